"""The schedules every target shares, their rules and how a Schedule is built from a choice:

    PERSISTENT  two chained gemms, the second keeping the first in registers, and no storage or
                phases declaration (their lifetimes assume one tile): min(tiles, SMs x CTAs per
                SM) CTAs loop over the tiles, prefetching the next tile's first stages of the
                first gemm during the last. With `keep B resident` on every gemm, each B is
                loaded once per CTA and the first gemm's stages become a ring of A tiles.
    TILED       one CTA per tile; refused only where `keep B resident` asks for PERSISTENT

A candidate whose buffers do not fit the shared memory is refused for that; the lowering raises
the storage pass's budget message only if it is the one selected. Each target's list
(kgen/targets/<arch>/schedules.py) puts its own schedules before these.
"""
from __future__ import annotations

import dataclasses

from ...enums import Layout, Residency
from ...plan import (CachePolicy, EntryPoints, GemmPlan, GemmSchedule, KernelKind, LoadPath, Mma,
                     MmaAtom, OperandSchedule, Output, Pipeline, Raster, Schedule, StorePath,
                     TensorMap, TileScheduler, WarpRole, WarpRoles)
from .. import Candidate, Instruction, Mainloop, Placing, ScheduleDraft, Site, place

WHY_PERSISTENT = ("two chained gemms, the intermediate in registers: CTAs loop over the tiles "
                  "and prefetch the next tile's first stages")
WHY_RESIDENT = ("every gemm keeps B resident: B loaded once per CTA, the first gemm's A "
                "streams through a ring across tiles")
WHY_MMA_SYNC = "the target's warp MMA"
WHY_MMA_FP8 = ("the target's warp MMA for FP8 operands: k32 steps over the same 32 bytes of "
               "each fragment row as 16-bit's k16")
WHY_NOT_WGMMA = "wgmma is planned for resident chains only ('keep B resident')"
WHY_LOAD = {
    LoadPath.CP_ASYNC: "every thread copies the next k tiles while the MMAs run",
    LoadPath.CP_ASYNC_PREFETCH: "the next tile's first stages load during this tile's last",
    LoadPath.CP_ASYNC_RING: "the ring runs on across tiles, never drained between them",
    LoadPath.RESIDENT: "keep resident: the whole operand, loaded once per CTA",
    LoadPath.CHAINED_REGISTERS: "the previous gemm's output, repacked in registers",
    LoadPath.CHAINED_SMEM: "the previous gemm's output, written to shared memory by its epilogue",
}
WHY_PRODUCER = ("the producer warps alone fill the ring across tiles, each slot guarded by a "
                "full and an empty mbarrier")
WHY_EVICT_FIRST = "; L2 evicts it first: a resident chain reads each A tile once"
WHY_NOT_EVICT_FIRST = ("; no L2 hint: with TMA stores (which carry it) the hint on A measured 2% "
                       "slower on an H200")


SM90_KINDS = (KernelKind.PINGPONG, KernelKind.COOPERATIVE)


def sm90_only(draft: ScheduleDraft) -> list[Candidate]:
    """The kinds only sm_90a has, refused on an earlier target (located when a line asked)."""
    return [refuse_request(draft) if draft.requested is kind else Candidate(
        kind, False, "needs target sm_90a (wgmma, mbarrier waits, TMA)") for kind in SM90_KINDS]


def refuse_request(draft: ScheduleDraft) -> Candidate | None:
    """A `schedule` line that asks for a kind this target does not have: refused, located."""
    if draft.requested not in SM90_KINDS:
        return None
    kind = draft.requested
    return Candidate(
        kind, False,
        f"schedule {kind.value} needs target sm_90a (wgmma, mbarrier waits, TMA); this kernel "
        f"compiles for {draft.target.arch.value}", Site("schedule"))


# ---------------------------------------------------------------------------------------------
# The rules


