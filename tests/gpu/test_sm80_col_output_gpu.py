"""On a GPU: sm_80 code (mma.sync, run on any GPU from sm_80) with a column-major 16-bit output
leaving the fast entry point as 16-byte chunks of 8 rows (movmatrix + quad transpose), against
the reference with outputs poisoned: f16 and bf16, ragged sizes (M a multiple of 8 runs the
fast entry point, other M the narrow one), a bare and a fused epilogue, batches, and columns
padded so that the fast entry point's last chunk of each column is cut at M while the padding
stays unwritten."""
from __future__ import annotations

import json

import pytest

from kgen import ir
from kgen.plan import StorePath

from tests.gpu.test_batches_gpu import _check as check_batched
from tests.targets.test_sm80_col_output import kernel

pytestmark = pytest.mark.gpu

SIZES = [(8, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4096, 4104, 72), (296, 520, 136),
         (129, 264, 4104), (4097, 136, 200), (40, 2, 16)]


def _run(k: ir.Kernel, mnk):
    from kgen.api import build
    from kgen.harness.run import run

    built = build(k, "sm_80")
    assert built.plan.schedule.gemms[0].store is StorePath.WIDE
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("t", ["f16", "bf16"])
def test_fused_column_major_output(t, mnk):
    _run(kernel(t=t), mnk)


@pytest.mark.parametrize("mnk", SIZES[:5], ids=lambda s: "x".join(map(str, s)))
def test_bare_column_major_output(mnk):
    from kgen.parse import parse
    from kgen.verify import verify

    text = """
kernel bare_col {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] row
  tensor D : f16[M, N] col out
  gemm g = A @ B accumulate f32 {
    epilogue { D = acc }
  }
}
"""
    module = parse(text, "bare_col.kg")
    verify(module)
    _run(module.kernels[0], mnk)


def test_batched_column_major_output():
    from kgen.parse import parse
    from kgen.verify import verify

    text = """
kernel batched_col {
  target sm_80
  tensor A : f16[L, M, K] row
  tensor B : f16[L, K, N] col
  tensor D : f16[L, M, N] col out
  vector bias : f32[L, N]
  gemm g = A @ B accumulate f32 {
    epilogue { D = acc + bias[col] }
  }
}
"""
    module = parse(text, "batched_col.kg")
    verify(module)
    for L in (1, 3):
        check_batched(module.kernels[0], ir.Arch.SM80, {"L": L, "M": 296, "N": 264, "K": 72},
                      expect_narrow=False)


def test_padded_columns_cut_the_last_chunk_at_m():
    """M = 1001 with columns of 1008: the fast entry point; each column's last chunk (rows
    1000..1007) stores row 1000 alone, and the padding stays NaN."""
    import torch

    import kgen
    from kgen.reference import compare, evaluate, host_dtype

    k_ir = kernel()
    k = kgen.load(k_ir, "sm_80")
    M, N, K, ld = 1001, 264, 200, 1008
    torch.manual_seed(7)
    args = {"A": (torch.randn(M, K, device="cuda") / K**0.5).half(),
            "B": torch.randn(N, K, device="cuda").half().t(),
            "C": torch.randn(N, ld, device="cuda").half()[:, :M].t(),
            "bias": torch.rand(N, device="cuda")}
    d = torch.full((N, ld), float("nan"), device="cuda", dtype=torch.float16)
    bound = k.bind(**args, D=d[:, :M].t())
    assert not bound.narrow, bound.narrow
    k(**args, D=d[:, :M].t())
    torch.cuda.synchronize()
    host = {name: t.float().cpu().numpy().astype(host_dtype(k_ir.param(name).dtype))
            for name, t in args.items()}
    ref = evaluate(k_ir, host)["D"]
    result = compare(d[:, :M].t().float().cpu().numpy(), ref, ir.DType.F16)
    assert result.ok, result.summary()
    assert torch.isnan(d[:, M:]).all()  # the padding is never written
