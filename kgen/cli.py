"""The `kgen` command: compile, inspect, run.

Exit codes: 0 success; 1 a check failed, or NVRTC, the driver or the GPU failed (or there is
no GPU for `run`); 2 bad input: a located message for mistakes in the kernel description, one
line for a missing file or a malformed option. Never a traceback for a user mistake.
"""
from __future__ import annotations

import difflib
import functools
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__, ir
from .errors import ArgumentError, KgenError, KgenRuntimeError
from .report import plan_summary, print_plan

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
DIFF_LINES = 20

ARCH_CHOICE = click.Choice([a.value for a in ir.Arch])


PIPE_WIDTH = 120  # rich's width when writing to a pipe or a file (80 cuts the tables)


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _stdout():
    from rich.console import Console

    width = None if sys.stdout.isatty() else PIPE_WIDTH
    return Console(highlight=False, width=width)


def _fail(code: int, message: str):
    click.echo(message, err=True)
    sys.exit(code)


def _read_text(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        _fail(EXIT_BAD_INPUT, f"error: {path}: no such file")
    except IsADirectoryError:
        _fail(EXIT_BAD_INPUT, f"error: {path}: is a directory, not a .kg file")
    except OSError as err:
        _fail(EXIT_BAD_INPUT, f"error: {path}: cannot read: {err.strerror or err}")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError:
        from .parse import parse_file

        parse_file(path)  # raises the located "not UTF-8 text" KgenError
        raise


def _source_for(err: KgenError, path: str, text: str) -> str | None:
    file = err.loc.file
    if file in (path, os.path.basename(path)) or os.path.abspath(file) == os.path.abspath(path):
        return text
    try:
        return Path(file).read_text()
    except (OSError, UnicodeDecodeError):
        return None


def guarded(command: Callable) -> Callable:
    """Turn kgen's exceptions into a message and an exit code (the FILE argument's text is
    used to show the offending line)."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        path = kwargs.get("file", "")
        try:
            return command(*args, **kwargs)
        except KgenError as err:
            text = None
            if path:
                try:
                    text = Path(path).read_text()
                except (OSError, UnicodeDecodeError):
                    text = None
            source = _source_for(err, path, text) if text is not None else None
            _fail(EXIT_BAD_INPUT, err.render(source))
        except ArgumentError as err:
            _fail(EXIT_BAD_INPUT, f"error: {err}")
        except KgenRuntimeError as err:
            _fail(EXIT_FAILED, f"error: {err}")
        except ModuleNotFoundError as err:
            if err.name and err.name.startswith("kgen."):
                _fail(EXIT_FAILED, f"error: this kgen has no {err.name} yet")
            raise

    return wrapper


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="kgen")
def cli() -> None:
    """Fused GPU kernels from a short description: emit, inspect, run and benchmark."""


# ---------------------------------------------------------------------------------------------
# compile


@cli.command("compile")
@click.argument("file")
@click.option("-o", "--output", "output", default=None, metavar="OUT.cu",
              help="Write the .cu here (default stdout).")
@click.option("--header", "header", default=None, metavar="OUT.h",
              help="Also write the header (params struct, host API declarations) here.")
@click.option("--arch", type=ARCH_CHOICE, default=None, help="Target instead of the kernel's own.")
@click.option("--kernel", "kernel_name", default=None, help="Which kernel, when FILE has several.")
@click.option("--check", "check_only", is_flag=True,
              help="Exit 1 if OUTPUT (and the --header file) differ from what kgen would write "
                   "(for CI).")
@guarded
def compile_command(file: str, output: str | None, header: str | None, arch: str | None,
                    kernel_name: str | None, check_only: bool) -> None:
    """Emit standalone CUDA C++ for the kernel in FILE (and, with --header, the .h that lets
    other C++ files call it). Needs no GPU."""
    from .api import build_file

    _read_text(file)
    if check_only and output is None:
        _fail(EXIT_BAD_INPUT, "error: --check needs -o OUTPUT, the file to compare")
    same = header is not None and output is not None
    if same and os.path.abspath(header) == os.path.abspath(output):
        _fail(EXIT_BAD_INPUT, "error: --header and -o name the same file")
    built = build_file(file, arch, kernel=kernel_name)
    files = [(output, built.source)] + ([(header, built.header)] if header is not None else [])
    if check_only:
        stale = [message for path, text in files if (message := _stale(path, text))]
        if stale:
            _fail(EXIT_FAILED, "\n".join(stale))
        return
    for path, text in files:
        if path is None:
            click.echo(text, nl=False)
        else:
            _write_atomic(Path(path), text)


def _stale(output: str, fresh: str) -> str | None:
    """None when `output` holds exactly `fresh`, else why not (with a short diff)."""
    try:
        current = Path(output).read_text()
    except FileNotFoundError:
        return f"{output} does not exist; run kgen compile to create it"
    except (OSError, UnicodeDecodeError) as err:
        return f"{output}: cannot read: {getattr(err, 'strerror', err)}"
    if current == fresh:
        return None
    diff = list(difflib.unified_diff(
        current.splitlines(), fresh.splitlines(), f"{output} (on disk)",
        f"{output} (kgen {__version__})", lineterm="", n=1,
    ))
    shown = diff[:DIFF_LINES]
    more = f"\n... {len(diff) - DIFF_LINES} more diff lines" if len(diff) > DIFF_LINES else ""
    return f"{output} is stale; regenerate it with kgen compile\n" + "\n".join(shown) + more


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.kgen-tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as err:
        _fail(EXIT_FAILED, f"error: cannot write {path}: {err.strerror or err}")


# ---------------------------------------------------------------------------------------------
# inspect


@cli.command("inspect")
@click.argument("file")
@click.option("--json", "as_json", is_flag=True, help="Print the plan as JSON.")
@click.option("--resources", is_flag=True, help="Compile with NVRTC and show registers/spills.")
@click.option("--arch", type=ARCH_CHOICE, default=None, help="Target instead of the kernels' own.")
@click.option("--kernel", "kernel_name", default=None, help="Only this kernel.")
@guarded
def inspect_command(file: str, as_json: bool, resources: bool, arch: str | None,
                    kernel_name: str | None) -> None:
    """Show the plan: tiles, shared-memory layouts, storage map, params, resources."""
    from .api import arch_of, build, compile_command as header_command, file_hash, pick_kernel
    from .api import read_module, safe_file_name
    from .lower import lower

    text = _read_text(file)
    module, _ = read_module(file)
    kernels = [pick_kernel(module, kernel_name)] if kernel_name else list(module.kernels)
    target = arch_of(arch)
    summaries = []
    for kernel in kernels:
        if resources:
            name = safe_file_name(file)
            built = build(kernel, target, source_name=name, source_hash=file_hash(text.encode()),
                          command=header_command(name, target, kernel_name))
            summaries.append(plan_summary(built.plan, _resources(built)))
        else:
            summaries.append(plan_summary(lower(kernel, target)))
    if as_json:
        click.echo(json.dumps({"kernels": summaries}, indent=2))
        return
    console = _stdout()
    for i, summary in enumerate(summaries):
        if i:
            console.print()
        print_plan(console, summary)


def _resources(built) -> dict:
    from .runtime.nvrtc import compile_cubin, nvrtc_version

    with _stderr().status(f"compiling {built.plan.name} with NVRTC"):
        result = compile_cubin(built.source, built.plan.name, built.plan.arch.value)
    return {"arch": result.arch, "nvrtc": nvrtc_version(), "seconds": result.seconds,
            "cached": result.cached, **result.resources()}


# ---------------------------------------------------------------------------------------------
# run


def parse_assignments(text: str | None, option: str, convert: Callable[[str], Any]) -> dict:
    """`M=4096,N=4096` -> {"M": 4096, "N": 4096}; a malformed one exits 2 with one line."""
    result: dict[str, Any] = {}
    if not text:
        return result
    for item in text.split(","):
        name, sep, value = item.partition("=")
        name = name.strip()
        try:
            if not sep or not name.isidentifier():
                raise ValueError
            result[name] = convert(value.strip())
        except ValueError:
            _fail(EXIT_BAD_INPUT,
                  f"error: {option} expects NAME=VALUE[,NAME=VALUE...], got {text!r}")
    return result


def _positive_int(value: str) -> int:
    number = int(value)
    if number <= 0:
        raise ValueError
    return number


@cli.command("run")
@click.argument("file")
@click.option("--size", "size_text", default=None, help="Sizes, e.g. M=4096,N=4096,K=4096.")
@click.option("--check/--no-check", default=True, help="Compare with the NumPy reference.")
@click.option("--bench", is_flag=True, help="Time it (and PyTorch doing the same).")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--arch", type=ARCH_CHOICE, default=None, help="Plan for this target instead.")
@click.option("--kernel", "kernel_name", default=None, help="Which kernel, when FILE has several.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--scalar", "scalar_text", default=None, help="Scalar values, e.g. alpha=1.5.")
@click.option("--iters", default=30, show_default=True, help="Timed runs (median taken).")
@guarded
def run_command(file: str, size_text: str | None, check: bool, bench: bool, as_json: bool,
                arch: str | None, kernel_name: str | None, seed: int, scalar_text: str | None,
                iters: int) -> None:
    """Compile, run on random data, check against the reference, and benchmark."""
    from .api import build_file
    from .runtime.device import gpu_available

    sizes = parse_assignments(size_text, "--size", _positive_int)
    scalars = parse_assignments(scalar_text, "--scalar", float)
    if iters < 1:
        _fail(EXIT_BAD_INPUT, "error: --iters must be at least 1")
    _read_text(file)
    built = build_file(file, arch, kernel=kernel_name)
    from .harness.inputs import check_scalar_names, resolve_sizes

    resolve_sizes(built.kernel, sizes)  # a wrong size or scalar name is bad input, GPU or not
    check_scalar_names(built.kernel, scalars)
    if not gpu_available():
        _fail(EXIT_FAILED, "error: no CUDA GPU is available: kgen run needs one "
                           "(kgen compile and kgen inspect do not)")
    from .harness.run import run

    with _stderr().status("starting") as status:
        report = run(built.kernel, built.plan, built.source, sizes, check=check, bench=bench,
                     seed=seed, progress=status.update, scalars=scalars, iters=iters)
    if as_json:
        click.echo(json.dumps(report.as_dict(), indent=2))
    else:
        _print_report(_stdout(), report)
    if report.checked and not report.ok:
        sys.exit(EXIT_FAILED)


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def _print_report(console, report) -> None:
    from rich.table import Table

    sizes = ", ".join(f"{k}={v}" for k, v in report.sizes.items())
    scalars = ", ".join(f"{k}={v:g}" for k, v in report.scalars.items())
    compile_info = report.compile
    compiled = ""
    if compile_info:
        compiled = (f"; {compile_info.get('registers')} registers, "
                    f"{compile_info.get('spill_stores', 0)} B spilled, "
                    + ("cached" if compile_info.get("cached")
                       else f"compiled in {compile_info.get('seconds', 0):.2f} s"))
    console.print(f"[bold]{report.kernel}[/bold] ({report.plan_arch} plan, {report.compile_arch} "
                  f"code) on {report.device}{compiled}")
    console.print(f"sizes {sizes}" + (f"; scalars {scalars}" if scalars else "")
                  + f"; seed {report.seed}; tensors from {report.backend}")
    if report.checked:
        table = Table(title="check against the NumPy reference", title_justify="left")
        for column in ("output", "dtype", "shape", "rows", "max abs", "max rel", "atol, rtol",
                       "unwritten", "result"):
            table.add_column(column)
        for c in report.checks:
            r = c.result
            verdict = "[green]ok[/green]" if r.ok else f"[red]FAIL[/red] ({r.bad} bad)"
            table.add_row(c.name, c.dtype, "x".join(map(str, c.shape)),
                          "all" if c.rows_checked is None else str(c.rows_checked),
                          f"{r.max_abs:.3g}", f"{r.max_rel:.3g}", f"{r.atol:g}, {r.rtol:g}",
                          str(r.unwritten), verdict)
        console.print(table)
    if report.timing is not None:
        table = Table(title="time (median of runs, inputs rotated past L2)", title_justify="left")
        for column in ("", "time", "TFLOP/s", "GB/s", "of peak", "vs PyTorch"):
            table.add_column(column, justify="right")
        peak = report.peak_fraction
        table.add_row("kgen", _fmt(report.timing.median_ms * 1e3, ".1f", " us"),
                      _fmt(report.tflops, ".1f"), _fmt(report.gbps, ".0f"),
                      _fmt(None if peak is None else 100 * peak, ".0f", "%"),
                      _fmt(report.speedup, ".2f", "x"))
        if report.torch_timing is not None:
            table.add_row("PyTorch", _fmt(report.torch_timing.median_ms * 1e3, ".1f", " us"),
                          _fmt(report.torch_tflops, ".1f"), "", "", "1.00x")
        console.print(table)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/dim]")
    if report.checked:
        console.print("[green]PASS[/green]" if report.ok else "[red]FAIL[/red]")


def main() -> None:
    cli(prog_name="kgen")


if __name__ == "__main__":
    main()