def persist_refusal(draft: ScheduleDraft, longer: bool = False) -> str | None:
    """Why the draft cannot run persistent (None: it can)."""
    gemms = [g.plan for g in draft.gemms]
    if not ((len(gemms) == 2 or longer and len(gemms) > 2)
            and all(g.chain is not None and g.a is None for g in gemms[1:])):
        return ("a persistent kernel needs two chained gemms, the second keeping the first in "
                "registers")
    if draft.declared_storage:
        return "a storage or phases declaration gives lifetimes for one tile, not a loop of them"
    if not draft.allow_persistent:
        return "the caller asked for one CTA per tile"
    return None


def resident_refusal(draft: ScheduleDraft, persist: bool, first_streams: bool = False,
                     column_blocks: bool = False) -> Candidate | None:
    """`keep B0 resident` on every gemm of a persistent chain, with fixed K and N and a tile N
    that covers N: each B operand's shared tile then holds all of its k tiles. `first_streams`:
    the first gemm's B may stream instead (sm_90a's ping-pong chain, through its ring).
    `column_blocks`: the last gemm's tile may cover part of its N, each CTA keeping one column
    block of its B (the ping-pong chain's walk, KernelPlan.column_blocks)."""
    asked = [i for i, g in enumerate(draft.gemms) if g.resident]
    if not asked:
        return None
    first = draft.gemms[asked[0]].plan
    if not persist:
        return _refused(
            f"keep {first.b.param} resident needs the persistent kernel: two chained gemms, "
            "the second keeping the first in registers, and no storage or phases declaration",
            Site("resident", asked[0]))
    for i, g in enumerate(draft.gemms):
        if not g.resident and not (first_streams and i == 0):
            return _refused(
                f"gemm '{g.name}' must keep {g.plan.b.param} resident too: {first.name} keeps "
                f"{first.b.param} resident, and a chain keeps every B resident or none "
                f"(add 'keep {g.plan.b.param} resident')", Site("gemm", i))
    for i, g in enumerate(draft.gemms):
        plan = g.plan
        if not g.resident:
            continue
        for what, dim in (("K", plan.k_dim), ("N", plan.n_dim)):
            if not isinstance(dim, int):
                return _refused(
                    f"keep {plan.b.param} resident needs a fixed {what}, not {dim}: the whole "
                    f"{plan.b.param} must have a known size", Site("resident", i))
        if plan.n_dim > plan.tile[1] and not (column_blocks and i == len(draft.gemms) - 1):
            return _refused(
                f"keep {plan.b.param} resident needs the CTA tile N of gemm '{plan.name}' "
                f"({plan.tile[1]}) to cover all of its N ({plan.n_dim}): each CTA keeps one "
                f"tile of {plan.b.param}", Site("resident", i))
    return None


def _refused(reason: str, site: Site) -> Candidate:
    return Candidate(KernelKind.PERSISTENT, False, reason, site)


