"""The configurations an sm_80-class target lists for the builder (kgen/lower/builder.py), best
first. sm_90a's list (kgen/targets/sm90/configs.py) puts its own before these.

    one gemm  CTA tiles from 128x256x64 on 8 warps down to 64x64x32, each with its deepest
              pipeline first; with a fixed M or N, in order of the padding their tiles add, and
              where a known N pads less to whole 192-column tiles than to 256-column ones
              (N = 192, 320-384, 576, ...) and B is K-major, each 256-wide tile's 192-wide
              twin before it.
    chains    every gemm on the same tile M and warps, each tile N its gemm's N, tile K 64 (or
              the source's N when smaller): first `keep B resident` on every gemm (B loaded
              once per persistent CTA: needs fixed sizes), then the persistent register chain
              (warps Nx1), then `keep smem` on a 2x2 warp grid; `keep smem` first where the
              register chain's accumulators would spill.

The builder lowers them in order and takes the first that plans; a tuner (`kgen tune`) times the
`wide` list, where split-K joins when the runtime sizes leave most SMs idle.
"""
from __future__ import annotations

import math
from typing import Mapping

from ...enums import Residency
from ...plan import KernelKind
from .. import Config, GemmConfig, GemmShape, Target

# (tile, warps, stages, deepest first): 128x256x64 on 2x4 warps was the fastest sm_80 tile on
# an H100 and an H200 (bench/RESULTS.md, "Tile sweep"); the rest fit smaller budgets and sizes
ONE_GEMM = (
    ((128, 256, 64), (2, 4), (3,)),
    ((128, 128, 64), (2, 2), (4, 3)),
    ((128, 128, 32), (2, 2), (4, 3)),
    ((64, 128, 64), (2, 2), (4, 3)),
    ((64, 64, 64), (2, 2), (4, 3)),
    ((64, 64, 32), (2, 2), (4, 3, 2)),
)
# the tuner's longer list
ONE_GEMM_WIDE = ONE_GEMM + (
    ((128, 256, 32), (2, 4), (4, 3)),
    ((256, 128, 64), (4, 2), (3,)),
    ((256, 128, 32), (4, 2), (4, 3)),
    ((128, 128, 64), (2, 2), (5, 2)),
    ((64, 256, 64), (1, 4), (3,)),
    ((64, 128, 64), (1, 4), (4, 3)),
    ((32, 128, 64), (1, 4), (4, 3)),
    ((32, 64, 64), (1, 2), (4, 3)),
)
# split-K, timed only where the runtime sizes leave most SMs idle: (tile, warps, stages, splits)
SPLIT_TILES = (
    ((64, 128, 64), (2, 2), 4, (2, 4, 8)),
    ((32, 128, 64), (1, 4), 4, (2, 4, 8)),
    ((64, 64, 64), (2, 2), 4, (16, 32, 64)),
)
SMS = 132  # an H100's or H200's SMs: split-K is worth timing below a fraction of this many tiles
WHY_ONE = "the sm_80 mainloop (cp.async, ldmatrix, mma.sync): the largest tile that plans"
# N = 192 on 128x256 tiles leaves a quarter of the mma.sync columns idle. The twin keeps the
# 256-wide tile's rows, K, warps and stages (on 2x4 warps, warp tiles 64x48): NVRTC 13.5 for
# sm_80, bf16 128x192x64 s3: 206 registers, no spill (128x256x64: 248)
NARROW_N = 192
WHY_192 = ("the sm_80 mainloop (cp.async, ldmatrix, mma.sync): the largest tile that plans, "
           "192 wide: N pads less to whole 192-column tiles than to 256-column ones")
WHY_SPLIT = "split-K: the runtime sizes give fewer output tiles than SMs"
WHY_RESIDENT = "every B resident in a persistent CTA: B read once per CTA, A streamed"
WHY_PERSISTENT = "a persistent register chain: the intermediate stays in registers"
WHY_SMEM = "the intermediate through shared memory (keep smem), on a 2x2 warp grid"


