"""Verify a loop's `blocks MxN by COUNTS, INDICES[, full FULL_COUNTS, FULL_INDICES]` line
(docs/language.md, "Masked blocks skipped": the block mask).

The line lists, per (batch, head, tile of rows), the blocks of the loop's dimension the tile
visits (FlexAttention's BlockMask: kv_num_blocks, kv_indices and the optional full_* pair).
Its blocks are the loop's own: M rows (the tile's M) by N columns (the loop's block), so a
written `tile` must say the same sizes, and without one the line's sizes are the tile's; a
line without sizes (`blocks by ...`) takes the tile as written or as the rulebook picks it. The
names are new parameters (int32, shaped by the program: kgen/lower/program.py), checked at run
time (kgen/runtime/blocks.py). The forward's loop takes it, and a DAG loop (the backward's:
its rows the keys, its lists the query blocks each tile of keys visits; what a DAG loop does not
take beside it, kgen/lower/loop_dag.py says); not with packed sequences.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import first_located, or_list, setting_problem, shown
from ..errors import KgenError
from .state import KernelState, require_str

__all__ = ["check_blocks"]


def check_blocks(state: KernelState, loop: ir.Loop, tile_m: tuple[int, ...],
                 tile_n: tuple[int, ...], rows_per_warp: int) -> None:
    """The line's sizes agree with the loop's tile (and are tile sizes), its names are new."""
    blocks = loop.blocks
    if blocks is None:
        return
    k = state.kernel
    loc = first_located(loop.loc, k.loc)
    if not isinstance(blocks, ir.BlockMask):
        raise KgenError(loc, f"loop '{loop.name}': blocks must be a kgen.ir.BlockMask, got "
                             f"{shown(blocks)}")
    at = first_located(blocks.loc, loc)
    if blocks.m is None and blocks.n is None:  # `blocks by ...`: the loop's tile, as it is
        _check_names(state, blocks, at, k)
        return
    for value, what in ((blocks.m, "blocks M"), (blocks.n, "blocks N")):
        if problem := setting_problem(value, what):
            raise KgenError(at, problem)
    if blocks.m not in tile_m:
        raise KgenError(at, f"a block mask's blocks are tiles of rows: M must be a loop's tile "
                            f"M ({or_list([str(m) for m in tile_m])}), got {blocks.m}")
    if blocks.n not in tile_n:
        raise KgenError(at, f"a block mask's blocks are the loop's blocks of {loop.dim}: N must "
                            f"be a loop's tile N ({or_list([str(n) for n in tile_n])}), got "
                            f"{blocks.n}")
    tile = loop.tile
    if tile is not None and (tile.m, tile.n) != (blocks.m, blocks.n):
        raise KgenError(at, f"the block mask's blocks are {blocks.m}x{blocks.n} but loop "
                            f"'{loop.name}' has tile {tile.m}x{tile.n}: a tile of rows visits "
                            "the listed blocks of its own tile, so the sizes must agree (write "
                            f"tile {blocks.m}x{blocks.n}, or list the blocks at "
                            f"{tile.m}x{tile.n})")
    warps = loop.warps
    if tile is None and warps is not None and warps.m * rows_per_warp != blocks.m:
        raise KgenError(first_located(warps.loc, loc),
                        f"warps {warps.m} cover {warps.m * rows_per_warp} rows "
                        f"({rows_per_warp} each) but the block mask's blocks have {blocks.m}")
    _check_names(state, blocks, at, k)


def _check_names(state: KernelState, blocks: ir.BlockMask, at, k: ir.Kernel) -> None:
    if k.packed:
        raise KgenError(at, "a block mask and packed sequences together are not supported: "
                            "list the blocks of a dense batch, or pack without a block mask")
    pairs = [(blocks.counts, blocks.indices)]
    if (blocks.full_counts is None) != (blocks.full_indices is None):
        raise KgenError(at, "the full blocks take two names, their counts and their indices")
    if blocks.full_counts is not None:
        pairs.append((blocks.full_counts, blocks.full_indices))
    for counts, indices in pairs:
        state.define(require_str(counts, at, "a block count name"), "block count", at)
        state.define(require_str(indices, at, "a block index name"), "block index", at)

