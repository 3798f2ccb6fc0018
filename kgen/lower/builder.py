"""The builder: kgen fills the schedule lines a source leaves out, as CUTLASS's CollectiveBuilder
does from dtypes, layouts and the target's limits.

Every schedule line is optional: `tile`, `warps`, `stages`, `keep registers|smem`, `keep B
resident`, `split`, `cluster` in a gemm, `schedule` in the kernel. The target lists configurations for the
kernel's gemms, best first (kgen/targets/<arch>/configs.py, from the gemms' dtypes, layouts and
fixed sizes); the builder fills each one into the lines the source left out, never into a line it
wrote, and asks the target's rulebook (kgen/targets/<arch>/rules.py `refusal`) before lowering:
the first configuration it allows is lowered, and the lowering's errors are not caught. A line
the source writes therefore always wins; if the rulebook refuses every configuration around it,
the first configuration's refusal is raised, located at the line that stops it. The plan's
Schedule keeps each filled line and why (`Schedule.chosen`) and each refused configuration with
the rulebook's reason (`Schedule.untaken`), which `kgen inspect` shows.

A tuner (`kgen tune`) takes the same list, longer (`wide`), and times what plans; its winner
comes back as `config=` and is tried first.
"""
from __future__ import annotations

import dataclasses
from typing import Callable, Mapping

from .. import ir, targets
from ..errors import KgenError, SourceLoc
from ..plan import KernelKind, KernelPlan, LineChoice
from ..targets import (Candidate, Config, GemmConfig, GemmShape, Instruction, Mainloop, Site,
                       Target, configs)
from ..targets import rules
from . import abi, chain, schedule, select, storage
from . import mainloops as loops
from .epilogue import stores_one_16bit_tensor

WHY_TUNED = "tuned:"  # how the why of each line of a tuned configuration starts
_SCHEDULES = {KernelKind.PINGPONG: ir.Schedule.PINGPONG,
              KernelKind.COOPERATIVE: ir.Schedule.COOPERATIVE}


def complete(kernel: ir.Kernel) -> bool:
    """True if the source writes every line the mainloop needs (tile, warps, stages)."""
    return all(g.tile is not None and g.warps is not None and g.stages is not None
               for g in kernel.gemms)


def shapes(kernel: ir.Kernel) -> tuple[GemmShape, ...]:
    """The gemms as the targets' configuration lists see them."""
    out = []
    first_a = kernel.param(kernel.gemms[0].a.name) if kernel.gemms else None
    for g in kernel.gemms:
        a, b = kernel.param(g.a.name), kernel.param(g.b.name)
        stored = [kernel.param(s.target) for s in g.epilogue.stmts if isinstance(s, ir.Store)]
        out.append(GemmShape(
            name=g.name, m=first_a.shape[0], n=b.shape[1], k=b.shape[0], dtype=b.dtype,
            k_major=(a is None or a.layout is ir.Layout.ROW, b.layout is ir.Layout.COL),
            chained=a is None,
            reductions=bool(g.epilogue.reductions),
            fused=not all(isinstance(s, ir.Store) and isinstance(s.value, ir.Acc)
                          for s in g.epilogue.stmts),
            pairs=not stores_one_16bit_tensor(kernel, g.epilogue),
            row_out=all(p is not None and p.layout is ir.Layout.ROW for p in stored)))
    return tuple(out)


@dataclasses.dataclass(frozen=True, slots=True)
class WrittenLine:
    """A schedule line the source writes: in gemm number `gemm` (None: the kernel's
    `schedule`), which one (`what`: tile, warps, stages, keep, resident, split, cluster,
    schedule), as DSL text, and where (`keep` has no location of its own: its gemm's)."""

    gemm: int | None
    what: str
    text: str
    loc: SourceLoc


