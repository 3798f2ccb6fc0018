"""On a GPU: kgen.attention trains with a value head dim unlike the query's (D_v != D:
kgen/attention_grad.py BackwardSignature.d_v; 192 / 128 as DeepSeek's, 128 / 64, 64 / 128):
dQ, dK, dV (and O) against float64 autograd of attention written out, causal (top-left, as
SDPA's is_causal) and not, at ragged lengths (1, 17, 1000), GQA 4:2 once per pair, on the
device's target (on a Hopper GPU sm_90a: the wgmma skeleton) and on sm_80's (the mma.sync
skeleton, which any GPU runs); 192 / 128 on sm_90a runs the wgmma skeleton's split layout (dK's
and dQ's warpgroup halves of 96 columns in wgmma pieces of 32: dag_wgmma_rules.
DAG_WGMMA_SPLIT_PIECE); 256 / 128 and 128 / 256 (the split layout with accumulators of two
N) on the device's target.
Also kgen.attention_varlen (packed, bottom-right causal) and a fullgraph torch.compile step at
128 / 64. Every buffer the backward allocates (its outputs, D, the f32 dQ accumulator) is
poisoned with NaN, so an element no kernel writes shows."""
from __future__ import annotations

import math

import pytest

from tests.gpu.attention_checks import (close, close_grads, cuda_torch, skip_unless_runs,
                                        varlen_reference)
from tests.gpu.test_attention_varlen_bwd_gpu import poisoned  # noqa: F401 (the fixture)

pytestmark = pytest.mark.gpu

PAIRS = [(192, 128), (128, 64), (64, 128)]
LENGTHS = [(1, 1), (17, 17), (17, 1000), (1000, 17), (1000, 1000)]


def _target(torch, arch: str, monkeypatch) -> str:
    """The target kgen.attention builds for: the device's, or sm_80's where `arch` says so."""
    from kgen import attention as forward

    if arch == "sm_80":  # the mma.sync skeleton, forward and backward
        monkeypatch.setattr(forward, "_arch", lambda device: "sm_80")
    return forward._arch(torch.device("cuda"))


def _check(torch, monkeypatch, arch, d, d_v, s, t, causal, heads=(2, 2), seed=1):
    import kgen

    target = _target(torch, arch, monkeypatch)
    h, hkv = heads
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(1, h, s, n, device="cuda", generator=gen).bfloat16() for n in (d, d_v))
    k, v = (torch.randn(1, hkv, t, n, device="cuda", generator=gen).bfloat16()
            for n in (d, d_v))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    out = kgen.attention(*leaves, is_causal=causal, enable_gqa=hkv != h)
    assert out.shape == (1, h, s, d_v)
    out.backward(do)
    torch.cuda.synchronize()

    q64, k64, v64 = (x.double().requires_grad_() for x in (q, k, v))
    group = h // hkv
    kk, vv = (x.repeat_interleave(group, dim=1) for x in (k64, v64))
    scores = (q64 @ kk.transpose(-1, -2)) / math.sqrt(d)
    if causal:
        keep = (torch.arange(t, device="cuda")[None, :]
                <= torch.arange(s, device="cuda")[:, None])
        scores = scores.masked_fill(~keep, float("-inf"))
    ref = torch.softmax(scores, -1) @ vv
    ref.backward(do.double())
    close(out.detach(), ref.detach(), 2e-2, "O")
    close_grads([x.grad for x in leaves], [q64.grad, k64.grad, v64.grad], 3e-2)


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", LENGTHS, ids=[f"S{s}-T{t}" for s, t in LENGTHS])
@pytest.mark.parametrize("d, d_v", PAIRS, ids=[f"D{d}-Dv{v}" for d, v in PAIRS])
def test_gradients_match_float64_autograd(poisoned, monkeypatch, d, d_v, s, t, causal, arch):
    _check(poisoned, monkeypatch, arch, d, d_v, s, t, causal)


SPLIT_PAIRS = [(256, 128), (128, 256)]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", [(17, 1000), (1000, 1000)], ids=["S17-T1000", "S1000-T1000"])
@pytest.mark.parametrize("d, d_v", SPLIT_PAIRS, ids=[f"D{d}-Dv{v}" for d, v in SPLIT_PAIRS])
def test_the_split_layout_s_pairs_on_the_device(poisoned, monkeypatch, d, d_v, s, t, causal):
    """256 / 128 and 128 / 256 on the device's target (sm_90a: the wgmma skeleton's split layout,
    each accumulator halved at its own N, a tail's first column each)."""
    _check(poisoned, monkeypatch, "device", d, d_v, s, t, causal)


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("d, d_v", PAIRS, ids=[f"D{d}-Dv{v}" for d, v in PAIRS])
def test_gqa_sums_dk_and_dv_over_each_group(poisoned, monkeypatch, d, d_v, arch):
    """GQA 4:2 (K and V of 2 heads, each serving 2 query heads), causal, S 1000, T 1000."""
    _check(poisoned, monkeypatch, arch, d, d_v, 1000, 1000, True, heads=(4, 2), seed=7)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_gradients_at_a_narrower_value_dim(poisoned, arch, causal):
    """kgen.attention_varlen, D 128 / D_v 64, packed ragged sequences (1, 17, 1000), GQA 4:2."""
    import kgen

    torch = poisoned
    skip_unless_runs(arch)
    lengths = (1, 17, 1000)
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    gen = torch.Generator(device="cuda").manual_seed(3)
    q, do = (torch.randn(cu[-1], 4, n, device="cuda", generator=gen).bfloat16()
             for n in (128, 64))
    k, v = (torch.randn(cu[-1], 2, n, device="cuda", generator=gen).bfloat16()
            for n in (128, 64))
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    offsets = torch.tensor(cu, dtype=torch.int32, device="cuda")
    out = kgen.attention_varlen(*leaves, offsets, offsets, max(lengths), max(lengths),
                                is_causal=causal, scale=0.1, arch=arch)
    assert out.shape == (cu[-1], 4, 64)
    out.backward(do)
    torch.cuda.synchronize()
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    ref, _ = varlen_reference(q64, k64, v64, cu, cu, 0.1, causal)
    ref.backward(do.double())
    close(out.detach(), ref.detach(), 2e-2, "O")
    close_grads([x.grad for x in leaves], [q64.grad, k64.grad, v64.grad], 2e-2)


def test_a_compiled_training_step_matches_the_eager_one():
    """torch.compile(fullgraph=True) of a step at D 128 / D_v 64 (causal, deterministic): the
    eager step's O, dQ, dK and dV bit for bit (the same kernels)."""
    torch = cuda_torch()
    import kgen

    gen = torch.Generator(device="cuda").manual_seed(5)
    q, do = (torch.randn(2, 2, 300, n, device="cuda", generator=gen).bfloat16()
             for n in (128, 64))
    k, v = (torch.randn(2, 2, 250, n, device="cuda", generator=gen).bfloat16()
            for n in (128, 64))

    def call(q, k, v):
        return kgen.attention(q, k, v, is_causal=True, deterministic=True)

    def train(fn):
        leaves = [x.clone().requires_grad_() for x in (q, k, v)]
        out = fn(*leaves)
        out.backward(do)
        torch.cuda.synchronize()
        return [out.detach()] + [x.grad for x in leaves]

    want = train(call)
    torch._dynamo.reset()
    got = train(torch.compile(call, fullgraph=True))
    for name, g, w in zip(("O", "dQ", "dK", "dV"), got, want):
        assert torch.equal(g, w), f"{name} differs from eager's"
    assert got[3].shape == v.shape
