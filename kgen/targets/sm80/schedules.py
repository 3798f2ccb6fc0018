"""The schedules an sm_80-class target (sm_80, sm_86, sm_89) runs a kernel with, in its order of
preference: persistent, then tiled (their rules are kgen/targets/common/schedules.py's). A
schedule line asking for a kind only sm_90a has is refused with its reason, and so is every
kind of an FP8 gemm with block scales (kgen/targets/sm80/fp8.py: sm_90a's promotion step)."""
from __future__ import annotations

from typing import Generator

from ...plan import KernelKind, StoragePlan
from .. import Candidate, Placement, ScheduleDraft, Site, rules
from ..common import schedules as common


def candidates(draft: ScheduleDraft) -> Generator[Placement, StoragePlan, list[Candidate]]:
    listed = [*common.sm90_only(draft), (yield from common.persistent(draft)),
              (yield from common.tiled(draft))]
    if any(g.plan is not None and g.plan.scales for g in draft.gemms):
        # verified for sm_90a, lowered for this target: its mainloop has no promotion step
        reason = rules.FP8_BLOCK_SCALES.format(arch=draft.target.arch.value)
        return [Candidate(c.kind, False, reason, Site("gemm", 0)) for c in listed]
    return listed


def producer_threads(kind: KernelKind | None) -> int | None:
    return None


def refuse_request(draft: ScheduleDraft) -> Candidate | None:
    """A schedule line this target cannot run, refused with its reason (None: none asked)."""
    return common.refuse_request(draft)


def consumer_grid(kind: KernelKind, tile: tuple[int, int, int]) -> None:
    """No kind of this target has consumer warps of its own: every gemm runs the source's grid."""
    return None
