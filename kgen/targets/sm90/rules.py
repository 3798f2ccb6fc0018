"""The sm_90a rulebook: whether a kernel's schedule lines plan, asked before lowering
(kgen/targets/common/rules.py says in what order and from where). Its request rules are its
schedules' (the ping-pong chain's rules on what the source alone shows); `split stream` and
`cluster` run here, on the warp-specialized kernel, whose candidates weigh them."""
from __future__ import annotations

from .. import ScheduleDraft
from ..common import rules as common
from . import schedules


def refusal(facts: common.Facts) -> common.Refusal | None:
    """The first rule that refuses the facts' schedule lines (None: they plan)."""
    return common.refusal(facts, request_refusal)


def request_refusal(draft: ScheduleDraft) -> common.Refusal | None:
    """The request refused on what the source alone shows (schedules.refuse_request)."""
    return common.requested(schedules.refuse_request(draft))
