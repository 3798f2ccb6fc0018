"""On an H100/H200: the FP8 GEMMs (examples/gemm_fp8_rowwise.kg and gemm_fp8_tensorwise.kg,
and e4m3 x e5m2 mixed) against a float64 reference of the dequantized operands at ragged sizes,
through the fast entry point (16-byte rows) and the narrow one (rows off 16 bytes: the
producer copies them byte by byte), on the builder's schedule and on written ones (ping-pong,
256-row tiles, promoted), every output element written.

The bound is FP8's: the operands are exact, but wgmma's FP8 accumulator keeps about 14
mantissa bits (DeepGEMM's figure), so each of the ceil(K / 32) k32 instructions may lose up to
2^-13 of the running sum, which |A| @ |B| bounds; then the bf16 rounding of the output (2^-8
relative). Beside that element-wise bound, the whole output's relative error (Frobenius) must
stay under 1e-2, which a lost k slice or a misplaced element breaks at any K."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from kgen import ir

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SIZES = [(1, 8, 16), (17, 24, 40), (127, 130, 33), (1000, 1000, 1000), (4097, 4104, 72),
         (256, 512, 4096), (130, 264, 8200)]
SCHEDULES = {
    "builder": None,
    "pingpong128": (ir.Schedule.PINGPONG, (128, 128, 128), 5),
    "cooperative256": (None, (256, 128, 128), 4),
    # two-level accumulation: wgmma's sums promoted into f32 registers every k tile
    "promoted128": (None, (128, 128, 128), 6),
    "promoted_pingpong64": (ir.Schedule.PINGPONG, (64, 128, 128), 6),
    "split4": (None, (128, 128, 128), 5, ir.SplitK(4)),
    "stream": (None, (128, 256, 128), 3, ir.SplitK(1, stream=True)),
}


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _kernel(example: str, schedule: str, b_dtype: ir.DType | None = None) -> ir.Kernel:
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / example).kernels[0]
    if b_dtype is not None:
        params = tuple(dataclasses.replace(p, dtype=b_dtype) if p.name == "B" else p
                       for p in kernel.params)
        kernel = dataclasses.replace(kernel, params=params, name=kernel.name + "_mixed")
    if SCHEDULES[schedule] is not None:
        kind, tile, stages, *split = SCHEDULES[schedule]
        g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile),
                                warps=ir.WarpGrid(2, 4), stages=ir.StageCount(stages),
                                split=split[0] if split else None)
        kernel = dataclasses.replace(kernel, gemms=(g,), schedule=kind,
                                     name=f"{kernel.name}_{schedule}")
    return kernel


def _torch_dtype(torch, dtype: ir.DType):
    return {ir.DType.F8E4M3: torch.float8_e4m3fn, ir.DType.F8E5M2: torch.float8_e5m2}[dtype]


def _run(kernel: ir.Kernel, mnk, seed=0, pad=0):
    """`pad`: the operands' rows `pad` bytes longer than K (a slice of wider storage)."""
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(seed)
    a_dtype = _torch_dtype(torch, kernel.param("A").dtype)
    b_dtype = _torch_dtype(torch, kernel.param("B").dtype)
    a = (torch.randn(m, k + pad, device="cuda", generator=g) / math.sqrt(max(k, 1))).to(a_dtype)
    b = torch.randn(n, k + pad, device="cuda", generator=g).to(b_dtype)
    a, b = a[:, :k], b[:, :k].t()  # b: [K, N] column-major
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    if kernel.param("sa").kind is ir.ParamKind.SCALAR:
        sa, sb = 0.75, 1.25
        scale = torch.tensor(sa * sb, device="cuda", dtype=torch.float64)
    else:
        sa = torch.rand(m, device="cuda", generator=g) + 0.5
        sb = torch.rand(n, device="cuda", generator=g) + 0.5
        scale = sa.double()[:, None] * sb.double()[None, :]
    compiled = kgen.load(kernel)
    compiled(A=a, B=b, D=d, sa=sa, sb=sb)
    torch.cuda.synchronize()
    assert not torch.isnan(d).any(), "output elements left unwritten"
    check(d, a, b, scale)
    return compiled


