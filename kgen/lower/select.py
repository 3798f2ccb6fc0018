"""Selection: the one schedule a kernel runs with, among those its target lists
(kgen/targets/<arch>/schedules.py), each with its storage plan.

The source's request wins or is refused with its located reason: `schedule pingpong` asks for
PINGPONG and `keep ... resident` for PERSISTENT (B resident). Without one, the first legal
candidate in the target's order of preference is taken. A candidate whose buffers do not fit
the shared memory is only refused; the storage pass raises its budget message (the largest
buffers, what to change) only when the selected candidate, or the last one, does not fit.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .. import ir
from ..errors import KgenError, SourceLoc
from ..plan import LineChoice
from ..targets import Candidate, GemmDraft, Placement, ScheduleDraft, Site, Target, candidates
from ..targets import rules
from . import schedule, storage
from .mainloops import Mainloops

GROUP_M = 8  # CTA rasterization: 8 tile rows share the B tiles they stream through L2


def draft(kernel: ir.Kernel, tgt: Target, loops: Mainloops | None = None, *,
          persistent: bool | None = None) -> ScheduleDraft:
    """`loops`: the mainloop pass's plans (None: only the request can be checked yet)."""
    plans = loops.written if loops is not None else [None] * len(kernel.gemms)
    return ScheduleDraft(
        target=tgt,
        requested=schedule.requested(kernel),
        gemms=tuple(GemmDraft(g.name, (g.warps.m, g.warps.n), g.resident, g.keep, plan)
                    for g, plan in zip(kernel.gemms, plans)),
        declared_storage=kernel.storage is not None or bool(kernel.phases),
        allow_persistent=persistent is not False,
        group_m=GROUP_M,
        dtypes={p.name: p.dtype for p in kernel.params},
        batched=frozenset(p.name for p in kernel.params if p.batch is not None),
        split_k=kernel.gemms[0].split.count if kernel.gemms and kernel.gemms[0].split else 1,
        stream_k=bool(kernel.gemms) and kernel.gemms[0].split is not None
        and kernel.gemms[0].split.stream,
        cluster=_cluster(kernel),
        cluster_written=bool(kernel.gemms) and kernel.gemms[0].cluster is not None,
        mainloops=loops.plans if loops is not None else {},
        mma_sync_refusal=loops.mma_sync_refusal if loops is not None else None,
    )


def _cluster(kernel: ir.Kernel) -> tuple[int, int]:
    """The first gemm's `cluster MxN` (1x1 where the source leaves it out)."""
    c = kernel.gemms[0].cluster if kernel.gemms else None
    return (c.m, c.n) if c is not None else (1, 1)


def check_request(kernel: ir.Kernel, tgt: Target) -> None:
    """refused_request, raised."""
    refused = refused_request(kernel, tgt)
    if refused is not None:
        raise KgenError(locate(kernel, refused.site), refused.message)


def refused_request(kernel: ir.Kernel, tgt: Target) -> rules.Refusal | None:
    """The request refused on what the source alone shows, before the mainloop pass (the
    target's rulebook, kgen/targets/<arch>/rules.py `request_refusal`), or None."""
    return rules.rulebook(tgt).request_refusal(draft(kernel, tgt))


def listed(kernel: ir.Kernel, tgt: Target, loops: Mainloops, *,
           persistent: bool | None = None) -> list[Candidate]:
    """The target's candidates for the kernel, each placed in shared memory."""
    return placed(kernel, tgt, draft(kernel, tgt, loops, persistent=persistent))[0]


def placed(kernel: ir.Kernel, tgt: Target,
           schedule_draft: ScheduleDraft) -> tuple[list[Candidate], dict[int, tuple]]:
    """The target's candidates, each trial placement they yield placed by the storage pass
    (over the budget without raising); and per storage plan (by id) itself and its
    Placement."""
    trials: dict[int, tuple] = {}
    budget_loc = storage.budget_loc(kernel)
    run = candidates(schedule_draft)
    try:
        request = next(run)
        while True:
            plan = storage.run(kernel, list(request.gemms), tgt, budget_loc, check_budget=False,
                               **request.options)
            trials[id(plan)] = (plan, request)
            request = run.send(plan)
    except StopIteration as done:
        return done.value, trials


@dataclass(frozen=True, slots=True)
class Filled:
    """The schedule lines the builder filled (kgen/lower/builder.py) and the configurations it
    tried before, refused (label, reason): the schedule's record of them (Schedule.chosen,
    Schedule.untaken)."""

    chosen: tuple[LineChoice, ...]
    untaken: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True)
class Selected:
    """The schedule pass's part: the selected candidate (its schedule noting the candidates
    before it) and what it asks of the storage pass."""

    candidate: Candidate
    placement: Placement


def select(kernel: ir.Kernel, tgt: Target, loops: Mainloops, *,
           persistent: bool | None = None, filled: Filled | None = None) -> Selected:
    """The selected candidate, its schedule noting the candidates before it and the lines the
    builder `filled`, as the selected gemms run them (as_run): legal, or refused only for its
    shared memory (then the storage pass raises the budget's message). Each candidate weighs
    its storage by trial placements (targets.Placement: it yields them, `placed` places them,
    never raising the budget's error)."""
    listed, trials = placed(kernel, tgt, draft(kernel, tgt, loops, persistent=persistent))
    chosen = rules.chosen(listed, schedule.requested(kernel))
    if not chosen.legal and not chosen.over_budget:
        raise KgenError(locate(kernel, chosen.site), chosen.reason)
    plan, placement = trials[id(chosen.storage)]
    assert plan is chosen.storage
    if not chosen.legal:  # the storage pass raises the budget's message
        return Selected(chosen, placement)
    before = listed[:listed.index(chosen)]
    rejected = tuple((c.kind, c.reason) for c in before)
    record = dict(chosen=as_run(filled.chosen, chosen.gemms),
                  untaken=filled.untaken) if filled is not None else {}
    return Selected(dataclasses.replace(
        chosen, schedule=dataclasses.replace(chosen.schedule, rejected=rejected, **record)),
        placement)


def as_run(chosen: tuple[LineChoice, ...], gemms) -> tuple[LineChoice, ...]:
    """The filled lines as the plan runs them: a `warps` line names the warps of the plan's
    gemm (the warp-specialized kernels take the 8 math warps of a configuration's `warps 2x4`
    as 8x1, or a ping-pong consumer's 4x1), so `kgen inspect`'s line and its gemms table agree,
    and the line, written back, plans the same kernel."""
    warps = {f"{g.name} warps": f"{g.warps[0]}x{g.warps[1]}" for g in gemms}
    return tuple(dataclasses.replace(c, value=warps.get(c.line, c.value)) for c in chosen)


def locate(kernel: ir.Kernel, site: Site | None) -> SourceLoc:
    """The source location a refusal points at."""
    if site is None or site.what == "schedule":
        return kernel.schedule_loc if site is not None else kernel.loc
    if site.what == "budget":  # a refusal that quotes another kernel kind's shared memory
        return storage.budget_loc(kernel)
    g = kernel.gemms[site.gemm]
    return {"gemm": g.loc, "resident": g.resident_loc or g.loc, "warps": g.warps.loc,
            "tile": g.tile.loc, "stages": g.stages.loc,
            "split": g.split.loc if g.split is not None else g.loc,
            "cluster": g.cluster.loc if g.cluster is not None else g.loc}[site.what]
