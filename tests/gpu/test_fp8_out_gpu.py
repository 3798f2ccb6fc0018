"""On an H100/H200: FP8 outputs with amax (examples/gemm_fp8_out_amax.kg): Y = e4m3(acc *
sa[row] * sb[col] * scale_out), rounded once and saturated to +-448, and amax = max |acc * sa[row]
* sb[col]|, against the float64 product of the dequantized operands at ragged sizes (odd N: the
narrow entry point's byte stores), Y poisoned (e4m3 NaN) and amax NaN before the launch.

Y may sit one e4m3 step (2^-3 relative) from the float64 value rounded to e4m3: the kernel's f32
sum differs from the float64 one by FP8's accumulation bound (tests/gpu/test_fp8_gpu.py), which
can cross a rounding boundary; a value past 448 must be exactly 448."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

EXAMPLE = Path(__file__).resolve().parent.parent.parent / "examples" / "gemm_fp8_out_amax.kg"
# The example's statement of Y (its first "Y = d * scale_out" is in the header comment)
Y_LINE = "      Y = d * scale_out\n"
SIZES = [(1, 8, 16), (17, 24, 40), (127, 130, 33), (1000, 1000, 1000), (4097, 4104, 72),
         (130, 263, 520), (256, 512, 4096),
         # the fast entry point's staging (N and K multiples of 16): ragged M and N past the
         # tile, many tiles per CTA (the walk's amax partials), one tile
         (1000, 1008, 1008), (4097, 4112, 80), (130, 272, 528), (1, 16, 16)]
FAST = {(256, 512, 4096), (1000, 1008, 1008), (4097, 4112, 80), (130, 272, 528), (1, 16, 16)}


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def run(mnk, scale_out, seed=0, kernel=None, ld=None, out_dtype="float8_e4m3fn",
        c=False):
    """`kernel`: another text of the example (default the file); `ld`: Y's row pitch (past N);
    `c`: the kernel adds a bf16 input C to Y (returned in d times 1 / scale_out)."""
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, device="cuda", generator=g) / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, device="cuda", generator=g) + 0.5
    sb = torch.rand(n, device="cuda", generator=g) + 0.5
    nan = 0x7F  # NaN in e4m3 and in e5m2
    y = torch.full((m, ld or n), nan, device="cuda", dtype=torch.uint8)
    y = y.view(getattr(torch, out_dtype))[:, :n]
    amax = torch.full((1,), float("nan"), device="cuda")
    args = dict(A=a, B=b, Y=y, sa=sa, sb=sb, scale_out=scale_out, amax=amax)
    if c:
        args["C"] = torch.randn(m, n, device="cuda", generator=g).to(torch.bfloat16)
    compiled = kgen.load(kernel or EXAMPLE, tuned=False)
    narrow = compiled.bind(**args).narrow  # why the narrow entry point runs ("": the fast one)
    compiled(**args)
    torch.cuda.synchronize()
    scales = sa.double()[:, None] * sb.double()[None, :]
    d = (a.double() @ b.double()) * scales
    d_abs = (a.double().abs() @ b.double().abs()) * scales  # bounds the accumulation error
    if ld is not None:  # the pitch's bytes past N are left as they were
        pad = y.view(torch.uint8).as_strided((m, ld - n), (ld, 1), n)
        assert (pad == nan).all(), "bytes past N written"
    ref_amax = d.abs().max().item()
    if c:
        d = d + args["C"].double() / scale_out
    return y.double(), amax.item(), d, d_abs, ref_amax, narrow


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_out_and_amax_at_ragged_sizes(mnk):
    torch = pytest.importorskip("torch")
    scale_out = 96.0  # O(1) products times 96: a few past 448 saturate
    y, amax, d, d_abs, _, narrow = run(mnk, scale_out)
    assert (narrow == "") == (mnk in FAST), narrow
    assert not torch.isnan(y).any(), "output elements left unwritten"
    want = (d * scale_out).clamp(-448.0, 448.0)
    step = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0 ** -6))) - 3)
    err = (y - want).abs()
    worst = (err / step).argmax().item()
    k = mnk[2]
    bound = step + (-(-k // 32) + 1) * 2.0 ** -13 * scale_out * d_abs
    assert (err <= bound).all(), (
        f"element {divmod(worst, mnk[1])}: {y.flatten()[worst].item()} against "
        f"{want.flatten()[worst].item()}")
    assert (y[(d * scale_out).abs() > 460.0].abs() == 448.0).all(), "saturation to 448"
    assert y.abs().max().item() <= 448.0
    ref = d.abs().max().item()
    assert abs(amax - ref) <= 2e-3 * ref + 1e-6, (amax, ref)


def test_fp8_out_saturates_and_keeps_signs():
    """scale_out 1e4: nearly every value saturates, each to its sign's 448."""
    torch = pytest.importorskip("torch")
    y, _, d, _, _, narrow = run((128, 256, 256), 1e4)
    assert narrow == ""
    big = (d * 1e4).abs() > 460.0
    assert big.float().mean().item() > 0.9
    assert torch.equal(y[big], 448.0 * torch.sign(d[big]))


