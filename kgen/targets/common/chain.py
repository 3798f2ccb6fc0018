"""Chained gemms (back-to-back) on any target: every stage in one CTA, the intermediate on chip.

The kernel runs the stages in order, each in its own block scope that opens the stage's
configuration namespace (`using namespace g0_cfg;`), so a stage's code reads like the single
gemm kernel's: the first stage is that target's mainloop, a chained stage reads A from registers
or from the shared tile its source's epilogue wrote, and streams B through its own cp.async
pipeline over a k-tile count known at compile time (its K is the source's whole N), unrolled
(kgen.targets.common.chain_mainloop). Every string is prepared here; the templates lay it out.

A persistent plan (TileScheduler.persistent) wraps the stages in a loop over tiles (tile +=
gridDim.x) and issues the next tile's first stages of the first gemm (`load_first_stages`)
behind the last gemm's last B load; the last gemm's waits then count its cp.async groups
exactly.

What differs by target (the first gemm's mainloop, a resident chained stage, the last epilogue,
the persistent loop, the template and its extra values) is a ChainTarget, subclassed by
kgen.targets.sm80.chain and kgen.targets.sm90.chain; this module imports neither.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import CachePolicy, GemmPlan, KernelPlan, VectorHome
from . import arch_guard, batch, epilogue_cpp, host_api
from .chain_mainloop import (CHAIN_LINES, block, cfg, chained_mainloop, early_lines,
                             early_vectors, feed_lines, first_stage_loads, first_stages_function,
                             resident_loads, resident_mainloop)
from .operands import MMA_TYPE, dim_expr, header, host_checks, operand, storage_asserts
from .epilogue_cpp import PAIR
from .render import macro_lines, render, render_lines

BARRIER_CTYPE = "unsigned long long"  # the only buffers without a dtype: barriers (sm_90a)


@dataclass(frozen=True, slots=True)
class StageConfig:
    """A stage's compile-time configuration; 0 or "" where a line does not apply."""

    name: str
    a_name: str
    b_name: str
    keep: str
    tile_m: int
    tile_n: int
    tile_k: int
    warps_m: int
    warps_n: int
    threads_assert: str
    warp_tile_m: int
    warp_tile_n: int
    frag_m: int
    frag_n: int
    stages: int
    b_param: str
    source: str
    chain_k: int
    k_steps: int
    k_tiles: int
    resident_k: bool
    whole_n: str


@dataclass(frozen=True, slots=True)
class StageThreads:
    """The threads that run every stage: the constant that counts them, and who they are in
    words (the stage's static check that its warps are exactly those)."""

    constant: str
    who: str


