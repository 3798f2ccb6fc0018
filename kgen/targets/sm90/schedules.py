"""The schedules sm_90a can run a kernel with, in its order of preference: the shared ones (see
kgen/targets/common/schedules.py), where a resident chain's gemms also move to wgmma where its
rules hold, and before them the ping-pong schedule, taken only when `schedule pingpong` asks:

    producer   a warpgroup (its registers lowered with setmaxnreg, the consumers' raised) streams
               the first gemm's A tiles into a ring of `stages` slots, each
               guarded by a full and an empty mbarrier (cp.async, signalled through
               cp.async.mbarrier.arrive), over every tile of the CTA in order
    consumers  two warpgroups (three where consumer_count says so) take the CTA's tiles in
               turn; each runs the whole chain on a 64-row tile of its own: g0 on wgmma from
               the ring, every later gemm on wgmma with A from registers (the gemm before's
               accumulators, repacked), then the last epilogue and its stores.

The last gemm's output leaves through the copy engine where it can (tma_refusal): each consumer
warpgroup writes its tile into a staging buffer of its own (64x64 boxes, 128-byte swizzle) and
one thread issues cp.async.bulk.tensor stores of it. On an H200 this beat 16-byte stores from
registers (bench/RESULTS.md); it takes 2 x 64 x tile N x 2 bytes of shared memory that the ring
then cannot have.

The ping-pong rules, each refusal pointing at its source: a chain of two or more gemms, each
after the first keeping the one before in registers and its B resident (the first gemm's B is
resident too, or streams through the ring beside A: `chain_ring_b`, which needs a K-major B0 of
at most 256 rows, not batched); a consumer thread's values at each chained gemm within its
registers (kgen/targets/sm90/chain_values.py: tile_values, max_values, and the last gemm's
column passes); the first gemm's warps 4x1 (one warpgroup per tile); the buffers within the
budget; the first gemm on wgmma. The consumers take turns at the first gemm's mainloop
(consumer_order), so any ring depth from 2 is safe: a consumer never waits on a slot whose
previous fill may not have landed.
"""
from __future__ import annotations

import dataclasses
from typing import Generator, Sequence

from ...enums import DType, Residency
from ...plan import (ColumnPasses, EpilogueVectors, GemmPlan, KernelKind, LoadPath, Mma,
                     OperandPlan, OperandSchedule, Overlap, StoragePlan, StorePath, TensorMap,
                     VectorHome, WarpRole)
from .. import (MORE_WARPS, Candidate, Instruction, Mainloop, Placement, Placing, ScheduleDraft,
                Site, WarpGrid, place)
from ..common import schedules as common
from . import warp_specialized
from .chain_pairs import pairs_why
from .tensor_map import STAGING_BOX
from .chain_values import (CONSUMERS, STAGING_MAX_VALUES, WHY_THREE, chain_values,
                           column_passes, consumer_count, max_values, pass_n, passes_in_flight, passes_why,
                           register_refusal, staged_passes, staging_fits, staging_refusal,
                           tile_values, values_over)

STAGING_ALIGN = 1024  # a 128-byte swizzled box starts on a 1024-byte boundary (8 rows x 128 B)
PRODUCER_THREADS = 128  # a warpgroup issues the ring's copies (setmaxnreg works per warpgroup;
# one warp could not keep up on an H200)
PRODUCER_REGISTERS = 40  # setmaxnreg: the producers only compute addresses
CONSUMER_WORDS = {2: "two", 3: "three"}  # for the templates' comments
WARPGROUP_WARPS = 4
WGMMA_SS = ("wgmma: warpgroups of 4 warps along M, 16 rows per warp, A and B K-major with "
            "128-byte swizzled k tiles")
WGMMA_RS = ("wgmma with A from registers: the previous gemm's output is already in its "
            "register layout, B K-major with 128-byte swizzled k tiles")


