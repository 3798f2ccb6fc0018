"""kgen.attention's block masks on the CPU (kgen/attention_blocks.py): kgen's builder from a
dense boolean mask, FlexAttention's BlockMask split into kgen's tile (the same visited and full
elements), the tile chosen for a BlockMask's BLOCK_SIZE and the refusals by name; the program
text with its `blocks` line and the tile the rulebook gives it."""
from __future__ import annotations

import pytest

from kgen import attention as ka
from kgen import attention_blocks as ab
from kgen.errors import ArgumentError

torch = pytest.importorskip("torch")


def state_of(counts, indices, blocks: int, value: int, out=None):
    """The dense [B, H, tiles, blocks] state of one list pair: `value` where listed."""
    counts, indices = counts.long(), indices.long()
    b, h, tiles = counts.shape
    out = torch.zeros(b, h, tiles, blocks, dtype=torch.long) if out is None else out
    for i in range(b):
        for j in range(h):
            for t in range(tiles):
                for entry in indices[i, j, t, :counts[i, j, t]].tolist():
                    out[i, j, t, entry] = value
    return out


def element_state(lists, rows: int, cols: int, s: int, t: int):
    """Per element [B, H, S, T]: 0 skipped, 1 partial, 2 full."""
    blocks = -(-t // cols)
    state = state_of(lists[0], lists[1], blocks, 1)
    if len(lists) == 4:
        state = state_of(lists[2], lists[3], blocks, 2, state)
    return state.repeat_interleave(rows, 2)[:, :, :s].repeat_interleave(cols, 3)[..., :t]


def test_from_dense_lists_the_blocks_with_kept_elements():
    gen = torch.Generator().manual_seed(0)
    mask = torch.rand(2, 1, 200, 300, generator=gen) < 0.02
    mask[:, :, :128, :64] = True  # a full block
    lists = ab.from_dense(mask, (128, 64))
    assert lists.BLOCK_SIZE == (128, 64)
    assert lists.kv_num_blocks.dtype == torch.int32 and lists.kv_indices.shape == (2, 1, 2, 5)
    state = element_state((lists.kv_num_blocks, lists.kv_indices, lists.full_kv_num_blocks,
                           lists.full_kv_indices), 128, 64, 200, 300)
    blocks = mask.reshape(2, 1, 200, 300)
    for b in range(2):
        for tile in range(2):
            for block in range(5):
                part = blocks[b, 0, tile * 128:(tile + 1) * 128, block * 64:(block + 1) * 64]
                want = 2 if part.all() else (1 if part.any() else 0)
                assert state[b, 0, tile * 128, block * 64].item() == want, (b, tile, block)


def _flex_mask(fn, b, h, s, t, block=128):
    from torch.nn.attention.flex_attention import create_block_mask

    return create_block_mask(fn, b, h, s, t, device="cpu", BLOCK_SIZE=block)


@pytest.mark.parametrize("tile", [(128, 128), (128, 64), (64, 32)])
def test_a_flex_block_mask_splits_into_kgens_tile(tile):
    s, t = 300, 500
    bm = _flex_mask(lambda b, h, q, kv: (q >= kv) & (kv > q - 200), 1, 1, s, t)
    q = torch.zeros(2, 3, s, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 3, t, 64, dtype=torch.bfloat16)
    lists = ab.lists_for(bm, tile, q, k)
    rows, cols = tile
    assert [tuple(x.shape) for x in lists] == [(1, 1, -(-s // rows)),
                                               (1, 1, -(-s // rows), -(-t // cols))] * 2
    assert all(x.dtype == torch.int32 and x.is_contiguous() for x in lists)
    flex = element_state((bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                          bm.full_kv_indices), 128, 128, s, t)
    assert torch.equal(element_state(lists, rows, cols, s, t), flex)


def test_the_split_keeps_flexs_order_and_drops_blocks_past_the_keys():
    counts = torch.tensor([[[2]]], dtype=torch.int32)
    indices = torch.tensor([[[[3, 0, 1, 2]]]], dtype=torch.int32)  # 3: the keys' last block
    lists = ab.lists_for(ab.BlockLists(counts, indices, block_size=(128, 128)), (128, 64),
                         torch.zeros(1, 1, 100, 64), torch.zeros(1, 1, 420, 64))
    # 420 keys: kgen's blocks 0..6; Flex's block 3 is kgen's 6 (and 7, past the end)
    assert lists[0].tolist() == [[[3]]]
    assert lists[1][0, 0, 0, :3].tolist() == [6, 0, 1]


def test_the_tile_for_a_block_size():
    assert ab.tile_for((128, 128), (128, 128)) == (128, 128)
    assert ab.tile_for((128, 128), (128, 80)) == (128, 64)  # D 256 on sm_90a
    assert ab.tile_for((64, 256), (128, 64)) == (64, 64)
    with pytest.raises(ArgumentError, match=r"BLOCK_SIZE \(48, 128\) cannot be used: kgen runs "
                                            r"this attention in tiles of 128 query rows"):
        ab.tile_for((48, 128), (128, 64))


def test_mismatches_are_refused_by_name():
    bm = _flex_mask(lambda b, h, q, kv: q >= kv, 1, 1, 256, 256)
    q = torch.zeros(1, 2, 300, 64)
    with pytest.raises(ArgumentError, match=r"block_mask was built for \(S, T\) = \(256, 256\), "
                                            r"but q and k have \(S, T\) = \(300, 256\)"):
        ab.lists_for(bm, (128, 128), q, torch.zeros(1, 2, 256, 64))
    lists = ab.BlockLists(torch.zeros(3, 1, 2, dtype=torch.int32),
                          torch.zeros(3, 1, 2, 2, dtype=torch.int32))
    with pytest.raises(ArgumentError, match="block_mask has batch 3, but q has 1"):
        ab.lists_for(lists, (128, 128), torch.zeros(1, 2, 256, 64), torch.zeros(1, 2, 256, 64))
    with pytest.raises(ArgumentError, match="must be a FlexAttention BlockMask"):
        ab.block_size(object())


def test_the_program_text_and_its_tile():
    sig = ka.Signature("bf16", 128, 128, True, None, None, (), "sm_80", block_mask="full")
    text = ka.program_text(sig)
    assert ("    blocks by kv_num_blocks, kv_indices, full full_kv_num_blocks, full_kv_indices\n"
            in text)
    assert ka.default_tile(sig) == (128, 64)  # 16 rows a warp: the lists' registers
    sized = ka.program_text(ka.Signature("bf16", 256, 256, False, None, None, (), "sm_90a",
                                         block_mask="partial", blocks=(128, 64)))
    assert "    blocks 128x64 by kv_num_blocks, kv_indices\n" in sized
    assert ka.default_tile(ka.Signature("bf16", 128, 128, False, None, None, (), "sm_90a",
                                        block_mask="partial")) == (128, 128)
    with pytest.raises(ArgumentError, match="scalar name 'kv_indices' is not usable"):
        ka._usable("kv_indices", "scalar")


def test_lists_at_kgens_tile_pass_as_they_are_and_a_split_is_kept():
    bm = _flex_mask(lambda b, h, q, kv: q >= kv, 1, 1, 300, 500)
    q, k = torch.zeros(1, 2, 300, 64), torch.zeros(1, 2, 500, 64)
    same = ab.lists_for(bm, (128, 128), q, k)
    assert same[0] is bm.kv_num_blocks and same[1] is bm.kv_indices
    split = ab.lists_for(bm, (128, 64), q, k)
    again = ab.lists_for(bm, (128, 64), q, k)
    assert all(a is b for a, b in zip(split, again))  # converted once per source
    bm.kv_num_blocks.add_(0)  # an in-place change (its version): converted again
    assert ab.lists_for(bm, (128, 64), q, k)[0] is not split[0]


# ---------------------------------------------------------------------------------------------
# The backward's lists: per tile of keys, the blocks of queries (transposed_lists)


@pytest.mark.parametrize("tile", [(128, 64), (128, 32), (64, 64), (128, 128)])
@pytest.mark.parametrize("s, t", [(17, 1000), (300, 500), (1000, 17)])
def test_the_backward_lists_are_the_masks_blocks_transposed(tile, s, t):
    """Each (key tile, query block) of the backward's tile lies in one block of the mask: its
    state in the transposed lists (0 unlisted, 1 partial, 2 full) is that block's, for a random
    boolean pattern (from_dense: partial, full and empty blocks) and a FlexAttention mask."""
    gen = torch.Generator().manual_seed(s + t)
    keys, queries = tile
    dense = torch.rand(2, 3, -(-s // 128), -(-t // 128), generator=gen)
    elements = (dense.repeat_interleave(128, 2)[:, :, :s].repeat_interleave(128, 3)[..., :t])
    mask = (elements < 0.3) | ((elements < 0.7) & (torch.rand(2, 3, s, t, generator=gen) < 0.5))
    flex = _flex_mask(lambda b, h, q, kv: (q >= kv) & (kv > q - 300), 1, 1, s, t)
    q = torch.zeros(2, 3, s, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 3, t, 64, dtype=torch.bfloat16)
    for bm in (ab.from_dense(mask, 128), flex):
        lists = ab.transposed_lists(bm, tile, q, k)
        lead = tuple(bm.kv_num_blocks.shape[:2])
        assert [tuple(x.shape) for x in lists] == [(*lead, -(-t // keys)),
                                                   (*lead, -(-t // keys), -(-s // queries))] * 2
        assert all(x.dtype == torch.int32 and x.is_contiguous() for x in lists)
        forward = element_state((bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                                 bm.full_kv_indices), 128, 128, s, t)  # [B, H, S, T]
        backward = element_state(lists, keys, queries, t, s)  # [B, H, T, S]
        assert torch.equal(backward, forward.transpose(-1, -2))
        # ascending within each list (the kernel's visits in order)
        for counts, indices in ((lists[0], lists[1]), (lists[2], lists[3])):
            for i in torch.nonzero(counts > 1).tolist():
                listed = indices[tuple(i)][:counts[tuple(i)]]
                assert bool((listed[1:] > listed[:-1]).all())


@pytest.mark.parametrize("list_heads", [4, 1])
def test_the_backward_lists_with_gqa_are_per_query_head(list_heads):
    """GQA (q with 4 heads, k with 2): the lists have the mask's heads, the query heads (each
    its own state) or 1 (shared by every query head); the KV heads' count is refused."""
    s, t = 300, 1000
    gen = torch.Generator().manual_seed(list_heads)
    dense = torch.rand(2, list_heads, 3, 8, generator=gen)  # per head, block by block
    elements = dense.repeat_interleave(128, 2)[:, :, :s].repeat_interleave(128, 3)[..., :t]
    mask = (elements < 0.3) | ((elements < 0.7)
                               & (torch.rand(2, list_heads, s, t, generator=gen) < 0.5))
    bm = ab.from_dense(mask, 128)
    q = torch.zeros(2, 4, s, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 2, t, 64, dtype=torch.bfloat16)
    lists = ab.transposed_lists(bm, (128, 64), q, k)
    assert [tuple(x.shape) for x in lists] == [(2, list_heads, 8), (2, list_heads, 8, 5)] * 2
    forward = element_state((bm.kv_num_blocks, bm.kv_indices, bm.full_kv_num_blocks,
                             bm.full_kv_indices), 128, 128, s, t)
    backward = element_state(lists, 128, 64, t, s)
    assert torch.equal(backward, forward.transpose(-1, -2))
    if list_heads > 1:
        assert not torch.equal(backward[:, 0], backward[:, 1])
    with pytest.raises(ArgumentError, match="block_mask has heads 2, but q has 4"):
        ab.transposed_lists(ab.from_dense(mask[:, :1].expand(2, 2, s, t), 128), (128, 64),
                            q, k)


def test_the_backward_lists_without_full_blocks_and_with_stray_indices():
    """A mask of partial lists only has empty full lists; indices past the keys' blocks and
    counts past the list list nothing (an unused entry is never read)."""
    counts = torch.tensor([[[3, 9]]], dtype=torch.int32)  # tile 1: more than its entries
    indices = torch.tensor([[[[1, 7, -1], [0, 0, 1]]]], dtype=torch.int32)  # 7, -1: stray
    bm = ab.BlockLists(counts, indices, block_size=(128, 128))
    q = torch.zeros(1, 1, 256, 64, dtype=torch.bfloat16)
    k = torch.zeros(1, 1, 384, 64, dtype=torch.bfloat16)
    lists = ab.transposed_lists(bm, (128, 64), q, k)
    state = element_state(lists, 128, 64, 384, 256)[0, 0]  # [T, S]
    want = torch.zeros(384, 256, dtype=torch.long)
    want[128:256, :128] = 1  # query block 0 lists key block 1
    want[:256, 128:] = 1  # query block 1 lists key blocks 0 and 1
    assert torch.equal(state, want)
    assert int(lists[2].sum()) == 0


def test_the_backward_lists_are_kept_per_source_and_version():
    bm = ab.from_dense(torch.ones(1, 1, 256, 256, dtype=torch.bool), 128)
    q = torch.zeros(1, 1, 256, 64, dtype=torch.bfloat16)
    one = ab.transposed_lists(bm, (128, 64), q, q)
    assert ab.transposed_lists(bm, (128, 64), q, q) is one
    bm.full_kv_num_blocks.add_(0)  # an in-place change (its version): transposed again
    assert ab.transposed_lists(bm, (128, 64), q, q) is not one


def test_a_block_size_the_backwards_tile_does_not_divide_is_refused_by_name():
    with pytest.raises(ArgumentError, match=r"BLOCK_SIZE \(128, 64\) cannot be used by "
                       r"kgen.attention's backward: it runs in tiles of 128 keys by 64 "
                       r"queries.*key block must be a multiple of 128"):
        ab.backward_tile_check((128, 64), (128, 64))
    ab.backward_tile_check((128, 128), (128, 64))
    ab.backward_tile_check((64, 256), (128, 32))
