"""sm_90a emitter of one gemm on the warp-specialized schedules (COOPERATIVE, PINGPONG; see
kgen/targets/sm90/warp_specialized.py): a producer warpgroup fills the ring by TMA, two consumer
warpgroups run wgmma and the epilogue DAG in registers, the output leaving through the copy
engine or as pair stores. The values the templates print are prepared here from the plan (the
consumers' side around the mainloop in sm90/consumer_epilogue.py); the templates are
templates/sm90/gemm.cu.j2 and the macros of templates/sm90/walk.inc.j2."""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Layout
from ...plan import (AccPromotion, KernelPlan, KSplit, PeriodSets, ScaleLoads, StagingMode,
                     StorePath, VectorHome)
from ..common import arch_guard, batch, epilogue_cpp, epilogue_loop, helper_kernels, host_api
from ..common.operands import MMA_TYPE, dim_expr, header, host_checks, storage_asserts
from ..common.render import macro_lines, render
from . import epilogue_math, schedules, tensor_map
from .chain import wgmma_outs
from .consumer_epilogue import (epilogue_loop as consumer_epilogue, mainloop_staged,
                                packed_vector_params, tile_start, walk_reductions)
from .consumer_epilogue import staging_reads_memory  # noqa: F401  (tests read it from here)
from .promotion import scale_blocks_n, scale_buffer, scale_split_cases
from .warp_specialized import byte_staging, odd_n8, part_box

WALK = "sm90/walk.inc.j2"


@dataclass(frozen=True, slots=True)
class WalkValues:
    """What the walk's pieces print (templates/sm90/walk.inc.j2): its first unit, its end and
    step (per CTA, or per cluster), and the constants of split-K and stream-K."""

    first: str
    walk: str
    step: str
    split_k: int
    stream_flags: int


@dataclass(frozen=True, slots=True)
class KWalk:
    """The macros of templates/sm90/walk.inc.j2 that print one way of sharing a tile's k
    tiles: the constant it declares (None: none), the head of the producer's walk and of a
    consumer's, and a consumer's first ring position and step."""

    constant: str | None
    producer: str
    consumer: str
    start: str


K_SPLIT_WALK = {
    KSplit.WHOLE: KWalk(None, "producer_tiles", "consumer_tiles", "whole_start"),
    KSplit.SPLIT: KWalk("split_constant", "producer_tiles", "consumer_tiles", "split_start"),
    KSplit.STREAM: KWalk("stream_constant", "stream_steps", "stream_steps", "stream_start"),
}


def walk_lines(plan: KernelPlan, values: dict) -> dict:
    """The walk's pieces for the way the plan shares a tile's k tiles (K_SPLIT_WALK), from the
    walk's values in `values` (cluster_values, split_values)."""
    scheduler = plan.schedule.scheduler
    way = K_SPLIT_WALK[scheduler.k_split]
    w = WalkValues(first=values["walk_first"], walk=values["walk"], step=values["walk_step"],
                   split_k=scheduler.split_k, stream_flags=plan.STREAM_FLAGS)
    return dict(
        k_split_constants=macro_lines(WALK, way.constant, w=w) if way.constant else [],
        producer_walk=macro_lines(WALK, way.producer, w=w),
        consumer_walk=macro_lines(WALK, way.consumer, w=w),
        consumer_start=macro_lines(WALK, way.start, w=w))
# The output staging's pieces in the kernel (its constants, the staged input's barriers), per
# staging (Staging.mode); the epilogue's are consumer_epilogue.TMA_STORE_EPILOGUE's
STAGING = {
    StagingMode.WHOLE_TILE: "sm90/staging_tile.inc.j2",
    StagingMode.BOXES: "sm90/staging_boxes.inc.j2",
}


@dataclass(frozen=True, slots=True)
class TmaLoad:
    """The producer's copy-engine load of one operand's k tile (templates/sm90/walk.inc.j2,
    tma_load): one box K-major; MN-major, the boxes [first, last) of 64 M (or N) columns by
    the k tile's rows. `multicast`: the CTA mask the boxes are written to ("": this CTA's)."""

    operand: str
    ring: str  # the ring's address
    stage_bytes: str  # the constant that holds a stage's bytes
    row: str  # the tile's first row (column) of the operand
    k_tile: str
    mn_major: bool
    batched: bool  # rank 3: the map's third coordinate is the batch
    multicast: str = ""
    first: str = "0"
    last: str = ""


