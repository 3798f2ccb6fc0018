"""On a GPU: kgen.attention's gradients (kgen/attention_grad.py: the forward program, then the
backward sequence) checked against finite differences, the f32-and-below equivalent of
torch.autograd.gradcheck that issue 52 asks for.

What is checked. The loss is L(q, k, v) = <dO, attention(q, k, v)>, evaluated by a float64
reference attention, at the bf16 (or f16) inputs the kernels read (exactly representable in
float64). kgen's backward returns g = dL/dX for X in q, k, v (its outputs, rounded to the input
dtype). For a unit direction w, the central difference (L(X + eps w) - L(X - eps w)) / (2 eps)
in float64 is the exact directional derivative <g*, w> up to eps^2 / 6 * L''' (about 1e-7 at
eps 1e-3) and float64 round-off over 2 eps (about 1e-11): it is exact at the scale of the test.
So the check measures kgen's error e = g - g* along w, and nothing else:

- along w = g / |g| (kgen's own gradient), <g, w> - fd = <e, g> / |g|: the error's component
  along the gradient, bounded by |e|. A wrong scale, sign or missing term (a forgotten
  `scale`, D, or 1/sqrt(d)) moves it by the size of the gradient itself;
- along random unit directions w_j, <e, w_j> is N(0, |e|^2 / n) (n the tensor's elements): the
  root mean square over 4 directions estimates |e| / sqrt(n), components orthogonal to g
  included (a transposed or misplaced gradient).

The tolerance: kgen rounds P^T and dS^T to the operand dtype before the gemms that read them,
O to it before D = rowsum(dO * O), and each gradient once at the end, each a relative error of
at most u (2^-8 for bf16, 2^-11 for f16) per element, mostly independent between elements; the
f32 accumulations add far less. The relative error |e| / |g| is then a few u; the check allows
REL = 16 u (6.25% for bf16, 0.78% for f16): along g, |<g, w> - fd| <= REL |g|; along random
directions, the root mean square <= 3 REL |g| / sqrt(n) (3x: four samples of a chi
distribution). Both bounds sit far below what a wrong formula gives (100% of |g| or more:
`test_the_check_rejects_a_wrong_gradient`). The finite differences themselves are checked
against float64 autograd first, to 1e-6 of |g|, so the oracle is right."""
from __future__ import annotations

import math

import pytest

from tests.gpu.attention_checks import cuda_torch

pytestmark = pytest.mark.gpu

EPS = 1e-3
DIRECTIONS = 4
UNIT = {"bf16": 2.0 ** -8, "f16": 2.0 ** -11}


def loss64(torch, q, k, v, do, causal, scale):
    """<dO, attention(q, k, v)> in float64 (top-left causal, as SDPA's is_causal)."""
    scores = (q @ k.transpose(-1, -2)) * scale
    if causal:
        s, t = q.shape[-2], k.shape[-2]
        keep = torch.arange(t, device=q.device)[None, :] <= torch.arange(s, device=q.device)[:, None]
        scores = scores.masked_fill(~keep, float("-inf"))
    return (do * (torch.softmax(scores, -1) @ v)).sum()


def kgen_gradients(torch, q, k, v, do, causal):
    import kgen

    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    out = kgen.attention(q, k, v, is_causal=causal)
    out.backward(do)
    torch.cuda.synchronize()
    return [x.grad.double() for x in (q, k, v)]


def directional(torch, args, which, w, causal, scale):
    """The central difference of loss64 along w in argument `which`, in float64."""
    plus, minus = list(args), list(args)
    plus[which] = args[which] + EPS * w
    minus[which] = args[which] - EPS * w
    return ((loss64(torch, *plus, causal=causal, scale=scale)
             - loss64(torch, *minus, causal=causal, scale=scale)) / (2 * EPS)).item()


def discrepancies(torch, grads, args, causal, scale, seed):
    """Per tensor: (|g|, n, <g, g/|g|> - fd along g, the rms over random directions of
    <g, w> - fd)."""
    gen = torch.Generator(device=grads[0].device).manual_seed(seed)
    out = []
    for which, g in enumerate(grads):
        norm = g.norm().item()
        along = norm - directional(torch, args, which, g / norm, causal, scale)
        errors = []
        for _ in range(DIRECTIONS):
            w = torch.randn(g.shape, device=g.device, dtype=torch.float64, generator=gen)
            w /= w.norm()
            errors.append((g * w).sum().item() - directional(torch, args, which, w, causal,
                                                             scale))
        out.append((norm, g.numel(), along, math.sqrt(sum(e * e for e in errors) / len(errors))))
    return out


def inputs(torch, dtype, s, t, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tdtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    return [torch.randn(1, 2, n, d, device="cuda", generator=gen).to(tdtype)
            for n in (s, t, t, s)]


def check(torch, grads, args, causal, scale, dtype, seed):
    rel = 16 * UNIT[dtype]
    names = ("dQ", "dK", "dV")
    for name, (norm, n, along, rms) in zip(names, discrepancies(torch, grads, args, causal,
                                                                  scale, seed)):
        assert norm > 0, name
        assert abs(along) <= rel * norm, (f"{name}: along the gradient, kgen - finite "
                                          f"difference = {along:.3g}, |g| = {norm:.3g}")
        assert rms <= 3 * rel * norm / math.sqrt(n), (
            f"{name}: over random directions, rms {rms:.3g} > {3 * rel * norm / math.sqrt(n):.3g}")


SHAPES = [(17, 17), (64, 200), (200, 64), (130, 130)]


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("d", [64, 128])
def test_gradients_match_finite_differences(d, shape, causal, dtype):
    torch = cuda_torch()
    s, t = shape
    q, k, v, do = inputs(torch, dtype, s, t, d, seed=s * 31 + t + d)
    scale = 1 / math.sqrt(d)
    grads = kgen_gradients(torch, q, k, v, do, causal)
    args = [x.double() for x in (q, k, v, do)]
    check(torch, grads, args, causal, scale, dtype, seed=d + s)


def test_the_finite_differences_are_float64_autograds():
    """The oracle: along g and along random directions, the central differences agree with
    float64 autograd's directional derivatives to 1e-6 of |g|."""
    torch = cuda_torch()
    q, k, v, do = inputs(torch, "bf16", 64, 200, 64, seed=3)
    args = [x.double() for x in (q, k, v, do)]
    leaves = [x.clone().requires_grad_() for x in args[:3]]
    loss64(torch, *leaves, args[3], causal=True, scale=0.125).backward()
    exact = [x.grad for x in leaves]
    for (norm, _, along, rms) in discrepancies(torch, exact, args, True, 0.125, seed=5):
        assert abs(along) <= 1e-6 * norm and rms <= 1e-6 * norm


@pytest.mark.parametrize("which, factor", [(0, 1.1), (1, 0.9), (2, -1.0)])
def test_the_check_rejects_a_wrong_gradient(which, factor):
    """The check can fail: kgen's gradients with one of them scaled by 10% or negated."""
    torch = cuda_torch()
    q, k, v, do = inputs(torch, "bf16", 64, 200, 64, seed=11)
    grads = kgen_gradients(torch, q, k, v, do, True)
    args = [x.double() for x in (q, k, v, do)]
    check(torch, grads, args, True, 0.125, "bf16", seed=1)  # as returned: passes
    grads[which] = grads[which] * factor
    with pytest.raises(AssertionError):
        check(torch, grads, args, True, 0.125, "bf16", seed=1)
