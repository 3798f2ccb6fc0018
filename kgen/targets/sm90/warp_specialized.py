"""The warp-specialized schedules of one gemm on sm_90a (the Hopper GEMM):

    producer   one warpgroup (its registers lowered with setmaxnreg) of which one thread issues
               the copy engine's loads of A and B tiles into a ring of `stages` slots, each slot
               guarded by a full mbarrier (the loads' bytes) and an empty one (the consumers'
               release), over every tile of the CTA in order
    consumers  two warpgroups (registers raised) multiply with wgmma from shared-memory
               descriptors (128-byte swizzle, the TMA box's), one group kept in flight while
               the next k tile's group is issued; then the epilogue DAG in registers, and the
               output leaves through the copy engine (a swizzled staging buffer per consumer,
               bulk tensor stores) or as pair stores. The staging holds the consumer's whole
               tile, or, where that does not fit beside the ring, two 64x64 boxes that the
               epilogue fills and stores in turn (the epilogue tile, Staging).

    COOPERATIVE  both consumers on each 128-row tile, 64 rows each (the default), or on each
                 256-row tile, 128 rows (two m64 halves) each
    PINGPONG     each consumer a tile of its own (`schedule pingpong`; 128 or 64 rows): one's
                 epilogue runs while the other multiplies, their mainloops ordered by two turn
                 mbarriers

`split S` (cooperative only, no epilogue reductions) makes each output tile S units of the
persistent walk, unit u part u % S of tile u / S's k tiles; the consumers write its f32 partial
sums to the workspace and <kernel>_splitk (the tiled kernel's) adds them in order and runs the
epilogue.

CTAs are persistent (min(tiles, SMs) of them) and walk the tiles in groups of 8 tile rows (L2
reuse of the B tiles). Each operand is K-major (A row-major, B column-major: 128-byte rows along
K) or MN-major (A column-major, B row-major: 128-byte rows along M or N, boxes of 64 of them per
k tile, read by wgmma transposed). `cluster 2x1` (or 1x2) launches the CTAs in thread-block
clusters of two that walk cluster tiles of 2x1 (1x2) output tiles, the operand both tiles read
(B, or A) loaded half by each CTA and multicast to both (LoadPath.TMA_MULTICAST): half the
rows of a K-major tile, half the 64-column boxes of an MN-major one; the narrow
entry point runs without clusters. The rules, each refusal with its reason and where it points:
one gemm, 128-byte k tiles, a 128- or 256-row tile (64 or 128 for ping-pong), 8 math warps (the two
consumer warpgroups; or the grid of one tile's, CONSUMER_WARPS), tile N a multiple of 8 up to 256 (where a consumer has 128 rows, it holds
128 x N accumulators: up to 192 on a 256-row cooperative tile, 128 on a 128-row ping-pong one)
and of 64 for an MN-major B, a shared MN-major operand's tile a multiple of 128 (two CTAs' boxes), no
reductions with ping-pong, and
the buffers within the budget.
"""
from __future__ import annotations

import dataclasses

from ...enums import Axis, DType, Layout
from ...plan import (Cluster, EpilogueGroups, EpilogueVectors, GemmPlan,
                     GemmSchedule, KernelKind, LoadPath, Mma, MmaAtom, OperandPlan,
                     OperandSchedule, Output, Pipeline, Raster, Schedule, StagedInput, Staging,
                     StorePath, TensorLoad, TensorMap, TileScheduler, VectorHome, VectorLoad,
                     WarpRole, WarpRoles, staged_vector_buffer)
from .. import (Candidate, Instruction, Mainloop, Placing, ScheduleDraft, Site, WarpGrid,
                place)
from ..common import schedules as common
from .epilogue_groups import epilogue_groups
from .epilogue_math import epilogue_math
from .promotion import acc_promotion, scale_refusal, scale_requests
from .tensor_map import STAGING_BOX