def written(kernel: ir.Kernel) -> tuple[WrittenLine, ...]:
    """The schedule lines the source writes, in source order."""
    out = []
    if kernel.schedule is not None:
        out.append(WrittenLine(None, "schedule", f"schedule {kernel.schedule.value}",
                               kernel.schedule_loc))
    for i, g in enumerate(kernel.gemms):
        texts = _gemm_lines(g.a.name, g.b.name, g.tile and (g.tile.m, g.tile.n, g.tile.k),
                            g.warps and (g.warps.m, g.warps.n), g.stages and g.stages.count,
                            g.keep, g.resident, g.split and g.split.count,
                            g.split is not None and g.split.stream,
                            g.cluster and (g.cluster.m, g.cluster.n))
        locs = {"tile": g.tile, "warps": g.warps, "stages": g.stages, "split": g.split,
                "cluster": g.cluster}
        for what, text in texts.items():
            loc = g.resident_loc if what == "resident" else getattr(locs.get(what), "loc", None)
            out.append(WrittenLine(i, what, text, loc or g.loc))
    return tuple(sorted(out, key=lambda line: (line.loc.line, line.loc.col)))


def without(kernel: ir.Kernel, lines) -> ir.Kernel:
    """The kernel with these written lines left out (to the builder)."""
    cleared = {"tile": None, "warps": None, "stages": None, "keep": None, "split": None,
               "cluster": None}
    gemms = list(kernel.gemms)
    schedule = kernel.schedule
    for line in lines:
        if line.gemm is None:
            schedule = None
        elif line.what == "resident":
            gemms[line.gemm] = dataclasses.replace(gemms[line.gemm], resident=False,
                                                   resident_loc=None)
        else:
            gemms[line.gemm] = dataclasses.replace(gemms[line.gemm],
                                                   **{line.what: cleared[line.what]})
    return dataclasses.replace(kernel, gemms=tuple(gemms), schedule=schedule)


def free(kernel: ir.Kernel) -> ir.Kernel:
    """The kernel with every schedule line left out: tile, warps, stages, keep, resident,
    split, cluster in each gemm, and the kernel's schedule."""
    gemms = tuple(dataclasses.replace(g, tile=None, warps=None, stages=None, keep=None,
                                      resident=False, resident_loc=None, split=None,
                                      cluster=None)
                  for g in kernel.gemms)
    return dataclasses.replace(kernel, gemms=gemms, schedule=None)


def _gemm_lines(a: str, b: str, tile, warps, stages, keep, resident: bool, split, stream: bool,
                cluster) -> dict[str, str]:
    """A gemm's schedule lines as DSL text, those it has (None, False, a split of 1 and a
    cluster of 1x1 are lines left out)."""
    texts = {"tile": tile and f"tile {'x'.join(map(str, tile))}",
             "warps": warps and f"warps {warps[0]}x{warps[1]}",
             "stages": stages and f"stages {stages}",
             "keep": keep and f"keep {a} in {keep.value}",
             "resident": resident and f"keep {b} resident",
             "split": "split stream" if stream else split and split > 1 and f"split {split}",
             "cluster": cluster and cluster != (1, 1) and f"cluster {cluster[0]}x{cluster[1]}"}
    return {what: text for what, text in texts.items() if text}


def overridden(kernel: ir.Kernel, config: Config) -> tuple[WrittenLine, ...]:
    """The written lines where `config` would write another value, or none: the kernel the
    configuration fills is then not the one its why describes. A configuration without a
    `schedule` describes the target's preference: on sm_90a, the cooperative kernel, the one
    kind a written `schedule cooperative` plans."""
    described = (ir.Schedule.COOPERATIVE if config.schedule is None
                 else _SCHEDULES.get(config.schedule))
    own = {None: {"schedule": f"schedule {described.value}" if described else ""}}
    for i, (g, c) in enumerate(zip(kernel.gemms, config.gemms)):
        own[i] = _gemm_lines(g.a.name, g.b.name, c.tile, c.warps, c.stages, c.keep, c.resident,
                             c.split, c.stream, c.cluster)
    return tuple(line for line in written(kernel) if own[line.gemm].get(line.what) != line.text)


def _beside(lines: tuple[WrittenLine, ...]) -> str:
    return ", ".join(f"`{line.text}`" for line in lines)


