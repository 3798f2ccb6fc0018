"""No silent slow path: the written schedule lines that make a target with wgmma (sm_90a) plan a
slower path than it plans without them, found by planning the kernel without them.

The paths, slowest first (`rank`): the mma.sync kernels of sm_80 (one CTA per tile, then the
persistent chain), a chain with some gemms on wgmma, the resident wgmma chain (every thread
copies A by cp.async), the warp-specialized kernels (a producer warpgroup fills a ring for
consumer warpgroups on wgmma: cooperative and ping-pong for one gemm, the ping-pong chain). This
is the order in which the target's configurations list them (kgen/targets/sm90/configs.py), each
measured faster than the next (bench/RESULTS.md).

`check` compares the plan with the plan of the kernel without any written line (the builder
fills them all). Where that is a faster path, the lines to blame are found one at a time: each
written line, in source order, is put back beside those already back, and stays back where the
plan keeps the faster path; the lines that do not are the ones the warning names. The plans are
the builder's default (no tuned configuration), so the answer depends on the source alone.
"""
from __future__ import annotations

from typing import Callable

from .. import ir
from ..diagnostics import at_line
from ..errors import KgenWarning
from ..plan import KernelPlan, Mma, Schedule
from ..targets import Instruction, Target
from . import builder


def rank(schedule: Schedule) -> tuple[int, bool, bool]:
    """How fast a path is, as the target orders them: gemms on wgmma, then a producer warp
    role (warp specialization), then persistent CTAs."""
    wgmma = sum(g.atom.instruction not in (Mma.MMA_SYNC, Mma.MMA_SYNC_FP8)
                for g in schedule.gemms)
    return wgmma, schedule.warps.role("producer") is not None, schedule.scheduler.persistent


def path(schedule: Schedule) -> str:
    """A path in words, for the warning."""
    n = len(schedule.gemms)
    wgmma, specialized, persistent = rank(schedule)
    if specialized and n == 1:
        return f"the warp-specialized wgmma kernel ({schedule.scheduler.kind.value})"
    if specialized:
        return ("the ping-pong wgmma chain (warp-specialized: a producer warpgroup fills a ring "
                "for two consumer warpgroups)")
    if wgmma == n:
        return "the resident wgmma chain (no producer warps: every thread copies A by cp.async)"
    if wgmma:
        return f"the {schedule.scheduler.kind.value} chain with {wgmma} of its {n} gemms on wgmma"
    if persistent:
        return "the persistent mma.sync chain (the sm_80 path)"
    return "the mma.sync kernel (the sm_80 path: one CTA per tile, cp.async stages)"


def check(kernel: ir.Kernel, tgt: Target, plan: KernelPlan,
          lower_one: Callable[[ir.Kernel], KernelPlan]) -> KgenWarning | None:
    """The warning for the written lines that put `plan` (the kernel's default plan) on a slower
    path than the kernel without them (`lower_one` plans a kernel the builder's way), or None.
    Only on a target with wgmma; nothing is planned again where `plan` is on the fastest path
    or no line is written."""
    lines = builder.written(kernel)
    top = (len(plan.gemms), True, True)
    if not tgt.has(Instruction.WGMMA) or not lines or rank(plan.schedule) == top:
        return None
    best = builder.tried(builder.free(kernel), tgt, lower_one)
    if best is None or rank(best.schedule) <= rank(plan.schedule):
        return None
    goal = rank(best.schedule)
    kept: list[builder.WrittenLine] = []
    forcing: list[builder.WrittenLine] = []
    for line in lines:
        left_out = [w for w in lines if w is not line and w not in kept]
        trial = builder.tried(builder.without(kernel, left_out), tgt, lower_one)
        if trial is not None and rank(trial.schedule) >= goal:
            kept.append(line)
            best = trial
        else:
            forcing.append(line)
    if not forcing:  # every line back is the kernel itself: `plan` was not its default plan
        return None
    first = forcing[0]
    named = [_named(kernel, line, first) for line in forcing]
    listing = named[0] if len(named) == 1 else ", ".join(named[:-1]) + " and " + named[-1]
    them, verb = ("them", "force") if len(forcing) > 1 else ("it", "forces")
    return KgenWarning(first.loc, (
        f"{listing} {verb} {path(plan.schedule)} on {tgt.arch.value}; without {them}, kgen "
        f"plans {path(best.schedule)}, a faster path (delete {them}; `kgen inspect` shows why "
        "each faster kernel is refused)"))


def _named(kernel: ir.Kernel, line: builder.WrittenLine, first: builder.WrittenLine) -> str:
    """`tile 128x128x32`, with its gemm in a chain and its line where it is not the first's
    (`keep` has no location of its own: its gemm names it)."""
    text = f"`{line.text}`"
    if line.gemm is not None and len(kernel.gemms) > 1:
        text += f" of {kernel.gemms[line.gemm].name}"
    if line.loc.line != first.loc.line and line.what != "keep":
        text += at_line(line.loc)
    return text
