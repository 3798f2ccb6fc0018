"""The configurations sm_90a lists for the builder (kgen/lower/builder.py), best first: its own
warp-specialized ones, then the sm_80 ones (kgen/targets/common/configs.py).

    one gemm  the cooperative kernel (TMA ring, two consumer warpgroups on wgmma) on 128x256x64
              tiles, then 128x192x64, 128x128x64, 128x64x64, 256x128x64, the other 256-row
              ones and 128 x 176, 160 and 144 (the waves' widths, SIZED_TILES), for every operand
              layout (an MN-major A or B, i.e. a column-major A or a row-major B, loads by
              64-column boxes: each tile N here is a multiple of 64). A fixed K of at most
              1024 puts ping-pong 128x128x64 first:
              with few k tiles per output tile the epilogue weighs more, and ping-pong hides it
              (8192x8192x512 ran 1.13-1.32x torch.matmul that way, bench/RESULTS.md); so
              does an output that leaves as pairs from registers, on 4 stages first. The
              tuner's wide list adds the cooperative ones of tile N 192 and 256 on clusters of
              2x1 and 1x2 CTAs (the builder keeps 1x1), and, where the runtime sizes give fewer
              output tiles than SMs, split-K on the cooperative kernel.
    chains    ping-pong (two consumer warpgroups on 64-row tiles, taking turns at the first
              gemm's mainloop) with a producer warpgroup streaming A and B0 through a ring, then
              with B0 resident and A alone in the ring, then the resident wgmma chain on
              128-row tiles, then the sm_80 chains.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from ...enums import Residency
from ...plan import KernelKind
from .. import WHY_SIZED, Config, GemmConfig, GemmShape, Target
from ..common import configs as common
from . import chain_values
from .tensor_map import STAGING_BOX

WS_TILES = (  # (tile, stages); 8 math warps: the two consumer warpgroups. 128x256 takes 4
    # stages first, with the epilogue tile's staging (two boxes per consumer; 3 stages hold the
    # whole tile's): the mainloop waited on a ring of 3 (1093.5 against 1036.5 cycles per k
    # tile at 4096^3 on an H100, bench/RESULTS.md). Also where the epilogue reads C: with C's
    # later boxes prefetched into L2, 4 stages ran relu(alpha*acc + beta*C + bias[col]) 1.044x
    # the matmul's time at 8192x8192x4096 against 1.064x on 3, and 1.048x against 1.038x at
    # 8192^3 (H100, bench/logs/issue15_h100/c_prefetch.log)
    ((128, 256, 64), (4, 3)),
    # three 64-column boxes: fewer idle SMs in the last wave where 256-column tiles leave it
    # part empty (6144x5120: 960 tiles of 128x256 are 7.3 waves of 132, 1296 of 128x192 9.8)
    ((128, 192, 64), (4, 3)),
    ((128, 128, 64), (6, 5, 4)),
    ((128, 64, 64), (8, 6)),
    # two m64 halves per consumer: the waves' other shape where 128x256 leaves the last one part
    # empty (see SIZED_TILES); wider ones on 3 stages (4 leave no room for the epilogue tile's
    # staging), 176 columns with its last staging box part full
    ((256, 128, 64), (4, 3)),
    ((256, 192, 64), (3,)),
    ((256, 176, 64), (3,)),
    ((256, 152, 64), (4,)),  # one staging box per consumer beside the ring of 4
    # the waves' narrower widths (SIZED_TILES), last: the size-blind list reaches them only
    # where nothing before them fits
    ((128, 176, 64), (4,)),
    ((128, 160, 64), (4,)),
    ((128, 144, 64), (4,)),
)
PINGPONG_TILES = (((128, 128, 64), (5, 6, 4)),)
# Ping-pong first, on 4 stages first, where the output leaves as pairs from registers (two
# outputs, an f32 one) and nothing reduces: that epilogue is the longest, and one consumer's
# runs under the other's mainloop. On an H100 (bench/logs/pairs_pingpong/pairs_pingpong.log,
# 4096^3, 8192x8192x4096, 2048^3, 6144x5120x3072) ping-pong 128x128 s4 ran Z, D = gelu(-z) * z
# 7-16% faster than the cooperative 128x256 s4, Z = acc, D = relu(acc + bias[col]) 4-11%, and
# an f32 D = acc + bias[col] 2-12% faster at three sizes, 1.4% slower at 4096^3; geometric mean
# 0.920x the time (5 stages: 0.941x; 6: slower at 8 of 12). Where the output goes through the
# staging, ping-pong lost at all ten heavy-EVT runs (heavy_epilogues.log).
PINGPONG_PAIRS_STAGES = (4, 5, 6)


def pingpong_for_pairs(shape: GemmShape) -> bool:
    """The output leaves as pairs from registers and nothing reduces: ping-pong first."""
    return shape.pairs and not shape.reductions


WS_SPLIT_TILES = (((128, 128, 64), 5, (2, 4, 8)), ((128, 64, 64), 6, (2, 4, 8, 16, 32, 64)))
SMALL_K = 1024
CLUSTERS = ((2, 1), (1, 2))  # the tuner's clusters beside 1x1 (the builder keeps 1x1)
# Clusters only on cooperative tiles this wide, and not where known sizes give fewer tiles than
# SMs: they ran no faster than 1x1 (0.95-0.98x torch.matmul, bench/RESULTS.md), and the whole
# list of them pushed the split-K candidates that small outputs need past the tuner's 50
CLUSTER_MIN_N = 192
WHY_CLUSTER = {(2, 1): "cluster 2x1: two CTAs on adjacent tile rows share B by multicast",
               (1, 2): "cluster 1x2: two CTAs on adjacent tile columns share A by multicast"}
WHY_COOPERATIVE = ("the cooperative warp-specialized kernel: TMA ring, two consumer warpgroups "
                   "on wgmma share each tile")
WHY_WS_SPLIT = ("split-K on the cooperative kernel: the runtime sizes give fewer output tiles "
                "than SMs")
WHY_PINGPONG = ("ping-pong: two consumer warpgroups on alternate tiles, one's epilogue under "
                "the other's mainloop (a fixed K of at most 1024: few k tiles per tile)")
WHY_PINGPONG_PAIRS = ("ping-pong: two consumer warpgroups on alternate tiles, one's epilogue "
                      "under the other's mainloop (the output leaves as pairs from registers: "
                      "the longest epilogue)")
WHY_CHAIN_PINGPONG = ("ping-pong over resident B: producer warps stream A through a ring, two "
                      "consumer warpgroups run the whole chain on 64-row tiles of their own")
WHY_CHAIN_WGMMA = "the resident chain on wgmma, 128-row tiles on two warpgroups"
WHY_CHAIN_SHORT_RING = ("ping-pong with the first gemm's B streamed through a short ring "
                        "beside A: its wide k tiles and the resident later B leave room for no "
                        "deeper one")
WHY_CHAIN_RING_B = ("ping-pong with the first gemm's B streamed through the ring beside A (L2 "
                    "serves its rereads), which leaves room for the output staging")
# The ping-pong chain's rings. bench/chain_ring.py timed every configuration on 16 chains at
# M = 81920 (H200, bench/RESULTS.md): B0 streamed through a 6-slot ring was the fastest or
# within 5% of it at every one. A deeper ring, or B0 resident, fits the output staging less
# often, and without it the chain ran up to 1.3x slower.
RING_B_RINGS = (6, 4)
# Where the last gemm needs column passes for its staging (chain_values.column_passes: N1 = 256
# beside N0 = 128), one pass's staging fits beside 5 or 4 slots, not 6, and the staged chain
# ran faster than 6 slots storing from registers (bench/RESULTS.md, "column passes"). Beside
# N0 = 64 the staging fits 6 slots, and 5 ran slower at K0 = 576: the usual list.
RING_B_PASS_RINGS = (5, 4, 6)
# The same shorter rings wherever the staging would not fit beside 6 slots (short_rings): N1 = 192
# beside N0 = 128 (48 KB of B1, 48 KB of staging).
RING_B_SLOTS = 6
RINGS = (12, 8, 6, 4)  # B0 resident (where B0 is not K-major, or is batched), deepest first
# Short rings of B0 streamed beside A, after the deeper ping-pong rings: where a wide first tile
# (N0 of 160 to 256, 20-32 KB of B0 a slot) and the resident later B tiles leave room for no
# ring above, 3 or 2 slots still keep the chain on the ping-pong wgmma; consumers take turns at
# g0, so 2 slots are safe. H200, M = 81920 (bench/chain_sweep.py, 2026-11-29): N0 = 224 and 256
# with N1 of 128 and more had run the mma.sync chains, 3.6-7.1x a copy of their bytes with
# spills, and ran 1.55-2.24x on these rings; beside the resident 128-row chain on wgmma, listed
# before them until then, they ran 0.68-0.74 of its time (f16 256/256/128: 1.68-1.70 against
# 2.30x the copy; 256/192/256: 1.53-1.56 against 2.25x), so they come before it.
SHORT_RINGS = (3, 2)
# ... and before column blocks where the first tile is at least this wide: two blocks compute
# the first gemm twice, which costs more than the short ring over one block. H200, same runs:
# bf16 256/160/320 one block on 2 slots 1.461x the copy against 1.632-1.696x in two blocks (every
# ring); f16 576/160/384 1.630x against 1.674-1.697x. Beside N0 = 128 (256/128/512) one block on
# 2 slots ran 1.333x against 1.304x for two blocks on 5: not there.
SHORT_RING_OVER_BLOCKS_N0 = 160


# Whether a ping-pong chain configuration's output staging fits beside its ring and resident B
# tiles, by the storage planner's own placement (schedules.staging_placement): the builder
# (kgen/lower/builder.py) answers it for the kernel it fills; without one to ask, it fits
Fits = Callable[[Config], bool]


def _fit(config: Config) -> bool:
    return True


def configs(tgt: Target, shapes: tuple[GemmShape, ...], *, sizes: Mapping[str, int],
            wide: bool, fits: Fits = _fit) -> list[Config]:
    if len(shapes) > 1:
        return chain(shapes, fits)
    shape = shapes[0]
    cooperative = [Config((GemmConfig(k_bytes(tile, shape), (2, 4), s),), why=WHY_COOPERATIVE)
                   for tile, stages in WS_TILES for s in stages]
    pairs = pingpong_for_pairs(shape)
    pingpong = [Config((GemmConfig(k_bytes(tile, shape), (2, 4), s),), KernelKind.PINGPONG,
                       WHY_PINGPONG_PAIRS if pairs else WHY_PINGPONG)
                for tile, stages in PINGPONG_TILES
                for s in (PINGPONG_PAIRS_STAGES if pairs else stages)]
    k = common.known(shape.k, sizes)
    first = pairs or k is not None and k <= SMALL_K
    own = pingpong + cooperative if first else cooperative + pingpong
    if not wide:
        own = [c for c in own if c.schedule is None or c is own[0]]
    own = common.fitting_first(own, shape, sizes)
    if shape.dtype.fp8:  # wgmma alone; split-K, stream-K and small tiles not yet measured
        return own + ([clustered(c, cluster) for cluster in CLUSTERS for c in own
                       if c.schedule is None and c.gemms[0].tile[1] >= CLUSTER_MIN_N]
                      if wide else [])
    if wide:  # the tuner also times the widest with a cluster of two CTAs sharing an operand
        own += [clustered(c, cluster) for cluster in CLUSTERS for c in own
                if c.schedule is None and c.gemms[0].tile[1] >= CLUSTER_MIN_N
                and not few_tiles(c.gemms[0].tile, shape, sizes)]
        own += split_configs(shape, sizes) + stream_configs(shape, sizes) + small_configs(
            shape, sizes)
    return own + common.one_gemm(shape, sizes, wide)


def k_bytes(tile: tuple[int, int, int], shape: GemmShape) -> tuple[int, int, int]:
    """The tile with its k tile of 128 bytes for the gemm's operands (the tables above give
    16-bit ones, tile K 64): tile K 128 for FP8, whose stages then hold the same bytes, so
    the same ring depths fit."""
    return (tile[0], tile[1], 128 // shape.dtype.nbytes)


WHY_SMALL = ("ping-pong on 64-row tiles, each consumer warpgroup a tile of its own: the runtime "
             "sizes give fewer 128x128 tiles than SMs")


def small_configs(shape: GemmShape, sizes: Mapping[str, int]) -> list[Config]:
    """The 64-row ping-pong tiles of SIZED_TILES, where known sizes give fewer 128x128 tiles
    than SMs and nothing reduces (ping-pong runs no reductions)."""
    if shape.reductions or not few_tiles((128, 128, 64), shape, sizes):
        return []
    return [Config((GemmConfig((64, n, 64), (2, 4), stages),), KernelKind.PINGPONG, WHY_SMALL)
            for tile_m, n, stages, _ in SIZED_TILES if tile_m == 64]


def few_tiles(tile: tuple[int, int, int], shape: GemmShape, sizes: Mapping[str, int]) -> bool:
    """Known sizes give fewer output tiles than SMs: no L2 traffic for a cluster to share."""
    m, n = common.known(shape.m, sizes), common.known(shape.n, sizes)
    return None not in (m, n) and -(-m // tile[0]) * -(-n // tile[1]) < common.SMS


def split_configs(shape: GemmShape, sizes: Mapping[str, int]) -> list[Config]:
    """Split-K on the cooperative kernel, where the runtime sizes give fewer output tiles than
    SMs: each split leaves each part at least two k tiles and at most two waves of units. Not
    with epilogue reductions (their split-K runs on the tiled kernel)."""
    m, n, k = (common.known(d, sizes) for d in (shape.m, shape.n, shape.k))
    if shape.reductions or None in (m, n, k):
        return []
    out = []
    for tile, stages, splits in WS_SPLIT_TILES:
        tiles = -(-m // tile[0]) * -(-n // tile[1])
        out += [Config((GemmConfig(tile, (2, 4), stages, split=split),), why=WHY_WS_SPLIT)
                for split in splits
                if tiles < common.SMS and k >= 2 * split * tile[2]
                and tiles * split <= 2 * common.SMS]
    return out


# Stream-K (`split stream`) on the tuner's list: the tiles it ran best on, timed where known
# sizes give at most two waves of 128x256 tiles, the last one part empty, and each tile at
# least STREAM_MIN_K_TILES k tiles. On an H200 (bench/stream_k.py) it won only where every
# data-parallel tile left SMs idle or ran slowly (3000x1000x8000: 0.839x torch.matmul against
# 0.653x for the sized choice); its walk is slower than the data-parallel one (4096^3: 0.199
# against 0.185 ms even with the fixup cut out), so the builder never takes it unasked.
STREAM_TILES = (((128, 256, 64), 3), ((128, 192, 64), 4))
STREAM_MIN_K_TILES = 32
WHY_STREAM = ("stream-K on the cooperative kernel: the runtime sizes leave the last wave of "
              "tiles part empty")


def stream_configs(shape: GemmShape, sizes: Mapping[str, int]) -> list[Config]:
    m, n, k = (common.known(d, sizes) for d in (shape.m, shape.n, shape.k))
    if shape.reductions or None in (m, n, k) or -(-k // 64) < STREAM_MIN_K_TILES:
        return []
    tiles = -(-m // 128) * -(-n // 256)
    if tiles >= 2 * common.SMS or tiles % common.SMS == 0:
        return []
    return [Config((GemmConfig(tile, (2, 4), stages, stream=True),), why=WHY_STREAM)
            for tile, stages in STREAM_TILES]


def clustered(config: Config, cluster: tuple[int, int]) -> Config:
    """`config` on a cluster of CTAs (2x1: B multicast, 1x2: A multicast)."""
    gemms = tuple(dataclasses.replace(g, cluster=cluster) for g in config.gemms)
    return dataclasses.replace(config, gemms=gemms,
                               why=f"{config.why}; {WHY_CLUSTER[cluster]}")


# A ping-pong chain's last tile keeps an N that is a multiple of the copy engine's 64-column box
# (192: common.chain_tiles' `boxes`) instead of rounding it up to a power of two: N1 = 192 ran on
# 64x256 tiles, a quarter of g1's columns past N and stored from registers, at 1.91x a copy of
# its bytes on an H200 (bench/logs/consumers/consumers_edges.log).
def pingpong_registers(shapes: tuple[GemmShape, ...], blocks: int = 1) -> bool:
    """Whether a consumer thread's values (chain_values.values_over) in the chain's tiles fit
    its registers, with one column pass's accumulators where the last gemm takes passes: over 256
    columns, or where only the passes' staging fits the registers (N1 = 256 beside N0 = 128 or
    160)."""
    widths = [t[1] for t in common.chain_tiles(shapes, 64, boxes=True, blocks=blocks)]
    passes = chain_values.staged_passes(widths[-2], widths[-1])
    return not chain_values.values_over(widths, passes)


# A ping-pong chain whose last N is over 256 tries the fewest column blocks whose tile fits
# MAX_PASSES passes of 128 (one for N1 up to 512), then one more: each CTA keeps its block of
# B1 resident and recomputes g0 for it (KernelPlan.column_blocks). N1 = 640 and N0 = 128 with
# N1 = 448 ran the sm_80 tiled chain, 64x256 tiles at 3.75-4.18x a copy of the bytes on an
# H200 (bench/RESULTS.md).
WHY_COLUMN_BLOCKS = ("; each CTA keeps one of {blocks} column blocks of the last B resident "
                     "and recomputes the first gemm for it")


def column_block_counts(n) -> tuple[int, ...]:
    """The column blocks a ping-pong chain with a last N of `n` tries, in order."""
    if not isinstance(n, int) or n <= 256:
        return (1,)
    fewest = -(-n // (common.MAX_PASSES * 128))
    return (fewest, fewest + 1)


def chain(shapes: tuple[GemmShape, ...], fits: Fits = _fit) -> list[Config]:
    """Ping-pong with B0 streamed through the ring beside A; then over resident B, deepest ring
    first (for a last N over 256, in the fewest column blocks that fit, then one more:
    column_block_counts); then ping-pong on SHORT_RINGS (over one block before the column
    blocks where N0 is at least SHORT_RING_OVER_BLOCKS_N0); then the resident 128-row chain,
    whose ring runs at most one tile ahead (stages at most k tiles + 1); then the sm_80
    chains."""
    k = shapes[0].k
    k_tiles = -(-k // 64) if isinstance(k, int) else 9
    rest = (3,) * (len(shapes) - 1)
    regs = Residency.REGISTERS
    out, shorter = [], []  # shorter: the short rings, after every deeper ping-pong ring
    n = shapes[-1].n
    for blocks in column_block_counts(n):
        if not pingpong_registers(shapes, blocks):
            continue
        # the copy engine's stores need a fixed N (schedules.tma_refusal)
        tiles = common.chain_tiles(shapes, 64, boxes=True, blocks=blocks)
        more = WHY_COLUMN_BLOCKS.format(blocks=blocks) if blocks > 1 else ""

        def streaming(ring: int) -> Config:
            return ring_b(common.chain_config(shapes, 64, (4, 1), (ring, *rest), regs, True,
                                              WHY_CHAIN_RING_B + more, KernelKind.PINGPONG,
                                              boxes=True, blocks=blocks))

        short = isinstance(n, int) and short_rings(tiles, streaming(RING_B_SLOTS), fits)
        streamed = [streaming(ring) for ring in (RING_B_PASS_RINGS if short else RING_B_RINGS)]
        resident = [common.chain_config(shapes, 64, (4, 1), (ring, *rest), regs, True,
                                        WHY_CHAIN_PINGPONG + more, KernelKind.PINGPONG,
                                        boxes=True, blocks=blocks)
                    for ring in RINGS]
        first = resident_first(tiles, resident, fits) if split_rows(shapes[0]) else []
        out += [dataclasses.replace(c, why=WHY_CHAIN_SPLIT_ROWS + more) for c in first]
        out += streamed + [c for c in resident if c not in first]
        rings = [dataclasses.replace(streaming(ring), why=WHY_CHAIN_SHORT_RING + more)
                 for ring in SHORT_RINGS]
        if blocks == 1 and isinstance(shapes[0].n, int) and (
                shapes[0].n >= SHORT_RING_OVER_BLOCKS_N0):
            out += rings  # before any column blocks
        else:
            shorter += rings
    out += shorter  # then the resident 128-row chain
    out += [common.chain_config(shapes, 128, (8, 1), (s, *rest), regs, True, WHY_CHAIN_WGMMA)
            for s in sorted({min(6, k_tiles + 1), min(4, k_tiles + 1), 2}, reverse=True)]
    return out + common.chain(shapes)


# Where B0's rows split 32-byte sectors (K0 = 8 mod 16 in f16 and bf16: rows of 2000 bytes at
# K0 = 1000), every 64-row tile's rereads of B0 from L2 cost far more than at K0 = 1024: B0
# streamed through the ring ran 1.71-1.76x a copy of the chain's bytes at K0 = 1000 (f16,
# N0 = 64, N1 = 64 and 128), kept resident 1.15-1.19x (8 and 6 slots; H200,
# bench/logs/stop10/d/configs_k1000.log). There the resident rings come first (resident_first);
# where B0 does not fit resident beside the rest, the streamed ring still serves.
WHY_CHAIN_SPLIT_ROWS = ("ping-pong with B resident: the first gemm's B rows split 32-byte "
                        "sectors, which every tile's rereads from L2 would pay again")


def split_rows(first: GemmShape) -> bool:
    """Whether the first gemm's rows (K0 elements of 16 bits) are not whole 32-byte sectors."""
    return isinstance(first.k, int) and first.k * first.dtype.nbytes % 32 != 0