def check(d, a, b, scale) -> None:
    """d (bf16) against the float64 product of the dequantized a and b times `scale`, within
    FP8's bound (see the module's note)."""
    n, k = d.shape[1], a.shape[1]
    ref = (a.double() @ b.double()) * scale  # the dequantized operands, exactly, in float64
    ref_abs = (a.double().abs() @ b.double().abs()) * scale.abs()
    out = d.double()
    err = (out - ref).abs()
    steps = -(-k // 32)
    bound = 2.0 ** -8 * ref.abs() + (steps + 1) * 2.0 ** -13 * ref_abs + 1e-6
    worst = (err - bound).argmax().item()
    assert (err <= bound).all(), (
        f"element {divmod(worst, n)}: {out.flatten()[worst].item()} against "
        f"{ref.flatten()[worst].item()} (bound {bound.flatten()[worst].item()})")
    norm = ref.norm().item()
    if norm > 0:
        assert (out - ref).norm().item() / norm < 1e-2


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("example", ["gemm_fp8_rowwise.kg", "gemm_fp8_tensorwise.kg"])
def test_fp8_example_at_ragged_sizes(example, mnk):
    _run(_kernel(example, "builder"), mnk)


@pytest.mark.parametrize("mnk", [(17, 24, 40), (1000, 1000, 1000), (4097, 4104, 72),
                                 (127, 130, 33)], ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("schedule", ["pingpong128", "cooperative256", "promoted128",
                                      "promoted_pingpong64", "split4", "stream"])
def test_fp8_written_schedules(schedule, mnk):
    _run(_kernel("gemm_fp8_rowwise.kg", schedule), mnk)


@pytest.mark.parametrize("mnk", [(17, 24, 40), (1000, 1000, 1000), (256, 512, 4096)],
                         ids=lambda s: "x".join(map(str, s)))
def test_fp8_mixed_e4m3_e5m2(mnk):
    _run(_kernel("gemm_fp8_rowwise.kg", "builder", ir.DType.F8E5M2), mnk)


@pytest.mark.parametrize("example", ["gemm_fp8_rowwise.kg", "gemm_fp8_tensorwise.kg"])
def test_fp8_promoted_at_long_k(example):
    """Promoted every k tile, the error at K = 16384 is one k tile's accumulation error, not
    the whole K's: well inside the bound."""
    built = _run(_kernel(example, "promoted128"), (384, 256, 16384))
    assert built.plan.schedule.gemms[0].promotion.k_tiles == 1


@pytest.mark.parametrize("mnk, pad", [((130, 264, 33), 1), ((130, 264, 1000), 8),
                                      ((130, 264, 1001), 3), ((64, 96, 4095), 1)],
                         ids=["odd-k-even-rows", "rows-8-bytes-longer", "odd-k-odd-rows",
                              "long-odd-k"])
def test_fp8_padded_rows(mnk, pad):
    """Rows longer than K: the copy engine where the pitch is a 16-byte multiple (K = 4095 then
    ends mid-row), else the narrow producer byte by byte, zeros past K."""
    _run(_kernel("gemm_fp8_rowwise.kg", "builder"), mnk, pad=pad)


def test_fp8_plan_on_the_device_is_wgmma():
    from kgen.api import build
    from kgen.plan import Mma

    built = build(_kernel("gemm_fp8_rowwise.kg", "builder"))
    assert built.plan.schedule.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert "m64n256k32.f32.e4m3.e4m3" in built.source


def test_fp8_matches_torch_scaled_mm_rowwise():
    """The same row-wise scaling as torch._scaled_mm's, at a size both take."""
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = 512, 768, 1024
    a = (torch.randn(m, k, device="cuda") / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
    sa, sb = torch.rand(m, device="cuda") + 0.5, torch.rand(n, device="cuda") + 0.5
    d = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    kgen.load(EXAMPLES / "gemm_fp8_rowwise.kg")(A=a, B=b, D=d, sa=sa, sb=sb)
    want = torch._scaled_mm(a, b, scale_a=sa[:, None].contiguous(),
                            scale_b=sb[None, :].contiguous(), out_dtype=torch.bfloat16)
    torch.cuda.synchronize()
    torch.testing.assert_close(d.float(), want.float(), atol=2e-2, rtol=2e-2)
