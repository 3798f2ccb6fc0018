"""sm_90a emitter of one gemm on the warp-specialized schedules (COOPERATIVE, PINGPONG; see
kgen/targets/sm90/warp_specialized.py): a producer warpgroup fills the ring by TMA, two consumer
warpgroups run wgmma and the epilogue DAG in registers, the output leaving through the copy
engine or as pair stores. Everything the template prints is prepared here from the plan; the
template is templates/sm90/gemm.cu.j2."""
from __future__ import annotations

from ...enums import Axis
from ...plan import GemmPlan, KernelPlan, StorePath
from ..common import arch_guard, batch, epilogue_cpp, host_api
from ..common.operands import MMA_TYPE, dim_expr, header, host_checks, storage_asserts
from ..common.render import render, render_lines
from ..sm80 import epilogue as sm80_epilogue
from . import tensor_map
from .chain import wgmma_outs

# Per axis: the reduction helper of templates/sm90/reduce.inc.j2, its arguments past the
# partials and the output, and (deterministic mode) the CTA's workspace slot and its length
_REDUCE = {
    Axis.ROW: ("reduce_rows", "m0 + row0 + warp * 16 + lane / 4, M, lane", "tile_n", "M"),
    Axis.COL: ("reduce_cols", "{scratch}, n0, N, lane, consumer_warp, consumer_tid", "tile_m", "N"),
    Axis.ALL: ("reduce_all", "{scratch}, lane, consumer_warp, consumer_tid",
               "tile_m * tiles_n + tile_n", "1"),
}
_SLOTS = {Axis.ROW: "tiles_n", Axis.COL: "tiles_m", Axis.ALL: "tiles_m * tiles_n"}


def reduction_lines(plan: KernelPlan, g: GemmPlan, params: str = "p") -> list[str]:
    """Each reduction's tile partial to the output (atomic) or to the CTA's workspace slot
    (of `params`: the tile's batch of the arguments)."""
    reds = g.epilogue.reductions
    if not reds:
        return []
    atomic = "false" if plan.deterministic else "true"
    lines = ["long long ws_offset = 0;"] if plan.deterministic and len(reds) > 1 else []
    for r in reds:
        helper, args, slot, length = _REDUCE[r.axis]
        args = args.format(scratch=f"smem.{r.scratch}()")
        out = f"{params}.{r.target}"
        if plan.deterministic:
            offset = " + ws_offset" if len(reds) > 1 else ""
            out = f"{params}.workspace{offset} + (long long)({slot}) * {length}"
        lines.append(f"{helper}<{sm80_epilogue.OP_STRUCT[r.op]}, {atomic}>(red{r.index}_part, {out}, {args});")
        if plan.deterministic and len(reds) > 1 and r is not reds[-1]:
            lines.append(f"ws_offset += (long long)({_SLOTS[r.axis]}) * {length};")
    return lines


