"""`kgen tune` on the command line: options, bad input, the GPU check, the progress bars and
table, --write and --plot. The work is kgen/tune/tuner.py's; the conventions (exit codes,
--json, --werror, located errors) are kgen/cli.py's.
"""
from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import click

from .cli import (ARCH_CHOICE, EXIT_BAD_INPUT, EXIT_FAILED, _check_writable, _fail, _json_option,
                  _positive_int, _read_text, _require_matplotlib, _stderr, _stdout,
                  _warnings_shown, _watching_warnings, _write_atomic, guarded,
                  parse_assignments, werror_option)


def _positive_float(value: float | None, option: str) -> None:
    if value is not None and not value > 0:
        _fail(EXIT_BAD_INPUT, f"error: {option} must be positive, got {value:g}")


@click.command("tune")
@click.argument("file")
@click.option("--size", "size_text", default=None,
              help="The sizes to tune at, e.g. M=4096,N=4096,K=4096 (others default to 1024).")
@click.option("--arch", type=ARCH_CHOICE, default=None, help="Plan for this target instead.")
@click.option("--kernel", "kernel_name", default=None, help="Which kernel, when FILE has several.")
@click.option("--budget", type=float, default=None, metavar="SECONDS",
              help="Stop timing more candidates once this much time has passed (the "
                   "builder's choice is always timed).")
@click.option("--limit", type=int, default=50, show_default=True,
              help="At most this many candidates (the target's order; the builder's choice "
                   "always among them).")
@click.option("--all-lines", is_flag=True,
              help="Search the schedule lines the source writes too (with --write, they are "
                   "replaced).")
@click.option("--write", "write", is_flag=True,
              help="Write the winning lines into FILE, keeping its comments; `kgen compile` "
                   "then emits the tuned .cu.")
@click.option("--compile-only", is_flag=True,
              help="Enumerate and compile the candidates (in parallel), no GPU needed; time "
                   "nothing.")
@click.option("--workers", type=int, default=None,
              help="Compile processes (default: one per CPU core).")
@click.option("--iters", default=30, show_default=True, help="Timed runs per candidate.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--scalar", "scalar_text", default=None, help="Scalar values, e.g. alpha=1.5.")
@click.option("--no-cache", "no_cache", is_flag=True,
              help="Do not store the winner in the tune cache.")
@click.option("--plot", "plot", default=None, metavar="FILE.png",
              help="Draw the timed candidates (needs matplotlib: kgen[plot]).")
@click.option("-v", "--verbose", is_flag=True, help="List every candidate left out, and why.")
@_json_option("the candidates, compile and timing figures, the winner and its cache key")
@werror_option
@guarded
def tune_command(file: str, size_text: str | None, arch: str | None, kernel_name: str | None,
                 budget: float | None, limit: int, all_lines: bool, write: bool,
                 compile_only: bool, workers: int | None, iters: int, seed: int,
                 scalar_text: str | None, no_cache: bool, plot: str | None, verbose: bool,
                 as_json: bool, werror: bool) -> None:
    """Search the schedules of the kernel in FILE: compile the candidates in parallel, time
    them on the GPU, check the fastest against the reference and keep it in the tune cache,
    where `kgen run` and `kgen.load` find it (per kernel, arch, GPU and size bucket)."""
    from .api import arch_of, file_hash, pick_kernel, read_module, safe_file_name
    from .harness.inputs import check_scalar_names, resolve_sizes
    from .runtime.device import gpu_available
    from .tune.show import RichProgress, print_tune_report
    from .tune.space import refuse_programs
    from .tune.tuner import NoProgress, tune

    sizes = parse_assignments(size_text, "--size", _positive_int)
    scalars = parse_assignments(scalar_text, "--scalar", float)
    _positive_float(budget, "--budget")
    for option, value in (("--limit", limit), ("--workers", workers), ("--iters", iters)):
        if value is not None and value < 1:
            _fail(EXIT_BAD_INPUT, f"error: {option} must be at least 1, got {value}")
    if compile_only and (write or plot):
        _fail(EXIT_BAD_INPUT, "error: --write and --plot need the timing; drop --compile-only")
    if plot is not None:
        _check_writable("--plot", plot)
        _require_matplotlib()
    text = _read_text(file)
    with _watching_warnings():
        module, _ = read_module(file)
        kernel = pick_kernel(module, kernel_name)
        refuse_programs(kernel)  # before the GPU check: not tunable on any machine
        target = arch_of(arch)
        dims = resolve_sizes(kernel, sizes)
        check_scalar_names(kernel, scalars)
        if write and target is not None and target is not kernel.target:
            _fail(EXIT_BAD_INPUT, f"error: --write: {file} targets {kernel.target.value}, not "
                                  f"{target.value}; change its target line, or drop --arch")
        bench = None
        if not compile_only:
            if not gpu_available():
                _fail(EXIT_FAILED, "error: no CUDA GPU is available: kgen tune times the "
                                   "candidates on one (--compile-only enumerates and compiles "
                                   "them without)")
            from .tune.measure import GpuBench

            bench = GpuBench(kernel, dims, seed=seed, scalars=scalars)
        source_name, source_hash = safe_file_name(file), file_hash(text.encode())
        progress = NoProgress() if as_json else RichProgress(_stderr())
        with progress if isinstance(progress, RichProgress) else contextlib.nullcontext():
            report = tune(kernel, target, dims, bench=bench, all_lines=all_lines, limit=limit,
                          budget=budget, workers=workers, iters=iters, store=not no_cache,
                          progress=progress, source_name=source_name, source_hash=source_hash)
    written = None
    if write and report.winner is not None:
        written = _write_tuned(file, kernel, report, all_lines, source_name, source_hash)
    if plot is not None:
        from .plot import candidates_chart

        candidates_chart(report, plot)
    if as_json:
        document = report.as_dict()
        document["written"] = written
        document["plot"] = plot
        if _warnings_shown():
            document["warnings"] = _warnings_shown()
        click.echo(json.dumps(document, indent=2))
    else:
        console = _stdout()
        print_tune_report(console, report, verbose)
        if written:
            console.print(f"wrote the winning lines into {written}")
        if plot is not None:
            console.print(f"candidates drawn in {plot}")
    if bench is not None and report.winner is None:
        sys.exit(EXIT_FAILED)


def _write_tuned(file: str, kernel, report, all_lines: bool, source_name: str,
                 source_hash: str) -> str:
    """The winner's lines into FILE (checked to plan to the tuned kernel first)."""
    from .tune.write import checked, write_lines

    raw = Path(file).read_bytes().decode("utf-8")
    winner = report.winner.candidate
    new_text = write_lines(raw, kernel, winner.lines, replace=all_lines)
    checked(new_text.removeprefix("\ufeff"), file, kernel.name, report.space.arch,
            winner.source, source_name, source_hash)
    _write_atomic(Path(file), new_text.encode("utf-8"))
    return file