def check_y(y, d, d_abs, k, scale_out, top=448.0, step_bits=3):
    """Y within one FP8 step (2^-step_bits relative) plus the accumulation bound of the
    saturated float64 value."""
    torch = pytest.importorskip("torch")
    assert not torch.isnan(y).any(), "output elements left unwritten"
    want = (d * scale_out).clamp(-top, top)
    step = torch.exp2(torch.floor(torch.log2(want.abs().clamp(min=2.0 ** -6))) - step_bits)
    bound = step + (-(-k // 32) + 1) * 2.0 ** -13 * scale_out * d_abs
    assert ((y - want).abs() <= bound).all()
    assert y.abs().max().item() <= top


def variant_text(old: str, new: str) -> str:
    """The example with `old` (found exactly once: a statement's text may recur in the header
    comment) replaced by `new`."""
    text = EXAMPLE.read_text()
    assert text.count(old) == 1, old
    return text.replace(old, new)


def variant(old: str, new: str):
    from kgen.parse import parse

    return parse(variant_text(old, new), "gemm_fp8_out_variant.kg").kernels[0]


def test_fp8_out_with_a_padded_pitch_and_n_off_the_chunk():
    """ld 208 and N 200: the copy engine may store every tile but the last column's, whose
    rows end inside a 16-byte chunk: its threads copy it out of the staging byte by byte."""
    y, amax, d, d_abs, _, narrow = run((300, 200, 272), 96.0, ld=208)
    assert narrow == ""
    check_y(y, d, d_abs, 272, 96.0)
    assert abs(amax - d.abs().max().item()) <= 2e-3 * d.abs().max().item()


def test_fp8_out_e5m2():
    kernel = variant("tensor Y : f8e4m3[M, N] row out", "tensor Y : f8e5m2[M, N] row out")
    for mnk in ((1000, 1008, 1008), (130, 263, 520)):
        y, amax, d, d_abs, _, narrow = run(mnk, 4096.0, kernel=kernel, out_dtype="float8_e5m2")
        assert (narrow == "") == (mnk[1] == 1008)
        check_y(y, d, d_abs, mnk[2], 4096.0, top=57344.0, step_bits=2)
        assert abs(amax - d.abs().max().item()) <= 2e-3 * d.abs().max().item()


@pytest.mark.parametrize("which", ["gelu-groups", "c-input", "deterministic", "tile128"])
def test_fp8_out_variants(which):
    """The staging's other paths: the EVT in groups (gelu), an input read from global memory
    (every pair guarded), deterministic amax (per-tile slots), a 128x128 tile."""
    gemm = "  gemm mma0 = A @ B accumulate f32 {\n"
    kernel = {
        "gelu-groups": lambda: variant(Y_LINE,
                                       Y_LINE.replace("scale_out", "scale_out + 0.0 * gelu(d)")),
        "deterministic": lambda: variant("  target sm_90a\n",
                                         "  target sm_90a\n  reductions deterministic\n"),
        "tile128": lambda: variant(gemm, gemm + "    tile 128x128x128  warps 2x4  stages 6\n"),
    }[which]() if which != "c-input" else c_input_kernel()
    for mnk in ((1000, 1008, 1008), (4097, 4112, 80), (130, 263, 520)):
        y, amax, d, d_abs, ref_amax, narrow = run(mnk, 96.0, kernel=kernel, c=which == "c-input")
        assert (narrow == "") == (mnk[1] != 263), narrow
        check_y(y, d, d_abs, mnk[2], 96.0)
        assert abs(amax - ref_amax) <= 2e-3 * ref_amax + 1e-6, (amax, ref_amax)


def c_input_text() -> str:
    """The example with a bf16 input C added into Y (Y = d * scale_out + C)."""
    text = variant_text("  vector sa", "  tensor C : bf16[M, N] row\n  vector sa")
    assert text.count(Y_LINE) == 1
    return text.replace(Y_LINE, "      Y = d * scale_out + C\n")


def c_input_kernel():
    from kgen.parse import parse

    return parse(c_input_text(), "gemm_fp8_out_c.kg").kernels[0]
