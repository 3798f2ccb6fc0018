"""What `kgen tune` shows people: rich progress bars while it compiles and times, then a table
of the candidates (fastest first) and a summary."""
from __future__ import annotations

from collections import Counter

from .tuner import Row, TuneReport
from .write import setting_text

_PHASES = {"compile": "compiling with NVRTC", "time": "timing on the GPU"}


class RichProgress:
    """A progress bar per phase, on `console` (stderr), as the tuner's Progress."""

    def __init__(self, console):
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        self._progress = Progress(TextColumn("{task.description}"), BarColumn(),
                                  MofNCompleteColumn(), TimeElapsedColumn(),
                                  TextColumn("[dim]{task.fields[last]}"), console=console)
        self._tasks: dict[str, int] = {}

    def __enter__(self) -> "RichProgress":
        self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self._progress.stop()

    def phase(self, name: str, total: int) -> None:
        self._tasks[name] = self._progress.add_task(_PHASES.get(name, name), total=total,
                                                    last="")

    def step(self, name: str, text: str = "") -> None:
        self._progress.advance(self._tasks[name])
        self._progress.update(self._tasks[name], last=text)


def _fmt(value, spec: str, unit: str = "") -> str:
    return "" if value is None else f"{value:{spec}}{unit}"


def _order(report: TuneReport) -> list[Row]:
    timed = sorted(report.timed_rows, key=lambda r: r.ms)
    return timed + [r for r in report.rows if r not in timed]


def _status(report: TuneReport, row: Row, skipped: dict[str, str]) -> str:
    if row is report.winner:
        return "[bold green]winner[/bold green]"
    if row.candidate.label in skipped:
        step = skipped[row.candidate.label]
        return f"[red]{step}[/red]" if step in ("check", "compile", "run") else step
    return ""


def print_tune_report(console, report: TuneReport, verbose: bool = False) -> None:
    from rich.table import Table

    sizes = ", ".join(f"{k}={v}" for k, v in report.sizes.items())
    where = f"timed on {report.device}" if report.device else "compiled only"
    console.print(f"[bold]{report.kernel}[/bold] ({report.arch} plan, {report.compile_arch} "
                  f"code), sizes {sizes}, {where}")
    skipped = {s.label: s.step for s in report.skipped}
    best = min((r.ms for r in report.timed_rows), default=None)
    table = Table(title_justify="left", title=(
        "candidates, fastest first (median of CUDA-event runs, inputs rotated past L2)"
        if report.device else "candidates"))
    columns = ["#", "candidate", "kind", "threads", "regs", "smem KiB", "NVRTC s"]
    if report.device:
        columns += ["ms", "TFLOP/s", "x best"]
    columns.append("")
    for column in columns:
        table.add_column(column, justify="left" if column in ("candidate", "kind", "") else
                         "right")
    for row in _order(report):
        c, compiled = row.candidate, row.compiled
        label = c.label + (" [cyan](builder's choice)[/cyan]" if c.default else "")
        cells = [str(c.index) if c.index >= 0 else "-", label, c.plan.schedule.scheduler.kind.value,
                 str(c.plan.schedule.warps.threads),
                 _fmt(compiled.registers if compiled else None, "d"),
                 f"{c.plan.smem_bytes / 1024:.0f}",
                 ("cached" if compiled.cached else f"{compiled.seconds:.1f}") if compiled else ""]
        if report.device:
            ms = row.ms
            cells += [_fmt(ms, ".4f"), _fmt(report.tflops(row), ".1f"),
                      _fmt(ms / best if ms and best else None, ".2f", "x")]
        cells.append(_status(report, row, skipped))
        table.add_row(*cells)
    console.print(table)
    _summary(console, report, verbose)


def _summary(console, report: TuneReport, verbose: bool) -> None:
    space = report.space
    console.print(f"search space: {space.listed} configurations listed, "
                  f"{len(space.candidates)} candidates")
    if len(space.candidates) == 1:
        console.print("[yellow]one candidate: the source writes the schedule lines the target "
                      "varies; --all-lines searches them too[/yellow]")
    console.print(f"compile: {len(report.rows)} candidates in {report.compile_wall_s:.1f} s on "
                  f"{report.workers} processes (NVRTC {report.compile_cpu_s:.1f} s in all), "
                  f"{len(report.compiled_rows)} without spills")
    counts = Counter(s.step for s in report.skipped)
    if counts:
        console.print("left out: " + ", ".join(f"{n} at {step}" for step, n in counts.items())
                      + ("" if verbose else " (-v lists them)"))
    if verbose:
        for s in report.skipped:
            console.print(f"  [dim]{s.step}[/dim] {s.label}: {s.reason}")
    if report.device is None:
        return
    console.print(f"timing: {len(report.timed_rows)} timed in {report.timing_wall_s:.1f} s"
                  + (f", {report.untimed} left untimed by --budget {report.budget_s:g} s"
                     if report.untimed else "") + f"; total {report.total_s:.1f} s")
    for label, why in report.failed_checks:
        console.print(f"[bold red]CHECK FAILED[/bold red] {label}: {why} (not taken)")
    winner = report.winner
    if winner is None:
        why = "no candidate passed the check" if report.timed_rows else \
            "no candidate ran on this GPU (-v says why)"
        console.print(f"[bold red]{why}: nothing is cached[/bold red]")
        return
    if report.within_noise and winner is report.default_row:
        label, gain, margin = report.within_noise
        console.print(f"kept the builder's choice: {label} ran {100 * gain:.1f}% faster, within "
                      f"the noise ({100 * margin:.1f}%)")
    lines = "  ".join(_shown(line, value) for line, value in winner.candidate.line_values)
    speedup = report.speedup
    console.print(f"[bold green]winner[/bold green] {winner.candidate.label}: {winner.ms:.4f} ms"
                  + (f", {report.tflops(winner):.1f} TFLOP/s" if report.tflops(winner) else "")
                  + (f", {speedup:.2f}x the builder's choice" if speedup else "")
                  + "; checked against the reference")
    if lines:
        console.print(f"its lines: {lines}")
    if report.cache_path:
        console.print(f"cached: {report.cache_path} (kgen run and kgen.load use it)")
    else:
        console.print("not cached (KGEN_CACHE=0, --no-cache, or the cache folder is not private)")


def _shown(line: str, value: str) -> str:
    """A filled line as the source would read: ("g0 split", "split 4") -> "g0 split 4"."""
    gemm, _, what = line.rpartition(" ")
    text = setting_text(what, value)
    return f"{gemm} {text}" if gemm else text
