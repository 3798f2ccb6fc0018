"""Emission: a KernelPlan to standalone CUDA C++, through one emitter per target family."""
from __future__ import annotations

from ..plan import KernelPlan
from ..targets import target
from . import sm80

EMITTERS = {
    "sm80": sm80.emit,
}


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    """The .cu text; byte-identical for the same plan, source and kgen version."""
    emitter = EMITTERS[target(plan.arch).emitter]
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command)
