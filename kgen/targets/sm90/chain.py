"""sm_90a emitter of chained gemms (back-to-back): the first gemm on wgmma (both operands from
shared memory through descriptors) over a resident ring of A, later gemms on wgmma with A from
registers where the schedule says so (Mma.WGMMA_RS), and `schedule pingpong`: producer warps
fill the ring through full and empty mbarriers while two (or three: schedules.consumer_count)
consumer warpgroups take the tiles in turn, the output leaving through the copy engine (the
schedule's tma_output: cp.async.bulk.tensor through a CUtensorMap). The stage scaffolding is
kgen.targets.common.chain's; the template is templates/sm90/chain.cu.j2."""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import GemmPlan, KernelPlan, LoadPath
from ..common import batch, chain
from ..common import epilogue_loop as epilogue_emit
from ..common.chain_mainloop import block, cfg, function_level, resident_loads, wide_store_lines
from ..common.operands import dim_expr, load_args, operand
from ..common.render import macro_lines, render, render_lines
from . import schedules, tensor_map

LINES = "sm90/chain_lines.inc.j2"


@dataclass(frozen=True, slots=True)
class WgmmaStep:
    """One wgmma of a resident chained stage: A fragments of k step `step`, B at address `at`."""

    step: int
    at: str



class Sm90Chain(chain.ChainTarget):
    template = "sm90/chain.cu.j2"

    def warp_var(self, plan: KernelPlan) -> str:
        # ping-pong: the warp in its warpgroup
        return "math_warp" if plan.schedule.scheduler.pingpong else "warp_id"

    def stage_threads(self, plan: KernelPlan) -> chain.StageThreads:
        if not plan.schedule.scheduler.pingpong:
            return super().stage_threads(plan)
        return chain.StageThreads(constant="kWarpgroupThreads", who="a whole consumer warpgroup")

    def first_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        a, b = operand(g.a, "a"), operand(g.b, "b")
        if plan.schedule.scheduler.pingpong:  # the producer warps load the ring (produce_ring)
            text = render("sm90/pingpong_wgmma.inc.j2", a=a, b=b, tma_a=tma_ring(plan),
                          ring_b=plan.schedule.chain_ring_b, paired=paired(plan),
                          order=plan.schedule.consumer_order,
                          in_flight=plan.schedule.gemms[0].overlap.wgmma_groups,
                          **consumer_template_values(plan))
        else:
            text = render("sm90/ring_wgmma.inc.j2", a=a, b=b,
                          ring_load_args=load_args(g.a, "a", "load_m0", "load_k"),
                          ring_a=batch.next_operand(plan, g.a.param)[1])
        return function_level(text)

    def resident_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if g.name in plan.schedule.wgmma_chain:
            gs = plan.schedule.gemm(g.name)
            return resident_wgmma(g, gs.passes.count, gs.overlap.passes)
        return super().resident_mainloop(plan, g)

    def last_epilogue(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if plan.schedule.tma_output is not None:
            return tma_store_lines(plan, g)
        if plan.schedule.wide_stores:
            return wide_store_lines(g)
        return epilogue_emit.loop_lines(plan, g)

    def persistent_body(self, plan: KernelPlan, stages: list[str]) -> list[str]:
        if plan.schedule.scheduler.pingpong:
            return pingpong_body(plan, stages)
        return super().persistent_body(plan, stages)

    def first_gemm_functions(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if not plan.schedule.scheduler.pingpong:
            return super().first_gemm_functions(plan, g)
        a = g.a.param
        batched = plan.param(a).batch is not None
        producer_a = (f"at_batch(p, tile / (tiles_m * tiles_n)).{a}"
                      if batched else f"p.{a}")  # the tile's batch
        (tma_load,) = macro_lines(LINES, "ring_a_load", a=a, batched=batched)
        return render(
            "sm90/pingpong_producer.inc.j2", name=plan.name, a=operand(g.a, "a"),
            b=operand(g.b, "b"), ring_b=plan.schedule.chain_ring_b, paired=paired(plan),
            m_expr=dim_expr(g.m_dim), k_expr=dim_expr(g.k_dim),
            load_args=load_args(g.a, "a", "m0", "kt"), producer_a=producer_a,
            tma_a=tma_ring(plan), tma_load=tma_load,
            times_batches=batch.chain_values(plan)["times_batches"]).rstrip("\n").split("\n")

    def device_helpers(self, plan: KernelPlan) -> list[str]:
        """The fixed device helpers the chain's .cu carries, in order: wgmma's, and of the others
        only those its kernel calls, as its schedule's components decide."""
        schedule = plan.schedule
        helpers = ["common/cp_async_evict_first.inc.j2"] if self.evict_first(plan) else []
        helpers.append("sm90/wgmma.inc.j2")
        if schedule.scheduler.pingpong:  # the ring's barriers; its producer's loads or registers
            helpers += ["sm90/mbarrier.inc.j2", "sm90/tma_load.inc.j2" if tma_ring(plan)
                        else "sm90/setmaxnreg.inc.j2"]
        if schedule.tma_output is not None:
            helpers.append("sm90/tma_store.inc.j2")
        if batch.batched(plan) and schedule.tensor_maps:
            helpers.append("sm90/tma_batch.inc.j2")
        if schedule.quad_stores:  # 16-byte stores from registers
            helpers.append("common/quad_transpose.inc.j2")
        if schedule.mma_sync:  # a gemm still multiplies with mma.sync
            helpers.append("common/mma_step.inc.j2")
        return helpers

    def template_values(self, plan: KernelPlan) -> dict:
        first, schedule = plan.gemms[0], plan.schedule
        tma = schedule.tma_output
        maps = tensor_map.template_maps(schedule.tensor_maps, dim_expr, plan)
        return dict(
            device_helpers=self.device_helpers(plan),
            **consumer_template_values(plan),
            pingpong=schedule.scheduler.pingpong,
            tma_store=tma is not None,
            tma_output=tma.param if tma else "",
            staged="",  # a chain's epilogue reads its inputs from global memory
            stmatrix=tma is not None,  # and writes its staging by stmatrix
            byte_out=False,  # of a 16-bit output
            copy_out=False,  # the tensor map clips columns past N (tma_refusal): the copy engine stores each
            stmatrix_trans=False,
            part_box=False,
            odd_n8=False,
            stages_d=0,  # its staging holds the whole tile
            maps=maps,
            map_steps=tensor_map.steps_lines(maps),
            map_names=tensor_map.names(schedule.tensor_maps) if maps else "",
            tma_a=tma_ring(plan),
            producer_threads=first.producer_threads,
            producer_registers=(schedule.warps.role("producer").registers
                                if schedule.scheduler.pingpong else 0),
            consumer_registers=(schedule.warps.role("consumer").registers
                                if schedule.scheduler.pingpong else 0),
            wgmma_n=first.tile[1],
            wgmma_acc=f"float (&acc)[1][{first.tile[1] // 8}][4]",
            wgmma_regs=", ".join(f"%{i}" for i in range(first.tile[1] // 2)),
            wgmma_outs=wgmma_outs(first.tile[1]),
            wgmma_rs=[dict(n=n, regs=", ".join(f"%{i}" for i in range(n // 2)),
                           outs=wgmma_outs(n))
                      for n in sorted({g.tile[1] // schedule.gemm(g.name).passes.count
                                       for g in plan.gemms if g.name in schedule.wgmma_chain})],
            descriptor_64=any(schedules.k_tile_row_bytes(g, g.b) == 64 for g in plan.gemms
                              if g.name in schedule.wgmma_chain),
        )


SM90 = Sm90Chain()


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    return chain.emit(SM90, plan, source_name=source_name, source_hash=source_hash,
                      command=command)


def resident_wgmma(g: GemmPlan, passes: int = 1, in_flight: int = 1) -> list[str]:
    """The resident chained stage on wgmma (Mma.WGMMA_RS): the warpgroup's rows times all
    of B (in column passes: the pass's rows of B, K-major), one k16 step per instruction, A
    from this thread's fragments, B through descriptors; one commit group, waited on before the
    epilogue reads the accumulators. `in_flight` 2 (Overlap.passes): the next
    pass's group is issued first, into the other set of the stage's `pass_acc`."""
    tiles, steps = g.chain.k // g.tile[2], g.tile[2] // 16
    wgmma_steps = []
    for kt in range(tiles):
        here = f"b_smem + {kt} * kBStageBytes" if kt else "b_smem"
        for kk in range(steps):
            # B's k16 step kk starts 32 bytes (16 elements) further along its 128- or 64-byte rows
            wgmma_steps.append(WgmmaStep(step=kt * steps + kk,
                                         at=f"{here} + {kk * 32}" if kk else here))
    return render_lines("sm90/resident_wgmma.inc.j2", b=operand(g.b, "b"), name=g.name,
                        source=g.chain.source, several_tiles=tiles > 1, steps=wgmma_steps,
                        passes=passes, in_flight=in_flight,
                        descriptor=DESCRIPTORS[schedules.k_tile_row_bytes(g, g.b)])


# The wgmma descriptor function (templates/sm90/wgmma.inc.j2) of B's swizzled k-tile rows, by
# their bytes (schedules.RS_B_ROW_BYTES)
DESCRIPTORS = {128: "smem_descriptor", 64: "smem_descriptor_64"}



def tma_store_lines(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The last gemm's epilogue through the copy engine (tma_output): the warpgroup writes
    its tile into its staging as 64x64 swizzled boxes, then one thread stores the boxes with
    cp.async.bulk.tensor. The staging is rewritten only once the copy engine has read the last
    tile's boxes. Rows past M hold zeros and are clipped by the tensor map, as are columns past
    N where the tiles overhang it, which the epilogue then skips (it may read column inputs)."""
    out = g.epilogue.packed_store.param
    batched = plan.param(out).batch is not None  # a rank-3 map: (columns, rows, batches)
    guard = f" && n0 + c < {dim_expr(g.n_dim)}" if schedules.overhangs(g) else ""
    return render_lines("sm90/tma_store_epilogue.inc.j2", out=out, name=g.name, guard=guard,
                        store_box="tma_store_box_3d" if batched else "tma_store_box",
                        store_batch=f", map_batch(p.batch_{out}, batch)" if batched else "")


def tma_ring(plan: KernelPlan) -> bool:
    """The copy engine fills the first gemm's ring of A (the ping-pong chain's producer)."""
    return (plan.schedule.scheduler.pingpong
            and plan.schedule.gemms[0].pipeline.a.load is LoadPath.TMA)


def paired(plan: KernelPlan) -> bool:
    """The ping-pong chain's consumers take pairs of tiles, B0's k tiles shared (chain_pairs)."""
    return plan.schedule.scheduler.pingpong and plan.schedule.gemms[0].pipeline.paired


def wgmma_outs(n: int, acc: str = "acc[0]") -> str:
    """The asm outputs of a warp's m64nNk16 accumulators, in the m16n8 layout `acc`[j][e]."""
    return ", ".join(f'"+f"({acc}[{j}][{e}])' for j in range(n // 8) for e in range(4))


def pingpong_body(plan: KernelPlan, stages: list[str]) -> list[str]:
    """schedule pingpong: the barriers and the resident B operands, then the producer warps fill
    the ring while the two consumer warpgroups run every other tile of this CTA."""
    g0 = plan.gemms[0]
    return block(render_lines(
        "sm90/pingpong_body.inc.j2", cfg=cfg(g0), bars=f"{g0.name}_ring_barriers",
        order=plan.schedule.consumer_order, paired=paired(plan),
        resident_loads=block(resident_loads(plan)), stages=block(stages),
        tma_store=plan.schedule.tma_output is not None, tma_a=tma_ring(plan),
        map_params=[m.param for m in plan.schedule.tensor_maps] if tma_ring(plan) else [],
        times_batches=batch.chain_values(plan)["times_batches"],
        tile_batch=batch.tile_batch(plan, "tile"), **consumer_template_values(plan)))


def consumer_template_values(plan: KernelPlan) -> dict:
    """The ping-pong consumer warpgroups' count for the templates: as a number, as a word, and
    the C++ expression of the warpgroup whose turn comes after `warpgroup`'s."""
    role = plan.schedule.warps.role("consumer")
    n = role.groups if role is not None else schedules.CONSUMERS
    return dict(consumers=n, consumers_word=schedules.CONSUMER_WORDS[n],
                next_warpgroup="(1 - warpgroup)" if n == 2 else f"((warpgroup + 1) % {n})")
