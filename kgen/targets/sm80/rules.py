"""The sm_80-class rulebook (sm_80, sm_86, sm_89): whether a kernel's schedule lines plan,
asked before lowering (kgen/targets/common/rules.py says in what order and from where). Beside
the shared rules, its own: the lines only a target with the copy engine runs."""
from __future__ import annotations

from .. import ScheduleDraft, Site
from ..common import rules as common
from . import schedules


def refusal(facts: common.Facts) -> common.Refusal | None:
    """The first rule that refuses the facts' schedule lines (None: they plan)."""
    return common.refusal(facts, request_refusal)


def request_refusal(draft: ScheduleDraft) -> common.Refusal | None:
    """The request refused on what the source alone shows: a kind only sm_90a has, then
    `split stream` and `cluster` (each runs on sm_90a's warp-specialized kernel)."""
    refused = common.requested(schedules.refuse_request(draft))
    if refused is not None:
        return refused
    arch = draft.target.arch.value
    if draft.stream_k:
        return common.Refusal("split stream needs target sm_90a (stream-K runs on the "
                              "cooperative wgmma kernel); this kernel is lowered for "
                              f"{arch}", Site("split", 0))
    if draft.cluster_written:  # verified for the kernel's target, lowered for this one
        return common.Refusal("cluster needs target sm_90a (thread-block clusters and the "
                              f"copy engine's multicast); this kernel is lowered for {arch}",
                              Site("cluster", 0))
    return None
