"""On a GPU: kgen.attention's gradients with a block mask (kgen/attention_grad.py: the main
kernel's `blocks` line, the lists transposed per tile of keys by kgen/attention_blocks.py
`transposed_lists`), against float64 autograd of attention with the same elementwise meaning:
an element counts where its block of the mask is full, or partial and the mask (is_causal,
mask_mod) keeps it; an unlisted block's elements count for nothing (its keys get no gradient
from those queries, and those queries none from its keys). Both targets, causal and not, ragged
lengths: FlexAttention's BlockMask (create_block_mask) and kgen's from_dense of a random boolean
block pattern (empty, partial and full blocks; key tiles that visit nothing). Every buffer the
backward allocates is poisoned with NaN first. A training step with a block mask captured into a
CUDA graph, and torch.compile's ops, give the eager gradients."""
from __future__ import annotations

import math

import pytest

import kgen
from kgen import attention as kattention
from kgen import attention_blocks as ab
from kgen.errors import ArgumentError
from tests.gpu.attention_checks import close, close_grads, cuda_torch, skip_unless_runs

pytestmark = pytest.mark.gpu

ARCHS = ["sm_80", "sm_90a"]
LENGTHS = [(17, 17), (1000, 1000), (17, 4097), (4097, 1000), (1000, 17)]
WINDOW = 700  # the mask_mod beside the block mask: col > row - WINDOW


def _inputs(torch, b, h, s, t, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, d, device="cuda", generator=gen).bfloat16()
               for n in (s, t, t))
    do = torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
    return q, k, v, do


def _state(torch, bm, s, t):
    """Per element [B or 1, H or 1, S, T]: 0 unlisted, 1 partial, 2 full (each block listed
    once)."""
    rows, cols = ab.block_size(bm)
    out = None
    for value, counts, indices in ((1, bm.kv_num_blocks, bm.kv_indices),
                                   (2, bm.full_kv_num_blocks, bm.full_kv_indices)):
        if counts is None:
            continue
        blocks = -(-t // cols)
        dense = torch.zeros(*indices.shape[:3], blocks + 1, dtype=torch.long, device="cuda")
        listed = torch.arange(indices.shape[-1], device="cuda") < counts.long()[..., None]
        ok = listed & (indices.long() >= 0) & (indices.long() < blocks)
        dense.scatter_(-1, torch.where(ok, indices.long(), blocks), value)
        dense = dense[..., :blocks]
        out = dense if out is None else torch.maximum(out, dense)
    return out.repeat_interleave(rows, 2)[:, :, :s].repeat_interleave(cols, 3)[..., :t]


def _reference(torch, q, k, v, do, scale, visible):
    """O and dQ, dK, dV by float64 autograd: softmax over the visible elements of each row (a
    row with none: O = 0, no gradient)."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    x = torch.where(visible, scale * (q64 @ k64.transpose(-1, -2)), -math.inf)
    m = x.amax(-1, keepdim=True)
    m = torch.where(m == -math.inf, 0.0, m).detach()
    p = torch.exp(x - m)
    total = p.sum(-1, keepdim=True)
    out = (p @ v64) / torch.where(total == 0, 1.0, total)
    out.backward(do.double())
    return out.detach(), (q64.grad, k64.grad, v64.grad)


def _poison(torch, patch):
    """torch.empty's float buffers filled with NaN (the backward's D, dQ accumulator and
    gradients among them) within `patch` (a monkeypatch context): an element the kernels leave
    unwritten shows."""
    empty = torch.empty

    def nan_empty(*args, **kwargs):
        out = empty(*args, **kwargs)
        return out.fill_(math.nan) if out.is_floating_point() else out

    patch.setattr(torch, "empty", nan_empty)


def _random_pattern(torch, b, h, s, t, seed):
    """A boolean [B, H, S, T] of 128x128 blocks each empty, partial (random elements) or full,
    about a third each; from_dense lists it."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    kind = torch.randint(0, 3, (b, h, -(-s // 128), -(-t // 128)), device="cuda", generator=gen)
    kind = kind.repeat_interleave(128, 2)[:, :, :s].repeat_interleave(128, 3)[..., :t]
    some = torch.rand(b, h, s, t, device="cuda", generator=gen) < 0.5
    return (kind == 2) | ((kind == 1) & some)


def _run(torch, arch, s, t, causal, bm, monkeypatch, d=64, b=2, h=3, seed=0):
    skip_unless_runs(arch)
    monkeypatch.setattr(kattention, "_arch", lambda device: arch)
    q, k, v, do = _inputs(torch, b, h, s, t, d, seed)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    with monkeypatch.context() as patch:
        _poison(torch, patch)
        out = kgen.attention(q, k, v, is_causal=causal, mask_mod=f"col > row - {WINDOW}",
                             block_mask=bm, deterministic=False)
        out.backward(do)
        torch.cuda.synchronize()
    row = torch.arange(s, device="cuda")[:, None]
    col = torch.arange(t, device="cuda")[None, :]
    keep = (col > row - WINDOW) & ((col <= row) if causal else True)
    state = _state(torch, bm, s, t)
    visible = (state == 2) | ((state == 1) & keep)
    ref, grads = _reference(torch, q, k, v, do, 1 / math.sqrt(d), visible)
    close(out, ref, 2e-2, f"O {arch}")
    close_grads((q.grad, k.grad, v.grad), grads, 3e-2)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", LENGTHS, ids=lambda x: str(x))