WARPGROUP = 128
CONSUMERS = 2
PRODUCER_REGISTERS = 40  # one thread issues every copy
CONSUMER_REGISTERS = 232  # 40 x 128 + 232 x 256 <= 65536 registers of the SM
# The cooperative tile: two consumer warpgroups of one m64 half each (128 rows), or two each
# (256 rows, up to 128 columns: a consumer then holds 128 x N accumulators, as a 128-row
# ping-pong one does). 256x128 fills the waves where 128x256 leaves the last one part empty
# (4000x5200x2048 on an H200: 656 tiles, 4.97 waves of 132 SMs, against 672 of 128x256, 5.09;
# 0.998x torch.matmul against 0.932x for the wave model's 128x192); where both fill the same
# waves it ran 0.98-0.99x 128x256's speed (bench/logs/wide/wide_probe_tiles.log). Up to 192
# columns (192 accumulators per consumer thread, no spill on 3 stages; NVRTC 13.0): 256x192,
# 256x176 and 256x152 fill waves that no other tile does (bench/logs/part_box/).
COOPERATIVE_TILE_M = (128, 256)
WIDEST_TWO_HALVES = 192
# A ping-pong consumer's tile: one m64 half (up to 256 columns), or two (up to 128: it holds
# 128 x N accumulators). The 64-row tile serves small outputs, where 128-row tiles leave SMs
# idle (cuBLAS runs 64-row tiles at 128x4096x4096 and 1024^3, bench/RESULTS.md).
PINGPONG_TILE_M = (64, 128)
STAGE_ALIGN = 1024  # a 128-byte swizzled box starts on a 1024-byte boundary
MN_BOX = 64  # an MN-major operand's box: 64 M (or N) elements (128 bytes) by the k tile
# The warps that multiply one tile, as the plan and `kgen inspect` show them: cooperative, both
# consumer warpgroups along M; ping-pong, one warpgroup (the other has a tile of its own). The
# kernel takes any `warps` line of 8 math warps (2x4, 4x2, 8x1), or this grid.
CONSUMER_WARPS = {KernelKind.COOPERATIVE: (8, 1), KernelKind.PINGPONG: (4, 1)}
MAINLOOP = {KernelKind.COOPERATIVE: Mainloop.COOPERATIVE, KernelKind.PINGPONG: Mainloop.PINGPONG}
ROLES = (WarpRole("producer", 4, registers=PRODUCER_REGISTERS),
         WarpRole("consumer", 4, groups=CONSUMERS, registers=CONSUMER_REGISTERS))
WHY_KIND = {
    KernelKind.COOPERATIVE: ("a producer warpgroup fills the ring by TMA; two consumer "
                             "warpgroups share each {rows}-row tile, {half} rows each; "
                             "persistent CTAs"),
    KernelKind.PINGPONG: ("schedule pingpong: a producer warpgroup fills the ring by TMA; two "
                          "consumer warpgroups take alternate {rows}-row tiles, one's epilogue "
                          "overlapping the other's mainloop"),
}
WHY_MMA = ("wgmma m64nNk16 from shared-memory descriptors (128-byte swizzle, the TMA box's), "
           "one group in flight while the next is issued")
WHY_MMA_FP8 = ("wgmma m64nNk32 on 8-bit operands (e4m3, e5m2), both K-major from shared-memory "
               "descriptors (128-byte swizzle, the TMA box's: 128 elements per row), one group "
               "in flight while the next is issued; FP8 runs at twice the 16-bit rate")
WHY_TMA = ("the copy engine: one thread issues each k tile's box, the full mbarrier counts its "
           "bytes; the consumers free the slot through the empty one")
WHY_MULTICAST = ("the copy engine, shared by the cluster's two CTAs: each loads half of the tile's "
                 "{half} and multicasts it to both; a CTA's full mbarrier counts the whole "
                 "stage, and a slot is refilled once the consumers of both CTAs released it")
WHY_CLUSTER = {
    (2, 1): ("two CTAs on vertically adjacent tiles (the same tile columns) share B: each loads "
             "its own A and half of B, multicast to both, halving B's L2 reads"),
    (1, 2): ("two CTAs on horizontally adjacent tiles (the same tile rows) share A: each loads "
             "its own B and half of A, multicast to both, halving A's L2 reads"),
    (1, 1): "one CTA per cluster (the line's own choice): every CTA loads its own A and B",
}
WHY_SPLIT_STORE = ("split-K: each unit's f32 partial sums leave as pairs into the workspace; "
                   "<kernel>_splitk adds the parts in order, runs the epilogue and stores the "
                   "output")
WHY_VECTORS = ("each consumer thread loads its elements of the tile's slice at the tile's start "
               "and holds them through the mainloop, then writes them to its consumer's buffer "
               "before the epilogue, which reads them there: no read waits on global memory "
               "(a batched bias read from global memory ran 0.59x torch.bmm where the bare "
               "product ran 0.93x, bench/RESULTS.md)")