def fill(kernel: ir.Kernel, config: Config) -> tuple[ir.Kernel, tuple[LineChoice, ...]]:
    """The kernel with `config` in every schedule line it leaves out, and those lines. Where
    the source writes a line other than the configuration's (`overridden`), the
    configuration's why (which describes its own kernel) gives way to one that says so."""
    chosen: list[LineChoice] = []
    gemms = []
    why = config.why
    if differing := overridden(kernel, config):
        why = ("the first of the target's configurations that plans beside the written lines "
               f"({_beside(differing)})")
    for g, c in zip(kernel.gemms, config.gemms):
        gemms.append(_fill_gemm(g, c, why, chosen))
    kernel = dataclasses.replace(kernel, gemms=tuple(gemms))
    if kernel.schedule is None and config.schedule is not None:
        kernel = dataclasses.replace(kernel, schedule=_SCHEDULES[config.schedule],
                                     schedule_loc=kernel.loc)
        chosen.insert(0, LineChoice("schedule", config.schedule.value, config.why))
    return kernel, tuple(chosen)


def _fill_gemm(g: ir.Gemm, c: GemmConfig, why: str, chosen: list[LineChoice]) -> ir.Gemm:
    changes: dict = {}

    def take(line: str, value, text: str) -> None:
        changes[line] = value
        chosen.append(LineChoice(f"{g.name} {line}", text, why))

    if g.tile is None:
        take("tile", ir.TileShape(*c.tile, loc=g.loc), "x".join(map(str, c.tile)))
    if g.warps is None:
        take("warps", ir.WarpGrid(*c.warps, loc=g.loc), f"{c.warps[0]}x{c.warps[1]}")
    if g.stages is None:
        take("stages", ir.StageCount(c.stages, loc=g.loc), str(c.stages))
    if g.keep is None and c.keep is not None:
        take("keep", c.keep, f"keep {g.a.name} in {c.keep.value}")
    if not g.resident and c.resident:
        take("resident", True, f"keep {g.b.name} resident")
        changes["resident_loc"] = g.loc
    if g.split is None and c.split > 1:
        take("split", ir.SplitK(c.split, loc=g.loc), f"split {c.split}")
    if g.split is None and c.stream:
        take("split", ir.SplitK(1, loc=g.loc, stream=True), "split stream")
    if g.cluster is None and c.cluster != (1, 1):
        take("cluster", ir.ClusterShape(*c.cluster, loc=g.loc), f"{c.cluster[0]}x{c.cluster[1]}")
    return dataclasses.replace(g, **changes)


def listed(kernel: ir.Kernel, tgt: Target, *, sizes: Mapping[str, int] | None = None,
           wide: bool = False) -> list[tuple[Config, ir.Kernel, tuple[LineChoice, ...]]]:
    """The target's configurations filled into the kernel, without repeats (two configurations
    may fill the same kernel where the source writes the lines they differ in)."""
    seen = set()
    out = []
    for config in configs(tgt, shapes(kernel), sizes=sizes, wide=wide,
                          fits=lambda c: staging_fits(kernel, tgt, c)):
        filled, chosen = fill(kernel, config)
        key = (filled.gemms, filled.schedule)
        if key not in seen:
            seen.add(key)
            out.append((config, filled, chosen))
    return out


def staging_fits(kernel: ir.Kernel, tgt: Target, config: Config) -> bool:
    """Whether the kernel's ping-pong chain on `config`'s lines alone (the configuration's own
    kernel: the written lines left out) stages its output beside its ring and resident B tiles
    within the target's shared memory: the storage planner places the staging trial
    (kgen/targets/sm90/schedules.py staging_placement), the one accounting. False where the
    chain has no staging, or its rules refuse the lines before the schedule."""
    filled = fill(free(kernel), config)[0]
    if chain.refusal(filled) is not None or select.refused_request(filled, tgt) is not None:
        return False
    planned = loops.plan(filled, tgt, schedule.requested(filled))
    if isinstance(planned, rules.Refusal) or Mainloop.RESIDENT not in planned.plans:
        return False
    placement = rules.rulebook(tgt).staging_placement(select.draft(filled, tgt, planned))
    return placement is not None and storage.budget_refusal(filled, tgt, placement) is None