class ChainTarget:
    """The parts of a chain kernel that a target decides; the defaults are mma.sync's."""

    template = ""

    def warp_var(self, plan: KernelPlan) -> str:
        """The warp's index among the warps that run a stage."""
        return "warp_id"

    def stage_threads(self, plan: KernelPlan) -> StageThreads:
        return StageThreads(constant="kThreads", who="all the warps")

    def first_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        raise NotImplementedError

    def resident_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        return resident_mainloop(g)

    def last_epilogue(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        """The last gemm's epilogue: wide_store_lines, or the target's register stores."""
        raise NotImplementedError

    def persistent_body(self, plan: KernelPlan, stages: list[str]) -> list[str]:
        if plan.schedule.resident:
            return resident_body(plan, stages)
        return persistent_body(plan, stages)

    def evict_first(self, plan: KernelPlan) -> bool:
        """Whether the first gemm's A copies carry L2's evict-first hint: the schedule says."""
        return plan.schedule.gemms[0].pipeline.a.cache is CachePolicy.EVICT_FIRST

    def first_gemm_functions(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        """Device functions in the first gemm's namespace."""
        return first_stages_function(plan) if plan.schedule.scheduler.persistent else []

    def template_values(self, plan: KernelPlan) -> dict:
        """Values only this target's template reads, or overrides of the common ones."""
        return {}


def stage_lines(arch: ChainTarget, plan: KernelPlan, i: int) -> list[str]:
    """Stage i in its block scope: its mainloop, then its epilogue (feeding the next stage, or
    the output)."""
    g = plan.gemms[i]
    last = i == len(plan.gemms) - 1
    nxt = None if last else plan.gemms[i + 1]
    # A resident first gemm loads no B in its mainloop (no n0, N); a resident chained one
    # loads nothing (no K), and where it feeds a later gemm stores nothing either (no n0, N).
    b_in_loop = not (plan.schedule.resident and (g.chain is None or not last))
    k_in_loop = not (plan.schedule.resident and g.chain is not None)
    # 16-byte stores over tiles that divide N check no column against N
    n_used = b_in_loop and not (plan.schedule.wide_stores and last and g.n_dim % g.tile[1] == 0)
    if g.chain is None:
        mainloop = arch.first_mainloop(plan, g)
    elif plan.schedule.resident:
        mainloop = arch.resident_mainloop(plan, g)
    elif plan.schedule.scheduler.persistent and last:
        first = plan.gemms[0]
        why = [f"// Prefetch: the next tile's first kStages - 1 stages of {first.name} "
               f"({first.a.param}, {first.b.param}) start now,",
               f"// behind {g.name}'s last {g.b.param} load, so the memory system streams "
               f"{first.a.param} while this tile finishes."]
        mainloop = chained_mainloop(g, first_stage_loads(plan, "next_tile", why),
                                    first.stages - 1)
    else:
        mainloop = chained_mainloop(g)
    early = plan.schedule.gemm(g.name).vectors.held(VectorHome.REGISTERS)
    epilogue = arch.last_epilogue(plan, g) if nxt is None else feed_lines(g, nxt, early)
    passes = plan.schedule.gemm(g.name).passes.count  # the pass loop declares its own n0
    in_flight = plan.schedule.gemm(g.name).overlap.passes
    if passes > 1:  # the mainloop and epilogue sit inside the pass loop
        mainloop, epilogue = block(mainloop), block(epilogue)
    return render_lines(
        "common/stage.inc.j2", name=g.name, a_name=g.a_name, b_name=g.b_name, cfg=cfg(g),
        a_frags=nxt is not None and nxt.a is None,
        next="" if nxt is None else nxt.name, next_cfg="" if nxt is None else cfg(nxt),
        next_dtype="" if nxt is None else nxt.chain.dtype.dsl_name,
        tile=f"{g.tile[0]}x{g.tile[1]}x{g.tile[2]}",
        where="this CTA's columns" if last else "all of its N in every CTA",
        warp=arch.warp_var(plan),
        n0=("tile_n * kTileN" if last else "0") if b_in_loop and passes == 1 else "",
        passes=passes, in_flight=in_flight,
        n_expr=dim_expr(g.n_dim) if n_used else "",
        k_expr=dim_expr(g.k_dim) if k_in_loop else "",
        early=block(early_lines(g, early)),
        mainloop=block(mainloop),
        # a resident plan's buffers are never reused within a tile
        sync=nxt is not None and not plan.schedule.resident,
        last=last,
        epilogue=block(epilogue),
    )


def config_lines(arch: ChainTarget, g: GemmPlan, plan: KernelPlan) -> StageConfig:
    """The stage's configuration namespace (templates/common/stage_config.inc.j2)."""
    chain = g.chain
    return StageConfig(
        name=g.name, a_name=g.a_name, b_name=g.b_name,
        keep="" if chain is None else f"; A = {chain.source} kept in {chain.residency.value}",
        tile_m=g.tile[0], tile_n=g.tile[1], tile_k=g.tile[2], warps_m=g.warps[0],
        warps_n=g.warps[1], threads_assert="".join(macro_lines(
            CHAIN_LINES, "threads_assert", threads=arch.stage_threads(plan))),
        warp_tile_m=g.warp_tile[0], warp_tile_n=g.warp_tile[1], frag_m=g.frags[0],
        frag_n=g.frags[1],
        # a resident chained stage streams no B: no stages
        stages=0 if plan.schedule.resident and chain is not None else g.stages,
        b_param=g.b.param, source="" if chain is None else chain.source,
        chain_k=0 if chain is None else chain.k,
        # the register-resident A fragments are indexed by k step
        k_steps=chain.k_steps if chain is not None and g.a is None else 0,
        k_tiles=0 if chain is None else chain.k // g.tile[2],
        resident_k=chain is not None and plan.schedule.resident,
        whole_n="" if g is plan.gemms[-1] else str(g.n_dim),
    )


def chain_asserts(plan: KernelPlan) -> list[dict]:
    """Where a stage's A fragments are its source's accumulators, their shapes must agree."""
    ns = f"{plan.name}_kgen"
    return [dict(source=f"{ns}::{cfg(src)}", cfg=f"{ns}::{cfg(g)}", source_name=src.name,
                 name=g.name)
            for src, g in zip(plan.gemms, plan.gemms[1:]) if g.a is None]


def kernel_body(arch: ChainTarget, plan: KernelPlan) -> list[str]:
    """The stages for one tile, or (persistent) for every tile of this CTA's loop."""
    stages: list[str] = []
    for i in range(len(plan.gemms)):
        stages += stage_lines(arch, plan, i) + [""]
    stages = stages[:-1]
    if not plan.schedule.scheduler.persistent:
        return block(render_lines("common/tile_body.inc.j2", cfg=cfg(plan.gemms[0]),
                                  stages=stages, tile_batch=batch.tile_batch(plan, "blockIdx.x")))
    return arch.persistent_body(plan, stages)


def persistent_body(plan: KernelPlan, stages: list[str]) -> list[str]:
    """Persistent, B streamed: each tile prefetches the next tile's first stages."""
    g0 = plan.gemms[0]
    why = [f"// The first tile's first kStages - 1 stages of {g0.name}; later tiles' are "
           "prefetched by the tile before."]
    return block(render_lines(
        "common/persistent_body.inc.j2", cfg=cfg(g0), first=g0.name, last=plan.gemms[-1].name,
        first_loads=first_stage_loads(plan, "blockIdx.x", why), stages=block(stages),
        times_batches=batch.chain_values(plan)["times_batches"],
        tile_batch=batch.tile_batch(plan, "tile"), next_batch=batch.next_tile_lines(plan)))


def resident_body(plan: KernelPlan, stages: list[str]) -> list[str]:
    """Persistent with resident B: the B operands once, then one ring of A stages that the
    first gemm's mainloop keeps loading across this CTA's tiles."""
    g0 = plan.gemms[0]
    why = [f"// The first tile's first kStages - 1 k tiles of {g0.a.param}; later tiles' are "
           f"loaded by the tile before, in its {g0.name} mainloop."]
    return block(render_lines(
        "common/resident_body.inc.j2", cfg=cfg(g0), a_param=g0.a.param,
        resident_loads=resident_loads(plan), first_loads=first_stage_loads(plan, "blockIdx.x", why),
        stages=block(stages), times_batches=batch.chain_values(plan)["times_batches"],
        tile_batch=batch.tile_batch(plan, "tile"),
        next_batch=batch.next_operand(plan, g0.a.param)[0]))


def _stage_values(arch: ChainTarget, plan: KernelPlan, g: GemmPlan) -> dict:
    """One stage's configuration, shared-memory tiles, functions and epilogue function."""
    first, last = plan.gemms[0], plan.gemms[-1]
    ring = g is first and arch.evict_first(plan)
    operands = [operand(op, w, "cp_async_16_evict_first" if ring and w == "a" else "cp_async_16")
                for op, w in ((g.a, "a"), (g.b, "b")) if op is not None and op.copies_per_thread]
    layouts = []
    if g.a is not None and not g.a.copies_per_thread:  # the chained intermediate
        t = g.a.smem
        sw = t.swizzle
        layouts.append(dict(
            param=g.a.param, dtype=t.dtype.dsl_name, outer=t.outer, inner=t.inner,
            layout="ALayout", major="K contiguous",
            atom_inner=t.atom_inner, swizzle=str(sw), sw_shift=sw.shift,
            sw_mask=((1 << sw.bits) - 1) << sw.base))
    early = plan.schedule.gemm(g.name).vectors.held(VectorHome.REGISTERS)
    epi = epilogue_cpp.render(g.epilogue, early=early)
    extra = ", float& inter_0, float& inter_1" if g is not last else ""
    extra += "".join(f", {pair} early_{param}" for param, pair in early_vectors(g, early))
    wide = plan.schedule.wide_stores and g is last
    body = epilogue_cpp.function_body(epi, wide)
    return dict(
        cfg=cfg(g), name=g.name, config=config_lines(arch, g, plan), operands=operands,
        functions=arch.first_gemm_functions(plan, g) if g is first else [],
        layouts=layouts, epilogue=body, epilogue_params=extra,
        epilogue_type="unsigned" if wide else "void",
        epilogue_note=(", packed (the caller stores four pairs as one 16-byte chunk)"
                       if wide else ""),
    )


def emit(arch: ChainTarget, plan: KernelPlan, *, source_name: str, source_hash: str,
         command: str) -> str:
    first, last = plan.gemms[0], plan.gemms[-1]
    buffers = [
        dict(name=b.name, role=b.role, live=plan.storage.live_text(b), offset=b.offset,
             bytes=b.bytes, ctype=b.dtype.cpp if b.dtype is not None else BARRIER_CTYPE)
        for b in plan.storage.buffers
    ]
    stages = [_stage_values(arch, plan, g) for g in plan.gemms]
    dtype = plan.gemms[1].chain.dtype
    pair, _, _, to_pair, _ = PAIR[dtype]
    summary = ", then ".join(f"{g.name} = {g.a_name} @ {g.b_name}" for g in plan.gemms)
    values = dict(
        header=header(plan, source_name, source_hash, command),
        name=plan.name,
        ns=f"{plan.name}_kgen",
        threads=plan.schedule.warps.threads,
        group_m=plan.schedule.scheduler.raster.group_m,
        smem_bytes=plan.smem_bytes,
        stages=stages,
        chain_asserts=chain_asserts(plan),
        **host_api.template_values(plan),
        arch_guard=arch_guard.guard(plan),
        buffers=buffers,
        storage_asserts=storage_asserts(plan),
        mma_types=f"{dtype.dsl_name} x {dtype.dsl_name} -> f32",
        mma_ab=MMA_TYPE[dtype],
        operand_pair=pair,
        pack_expr=to_pair.format("lo", "hi"),
        operand_dtype=dtype.dsl_name,
        summary=summary,
        min_blocks=plan.schedule.scheduler.min_blocks_per_sm,
        evict_first=arch.evict_first(plan),
        # helpers only where the kernel calls them: the quad transpose of 16-byte stores from
        # registers, and mma_step wherever a gemm still multiplies with mma.sync
        quad_stores=plan.schedule.wide_stores,
        mma_sync=True,
        m_expr=dim_expr(first.m_dim, batch.size_prefix(plan)),
        first_cfg=cfg(first),
        last_cfg=cfg(last),
        last_n_expr=dim_expr(last.n_dim, batch.size_prefix(plan)),
        host_m_expr=dim_expr(first.m_dim),
        host_n_expr=dim_expr(last.n_dim),
        body=kernel_body(arch, plan),
        host_checks=host_checks(plan),
        persistent=plan.schedule.scheduler.persistent,
        column_blocks=plan.column_blocks > 1,
        **batch.chain_values(plan),
    )
    values.update(arch.template_values(plan))
    return render(arch.template, **values)
