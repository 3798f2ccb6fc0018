"""Emission: a KernelPlan to standalone CUDA C++, through one emitter per (target family,
kernel kind), and the header that declares its host API (the same for every target)."""
from __future__ import annotations

import importlib
from typing import Callable

from .errors import KgenError
from .plan import KernelPlan, is_program_plan
from .targets import target

__all__ = ["EMITTERS", "emit", "emit_header", "family", "kind"]

Emitter = Callable[..., str]


# (target family, kernel kind) -> emitter, as "module:function" under kgen.targets, imported on
# first use (a gemm's compile loads no tile-program emitter, and the reverse: kgen compile's time
# is mostly imports). A kind is "gemm" (one gemm) or "chain" (chained gemms, back to back, in
# one CTA).
EMITTERS: dict[tuple[str, str], str] = {
    ("sm80", "gemm"): "sm80.gemm:emit",
    ("sm80", "chain"): "sm80.chain:emit",
    ("sm90", "chain"): "sm90.chain:emit",
    ("sm90", "gemm"): "sm90.gemm:emit",
}
# The same for tile programs (plan.program): "loop" (a loop kernel), "rows" (a row kernel).
# The mma.sync skeletons run on both families; an sm_90a loop plan with a wgmma schedule (the
# rulebook's choice, plan.wgmma) runs the warp-specialized wgmma skeleton.
PROGRAM_EMITTERS: dict[tuple[str, str], str] = {
    ("sm80", "loop"): "common.loop:emit",
    ("sm90", "loop"): "sm90.loop:emit_loop",
    ("sm80", "rows"): "common.loop:emit",
    ("sm90", "rows"): "common.loop:emit",
    ("sm80", "loop_dag"): "common.loop_dag:emit",  # a loop over a DAG of gemms: mma.sync, both
    ("sm90", "loop_dag"): "sm90.loop_dag:emit",  # its sm_90a wgmma skeleton (plan.wgmma)
}


def _emitter(where: str) -> Emitter:
    """The function `module:function` of kgen.targets names."""
    module, function = where.split(":")
    return getattr(importlib.import_module(f".targets.{module}", __package__), function)


def family(plan: KernelPlan) -> str:
    """The emitter family the plan asks for: a plan on wgmma (ping-pong included: it needs
    wgmma; a loop or DAG loop plan with a wgmma schedule) is sm_90a code; otherwise its target's family
    (sm_90a runs the sm_80 mainloop)."""
    if is_program_plan(plan):
        wgmma = getattr(plan, "wgmma", None) is not None  # a loop or DAG loop's schedule
        return "sm90" if wgmma else target(plan.arch).emitter
    return "sm90" if plan.schedule.wgmma else target(plan.arch).emitter


def kind(plan: KernelPlan) -> str:
    if is_program_plan(plan):
        return plan.kind
    return "chain" if len(plan.gemms) > 1 else "gemm"


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    """The .cu text; byte-identical for the same plan, source and kgen version."""
    if not is_program_plan(plan) and not plan.gemms:
        raise KgenError(
            plan.loc, f"kernel '{plan.name}' has no gemm to emit; kgen inspect shows its storage plan")
    table = PROGRAM_EMITTERS if is_program_plan(plan) else EMITTERS
    emitter = _emitter(table[(family(plan), kind(plan))])
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command)


def emit_header(plan: KernelPlan, *, source_name: str, source_hash: str, command: str,
                header_name: str | None = None) -> str:
    """The .h text (`kgen compile --header`): the params struct and the host API's
    declarations, the same calls for every kind of kernel."""
    emitter = _emitter("common.loop:emit_header" if is_program_plan(plan)
                       else "common.host_api:emit_header")
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command,
                   header_name=header_name)