WHY_VECTORS_OFF = {
    "split": "read from global memory by <kernel>_splitk, which runs the epilogue",
    "stream": "read from global memory: under stream-K a tile's epilogue follows its last part",
    "budget": "read from global memory: their buffers do not fit beside the ring and staging",
    "pairs": "read from global memory: the output leaves as pairs from registers",
}
WHY_STAGED = ("each consumer writes its rows into a swizzled staging buffer of its own and one "
              "thread stores 64x64 boxes with cp.async.bulk.tensor; they drain during the next "
              "tile's mainloop")
WHY_STAGED_BYTES = ("each consumer writes its rows, scaled and saturated in registers, as byte pairs "
                    "into a swizzled staging buffer of its own (64x128 boxes of the 8-bit "
                    "output: 128-byte rows) and one thread stores the boxes with "
                    "cp.async.bulk.tensor; they drain during the next tile's mainloop (pair "
                    "stores from registers wrote a quarter of each 32-byte sector: 1.39x the "
                    "bare kernel's time, bench/RESULTS.md)")
WHY_STAGED_BOX = ("each consumer writes its rows into swizzled staging buffers of its own and one "
                  "thread stores each 64x64 box with cp.async.bulk.tensor as soon as it is "
                  "written")
WHY_PART_BOX = ("; the last box of each 64 rows holds {cols} columns, copied out by the "
                "consumer's threads in 16-byte chunks, since the copy engine's 64-column box "
                "would write past the tile")
# the epilogue tile's staging boxes per consumer, where the whole tile's do not fit; one where
# two do not either (256x160 on a ring of 4)
STAGES_D = (2, 1)
WHY_WHOLE_TILE = ("the staging holds the consumer's whole tile: every box is written, then all "
                  "are stored")
WHY_EPILOGUE_TILE = ("the consumer's whole tile does not fit beside the ring: its staging "
                     "holds {boxes} 64x64 box{es}, and the epilogue runs box by box, each "
                     "stored as soon as it is written, into the buffer the copy engine has read "
                     "the box before it out of (the seed's EpilogueTile and StagesD)")
WHY_STAGED_BOXES = ("the copy engine loads {param}'s 64x64 boxes into the epilogue tile's "
                    "buffers, where the epilogue reads each and writes the output's box over "
                    "it: the first {boxes} during the tile's mainloop, each later one once "
                    "the output's box before it has left its buffer{rest}")


def candidate(draft: ScheduleDraft, kind: KernelKind) -> Placing:
    refusal = refuse(draft, kind)
    if refusal is not None:
        reason, site = refusal
        return Candidate(kind, False, reason, site)
    g = draft.plans(MAINLOOP[kind])[0]
    rings = 2 * g.stages + (2 if kind is KernelKind.PINGPONG else 0)
    staging = WHY_SPLIT_STORE if draft.split_k > 1 else staging_refusal(g)
    wanted = vector_requests(g, kind) if not (draft.split_k > 1 or draft.stream_k) else ()
    # the whole tile's staging, then the epilogue tile's where it holds fewer boxes (each with
    # the staged vectors, then without), then pairs from registers
    stagings = [0] + [d for d in STAGES_D if staging_boxes(g, kind) > d and not byte_staging(g)]
    tries = [(0, StorePath.PAIRS, staging, (), 0)] if staging else [
        (staging_bytes(g, kind, d), StorePath.TMA,
         WHY_STAGED_BOX if d else WHY_STAGED_BYTES if byte_staging(g) else WHY_STAGED, v, d)
        for d in stagings for v in (wanted, ())] + [
        (0, StorePath.PAIRS, "the output staging does not fit beside the ring", (), 0)]
    tries = list(dict.fromkeys(tries))  # without vectors to stage, the second is the first
    staged = staged_input(g)[0] is not None
    for nbytes, store, why_store, vectors, stages_d in tries:
        # a staged input's load completes on one mbarrier per consumer (the epilogue tile's: per
        # buffer of each consumer)
        barriers = rings + (CONSUMERS * (stages_d or 1) if staged and store is StorePath.TMA
                            else 0)
        storage = yield place([g], persistent=True, ring_barriers=barriers,
                              staging=(nbytes, STAGE_ALIGN) if nbytes else (0, 0),
                              vectors=vectors + scale_requests(g))
        if storage.total_bytes <= storage.limit_bytes:
            break
    else:
        return Candidate(kind, False, common.over_budget(storage), Site("budget"), gemms=(g,),
                         storage=storage)
    offsets = {b.name: b.offset for b in storage.buffers}
    for op in (g.a, g.b):
        if offsets[op.smem.name] % STAGE_ALIGN:
            return Candidate(kind, False, f"{op.smem.name} must start on a 1024-byte boundary "
                             "(the 128-byte swizzle's)", Site("tile", 0))
    why_vectors = WHY_VECTORS if vectors else ""
    if not vectors and epilogue_vectors(g):
        why_vectors = WHY_VECTORS_OFF["split" if draft.split_k > 1 else
                                      "stream" if draft.stream_k else
                                      "budget" if store is StorePath.TMA else "pairs"]
    if store is StorePath.TMA and part_box(g):
        why_store += WHY_PART_BOX.format(cols=part_box(g))
    schedule = build(draft, kind, g, store, why_store,
                     tuple(param for param, *_ in epilogue_vectors(g)) if vectors else (),
                     why_vectors, stages_d)
    return Candidate(kind, True, "", None, schedule, (g,), storage)


