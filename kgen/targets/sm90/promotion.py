"""The two-level accumulation of an FP8 gemm on the warp-specialized sm_90a kernel
(AccPromotion): whether wgmma's sums are promoted into f32 registers and how often, and, with
block scales (`scale A by SA 1x128`, DeepGEMM's recipe), which schedules can apply them, where
each k tile's sums wait for their promotion (PeriodSets) and the consumers' overlap options.
kgen/targets/sm90/warp_specialized.py asks these rules with a consumer's rows; the template is
templates/sm90/block_scales.inc.j2. The plan options at the end (with_promotion_overlap,
with_period_sets, without_promotion) rebuild a plan for the bench's variants and the GPU tests.
"""
from __future__ import annotations

import dataclasses
import math

from ...enums import DType
from ...plan import (AccPromotion, Buffer, GemmPlan, KernelKind, PeriodSets, PromotionBound,
                     ScaleLoads)
from .. import ScheduleDraft, Site

WARPGROUP = 128

# Two-level accumulation of an FP8 gemm: wgmma's sums promoted into f32 registers every k tile
# (128 of K, DeepGEMM's period), where a consumer thread's registers hold the second set
PROMOTE_K_TILES = 1
PROMOTE_MAX_VALUES = 64  # a consumer thread's accumulators (its rows x tile N / 128 threads)
# With block scales every k tile is promoted, and a tile of 128x192 (96 accumulators a consumer
# thread, twice) compiles without spills (NVRTC 13.0): a wider tile shares each k tile's drain
# and the operands' loads over more products than 128x128 (H200, 8192^3: 1.105 ms against 1.233
# for 128x128 s5; at M = 2048 128x128 ran 1.02-1.08x faster, bench/RESULTS.md)
PROMOTE_MAX_VALUES_SCALED = 96
# tile N of a block-scaled gemm: within one of B's 128-column scale blocks (dividing 128), or
# every tile across at most two (tiles start at multiples of gcd(N, 128) into a block: N up to
# 128 + gcd(N, 128): 136, 144, 160, 192, the widths DeepGEMM picks to fill 132 SMs among them)
WHY_ACC_PROMOTION = ("FP8 wgmma accumulates with about 14 mantissa bits: each k tile's (128 of "
                     "K) sums go into registers of their own, which the consumer adds into its "
                     "f32 accumulators once their group is done (the period sets say when)")
WHY_NO_ACC_PROMOTION = ("a consumer thread's {values} accumulators leave no registers for a "
                        "second set (a 128x128 cooperative tile promotes); wgmma accumulates "
                        "the whole K, as torch._scaled_mm's use_fast_accum")


WHY_BLOCK_SCALES = ("each k tile's sums (one 128-wide k block) are promoted alone, times the "
                    "scales of its block (the scale loads say who brings them)")

# Who brings each k tile's scales to the consumers (ScaleLoads). CONSUMERS: each consumer
# thread reads its rows' scales (and the tile's B scales) with __ldg into one of two register
# sets as the k tile two before is promoted (multiplied as they were read, a load of the next k
# tile stalled every k tile: 0.44x the tensor-wise kernel at 8192^3 on an H200); the mainloop
# without them is the bound below (PromotionBound.UNLOADED). PRODUCER: the
# producer warp copies the tile's kTileM A scales and its B scales of the k block into a buffer
# beside the ring slot (cp.async, 4 bytes each: any layout and alignment, zeros past M and N),
# whose full barrier counts the warp's 32 arrivals (cp.async.mbarrier.arrive.noinc) beside the
# copy engine's; the consumers read them from shared memory after that barrier.
# H200, 8192^3, bench/fp8.py --blockwise --loads, one run (session 7, the builder's 128x192 s4
# with halves): the producer's copies 1.1074 ms (993 TFLOP/s, 0.643x the tensor-wise kernel)
# against 0.9464 ms (1162, 0.752x) with the consumers' __ldg, whose bound without the loads ran
# 0.8976 ms (0.793x): slower, so the rulebook keeps the consumers' loads (both checked against
# the float64 reference, 2.6e-3). with_scale_loads builds the producer's for the bench.
SCALE_LOADS = ScaleLoads.CONSUMERS
WHY_SCALE_LOADS = {
    ScaleLoads.CONSUMERS: ("each consumer thread loads its rows' A scales and the tile's B "
                           "scales with __ldg into one of two register sets as the k tile two "
                           "before is promoted: a global load in the mainloop"),
    ScaleLoads.PRODUCER: ("the producer warp copies each k tile's scales (the tile's rows of "
                          "A's, B's block) by cp.async into a buffer beside the ring slot, "
                          "counted by the slot's full barrier (32 arrivals more): the consumers "
                          "read them from shared memory, no global load in the mainloop"),
}
WHY_SCALE_LOADS_MEASURED = (" (H200, 8192^3, the builder's 128x192: 1162 TFLOP/s against 993 "
                            "with the producer's copies, which the rulebook does not take)")
