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
SIZES = [(1, 8, 16), (17, 24, 40), (127, 130, 33), (1000, 1000, 1000), (4097, 4104, 72),
         (130, 263, 520), (256, 512, 4096)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def run(mnk, scale_out, seed=0):
    torch = pytest.importorskip("torch")
    import kgen

    m, n, k = mnk
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = (torch.randn(m, k, device="cuda", generator=g) / math.sqrt(k)).to(torch.float8_e4m3fn)
    b = torch.randn(n, k, device="cuda", generator=g).to(torch.float8_e4m3fn).t()
    sa = torch.rand(m, device="cuda", generator=g) + 0.5
    sb = torch.rand(n, device="cuda", generator=g) + 0.5
    y = torch.full((m, n), 0x7F, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
    amax = torch.full((1,), float("nan"), device="cuda")
    kgen.load(EXAMPLE)(A=a, B=b, Y=y, sa=sa, sb=sb, scale_out=scale_out, amax=amax)
    torch.cuda.synchronize()
    scales = sa.double()[:, None] * sb.double()[None, :]
    d = (a.double() @ b.double()) * scales
    d_abs = (a.double().abs() @ b.double().abs()) * scales  # bounds the accumulation error
    return y.double(), amax.item(), d, d_abs


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_fp8_out_and_amax_at_ragged_sizes(mnk):
    torch = pytest.importorskip("torch")
    scale_out = 96.0  # O(1) products times 96: a few past 448 saturate
    y, amax, d, d_abs = run(mnk, scale_out)
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
    y, _, d, _ = run((128, 256, 256), 1e4)
    big = (d * 1e4).abs() > 460.0
    assert big.float().mean().item() > 0.9
    assert torch.equal(y[big], 448.0 * torch.sign(d[big]))
