"""sm_80 emitter: cp.async multistage mainloop, ldmatrix, mma.sync m16n8k16 (m16n8k32 for sm_89's
FP8 operands, kgen/targets/sm80/fp8.py), register epilogue.

The values templates/sm80/gemm.cu.j2 prints are prepared here from the plan; the epilogue loop
and the helper kernels are kgen/targets/common's (epilogue_loop, helper_kernels).
"""
from __future__ import annotations

from ...plan import GemmPlan, KernelPlan
from ..common import arch_guard, batch, epilogue_cpp, epilogue_loop, helper_kernels, host_api
from ..common.operands import (MMA_TYPE, dim_expr, frag_loads, header, host_checks,
                               mainloop_steps, operand, storage_asserts)
from ..common.render import render
from . import epilogue as epilogue_emit


def _buffer_ctype(g: GemmPlan, name: str) -> str:
    types = {g.a.smem.name: g.a.dtype.cpp, g.b.smem.name: g.b.dtype.cpp}
    types.update({r.scratch: "float" for r in g.epilogue.reductions})
    return types[name]


def _summary(plan: KernelPlan) -> str:
    g = plan.gemms[0]
    return f"{g.name} = {g.a_name} @ {g.b_name}, CTA tile {g.tile[0]}x{g.tile[1]}x{g.tile[2]}"


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    g = plan.gemms[0]
    ns = f"{plan.name}_kgen"
    assert plan.schedule.entry.narrow, "a one-gemm kernel has a narrow entry point"
    epi = epilogue_cpp.render(g.epilogue, narrow="kNarrow")
    epilogue_lines = list(epi.loads) + list(epi.compute) + list(epi.stores)
    buffers = [
        dict(
            name=b.name,
            role=b.role,
            live=plan.storage.live_text(b),
            offset=b.offset,
            bytes=b.bytes,
            ctype=b.dtype.cpp if b.dtype is not None else _buffer_ctype(g, b.name),
        )
        for b in plan.storage.buffers
    ]
    split = plan.schedule.scheduler.split_k
    k_tile = "(k_first + s)" if split > 1 else "s"
    # the CTA's index among its batch's (the grid's, without a batch dimension)
    block = "block" if batch.batched(plan) else "blockIdx.x"
    a = operand(g.a, "a", narrow=True, k_tile=k_tile)
    b = operand(g.b, "b", narrow=True, k_tile=k_tile)
    return render(
        "sm80/gemm.cu.j2",
        header=header(plan, source_name, source_hash, command),
        name=plan.name,
        ns=ns,
        tile_m=g.tile[0],
        tile_n=g.tile[1],
        tile_k=g.tile[2],
        warps_m=g.warps[0],
        warps_n=g.warps[1],
        threads=plan.schedule.warps.threads,
        warp_tile_m=g.warp_tile[0],
        warp_tile_n=g.warp_tile[1],
        frag_m=g.frags[0],
        frag_n=g.frags[1],
        stages=g.stages,
        group_m=plan.schedule.scheduler.raster.group_m,
        smem_bytes=plan.smem_bytes,
        **host_api.template_values(plan),
        arch_guard=arch_guard.guard(plan),
        persistent=False,  # one CTA per tile
        buffers=buffers,
        storage_asserts=storage_asserts(plan),
        mma_types=f"{g.a.dtype.dsl_name} x {g.b.dtype.dsl_name} -> f32",
        mma_ab=MMA_TYPE[g.a.dtype],
        mma_b=MMA_TYPE[g.b.dtype],
        mma_k=g.mma[2],  # m16n8k32 for FP8 (sm_89: kgen/targets/sm80/fp8.py), else m16n8k16
        fp8_out=any(p.dtype.fp8 and p.is_output for p in plan.params),
        operands=[a, b],
        a=a,
        b=b,
        gemm_name=g.name,
        epilogue=epilogue_lines,
        epilogue_params=epilogue_loop.epilogue_params(g),
        epilogue_loop=epilogue_loop.loop_lines(plan, g),
        reduce_helpers=epilogue_emit.helpers(plan),
        **helper_kernels.template_values(plan, g),
        split_k=split,
        cta="cta_tile" if split > 1 else block,
        block=block,
        block_param=", int block" if batch.batched(plan) else "",
        at_batch=batch.at_batch_lines(plan),
        body_call_fast=batch.body_call(plan, False, ns),
        body_call_narrow=batch.body_call(plan, True, ns),
        host_batches=batch.host_lines(plan),
        grid=batch.grid_count(
            plan, "tiles_m * tiles_n" + (f" * {ns}::kSplitK" if split > 1 else "")),
        mainloop_steps=mainloop_steps(g),
        first_fragments=frag_loads(g, 0, 0, "_next"),
        prologue=True,
        resident=False,
        summary=_summary(plan),
        min_blocks=plan.schedule.scheduler.min_blocks_per_sm,
        m_expr=dim_expr(g.m_dim),
        n_expr=dim_expr(g.n_dim),
        k_expr=dim_expr(g.k_dim),
        host_m_expr=dim_expr(g.m_dim),
        host_n_expr=dim_expr(g.n_dim),
        host_checks=host_checks(plan),
    )
