"""sm_80 emitter of chained gemms (back-to-back): the first gemm on the cp.async multistage
mainloop with ldmatrix and mma.sync (templates/sm80/mainloop.inc.j2), every later stage as
kgen.targets.common.chain lays it out, into templates/sm80/chain.cu.j2."""
from __future__ import annotations

from ...plan import GemmPlan, KernelPlan
from ..common import batch, chain, epilogue_loop
from ..common.chain_mainloop import function_level, wide_store_lines
from ..common.operands import frag_loads, load_args, mainloop_steps, operand
from ..common.render import render


class Sm80Chain(chain.ChainTarget):
    template = "sm80/chain.cu.j2"

    def first_mainloop(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        text = render("sm80/mainloop.inc.j2", a=operand(g.a, "a"), b=operand(g.b, "b"),
                      first_fragments=frag_loads(g, 0, 0, "_next"),
                      mainloop_steps=mainloop_steps(g),
                      prologue=not plan.schedule.scheduler.persistent,
                      resident=plan.schedule.resident,
                      ring_load_args=load_args(g.a, "a", "load_m0", "load_k"),
                      ring_a=batch.next_operand(plan, g.a.param)[1])
        return function_level(text)

    def last_epilogue(self, plan: KernelPlan, g: GemmPlan) -> list[str]:
        if plan.schedule.wide_stores:
            return wide_store_lines(g)
        return epilogue_loop.loop_lines(plan, g)


SM80 = Sm80Chain()


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    return chain.emit(SM80, plan, source_name=source_name, source_hash=source_hash,
                      command=command)