SCALE_SLOT_PAD = 4  # B's scales after A's kTileM in a slot's buffer: two used, 16 bytes


def scale_buffer(gemm: str) -> str:
    """The shared-memory buffer of a block-scaled gemm's staged scales (ScaleLoads.PRODUCER)."""
    return f"{gemm}_scales"


def scale_requests(g: GemmPlan, loads: ScaleLoads = SCALE_LOADS) -> tuple:
    """The storage request of the staged scales where the scale loads (the rulebook's unless
    given) are the producer's (storage's vector requests: name, bytes, element type, role)."""
    if not g.scales or loads is not ScaleLoads.PRODUCER:
        return ()
    return ((scale_buffer(g.name), g.stages * (g.tile[0] + SCALE_SLOT_PAD) * 4, DType.F32,
             f"the block scales of each ring slot's k tile: {g.tile[0]} of A's rows, then "
             "B's (two), copied by the producer warp"),)


def promoted_values(g: GemmPlan, rows: int) -> int:
    """A consumer thread's accumulators: its `rows` of the tile x tile N / 128 threads."""
    return rows * g.tile[1] // WARPGROUP


def scale_refusal(draft: ScheduleDraft, g: GemmPlan,
                  rows: int) -> tuple[str, Site | None] | None:
    """Why the gemm's block scales cannot be applied on this schedule (None: they can): each
    k tile promoted alone (registers for a second set of accumulators), a tile within one of
    B's 128-column scale blocks, the whole K in one unit."""
    if not g.scales:
        return None
    if draft.split_k > 1 or draft.stream_k:
        return ("block scales are applied as a tile's k tiles are promoted one by one; split-K "
                "and stream-K are not built with them", Site("split", 0))
    values = promoted_values(g, rows)
    if values > PROMOTE_MAX_VALUES_SCALED:
        return (f"block scales are applied as each k tile's sums are promoted, which needs "
                f"registers for a second set of accumulators: a consumer thread of tile "
                f"{g.tile[0]}x{g.tile[1]} holds {values}, more than {PROMOTE_MAX_VALUES_SCALED} "
                "(128x192 cooperative or 64x192 ping-pong promote)", Site("tile", 0))
    n = g.tile[1]
    if 128 % n and n > 128 + math.gcd(n, 128):
        return (f"tile N {n} is not one the scales of B's 128-column blocks are built for: a "
                "tile within one block (N dividing 128) or over at most two (N up to 128 + "
                f"gcd(N, 128): 136, 144, 160, 192); some {n}-column tiles span three",
                Site("tile", 0))
    return None


def scale_blocks_n(g: GemmPlan) -> int:
    """B's 128-column scale blocks a tile's columns span: one (N dividing 128), else two."""
    return 1 if 128 % g.tile[1] == 0 else 2


