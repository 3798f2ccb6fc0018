"""On a GPU of compute capability 8.9 or later (an H100/H200 runs the same source built for its
own arch): sm_89's FP8 GEMM (examples/gemm_fp8_sm89.kg, mma.sync m16n8k32) against a float64
reference of the dequantized operands at ragged sizes, every output element written (outputs
poisoned with NaN first), through the fast entry point (16-byte rows) and the narrow one (rows
off 16 bytes: copied byte by byte), on the builder's tile and written ones, e4m3 and e5m2
mixed, tensor-wise scalars and an e4m3 output with its scale.

The bound is tests/gpu/test_fp8_gpu.py's: the operands are exact; each of the ceil(K / 32) k32
MMAs may lose up to 2^-13 of the running sum (FP8 MMAs need not keep f32's 24 bits), which
|A| @ |B| bounds; then the output's rounding (bf16: 2^-8 relative). The whole output's relative
error (Frobenius) must stay under 1e-2 beside it."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest

from kgen import ir

pytestmark = pytest.mark.gpu

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "gemm_fp8_sm89.kg"
SIZES = [(1, 8, 16), (17, 24, 40), (127, 130, 33), (1000, 1000, 1000), (4097, 264, 72),
         (256, 512, 4096), (130, 264, 8200)]
TILES = {"builder": None, "64x64x128": ((64, 64, 128), (2, 2), 4),
         "128x128x128": ((128, 128, 128), (2, 2), 3), "64x64x64": ((64, 64, 64), (2, 2), 2)}


@pytest.fixture(autouse=True)
def _ada_or_later():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 mma.sync needs compute capability 8.9 or later")


def _kernel(tile: str = "builder", b: ir.DType | None = None, out: ir.DType | None = None,
            tensorwise: bool = False) -> ir.Kernel:
    from kgen.parse import parse, parse_file

    if tensorwise or out is not None:
        text = EXAMPLE.read_text()
        if tensorwise:
            text = (text.replace("vector sa : f32[M]", "scalar sa : f32 = 1.0")
                    .replace("vector sb : f32[N]", "scalar sb : f32 = 1.0")
                    .replace("acc * sa[row] * sb[col]", "acc * sa * sb"))
        if out is not None:
            text = (text.replace("tensor D : bf16", f"tensor D : {out.dsl_name}")
                    .replace("  vector sa", "  scalar so : f32 = 1.0\n  vector sa")
                    .replace("acc * sa[row] * sb[col]", "acc * sa[row] * sb[col] * so"))
        kernel = parse(text, EXAMPLE.name).kernels[0]
    else:
        kernel = parse_file(EXAMPLE).kernels[0]
    name = kernel.name + ("_tensorwise" if tensorwise else "") + (
        f"_{out.dsl_name}" if out else "")
    if b is not None:
        params = tuple(dataclasses.replace(p, dtype=b) if p.name == "B" else p
                       for p in kernel.params)
        kernel = dataclasses.replace(kernel, params=params)
        name += "_mixed"
    if TILES[tile] is not None:
        shape, warps, stages = TILES[tile]
        g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*shape),
                                warps=ir.WarpGrid(*warps), stages=ir.StageCount(stages))
        kernel = dataclasses.replace(kernel, gemms=(g,))
        name += f"_{tile.replace('x', '_')}"
    return dataclasses.replace(kernel, name=name)


def _torch_dtype(torch, dtype: ir.DType):
    return {ir.DType.F8E4M3: torch.float8_e4m3fn, ir.DType.F8E5M2: torch.float8_e5m2,
            ir.DType.BF16: torch.bfloat16}[dtype]


def _run(kernel: ir.Kernel, mnk, seed=0, pad=0):
    """`pad`: the operands' rows `pad` bytes longer than K (a slice of wider storage)."""
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(seed)
    b_dtype = _torch_dtype(torch, kernel.param("B").dtype)
    out_dtype = kernel.param("D").dtype
    a = (torch.randn(m, k + pad, device="cuda", generator=g) / math.sqrt(max(k, 1))).to(
        torch.float8_e4m3fn)
    b = torch.randn(n, k + pad, device="cuda", generator=g).to(b_dtype)
    a, b = a[:, :k], b[:, :k].t()  # b: [K, N] column-major
    args = dict(A=a, B=b)
    if kernel.param("sa").kind is ir.ParamKind.SCALAR:
        args.update(sa=0.75, sb=1.25)
        scale = torch.tensor(0.75 * 1.25, device="cuda", dtype=torch.float64)
    else:
        sa = torch.rand(m, device="cuda", generator=g) + 0.5
        sb = torch.rand(n, device="cuda", generator=g) + 0.5
        args.update(sa=sa, sb=sb)
        scale = sa.double()[:, None] * sb.double()[None, :]
    if out_dtype is ir.DType.BF16:
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    else:  # e4m3's NaN code, 0x7f: no finite result has it
        d = torch.full((m, n), 0x7F, device="cuda", dtype=torch.uint8).view(
            _torch_dtype(torch, out_dtype))
        args["so"] = 2.0
        scale = scale * 2.0
    compiled = kgen.load(kernel)
    compiled(D=d, **args)
    torch.cuda.synchronize()
    assert not torch.isnan(d.float()).any(), "output elements left unwritten"
    _check(d, a, b, scale, out_dtype)
    return compiled