def ring_refusal(first: GemmPlan) -> str | None:
    """A ring of A tiles refills `stages - 1` k tiles ahead, at most into the next tile's: so
    stages - 1 may not exceed the first gemm's k tiles (the GPU run at K0 = 256, stages 6 and
    M = 81920 computed wrong rows before this rule)."""
    k_tiles = -(-first.k_dim // first.tile[2])
    if first.stages - 1 > k_tiles:
        return (f"the ring of {first.a.param} tiles runs at most one tile ahead: gemm "
                f"'{first.name}' has {k_tiles} k tiles, so stages {first.stages} must be at "
                f"most {k_tiles + 1}")
    return None


def wide_refusal(last: GemmPlan) -> str | None:
    """Why a resident chain's last gemm cannot store 16-byte chunks (None: it can): its
    epilogue must only store one row-major 16-bit tensor, N be a fixed multiple of 8 (no
    partial chunk) and each warp's columns come in whole chunks of four n8 tiles."""
    packed = last.epilogue.packed_store
    if packed is None or packed.layout is not Layout.ROW:
        return "16-byte stores need an epilogue that only stores one row-major 16-bit tensor"
    if not (isinstance(last.n_dim, int) and last.n_dim % 8 == 0):
        return f"16-byte stores need a fixed N that is a multiple of 8, not {last.n_dim}"
    if last.warp_tile[1] % 32:
        return f"16-byte stores need warp tiles of whole 32 columns, not {last.warp_tile[1]}"
    return None


WHY_WIDE = "one row-major 16-bit output: a quad's four pairs go out as one 16-byte chunk"
WHY_PAIRS = "16-byte stores are planned for resident chains only"


def over_budget(storage) -> str:
    return (f"shared memory over budget: {storage.total_bytes} bytes needed, "
            f"{storage.limit_bytes} allowed")


# ---------------------------------------------------------------------------------------------
# The candidates


def tiled(draft: ScheduleDraft, why_mma: str = "") -> Placing:
    """`why_mma`: why its gemms run on mma.sync, where the target says (sm_90a: which rule of
    its warp-specialized kernel the gemm misses); by default the target's own words."""
    if draft.mma_sync_refusal:  # a tile only the warp-specialized kernels plan
        i, reason = draft.mma_sync_refusal
        return Candidate(KernelKind.TILED, False, reason, Site("tile", i))
    refusal = resident_refusal(draft, persist=False)
    if refusal is not None:
        return dataclasses.replace(refusal, kind=KernelKind.TILED)
    gemms = draft.plans(Mainloop.WRITTEN)
    storage = yield place(gemms)
    # a one-gemm kernel's outputs leave as pairs; a column-major one as element stores, which
    # ran at the row-major pairs' speed, and faster than 16-byte chunks transposed in registers
    # (bench/logs/any_chain/sm80_col_output.log)
    last_store = StorePath.PAIRS, WHY_PAIRS
    schedule = build(draft, KernelKind.TILED, gemms, last_store, why_kind="one CTA per tile",
                     why_mma=why_mma)
    return _candidate(KernelKind.TILED, schedule, gemms, storage)


def persistent(draft: ScheduleDraft, mmas=None) -> Placing:
    """`mmas(gemm plans, storage)`: each gemm's (Mma, why) on a resident chain (sm_90a's
    wgmma); by default mma.sync."""
    if draft.mma_sync_refusal and len(draft.gemms) > 1:  # only the ping-pong chain's passes
        i, reason = draft.mma_sync_refusal
        return Candidate(KernelKind.PERSISTENT, False, reason, Site("tile", i))
    persist = persist_refusal(draft)
    refusal = resident_refusal(draft, persist is None)
    if refusal is not None:
        return refusal
    if persist is not None:
        return Candidate(KernelKind.PERSISTENT, False, persist)
    resident = draft.resident
    gemms = draft.plans(Mainloop.RESIDENT if resident else Mainloop.WRITTEN)
    if resident:
        deep = ring_refusal(gemms[0])
        if deep is not None:
            return Candidate(KernelKind.PERSISTENT, False, deep, Site("stages", 0))
    storage = yield place(gemms, persistent=True, resident=resident)
    last_store = StorePath.PAIRS, WHY_PAIRS
    if resident:
        wide = wide_refusal(gemms[-1])
        last_store = (StorePath.PAIRS, wide) if wide else (StorePath.WIDE, WHY_WIDE)
    schedule = build(draft, KernelKind.PERSISTENT, gemms, last_store,
                     mmas=mmas(gemms, storage) if mmas and resident else None,
                     why_kind=WHY_RESIDENT if resident else WHY_PERSISTENT)
    return _candidate(KernelKind.PERSISTENT, schedule, gemms, storage)


def _candidate(kind, schedule, gemms, storage) -> Candidate:
    legal = storage.total_bytes <= storage.limit_bytes
    reason = "" if legal else over_budget(storage)
    return Candidate(kind, legal, reason, None if legal else Site("budget"), schedule,
                     tuple(gemms), storage)


def build(draft: ScheduleDraft, kind: KernelKind, gemms: list[GemmPlan],
          last_store: tuple[StorePath, str], *, mmas=None, why_kind: str = "",
          roles: tuple[WarpRole, ...] | None = None,
          tensor_maps: tuple[TensorMap, ...] = (), why_mma: str = "") -> Schedule:
    """The schedule of a candidate: per gemm its MMA, each operand's load path and L2 policy,
    and its output's store path. Without `mmas`, every gemm on mma.sync, for `why_mma` (by
    default WHY_MMA_SYNC, or on a target with wgmma WHY_NOT_WGMMA)."""
    resident = draft.resident and kind is not KernelKind.TILED
    store, why_store = last_store
    out = []
    for i, g in enumerate(gemms):
        first, last = i == 0, i == len(gemms) - 1
        if g.chain is not None:
            a = (LoadPath.CHAINED_REGISTERS if g.chain.residency is Residency.REGISTERS
                 else LoadPath.CHAINED_SMEM)
        elif first and resident:
            a = LoadPath.CP_ASYNC_RING
        elif first and kind is KernelKind.PERSISTENT:
            a = LoadPath.CP_ASYNC_PREFETCH
        else:
            a = LoadPath.CP_ASYNC
        # a resident chain reads each A tile once: its ring's copies ask L2 to evict them
        # first; not when the output leaves through the copy engine (whose stores carry that
        # hint): there A's hint measured 2% slower on an H200 (bench/RESULTS.md)
        evict = first and resident and store is not StorePath.TMA
        why_a = (WHY_PRODUCER if a is LoadPath.CP_ASYNC_RING and roles and roles[0].name ==
                 "producer" else WHY_LOAD[a]) + (WHY_EVICT_FIRST if evict else WHY_NOT_EVICT_FIRST
                               if first and resident else "")
        if resident:
            b = LoadPath.RESIDENT
        elif first and kind is KernelKind.PERSISTENT:
            b = LoadPath.CP_ASYNC_PREFETCH
        else:
            b = LoadPath.CP_ASYNC
        mma, why = mmas[i] if mmas else (Mma.MMA_SYNC, why_mma or (
            WHY_NOT_WGMMA if draft.target.has(Instruction.WGMMA) else WHY_MMA_SYNC))
        if mma is Mma.MMA_SYNC and g.b.dtype.fp8:  # sm_89's (kgen/targets/sm80/fp8.py)
            mma, why = Mma.MMA_SYNC_FP8, WHY_MMA_FP8
        out.append(GemmSchedule(
            name=g.name, atom=MmaAtom(mma, why),
            pipeline=Pipeline(
                a=OperandSchedule(a, CachePolicy.EVICT_FIRST if evict else CachePolicy.NORMAL,
                                  why_a),
                b=OperandSchedule(b, why=WHY_LOAD[b]), stages=g.stages),
            output=(Output(store, why_store) if last
                    else Output(StorePath.FEED, f"the A operand of {gemms[i + 1].name}"))))
    if roles is None:
        warps = gemms[0].warps if gemms else (0, 0)
        roles = (WarpRole("math", warps[0] * warps[1]),)
    scheduler = TileScheduler(kind, Raster(draft.group_m), min_blocks_per_sm=1,
                              split_k=draft.split_k if kind is KernelKind.TILED else 1,
                              why=why_kind)
    return Schedule(scheduler=scheduler, warps=WarpRoles(roles), gemms=tuple(out),
                    entry=entry_points(gemms), tensor_maps=tensor_maps)


WHY_NARROW = ("arguments that miss the fast path's alignment rules (odd sizes, leading "
              "dimensions not 16-byte multiples) run the second entry point <kernel>_narrow, "
              "chosen at launch")


def entry_points(gemms) -> EntryPoints:
    """A one-gemm kernel also gets an entry point for any alignment (EntryPoints.narrow); a
    chain keeps its 16-byte rules (its fixed sizes and resident tiles assume them)."""
    return EntryPoints(narrow=True, why=WHY_NARROW) if len(gemms) == 1 else EntryPoints()
