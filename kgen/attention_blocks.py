"""Block masks for `kgen.attention(..., block_mask=...)`: FlexAttention's BlockMask, or kgen's
own `BlockLists` (`from_dense` builds one from any boolean mask), as the lists the program's
`blocks MxN by kv_num_blocks, kv_indices[, full ...]` line reads at kgen's tile.

The meaning is FlexAttention's (docs/language.md, "Masked blocks skipped"): each tile of query
rows visits its listed partial blocks, where the mask (is_causal and mask_mod) applies, then
its listed full blocks, where it does not (the lists assert every element is kept there); a
block listed in neither is skipped, whatever its elements. An attn_mask is a bias: it applies
on every visited block.

A block mask of Q_BLOCK x KV_BLOCK (BlockMask.BLOCK_SIZE) converts to kgen's tile M x N when M
divides Q_BLOCK and N divides KV_BLOCK: each of its blocks is (Q_BLOCK / M) x (KV_BLOCK / N) of
kgen's, listed in the same order (the sub-blocks past the keys' end dropped). The tile is the
rulebook's for the call (kgen/targets/loop_rules.py), or the largest smaller one that divides
(a BlockMask at 128 x 128, FlexAttention's default, converts at every head dim). Nothing here
synchronizes: a CUDA graph can capture the conversion.

The backward (kgen/attention_grad.py) walks the other way: a tile of keys visits blocks of
queries. `transposed_lists` gives, per (batch, head, tile of keys), the query blocks whose
(query block, key tile) lies in a listed block of the mask, partial then full (FlexAttention's
q_num_blocks, q_indices, full_q_*), at the backward's tile: its keys must divide the mask's
KV_BLOCK and its queries the mask's Q_BLOCK, so each of its tiles lies in one block of the mask.
Built from the kv lists on the device, without a synchronization (a CUDA graph captures it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .errors import ArgumentError

__all__ = ["BlockLists", "checked_lists", "from_dense", "lists_for", "tile_for",
           "backward_tile_check", "transposed_lists"]

TILE_M = (128, 64)  # kgen's tiles of rows, largest first (kgen/verify/loops.py: LOOP_TILE_M)
TILE_N = (128, 80, 64, 32)  # its blocks of keys (LOOP_TILE_N)


@dataclass(frozen=True)
class BlockLists:
    """kgen's block mask, in FlexAttention's layout: per (batch, head, tile of `block_size[0]`
    query rows) the count and indices (int32) of the partial blocks of `block_size[1]` keys
    to visit, and optionally of the full ones. Batch and heads may be 1 (shared)."""

    kv_num_blocks: Any
    kv_indices: Any
    full_kv_num_blocks: Any = None
    full_kv_indices: Any = None
    block_size: tuple[int, int] = (128, 128)

    @property
    def BLOCK_SIZE(self) -> tuple[int, int]:  # noqa: N802  (FlexAttention's name)
        return self.block_size


def from_dense(mask, block_size: int | tuple[int, int] = 128) -> BlockLists:
    """The BlockLists of a boolean mask [B or 1, H or 1, S, T] (True keeps): a block with a
    kept element is listed, as full where every element of it that exists is kept."""
    import torch

    rows, cols = (block_size, block_size) if isinstance(block_size, int) else block_size
    if mask.dtype != torch.bool or mask.dim() != 4:
        raise ArgumentError(f"from_dense takes a bool mask [B, H, S, T], got {mask.dtype} of "
                            f"shape {list(mask.shape)}")
    b, h, s, t = mask.shape
    tiles, blocks = -(-s // rows), -(-t // cols)
    padded = torch.ones((b, h, tiles * rows, blocks * cols), dtype=torch.bool,
                        device=mask.device)
    padded[:, :, :s, :t] = mask
    kept = torch.zeros_like(padded)
    kept[:, :, :s, :t] = mask
    shape = (b, h, tiles, rows, blocks, cols)
    full = padded.view(shape).all(dim=5).all(dim=3)  # past the ends counts as kept
    any_kept = kept.view(shape).any(dim=5).any(dim=3)
    partial = any_kept & ~full
    return BlockLists(*_ordered(partial), *_ordered(full & any_kept), (rows, cols))


def _ordered(dense):
    """Counts and indices of a [..., tiles, blocks] bool: the listed blocks first, ascending."""
    import torch

    dense = dense.to(torch.int32)
    return (dense.sum(dim=-1).to(torch.int32).contiguous(),
            torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32)
            .contiguous())


def block_size(block_mask) -> tuple[int, int]:
    """(rows, keys) of a BlockMask or BlockLists."""
    size = getattr(block_mask, "BLOCK_SIZE", None)
    if size is None or not hasattr(block_mask, "kv_num_blocks"):
        raise ArgumentError(f"block_mask must be a FlexAttention BlockMask or a "
                            f"kgen.attention_blocks.BlockLists, got {type(block_mask).__name__}")
    rows, cols = (size, size) if isinstance(size, int) else tuple(size)
    return int(rows), int(cols)


def tile_for(size: tuple[int, int], tile: tuple[int, int]) -> tuple[int, int]:
    """kgen's tile (rows, block) for a block mask of `size`: the rulebook's `tile` where it
    divides the mask's blocks, else the largest smaller tile sizes that do."""
    rows = next((m for m in TILE_M if m <= tile[0] and size[0] % m == 0), None)
    cols = next((n for n in TILE_N if n <= tile[1] and size[1] % n == 0), None)
    if rows is None or cols is None:
        raise ArgumentError(
            f"block_mask's BLOCK_SIZE {size} cannot be used: kgen runs this attention in tiles "
            f"of {tile[0]} query rows by {tile[1]} keys and splits a block mask's blocks into "
            f"them, so the query block must be a multiple of 64 and the key block of 32 (of "
            f"{tile[0]} and {tile[1]} for the full speed), e.g. BLOCK_SIZE=(128, 128)")
    return rows, cols


