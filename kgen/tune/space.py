"""The search space of `kgen tune`: the target's configurations filled into the schedule lines a
kernel leaves out (kgen/lower/builder.py's `listed`, the tuner's wide list, with the runtime sizes
so that split-K joins where the output tiles leave SMs idle; on sm_90a the warp-specialized
configurations also with clusters 2x1 and 1x2), each lowered and emitted.

A configuration that does not plan is skipped with the lowering's reason; one whose emitted
source equals an earlier one's (two configurations that differ only in lines the source writes,
or a `schedule` request the target takes anyway) is skipped as a duplicate. The builder's own
choice (what `kgen run` plans without a tune entry) is always a candidate, so the winner is at
worst that. `all_lines` frees every schedule line first: the tuner then searches the lines the
source writes too.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .. import ir
from ..emit import emit
from ..errors import KgenError
from ..lower import builder, lower
from ..plan import KernelKind, KernelPlan, LineChoice
from ..targets import Config, GemmConfig, target

DEFAULT_LIMIT = 50


@dataclass(frozen=True, slots=True)
class Candidate:
    """One configuration that plans: the kernel with it filled in, its plan and .cu."""

    index: int  # its place in the target's list, best first
    config: Config
    lines: tuple[LineChoice, ...]  # the schedule lines it fills
    kernel: ir.Kernel
    plan: KernelPlan
    source: str
    default: bool = False  # the builder's own choice

    @property
    def label(self) -> str:
        """Every schedule line the kernel runs with, written or filled (`config.label` names
        only what the configuration would fill)."""
        return applied(self.kernel).label

    @property
    def line_values(self) -> tuple[tuple[str, str], ...]:
        return tuple((c.line, c.value) for c in self.lines)


@dataclass(frozen=True, slots=True)
class Skipped:
    """A configuration left out, at which step and why."""

    label: str
    step: str  # "plan", "duplicate", "limit", "compile", "resources", "run", "check"
    reason: str


@dataclass(frozen=True, slots=True)
class Space:
    kernel: ir.Kernel  # the kernel the configurations fill (every line freed with all_lines)
    arch: ir.Arch
    listed: int  # configurations the target listed (distinct filled kernels)
    candidates: tuple[Candidate, ...]
    skipped: tuple[Skipped, ...]


def applied(kernel: ir.Kernel) -> Config:
    """The schedule lines of a kernel that writes tile, warps and stages, as a Config."""
    gemms = tuple(GemmConfig((g.tile.m, g.tile.n, g.tile.k), (g.warps.m, g.warps.n),
                             g.stages.count, keep=g.keep, resident=g.resident,
                             split=g.split.count if g.split is not None else 1,
                             stream=g.split is not None and g.split.stream,
                             cluster=(g.cluster.m, g.cluster.n) if g.cluster is not None
                             else (1, 1))
                  for g in kernel.gemms)
    schedule = KernelKind(kernel.schedule.value) if kernel.schedule is not None else None
    return Config(gemms, schedule)


def free_lines(kernel: ir.Kernel) -> ir.Kernel:
    """The kernel with every schedule line left out (kgen/lower/builder.py's `free`)."""
    return builder.free(kernel)


def emit_source(plan: KernelPlan, source_name: str = "<tune>", source_hash: str = "") -> str:
    return emit(plan, source_name=source_name, source_hash=source_hash, command="kgen tune")


def refuse_programs(kernel: ir.Kernel) -> None:
    """A tile program is not tuned yet: its configuration is the loop rulebook's
    (kgen/targets/loop_rules.py), a row kernel has none. Raises the located KgenError."""
    if kernel.loop is not None:
        raise KgenError(kernel.loop.loc, "kgen tune does not tune tile programs yet; the "
                        "loop's configuration is the rulebook's (write tile, warps and stages "
                        "on the loop to choose another): kgen inspect shows it")
    if kernel.epilogue is not None and not kernel.gemms:
        raise KgenError(kernel.loc, "kgen tune does not tune tile programs yet; a row kernel "
                        "has no configuration to tune (one warp per row): kgen inspect shows "
                        "its plan")


def search_space(kernel: ir.Kernel, arch: ir.Arch | None, sizes: Mapping[str, int], *,
                 all_lines: bool = False, limit: int = DEFAULT_LIMIT,
                 source_name: str = "<tune>", source_hash: str = "") -> Space:
    """The candidates, at most `limit` (the builder's choice among them), in the target's order.
    Raises the lowering's KgenError when nothing plans at all."""
    refuse_programs(kernel)
    arch = arch or kernel.target
    free = free_lines(kernel) if all_lines else kernel
    listed = builder.listed(free, target(arch), sizes=dict(sizes), wide=True)
    # the builder's choice for these sizes (what kgen run takes untuned); raises when nothing
    # plans
    sized = builder.sized(free, target(arch), sizes)
    default_plan = lower(free, arch, config=sized)
    default_source = emit_source(default_plan, source_name, source_hash)
    candidates: list[Candidate] = []
    skipped: list[Skipped] = []
    seen: dict[str, str] = {}
    for index, (config, filled, lines) in enumerate(listed):
        try:
            plan = lower(filled, arch)
        except KgenError as err:
            skipped.append(Skipped(applied(filled).label, "plan", err.message))
            continue
        source = emit_source(plan, source_name, source_hash)
        candidate = Candidate(index, config, builder.as_run(lines, plan), filled, plan, source,
                              default=source == default_source)
        if source in seen:
            skipped.append(Skipped(candidate.label, "duplicate",
                                   f"the same kernel as {seen[source]}"))
            continue
        seen[source] = candidate.label
        candidates.append(candidate)
    if not any(c.default for c in candidates):  # the builder's short list differs: add it
        # the sizes' own configuration, or the size-blind one the listed lines rebuild
        config = sized if sized is not None else _default_config(default_plan, free)
        candidates.insert(0, Candidate(-1, config, default_plan.schedule.chosen,
                                       builder.fill(free, config)[0], default_plan,
                                       default_source, default=True))
    kept = [c for c in candidates if c.default]
    for c in candidates:
        if not c.default and len(kept) < limit:
            kept.append(c)
        elif not c.default:
            skipped.append(Skipped(c.label, "limit", f"past --limit {limit}"))
    kept.sort(key=lambda c: c.index)
    return Space(free, arch, len(listed), tuple(kept), tuple(skipped))


def _default_config(plan: KernelPlan, kernel: ir.Kernel) -> Config:
    """The configuration the builder filled into `kernel` for `plan`, rebuilt from its lines."""
    for config, _filled, lines in builder.listed(kernel, target(plan.arch)):
        if builder.as_run(lines, plan) == plan.schedule.chosen:
            return config
    raise AssertionError("the builder's choice is one of the configurations it lists")
