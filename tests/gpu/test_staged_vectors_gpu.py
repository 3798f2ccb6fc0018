"""On an H100/H200: the epilogue's row and column vectors staged in shared memory per tile
(EpilogueVectors, STAGED) on both warp-specialized schedules, against the reference with
every output poisoned: column vectors of three element types beside row vectors, tiles whose
slices are narrower (64) and not a multiple (192) of a warpgroup's threads, ragged sizes, a
column-major output, a cluster, rows padded so that the last column tile leaves as pairs,
batches (vectors per batch and broadcast), and the same plan with the Schedule value off."""
from __future__ import annotations


import pytest

from kgen import ir
from kgen.plan import EpilogueVectors, VectorHome

from tests.gpu.test_batches_gpu import _check as check_batched
from tests.gpu.test_batches_gpu import _host, _inputs, _outputs
from tests.gpu.test_hopper_gpu import _run

pytestmark = pytest.mark.gpu

KINDS = {
    "cooperative": ("", "tile 128x256x64  warps 2x4  stages 3"),
    # 4 stages: with 5, the four vectors' buffers do not fit beside the ring and staging
    "pingpong": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 4"),
    "pingpong64": ("schedule pingpong", "tile 64x128x64  warps 2x4  stages 6"),
    "n64": ("", "tile 128x64x64  warps 2x4  stages 8"),
    "n192": ("", "tile 128x192x64  warps 2x4  stages 4"),
    "cluster": ("", "tile 128x256x64  warps 2x4  stages 3  cluster 2x1"),
}
SIZES = [(1, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4097, 4104, 72), (300, 520, 136),
         (129, 264, 4104)]
EPILOGUE = "relu(alpha * acc + bias[col] + hb[col]) * scale[row] + shift[row]"


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _kernel(kind: str, *, batch: str = "", d: str = "row") -> ir.Kernel:
    from kgen.parse import parse
    from kgen.verify import verify

    schedule, lines = KINDS[kind]
    text = f"""
kernel vectors_{kind} {{
  target sm_90a
  {schedule}
  tensor A : f16[{batch}M, K] row
  tensor B : f16[{batch}K, N] col
  tensor D : f16[{batch}M, N] {d} out
  vector bias : f32[{batch}N]
  vector hb : bf16[N]
  vector scale : f16[{batch}M]
  vector shift : f32[M]
  scalar alpha : f32 = 1.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {EPILOGUE} }}
  }}
}}
"""
    module = parse(text, f"vectors_{kind}.kg")
    verify(module)
    kernel = module.kernels[0]
    from kgen.lower import lower

    vectors = lower(kernel).schedule.gemms[0].vectors
    assert vectors.held(VectorHome.STAGED) == ("bias", "hb", "scale", "shift")
    return kernel


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
def test_vectors_from_shared_memory(kind, mnk):
    _run(_kernel(kind), mnk, None)


@pytest.mark.parametrize("kind", ["cooperative", "pingpong"])
def test_column_major_output(kind):
    _run(_kernel(kind, d="col"), (1000, 520, 264), None)


@pytest.mark.parametrize("kind", ["cooperative", "pingpong"])
def test_batched_vectors(kind):
    kernel = _kernel(kind, batch="L, ")
    for L in (1, 3, 17):
        check_batched(kernel, ir.Arch.SM90A, {"L": L, "M": 300, "N": 264, "K": 72},
                      expect_narrow=False)


@pytest.mark.parametrize("kind", ["cooperative", "pingpong"])
def test_broadcast_vectors(kind):
    """bias and scale one vector for every batch (batch stride 0, torch's expand)."""
    import torch

    import kgen
    from kgen.reference import checking_dtype, compare, evaluate

    kernel = _kernel(kind, batch="L, ")
    sizes = {"L": 5, "M": 300, "N": 264, "K": 72}
    torch.manual_seed(3)
    args = _inputs(torch, kernel, sizes)
    for name in ("bias", "scale"):
        args[name] = args[name][0].expand(sizes["L"], -1)
    outs = _outputs(torch, kernel, sizes)
    k = kgen.load(kernel, "sm_90a")
    bound = k.bind(**args, **outs)
    assert bound.values["batch_bias"] == 0 and bound.values["batch_scale"] == 0
    assert not bound.narrow
    k(**args, **outs)
    torch.cuda.synchronize()
    params = {p.name: p for p in kernel.params}
    host = {name: _host(t, params[name].dtype) for name, t in args.items()}
    ref = evaluate(kernel, host, {}, batches=sizes["L"])
    result = compare(_host(outs["D"], ir.DType.F16), ref["D"], checking_dtype(kernel, "D"))
    assert result.ok, result.summary()


@pytest.mark.parametrize("kind", ["cooperative", "pingpong"])
def test_padded_rows_leave_the_last_tile_as_pairs(kind):
    """N = 258 with rows of 264: the fast entry point, whose last column tile ends inside a
    16-byte chunk and leaves as pairs from registers, reading the staged vectors too."""
    import torch

    import kgen
    from kgen.reference import compare, evaluate, host_dtype

    kernel = _kernel(kind)
    k = kgen.load(kernel, "sm_90a")
    M, N, K, ld = 1000, 258, 200, 264
    torch.manual_seed(7)
    args = {"A": (torch.randn(M, K, device="cuda") / K**0.5).half(),
            "B": torch.randn(N, K, device="cuda").half().t(),
            "bias": torch.randn(N, device="cuda"),
            "hb": torch.randn(N, device="cuda").bfloat16(),
            "scale": torch.randn(M, device="cuda").half(),
            "shift": torch.randn(M, device="cuda")}
    d = torch.full((M, ld), float("nan"), device="cuda", dtype=torch.float16)
    assert not k.bind(**args, D=d[:, :N]).narrow
    k(**args, D=d[:, :N])
    torch.cuda.synchronize()
    host = {name: t.float().cpu().numpy().astype(host_dtype(kernel.param(name).dtype))
            for name, t in args.items()}
    ref = evaluate(kernel, host, {"alpha": 1.5})["D"]
    result = compare(d[:, :N].float().cpu().numpy(), ref, ir.DType.F16)
    assert result.ok, result.summary()
    assert torch.isnan(d[:, N:]).all()


def test_the_schedule_value_off_gives_the_same_output():
    """The plan with staged_vectors () (the variant bench/prototypes/batched_probe.py times)
    is checked the same way."""
    import json

    from kgen.api import build
    from kgen.emit import emit
    from kgen.harness.run import run

    plan = build(_kernel("cooperative")).plan
    off = plan.with_gemm_schedule(vectors=EpilogueVectors())
    source = emit(off, source_name="off.kg", source_hash="", command="test")
    assert "sv_bias" not in source
    report = run(_kernel("cooperative"), off, source, dict(M=1000, N=1000, K=1000), check=True)
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