def _tma_load(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, row: str,
              mn_major: bool = False, extent: str = "", multicast: str = "",
              boxes: tuple[str, str] | None = None) -> TmaLoad:
    """`extent`: an MN-major operand's tile columns (extent / 64 boxes), or the range `boxes`
    of them."""
    first, last = boxes or ("0", f"{extent} / 64")
    return TmaLoad(operand=operand, ring=ring, stage_bytes=stage_bytes, row=row,
                   k_tile=k_tile(plan), mn_major=mn_major,
                   batched=plan.param(operand).batch is not None, multicast=multicast,
                   first=first, last=last)


def k_tile(plan: KernelPlan) -> str:
    """The producer's k tile at step kt of a tile's (split-K, stream-K: of its unit's part)."""
    scheduler = plan.schedule.scheduler
    return "(k_first + kt)" if scheduler.split_k > 1 or scheduler.stream_k else "kt"


def stream_values(plan: KernelPlan) -> dict:
    """What the template prints about stream-K (templates/sm90/stream_k.inc.j2): the CTA's
    share of the walk's steps and, per tile, the part of its k tiles the share holds."""
    if not plan.schedule.scheduler.stream_k:
        return dict(stream_k=False, stream_head=[])
    tiles = "walk" if batch.batched(plan) else "tiles"  # every batch's
    return dict(
        split_k=1, stream_k=True, stream_flags=plan.STREAM_FLAGS, k_tile=k_tile(plan),
        k_tiles_total="k_tiles_all",
        stream_head=macro_lines(WALK, "stream_head", tiles=tiles),
        unit_k=macro_lines(WALK, "stream_unit"))


def split_values(plan: KernelPlan) -> dict:
    """What the template prints about split-K: the walk over units (part u % kSplitK of tile
    u / kSplitK's k tiles), each unit's k tiles, and the name of the kernel's k tile count."""
    split = plan.schedule.scheduler.split_k
    if plan.schedule.scheduler.stream_k:
        return stream_values(plan)
    if split == 1:
        return dict(split_k=1, unit_k=[], k_tile="kt", k_tiles_total="k_tiles", stream_k=False,
                    stream_head=[])
    batched = batch.batched(plan)
    per_batch = "tiles_m * tiles_n * kSplitK"
    tile_batch = macro_lines(WALK, "batch_of", per_batch=f"({per_batch})") if batched else []
    in_batch = f"tile % ({per_batch}) / kSplitK" if batched else "tile / kSplitK"
    # the walk's units (each batch's): tiles x kSplitK, or on clusters each cluster tile's parts
    # (the cluster's CTAs take the same part of their own tiles, so the operand they share
    # covers the same k tiles); the narrow producer walks tiles without clusters (tile_batch)
    units = "cluster_units" if plan.schedule.scheduler.cluster.size > 1 else "units"
    walk_batch = macro_lines(WALK, "batch_of", per_batch=units) if batched else []
    walk_in_batch = f"tile % {units} / kSplitK" if batched else "tile / kSplitK"
    return dict(
        split_k=split, k_tile=k_tile(plan), k_tiles_total="k_tiles_all", stream_k=False,
        stream_head=[], walk_tiles=units, walk="walk" if batched else units,
        walk_batch=walk_batch, walk_in_batch=walk_in_batch, tile_batch=tile_batch,
        tile_in_batch=in_batch,
        unit_k=macro_lines(WALK, "split_unit"))


def host_tiles(plan: KernelPlan) -> str:
    """The launcher's count of the walk's units (the persistent grid takes at most this many
    CTAs): tiles, split-K parts, or stream-K steps (each tile's k tiles, at least one)."""
    schedule, ns = plan.schedule, f"{plan.name}_kgen"
    if schedule.scheduler.stream_k:
        return host_api.stream_units(plan)
    return batch.grid_count(plan, "tiles_m * tiles_n" + (
        f" * {ns}::kSplitK" if schedule.scheduler.split_k > 1 else ""))