def epilogue_vectors(g: GemmPlan) -> tuple[tuple[str, Axis, DType], ...]:
    """(param, axis, element type) of each vector the epilogue reads, once; a vector read
    along both axes is left in global memory."""
    loads = [n.kind for n in g.epilogue.nodes if isinstance(n.kind, VectorLoad)]
    axes: dict[str, set] = {}
    for v in loads:
        axes.setdefault(v.param, set()).add(v.axis)
    return tuple(dict.fromkeys((v.param, v.axis, v.dtype) for v in loads
                               if len(axes[v.param]) == 1))


def consumer_rows(tile_m: int, kind: KernelKind) -> int:
    """The rows of a tile one consumer multiplies: ping-pong, the whole tile's; cooperative, its
    half."""
    return tile_m if kind is KernelKind.PINGPONG else tile_m // CONSUMERS


def vector_extent(axis: Axis, kind: KernelKind, tile: tuple[int, int, int]) -> int:
    """The elements of a staged vector one consumer holds per tile: the tile's columns, or the
    consumer's rows."""
    return tile[1] if axis is Axis.COL else consumer_rows(tile[0], kind)


def vector_requests(g: GemmPlan, kind: KernelKind) -> tuple:
    """The storage requests of the staged vectors: a buffer per vector, a slice per consumer."""
    return tuple(
        (staged_vector_buffer(g.name, param),
         CONSUMERS * vector_extent(axis, kind, g.tile) * dtype.nbytes, dtype,
         f"{param}[{axis.value}] staged for the epilogue: the tile's slice per consumer "
         "warpgroup")
        for param, axis, dtype in epilogue_vectors(g))


