"""`kgen tune`: the search space, the parallel compile, the timing, the winner's check and the
cache entry, in that order. The GPU part goes through a bench object (measure.GpuBench on a GPU;
None compiles only), so that every step but the launches runs, and is tested, without a GPU.

Timing: the builder's own choice first (a tune cut short by its budget still has it), then the
others in the target's order, each the median of `iters` CUDA-event runs on inputs rotated past
L2. The builder's choice is run for WARM_S before its timing counts: the compile leaves the GPU
idle, and its clocks take a while to rise, which would slow the first timing alone. The `final`
fastest, and the builder's choice beside them, are then timed again, in turn, `rounds` times;
the winner has the lowest median of those samples, so a candidate wins over the builder's
choice only where it was faster timed beside it, and by more than the noise: MIN_GAIN, or the
spread of the builder's choice's own round medians where that is larger (Row.spread). It is
checked against the reference; one that fails is reported and the next fastest is checked.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol

from .. import ir
from ..errors import ArgumentError, KgenRuntimeError
from ..harness.timing import DEFAULT_ITERS, Timing
from . import cache
from .codec import config_to_json
from .compile import Compiled, Job, compile_all, default_workers
from .space import DEFAULT_LIMIT, Candidate, Skipped, Space, search_space

FINAL = 3  # candidates timed again at the end (and the builder's choice)
ROUNDS = 2  # times each of them is timed again
# The first candidate's timings before this many seconds are left out: on an H200, kgen tune
# at 8192^3 took a cluster 1x2 that ran 0.956x torch.matmul over the builder's 128x256 s4 at
# 1.012x, and 128x256 s3 over s4 at 4096x4096x11008 (0.977x against 0.997x), the builder's
# choice timed first and never again (bench/RESULTS.md, 2026-11-27)
WARM_S = 0.3
# A candidate replaces the builder's choice only where its final median is this much faster (or
# by the builder's choice's own round-to-round spread, where larger). The minimum of several
# noisy medians favours whichever drew the fastest samples: on an H100
# (bench/logs/small_launch/h100/sweep_tuned_nomargin.log), kgen tune took 128x192 on a cluster
# 2x1 at 8192^3 and 256x128 at 4096x4096x11008, which then ran 0.983x and 0.979x torch.matmul
# against 1.003x and 0.992x for the builder's choices timed in the same run (defaults.log)
MIN_GAIN = 0.01


class Progress(Protocol):
    def phase(self, name: str, total: int) -> None: ...

    def step(self, name: str, text: str = "") -> None: ...


class NoProgress:
    def phase(self, name: str, total: int) -> None:
        pass

    def step(self, name: str, text: str = "") -> None:
        pass


@dataclass
class Row:
    """One candidate through the tune: compiled, timed, re-timed."""

    candidate: Candidate
    compiled: Compiled | None = None
    timing: Timing | None = None
    final_samples: list[float] = field(default_factory=list)
    round_medians: list[float] = field(default_factory=list)  # one per final round
    loaded: Any = None

    @property
    def spread(self) -> float:
        """How far apart the final rounds' medians lie, over the lowest (0 with fewer than two
        rounds)."""
        if len(self.round_medians) < 2:
            return 0.0
        return (max(self.round_medians) - min(self.round_medians)) / min(self.round_medians)

    @property
    def ms(self) -> float | None:
        """The final round's median where it was re-timed, else the first timing's."""
        if self.final_samples:
            return statistics.median(self.final_samples)
        return self.timing.median_ms if self.timing is not None else None


@dataclass
class TuneReport:
    kernel: str
    arch: str  # the plan's
    compile_arch: str  # NVRTC's
    device: str | None  # None: compiled only
    sizes: dict[str, int]
    space: Space
    rows: list[Row]
    skipped: list[Skipped]
    workers: int
    compile_wall_s: float = 0.0
    timing_wall_s: float = 0.0
    total_s: float = 0.0
    budget_s: float | None = None
    untimed: int = 0  # compiled candidates the budget left untimed
    flops: int = 0
    winner: Row | None = None
    failed_checks: list[tuple[str, str]] = field(default_factory=list)
    # (label, its gain over the builder's choice, the margin): the fastest, within the noise
    within_noise: tuple[str, float, float] | None = None
    key: cache.TuneKey | None = None
    cache_path: str | None = None

    @property
    def compiled_rows(self) -> list[Row]:
        return [r for r in self.rows if r.compiled is not None and r.compiled.ok
                and not r.compiled.local_memory]

    @property
    def timed_rows(self) -> list[Row]:
        return [r for r in self.rows if r.ms is not None]

    @property
    def default_row(self) -> Row | None:
        return next((r for r in self.rows if r.candidate.default), None)

    @property
    def compile_cpu_s(self) -> float:
        """NVRTC's time summed over the candidates (the wall time divided by it: parallelism)."""
        return sum(r.compiled.seconds for r in self.rows if r.compiled is not None)

    def tflops(self, row: Row) -> float | None:
        ms = row.ms
        return self.flops / (ms * 1e-3) / 1e12 if ms and self.flops else None

    @property
    def speedup(self) -> float | None:
        """The builder's choice's time over the winner's."""
        default = self.default_row
        if self.winner is None or default is None or default.ms is None:
            return None
        return default.ms / self.winner.ms

    def as_dict(self) -> dict[str, Any]:
        def row_dict(row: Row) -> dict[str, Any]:
            c, compiled = row.candidate, row.compiled
            return {
                "index": c.index, "label": c.label, "default": c.default,
                "config": config_to_json(c.config),
                "lines": [list(line) for line in c.line_values],
                "threads": c.plan.schedule.warps.threads, "smem_bytes": c.plan.smem_bytes,
                "kind": c.plan.schedule.scheduler.kind.value,
                "registers": compiled.registers if compiled else None,
                "compile_s": compiled.seconds if compiled else None,
                "cached": compiled.cached if compiled else None,
                "time_ms": row.timing.median_ms if row.timing else None,
                "final_ms": statistics.median(row.final_samples) if row.final_samples else None,
                "tflops": self.tflops(row),
            }

        return {
            "kernel": self.kernel, "arch": self.arch, "compile_arch": self.compile_arch,
            "device": self.device, "sizes": self.sizes, "listed": self.space.listed,
            "candidates": [row_dict(r) for r in self.rows],
            "skipped": [{"label": s.label, "step": s.step, "reason": s.reason}
                        for s in self.skipped],
            "compile": {"workers": self.workers, "wall_s": self.compile_wall_s,
                        "nvrtc_s": self.compile_cpu_s, "compiled": len(self.compiled_rows)},
            "timing": {"wall_s": self.timing_wall_s, "timed": len(self.timed_rows),
                       "untimed": self.untimed, "budget_s": self.budget_s},
            "total_s": self.total_s,
            "winner": row_dict(self.winner) if self.winner else None,
            "speedup_vs_default": self.speedup,
            "failed_checks": [{"label": label, "reason": why}
                              for label, why in self.failed_checks],
            "within_noise": (dict(zip(("label", "gain", "margin"), self.within_noise))
                             if self.within_noise else None),
            "cache": {"key": self.key.as_dict() if self.key else None, "path": self.cache_path},
        }


