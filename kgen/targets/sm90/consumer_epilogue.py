"""sm_90a's one-gemm kernel: what its consumers do around the mainloop. The staged vectors'
loads (at a tile's start) and writes (before the epilogue), the staged input's load, stream-K's
fix-up, and the epilogue: pair stores with their reductions, or in the fast entry point the
staging the copy engine stores. The C++ is templates/sm90/consumer_epilogue.inc.j2 (and
templates/common/epilogue_loop.inc.j2, shared with sm_80); this module hands it values."""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Axis, Layout
from ...plan import (GemmPlan, KernelPlan, StagingMode, StorePath, TensorLoad, VectorHome,
                     VectorLoad, staged_vector_buffer)
from ..common import batch
from ..common.epilogue_loop import partial_lines, reductions
from ..common.operands import dim_expr
from ..common.render import macro_lines, render_lines
from .warp_specialized import WARPGROUP, box_columns, byte_staging, odd_n8, part_box, vector_extent

TEMPLATE = "sm90/consumer_epilogue.inc.j2"


@dataclass(frozen=True, slots=True)
class ConsumerEpilogue:
    """What the epilogue macro prints around the pair stores."""

    name: str  # the kernel's
    gemm: str
    params: str  # the arguments the epilogue reads: `pb`, the tile's batch of them, or `p`
    groups: int  # EpilogueGroups
    batched: bool
    stream_k: bool
    split_k: bool
    tma_store: bool
    deterministic: bool


@dataclass(frozen=True, slots=True)
class StagedVector:
    """A staged epilogue vector (EpilogueVectors, STAGED): its slice of `extent` elements per
    consumer, `count` of them per thread (`partial`: the last round leaves threads out)."""

    param: str
    axis: str
    ctype: str
    extent: int
    count: int
    partial: bool
    batched: bool
    buffer: str


def epilogue_loop(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The consumers' epilogue: pair stores (and the reductions); with a TMA store, the
    staging in the fast entry point and pair stores in the narrow one."""
    gs = plan.schedule.gemm(g.name)
    groups = gs.groups.count
    if gs.staging.boxes and groups > 1 and groups != g.tile[1] // 64:
        raise ValueError(f"{g.name}: the epilogue tile's groups are its {g.tile[1] // 64} boxes, "
                         f"not {groups}")
    e = ConsumerEpilogue(name=plan.name, gemm=g.name,
                         params="pb" if batch.batched(plan) else "p", groups=groups,
                         batched=batch.batched(plan), stream_k=plan.schedule.scheduler.stream_k,
                         split_k=plan.schedule.scheduler.split_k > 1,
                         tma_store=gs.output.path is StorePath.TMA,
                         deterministic=plan.deterministic)
    lines = macro_lines(TEMPLATE, "epilogue", e=e, reds=reductions(g),
                        staged=vector_writes(plan, g) + staging_lines(plan, g) if e.tma_store
                        else [])
    if plan.schedule.scheduler.cluster.size > 1:
        return macro_lines(TEMPLATE, "in_range", lines=lines)
    return lines


def staging_reads_memory(plan: KernelPlan, g: GemmPlan) -> bool:
    """Whether the staging epilogue reads global memory at a pair's row or column: a vector
    or an input shaped like the output that is not staged in shared memory. Only then does it
    skip the pairs past M or N; otherwise it computes every pair, branch-free, and the copy
    engine's store leaves those out (the pairs' predicates and branches had kept the compiler
    from interleaving them: 6194 against 3216 cycles per tile for relu(alpha*acc + beta*C +
    bias[col]) on an H100, bench/RESULTS.md)."""
    gs = plan.schedule.gemm(g.name)
    staged = gs.vectors.held(VectorHome.STAGED)
    for n in g.epilogue.nodes:
        if isinstance(n.kind, VectorLoad) and n.kind.param not in staged:
            return True
        if isinstance(n.kind, TensorLoad) and n.kind.param != gs.staged.param:
            return True
    return False


def staged_vectors(plan: KernelPlan, g: GemmPlan) -> list[StagedVector]:
    """Each staged epilogue vector (Schedule: EpilogueVectors, STAGED), in the schedule's
    order."""
    staged = plan.schedule.gemm(g.name).vectors.held(VectorHome.STAGED)
    kinds = {n.kind.param: n.kind for n in g.epilogue.nodes if isinstance(n.kind, VectorLoad)}
    out = []
    for v in staged:
        extent = vector_extent(kinds[v].axis, plan.schedule.scheduler.kind, g.tile)
        out.append(StagedVector(param=v, axis=kinds[v].axis.value, ctype=kinds[v].dtype.cpp,
                                extent=extent, count=-(-extent // WARPGROUP),
                                partial=extent % WARPGROUP != 0,
                                batched=plan.param(v).batch is not None,
                                buffer=staged_vector_buffer(g.name, v)))
    return out


def vector_writes(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """Before the fast entry point's epilogue: the held elements to the consumer's buffers."""
    return macro_lines(TEMPLATE, "vector_writes", vectors=staged_vectors(plan, g))


def _vector_axes(plan: KernelPlan, g: GemmPlan) -> dict:
    vectors = staged_vectors(plan, g)
    axes = {v.axis for v in vectors}
    return dict(vectors=vectors, cols=Axis.COL.value in axes, rows=Axis.ROW.value in axes)


def packed_vector_params(plan: KernelPlan, g: GemmPlan) -> str:
    """The packed epilogue function's parameters for the staged vectors: each one's slice and
    the origins it is indexed from."""
    return "".join(macro_lines(TEMPLATE, "vector_params", **_vector_axes(plan, g)))


def vector_args(plan: KernelPlan, g: GemmPlan) -> str:
    """The arguments to packed_vector_params at the call sites: the buffers and the tile's first
    column, the consumer's first row."""
    return "".join(macro_lines(TEMPLATE, "vector_args", **_vector_axes(plan, g)))