def refuse(draft: ScheduleDraft, kind: KernelKind) -> tuple[str, Site | None] | None:
    """Why `kind` cannot run the draft's gemm, and where that points (None: it can)."""
    tgt = draft.target
    if not (tgt.has(Instruction.WGMMA) and tgt.tma):
        return "needs target sm_90a (wgmma, TMA)", None
    if len(draft.gemms) != 1:
        return "the warp-specialized kernel runs one gemm; chains have their own schedules", None
    if draft.declared_storage:
        return ("a storage or phases declaration gives lifetimes for one tile, not a loop of "
                "them", None)
    if not draft.allow_persistent:
        return "the caller asked for one CTA per tile", None
    if draft.stream_k and kind is KernelKind.PINGPONG:
        return ("split stream runs on the cooperative schedule (both consumers on each part "
                "of a tile's k tiles)", Site("split", 0))
    if draft.stream_k and draft.cluster != (1, 1):
        return (f"split stream runs without a cluster (cluster {draft.cluster[0]}x"
                f"{draft.cluster[1]} walks whole tiles)", Site("split", 0))
    if draft.split_k > 1 and kind is KernelKind.PINGPONG:
        return (f"split {draft.split_k} runs on the cooperative schedule (both consumers on "
                "each part of a tile's k tiles)", Site("split", 0))
    g = draft.gemms[0].plan
    if g.chain is not None or g.a is None:
        return "its A is not a tensor parameter", None
    if g.a.dtype.fp8 and g.b.dtype.fp8:  # e4m3 or e5m2, mixed too: wgmma's k32 FP8 family
        if not (g.a.k_major and g.b.k_major):
            return ("wgmma reads 8-bit operands K-major only (A row-major, B column-major)",
                    Site("gemm", 0))
    elif g.a.dtype is not g.b.dtype or g.a.dtype.nbytes != 2:
        return "wgmma here takes f16 or bf16 A and B of one type, or two FP8", Site("gemm", 0)
    width = g.a.dtype.nbytes
    if g.tile[2] * width != 128:
        return (f"128-byte k tiles (tile K {128 // width} for {8 * width}-bit operands), not "
                f"{g.tile[2]}", Site("tile", 0))
    if kind is KernelKind.PINGPONG and g.tile[0] not in PINGPONG_TILE_M:
        return (f"a 64- or 128-row tile (a ping-pong consumer's one or two m64 halves), not "
                f"{g.tile[0]}", Site("tile", 0))
    if kind is KernelKind.COOPERATIVE and g.tile[0] not in COOPERATIVE_TILE_M:
        return (f"a 128- or 256-row tile (two consumer warpgroups of one or two m64 halves; "
                f"64-row tiles run with `schedule pingpong`), not {g.tile[0]}", Site("tile", 0))
    if g.warps[0] * g.warps[1] != CONSUMERS * 4 and tuple(g.warps) != CONSUMER_WARPS[kind]:
        own = ("" if kind is KernelKind.COOPERATIVE else
               "; 4x1 names one consumer's, each on a tile of its own")
        return (f"8 math warps (two consumer warpgroups{own}), not {g.warps[0]}x{g.warps[1]}",
                Site("warps", 0))
    widest = widest_n(g.tile[0], kind)
    if g.tile[1] % 8 or not 8 <= g.tile[1] <= widest:
        return (f"tile N a multiple of 8 up to {widest}, not {g.tile[1]}"
                + (" (a consumer of 128 rows holds 128 x N accumulators)"
                   if consumer_rows(g.tile[0], kind) == 128 else ""), Site("tile", 0))
    if not g.b.k_major and g.tile[1] % MN_BOX:
        return (f"{g.b.param} is MN-major (row-major): its k tile arrives as boxes of {MN_BOX} "
                f"columns (128 bytes, the swizzle's width), so tile N must be a multiple of "
                f"{MN_BOX}, not {g.tile[1]}", Site("tile", 0))
    shared = {"A": (g.a, draft.cluster[1]), "B": (g.b, draft.cluster[0])}
    for which, (op, ctas) in shared.items():
        extent = g.tile[0] if which == "A" else g.tile[1]
        if ctas > 1 and op.k_major and extent % (ctas * 8):
            return (f"cluster {draft.cluster[0]}x{draft.cluster[1]} shares {which}: each CTA "
                    f"loads half of its {extent} rows, which must be whole 8-row groups of the "
                    f"128-byte swizzle (tile {'M' if which == 'A' else 'N'} a multiple of "
                    f"{ctas * 8}, not {extent})", Site("cluster", 0))
        if ctas > 1 and not op.k_major and extent % (ctas * MN_BOX):
            return (f"cluster {draft.cluster[0]}x{draft.cluster[1]} shares {which}, which is "
                    f"MN-major ({op.param} is {'column' if which == 'A' else 'row'}-major): each "
                    f"CTA loads half of its {MN_BOX}-column boxes, so tile "
                    f"{'M' if which == 'A' else 'N'} must be a multiple of {ctas * MN_BOX}, not "
                    f"{extent}", Site("cluster", 0))
    refusal = scale_refusal(draft, g, consumer_rows(g.tile[0], kind))
    if refusal is not None:
        return refusal
    if draft.stream_k and g.epilogue.reductions:
        return ("split stream with epilogue reductions is not built; 'split S' runs them on "
                "the tiled kernel", Site("split", 0))
    if draft.split_k > 1 and g.epilogue.reductions:
        return (f"split {draft.split_k} with epilogue reductions runs on the tiled kernel (its "
                "<kernel>_splitk reduces each output tile in one block)", Site("split", 0))
    if kind is KernelKind.PINGPONG and g.epilogue.reductions:
        return ("reductions run on the cooperative schedule (a tile's rows shared by both "
                "consumers' warps)", Site("schedule"))
    if g.stages < 2:
        return "a ring of at least 2 stages", Site("stages", 0)
    return None