def tune(kernel: ir.Kernel, arch: ir.Arch | None, sizes: Mapping[str, int], *, bench=None,
         compile_arch: str | None = None, all_lines: bool = False, limit: int = DEFAULT_LIMIT,
         budget: float | None = None, workers: int | None = None, iters: int = DEFAULT_ITERS,
         final: int = FINAL, rounds: int = ROUNDS, store: bool = True,
         progress: Progress | None = None, source_name: str = "<tune>",
         source_hash: str = "") -> TuneReport:
    """Tune `kernel` for `arch` at `sizes` (every runtime size resolved). `bench`: a
    measure.GpuBench (None: enumerate and compile only, for `compile_arch`, default the plan's
    arch). Raises KgenError when no configuration plans."""
    started = time.perf_counter()
    progress = progress or NoProgress()
    space = search_space(kernel, arch, sizes, all_lines=all_lines, limit=limit,
                         source_name=source_name, source_hash=source_hash)
    target_arch = compile_arch or (bench.compile_arch if bench is not None
                                   else space.arch.value)
    workers = min(workers or default_workers(), max(len(space.candidates), 1))
    report = TuneReport(kernel=kernel.name, arch=space.arch.value, compile_arch=target_arch,
                        device=bench.device_name if bench is not None else None,
                        sizes=dict(sizes), space=space,
                        rows=[Row(c) for c in space.candidates], skipped=list(space.skipped),
                        workers=workers, budget_s=budget,
                        flops=bench.flops if bench is not None else 0)
    _compile(report, target_arch, workers, progress)
    if bench is not None:
        _time(report, bench, iters, final, rounds, budget, started, progress)
        _pick(report, bench)
        if report.winner is not None:
            report.key = cache.tune_key(space.kernel, space.arch, bench.device_name,
                                        bench.dims)
            if store:
                report.cache_path = cache.store(entry_of(report))
    report.total_s = time.perf_counter() - started
    return report