def has_staging(tiles: list[tuple[int, int, int]]) -> bool:
    """Whether a ping-pong chain of these tiles stages its output at all: a consumer thread's
    values, in the column passes the staging takes, within chain_values.staging_max_values."""
    widths = [t[1] for t in tiles]
    return chain_values.staging_fits(widths, chain_values.staged_passes(widths[-2], widths[-1]))


def short_rings(tiles: list[tuple[int, int, int]], six: Config, fits: Fits) -> bool:
    """Whether a ping-pong chain's output staging (two consumers', in column passes where
    they apply) does not fit beside a ring of RING_B_SLOTS slots of A's and B0's k tiles and
    the resident later B tiles (`six`: that configuration; `fits` weighs it). False where the
    chain has no staging (has_staging)."""
    return has_staging(tiles) and not fits(six)


def resident_first(tiles: list[tuple[int, int, int]], resident: list[Config],
                   fits: Fits) -> list[Config]:
    """Where B0's rows split sectors (split_rows), the resident rings the chain's list takes
    before the streamed one: all of them where a consumer thread's values with the whole last
    tile fit chain_values.STAGING_MAX_VALUES (stored from registers where the staging did not
    fit, 1000/64/128 and 1000/64/256 ran 1.19 and 1.23x the copy), else those whose output
    staging still fits (N0 = 128 with N1 = 256 stored from registers ran 1.75x the copy at
    K0 = 256, bench/logs/stop10/a/configs_256_128_256.log)."""
    if max(chain_values.tile_values([t[1] for t in tiles])) <= chain_values.STAGING_MAX_VALUES:
        return resident
    return [c for c in resident if has_staging(tiles) and fits(c)]


