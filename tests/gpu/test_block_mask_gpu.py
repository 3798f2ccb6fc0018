"""On a GPU: the forward attention with a block mask (FlexAttention's meaning: a tile of query
rows visits its listed partial blocks with the mask applied, then its full blocks without; a
block listed in neither counts for nothing) against float64 computed here, both skeletons, at
ragged lengths: FlexAttention's causal BlockMask (converted to kgen's tile), random sparse
block lists in a random order whose full blocks hold masked elements (they count there), a
boolean attn_mask with kgen's own lists from it (from_dense), GQA, rows that visit nothing
(O = 0, lse = -inf); the DSL's `blocks` line through the program runtime with poisoned
outputs, and the sm_90a skeleton's persistent walk."""
from __future__ import annotations

import dataclasses
import math

import pytest

import kgen
from kgen import attention as kattention
from kgen import attention_blocks as ab
from kgen.api import build_verified, load_built
from tests.gpu.attention_checks import close, cuda_torch

pytestmark = pytest.mark.gpu

ARCHS = ["sm_80", "sm_90a"]
LENGTHS = [(1, 17), (1000, 4097), (4097, 1000), (300, 300)]


def _arch_or_skip(torch, arch):
    if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a needs compute capability 9.0")


def reference(q, k, v, scale, state, keep):
    """O and lse in float64: an element counts where `state` (per element, [B or 1, H or 1,
    S, T]: 0 skipped, 1 partial, 2 full) is 2, or 1 and `keep` holds."""
    torch = cuda_torch()
    group = q.shape[1] // k.shape[1]
    kk = k.double().repeat_interleave(group, dim=1)
    vv = v.double().repeat_interleave(group, dim=1)
    x = scale * (q.double() @ kk.transpose(-1, -2))
    visible = (state == 2) | ((state == 1) & keep)
    x = torch.where(visible, x, -math.inf)
    m = x.amax(-1)
    m_use = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(x - m_use[..., None])
    total = p.sum(-1)
    o = torch.where(total[..., None] == 0, 0.0, (p @ vv) / total[..., None])
    return o, torch.where(total == 0, -math.inf, m + torch.log(total))