def candidates(draft: ScheduleDraft) -> Generator[Placement, StoragePlan, list[Candidate]]:
    ping = yield from pingpong(draft)
    cooperative = yield from warp_specialized.candidate(draft, KernelKind.COOPERATIVE)
    ws = ping if draft.requested is KernelKind.PINGPONG else cooperative
    rest = [(yield from persistent(draft)), (yield from one_gemm_tiled(draft, ws))]
    if draft.cluster != (1, 1):  # clusters run on the warp-specialized kernel alone
        reason = (f"cluster {draft.cluster[0]}x{draft.cluster[1]} runs on the warp-specialized "
                  f"kernel only, which refuses this gemm: {ws.reason}")
        rest = [Candidate(c.kind, False, reason, ws.site or Site("cluster", 0)) for c in rest]
    if any(d.fp8 for d in draft.dtypes.values()):  # FP8 operands: wgmma's alone
        reason = ("FP8 operands run on the warp-specialized kernel only (wgmma's k32 FP8 "
                  f"family; mma.sync here takes 16-bit operands), which refuses this gemm: "
                  f"{ws.reason}")
        rest = [Candidate(c.kind, False, reason, ws.site or Site("gemm", 0)) for c in rest]
    if draft.stream_k:  # stream-K runs on the cooperative kernel alone
        reason = ("split stream runs on the cooperative warp-specialized kernel only, which "
                  f"refuses this gemm: {cooperative.reason}")
        rest = [Candidate(c.kind, False, reason, cooperative.site or Site("split", 0))
                for c in rest]
    return [ping, cooperative, *rest]


def persistent(draft: ScheduleDraft) -> Placing:
    """The shared persistent chain, its gemms on wgmma where mmas says; a chain of more than two
    gemms it refuses with the advice that the ping-pong chain takes it."""
    candidate = yield from common.persistent(draft, mmas)
    if candidate.legal or len(draft.gemms) < 3:
        return candidate
    return dataclasses.replace(candidate, reason=(
        f"{candidate.reason}; on sm_90a a chain of {len(draft.gemms)} gemms keeps its B "
        "operands resident in the ping-pong chain ('schedule pingpong')"))


WHY_NOT_WS = "not wgmma: the {kind} warp-specialized kernel refuses this gemm: {reason}"
WS_TILE_ADVICE = ("; use a tile the warp-specialized kernel takes (more warps would run this "
                  "one on the mma.sync kernel, the slower path on sm_90a)")


def one_gemm_tiled(draft: ScheduleDraft, ws: Candidate) -> Placing:
    """The tiled kernel (mma.sync) with sm_90a's reasons: a gemm of its own runs on mma.sync
    because the warp-specialized kernel `ws` refuses it, and a tile the mma.sync kernel refuses
    too gets both reasons; where `ws` refuses the tile itself, with the advice that keeps it on
    wgmma instead of the mma.sync kernel's (MORE_WARPS). A chain keeps the shared words (its
    wgmma needs `keep B resident`)."""
    if len(draft.gemms) != 1:
        return (yield from common.tiled(draft))
    tiled = yield from common.tiled(draft, WHY_NOT_WS.format(kind=ws.kind.value,
                                                              reason=ws.reason))
    refusal = draft.mma_sync_refusal[1] if draft.mma_sync_refusal else ""
    if tiled.legal or ws.legal or tiled.reason != refusal:
        return tiled
    if ws.site != Site("tile", 0):
        return dataclasses.replace(tiled, reason=(
            f"{refusal} (on the mma.sync kernel; the {ws.kind.value} warp-specialized kernel "
            f"refuses this gemm: {ws.reason})"))
    tile = "x".join(map(str, draft.gemms[0].plan.tile))
    return dataclasses.replace(tiled, reason=(
        f"tile {tile} runs on neither of sm_90a's kernels for one gemm: the {ws.kind.value} "
        f"warp-specialized kernel refuses it: {ws.reason}; on the mma.sync kernel "
        f"{refusal.removesuffix(MORE_WARPS)}{WS_TILE_ADVICE}"))


