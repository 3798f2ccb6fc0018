"""The sm_80-class rulebook (sm_80, sm_86, sm_89): whether a kernel's schedule lines plan,
asked before lowering (kgen/targets/rules.py says in what order and from where), with this
target's request rule (schedules.refuse_request: a kind only sm_90a has is refused); the lines
only a target with the copy engine runs are refused by the shared request rule."""
from __future__ import annotations

from .. import ScheduleDraft, rules
from . import schedules


def refusal(facts: rules.Facts) -> rules.Refusal | None:
    """The first rule that refuses the facts' schedule lines (None: they plan)."""
    return rules.refusal(facts, request_refusal)


def request_refusal(draft: ScheduleDraft) -> rules.Refusal | None:
    """The request refused on what the source alone shows (rules.request_refusal)."""
    return rules.request_refusal(draft, schedules.refuse_request)