def _check(d, a, b, scale, out_dtype) -> None:
    n, k = d.shape[1], a.shape[1]
    ref = (a.double() @ b.double()) * scale  # the dequantized operands, exactly, in float64
    ref_abs = (a.double().abs() @ b.double().abs()) * scale.abs()
    if out_dtype is ir.DType.F8E4M3:
        ref = ref.clamp(-448.0, 448.0)  # saturated, as the kernel's conversion
    rounding = 2.0 ** -8 if out_dtype is ir.DType.BF16 else 2.0 ** -3  # e4m3: 3 mantissa bits
    out = d.double()
    err = (out - ref).abs()
    steps = -(-k // 32)
    bound = rounding * ref.abs() + (steps + 1) * 2.0 ** -13 * ref_abs + 2.0 ** -9
    worst = (err - bound).argmax().item()
    assert (err <= bound).all(), (
        f"element {divmod(worst, n)}: {out.flatten()[worst].item()} against "
        f"{ref.flatten()[worst].item()} (bound {bound.flatten()[worst].item()})")
    norm = ref.norm().item()
    if norm > 0:
        limit = 1e-2 if out_dtype is ir.DType.BF16 else 5e-2
        assert (out - ref).norm().item() / norm < limit


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_the_example_at_ragged_sizes(mnk):
    _run(_kernel(), mnk)


@pytest.mark.parametrize("mnk", [(17, 24, 40), (1000, 1000, 1000), (127, 130, 200)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("tile", ["64x64x128", "128x128x128", "64x64x64"])
def test_written_tiles(tile, mnk):
    _run(_kernel(tile), mnk)


@pytest.mark.parametrize("b", [ir.DType.F8E5M2])
@pytest.mark.parametrize("mnk", [(17, 24, 40), (1000, 1000, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_e4m3_times_e5m2(b, mnk):
    _run(_kernel(b=b), mnk)


@pytest.mark.parametrize("mnk", [(33, 72, 96), (1000, 1000, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_tensorwise_scalars(mnk):
    _run(_kernel(tensorwise=True), mnk)


@pytest.mark.parametrize("mnk", [(33, 72, 96), (515, 264, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
def test_an_e4m3_output_with_its_scale(mnk):
    _run(_kernel(out=ir.DType.F8E4M3), mnk)


@pytest.mark.parametrize("mnk, pad", [((130, 264, 33), 1), ((130, 264, 1000), 8),
                                      ((130, 264, 1001), 3), ((64, 96, 4095), 1)],
                         ids=["odd-k-even-rows", "rows-8-bytes-longer", "odd-k-odd-rows",
                              "long-odd-k"])
def test_padded_rows_take_the_narrow_entry_point(mnk, pad):
    _run(_kernel(), mnk, pad=pad)


def test_the_plan_on_the_device_is_the_fp8_mma_sync():
    from kgen.api import build
    from kgen.plan import Mma

    built = build(_kernel())
    assert built.plan.arch is ir.Arch.SM89
    assert built.plan.schedule.gemms[0].atom.instruction is Mma.MMA_SYNC_FP8
    assert "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32" in built.source