def sized(kernel: ir.Kernel, tgt: Target, sizes: Mapping[str, int]) -> Config | None:
    """The target's configuration for these runtime sizes (kgen/targets/sm90/configs.py's
    `sized`), where the kernel leaves its schedule lines to kgen (`sizable`); None where the
    default serves them. With no runtime sizes, that of a kernel whose source fixes every size
    (`build` plans it so), else None."""
    if not sizable(kernel, tgt):
        return None
    batch = next((p.batch for p in kernel.params if p.batch is not None), None)
    batches = 1 if batch is None else batch if isinstance(batch, int) else sizes.get(batch)
    if batches is None:
        return None
    return targets.sized(tgt, shapes(kernel), sizes, batches)


def sizable(kernel: ir.Kernel, tgt: Target) -> bool:
    """Whether runtime sizes may change the kernel's schedule (`sized` may return one)."""
    return unsized_reason(kernel, tgt) is None


def unsized_reason(kernel: ir.Kernel, tgt: Target) -> str | None:
    """Why runtime sizes cannot change the kernel's schedule, or None where they may."""
    if not tgt.has(Instruction.WGMMA):
        return f"the runtime sizes choose schedules on sm_90a only, not {tgt.arch.value}"
    if len(kernel.gemms) != 1:
        return "the runtime sizes choose the schedule of a kernel of one gemm, not of a chain"
    if kernel.schedule is not None or not _free(kernel.gemms[0]):
        return "the kernel writes its schedule lines, and a line the user writes wins"
    if kernel.gemms[0].epilogue.reductions:
        return ("the runtime sizes choose no schedule for epilogue reductions (their split-K "
                "and tiles were not measured against the default)")
    return None


def _free(g: ir.Gemm) -> bool:
    """No schedule line written: tile, warps, stages, keep, resident, split, cluster."""
    return (g.tile is None and g.warps is None and g.stages is None and g.keep is None
            and not g.resident and g.split is None and g.cluster is None)


def as_run(chosen: tuple[LineChoice, ...], plan: KernelPlan) -> tuple[LineChoice, ...]:
    """The filled lines as `plan` runs them (select.as_run)."""
    return select.as_run(chosen, plan.gemms)


def facts(kernel: ir.Kernel, tgt: Target, persistent: bool | None = None) -> rules.Facts:
    """What the target's rulebook weighs for a kernel whose every schedule line is written or
    filled: the lowering's planners, each answering with its refusal instead of raising it
    (kgen/targets/rules.py), each run at most once."""
    made: dict[str, object] = {}

    def mainloops() -> rules.Refusal | None:
        made["loops"] = planned = loops.plan(kernel, tgt, schedule.requested(kernel))
        return planned if isinstance(planned, rules.Refusal) else None

    def candidates() -> list[Candidate]:
        draft = select.draft(kernel, tgt, made["loops"], persistent=persistent)
        listed, made["trials"] = select.placed(kernel, tgt, draft)
        return listed

    def budget(candidate: Candidate) -> rules.Refusal:
        _, placement = made["trials"][id(candidate.storage)]
        return rules.Refusal(storage.budget_refusal(kernel, tgt, placement), Site("budget"))

    def interface(candidate: Candidate) -> rules.Refusal | None:
        return abi.refusal(kernel, **abi.of_schedule(kernel, made["loops"].written, candidate))

    return rules.Facts(tgt, select.draft(kernel, tgt), lambda: chain.refusal(kernel),
                       mainloops, candidates, budget, interface)


def refusal(kernel: ir.Kernel, tgt: Target,
            persistent: bool | None = None) -> tuple[SourceLoc, str] | None:
    """Where and why the target's rulebook refuses a kernel whose every schedule line is
    written or filled (kgen/targets/<arch>/rules.py), or None: it plans."""
    refused = rules.rulebook(tgt).refusal(facts(kernel, tgt, persistent))
    if refused is None:
        return None
    return refused.loc or select.locate(kernel, refused.site), refused.message


