"""On a GPU: kgen.attention's gradients with GQA (enable_gqa: k and v with HKV heads, q with H)
and a block mask (kgen/attention_grad.py: a CTA of the main kernel owns a KV head and walks, for
each query head of its group in turn, that head's listed query blocks; the lists transposed per
query head by kgen/attention_blocks.py `transposed_lists`), against float64 autograd of attention
with the same elementwise meaning, k and v repeated to the query heads (dK and dV then sum the
group's heads, each over its own listed blocks only): an element of query head h counts where
h's block is full, or partial and the mask (is_causal, mask_mod) keeps it. GQA 4:2 and 8:1, both
targets, causal and not, ragged lengths; FlexAttention's BlockMask (create_block_mask) with a
pattern per query head and shared by the heads (H = 1), and kgen's from_dense of a random block
pattern per query head. Every buffer the backward allocates is poisoned with NaN first
(tests/gpu/test_attention_grad_blocks_gpu.py's helpers, the non-GQA patterns)."""
from __future__ import annotations

import math

import pytest

import kgen
from kgen import attention as kattention
from kgen import attention_blocks as ab
from kgen.errors import ArgumentError
from tests.gpu.attention_checks import close, close_grads, cuda_torch, skip_unless_runs
from tests.gpu.test_attention_grad_blocks_gpu import WINDOW, _poison, _random_pattern, _state

pytestmark = pytest.mark.gpu

ARCHS = ["sm_80", "sm_90a"]
GROUPS = [(4, 2), (8, 1)]  # (query heads H, KV heads HKV)
LENGTHS = [(17, 1000), (1000, 1000), (1000, 4097), (4097, 17)]


def _inputs(torch, b, h, hkv, s, t, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(b, hkv, t, d, device="cuda", generator=gen).bfloat16() for _ in "kv")
    do = torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
    return q, k, v, do


def _reference(torch, q, k, v, do, scale, visible):
    """O and dQ, dK, dV by float64 autograd, k and v repeated to q's heads (their gradients the
    sums over each group): softmax over the visible elements of each row (none: O = 0)."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    group = q.shape[1] // k.shape[1]
    kr, vr = (x.repeat_interleave(group, dim=1) for x in (k64, v64))
    x = torch.where(visible, scale * (q64 @ kr.transpose(-1, -2)), -math.inf)
    m = x.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m).detach()
    p = torch.exp(x - m)
    total = p.sum(-1, keepdim=True)
    out = (p @ vr) / torch.where(total == 0, 1.0, total)
    out.backward(do.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def _run(torch, arch, s, t, causal, bm, heads, monkeypatch, d=64, b=2, seed=0):
    skip_unless_runs(arch)
    monkeypatch.setattr(kattention, "_arch", lambda device: arch)
    h, hkv = heads
    q, k, v, do = _inputs(torch, b, h, hkv, s, t, d, seed)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with monkeypatch.context() as patch:
        _poison(torch, patch)
        out = kgen.attention(q, k, v, is_causal=causal, mask_mod=f"col > row - {WINDOW}",
                             enable_gqa=True, block_mask=bm, deterministic=False)
        out.backward(do)
        torch.cuda.synchronize()
    row = torch.arange(s, device="cuda")[:, None]
    col = torch.arange(t, device="cuda")[None, :]
    keep = (col > row - WINDOW) & ((col <= row) if causal else True)
    state = _state(torch, bm, s, t)  # [B or 1, H or 1, S, T]
    visible = ((state == 2) | ((state == 1) & keep)).expand(b, h, s, t)
    ref, grads = _reference(torch, q, k, v, do, 1 / math.sqrt(d), visible)
    close(out, ref, 2e-2, f"O {arch}")
    close_grads((q.grad, k.grad, v.grad), grads, 3e-2)


def _flex(torch, s, t, causal, heads):
    """FlexAttention's BlockMask of the window (and causal), each query head of `heads` (None:
    shared) leaving out every third block of keys from its own offset: whole blocks, so the
    lists alone say it and the elementwise mask is the window's."""
    from torch.nn.attention.flex_attention import create_block_mask

    def mask(b, h, qi, kv):
        keep = (kv > qi - WINDOW) & (kv <= qi) if causal else kv > qi - WINDOW
        return keep & ((kv // 128 + h) % 3 != 0) if heads is not None else keep

    return create_block_mask(mask, None, heads, s, t, device="cuda")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("heads", GROUPS, ids=lambda g: f"{g[0]}:{g[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", LENGTHS, ids=lambda x: str(x))
def test_gqa_gradients_with_flexattentions_block_mask_per_query_head(arch, heads, causal, s, t,
                                                                     monkeypatch):
    torch = cuda_torch()
    bm = _flex(torch, s, t, causal, heads[0])
    _run(torch, arch, s, t, causal, bm, heads, monkeypatch, seed=s + 3 * t)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("heads", GROUPS, ids=lambda g: f"{g[0]}:{g[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_gqa_gradients_with_a_block_mask_shared_by_the_heads(arch, heads, causal, monkeypatch):
    torch = cuda_torch()
    bm = _flex(torch, 1000, 4097, causal, None)
    _run(torch, arch, 1000, 4097, causal, bm, heads, monkeypatch, seed=11)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("heads", GROUPS, ids=lambda g: f"{g[0]}:{g[1]}")
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", LENGTHS, ids=lambda x: str(x))
def test_gqa_gradients_with_kgens_lists_of_a_random_pattern_per_head(arch, heads, causal, s, t,
                                                                     monkeypatch):
    """Each query head its own pattern (empty, partial and full blocks): a KV head's dK and dV
    sum its group's heads over each head's listed blocks only."""
    torch = cuda_torch()
    bm = ab.from_dense(_random_pattern(torch, 2, heads[0], s, t, seed=s * t + heads[0]), 128)
    _run(torch, arch, s, t, causal, bm, heads, monkeypatch, seed=s + t)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d", [128, 256])
def test_gqa_gradients_at_larger_head_dims(arch, d, monkeypatch):
    torch = cuda_torch()
    if d == 256 and arch == "sm_80":
        pytest.skip("sm_80's backward keeps dK and dV in registers: no head dim 256")
    bm = ab.from_dense(_random_pattern(torch, 1, 4, 1000, 4097, seed=d), 128)
    _run(torch, arch, 1000, 4097, True, bm, (4, 2), monkeypatch, d=d, b=1, seed=d)


def test_partial_lists_only_and_the_deterministic_refusal(monkeypatch):
    """Lists per query head with no full pair (the mask applies on every listed block), GQA
    8:1; deterministic mode is refused at the call, by name, with GQA too."""
    torch = cuda_torch()
    full = ab.from_dense(_random_pattern(torch, 1, 8, 1000, 1000, seed=9), 128)
    bm = ab.BlockLists(full.kv_num_blocks, full.kv_indices, block_size=(128, 128))
    _run(torch, "sm_90a" if torch.cuda.get_device_capability() == (9, 0) else "sm_80",
         1000, 1000, True, bm, (8, 1), monkeypatch, b=1)
    q, k, v, _ = _inputs(torch, 1, 8, 1, 1000, 1000, 64, 1)
    with pytest.raises(ArgumentError, match="deterministic mode"):
        kgen.attention(q.requires_grad_(), k, v, enable_gqa=True, block_mask=bm,
                       deterministic=True)