def lists_for(block_mask, tile: tuple[int, int], q, k) -> list:
    """The program's block lists (counts, indices, then the full pair if any) for q [B, H, S,
    D] and k [B, HKV, T, D] at kgen's `tile`."""
    rows, cols = block_size(block_mask)
    m, n = tile
    b, h, s, t = int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2])
    lists = checked_lists(block_mask, q, k)
    out = []
    for counts, indices in zip(lists[::2], lists[1::2]):
        out += _converted(counts, indices, rows // m, cols // n, -(-s // m), -(-t // n), b, h,
                          q.device)
    return out


def checked_lists(block_mask, q, k) -> list:
    """The block mask's lists as given (counts, indices, then the full pair if any), their
    shapes checked for q and k (shapes only: a traced call's fake tensors too): counts [B or 1,
    H or 1, row blocks], indices [..., key blocks], rows enough for S."""
    import numpy as np

    rows, _ = block_size(block_mask)
    b, h, s, t = int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2])
    lengths = getattr(block_mask, "seq_lengths", None)
    if lengths is not None and tuple(int(x) for x in lengths) != (s, t):
        raise ArgumentError(f"block_mask was built for (S, T) = {tuple(lengths)}, but q and k "
                            f"have (S, T) = {(s, t)}")
    lists = [block_mask.kv_num_blocks, block_mask.kv_indices]
    if getattr(block_mask, "full_kv_num_blocks", None) is not None:
        lists += [block_mask.full_kv_num_blocks, block_mask.full_kv_indices]
    for counts, indices in zip(lists[::2], lists[1::2]):
        shape, index_shape = (tuple(int(d) for d in (x.shape if hasattr(x, "shape") else
                                                     np.shape(x))) for x in (counts, indices))
        if len(shape) != 3 or len(index_shape) != 4 or shape != index_shape[:3]:
            raise ArgumentError(f"block_mask's counts must be [B, H, row blocks] and its indices "
                                f"[B, H, row blocks, key blocks], got {list(shape)} and "
                                f"{list(index_shape)}")
        for name, got, want in (("batch", shape[0], b), ("heads", shape[1], h)):
            if got not in (1, want):
                raise ArgumentError(f"block_mask has {name} {got}, but q has {want} (1 shares "
                                    "it)")
        if shape[2] * rows < s:
            raise ArgumentError(f"block_mask lists {shape[2]} blocks of query rows; q's S needs "
                                f"{-(-s // rows)}")
    return lists


_CONVERTED: dict = {}  # the last few conversions: (source tensors, versions, shape) -> lists
_KEPT = 8


def _converted(counts, indices, per_row: int, per_col: int, tiles: int, blocks: int, b: int,
               h: int, device) -> list:
    """One pair at kgen's tile: as it is where it already is (int32, contiguous, FlexAttention's
    extents at kgen's tile), else split (`_refined`) once per source and version (a BlockMask
    made once and used every step converts once)."""
    import torch

    if (per_row == per_col == 1 and isinstance(counts, torch.Tensor)
            and isinstance(indices, torch.Tensor) and counts.device == indices.device == device
            and counts.dtype == indices.dtype == torch.int32 and counts.dim() == 3
            and indices.dim() == 4 and counts.shape[0] in (1, b) and counts.shape[1] in (1, h)
            and counts.shape == indices.shape[:3] and counts.shape[2] == tiles
            and indices.shape[3] == blocks and counts.is_contiguous()
            and indices.is_contiguous()):
        return [counts, indices]  # indices out of range: clamped by the kernel
    key = None
    if isinstance(counts, torch.Tensor) and isinstance(indices, torch.Tensor):
        key = (id(counts), counts._version, id(indices), indices._version, per_row, per_col,
               tiles, blocks, b, h, str(device))
        if key in _CONVERTED:
            return _CONVERTED[key][1]
    out = _refined(counts, indices, per_row, per_col, tiles, blocks, b, h, device)
    if key is not None:
        if len(_CONVERTED) >= _KEPT:
            _CONVERTED.pop(next(iter(_CONVERTED)))
        _CONVERTED[key] = ((counts, indices), out)  # the sources kept: their ids stay theirs
    return out


