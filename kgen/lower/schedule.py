"""Schedule requests: `schedule pingpong` and `keep ... resident` as the kind of schedule they
ask for. The rules and numbers of each schedule are the target's
(kgen/targets/<arch>/schedules.py); kgen/lower/select.py picks one.
"""
from __future__ import annotations

from .. import ir
from ..plan import KernelKind


def requested(kernel: ir.Kernel) -> KernelKind | None:
    """The kind of schedule the source asks for: `schedule pingpong`, or `keep B resident`
    (which only a persistent kernel has); None lets the target's preference decide."""
    if kernel.schedule is ir.Schedule.PINGPONG:
        return KernelKind.PINGPONG
    if kernel.schedule is ir.Schedule.COOPERATIVE:
        return KernelKind.COOPERATIVE
    if any(g.resident for g in kernel.gemms):
        return KernelKind.PERSISTENT
    return None