def _compile(report: TuneReport, arch: str, workers: int, progress: Progress) -> None:
    by_index = {r.candidate.index: r for r in report.rows}
    jobs = [Job(r.candidate.index, r.candidate.source, r.candidate.plan.name, arch,
                narrow_kernel=r.candidate.plan.narrow_kernel)
            for r in report.rows]
    progress.phase("compile", len(jobs))
    started = time.perf_counter()

    def done(result: Compiled) -> None:
        progress.step("compile", by_index[result.index].candidate.label)

    results = compile_all(jobs, workers=workers, done=done)
    report.compile_wall_s = time.perf_counter() - started
    for row in report.rows:
        row.compiled = results[row.candidate.index]
        if not row.compiled.ok:
            report.skipped.append(Skipped(row.candidate.label, "compile", row.compiled.error))
        elif row.compiled.local_memory:
            report.skipped.append(Skipped(row.candidate.label, "resources",
                                          f"ptxas reports {row.compiled.local_memory} "
                                          f"({row.compiled.registers} registers)"))


def _time(report: TuneReport, bench, iters: int, final: int, rounds: int,
          budget: float | None, started: float, progress: Progress) -> None:
    rows = sorted(report.compiled_rows, key=lambda r: (not r.candidate.default,
                                                       r.candidate.index))
    progress.phase("time", len(rows))
    timing_started = time.perf_counter()
    timed = 0
    for position, row in enumerate(rows):
        if budget is not None and timed and time.perf_counter() - started > budget:
            report.untimed = len(rows) - position
            for rest in rows[position:]:
                report.skipped.append(Skipped(rest.candidate.label, "budget",
                                              f"--budget {budget:g} s spent"))
            break
        try:
            row.loaded = bench.load(row.candidate, row.compiled)
            if not timed:
                _warm(bench, row.loaded, iters)
            row.timing = bench.time(row.loaded, iters)
            timed += 1
        except (KgenRuntimeError, ArgumentError) as err:
            row.loaded = None
            report.skipped.append(Skipped(row.candidate.label, "run", str(err)))
        progress.step("time", row.candidate.label)
    best = sorted((r for r in rows if r.timing is not None), key=lambda r: r.timing.median_ms)
    finalists = best[:final] + [r for r in best[final:] if r.candidate.default]
    if len(best) > 1:
        for _ in range(rounds):
            for row in finalists:
                timing = bench.time(row.loaded, iters)
                row.final_samples.extend(timing.samples_ms)
                row.round_medians.append(timing.median_ms)
    report.timing_wall_s = time.perf_counter() - timing_started


def _warm(bench, loaded, iters: int) -> None:
    """Run `loaded`, its timings thrown away, until WARM_S has passed on the host's clock or
    in the runs' own time, at least once."""
    warm_until, ran_s = time.perf_counter() + WARM_S, 0.0
    while True:
        ran_s += sum(bench.time(loaded, iters).samples_ms) / 1e3
        if ran_s >= WARM_S or time.perf_counter() >= warm_until:
            return


def _pick(report: TuneReport, bench) -> None:
    # the candidates timed again in the final rounds first, by those rounds' medians; the
    # builder's choice first among them unless the fastest beats it by more than the noise
    order = sorted(report.timed_rows, key=lambda r: (not r.final_samples, r.ms))
    default = report.default_row
    if default is not None and default.final_samples and order[0] is not default:
        gain, margin = 1 - order[0].ms / default.ms, max(MIN_GAIN, default.spread)
        if gain < margin:
            report.within_noise = (order[0].candidate.label, gain, margin)
            order.remove(default)
            order.insert(0, default)
    for row in order:
        passed, why = bench.check(row.candidate, row.loaded)
        if passed:
            report.winner = row
            return
        report.failed_checks.append((row.candidate.label, why))
        report.skipped.append(Skipped(row.candidate.label, "check", why))


def entry_of(report: TuneReport) -> cache.TuneEntry:
    winner = report.winner
    assert winner is not None and report.key is not None
    return cache.TuneEntry(
        key=report.key, config=winner.candidate.config, label=winner.candidate.label,
        lines=winner.candidate.line_values, time_ms=winner.ms, tflops=report.tflops(winner),
        sizes=tuple(sorted(report.sizes.items())), candidates=len(report.timed_rows),
        date=cache.now())