def _refined(counts, indices, per_row: int, per_col: int, tiles: int, blocks: int, b: int,
             h: int, device) -> list:
    """One pair at kgen's tile: each block split into per_row x per_col of kgen's, in order;
    the sub-blocks past the keys' end dropped; [B or 1, H or 1, tiles(, blocks)] int32."""
    import torch

    counts = torch.as_tensor(counts, device=device)  # shapes checked (`checked_lists`)
    indices = torch.as_tensor(indices, device=device)
    if per_row > 1:
        counts = counts.repeat_interleave(per_row, dim=2)
        indices = indices.repeat_interleave(per_row, dim=2)
    counts = counts[:, :, :tiles].to(torch.int64)
    indices = indices[:, :, :tiles].to(torch.int64)
    width = indices.shape[-1] * per_col
    split = (indices[..., None] * per_col
             + torch.arange(per_col, device=device)).flatten(-2)  # [.., tiles, width]
    place = torch.arange(width, device=device)
    valid = (place < (counts * per_col)[..., None]) & (split >= 0) & (split < blocks)
    order = torch.argsort((~valid).to(torch.int8), dim=-1, stable=True)
    split = torch.take_along_dim(split, order, dim=-1)
    if width < blocks:
        split = torch.nn.functional.pad(split, (0, blocks - width))
    return [valid.sum(dim=-1).to(torch.int32).contiguous(),
            split[..., :blocks].to(torch.int32).contiguous()]


# ---------------------------------------------------------------------------------------------
# The backward's lists: per tile of keys, the blocks of queries


def backward_tile_check(size: tuple[int, int], tile: tuple[int, int]) -> None:
    """The backward's `tile` (keys, queries) fits a block mask of BLOCK_SIZE `size` (query
    rows, keys): each of its tiles lies inside one block of the mask."""
    keys, queries = tile
    if size[1] % keys or size[0] % queries:
        raise ArgumentError(
            f"block_mask's BLOCK_SIZE {size} cannot be used by kgen.attention's backward: it "
            f"runs in tiles of {keys} keys by {queries} queries, each inside one block of the "
            f"mask, so the key block must be a multiple of {keys} and the query block of "
            f"{queries}, e.g. BLOCK_SIZE=(128, 128)")


def transposed_lists(block_mask, tile: tuple[int, int], q, k) -> list:
    """The backward's lists for q [B, H, S, D] and k [B, HKV, T, D] at its `tile` (keys,
    queries), per query head (GQA: a CTA of the backward walks its group's query heads, each
    with its own lists; H of 1 shares them): counts [B or 1, H or 1, key tiles] and indices
    [..., query blocks] of the partial query blocks, then of the full ones (zero counts where
    the mask lists no full blocks), int32 on q's device. A block of the mask listed twice, or partial and full, counts once,
    as partial; an index out of range lists nothing."""
    rows, cols = block_size(block_mask)
    backward_tile_check((rows, cols), tile)
    lists = checked_lists(block_mask, q, k)
    key = None
    sources = [x for x in lists]
    if all(hasattr(x, "_version") for x in sources):
        key = (tuple((id(x), x._version) for x in sources), rows, cols, tuple(tile),
               int(q.shape[2]), int(k.shape[2]), str(q.device))
        if key in _TRANSPOSED:
            return _TRANSPOSED[key][1]
    out = _transposed(lists, (rows, cols), tile, int(q.shape[2]), int(k.shape[2]), q.device)
    if key is not None:
        if len(_TRANSPOSED) >= _KEPT:
            _TRANSPOSED.pop(next(iter(_TRANSPOSED)))
        _TRANSPOSED[key] = (sources, out)  # the sources kept: their ids stay theirs
    return out


_TRANSPOSED: dict = {}  # the last few transpositions: (sources, versions, sizes) -> lists


def _transposed(lists: list, size: tuple[int, int], tile: tuple[int, int], s: int, t: int,
                device) -> list:
    import torch

    rows, cols = size
    keys, queries = tile
    row_blocks, key_blocks = -(-s // rows), -(-t // cols)
    grids = []
    for counts, indices in zip(lists[::2], lists[1::2]):
        counts = torch.as_tensor(counts, device=device).to(torch.int64)[:, :, :row_blocks]
        indices = torch.as_tensor(indices, device=device).to(torch.int64)[:, :, :row_blocks]
        place = torch.arange(indices.shape[-1], device=device)
        ok = (place < counts[..., None]) & (indices >= 0) & (indices < key_blocks)
        grid = torch.zeros((*indices.shape[:-1], key_blocks + 1), dtype=torch.bool,
                           device=device)
        # every listed block written True, the rest into the last column (dropped)
        grid.scatter_(-1, torch.where(ok, indices, key_blocks), True)
        grids.append(grid[..., :key_blocks])
    partial = grids[0]
    full = grids[1] & ~partial if len(grids) > 1 else torch.zeros_like(partial)
    out = []
    for grid in (partial, full):  # at the backward's tile, transposed: [.., key tiles, blocks]
        grid = grid.repeat_interleave(rows // queries, dim=2)[:, :, :-(-s // queries)]
        grid = grid.repeat_interleave(cols // keys, dim=3)[:, :, :, :-(-t // keys)]
        out += _ordered(grid.transpose(-1, -2))
    return out