def _descriptor(mn_major: bool, stage: str, rows: str = "") -> str:
    """The wgmma descriptor of k16 step kk of an operand's stage (`rows`: the offset of its m64
    half). K-major: 16 elements (32 bytes) along the 128-byte rows; MN-major: 16 rows of 128
    bytes (two 8-row swizzle atoms)."""
    if mn_major:
        return f"smem_descriptor_mn({stage}{rows} + 16 * 128 * kk)"
    return f"smem_descriptor({stage}{rows} + 32 * kk)"
def _whole(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, rows: str,
           first: str, shared: bool, mn_major: bool) -> list[TmaLoad]:
    """The loads of one operand's k tile by a CTA without a cluster (the narrow entry point's):
    its boxes; for a K-major operand a cluster shares (its box half the tile's rows), both
    halves."""
    if not shared or mn_major:  # an MN-major operand's boxes are 64 columns, shared or not
        return [_tma_load(plan, operand, ring, stage_bytes, first, mn_major, rows)]
    return [_tma_load(plan, operand, ring, stage_bytes, first),
            _tma_load(plan, operand, f"{ring} + {stage_bytes} / 2", stage_bytes,
                      f"{first} + {rows} / 2")]


def _whole_loads(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, rows: str,
                 first: str, shared: bool, mn_major: bool) -> list[str]:
    return macro_lines(WALK, "loads", whole=_whole(plan, operand, ring, stage_bytes, rows, first,
                                                   shared, mn_major), half=None)


def _loads(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, rows: str, first: str,
           shared: bool, mn_major: bool) -> list[str]:
    """The producer's loads of one operand's k tile: its boxes, or for the operand a cluster
    shares, this CTA's half multicast to every CTA: half the rows of a K-major tile, half the
    64-column boxes of an MN-major one (the narrow entry point, without a cluster, loads the
    whole tile itself)."""
    whole = _whole(plan, operand, ring, stage_bytes, rows, first, shared, mn_major)
    if not shared:
        return macro_lines(WALK, "loads", whole=whole, half=None)
    mask = f"0x{(1 << plan.schedule.scheduler.cluster.size) - 1:x}"
    if mn_major:
        half = f"{rows} / 128"  # boxes per CTA
        half_load = _tma_load(plan, operand, ring, stage_bytes, first, True, rows, multicast=mask,
                              boxes=(f"rank * ({half})", f"(rank + 1) * ({half})"))
    else:
        half_load = _tma_load(plan, operand, f"{ring} + rank * ({stage_bytes} / 2)", stage_bytes,
                              f"{first} + rank * ({rows} / 2)", multicast=mask)
    return macro_lines(WALK, "loads", whole=whole, half=half_load)


def cluster_values(plan: KernelPlan) -> dict:
    """What the template prints about clusters: the walk over cluster tiles (the plain walk
    over tiles without one) and the slots' release."""
    schedule = plan.schedule
    batched = batch.batched(plan)
    tile_batch = (macro_lines(WALK, "batch_of", per_batch="(tiles_m * tiles_n)") if batched
                  else [])
    tile_in_batch = "tile % (tiles_m * tiles_n)" if batched else "tile"
    if schedule.scheduler.cluster.size == 1:
        return dict(walk_tiles="tiles", walk="walk" if batched else "tiles",
                    walk_first="blockIdx.x", walk_step="gridDim.x", walk_batch=tile_batch,
                    walk_in_batch=tile_in_batch, walk_dims="tiles_m, tiles_n", cluster_tile=[],
                    release="mbarrier_arrive", releaser="tid % kWarpgroupThreads == 0",
                    tile_batch=tile_batch,
                    tile_in_batch=tile_in_batch)
    cm, cn = schedule.scheduler.cluster.shape
    along = "m" if cm > 1 else "n"
    shared = {"a": "A (the same tile rows)", "b": "B (the same tile columns)"}[schedule.multicast]
    return dict(
        cluster_m=cm, cluster_n=cn,
        cluster_note=f"they share {shared}, each CTA loading half of it for both",
        walk_tiles="cluster_tiles", walk="walk" if batched else "cluster_tiles",
        walk_first="cluster_id", walk_step="clusters",
        walk_batch=macro_lines(WALK, "batch_of", per_batch="cluster_tiles") if batched else [],
        walk_in_batch="tile % cluster_tiles" if batched else "tile",
        walk_dims="cluster_tiles_m, cluster_tiles_n",
        cluster_tile=macro_lines(WALK, "cluster_tile", along=along),
        release="release_slot<kNarrow>", releaser="releaser", tile_batch=tile_batch,
        tile_in_batch=tile_in_batch)


