"""On an H100/H200: a column-major 16-bit output on the sm_90a warp-specialized GEMM, staged
transposed (stmatrix .trans) and stored by the copy engine, against the reference with every
output poisoned: both schedules, f16 and bf16, ragged sizes (M a multiple of 8 runs the fast
entry point, other M the narrow one), a column-major C staged with it (ldmatrix .trans), a
row-major C from global memory, batches, a cluster, and columns padded so that the last row
tile of the fast entry point stores pairs (C from global memory there) while the padding stays
unwritten."""
from __future__ import annotations

import pytest

from kgen import ir

from tests.gpu.test_batches_gpu import _check as check_batched
from tests.gpu.test_hopper_gpu import _run

pytestmark = pytest.mark.gpu

KINDS = {
    "cooperative": ("", "tile 128x256x64  warps 2x4  stages 3"),
    "pingpong": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 5"),
}
SIZES = [(8, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4096, 4104, 72), (296, 520, 136),
         (129, 264, 4104), (4097, 136, 200)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _kernel(kind: str, dtype: str = "f16", *, c: str = "col", batch: str = "",
            epilogue: str = "relu(alpha * acc + beta * C + bias[col])", cluster: str = "") -> ir.Kernel:
    from kgen.parse import parse
    from kgen.verify import verify

    schedule, lines = KINDS[kind]
    text = f"""
kernel col_{kind} {{
  target sm_90a
  {schedule}
  tensor A : {dtype}[{batch}M, K] row
  tensor B : {dtype}[{batch}K, N] col
  tensor C : {dtype}[{batch}M, N] {c}
  tensor D : {dtype}[{batch}M, N] col out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    {lines} {cluster}
    epilogue {{ D = {epilogue} }}
  }}
}}
"""
    module = parse(text, f"col_{kind}.kg")
    verify(module)
    return module.kernels[0]


def _schedule(kernel):
    from kgen.lower import lower
    from kgen.plan import StorePath

    g = lower(kernel).schedule.gemms[0]
    assert g.output.path is StorePath.TMA
    return g


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_bare_column_major_output(kind, dtype, mnk):
    _run(_kernel(kind, dtype, epilogue="acc"), mnk, kind)


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
def test_column_major_c_from_the_staging(kind, mnk):
    kernel = _kernel(kind, "bf16")
    assert _schedule(kernel).staged.param == "C"
    _run(kernel, mnk, kind)


@pytest.mark.parametrize("kind", list(KINDS))
def test_row_major_c_from_global_memory(kind):
    kernel = _kernel(kind, c="row")
    assert _schedule(kernel).staged.param is None
    _run(kernel, (1000, 1000, 264), kind)


@pytest.mark.parametrize("cluster", ["cluster 2x1", "cluster 1x2"])
def test_under_a_cluster(cluster):
    import json

    from kgen.api import build
    from kgen.harness.run import run

    built = build(_kernel("cooperative", cluster=cluster))
    assert built.plan.schedule.scheduler.cluster.size == 2
    report = run(built.kernel, built.plan, built.source, {"M": 296, "N": 520, "K": 136},
                 check=True)
    assert report.checks and report.ok, json.dumps(report.as_dict()["checks"], indent=1)


@pytest.mark.parametrize("kind", list(KINDS))
def test_batched(kind):
    kernel = _kernel(kind, batch="L, ")
    for L in (1, 3):
        check_batched(kernel, ir.Arch.SM90A, {"L": L, "M": 296, "N": 264, "K": 72},
                      expect_narrow=False)


@pytest.mark.parametrize("kind", list(KINDS))
def test_padded_columns_store_the_last_row_tile_as_pairs(kind):
    """M = 1001 with columns of 1008: the fast entry point, whose last row tile ends inside a
    16-byte chunk and leaves as pair stores (C from global memory there); the padding stays
    NaN."""
    import torch

    import kgen
    from kgen.reference import compare, evaluate, host_dtype

    kernel = _kernel(kind)
    k = kgen.load(kernel, "sm_90a")
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
    host = {name: t.float().cpu().numpy().astype(host_dtype(kernel.param(name).dtype))
            for name, t in args.items()}
    ref = evaluate(kernel, host)["D"]
    result = compare(d[:, :M].t().float().cpu().numpy(), ref, ir.DType.F16)
    assert result.ok, result.summary()
    assert torch.isnan(d[:, M:]).all()  # the padding is never written