def widest_n(tile_m: int, kind: KernelKind) -> int:
    """The widest tile a consumer's accumulators hold: 256 columns of one m64 half; of two (128
    x N accumulators), 128 with ping-pong (its setmaxnreg budget also holds the other consumer's
    turn) and WIDEST_TWO_HALVES cooperative."""
    if consumer_rows(tile_m, kind) != 128:
        return 256
    return WIDEST_TWO_HALVES if kind is KernelKind.COOPERATIVE else 128


def consumer_grid(kind: KernelKind, tile: tuple[int, int, int]) -> WarpGrid:
    """The gemm as the consumers run it: cooperative, 8 warps along M of 16 rows each (two
    warpgroups); ping-pong, 4 warps of 16 rows in each of the tile's m64 halves. Each warp
    holds whole rows of the tile, so the column and tile reductions meet in scratch from 8 warps
    and the row ones need none."""
    n = tile[1]
    return WarpGrid(warps=CONSUMER_WARPS[kind], warp_tile=(16, n),
                    frags=(consumer_rows(tile[0], kind) // 64, n // 8), whole_rows=True)


def staging_refusal(g: GemmPlan) -> str | None:
    """Why the output cannot leave through the copy engine (None: it can): one 16-bit output
    (row- or column-major) and nothing else, a row-major one's tile N need not be a multiple of
    64 (part_box); or one row-major 8-bit output beside reductions of the whole output (FP8
    out with its amax), tile N a multiple of its 128-column box, the consumer's whole tile
    staged."""
    out = g.epilogue.staged_store
    if out is None:
        return "TMA stores need an epilogue that only stores one 16-bit tensor"
    if byte_staging(g) and g.tile[1] % BYTE_BOX:
        return (f"tile N {g.tile[1]} is not a multiple of the 8-bit output's {BYTE_BOX}-column "
                "box (its part box is not built)")
    if part_box(g) and out.layout is Layout.COL:
        return (f"tile N {g.tile[1]} is not a multiple of the {STAGING_BOX}-column box (a "
                "column-major output's part box is not built)")
    return None


def odd_n8(g: GemmPlan) -> bool:
    """The tile has an odd number of n8 column groups (tile N an odd multiple of 8, 256x152):
    the staging takes the last by stmatrix.x2, and the narrow producer copies B's last 8 rows
    in a half pass."""
    return g.tile[1] % 16 == 8


def part_box(g: GemmPlan) -> int:
    """The columns of the last staging box where tile N is not a multiple of 64 (its consumers
    copy it out of the staging in 16-byte chunks, since the copy engine's 64-column box would
    write past the tile), else 0."""
    return g.tile[1] % box_columns(g)


# An 8-bit output's staging box: 64 rows of 128 bytes (128 columns), the 128-byte swizzle's row
# as the 16-bit box's, and as many bytes (8 KiB)
BYTE_BOX = 128


def byte_staging(g: GemmPlan) -> bool:
    """The staged output is 8-bit (FP8): its boxes are 64x128, written as byte pairs."""
    out = g.epilogue.staged_store
    return out is not None and out.dtype.nbytes == 1


def box_columns(g: GemmPlan) -> int:
    """The columns of one staging box: 128 bytes of the output's elements."""
    return BYTE_BOX if byte_staging(g) else STAGING_BOX


def staging_map(param: str, dtype, layout: Layout, g: GemmPlan, *, store: bool,
                why: str) -> TensorMap:
    """The map of a tensor shaped like the output that moves through the staging in 64x64
    boxes: rows along M (row-major), or along N with M contiguous (column-major: the staging
    holds the tile transposed)."""
    if layout is Layout.COL:
        return TensorMap(param, dtype, g.n_dim, g.m_dim, (STAGING_BOX, STAGING_BOX), store=store,
                         why=why + ", transposed (column-major: M contiguous)")
    return TensorMap(param, dtype, g.m_dim, g.n_dim, (128 // dtype.nbytes, STAGING_BOX),
                     store=store, why=why)


def staged_input(g: GemmPlan) -> tuple[str | None, str]:
    """The epilogue input shaped like the output that the copy engine loads into the output's
    staging (the seed's ReuseSmemC) with a TMA store, and why; (None, why not) when the
    epilogue reads its inputs from global memory; (None, "") when it reads none."""
    loads = list(dict.fromkeys(n.kind.param for n in g.epilogue.nodes
                               if isinstance(n.kind, TensorLoad)))
    if not loads:
        return None, ""
    kinds = {n.kind.param: n.kind for n in g.epilogue.nodes if isinstance(n.kind, TensorLoad)}
    out = g.epilogue.staged_store
    layout = out.layout if out else Layout.ROW
    fits = [p for p in loads if kinds[p].layout is layout and kinds[p].dtype.nbytes == 2
            and (out is None or out.dtype.nbytes == 2)]
    if not fits:
        return None, (f"read from global memory: the output's staging takes a {layout.value}-major "
                      f"16-bit input (the output's layout), and {', '.join(loads)} is not")
    param = fits[0]
    why = (f"the copy engine loads the tile of {param} into the output's staging (64x64 boxes, "
           "128-byte swizzle) as the tile's mainloop starts; the epilogue reads it there and "
           "writes the output over it")
    rest = [p for p in loads if p != param]
    if rest:
        why += f"; {', '.join(rest)} from global memory (the staging holds one input)"
    return param, why


def staging_boxes(g: GemmPlan, kind: KernelKind) -> int:
    """The 64x64 boxes of one consumer's rows of the tile (the last of a row part full where
    tile N is not a multiple of 64)."""
    return consumer_rows(g.tile[0], kind) // STAGING_BOX * -(-g.tile[1] // box_columns(g))


def staging_bytes(g: GemmPlan, kind: KernelKind, stages_d: int = 0) -> int:
    """A staging buffer per consumer of 16-bit 64x64 boxes: its rows of the tile (stages_d 0),
    or `stages_d` boxes (Staging)."""
    return CONSUMERS * (stages_d or staging_boxes(g, kind)) * STAGING_BOX * STAGING_BOX * 2


# The operands' L2 promotion. Where A's and B's rows are 16-byte but not 32-byte multiples
# (K = 1000 in f16), 128-byte promotion ran the bare GEMM 1.13-1.21x as fast as 256-byte on
# 128x256, 1.09-1.14x on a cluster 2x1 (H100: 5000x3000x1000, 2000x7000x3000, 4096x4096x4104,
# 3072x6144x1800, 8000x2000x2504); over the bare sweep and five shapes more (all but one with
# 128-byte aligned rows) the geometric means were 0.976x torch.matmul on 256-byte lines and
# 0.979x on 128-byte ones (bench/logs/misaligned/)
OPERAND_PROMOTION = "L2_128B"
WHY_PROMOTION = "; L2 misses pull 128-byte lines"


def operand_map(op: OperandPlan, which: str, extent: int, mn_dim, k_dim, k: int,
                shared_by: int = 1) -> TensorMap:
    """The producer's map of one operand's k tiles (`extent` rows or columns of M or N). K-major:
    rows along M (or N), K contiguous, one box of extent x k, or of extent / 2 rows when the two
    CTAs of a cluster share the operand (`shared_by` 2: each loads one half and multicasts it).
    MN-major: rows along K, M (or N) contiguous, boxes of 64 x k: a 128-byte row is the widest
    the 128-byte swizzle takes, so a k tile arrives as extent / 64 boxes (shared: each CTA of
    the cluster loads half of them)."""
    if op.k_major:
        rows = extent // shared_by
        return TensorMap(op.param, op.dtype, mn_dim, k_dim, (k, rows),
                         why=f"{which} tiles of {extent}x{k} (K-major), loaded by the producer"
                         + (f" in two boxes of {rows} rows, one per CTA of the cluster, multicast"
                            if shared_by > 1 else "") + WHY_PROMOTION,
                         load_promotion=OPERAND_PROMOTION)
    axis = "M" if which == "A" else "N"
    return TensorMap(op.param, op.dtype, k_dim, mn_dim, (MN_BOX, k),
                     why=f"{which} tiles of {extent}x{k} (MN-major), loaded by the producer as "
                     f"{extent // MN_BOX} boxes of {MN_BOX} {axis} x {k} k"
                     + (", half of them by each CTA of the cluster, multicast" if shared_by > 1
                        else "") + WHY_PROMOTION,
                     load_promotion=OPERAND_PROMOTION)


def operand_schedule(op: OperandPlan, which: str, extent: int,
                     shared_by: int = 1) -> OperandSchedule:
    """The TMA ring's load of one operand, K-major or MN-major (as the parameter is stored),
    multicast when the CTAs of a cluster share it."""
    if op.k_major:
        storage = "row-major" if which == "A" else "column-major"
        why = (f"K-major ({op.param} is {storage}): 128-byte rows along K, one "
               f"{extent}x{128 // op.dtype.nbytes} box "
               "per k tile, wgmma reads it as is; ")
        if shared_by > 1:
            return OperandSchedule(LoadPath.TMA_MULTICAST,
                                   why=why + WHY_MULTICAST.format(half="rows"))
        return OperandSchedule(LoadPath.TMA, why=why + WHY_TMA)
    storage, axis = ("column-major", "M") if which == "A" else ("row-major", "N")
    why = (f"MN-major ({op.param} is {storage}): 128-byte rows along {axis}, {extent // MN_BOX} "
           f"boxes of {MN_BOX} {axis} x 64 k per k tile, wgmma reads it transposed "
           f"(imm-trans-{which.lower()}); ")
    if shared_by > 1:
        return OperandSchedule(LoadPath.TMA_MULTICAST, mn_major=True,
                               why=why + WHY_MULTICAST.format(half=f"{MN_BOX}-column boxes"))
    return OperandSchedule(LoadPath.TMA, why=why + WHY_TMA, mn_major=True)


def build(draft: ScheduleDraft, kind: KernelKind, g: GemmPlan, store: StorePath,
          why_store: str, vectors: tuple[str, ...] = (), why_vectors: str = "",
          stages_d: int = 0) -> Schedule:
    k = g.tile[2]
    cluster = draft.cluster
    # the shared operand's box is half its tile's rows: each CTA of the cluster loads one half
    maps = [operand_map(g.a, "A", g.tile[0], g.m_dim, g.k_dim, k, shared_by=cluster[1]),
            operand_map(g.b, "B", g.tile[1], g.n_dim, g.k_dim, k, shared_by=cluster[0])]
    staged, why_staged = staged_input(g) if store is StorePath.TMA else (None, "")
    if stages_d and staged is not None:
        rest = why_staged.partition(";")
        why_staged = WHY_STAGED_BOXES.format(param=staged, rest=rest[1] + rest[2],
                                             boxes=stages_d)
    if store is StorePath.TMA:
        out = g.epilogue.staged_store
        maps.append(staging_map(out.param, out.dtype, out.layout, g, store=True,
                                why="the consumers' staging, stored as 64x64 boxes"
                                if out.dtype.nbytes == 2 else
                                "the consumers' staging, stored as 64x128 boxes (128-byte rows)"))
        if staged is not None:
            maps.append(staging_map(staged, draft.dtypes[staged], out.layout, g, store=False,
                                    why="loaded into the consumers' staging as 64x64 boxes"))
    math = epilogue_math(g)
    groups, why_groups = epilogue_groups(g, draft.split_k, store, math)
    gemm = GemmSchedule(
        name=g.name, atom=MmaAtom(Mma.WGMMA_SS, WHY_MMA_FP8 if g.a.dtype.fp8 else WHY_MMA),
        pipeline=Pipeline(a=operand_schedule(g.a, "A", g.tile[0], shared_by=cluster[1]),
                          b=operand_schedule(g.b, "B", g.tile[1], shared_by=cluster[0]),
                          stages=g.stages),
        output=Output(store, why_store),
        # halfway through the mainloop, the previous tile's output has left the staging: the
        # load's wait for that no longer holds the consumers at the tile's start (1.085x to
        # 1.069x the bare matmul's time at 8192^3, bench/RESULTS.md)
        staged=StagedInput(staged, late=staged is not None, why=why_staged),
        staging=Staging(stages_d, why=(
            "" if store is not StorePath.TMA else
            WHY_EPILOGUE_TILE.format(boxes=stages_d, es="es" * (stages_d > 1))
            if stages_d else WHY_WHOLE_TILE)),
        groups=EpilogueGroups(groups, why_groups),
        math=math,
        vectors=EpilogueVectors(VectorHome.STAGED if vectors else VectorHome.GLOBAL, vectors,
                                why_vectors),
        promotion=acc_promotion(g, kind, consumer_rows(g.tile[0], kind)))
    scheduler = TileScheduler(
        kind, Raster(draft.group_m), min_blocks_per_sm=1,
        split_k=draft.split_k, stream_k=draft.stream_k,
        cluster=Cluster(cluster, WHY_CLUSTER[cluster] if draft.cluster_written else ""),
        why=WHY_KIND[kind].format(rows=g.tile[0], half=g.tile[0] // CONSUMERS))
    return Schedule(scheduler=scheduler, warps=WarpRoles(ROLES), gemms=(gemm,),
                    entry=common.entry_points((g,)), tensor_maps=tuple(maps))
