"""The schedules an sm_80-class target (sm_80, sm_86, sm_89) runs a kernel with, in its order of
preference: persistent, then tiled (their rules are kgen/targets/common/schedules.py's). A
schedule line asking for a kind only sm_90a has is refused with its reason."""
from __future__ import annotations

from typing import Generator

from ...plan import KernelKind, StoragePlan
from .. import Candidate, Placement, ScheduleDraft
from ..common import schedules as common


def candidates(draft: ScheduleDraft) -> Generator[Placement, StoragePlan, list[Candidate]]:
    return [*common.sm90_only(draft), (yield from common.persistent(draft)),
            (yield from common.tiled(draft))]


def producer_threads(kind: KernelKind | None) -> int | None:
    return None


def refuse_request(draft: ScheduleDraft) -> Candidate | None:
    """A schedule line this target cannot run, refused with its reason (None: none asked)."""
    return common.refuse_request(draft)


def consumer_grid(kind: KernelKind, tile: tuple[int, int, int]) -> None:
    """No kind of this target has consumer warps of its own: every gemm runs the source's grid."""
    return None