def tile_start(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """At each tile's start, before the mainloop: the staged vectors' loads into registers
    (EpilogueVectors, STAGED), then the staged input's load (_staged_input_start)."""
    return (macro_lines(TEMPLATE, "vector_loads", vectors=staged_vectors(plan, g))
            + _staged_input_start(plan, g))


def _staged_input_start(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The staged input's load into the output's staging (Schedule: StagedInput),
    if any; under a cluster, only for a tile in range (a tile past M or N runs no epilogue, so
    nothing would wait for the load)."""
    gs = plan.schedule.gemm(g.name)
    c = gs.staged.param
    if c is None:
        return []
    batched = plan.param(c).batch is not None
    col = g.epilogue.staged_store.layout is Layout.COL
    values = dict(param=c, staging=f"{g.name}_d_staging", batched=batched,
                  prefetch_when=_prefetch_when(plan, c),
                  cluster=plan.schedule.scheduler.cluster.size > 1, col=col,
                  stages_d=gs.staging.boxes)
    lines = render_lines("sm90/staged_input.inc.j2", **values)
    # the epilogue tile's loads of one box each, here and in the epilogue
    boxes = render_lines("sm90/staged_input_box.inc.j2", **values) if gs.staging.boxes else []
    return macro_lines(TEMPLATE, "staged_input_start", boxes=boxes, load=lines,
                       late=gs.staged.late, stream_k=plan.schedule.scheduler.stream_k)


# The epilogue tile's staged input: its boxes past the first kStagesD load during the epilogue,
# each waited on there. Where the input is larger than L2 they come from device memory; then
# they are prefetched into L2 when the first ones load, halfway through the mainloop. H100,
# relu(alpha*acc + beta*C + bias[col]) (bench/logs/issue15_h100/c_prefetch.log): 8192^3 (C 128
# MB) 1.634 -> 1.539 ms, 8192x8192x4096 0.788 -> 0.781; where C fits in L2 the prefetch cost
# 1.2-1.4% (4096^3, C 32 MB; 6144x5120x3072, 60 MB), so it runs from 64 MB of the input on
# (an H100 has 50 MB of L2, an H200 60 MB).
PREFETCH_BYTES = 64 << 20


def _prefetch_when(plan: KernelPlan, param: str) -> str:
    """The C++ condition, in the consumers, under which the staged input's later boxes are
    prefetched into L2: the whole input (every batch) at least PREFETCH_BYTES."""
    g = plan.gemms[0]
    batches = batch.batch_count(plan)
    size = (f"static_cast<long long>({dim_expr(g.m_dim)}) * {dim_expr(g.n_dim)}"
            + (f" * {batches}" if batches != "1" else "") + f" * sizeof(*p.{param})")
    return f"{size} >= ({PREFETCH_BYTES >> 20}ll << 20)"


def mainloop_staged(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """In the consumers' mainloop, after a k tile's wgmma group is issued: the staged input's
    load, halfway through (StagedInput.late), once the previous tile's output
    has had time to leave the staging."""
    gs = plan.schedule.gemm(g.name)
    if gs.staged.param is None or not gs.staged.late:
        return []
    return macro_lines(TEMPLATE, "mainloop_staged", stream_k=plan.schedule.scheduler.stream_k)


def whole_chunks(col: bool, chunk: int = 8) -> str:
    """When the copy engine may store a tile from the staging: it writes whole 16-byte chunks
    (`chunk` elements) of the contiguous dimension, so a tile whose last columns (rows,
    column-major) end inside one is copied out of the staging by the consumer's threads instead
    (copy_box_out)."""
    if col:
        return f"m0 + kTileM <= M || M % {chunk} == 0"
    return f"n0 + kTileN <= N || N % {chunk} == 0"


# The fast entry point's staging epilogue, per staging of the output (Staging.mode); both
# import the pieces they share from templates/sm90/gemm_tma_store.inc.j2
TMA_STORE_EPILOGUE = {
    StagingMode.WHOLE_TILE: "sm90/gemm_tma_store_tile.inc.j2",
    StagingMode.BOXES: "sm90/gemm_tma_store_boxes.inc.j2",
}


def staging_lines(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The fast entry point's staging epilogue (TMA_STORE_EPILOGUE)."""
    params = "pb" if batch.batched(plan) else "p"
    gs = plan.schedule.gemm(g.name)
    packed = g.epilogue.staged_store
    out, col = packed.param, packed.layout is Layout.COL
    batched_out = plan.param(out).batch is not None
    # an 8-bit output's whole-output reductions: folded into the walk's partials (walk_reductions)
    # or, where they are not, into the tile's, sent on at the tile's end
    reds = reductions(g)
    tile_reds = bool(reds) and not walk_reduced(plan, g)
    return render_lines(TMA_STORE_EPILOGUE[gs.staging.mode], out=out,
                        byte_out=byte_staging(g), box_cols=box_columns(g), reds=reds,
                        walk=walk_reduced(plan, g),
                        red_start=partial_lines(g) if tile_reds else [],
                        red_end=macro_lines(TEMPLATE, "reductions", reds=reds,
                                            deterministic=plan.deterministic, params=params)
                        if tile_reds else [],
                        staging=f"{g.name}_d_staging", name=g.name, params=params,
                        batched_out=batched_out,
                        staged=gs.staged.param or "", col=col,
                        whole_chunks=whole_chunks(col, 16 // packed.dtype.nbytes),
                        vector_args=vector_args(plan, g),
                        reads_memory=staging_reads_memory(plan, g),
                        groups=gs.groups.count,
                        part_box=bool(part_box(g)), odd_n8=odd_n8(g))


def walk_reduced(plan: KernelPlan, g: GemmPlan) -> bool:
    """An 8-bit staged output's whole-output reductions are folded into each consumer thread's
    partial over all the CTA's tiles and sent on once at the walk's end, each warp's by one
    atomic (no barrier, no scratch per tile): not in deterministic mode (a slot per tile), nor
    in a batched kernel (an output per batch)."""
    gs = plan.schedule.gemm(g.name)
    return (gs.output.path is StorePath.TMA and byte_staging(g) and bool(g.epilogue.reductions)
            and not plan.deterministic and not batch.batched(plan))


def walk_reductions(plan: KernelPlan, g: GemmPlan) -> dict[str, list[str]]:
    """The walk's partials of the reductions walk_reduced folds (before the walk), and their
    warps' atomics in the fast entry point (after it)."""
    if not walk_reduced(plan, g):
        return dict(walk_start=[], walk_end=[])
    return dict(walk_start=macro_lines(TEMPLATE, "walk_partials", reds=reductions(g)),
                walk_end=macro_lines(TEMPLATE, "walk_end", reds=reductions(g)))