@dataclasses.dataclass(frozen=True, slots=True)
class Choice:
    """The builder's choice: the kernel with the first legal configuration filled in, the lines
    it filled and the configurations refused before it (select.Filled: Schedule.chosen and
    untaken); `kernel` None where the rulebook refuses every one, `refusal` then the first
    one's (located)."""

    kernel: ir.Kernel | None
    filled: select.Filled
    refusal: tuple[SourceLoc, str] | None = None
    tries: int = 0


def choose(kernel: ir.Kernel, tgt: Target, *, config: Config | None = None,
           persistent: bool | None = None) -> Choice:
    """The first listed configuration the target's rulebook allows (`config`, a tuned one,
    asked first; without one, the sized one of a kernel whose source fixes every size), each
    refused one recorded with its reason; nothing is lowered."""
    tries = listed(kernel, tgt)
    config = config or sized(kernel, tgt, {})
    if config is not None:
        tries.insert(0, (config, *fill(kernel, config)))
    first: tuple[SourceLoc, str] | None = None
    refused: list[tuple[str, str]] = []
    for cfg, filled, chosen in tries:
        if cfg is config:  # a tuned configuration, or the one the runtime sizes call for
            why = (config.why if config.why.startswith(targets.WHY_SIZED)
                   else WHY_TUNED + " the fastest `kgen tune` timed")
            chosen = tuple(dataclasses.replace(c, why=why) for c in chosen)
        stop = refusal(filled, tgt, persistent)
        if stop is None:
            return Choice(filled, select.Filled(chosen, tuple(refused)))
        first = first or stop
        differing = overridden(kernel, cfg)  # the label names the configuration's lines
        refused.append((cfg.label, f"beside the written {_beside(differing)}: {stop[1]}"
                        if differing else stop[1]))
    assert first is not None, "every target lists at least one configuration"
    return Choice(None, select.Filled((), tuple(refused)), first, len(tries))


def refused_error(choice: Choice) -> KgenError:
    """The error for a choice the rulebook refused every configuration of: the first one's
    refusal, located at the line that stops it, which says how many were tried where their
    reasons differ."""
    loc, message = choice.refusal
    if len({reason for _, reason in choice.filled.untaken}) == 1:  # kgen's choices do not matter
        return KgenError(loc, message)
    return KgenError(loc, f"{message} (kgen tried {choice.tries} configurations for the schedule "
                     "lines this kernel leaves out; none plans)")


def tried(kernel: ir.Kernel, tgt: Target,
          lower_one: Callable[[ir.Kernel], KernelPlan]) -> KernelPlan | None:
    """The plan of `kernel` as lower() plans it (its written lines, each one left out filled by
    the builder's choice), or None where the target's rulebook refuses it: for the slow-path
    check (kgen/lower/slow_path.py), which plans the kernel with written lines left out, as
    the builder fills configurations. `lower_one` lowers the complete kernel (the builder's
    choice filled in: the same plan, without the record of the lines filled); the lowering's
    errors are not caught."""
    if complete(kernel):
        return lower_one(kernel) if refusal(kernel, tgt) is None else None
    choice = choose(kernel, tgt)
    return None if choice.kernel is None else lower_one(choice.kernel)


def build(kernel: ir.Kernel, tgt: Target,
          lower_one: Callable[[ir.Kernel, select.Filled], KernelPlan], *,
          config: Config | None = None,
          persistent: bool | None = None) -> tuple[ir.Kernel, KernelPlan]:
    """The kernel with the first configuration the target's rulebook allows filled in
    (`choose`), and its plan, whose schedule keeps the filled lines (lower_one(kernel, the
    lines filled)); the lowering's errors are not caught. Raises the first configuration's
    refusal when the rulebook refuses them all."""
    choice = choose(kernel, tgt, config=config, persistent=persistent)
    if choice.kernel is None:
        raise refused_error(choice)
    return choice.kernel, lower_one(choice.kernel, choice.filled)