def configs(tgt: Target, shapes: tuple[GemmShape, ...], *, sizes: Mapping[str, int],
            wide: bool) -> list[Config]:
    if len(shapes) > 1:
        return chain(shapes)
    return one_gemm(shapes[0], sizes, wide)


def one_gemm(shape: GemmShape, sizes: Mapping[str, int], wide: bool) -> list[Config]:
    table = ONE_GEMM_WIDE if wide else ONE_GEMM
    if shape.k_major[1]:
        table = narrowed(table, known(shape.n, sizes))
    out = [Config((GemmConfig(tile, warps, s),), why=WHY_192 if tile[1] == NARROW_N else WHY_ONE)
           for tile, warps, stages in table for s in stages]
    out = fitting_first(out, shape, sizes)
    if wide:
        out += split_configs(shape, sizes)
    return out


def narrowed(table, n: int | None):
    """The table with each 256-wide tile's 192-wide twin (same rows, K, warps and stages) before
    it, where a known N pads less to whole 192-column tiles than to 256-column ones; else the
    table itself. (A narrower tile that pads no less than 256 would only add CTAs.) For a
    K-major B only: an N-major B tile 192 wide has no layout with per-thread constant offsets
    for 256 threads (kgen/lower/mainloop.py refuses it)."""
    if n is None or padded(n, NARROW_N) >= padded(n, 256):
        return table
    out = []
    for tile, warps, stages in table:
        if tile[1] == 256:
            out.append(((tile[0], NARROW_N, tile[2]), warps, stages))
        out.append((tile, warps, stages))
    return tuple(out)