def ring_b(config: Config) -> Config:
    """`config` with the first gemm's B streamed (not `keep B0 resident`)."""
    first = dataclasses.replace(config.gemms[0], resident=False)
    return dataclasses.replace(config, gemms=(first,) + config.gemms[1:])


# ---------------------------------------------------------------------------------------------
# The runtime sizes' choice (kgen run, kgen inspect --size, kgen.load per call): the builder's
# size-blind default is 128x256x64 cooperative; with the sizes known, a wave model of the
# cooperative kernel picks the tile that leaves fewer SMs idle, and split-K where even the
# smallest tiles are too few. Each rule below is one that bench/wave_split.py measured on an
# H200 (bench/RESULTS.md); `kgen tune` times the whole list instead.

# (tile M, tile N, stages, time per output element over a 128x256 tile's): the tiles the wave
# model weighs. The cooperative ones from the H200 runs of bench/wave_split.py and
# bench/defaults.py --tuned (a 128x128 tile lost to 128x256 at 4096x11008x4096 and to 128x192
# at 5120x3584x2048, won at 96x12288x4096; 128x64 won at 1024^3). The 64-row ones run
# ping-pong, each consumer a tile of its own, from the H100 runs of bench/small_tiles.py
# (bench/logs/small_tiles/): 64x64 s12 ran 128x4096x4096 at 0.959x torch.matmul against 0.865x
# on 128x64, 64x192 (s7: its output then leaves as pairs) 192x6144x4096 at 0.917x against
# 0.750x on 128x128, 64x128 s6 320x2048x4096 at 0.946x against 0.852x on 128x64; they lost
# wherever 128-row tiles fill the waves (512x4096x4096: 0.903x on 64x256 against 0.962x).
# 256x128 (each consumer two m64 halves) ran 0.976-0.991x 128x256's speed where both fill the
# same waves (seven shapes, H200, bench/logs/wide/wide_probe_tiles.log), and 0.998x torch.matmul
# against 0.932x for 128x192 at 4000x5200x2048, where it fills 5 waves and they need 6 and 7.
# 256x192 and 256x176 on 3 stages (the latter's last staging box part full), H200,
# bench/logs/part_box/part_box_rule.log, two rounds where the choice changes (2.2% of 3000
# random shapes): 256x192 against 128x192 s4 0.967-1.014x -> 0.980-1.038x torch.matmul at
# eight shapes (5120x3584x2048 1.007 -> 1.004), 256x176 against 128x192 or 128x256
# 0.605-0.985x -> 0.839-1.020x at five; relu(alpha*acc + beta*C + bias[col]) 1.317-2.834x ->
# 1.481-2.773x the unfused PyTorch (5120x3584x2048 the one slower). Where the waves tie they
# lost (256x192: 8192^3 1.007 against 1.023x; 256x144 and 256x160 won nowhere,
# part_box_probe.log). 256x152 on a ring of 4 (one staging box per consumer), cuBLAS's tile at
# 3000x5000x2000 (396 tiles, 3.0 waves): 0.913 -> 0.977-0.980x there, and 0.479-0.896 ->
# 0.757-0.978x at nine shapes where the choice changes (4% of 3000 random shapes), slower at one
# (5152x1744x4904, 0.771 -> 0.750-0.769x; part_box_rule152.log). 128x176, 128x160 and 128x144
# on 4 stages (their last staging box part full), each timed where it fills exactly four waves
# (4224 x 16 tile columns, K = 2048 and 6144; H200, bench/logs/tile_n/probe.log): 1.041-1.045,
# 1.057-1.058 and 1.077-1.081x 128x256's time per element (128x192 1.029-1.032; on 5 stages all
# three were slower). cuBLAS's width at 1536x1536x6144 (132 tiles of 128x144, one wave): 0.976x
# torch.matmul there against 0.855x for 128x192's 96 tiles. With them (SIZED_NARROW_MARGIN),
# two rounds at 16 shapes where the choice changes (6% of 3000 random shapes), the bare GEMM ran
# 0.525-0.998x -> 0.774-0.996x torch.matmul (f16; bf16 0.540-0.977 -> 0.852-0.995 at six),
# relu(alpha*acc + beta*C + bias[col]) 1.061-1.882x -> 1.463-1.902x the unfused PyTorch at six
# (bench/logs/tile_n/rule.log). 256x176 left the list: 128x176 at twice its tiles weighs less
# (1.043 x the margin against 1.08), so it won at none of 20,000 random shapes; where it had
# been the choice 128x176 ran -1.2% (3000x1936x4096, 264 tiles in two waves against 132 in one)
# to +0.5% bare, +1.1% fused. The tuner still times it.
SIZED_TILES = ((128, 256, 4, 1.0), (128, 192, 4, 1.03), (256, 128, 4, 1.02), (256, 192, 3, 1.0),
               (256, 152, 4, 1.08), (128, 176, 4, 1.043),
               (128, 160, 4, 1.058), (128, 144, 4, 1.08), (128, 128, 6, 1.06),
               (128, 64, 8, 1.3), (64, 256, 4, 1.15), (64, 192, 7, 1.25), (64, 128, 8, 1.25),
               (64, 64, 12, 1.6))
