"""Emission: a KernelPlan to standalone CUDA C++, through one emitter per (target family,
kernel kind), and the header that declares its host API (the same for every target)."""
from __future__ import annotations

from typing import Callable

from .errors import KgenError
from .plan import KernelPlan
from .plan.loop_dag import LoopDagPlan
from .plan.program import LoopPlan, RowsPlan
from .targets import target
from .targets.common import host_api
from .targets.common import loop as program
from .targets.common.loop import emit as program_emit
from .targets.common import loop_dag as dag_loop
from .targets.sm80 import chain as sm80_chain, gemm as sm80_gemm
from .targets.sm90 import chain as sm90_chain, gemm as sm90_gemm
from .targets.sm90 import loop as sm90_loop
from .targets.sm90 import loop_dag as sm90_loop_dag

__all__ = ["EMITTERS", "emit", "emit_header", "family", "kind"]

Emitter = Callable[..., str]
PROGRAM_PLANS = (LoopPlan, RowsPlan, LoopDagPlan)  # tile programs: kgen/targets/common/loop*.py

# (target family, kernel kind) -> emitter. A kind is "gemm" (one gemm) or "chain" (chained
# gemms, back to back, in one CTA).
EMITTERS: dict[tuple[str, str], Emitter] = {
    ("sm80", "gemm"): sm80_gemm.emit,
    ("sm80", "chain"): sm80_chain.emit,
    ("sm90", "chain"): sm90_chain.emit,
    ("sm90", "gemm"): sm90_gemm.emit,
}
# The same for tile programs (plan.program): "loop" (a loop kernel), "rows" (a row kernel).
# The mma.sync skeletons run on both families; an sm_90a loop plan with a wgmma schedule (the
# rulebook's choice, plan.wgmma) runs the warp-specialized wgmma skeleton.
PROGRAM_EMITTERS: dict[tuple[str, str], Emitter] = {
    ("sm80", "loop"): program_emit,
    ("sm90", "loop"): sm90_loop.emit_loop,
    ("sm80", "rows"): program_emit,
    ("sm90", "rows"): program_emit,
    ("sm80", "loop_dag"): dag_loop.emit,  # a loop over a DAG of gemms: mma.sync, both targets
    ("sm90", "loop_dag"): sm90_loop_dag.emit,  # its sm_90a wgmma skeleton (plan.wgmma)
}


def family(plan: KernelPlan) -> str:
    """The emitter family the plan asks for: a plan on wgmma (ping-pong included: it needs
    wgmma; a loop or DAG loop plan with a wgmma schedule) is sm_90a code; otherwise its target's family
    (sm_90a runs the sm_80 mainloop)."""
    if isinstance(plan, PROGRAM_PLANS):
        wgmma = isinstance(plan, (LoopPlan, LoopDagPlan)) and plan.wgmma is not None
        return "sm90" if wgmma else target(plan.arch).emitter
    return "sm90" if plan.schedule.wgmma else target(plan.arch).emitter


def kind(plan: KernelPlan) -> str:
    if isinstance(plan, PROGRAM_PLANS):
        return plan.kind
    return "chain" if len(plan.gemms) > 1 else "gemm"


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    """The .cu text; byte-identical for the same plan, source and kgen version."""
    if not isinstance(plan, PROGRAM_PLANS) and not plan.gemms:
        raise KgenError(
            plan.loc, f"kernel '{plan.name}' has no gemm to emit; kgen inspect shows its storage plan")
    table = PROGRAM_EMITTERS if isinstance(plan, PROGRAM_PLANS) else EMITTERS
    emitter = table[(family(plan), kind(plan))]
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command)


def emit_header(plan: KernelPlan, *, source_name: str, source_hash: str, command: str,
                header_name: str | None = None) -> str:
    """The .h text (`kgen compile --header`): the params struct and the host API's
    declarations, the same calls for every kind of kernel."""
    emitter = program.emit_header if isinstance(plan, PROGRAM_PLANS) else host_api.emit_header
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command,
                   header_name=header_name)