def padded(n: int, width: int) -> int:
    """N rounded up to whole tiles `width` columns wide."""
    return -(-n // width) * width


def fitting_first(configs: list[Config], shape: GemmShape,
                  sizes: Mapping[str, int]) -> list[Config]:
    """The configurations in order of the padding their tile adds to a known M and N (the
    tiles' rows and columns over the size's, in powers of two), in their order otherwise."""
    m, n = known(shape.m, sizes), known(shape.n, sizes)

    def padding(c: Config) -> int:
        tile = c.gemms[0].tile
        ratio = 1.0
        for extent, size in ((tile[0], m), (tile[1], n)):
            if size:
                ratio *= -(-size // extent) * extent / size
        return round(math.log2(ratio))

    return sorted(configs, key=padding)


def known(dim, sizes: Mapping[str, int]) -> int | None:
    """The dim's value: fixed in the source, or given as a runtime size (None: unknown)."""
    return dim if isinstance(dim, int) else sizes.get(dim)


def split_configs(shape: GemmShape, sizes: Mapping[str, int]) -> list[Config]:
    """Split-K over the k tiles, where the output tiles would leave over half the SMs idle and K
    gives each part at least two k tiles. Not offered with epilogue reductions: their split
    kernel reduces each output tile in one block, correct but not measured against the plain
    kernel."""
    m, n, k = (known(d, sizes) for d in (shape.m, shape.n, shape.k))
    if shape.reductions or None in (m, n, k):
        return []
    out = []
    for tile, warps, stages, splits in SPLIT_TILES:
        tiles = -(-m // tile[0]) * -(-n // tile[1])
        if tiles * 2 > SMS:
            continue
        for split in splits:
            if k >= 2 * split * tile[2]:
                out.append(Config((GemmConfig(tile, warps, stages, split=split),), why=WHY_SPLIT))
    return out


# ---------------------------------------------------------------------------------------------
# Chains


def chain_tiles(shapes: tuple[GemmShape, ...], tile_m: int, tile_k: int = 64,
                boxes: bool = False, blocks: int = 1) -> list[tuple[int, int, int]]:
    """Each gemm's CTA tile: tile M, its N (a gemm that feeds another covers all of it; the last
    one's N rounded up to a power of two, at most 256, or with `boxes` over 64 rounded up to
    whole 64-column boxes of the copy engine up to 256, and over 256 to whole column passes of
    128 up to MAX_PASSES x 128, the last box or pass clipped at N), tile K `tile_k`, or for a
    chained gemm the widest of `tile_k`, 32 and 16 that divides the source's N (its K).
    `blocks`: the last tile covers 1 / blocks of its N, rounded as above (the ping-pong chain's
    column blocks, KernelPlan.column_blocks)."""
    tiles = []
    for i, s in enumerate(shapes):
        last_n = -(-s.n // blocks) if isinstance(s.n, int) else s.n
        if i < len(shapes) - 1:
            n = s.n if isinstance(s.n, int) else 64  # refused by the chain rule, located
        elif boxes and isinstance(s.n, int) and 64 < last_n <= 256:
            n = -(-last_n // 64) * 64  # whole boxes, the last one clipped at N
        elif boxes and isinstance(s.n, int) and 256 < last_n <= MAX_PASSES * 128:
            n = -(-last_n // 128) * 128  # column passes of 128, the last one clipped at N
        else:
            n = min(256, power_of_two(last_n)) if isinstance(s.n, int) else 128
        source_n = tiles[-1][1] if i else 0
        k = tile_k if i == 0 else next((t for t in (tile_k, 32, 16) if source_n % t == 0),
                                       min(tile_k, source_n))
        tiles.append((tile_m, n, k))
    return tiles


MAX_PASSES = 4  # a ping-pong chain's last tile, in column passes of 128, up to 512 columns


def power_of_two(n: int) -> int:
    p = 16
    while p < n:
        p *= 2
    return p


def chain_config(shapes, tile_m: int, warps: tuple[int, int], stages: tuple[int, ...],
                 keep: Residency, resident: bool, why: str,
                 schedule: KernelKind | None = None, tile_k: int = 64,
                 boxes: bool = False, blocks: int = 1) -> Config:
    tiles = chain_tiles(shapes, tile_m, tile_k, boxes, blocks)
    return Config(tuple(
        GemmConfig(tile, warps, s, keep=keep if i else None, resident=resident)
        for i, (tile, s) in enumerate(zip(tiles, stages))), schedule, why)


# A register chain's thread holds, per 16-row warp tile, g0's accumulators (N0 / 2 floats),
# their repacked A fragments (N0 / 4) and g1's accumulators (N1 / 2). NVRTC 13.0 spilled at 176
# such values (N0 64, N1 256: 8 bytes) and 224 (N0 128, N1 256: 208 bytes) on an H200: wider
# chains keep the intermediate in shared memory.
REGISTER_CHAIN_VALUES = 160


def register_values(shapes: tuple[GemmShape, ...]) -> int:
    tiles = chain_tiles(shapes, 64)
    n0, n1 = tiles[0][1], tiles[-1][1]
    return n0 // 2 + n0 // 4 + n1 // 2


def chain(shapes: tuple[GemmShape, ...]) -> list[Config]:
    n = len(shapes)
    rest = (3,) * (n - 1)
    regs, smem = Residency.REGISTERS, Residency.SMEM
    k = shapes[0].k
    ring = min(4, -(-k // 64) + 1) if isinstance(k, int) else 4  # at most one tile ahead
    in_registers = [
        chain_config(shapes, 64, (4, 1), (ring, *rest), regs, True, WHY_RESIDENT),
        chain_config(shapes, 64, (4, 1), (4, *rest), regs, False, WHY_PERSISTENT),
        chain_config(shapes, 64, (4, 1), (3, *rest), regs, False, WHY_PERSISTENT),
        chain_config(shapes, 128, (8, 1), (3, *rest), regs, False, WHY_PERSISTENT),
    ]
    in_smem = [  # tile K 32: a 2x2 warp grid's 32 x N1/2 warp tiles leave fewer registers
        chain_config(shapes, 64, (2, 2), (4, *rest), smem, False, WHY_SMEM, tile_k=32),
        chain_config(shapes, 64, (2, 2), (3, *rest), smem, False, WHY_SMEM, tile_k=32),
    ]
    if register_values(shapes) > REGISTER_CHAIN_VALUES:
        return in_smem + in_registers
    return in_registers + in_smem