# For D = acc alone: 64x192's ring of 7 leaves no room for the output's staging, so its output
# leaves as pairs; a fused epilogue then reads C from global memory (192x6144x4096 with
# relu(alpha*acc + beta*C + bias[col]) ran 1.529x the unfused PyTorch against 1.825x on the
# cooperative 128x128, bench/logs/small_tiles/small_tiles_f16_rule.log)
SIZED_BARE_ONLY = ((64, 192),)
# Weighed only where they make at most one wave: 128x144 in more ran slower than the model said
# at both shapes where it would have been taken (1792x2464x8064, 252 tiles: 0.912x torch.matmul
# against 0.947x for 256x152; 2064x3176x5376, 391 tiles: 0.829x against 0.874x for 128x256;
# bench/logs/tile_n/probe.log), and faster at both in one (1536x1536x6144, 2408x792x4056)
SIZED_ONE_WAVE = ((128, 144),)
# The narrower 128-row widths win only by this factor on the model's cost: it overstated their
# gains over the widths before them by 3-11% (1536x1536x6144: 1.27x the model, 1.14x measured),
# and at model gains under 3% they lost (2064x3176x5376: 128x160 1.008x the model, 0.966x
# measured; bench/logs/tile_n/probe.log)
SIZED_NARROW = ((128, 176), (128, 160), (128, 144))
SIZED_NARROW_MARGIN = 1.03
SIZED_FEW = common.SMS // 2  # fewer 128x256 tiles than this: split-K, where K is long enough
# Split-K only from this many k tiles (K = 8192): its parts' sum runs as a second kernel, a
# fixed cost that a short k loop does not repay. On an H100 (bench/logs/small_shapes/) the
# unsplit 128x64 s8 ran 128x4096x4096 at 0.865x torch.matmul against 0.732x split 2, and
# 64x8192x4096 at 0.864x against 0.785x split 2 on 128x128; 256x2048x16384 (256 k tiles) kept
# split 4 at 0.932x against 0.659x unsplit. (On an H200, 128x4096x4096 had run split 2 at
# 0.856x and 128x64 s8 at 0.825x.)
SIZED_SPLIT_K_TILES = 128
SIZED_PART_K_TILES = 16  # split-K: at least this many k tiles per part
SIZED_LONG_PART = 32  # 128x128 parts this long; shorter ones split 128x64 tiles instead
SIZED_SKINNY_M = 32  # at most this many rows: the tiled kernel's 32-row tiles, split 4
# At most this many rows, in at least SIZED_ONE_ROW_TILES tiles of 64x64: no split-K, the wave
# model's 64-row tiles. One tile row streams B once with no second kernel: 64x4096x8192 ran
# 1.091x torch.matmul on 64x64 s12 against 0.946x on 128x128 split 4 (H100,
# bench/logs/small_tiles/)
SIZED_ONE_ROW = 64
SIZED_ONE_ROW_TILES = 64


