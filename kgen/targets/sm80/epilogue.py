"""sm_80's reduction helpers (templates/sm80/reduce.cu.j2: a warp's partials through shared
memory, then to the output or the CTA's workspace slot). The epilogue loop that calls them is
shared with sm_90a's chains: kgen/targets/common/epilogue_loop.py."""
from __future__ import annotations

from ...plan import KernelPlan
from ..common.render import render


def helpers(plan: KernelPlan) -> str:
    return render("sm80/reduce.cu.j2") if plan.reductions else ""
