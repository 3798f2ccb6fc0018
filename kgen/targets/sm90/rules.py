"""The sm_90a rulebook: whether a kernel's schedule lines plan, asked before lowering
(kgen/targets/rules.py says in what order and from where), with this target's request rule
(schedules.refuse_request: the ping-pong chain's rules on what the source alone shows);
`split stream` and `cluster` run here, on the warp-specialized kernel, whose candidates weigh
them. The builder also asks it where a chain's output staging would sit
(`staging_placement`), to order the chain's ring depths by the storage planner's answer."""
from __future__ import annotations

from .. import Placement, ScheduleDraft, rules
from . import schedules


def refusal(facts: rules.Facts) -> rules.Refusal | None:
    """The first rule that refuses the facts' schedule lines (None: they plan)."""
    return rules.refusal(facts, request_refusal)


def request_refusal(draft: ScheduleDraft) -> rules.Refusal | None:
    """The request refused on what the source alone shows (rules.request_refusal)."""
    return rules.request_refusal(draft, schedules.refuse_request)


def staging_placement(draft: ScheduleDraft) -> Placement | None:
    """The trial placement of a ping-pong chain's output staging (schedules.staging_placement),
    whose fit the storage planner weighs for the builder (kgen/lower/builder.py staging_fits)."""
    return schedules.staging_placement(draft)