def scale_split_cases(g: GemmPlan) -> tuple[int, ...]:
    """The n8 groups of a tile in B's first scale block, for every tile (tiles start at multiples
    of gcd(N, 128) into a block; all of a tile's groups: kFragN), widest first: the promotion's
    cases, so that each group's scale is a constant of its case."""
    n = g.tile[1]
    step = math.gcd(n, 128)
    return tuple(sorted({min((128 - offset) // 8, n // 8) for offset in range(0, 128, step)},
                        reverse=True))


# The one-set mainloop's overlap of the promotion with the tensor cores (AccPromotion.turns,
# .early_release): timed slower than without (bench/RESULTS.md section 19), so the rulebook takes
# neither; `with_promotion_overlap` builds them for the bench and the GPU tests
PROMOTE_TURNS = False
PROMOTE_EARLY_RELEASE = False
WHY_OVERLAP = ("each k tile's group is waited to completion before its promotion, as DeepGEMM "
               "does (which frees the slot at that wait); turns: consumer 0 issues k tile "
               "kt's group after consumer 1 issued kt - 1's, consumer 1 after consumer 0 "
               "issued kt's (named barriers 4 and 5), so the tensor cores run one consumer's "
               "group while the other promotes; early release: the slot is freed at the "
               "group's wait, one k tile sooner")
WHY_NO_TURNS = "; ping-pong's consumers multiply tiles of their own: no turns"
WHY_OVERLAP_MEASURED = ("; timed at 8192^3 on an H200 (session 6: turns 0.619x the tensor-wise "
                        "kernel, early release 0.638x, both 0.598x, against 0.640x without): "
                        "neither is taken (PROMOTE_TURNS, PROMOTE_EARLY_RELEASE)")
WHY_OVERLAP_HALVES = ("the period halves keep a group in flight while the one before is "
                      "promoted, and release each slot once its k tile's second half is done; "
                      "turns and early release are options of one period set "
                      "(with_promotion_overlap sets one)")


# Where each k tile's sums wait for their promotion (PeriodSets). ONE waits for each k tile's
# group (wgmma_wait<0>) before promoting it, so each consumer's tensor pipe drains at every k
# tile. HALVES splits each k tile into two groups of half the tile's columns (wgmma n = N / 2)
# and walks two k tiles a pass: each group is promoted while the next multiplies, so the pipe
# drains once a pass, for a quarter of ONE's promotions; its periods take one set's registers.
# A group kept in flight across the loop's back edge (two full-width sets, kt + 1 issued before
# kt's promotion in every pass) made ptxas serialize every wgmma (C7514, NVRTC 13), as did
# HALVES's first form (one k tile a pass, the second half in flight into the next).
# H200, 8192^3, bench/fp8.py --blockwise --sets, one run: the builder's 128x192 s4 with ONE
# 1.064 ms (1033 TFLOP/s, 0.679x the tensor-wise kernel), with HALVES 0.995 ms (1105, 0.726x);
# HALVES on 128x128 s6 918, 128x144 s5 826-906, 128x160 s4 881-888 (ONE: 871 at 128x128 in
# session 5's run, 760 and 778 at 144 and 160 with a select per group). A tile under 128
# columns keeps ONE (HALVES not timed there).
PERIOD_SETS = PeriodSets.HALVES
PERIOD_SETS_MIN_N = 128
WHY_PERIOD_SETS = {
    PeriodSets.ONE: ("one period set: each k tile's group is waited to completion "
                     "(wgmma_wait<0>), then promoted, so the consumer's tensor pipe drains at "
                     "every k tile"),
    PeriodSets.HALVES: ("one period set per half of the tile's columns: each k tile is two "
                        "groups of wgmma n = N / 2, two k tiles a pass, each group promoted "
                        "while the next multiplies (wgmma_wait<1>); the pass's last group after "
                        "the pipe drains (H200, 8192^3, builder's 128x192: 1105 TFLOP/s against "
                        "1033 with one set)"),
}
WHY_ONE_NARROW = (f" (tile N under {PERIOD_SETS_MIN_N}: halves are not timed on such tiles, "
                  "the rulebook keeps one set)")


def period_sets_refusal(g: GemmPlan, rows: int, sets: PeriodSets) -> str | None:
    """Why the block-scaled gemm cannot keep its period sums as `sets` says (None: it can)."""
    if sets is PeriodSets.HALVES and g.tile[1] % 16:
        return f"period sets halves: tile N {g.tile[1]} has no halves of whole n8 groups"
    if sets is not PeriodSets.ONE and rows != 64:
        return f"period sets {sets.value}: built for consumers of 64 rows, not {rows}"
    return None


def acc_promotion(g: GemmPlan, kind: KernelKind, rows: int) -> AccPromotion:
    """Whether the gemm's wgmma sums are promoted (FP8 only), and why; with block scales every
    k tile (scale_refusal refused the schedules that cannot)."""
    if not g.a.dtype.fp8:
        return AccPromotion()
    values = promoted_values(g, rows)
    if values > (PROMOTE_MAX_VALUES_SCALED if g.scales else PROMOTE_MAX_VALUES):
        return AccPromotion(0, WHY_NO_ACC_PROMOTION.format(values=values))
    if g.scales:
        cooperative = kind is KernelKind.COOPERATIVE
        refused = period_sets_refusal(g, rows, PERIOD_SETS)
        narrow = g.tile[1] < PERIOD_SETS_MIN_N
        sets = PERIOD_SETS if refused is None and not narrow else PeriodSets.ONE
        why_sets = WHY_PERIOD_SETS[sets] + (
            f" ({refused}: the rulebook's {PERIOD_SETS.value} is not built here)" if refused
            else WHY_ONE_NARROW if sets is not PERIOD_SETS else "")
        loads = dict(scale_loads=SCALE_LOADS, why_scale_loads=WHY_SCALE_LOADS[SCALE_LOADS]
                     + (WHY_SCALE_LOADS_MEASURED if SCALE_LOADS is ScaleLoads.CONSUMERS else ""))
        if sets is not PeriodSets.ONE:
            return AccPromotion(1, WHY_ACC_PROMOTION, tuple(s.describe() for s in g.scales),
                                WHY_BLOCK_SCALES, why_overlap=WHY_OVERLAP_HALVES, sets=sets,
                                why_sets=why_sets, **loads)
        return AccPromotion(1, WHY_ACC_PROMOTION, tuple(s.describe() for s in g.scales),
                            WHY_BLOCK_SCALES, **loads, turns=PROMOTE_TURNS and cooperative,
                            early_release=PROMOTE_EARLY_RELEASE,
                            why_overlap=WHY_OVERLAP + ("" if cooperative else WHY_NO_TURNS)
                            + ("" if PROMOTE_TURNS or PROMOTE_EARLY_RELEASE
                               else WHY_OVERLAP_MEASURED),
                            sets=sets, why_sets=why_sets)
    return AccPromotion(PROMOTE_K_TILES, WHY_ACC_PROMOTION)



def with_promotion_overlap(plan, turns: bool, early_release: bool):
    """The block-scaled plan with its promotion overlap set (AccPromotion.turns, .early_release;
    turns on a cooperative kernel only): a plan option for the bench's variants and the GPU
    tests; PROMOTE_TURNS and PROMOTE_EARLY_RELEASE say what the rulebook picks."""
    gs = plan.schedule.gemms[0]
    if not gs.promotion.scales:
        raise ValueError(f"{plan.name}: no block scales, no promotion overlap")
    if turns and plan.schedule.scheduler.kind is not KernelKind.COOPERATIVE:
        raise ValueError(f"{plan.name}: turns need the cooperative kernel's two consumers")
    why = f"the plan option with_promotion_overlap (turns {turns}, early release {early_release})"
    return _with_promotion(plan, turns=turns, early_release=early_release, why_overlap=why,
                           sets=PeriodSets.ONE,
                           why_sets=WHY_PERIOD_SETS[PeriodSets.ONE] + " (" + why + ")")


def _with_promotion(plan, **changes):
    """The plan with its one gemm's AccPromotion changed."""
    gs = plan.schedule.gemms[0]
    gemm = dataclasses.replace(gs, promotion=dataclasses.replace(gs.promotion, **changes))
    schedule = dataclasses.replace(plan.schedule, gemms=(gemm,) + plan.schedule.gemms[1:])
    return dataclasses.replace(plan, schedule=schedule)


def with_period_sets(plan, sets: PeriodSets):
    """The block-scaled plan with its period sets set (AccPromotion.sets): a plan option for the
    bench's variants and the GPU tests; PERIOD_SETS says what the rulebook picks. Turns and
    early release stay with ONE (the other sets release a slot once its k tile's groups are
    done, and keep their own group in flight)."""
    gs = plan.schedule.gemms[0]
    if not gs.promotion.scales:
        raise ValueError(f"{plan.name}: no block scales, no period sets")
    from .warp_specialized import consumer_rows  # (it imports this module's rules)

    g = plan.gemms[0]
    refused = period_sets_refusal(g, consumer_rows(g.tile[0], plan.schedule.scheduler.kind),
                                  sets)
    if refused is not None:
        raise ValueError(f"{plan.name}: {refused}")
    if sets is not PeriodSets.ONE and (gs.promotion.turns or gs.promotion.early_release):
        raise ValueError(f"{plan.name}: turns and early release are built with one period set")
    return _with_promotion(plan, sets=sets, why_sets=WHY_PERIOD_SETS[sets]
                           + f" (the plan option with_period_sets({sets.value}))",
                           why_overlap=(WHY_OVERLAP_HALVES if sets is PeriodSets.HALVES
                                        else gs.promotion.why_overlap))


def without_promotion(plan, bound: PromotionBound = PromotionBound.UNPROMOTED):
    """A timing bound for bench/fp8.py, wrong results: the block-scaled plan (one period set)
    with the promotion and the scales left out (each k tile still waited, wgmma accumulating
    into the f32 accumulators), or with the mainloop's scale loads left out. No rule and no DSL
    spelling reaches it."""
    gs = plan.schedule.gemms[0]
    if not gs.promotion.scales or bound is PromotionBound.NONE:
        raise ValueError(f"{plan.name}: no block scales or no bound")
    return _with_promotion(plan, bound=bound, sets=PeriodSets.ONE,
                           why_sets=WHY_PERIOD_SETS[PeriodSets.ONE] + " (a timing bound's)",
                           scale_loads=ScaleLoads.CONSUMERS,
                           why_scale_loads=WHY_SCALE_LOADS[ScaleLoads.CONSUMERS]
                           + " (a timing bound's)")


def with_scale_loads(plan, loads: ScaleLoads):
    """The block-scaled plan with its scale loads set (AccPromotion.scale_loads): a plan option
    for the bench's variants and the GPU tests; SCALE_LOADS says what the rulebook picks. The
    producer's loads need a scale buffer: where the rulebook placed none, it is added after the
    plan's storage (live through every phase), within the target's limit; cooperative only."""
    gs = plan.schedule.gemms[0]
    if not gs.promotion.scales:
        raise ValueError(f"{plan.name}: no block scales, no scale loads")
    if loads is ScaleLoads.PRODUCER and plan.schedule.scheduler.kind is KernelKind.PINGPONG:
        raise ValueError(f"{plan.name}: the producer's scale copies are built on the "
                         "cooperative kernel: on ping-pong (64x128 s7, NVRTC 13) ptxas "
                         "serialized the halves' wgmma (C7519) and one set's narrow entry "
                         "point spilled")
    g = plan.gemms[0]
    storage = plan.storage
    if loads is ScaleLoads.PRODUCER and all(b.name != scale_buffer(g.name)
                                            for b in storage.buffers):
        (name, nbytes, dtype, role), = scale_requests(g, ScaleLoads.PRODUCER)
        offset = -(-storage.total_bytes // 16) * 16
        if offset + nbytes > storage.limit_bytes:
            raise ValueError(f"{plan.name}: the scale buffer ({nbytes} bytes) does not fit "
                             f"after its {storage.total_bytes} bytes of shared memory")
        buffer = Buffer(name, nbytes, 16, offset, (0, len(storage.phases) - 1), role,
                        dtype=dtype)
        storage = dataclasses.replace(storage, buffers=storage.buffers + (buffer,),
                                      total_bytes=offset + nbytes,
                                      peak_bytes=max(storage.peak_bytes, offset + nbytes))
        plan = dataclasses.replace(plan, storage=storage)
    return _with_promotion(plan, scale_loads=loads, why_scale_loads=WHY_SCALE_LOADS[loads]
                           + f" (the plan option with_scale_loads({loads.name.lower()}))")
