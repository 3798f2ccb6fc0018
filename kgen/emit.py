"""Emission: a KernelPlan to standalone CUDA C++, through one emitter per target family, and
the header that declares its host API (the same for every target)."""
from __future__ import annotations

from .errors import KgenError
from .plan import KernelPlan
from .targets import target
from .targets.common.host_api import emit_header
from .targets.sm80 import chain as sm80_chain, gemm as sm80_gemm

__all__ = ["EMITTERS", "emit", "emit_header"]

EMITTERS = {
    "sm80": sm80_gemm.emit,
}
# Kernels of chained gemms (back-to-back), per target family.
CHAIN_EMITTERS = {
    "sm80": sm80_chain.emit,
}


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    """The .cu text; byte-identical for the same plan, source and kgen version."""
    if not plan.gemms:
        raise KgenError(
            plan.kernel.loc,
            f"kernel '{plan.name}' has no gemm to emit; kgen inspect shows its storage plan",
        )
    table = CHAIN_EMITTERS if len(plan.gemms) > 1 else EMITTERS
    emitter = table[target(plan.arch).emitter]
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command)