def test_gradients_with_flexattentions_block_mask(arch, causal, s, t, monkeypatch):
    torch = cuda_torch()
    from torch.nn.attention.flex_attention import create_block_mask

    def mask(b, h, qi, kv):
        return (kv > qi - WINDOW) & (kv <= qi) if causal else kv > qi - WINDOW

    bm = create_block_mask(mask, None, None, s, t, device="cuda")
    _run(torch, arch, s, t, causal, bm, monkeypatch, seed=s + 3 * t)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", LENGTHS, ids=lambda x: str(x))
def test_gradients_with_kgens_lists_of_a_random_block_pattern(arch, causal, s, t, monkeypatch):
    """Full blocks count every element (even those the mask drops), unlisted ones none (even
    those it keeps): the lists, not the mask, decide which blocks count."""
    torch = cuda_torch()
    bm = ab.from_dense(_random_pattern(torch, 2, 3, s, t, seed=s * t), 128)
    _run(torch, arch, s, t, causal, bm, monkeypatch, seed=s + t)


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("d", [128, 256])
def test_gradients_at_larger_head_dims(arch, d, monkeypatch):
    torch = cuda_torch()
    if d == 256 and arch == "sm_80":
        pytest.skip("sm_80's backward keeps dK and dV in registers: no head dim 256")
    bm = ab.from_dense(_random_pattern(torch, 1, 2, 1000, 4097, seed=d), 128)
    _run(torch, arch, 1000, 4097, True, bm, monkeypatch, d=d, b=1, h=2, seed=d)


def test_shared_partial_lists_and_the_deterministic_refusal(monkeypatch):
    """Lists shared by batch and heads (B = H = 1) with no full pair: the mask applies on every
    listed block. Deterministic mode is refused at the call, by name."""
    torch = cuda_torch()
    full = ab.from_dense(_random_pattern(torch, 1, 1, 1000, 1000, seed=9), 128)
    bm = ab.BlockLists(full.kv_num_blocks, full.kv_indices, block_size=(128, 128))
    _run(torch, "sm_90a" if torch.cuda.get_device_capability() == (9, 0) else "sm_80",
         1000, 1000, True, bm, monkeypatch)
    q, k, v, _ = _inputs(torch, 1, 1, 1000, 1000, 64, 1)
    with pytest.raises(ArgumentError, match="deterministic mode"):
        kgen.attention(q.requires_grad_(), k, v, block_mask=bm, deterministic=True)


def test_a_training_step_with_a_block_mask_captures_into_a_cuda_graph():
    torch = cuda_torch()
    bm = ab.from_dense(_random_pattern(torch, 1, 2, 700, 900, seed=4), 128)
    q, k, v, do = _inputs(torch, 1, 2, 700, 900, 64, 3)
    q, k, v = (x.requires_grad_() for x in (q, k, v))

    def step():
        for x in (q, k, v):
            x.grad = None
        out = kgen.attention(q, k, v, is_causal=True, block_mask=bm, deterministic=False)
        out.backward(do)
        return out

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()  # compiled, loaded and the lists transposed outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    fresh = _inputs(torch, 1, 2, 700, 900, 64, 5)
    with torch.no_grad():
        for old, new in zip((q, k, v, do), fresh):
            old.copy_(new)
    graph.replay()
    torch.cuda.synchronize()
    grads = tuple(x.grad.clone() for x in (q, k, v))
    want = step()
    torch.cuda.synchronize()
    assert torch.equal(out, want)
    for got, eager in zip(grads, (q.grad, k.grad, v.grad)):
        close(got, eager.double(), 1e-2, "graph")


def test_torch_compile_gives_the_eager_gradients():
    torch = cuda_torch()
    bm = ab.from_dense(_random_pattern(torch, 2, 3, 300, 500, seed=6), 128)
    q, k, v, do = _inputs(torch, 2, 3, 300, 500, 64, 7)

    def grads(call):
        leaves = [x.detach().clone().requires_grad_() for x in (q, k, v)]
        call(*leaves, bm).backward(do)
        return [x.grad for x in leaves]

    def attention(q, k, v, mask):
        return kgen.attention(q, k, v, mask_mod=f"col > row - {WINDOW}", block_mask=mask,
                              deterministic=False)

    eager = grads(attention)
    torch._dynamo.reset()
    compiled = grads(torch.compile(attention, fullgraph=True))
    for got, want in zip(compiled, eager):
        close(got, want.double(), 1e-2, "compiled")