def producer_threads(kind: KernelKind | None) -> int | None:
    return PRODUCER_THREADS if kind is KernelKind.PINGPONG else None


def consumer_grid(kind: KernelKind, tile: tuple[int, int, int]) -> WarpGrid | None:
    """The warp-specialized kernels' consumer grid on a one-gemm tile (warp_specialized)."""
    if kind not in warp_specialized.CONSUMER_WARPS:
        return None
    return warp_specialized.consumer_grid(kind, tile)


def threads() -> int:
    return CONSUMERS * WARPGROUP_WARPS * 32 + PRODUCER_THREADS


def roles(consumers: int = CONSUMERS) -> tuple[WarpRole, ...]:
    """The producer warpgroup and `consumers` consumer warpgroups, the register file shared out
    by setmaxnreg: the producer keeps PRODUCER_REGISTERS, each consumer thread the rest, in
    steps of 8 (232 for two warpgroups: their accumulators; 152 for three)."""
    threads = consumers * WARPGROUP_WARPS * 32
    registers = (65536 - PRODUCER_THREADS * PRODUCER_REGISTERS) // threads // 8 * 8
    return (WarpRole("producer", PRODUCER_THREADS // 32, registers=PRODUCER_REGISTERS),
            WarpRole("consumer", WARPGROUP_WARPS, groups=consumers, registers=registers))


def refuse_request(draft: ScheduleDraft) -> Candidate | None:
    """The ping-pong rules that need only the source: the chain's residency and the warps."""
    if draft.requested is not KernelKind.PINGPONG or len(draft.gemms) == 1:
        return None  # one gemm: the warp-specialized rules, once its plan is made
    gemms = draft.gemms
    if any(not g.resident or g.keep is Residency.SMEM for g in gemms[1:]):
        return _refused(
            "schedule pingpong needs chained gemms, each after the first keeping the one before "
            "in registers and its B resident ('keep B1 resident'); the first gemm's B is "
            "resident too ('keep B0 resident') or streams through the ring beside A",
            Site("schedule"))
    first = gemms[0]
    if tuple(first.warps) != (WARPGROUP_WARPS, 1):
        return _refused(
            f"schedule pingpong gives each consumer warpgroup a tile of its own: gemm "
            f"'{first.name}' needs warps 4x1, not {first.warps[0]}x{first.warps[1]}",
            Site("warps", 0))
    return None


WHY_TMA_A = ("the copy engine: one producer thread issues each k tile's box into the ring (the "
             "128-byte swizzle wgmma reads), the slot's full mbarrier counts its bytes; the "
             "consumer warpgroup frees the slot through its empty one")


WHY_TMA_B = ("streamed, not resident: each ring slot holds the k tile of B beside A's, both "
             "boxes issued by one producer thread and counted by the slot's full mbarrier "
             "(every 64-row tile rereads B, from L2)")
# Overlap.wgmma_groups: two groups where the ring holds a tile's k tiles and two slots
# more (IN_FLIGHT_SPARE). A consumer then holds two slots at once, and the ring still holds the
# other consumer's whole next tile. H200 (bench/logs/chain_in_flight/variants_h200.log): 0.963-
# 0.972 of one group's time at K0 = 256, N0 = 128, N1 <= 128 (4 k tiles, 6 slots), 0.97-0.99 at
# N0 = 64; 1.00-1.03 at K0 = 576 (9 k tiles, 6 slots) and 1.00-1.02 at K0 = 256, N1 = 256
# (5 slots). The H100 run (bench/logs/chain_variants/variants.log) agrees within 1%.
IN_FLIGHT_SPARE = 2
WHY_IN_FLIGHT = ("the next k tile's wgmma group is issued before the one before completes (no "
                 "drain between k tiles), each slot going back one k tile later: the ring holds "
                 f"a tile's k tiles and {IN_FLIGHT_SPARE} slots more, so the other consumer's "
                 "next tile still fills ahead")


def in_flight(first: GemmPlan) -> int:
    """wgmma groups in flight in a ping-pong chain's first mainloop (Overlap.wgmma_groups):
    2 where the ring has IN_FLIGHT_SPARE slots more than a tile's k tiles, else 1."""
    k = first.k_dim
    if not isinstance(k, int):
        return 1
    return 2 if first.stages >= -(-k // first.tile[2]) + IN_FLIGHT_SPARE else 1


# EpilogueVectors, REGISTERS: a ping-pong chain's gemm that feeds the next one loads its
# epilogue's column vectors at each tile's top, where a consumer thread's registers hold them
# beside the mainloop's accumulators with EARLY_RESERVE to spare (addresses, descriptors, the
# loop). H200, f16 and bf16, both rounds in turn (bench/logs/stop10/held_vectors.log): 0.94-0.97
# of the time at K0 = 256 with N0 = 128 (N1 of 64, 128, 256, 320), 0.97-0.98 at K0 = 256,
# N0 = 64, 0.99-1.01 at K0 = 576 and 1024, 0.92 at 256/160/320 (160 values beside 80
# accumulators). Held across all of a consumer's tiles instead, they spilled there. Only where
# every later gemm runs on wgmma: beside g1 on mma.sync (N0 = 112, g1's k tile 16) NVRTC 13
# spilled 8 bytes at N1 = 320 with them and none without.
EARLY_RESERVE = 64
WHY_EARLY = ("the tile covers all of N, so a thread's columns are the same in every tile: "
             "loaded before the mainloop, they land while it runs, and the epilogue (which "
             "waited for each read from global memory after the last wgmma group) reads none")


def early_registers(g: GemmPlan, params: tuple[str, ...]) -> int:
    """A consumer thread's registers for g's column vectors `params` held through its
    mainloop: a pair per n8 fragment, 2 registers for f32, 1 for a 16-bit pair."""
    dtypes = g.epilogue.column_vectors
    return sum(g.frags[1] * (2 if dtypes[p] is DType.F32 else 1) for p in params)


def early_vectors(g: GemmPlan, consumers: int) -> tuple[str, ...]:
    """The column vectors of g's feeding epilogue that its consumers load before the mainloop
    (EpilogueVectors, REGISTERS): all of them where they fit beside the accumulators (and, in
    a chained gemm that feeds another, its A fragments from the gemm before), else none."""
    params = tuple(g.epilogue.column_vectors)
    accumulators = g.frags[0] * g.frags[1] * 4 + a_fragment_registers(g)
    budget = roles(consumers)[1].registers - EARLY_RESERVE
    return params if accumulators + early_registers(g, params) <= budget else ()


def a_fragment_registers(g: GemmPlan) -> int:
    """A consumer thread's registers for g's A fragments where they come from the gemm before
    in registers: 4 per m16 tile and k step; 0 where A is read from shared memory."""
    if g.chain is None or g.a is not None:
        return 0
    return g.chain.k_steps * g.frags[0] * 4


def ring_b_refusal(first: GemmPlan, draft: ScheduleDraft) -> str | None:
    """Why the first gemm's B cannot stream through the ping-pong ring (None: it can): the
    copy engine loads its k tiles as one box each, N rows of 128 bytes (K-major), which needs
    a fixed N of at most 256 rows and one B for every batch."""
    if not first.b.k_major:
        return f"{first.b.param} must be K-major (a column-major [K, N] tensor)"
    if not isinstance(first.n_dim, int) or first.n_dim > 256:
        return f"its box takes at most 256 rows of N, not {first.n_dim}"
    if first.b.param in draft.batched:
        return f"a batched {first.b.param} is not streamed by this kgen version"
    return None


# The ring's tensor maps pull 128-byte lines on an L2 miss, as the one-gemm kernel's operands do
# (warp_specialized.OPERAND_PROMOTION). Where A's and B0's rows are 16-byte but not 32-byte
# multiples (K0 = 1000 in f16), H200, f16, in turn (bench/logs/stop10/c/): A's map alone 0.93-0.95
# of the time on 256-byte lines, B0's alone 0.89-0.93 (64-byte lines and none about the same);
# at K0 = 1024 0.99-1.00.
RING_PROMOTION = warp_specialized.OPERAND_PROMOTION
WHY_RING_PROMOTION = warp_specialized.WHY_PROMOTION


def _refused(reason: str, site: Site | None = None) -> Candidate:
    return Candidate(KernelKind.PINGPONG, False, reason, site)


def pingpong(draft: ScheduleDraft) -> Placing:
    if draft.requested is not KernelKind.PINGPONG:
        return _refused("taken only on request ('schedule pingpong')")
    if len(draft.gemms) == 1:
        return (yield from warp_specialized.candidate(draft, KernelKind.PINGPONG))
    refusal = refuse_request(draft)
    if refusal is not None:
        return refusal
    ring_b = not draft.gemms[0].resident  # B0 streams through the ring beside A
    refusal = common.resident_refusal(draft, common.persist_refusal(draft, longer=True) is None,
                                      first_streams=True, column_blocks=True)
    if refusal is not None:
        return _refused(refusal.reason, refusal.site)
    gemms = draft.plans(Mainloop.RESIDENT)
    first, source, last = gemms[0], gemms[-2], gemms[-1]  # source: the last gemm's A
    if ring_b:
        refusal = ring_b_refusal(first, draft)
        if refusal:
            return _refused(f"schedule pingpong streams {first.b.param} through the ring "
                            f"beside {first.a.param} (it is not kept resident), but {refusal}",
                            Site("resident", 0))
    wide = common.wide_refusal(last)
    tma = wide or tma_refusal(last)
    # the output staged for the copy engine, in column passes where they apply, else whole;
    # where neither serves (tma says why), 16-byte stores from registers. Three consumer
    # warpgroups where consumer_count says so and their staging fits, else two.
    passes, consumers, storage = 1, CONSUMERS, None
    wider = last.tile[1] > 256  # wider than wgmma's N: only in column passes, each staged
    for passes, consumers in [] if tma else [
            (n, c) for n in sorted({column_passes(source.tile[1], last.tile[1]), 1}, reverse=True)
            if not (wider and n == 1)
            for c in sorted({consumer_count(gemms, n), CONSUMERS}, reverse=True)]:
        tma = staging_refusal(gemms, passes)
        if tma:
            continue
        storage = yield place(gemms, persistent=True, resident=True,
                              staging=(staging_bytes(last, passes, consumers), STAGING_ALIGN),
                              ring_b=ring_b, **turns(first, consumers))
        if storage.total_bytes > storage.limit_bytes:
            tma = "the output staging does not fit beside the ring and the resident B tiles"
        elif passes > 1 and mmas(gemms, storage)[-1][0] is not Mma.WGMMA_RS:
            tma = f"the column passes of gemm '{last.name}' need it on wgmma"
        else:
            break
    if tma and wider:
        return _refused(f"gemm '{last.name}' runs its tile of {last.tile[1]} columns in passes "
                        f"of {last.tile[1] // column_passes(source.tile[1], last.tile[1])}, each "
                        f"staged for the copy engine, but {tma}", Site("tile", len(gemms) - 1))
    if tma:
        passes, consumers = 1, CONSUMERS
        over = values_over([g.tile[1] for g in gemms])
        if over and over[0] == len(gemms) - 1:  # the last gemm alone, stored from registers
            return _refused(f"a consumer thread would hold {chain_values(gemms[-2:])} "
                            f"accumulator values (over {max_values(len(gemms) - 1)}: they "
                            f"spill) storing gemm '{last.name}' from registers, and its "
                            f"staging cannot serve: {tma}", Site("tile", len(gemms) - 1))
        if over:
            return _refused(register_refusal(gemms, over[0]), Site("tile", over[0]))
        storage = yield place(gemms, persistent=True, resident=True, staging=(0, 0),
                              ring_b=ring_b, **turns(first, consumers))
    if storage.total_bytes > storage.limit_bytes:
        return Candidate(KernelKind.PINGPONG, False, common.over_budget(storage), Site("budget"),
                         gemms=tuple(gemms), storage=storage)
    offsets = {b.name: b.offset for b in storage.buffers}
    if not draft.target.has(Instruction.WGMMA) or wgmma_refusal(first, first.a, offsets):
        return _refused(
            f"schedule pingpong runs gemm '{first.name}' on wgmma: it needs a 64-row tile, "
            "A and B K-major with 128-byte k tiles (64 f16/bf16), and N a multiple of 8 up "
            "to 256", Site("tile", 0))
    if wide:
        last_store = StorePath.PAIRS, wide
    elif tma:
        last_store = StorePath.WIDE, f"{common.WHY_WIDE}; not TMA: {tma}"
    else:
        last_store = StorePath.TMA, ("the copy engine stores each consumer's staged tile (beat "
                                     "16-byte stores from registers on an H200)")
    out = last.epilogue.packed_store.param if not tma else None
    a_map = TensorMap(first.a.param, first.a.dtype, first.m_dim, first.k_dim,
                      (first.tile[2], first.tile[0]),
                      why=f"{first.a.param} tiles of {first.tile[0]}x{first.tile[2]}, loaded by "
                      "the producer into the ring" + WHY_RING_PROMOTION,
                      load_promotion=RING_PROMOTION)
    b_map = (TensorMap(first.b.param, first.b.dtype, first.n_dim, first.k_dim,
                       (first.tile[2], first.tile[1]),
                       why=f"{first.b.param} tiles of {first.tile[1]}x{first.tile[2]}, loaded by "
                       f"the producer into the ring beside {first.a.param}'s"
                       + WHY_RING_PROMOTION, load_promotion=RING_PROMOTION),) if ring_b else ()
    gemm_mmas = mmas(gemms, storage)
    schedule = common.build(
        draft, KernelKind.PINGPONG, gemms, last_store, mmas=gemm_mmas,
        roles=roles(consumers), why_kind="schedule pingpong: producer warps fill the ring, "
        + ("two consumer warpgroups take alternate tiles" if consumers == 2 else
           f"{consumers} consumer warpgroups take the tiles in turn: {WHY_THREE}"),
        tensor_maps=(a_map,) + b_map + ((output_map(last, draft.dtypes[out]),) if out else ()))
    # the ring of A (and of B0 where it streams) by the copy engine: one producer thread
    # issues each k tile's boxes
    ring = schedule.gemms[0]
    ring_pipeline = dataclasses.replace(ring.pipeline, a=OperandSchedule(LoadPath.TMA,
                                                                         why=WHY_TMA_A))
    if ring_b:
        ring_pipeline = dataclasses.replace(ring_pipeline,
                                            b=OperandSchedule(LoadPath.TMA, why=WHY_TMA_B))
    ring = dataclasses.replace(ring, pipeline=ring_pipeline)
    groups = in_flight(first)
    paired = pairs_why(first, ring_b, consumers, bool(draft.batched))
    if paired:  # one wgmma group in flight: each slot goes back once its group completes
        ring = dataclasses.replace(ring, pipeline=dataclasses.replace(
            ring.pipeline, paired=True, why=paired))
    elif groups > 1:
        ring = dataclasses.replace(ring, overlap=Overlap(wgmma_groups=groups, why=WHY_IN_FLIGHT))
    on_wgmma = all(m is Mma.WGMMA_RS for m, _ in gemm_mmas[1:])
    feeding = [dataclasses.replace(gs, vectors=EpilogueVectors(VectorHome.REGISTERS, early,
                                                               WHY_EARLY))
               if on_wgmma and (early := early_vectors(g, consumers)) else gs
               for g, gs in zip(gemms[:-1], (ring,) + schedule.gemms[1:-1])]
    ring, later = feeding[0], tuple(feeding[1:]) + schedule.gemms[-1:]
    if passes > 1:  # the last gemm a share of its columns at a time
        why = passes_why(gemms, passes)
        later = later[:-1] + (dataclasses.replace(
            later[-1], passes=ColumnPasses(passes, why),
            overlap=passes_in_flight(gemms, passes, consumers)),)
    schedule = dataclasses.replace(schedule, gemms=(ring,) + later)
    return Candidate(KernelKind.PINGPONG, True, "", None, schedule, tuple(gemms), storage)


# ---------------------------------------------------------------------------------------------
# The rules of wgmma and of the copy engine's stores


def mmas(gemms: list[GemmPlan], storage) -> list[tuple[Mma, str]]:
    """Each gemm of a resident chain: the first on wgmma (A and B from shared memory) where its
    rules hold, and the later ones follow it with A from registers where theirs hold."""
    offsets = {b.name: b.offset for b in storage.buffers}
    first = gemms[0]
    refusal = wgmma_refusal(first, first.a, offsets)
    if refusal:
        return [(Mma.MMA_SYNC, f"not wgmma: {refusal}")] * len(gemms)
    out = [(Mma.WGMMA_SS, WGMMA_SS)]
    for source, g in zip(gemms, gemms[1:]):
        refusal = ("its A is not kept in registers" if g.chain is None or g.a is not None
                   else shape_refusal(g, offsets, pass_n(source.tile[1], g.tile[1]),
                                      RS_B_ROW_BYTES))
        out.append((Mma.MMA_SYNC, f"not wgmma: {refusal}") if refusal else (Mma.WGMMA_RS, WGMMA_RS))
    return out


def wgmma_refusal(g: GemmPlan, a: OperandPlan | None, offsets: dict[str, int]) -> str | None:
    """A gemm with A and B in shared memory on wgmma: the shared rules, and A as wgmma reads it."""
    if a is None:
        return "its A is not in shared memory"
    return shape_refusal(g, offsets) or tile_refusal(g, a, offsets)


def shape_refusal(g: GemmPlan, offsets: dict[str, int], n: int | None = None,
                  row_bytes: tuple[int, ...] = (128,)) -> str | None:
    """The rules every wgmma gemm shares: warpgroups of 4 warps along M, 16 rows per warp (the
    accumulators then sit where mma.sync would put them), N a multiple of 8 up to 256 (`n`:
    one column pass's, where the tile is wider), and B as wgmma reads it (k tiles of
    `row_bytes`)."""
    if g.warps[1] != 1 or g.warps[0] % 4:
        return f"warpgroups of 4 warps along M need warps 4kx1, not {g.warps[0]}x{g.warps[1]}"
    if g.warp_tile[0] != 16:
        return f"16 rows per warp, not {g.warp_tile[0]}"
    n = g.tile[1] if n is None else n
    if n % 8 or not 8 <= n <= 256:
        return f"tile N a multiple of 8 up to 256, not {n}"
    return tile_refusal(g, g.b, offsets, row_bytes)


# A chained gemm's resident B on wgmma (A from registers) takes k tiles of 64 bytes too, in the
# 64-byte swizzle (sm90/chain.py's DESCRIPTORS): g1's K, the N of g0, is then a multiple of 32 rather
# than 64 (N0 = 96, 32, 160). Those chains ran g1 on mma.sync: at N1 = 256 its values spilled,
# and wider N1 could not take column passes (the persistent chain, 2.5-4.1x a copy of the
# bytes on an H200, bench/RESULTS.md).
RS_B_ROW_BYTES = (128, 64)


def tile_refusal(g: GemmPlan, op: OperandPlan, offsets: dict[str, int],
                 row_bytes: tuple[int, ...] = (128,)) -> str | None:
    """An operand wgmma reads through a descriptor: K-major, one swizzled row of one of
    `row_bytes` per k tile (128 bytes; a chained gemm's resident B 64 too), its buffer
    1024-byte aligned."""
    if not op.k_major:
        return f"{op.param} must be K-major"
    width = k_tile_row_bytes(g, op)
    if width not in row_bytes or op.smem.atom_inner * op.dtype.nbytes != width:
        return (f"{op.param} needs {' or '.join(map(str, row_bytes))}-byte k tiles, not "
                f"{width}")
    if offsets[op.smem.name] % 1024:
        return f"{op.smem.name} must start on a 1024-byte boundary"
    return None


def k_tile_row_bytes(g: GemmPlan, op: OperandPlan) -> int:
    """The bytes of one row of a K-major operand's k tile: the width its swizzle and its wgmma
    descriptor read."""
    return g.tile[2] * op.dtype.nbytes


def tma_refusal(last: GemmPlan) -> str | None:
    """Why the last gemm's output cannot go out through the copy engine (None: it can; it
    already qualifies for 16-byte stores): its tile must be 64 rows (one consumer warpgroup),
    its tile N a multiple of the 64-column box, and N fixed. Rows past M and columns past N
    are clipped by the tensor map; where the tiles overhang N, the epilogue skips the columns
    past it (overhangs)."""
    n = last.tile[1]
    if last.tile[0] != STAGING_BOX:
        return f"the tile has {last.tile[0]} rows, not one {STAGING_BOX}-row box"
    if n % STAGING_BOX:
        return f"tile N {n} is not a multiple of the {STAGING_BOX}-column box"
    if not isinstance(last.n_dim, int):
        return f"N {last.n_dim} is not fixed"
    return None


def overhangs(last: GemmPlan) -> bool:
    """The last gemm's tiles reach past its N (N1 = 96 on 128-column tiles)."""
    return not (isinstance(last.n_dim, int) and last.n_dim % last.tile[1] == 0)



def turns(first: GemmPlan, consumers: int) -> dict[str, int]:
    """The ring's barriers for the storage plan: a full and an empty mbarrier per slot, then
    one per consumer warpgroup for the turns (consumer_order)."""
    return dict(ring_barriers=ring_barriers(first), turn_barriers=consumers)


def ring_barriers(first: GemmPlan) -> int:
    """mbarriers of the ring: a full and an empty one per slot."""
    return 2 * first.stages


def staging_placement(draft: ScheduleDraft) -> Placement | None:
    """The trial placement of a ping-pong chain's output staging (two consumers', in the column
    passes staged_passes gives) beside its ring (A's k tiles, and B0's where it streams) and
    its resident B tiles, whose fit the storage planner weighs: the builder orders the chain's
    ring depths by it (kgen/targets/sm90/configs.py). None where a consumer thread's values
    leave the chain no staging (over STAGING_MAX_VALUES)."""
    gemms = draft.plans(Mainloop.RESIDENT)
    widths = [g.tile[1] for g in gemms]
    passes = staged_passes(widths[-2], widths[-1])
    if not staging_fits(widths, passes):
        return None
    return place(gemms, persistent=True, resident=True,
                 staging=(staging_bytes(gemms[-1], passes), STAGING_ALIGN),
                 ring_b=not draft.gemms[0].resident, **turns(gemms[0], CONSUMERS))


def staging_bytes(last: GemmPlan, passes: int = 1, consumers: int = CONSUMERS) -> int:
    """Shared memory for the output staging: a tile of 16-bit values per consumer warpgroup
    (one pass's columns of it)."""
    return staging_bytes_for(last.tile[0], last.tile[1] // passes, consumers)


def staging_bytes_for(rows: int, columns: int, consumers: int = CONSUMERS) -> int:
    """The output staging of `consumers` warpgroups, each a rows x columns tile of 16-bit
    values."""
    return consumers * rows * columns * 2



def output_map(last: GemmPlan, dtype) -> TensorMap:
    """The tensor map of the last gemm's output, stored from 64x64 staged boxes."""
    out = last.epilogue.packed_store.param
    return TensorMap(out, dtype, last.m_dim, last.n_dim, (STAGING_BOX, STAGING_BOX), store=True,
                     why="the output staging's 64x64 boxes, stored by the copy engine")