# Rows of B that are not whole 128-byte L2 lines (K not a multiple of 64 in f16 for a K-major
# B, N for a row-major one): each 128-byte row of a box straddles two lines, and the copy
# engine reads them slowly. K-major A and B, rows 16-byte but not 32-byte multiples (K = 1000):
# 0.55-0.65x torch.matmul on 128x256 tiles, the L2's throughput x duration 2.5x that of K = 1024
# (Nsight Compute, 5000x3000). A cluster that multicasts B to two CTAs halves its reads. Before
# (the sized choice, 256-byte lines) and after (the rule, the operands' 128-byte lines), H100,
# bench/logs/misaligned/:
#   rows 16-byte     K-major B: 0.43-0.72x -> 0.86-1.10x at nine shapes (four not probed
#                    before); bf16 0.52-0.70x -> 0.92-1.11x at three; relu(alpha*acc + beta*C
#                    + bias[col]) 0.94-2.71x -> 1.57-3.99x the unfused PyTorch. On 128-byte
#                    lines 128x192 on the same cluster ran 0.81-0.94x, 128x256 alone 0.64-0.73x
#   rows 32-byte     K-major B (K = 1008, 1040, 1520, 2000, 2448, 3056, 4112, 5136): the wave
#                    model's choice 0.64-1.03x -> 0.85-1.01x (geometric mean 0.877 -> 0.937;
#                    slower at 6144x2048x1520, 1.03 -> 1.00, and 2560x7168x2448, 0.93 -> 0.92;
#                    bench/logs/misaligned/mn/); the fused epilogue above 1.26-3.99x ->
#                    1.63-4.04x (geometric mean +4.9%; 2560x7168x2448 2.65 -> 2.56)
#   B row-major      its MN-major boxes shared, half by each CTA (mn/mn_rule32.log), at N = 4104,
#                    5000, 7000, 8200, 9000 (16-byte rows): 0.66-0.80x alone, 0.68-0.86x
#                    on a cluster 1x2 (A shared), 0.84-1.02x on 2x1; at N = 4112 and 5008
#                    (32-byte rows): 0.78-0.86x, 0.69-0.85x, 0.84-0.94x
#   A column-major   K-major B (H200, bench/logs/wide/wide_cola.log, two rounds): the wave
#                    model's choice 0.685-0.947x -> 0.869-1.010x at K = 1000, 3000, 4104, 2000
#                    and 1320 (128x256 alone 0.793-0.951x, on 1x2 0.783-0.923x)
# Where only A's rows split (a row-major B, K = 4104; a column-major A, M = 5000 or 4104) the
# sized choice ran 0.98-1.00x, and the cluster 2x1 0.82-0.96x: the rule looks at B's rows. A
# column-major A beside a row-major B (both MN-major) was not measured: the rule leaves it.
LINE = 128
# The wave model's tiles the line rule leaves alone: 256x152 fills 3 waves at 3000x5000x2000
# (396 tiles), where it ran 0.979x torch.matmul against 0.917x for the rule's 128x256 on 2x1, and
# 11% faster than the rule's choice at 2900x4980x3000 (H200, bench/logs/part_box/
# part_box_narrow.log); its halves of B (76 rows) are no whole 8-row swizzle groups, so no
# cluster can share them
LINE_RULE_YIELDS = ((256, 152),)