def _pitch(plan: KernelPlan, operand: str) -> str:
    """What copy_granule takes of an operand's rows besides its address: the leading dimension,
    and, batched, the batch stride too (every batch's rows as aligned as the first's)."""
    if plan.param(operand).batch is None:
        return f"p.ld_{operand}"
    return f"p.ld_{operand} | p.batch_{operand}"


# The narrow producer's K-major box loop (copy_box_granule): passes unrolled, each pass's copies
# with their own registers, so that more of them are in flight (each cp.async holds its
# registers until the load unit takes it). H100, bench/prototypes/narrow_unroll.py: 8 against 4
# ran gemm_b_row 4096x4096x4092 0.354 against 0.475 ms, gemm 0.571 against 0.611. Unrolled 16
# times the 40-register producer spills; a batched kernel's batch pointers spill at 8 (40 B in
# batched_gemm_bias), so it keeps 4; so does an FP8 kernel's (its 8-bit copies spilled 184 B at 8
# in gemm_fp8_rowwise, none at 4).
NARROW_UNROLL, NARROW_UNROLL_BATCHED = 8, 4


@dataclass(frozen=True, slots=True)
class ScaleRead:
    """A block scale the consumers read (templates/sm90/block_scales.inc.j2): its parameter,
    and whether it is column-major (element (r, kb) at kb * ld + r)."""

    param: str
    col: bool


@dataclass(frozen=True, slots=True)
class HalfWgmma:
    """The wgmma of half a tile's columns (PeriodSets.HALVES): its n, and the asm's
    accumulator operands and outputs."""

    n: int
    regs: str
    outs: str


