"""On an H100/H200: the epilogue input C loaded by the copy engine into the output's staging
(the seed's ReuseSmemC; StagedInput) on both warp-specialized schedules, against
the reference with every output poisoned: ragged sizes, rows padded so that the last column
tile reads C from global memory while the others read the staging, a second input read from
global memory beside it, and batches (C per batch and broadcast)."""
from __future__ import annotations

import pytest

from kgen import ir

from tests.gpu.test_batches_gpu import _check as check_batched
from tests.gpu.test_hopper_gpu import _kind, _run

pytestmark = pytest.mark.gpu

# (schedule line, gemm lines) of each warp-specialized schedule
KINDS = {
    "cooperative": ("", "tile 128x256x64  warps 2x4  stages 3"),
    # tile N not a multiple of 64: C's last box loaded whole, the output's copied out by threads
    "cooperative_256x160": ("", "tile 256x160x64  warps 2x4  stages 3"),
    "cooperative_128x96": ("", "tile 128x96x64  warps 2x4  stages 4"),
    "cooperative_256x152": ("", "tile 256x152x64  warps 2x4  stages 4"),  # one box per consumer
    "pingpong": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 5"),
    "pingpong64": ("schedule pingpong", "tile 64x256x64  warps 2x4  stages 4"),
    "pingpong_128x96": ("schedule pingpong", "tile 128x96x64  warps 2x4  stages 5"),
}
SIZES = [(1, 8, 8), (17, 24, 24), (1000, 1000, 1000), (4097, 4104, 72), (300, 520, 136),
         (129, 264, 4104)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _kernel(kind: str, dtype: str = "f16", *, batch: str = "", extra: str = "",
            epilogue: str = "relu(alpha * acc + beta * C + bias[col])") -> ir.Kernel:
    from kgen.parse import parse
    from kgen.verify import verify

    schedule, lines = KINDS[kind]
    text = f"""
kernel staged_{kind} {{
  target sm_90a
  {schedule}
  compute f32
  tensor A : {dtype}[{batch}M, K] row
  tensor B : {dtype}[{batch}K, N] col
  tensor C : {dtype}[{batch}M, N] row
  tensor D : {dtype}[{batch}M, N] row out
  {extra}
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {epilogue} }}
  }}
}}
"""
    module = parse(text, f"staged_{kind}.kg")
    verify(module)
    return module.kernels[0]


def _staged(kernel) -> str | None:
    from kgen.lower import lower

    return lower(kernel).schedule.gemms[0].staged.param


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_c_from_the_staging(kind, dtype, mnk):
    kernel = _kernel(kind, dtype)
    assert _staged(kernel) == "C"
    _run(kernel, mnk, _kind(kind))


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_second_input_from_global_memory(kind):
    kernel = _kernel(kind, extra="tensor E : bf16[M, N] row", epilogue="acc + C - 2.0 * E")
    assert _staged(kernel) == "C"
    _run(kernel, (1000, 1000, 264), _kind(kind))


@pytest.mark.parametrize("kind", list(KINDS))
def test_padded_rows_read_the_last_tile_from_global_memory(kind):
    """N = 258 with rows of 264: the fast entry point, whose last column tile ends inside a
    16-byte chunk and leaves as pair stores (C from global memory there)."""
    import torch

    import kgen
    from kgen.reference import compare, evaluate, host_dtype

    kernel = _kernel(kind)
    k = kgen.load(kernel, "sm_90a")
    M, N, K, ld = 1000, 258, 200, 264
    torch.manual_seed(5)
    args = {"A": (torch.randn(M, K, device="cuda") / K**0.5).half(),
            "B": torch.randn(N, K, device="cuda").half().t(),
            "C": torch.randn(M, ld, device="cuda").half()[:, :N],
            "bias": torch.rand(N, device="cuda")}
    d = torch.full((M, ld), float("nan"), device="cuda", dtype=torch.float16)
    bound = k.bind(**args, D=d[:, :N])
    assert not bound.narrow, bound.narrow
    k(**args, D=d[:, :N])
    torch.cuda.synchronize()
    host = {name: t.float().cpu().numpy().astype(host_dtype(kernel.param(name).dtype))
            for name, t in args.items()}
    ref = evaluate(kernel, host)["D"]
    result = compare(d[:, :N].float().cpu().numpy(), ref, ir.DType.F16)
    assert result.ok, result.summary()
    assert torch.isnan(d[:, N:]).all()  # the padding is never written


@pytest.mark.parametrize("broadcast", [(), ("C",)], ids=["per batch", "broadcast C"])
@pytest.mark.parametrize("kind", list(KINDS))
def test_batched_c(kind, broadcast):
    kernel = _kernel(kind, batch="L, ")
    assert _staged(kernel) == "C"
    for L in (1, 3):
        check_batched(kernel, ir.Arch.SM90A, {"L": L, "M": 300, "N": 264, "K": 72},
                      broadcast=broadcast if L > 1 else (), expect_narrow=False)


def test_an_unaligned_c_runs_the_narrow_entry_point():
    """C's rows not 16-byte multiples: the launcher picks the narrow entry point."""
    kernel = _kernel("cooperative")
    _run(kernel, (300, 1002, 72), "cooperative")