def epilogue_loop(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The consumers' epilogue: pair stores (and the reductions); with a TMA store, the staging
    in the fast entry point and pair stores in the narrow one."""
    params = "pb" if batch.batched(plan) else "p"  # the tile's batch of the arguments
    # made here, not before the mainloop: its pointers hold no registers through the wgmma
    head = ([f"const {plan.name}_params pb = at_batch(p, batch);  // this tile's batch of the "
             "arguments"] if batch.batched(plan) else [])
    pairs = (sm80_epilogue.partial_lines(g)
             + sm80_epilogue.pair_loop(g, "m0 + row0 + i * 64 + warp * 16 + lane / 4",
                                       "n0 + j * 8 + (lane % 4) * 2", narrow=True, params=params)
             + reduction_lines(plan, g, params))
    if plan.schedule.gemm(g.name).store is not StorePath.TMA:
        return head + pairs
    out = g.epilogue.packed_store.param
    batched_out = plan.param(out).batch is not None
    c = plan.schedule.gemm(g.name).staged_input
    # the staged input's pair where a tile does not leave through the staging: from global
    # memory (its rows are 16-byte aligned in the fast entry point)
    global_staged = (f", *reinterpret_cast<const unsigned*>({params}.{c} + "
                     f"static_cast<long long>(row) * {params}.ld_{c} + col)" if c else "")
    staged = render_lines("sm90/gemm_tma_store.inc.j2", out=out,
                          staging=f"{g.name}_d_staging", name=g.name, params=params,
                          store_box="tma_store_box_3d" if batched_out else "tma_store_box",
                          store_batch=f", map_batch(p.batch_{out}, batch)" if batched_out else "",
                          staged=c or "", global_staged=global_staged)
    return head + (["if constexpr (kNarrow) {  // no copy engine: pair stores"]
            + [f"  {line}" for line in pairs] + ["} else {"]
            + [f"  {line}" if line else line for line in staged] + ["}"])


def tile_start(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """At each tile's start, before the mainloop: the staged input's load into the output's
    staging (Schedule: GemmSchedule.staged_input), if any."""
    c = plan.schedule.gemm(g.name).staged_input
    if c is None:
        return []
    batched = plan.param(c).batch is not None
    return render_lines("sm90/staged_input.inc.j2", param=c, staging=f"{g.name}_d_staging",
                        load_box="tma_load_box_3d" if batched else "tma_load_box",
                        load_batch=f", map_batch(p.batch_{c}, batch)" if batched else "")


def _tma_load(plan: KernelPlan, operand: str, ring: str, stage_bytes: str, row: str) -> str:
    """The producer's copy-engine load of one operand's k tile (rank 3 for a batched one)."""
    head = (f"{ring} + s * {stage_bytes}, &maps.{operand}, full + 8 * s, kt * kTileK, {row}")
    if plan.param(operand).batch is None:
        return f"tma_load_box({head});"
    return f"tma_load_box_3d({head}, map_batch(p.batch_{operand}, batch));"


def _pitch(plan: KernelPlan, operand: str) -> str:
    """What copy_granule takes of an operand's rows besides its address: the leading dimension,
    and, batched, the batch stride too (every batch's rows as aligned as the first's)."""
    if plan.param(operand).batch is None:
        return f"p.ld_{operand}"
    return f"p.ld_{operand} | p.batch_{operand}"


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    g = plan.gemms[0]
    schedule = plan.schedule
    staged = schedule.gemm(g.name).store is StorePath.TMA
    assert schedule.narrow, "a one-gemm kernel has a narrow entry point"
    body = epilogue_cpp.function_body(epilogue_cpp.render(g.epilogue, narrow="kNarrow"), False)
    c = schedule.gemm(g.name).staged_input
    packed = (epilogue_cpp.function_body(
        epilogue_cpp.render(g.epilogue, narrow="false", staged=c), True) if staged else [])
    buffers = [dict(name=b.name, role=b.role, live=plan.storage.live_text(b), offset=b.offset,
                    bytes=b.bytes, ctype=b.dtype.cpp if b.dtype is not None else "unsigned char")
               for b in plan.storage.buffers]
    consumer, producer = schedule.role("consumer"), schedule.role("producer")
    batched = batch.batched(plan)
    maps = tensor_map.template_maps(schedule.tensor_maps, dim_expr, plan)
    n = g.tile[1]
    return render(
        "sm90/gemm.cu.j2",
        header=header(plan, source_name, source_hash, command),
        name=plan.name,
        ns=f"{plan.name}_kgen",
        kind_note=f"{schedule.kind.value} ({schedule.why_kind})",
        tile_m=g.tile[0], tile_n=n, tile_k=g.tile[2],
        stages=g.stages,
        group_m=schedule.raster.group_m,
        smem_bytes=plan.smem_bytes,
        threads=schedule.threads,
        producer_registers=producer.registers,
        consumer_registers=consumer.registers,
        pingpong=schedule.pingpong,
        a_bytes=g.a.dtype.nbytes, b_bytes=g.b.dtype.nbytes,
        a_smem=g.a.smem.name, b_smem=g.b.smem.name, a_param=g.a.param, b_param=g.b.param,
        barriers=f"{g.name}_ring_barriers",
        maps=maps,
        map_steps=tensor_map.steps_lines(maps),
        map_names=tensor_map.names(schedule.tensor_maps),
        tma_store=staged,
        staged=c or "",
        packed_params=f", unsigned staged_{c}" if c else "",
        tile_start=tile_start(plan, g),
        reductions=bool(g.epilogue.reductions),
        buffers=buffers,
        storage_asserts=storage_asserts(plan),
        mma_types=f"{g.a.dtype.dsl_name} x {g.b.dtype.dsl_name} -> f32",
        mma_ab=MMA_TYPE[g.a.dtype],
        wgmma_n=n,
        wgmma_acc=f"float (&acc)[{n // 8}][4]",
        wgmma_regs=", ".join(f"%{i}" for i in range(n // 2)),
        wgmma_outs=wgmma_outs(n, "acc"),
        wgmma_rs=[],
        gemm_name=g.name,
        epilogue=body,
        packed_epilogue=packed,
        epilogue_params=sm80_epilogue.epilogue_params(g),
        epilogue_loop=epilogue_loop(plan, g),
        init_kernel=sm80_epilogue.init_kernel(plan)
        + sm80_epilogue.finalize_kernel(plan, dim_expr(g.m_dim), dim_expr(g.n_dim)),
        host_init=sm80_epilogue.host_init_lines(plan),
        host_empty=sm80_epilogue.host_empty_lines(plan),
        host_finalize=sm80_epilogue.host_finalize_lines(plan),
        **host_api.template_values(plan),
        persistent=True,
        arch_guard=arch_guard.guard(plan),
        summary=(f"{g.name} = {g.a_name} @ {g.b_name}, CTA tile {g.tile[0]}x{n}x{g.tile[2]}, "
                 f"{schedule.kind.value}"),
        min_blocks=schedule.min_blocks_per_sm,
        m_expr=dim_expr(g.m_dim), n_expr=dim_expr(g.n_dim), k_expr=dim_expr(g.k_dim),
        host_m_expr=dim_expr(g.m_dim), host_n_expr=dim_expr(g.n_dim),
        host_checks=host_checks(plan),
        batched=batched,
        batches=batch.batch_count(plan),
        walk="walk" if batched else "tiles",
        tile_batch=["const int batch = tile / (tiles_m * tiles_n);"] if batched else [],
        tile_in_batch="tile % (tiles_m * tiles_n)" if batched else "tile",
        tile_params="pb" if batched else "p",
        at_batch=batch.at_batch_lines(plan),
        a_pitch=_pitch(plan, g.a.param), b_pitch=_pitch(plan, g.b.param),
        a_load=_tma_load(plan, g.a.param, "a_ring", "kAStageBytes", "tile_m * kTileM"),
        b_load=_tma_load(plan, g.b.param, "b_ring", "kBStageBytes", "tile_n * kTileN"),
        host_batches=batch.host_lines(plan),
        host_tiles=batch.grid_count(plan, "tiles_m * tiles_n"),
    )