def block_scale_values(g, promotion: AccPromotion) -> dict:
    """The block scales of A and of B as the template reads them (None: not scaled), the
    128-column blocks of B's scales a tile spans (1 or 2), where the period sums wait
    (PeriodSets' value) and the half-width wgmma of PeriodSets.HALVES."""
    reads = {s.operand: ScaleRead(s.param, s.layout is Layout.COL) for s in g.scales}
    half = g.tile[1] // 2
    return dict(block_scaled=bool(g.scales), scale_a=reads.get("A"), scale_b=reads.get("B"),
                b_blocks=scale_blocks_n(g) if g.scales else 1,
                split_cases=scale_split_cases(g) if g.scales else (),
                period_sets=promotion.sets.value, timing_bound=promotion.bound.name.lower(),
                scale_staged=promotion.scale_loads is ScaleLoads.PRODUCER,
                scale_smem=scale_buffer(g.name),
                half=HalfWgmma(half, ", ".join(f"%{i}" for i in range(half // 2)),
                               wgmma_outs(half, "period"))
                if promotion.sets is PeriodSets.HALVES else None)


def device_helpers(plan: KernelPlan) -> list[str]:
    """The fixed device helpers the kernel carries before its batch and cluster ones, in order:
    the ring's barriers and loads, the narrow entry point's copies and wgmma's, and of the
    others only those its schedule's components call for."""
    g = plan.gemms[0]
    gs = plan.schedule.gemm(g.name)
    helpers = ["sm90/mbarrier.inc.j2", "sm90/tma_load.inc.j2"]
    if gs.staged.param is not None and gs.staging.mode is StagingMode.BOXES:
        helpers.append("sm90/tma_prefetch.inc.j2")  # the staged input's later boxes, into L2
    helpers += ["common/cp_async.inc.j2", "common/narrow_access.inc.j2", "sm90/wgmma.inc.j2"]
    if gs.groups.count > 1:
        helpers.append("sm90/epilogue_groups.inc.j2")
    if epilogue_math.calls_gelu_phi(g, gs.math):
        helpers.append("sm90/epilogue_math.inc.j2")
    if gs.output.path is StorePath.TMA:
        helpers.append("sm90/tma_store.inc.j2")
    if g.epilogue.reductions:
        helpers.append("sm90/reduce.inc.j2")
    return helpers


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    g = plan.gemms[0]
    schedule = plan.schedule
    staged = schedule.gemm(g.name).output.path is StorePath.TMA
    assert schedule.entry.narrow, "a one-gemm kernel has a narrow entry point"
    ops = epilogue_math.ops(schedule.gemm(g.name).math)
    body = epilogue_cpp.function_body(
        epilogue_cpp.render(g.epilogue, narrow="kNarrow", ops=ops), False)
    c = schedule.gemm(g.name).staged.param
    packed = (epilogue_cpp.function_body(
        epilogue_cpp.render(g.epilogue, narrow="false", staged=c, ops=ops,
                            vectors=schedule.gemm(g.name).vectors.held(VectorHome.STAGED)), True)
              if staged else [])
    buffers = [dict(name=b.name, role=b.role, live=plan.storage.live_text(b), offset=b.offset,
                    bytes=b.bytes, ctype=b.dtype.cpp if b.dtype is not None else "unsigned char")
               for b in plan.storage.buffers]
    consumer, producer = schedule.warps.role("consumer"), schedule.warps.role("producer")
    batched = batch.batched(plan)
    maps = tensor_map.template_maps(schedule.tensor_maps, dim_expr, plan)
    n = g.tile[1]
    fp8 = g.a.dtype.fp8  # wgmma's k32 FP8 family (verify: both operands FP8, K-major)
    pipeline = schedule.gemm(g.name).pipeline
    a_mn, b_mn = pipeline.a.mn_major, pipeline.b.mn_major
    majors = {(False, False): "A and B K-major", (True, True): "A and B MN-major (transposed)",
              (True, False): "A MN-major (transposed), B K-major",
              (False, True): "A K-major, B MN-major (transposed)"}[(a_mn, b_mn)]
    clusters = cluster_values(plan) | split_values(plan)
    clusters |= walk_lines(plan, clusters)
    multicast = schedule.multicast
    host_cluster_tiles = batch.grid_count(
        plan, f"((tiles_m + {plan.name}_kgen::kClusterM - 1) / {plan.name}_kgen::kClusterM) * "
        f"((tiles_n + {plan.name}_kgen::kClusterN - 1) / {plan.name}_kgen::kClusterN)"
        + (f" * {plan.name}_kgen::kSplitK" if schedule.scheduler.split_k > 1 else ""))
    return render(
        "sm90/gemm.cu.j2",
        header=header(plan, source_name, source_hash, command),
        name=plan.name,
        ns=f"{plan.name}_kgen",
        kind_note=f"{schedule.scheduler.kind.value} ({schedule.scheduler.why})",
        tile_m=g.tile[0], tile_n=n, tile_k=g.tile[2],
        stages=g.stages,
        group_m=schedule.scheduler.raster.group_m,
        smem_bytes=plan.smem_bytes,
        threads=schedule.warps.threads,
        producer_registers=producer.registers,
        consumer_registers=consumer.registers,
        consumers=consumer.groups,  # the consumer barrier's warpgroups
        consumers_word=schedules.CONSUMER_WORDS[consumer.groups],
        pingpong=schedule.scheduler.pingpong,
        a_bytes=g.a.dtype.nbytes, b_bytes=g.b.dtype.nbytes,
        a_smem=g.a.smem.name, b_smem=g.b.smem.name, a_param=g.a.param, b_param=g.b.param,
        barriers=f"{g.name}_ring_barriers",
        maps=maps,
        map_steps=tensor_map.steps_lines(maps),
        map_names=tensor_map.names(schedule.tensor_maps),
        tma_store=staged,
        stages_d=schedule.gemm(g.name).staging.boxes,
        staging_pieces=STAGING[schedule.gemm(g.name).staging.mode],
        stmatrix=staged and not byte_staging(g),  # the staging written by stmatrix
        byte_out=staged and byte_staging(g),  # an 8-bit output's, by 2-byte stores
        copy_out=staged,  # a tile the copy engine cannot store, copied out of it (copy_box_out)
        part_box=bool(staged and part_box(g)),  # copied out by the threads
        odd_n8=odd_n8(g),
        stmatrix_trans=staged and g.epilogue.staged_store.layout is Layout.COL,  # transposed
        staged=c or "",
        packed_params=((f", unsigned staged_{c}" if c else "") + packed_vector_params(plan, g)
                       + (epilogue_loop.epilogue_params(g) if staged else "")),
        tile_start=tile_start(plan, g),
        mainloop_staged=mainloop_staged(plan, g),
        buffers=buffers,
        storage_asserts=storage_asserts(plan),
        mma_types=f"{g.a.dtype.dsl_name} x {g.b.dtype.dsl_name} -> f32",
        mma_ab=MMA_TYPE[g.a.dtype], mma_b=MMA_TYPE[g.b.dtype],
        wgmma_k=32 if fp8 else 16,  # k per wgmma: 32 bytes of the 128-byte rows either way
        promote=schedule.gemm(g.name).promotion.k_tiles,  # 0: wgmma accumulates the whole K
        turns=schedule.gemm(g.name).promotion.turns,  # the block-scaled consumers' turns
        early_release=schedule.gemm(g.name).promotion.early_release,
        **block_scale_values(g, schedule.gemm(g.name).promotion),
        # an FP8 output: narrow_access's byte pairs (its stores saturate: epilogue_cpp.PAIR)
        fp8_out=any(p.dtype.fp8 and p.is_output for p in plan.params),
        wgmma_n=n,
        wgmma_acc=f"float (&acc)[{n // 8}][4]",
        wgmma_regs=", ".join(f"%{i}" for i in range(n // 2)),
        wgmma_outs=wgmma_outs(n, "acc"),
        wgmma_rs=[],
        gemm_name=g.name,
        epilogue=body,
        packed_epilogue=packed,
        epilogue_params=epilogue_loop.epilogue_params(g),
        epilogue_loop=consumer_epilogue(plan, g),
        **walk_reductions(plan, g),
        **helper_kernels.template_values(plan, g),
        **host_api.template_values(plan),
        persistent=True,
        arch_guard=arch_guard.guard(plan),
        summary=(f"{g.name} = {g.a_name} @ {g.b_name}, CTA tile {g.tile[0]}x{n}x{g.tile[2]}, "
                 f"{schedule.scheduler.kind.value}"),
        min_blocks=schedule.scheduler.min_blocks_per_sm,
        m_expr=dim_expr(g.m_dim), n_expr=dim_expr(g.n_dim), k_expr=dim_expr(g.k_dim),
        host_m_expr=dim_expr(g.m_dim), host_n_expr=dim_expr(g.n_dim),
        host_checks=host_checks(plan),
        batched=batched,
        batches=batch.batch_count(plan),
        **clusters,
        device_helpers=device_helpers(plan),
        **epilogue_math.template_values(),
        tile_params="pb" if batched else "p",
        at_batch=batch.at_batch_lines(plan),
        a_pitch=_pitch(plan, g.a.param), b_pitch=_pitch(plan, g.b.param),
        narrow_unroll=NARROW_UNROLL_BATCHED if batched or fp8 else NARROW_UNROLL,
        **{f"{w}_load{suffix}": loads(plan, param, f"{w}_ring", f"k{W}StageBytes", f"kTile{mn}",
                                      f"tile_{mn.lower()} * kTile{mn}", multicast == w, major)
           for loads, suffix in ((_loads, ""), (_whole_loads, "_whole"))
           for w, W, mn, param, major in (("a", "A", "M", g.a.param, a_mn),
                                          ("b", "B", "N", g.b.param, b_mn))},
        a_mn=a_mn, b_mn=b_mn,
        mn_descriptor=a_mn or b_mn,
        wgmma_trans=f"{int(a_mn)}, {int(b_mn)}",
        wgmma_majors=majors,
        a_descriptor=_descriptor(a_mn, "a_stage", " + i * 64 * 128"),
        b_descriptor=_descriptor(b_mn, "b_stage"),
        k_step_note=(f"k{32 if fp8 else 16} step kk is 32 bytes along the 128-byte rows"
                     if not (a_mn or b_mn)
                     else "k16 step kk: " + "; ".join(
                         f"{w} {'2048 bytes on (16 rows)' if mn else '32 bytes on'}"
                         for w, mn in (("A", a_mn), ("B", b_mn)))),
        host_cluster_tiles=host_cluster_tiles,
        host_batches=batch.host_lines(plan),
        host_tiles=host_tiles(plan),
    )