def line_split_rows(shape: GemmShape, sizes: Mapping[str, int]) -> tuple[int, int] | None:
    """The cluster 2x1 (B shared by multicast) where B's rows (K values if B is K-major, N if
    not) are 16-byte multiples but not whole 128-byte lines, and A or B is K-major. None
    elsewhere."""
    k_major_a, k_major_b = shape.k_major
    row = common.known(shape.k if k_major_b else shape.n, sizes) * shape.dtype.nbytes
    if not (k_major_a or k_major_b) or row % 16 or row % LINE == 0:
        return None
    return (2, 1)


def sized(shape: GemmShape, sizes: Mapping[str, int], batches: int = 1) -> Config | None:
    """The configuration the runtime sizes call for (None: the builder's default serves them):

        M <= 32           tiled 32x128x64 split 4 (a 128-row tile would compute 4x the rows)
        fewer than 66     split-K on the cooperative kernel where K has at least 128 k
        128x256 tiles     tiles (not where M <= 64 gives 64 tiles of 64x64): S the widest
                          power of two that keeps S x tiles within the
                          SMs and 16 k tiles per part, on 128x128 tiles where each part keeps
                          32 k tiles, else on 128x64 tiles
        pairs out         the builder's default: ping-pong 128x128 (PINGPONG_PAIRS_STAGES)
        B's rows split    128x256 s4 on a cluster 2x1 sharing B (line_split_rows), where the
        L2 lines          tile below is a 128- or 256-row one, A or B is K-major, B's rows
                          are 16-byte multiples but not whole 128-byte lines, and the 128x256
                          tiles fill at least a wave
        otherwise         the tile of SIZED_TILES with the least waves x tile area x its cost
                          per element (128x256 where it ties; 128 x 176, 160 and 144 weighed
                          SIZED_NARROW_MARGIN heavier, 128x144 in one wave at most): a 128- or
                          256-row one cooperative, a 64-row one ping-pong (each consumer a
                          tile of its own); where that is
                          128x256, K at most 1024 and the epilogue fused (more than D = acc),
                          ping-pong 128x128x64 s4 instead (bench/pingpong_small_k.py: 1.50x
                          against 1.40x the unfused PyTorch at 8192x8192x1024 with
                          C + 0.5 * gelu(acc); the bare GEMM stays cooperative, 0.997x
                          against 0.959x torch.matmul at 8192x8192x1024); where it is
                          128x128 and K at most 1024, ping-pong on the same tile, bare or
                          fused (bench/prototypes/batched_probe.py: ahead of the cooperative
                          128x128 at all four batched shapes, e.g. 4096 x 64x128x64 with a
                          bias, 0.88x against 0.68x torch.bmm)
    """
    m, n, k = (common.known(d, sizes) for d in (shape.m, shape.n, shape.k))
    if shape.chained or None in (m, n, k) or min(m, n, k, batches) <= 0:
        return None
    if shape.dtype.fp8:  # its tiles and splits were measured for 16-bit operands only
        return None
    if shape.reductions:  # their split-K and tiles were not measured against the default
        return None
    k_tiles = -(-k // 64)
    if m <= SIZED_SKINNY_M and k_tiles >= 4 * SIZED_PART_K_TILES:
        return Config((GemmConfig((32, 128, 64), (1, 4), 4, split=4),),
                      why=f"{WHY_SIZED} M = {m}: 32-row tiles of the tiled kernel, split-K 4")

    def tiles(tile_n: int, tile_m: int = 128) -> int:
        return batches * -(-m // tile_m) * -(-n // tile_n)

    def widest_split(tile_n: int) -> int:
        split = 1
        while (tiles(tile_n) * split * 2 <= common.SMS
               and k_tiles // (split * 2) >= SIZED_PART_K_TILES):
            split *= 2
        return split

    few = tiles(256)
    one_row = m <= SIZED_ONE_ROW and tiles(64, 64) >= SIZED_ONE_ROW_TILES
    if few < SIZED_FEW and k_tiles >= SIZED_SPLIT_K_TILES and not one_row:
        wide, narrow = widest_split(128), widest_split(64)
        tile_n, split, stages = ((128, wide, 5) if wide > 1 and k_tiles // wide >= SIZED_LONG_PART
                                 else (64, narrow, 6) if narrow > 1 else (128, wide, 5))
        if split > 1:
            return Config((GemmConfig((128, tile_n, 64), (2, 4), stages, split=split),),
                          why=f"{WHY_SIZED} {few} tile{'s' * (few > 1)} of 128x256 leave SMs "
                          f"idle: 128x{tile_n} tiles, split-K {split} ({tiles(tile_n) * split} "
                          "units)")

    if pingpong_for_pairs(shape):
        return None  # the builder's ping-pong (PINGPONG_PAIRS_STAGES)

    def cost(tile_m: int, tile_n: int, per_element: float) -> float:
        margin = SIZED_NARROW_MARGIN if (tile_m, tile_n) in SIZED_NARROW else 1.0
        return -(-tiles(tile_n, tile_m) // common.SMS) * tile_m * tile_n * per_element * margin

    # a tile N not a multiple of 64 needs a K-major B (an MN-major one's boxes are 64 columns)
    # and a row-major output (a column-major one's part box is not built: pairs)
    part_boxes = shape.k_major[1] and shape.row_out
    weighed = [t for t in SIZED_TILES if not (shape.fused and t[:2] in SIZED_BARE_ONLY)
               and (part_boxes or t[1] % STAGING_BOX == 0)
               and not (t[:2] in SIZED_ONE_WAVE and tiles(t[1], t[0]) > common.SMS)]
    tile_m, tile_n, stages, _ = min(weighed, key=lambda t: cost(t[0], t[1], t[3]))
    if tile_m == 64:
        return Config((GemmConfig((64, tile_n, 64), (2, 4), stages),), KernelKind.PINGPONG,
                      why=f"{WHY_SIZED} 64x{tile_n} tiles fill the waves better "
                      f"({tiles(tile_n, 64)} tiles against {few} of 128x256, on {common.SMS} "
                      "SMs); ping-pong, each consumer warpgroup a 64-row tile of its own")
    cluster = line_split_rows(shape, sizes)
    if cluster is not None and few >= common.SMS and (tile_m, tile_n) not in LINE_RULE_YIELDS:
        return Config((GemmConfig((128, 256, 64), (2, 4), 4, cluster=cluster),),
                      why=f"{WHY_SIZED} {'K' if shape.k_major[1] else 'N'} = "
                      f"{k if shape.k_major[1] else n}: B's rows are not whole 128-byte L2 "
                      f"lines, slow for the copy engine to read; {WHY_CLUSTER[cluster]}")
    if tile_m == 128 and (tile_n == 256 and shape.fused or tile_n == 128) and k <= SMALL_K:
        return Config((GemmConfig((128, 128, 64), (2, 4), 4),), KernelKind.PINGPONG,
                      why=f"{WHY_SIZED} K = {k}: few k tiles per tile, and the epilogue weighs "
                      "more; ping-pong runs one consumer's under the other's mainloop")
    if (tile_m, tile_n) == (128, 256):
        return None
    return Config((GemmConfig((tile_m, tile_n, 64), (2, 4), stages),),
                  why=f"{WHY_SIZED} {tile_m}x{tile_n} tiles fill the waves better "
                  f"({tiles(tile_n, tile_m)} tiles against {few} of 128x256, on {common.SMS} "
                  "SMs)")