def element_state(torch, lists, rows, cols, s, t):
    """Per element: 0, 1 (listed partial), 2 (listed full); a block listed twice counts as
    its last listing here (the tests list each block once)."""
    out = None
    for value, (counts, indices) in ((1, lists[:2]), (2, lists[2:4])):
        if counts is None:
            continue
        blocks = -(-t // cols)
        dense = torch.zeros(*indices.shape[:3], blocks + 1, dtype=torch.long, device="cuda")
        place = torch.arange(indices.shape[-1], device="cuda")
        listed = place < counts.long()[..., None]
        target = torch.where(listed, indices.long().clamp(0, blocks - 1), blocks)
        dense.scatter_(-1, target, value)
        dense = dense[..., :blocks]
        out = dense if out is None else torch.maximum(out, dense)
    return out.repeat_interleave(rows, 2)[:, :, :s].repeat_interleave(cols, 3)[..., :t]


def _inputs(torch, b, h, hkv, s, t, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    return tuple(torch.randn(b, heads, n, d, device="cuda", generator=gen).bfloat16()
                 for heads, n in ((h, s), (hkv, t), (hkv, t)))


def _positions(torch, s, t):
    return (torch.arange(s, device="cuda")[:, None], torch.arange(t, device="cuda")[None, :])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("s, t", LENGTHS, ids=lambda x: str(x))
def test_flexattentions_causal_block_mask(arch, s, t, monkeypatch):
    torch = cuda_torch()
    _arch_or_skip(torch, arch)
    from torch.nn.attention.flex_attention import create_block_mask

    monkeypatch.setattr(kattention, "_arch", lambda device: arch)
    q, k, v = _inputs(torch, 2, 4, 2, s, t, 128, seed=s + 7 * t)
    bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, s, t, device="cuda")
    o, lse = kgen.attention(q, k, v, mask_mod="col <= row", block_mask=bm, enable_gqa=True,
                            scale=0.1, return_lse=True)
    torch.cuda.synchronize()
    state = element_state(torch, (bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                  bm.full_kv_indices), 128, 128, s, t)
    row, col = _positions(torch, s, t)
    ref_o, ref_lse = reference(q, k, v, 0.1, state, col <= row)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


def _random_lists(torch, b, h, tiles, blocks, seed, rows=128, cols=128):
    """Random sparse lists (about half the blocks skipped, a quarter partial, a quarter full),
    each list in a random order."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    state = torch.randint(0, 4, (b, h, tiles, blocks), device="cuda", generator=gen)
    state = torch.where(state == 3, 0, state)  # 0 twice as likely
    pairs = []
    for value in (1, 2):
        keys = torch.where(state == value, torch.rand(state.shape, device="cuda",
                                                      generator=gen), 2.0)
        order = keys.argsort(dim=-1).to(torch.int32)
        pairs += [(state == value).sum(-1).to(torch.int32), order.contiguous()]
    return ab.BlockLists(*pairs, block_size=(rows, cols))


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("s, t", LENGTHS, ids=lambda x: str(x))
@pytest.mark.parametrize("d", [64, 128])
def test_random_sparse_lists_whose_full_blocks_hold_masked_elements(arch, s, t, d, monkeypatch):
    """A full block counts every element, even those the mask would drop: FlexAttention's
    meaning, the kernel's and the reference's."""
    torch = cuda_torch()
    _arch_or_skip(torch, arch)
    monkeypatch.setattr(kattention, "_arch", lambda device: arch)
    q, k, v = _inputs(torch, 2, 4, 4, s, t, d, seed=3 * s + t + d)
    lists = _random_lists(torch, 2, 4, -(-s // 128), -(-t // 128), seed=s + t)
    mod = "col > row - 700"
    o, lse = kgen.attention(q, k, v, mask_mod=mod, block_mask=lists, return_lse=True)
    torch.cuda.synchronize()
    state = element_state(torch, (lists.kv_num_blocks, lists.kv_indices,
                                  lists.full_kv_num_blocks, lists.full_kv_indices),
                          128, 128, s, t)
    row, col = _positions(torch, s, t)
    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(d), state, col > row - 700)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")
    # partial lists only (no full pair): the mask applies on every listed block
    partial = ab.BlockLists(lists.kv_num_blocks, lists.kv_indices, block_size=(128, 128))
    o2 = kgen.attention(q, k, v, mask_mod=mod, block_mask=partial)
    state2 = torch.where(state == 2, 0, state)
    close(o2, reference(q, k, v, 1 / math.sqrt(d), state2, col > row - 700)[0], 2e-2, "O partial")


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("s, t", [(1000, 4097), (300, 300)], ids=lambda x: str(x))
def test_a_boolean_mask_with_kgens_lists_from_it(arch, s, t, monkeypatch):
    """Any predicate as a bool attn_mask (a bias, on every visited block) and the lists that
    skip its empty blocks (from_dense): SDPA's masked attention, rows that keep nothing O = 0."""
    torch = cuda_torch()
    _arch_or_skip(torch, arch)
    monkeypatch.setattr(kattention, "_arch", lambda device: arch)
    q, k, v = _inputs(torch, 1, 4, 4, s, t, 128, seed=11)
    row, col = _positions(torch, s, t)
    mask = ((row // 200) == (col // 300)) & (((row + col) % 7) != 0)  # blocky and ragged
    mask = mask[None, None].expand(1, 4, s, t)
    lists = ab.from_dense(mask, 128)
    o, lse = kgen.attention(q, k, v, mask, block_mask=lists, return_lse=True)
    torch.cuda.synchronize()
    everywhere = torch.full((1, 1, s, t), 1, dtype=torch.long, device="cuda")
    ref_o, ref_lse = reference(q, k, v, 1 / math.sqrt(128), everywhere, mask)
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


@pytest.mark.parametrize("arch", ARCHS)
def test_rows_that_visit_nothing_and_shared_lists(arch, monkeypatch):
    torch = cuda_torch()
    _arch_or_skip(torch, arch)
    monkeypatch.setattr(kattention, "_arch", lambda device: arch)
    s, t = 1000, 1000
    q, k, v = _inputs(torch, 2, 4, 4, s, t, 64, seed=5)
    tiles, blocks = -(-s // 128), -(-t // 128)
    counts = torch.full((1, 1, tiles), 2, dtype=torch.int32, device="cuda")
    counts[..., 0] = 0  # the first tile of rows visits nothing
    indices = torch.zeros(1, 1, tiles, blocks, dtype=torch.int32, device="cuda")
    indices[..., 1] = blocks - 1  # the first block and the last (ragged) one
    o, lse = kgen.attention(q, k, v, block_mask=ab.BlockLists(counts, indices), return_lse=True)
    torch.cuda.synchronize()
    assert (lse[:, :, :128] == -math.inf).all() and (o[:, :, :128] == 0).all()
    state = element_state(torch, (counts, indices, None, None), 128, 128, s, t)
    ref_o, ref_lse = reference(q, k, v, 1 / 8, state, torch.ones(1, dtype=torch.bool,
                                                                  device="cuda"))
    close(o, ref_o, 2e-2, f"O {arch}")
    close(lse, ref_lse, 1e-3, f"lse {arch}")


def test_the_dsl_line_through_the_program_runtime_and_the_persistent_walk():
    """tests/test_block_mask.py's kernel (a vector mask), outputs poisoned with NaN, both
    skeletons and the sm_90a persistent walk."""
    torch = cuda_torch()
    from kgen.targets.sm90.loop import emit_loop
    from kgen.targets.sm90.loop_schedule import with_scheduler
    from tests.test_block_mask import TEXT, kernel_of

    runs = []
    for arch in ARCHS:
        if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
            continue
        built = build_verified(kernel_of(TEXT.replace("target sm_90a", f"target {arch}")), arch)
        runs.append((arch, load_built(built)))
        if arch == "sm_90a":
            plan = with_scheduler(built.plan, True)
            source = emit_loop(plan, source_name="test", source_hash="0", command="test")
            runs.append(("persistent", load_built(dataclasses.replace(built, plan=plan,
                                                                      source=source))))
    for s, t in ((1000, 4097), (17, 300)):
        q, k, v = _inputs(torch, 2, 4, 4, s, t, 128, seed=s)
        allowed = (torch.rand(2, 4, t, device="cuda") < 0.7).float()
        lists = _random_lists(torch, 2, 1, -(-s // 128), -(-t // 64), seed=t, cols=64)
        names = dict(kv_num_blocks=lists.kv_num_blocks, kv_indices=lists.kv_indices,
                     full_kv_num_blocks=lists.full_kv_num_blocks,
                     full_kv_indices=lists.full_kv_indices)
        state = element_state(torch, tuple(names.values()), 128, 64, s, t)
        row, col = _positions(torch, s, t)
        keep = (allowed[:, :, None, :] != 0) & (col > row - 300)
        ref_o, ref_lse = reference(q, k, v, 0.08838834764, state, keep)
        for what, run in runs:
            o = torch.full((2, 4, s, 128), math.nan, device="cuda", dtype=torch.bfloat16)
            lse = torch.full((2, 4, s), math.nan, device="cuda")
            run(Q=q, K=k, V=v, O=o, lse=lse, allowed=allowed, **names)
            torch.cuda.synchronize()
            close(o, ref_o, 2e-2, f"O {what} {s}x{t}")
            close(lse, ref_lse, 1e-4, f"lse {what} {s}x{t}")
