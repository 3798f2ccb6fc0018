"""The `kgen` command: compile, inspect, run, tune.

Exit codes: 0 success; 1 a check failed, or NVRTC, the driver or the GPU failed (or there is
no GPU for `run`); 2 bad input: a located message for mistakes in the kernel description, one
line for a missing file, a path that cannot be written or a malformed option, and any warning
under --werror. Never a traceback for a user mistake. With --json, stdout carries one JSON
object, errors included ({"error": {"file", "line", "col", "message", "kind"}}), while stderr
keeps the messages for people (errors, and warnings as `warning: ...` lines).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import json
import os
import sys
import warnings
from pathlib import Path
from typing import Any, Callable

import click

from . import __version__
from . import cli_sequence as seq_cli  # kgen compile and inspect of a file's sequence
from .cli_outputs import _check_outputs, _write_atomic, _write_outputs
from .enums import Arch
from .errors import ArgumentError, KgenError, KgenRuntimeError, KgenSourceWarning
from .report import plan_summary, print_plan, print_run_report

EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

ARCH_CHOICE = click.Choice([a.value for a in Arch])
RUN_ARCH_CHOICE = click.Choice([a.value for a in Arch] + ["native"])  # native: the GPU's own


PIPE_WIDTH = 120  # rich's width when writing to a pipe or a file (80 cuts the tables)


def _stderr():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _stdout():
    from rich.console import Console

    width = None if sys.stdout.isatty() else PIPE_WIDTH
    return Console(highlight=False, width=width)


# Set by `guarded` for one command: errors as JSON (--json), warnings as errors (--werror), and
# the warnings shown so far (for the JSON output).
_JSON: contextvars.ContextVar[bool] = contextvars.ContextVar("kgen_json", default=False)
_WERROR: contextvars.ContextVar[bool] = contextvars.ContextVar("kgen_werror", default=False)
_SHOWN: contextvars.ContextVar[list | None] = contextvars.ContextVar("kgen_shown", default=None)


def _error_json(message: str, *, file: str | None = None, line: int | None = None,
                col: int | None = None, code: int = EXIT_BAD_INPUT) -> str:
    kind = "bad input" if code == EXIT_BAD_INPUT else "failed"
    return json.dumps({"error": {"file": file, "line": line, "col": col,
                                 "message": message.removeprefix("error: "), "kind": kind}},
                      indent=2)


def _fail(code: int, message: str, *, file: str | None = None):
    """End the command: the message on stderr, and under --json also as JSON on stdout."""
    if _JSON.get():
        click.echo(_error_json(message, file=file, code=code))
    click.echo(message, err=True)
    sys.exit(code)


def _warn(message: str, located: bool = False) -> None:
    """Show a warning on stderr; under --werror it ends the command instead (exit 2). A located
    warning arrives rendered (`file:line:col: warning: ...`, source line, caret)."""
    if _WERROR.get():
        if located:
            _fail(EXIT_BAD_INPUT, message.replace(": warning: ", ": error: (--werror) ", 1))
        _fail(EXIT_BAD_INPUT, f"error: {message} (--werror)")
    click.echo(message if located else f"warning: {message}", err=True)
    shown = _SHOWN.get()
    if shown is not None:
        shown.append(message)


def _counts(warning: warnings.WarningMessage) -> bool:
    """kgen's warnings are about the kernel and count, except the cache's (an unwritable
    folder): that one is about the machine, shown but never failing --werror."""
    from .runtime.cache import KgenCacheWarning

    return not issubclass(warning.category, KgenCacheWarning)


@contextlib.contextmanager
def _watching_warnings():
    """The Python warnings kgen raises in the block (NVRTC's spills and local memory, the front
    end's located warnings) go through _warn at its end; other warnings pass through."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for warning in caught:
        if not warning.category.__module__.startswith("kgen"):
            warnings.warn_explicit(warning.message, warning.category, warning.filename,
                                   warning.lineno)
        elif _counts(warning):
            _warn(str(warning.message), located=issubclass(warning.category, KgenSourceWarning))
        else:
            click.echo(f"warning: {warning.message}", err=True)


def _warnings_shown() -> list[str]:
    return list(_SHOWN.get() or [])


def _read_text(path: str) -> str:
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        _fail(EXIT_BAD_INPUT, f"error: {path}: no such file", file=path)
    except IsADirectoryError:
        _fail(EXIT_BAD_INPUT, f"error: {path}: is a directory, not a .kg file", file=path)
    except OSError as err:
        _fail(EXIT_BAD_INPUT, f"error: {path}: cannot read: {err.strerror or err}",
              file=path)
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
    used to show the offending line), as JSON under --json; set up --werror."""

    @functools.wraps(command)
    def wrapper(*args, **kwargs):
        path = kwargs.get("file", "")
        tokens = [(_JSON, _JSON.set(bool(kwargs.get("as_json")))),
                  (_WERROR, _WERROR.set(bool(kwargs.get("werror")))),
                  (_SHOWN, _SHOWN.set([]))]
        try:
            return command(*args, **kwargs)
        except KgenError as err:
            if _JSON.get():
                loc = err.loc
                click.echo(_error_json(err.message, file=loc.file if loc.line else None,
                                       line=loc.line or None, col=loc.col or None))
            text = None
            if path:
                try:
                    text = Path(path).read_text()
                except (OSError, UnicodeDecodeError):
                    text = None
            source = _source_for(err, path, text) if text is not None else None
            click.echo(err.render(source), err=True)
            sys.exit(EXIT_BAD_INPUT)
        except ArgumentError as err:
            _fail(EXIT_BAD_INPUT, f"error: {err}")
        except KgenRuntimeError as err:
            _fail(EXIT_FAILED, f"error: {err}")
        except ModuleNotFoundError as err:
            if err.name and err.name.startswith("kgen."):
                _fail(EXIT_FAILED, f"error: this kgen has no {err.name} yet")
            raise
        finally:
            for var, token in reversed(tokens):
                var.reset(token)

    return wrapper


ENVIRONMENT = """\b
Environment:
  KGEN_CACHE=0          compile with NVRTC every time: no cubin is read from or
                        written to the cache (also false, no, off; default on)
  KGEN_CACHE_DIR        the folder of kgen's caches: cubins (v1/), sources NVRTC
                        rejected (failed/), kgen tune's winners (tune/), parser
                        tables, compiled templates
  XDG_CACHE_HOME        without KGEN_CACHE_DIR, cubins go to $XDG_CACHE_HOME/kgen
                        (default ~/.cache/kgen, where the other caches always go)
  CUDA_HOME, CUDA_PATH  where to look for the CUDA headers (include/cuda_fp16.h)
                        when the nvidia-cuda-runtime wheel has none
  CUDA_VISIBLE_DEVICES  which GPUs kgen run and kgen.load see (CUDA's own)

\b
Exit codes: 0 success; 1 a check failed, or NVRTC, the driver or the GPU failed;
2 bad input (the kernel description, an option, a path), or a warning under --werror.
With --json, errors are also JSON on stdout: {"error": {"file", "line", "col", "message"}}.
"""


class _Group(click.Group):
    """Click's group; with --json on the command line, a usage error is JSON too."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True,
             **extra):
        argv = list(sys.argv[1:] if args is None else args)
        if "--json" not in argv or not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            return super().main(args, prog_name, complete_var, False, **extra)
        except click.ClickException as err:
            click.echo(_error_json(err.format_message(), code=EXIT_BAD_INPUT))
            err.show()
            sys.exit(EXIT_BAD_INPUT)
        except click.Abort:
            click.echo(_error_json("aborted", code=EXIT_FAILED))
            sys.exit(EXIT_FAILED)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]},
             epilog=ENVIRONMENT)
@click.version_option(__version__, prog_name="kgen")
def cli() -> None:
    """Fused GPU kernels from a short description: emit, inspect, run and benchmark."""


def _json_option(what: str):
    return click.option("--json", "as_json", is_flag=True,
                        help=f"Print {what} as JSON on stdout, errors included.")


werror_option = click.option(
    "--werror", is_flag=True,
    help="Make warnings errors, exit 2: a schedule line that forces a slower path than the "
         "target has, the front end's, NVRTC's spills and local memory (and, for kgen run, a "
         "GPU newer than the file's target).")


# ---------------------------------------------------------------------------------------------
# compile


@cli.command("compile")
@click.argument("file")
@click.option("-o", "--output", "output", default=None, metavar="OUT.cu",
              help="Write the .cu here (default stdout, unless --cubin, --ptx or --json).")
@click.option("--header", "header", default=None, metavar="OUT.h",
              help="Also write the header (params struct, host API declarations) here.")
@click.option("--cubin", "cubin", default=None, metavar="OUT.cubin",
              help="Also compile with NVRTC for the plan's arch and write the cubin here "
                   "(no GPU needed; spills are warnings).")
@click.option("--ptx", "ptx", default=None, metavar="OUT.ptx",
              help="Also write NVRTC's PTX for the plan's arch here (no GPU needed).")
@click.option("--arch", type=ARCH_CHOICE, default=None, help="Target instead of the kernel's own.")
@click.option("--kernel", "kernel_name", default=None, help="Which kernel, when FILE has several.")
@click.option("--size", "size_text", default=None,
              help="Plan for these runtime sizes (every one, e.g. M=3000,N=5000,K=1000), as "
                   "kgen run --size does without a tune entry: the schedule lines the kernel "
                   "leaves out are filled for them. The .cu still takes any size.")
@click.option("--check", "check_only", is_flag=True,
              help="Exit 1 if OUTPUT (and the --header file) differ from what kgen would write "
                   "(for CI).")
@_json_option("what was written (paths, kernel, arch, shared memory, the lines kgen filled, "
              "the sizes, NVRTC's report)")
@werror_option
@guarded
def compile_command(file: str, output: str | None, header: str | None, cubin: str | None,
                    ptx: str | None, arch: str | None, kernel_name: str | None,
                    size_text: str | None, check_only: bool, as_json: bool,
                    werror: bool) -> None:
    """Emit standalone CUDA C++ for the kernel in FILE (and, with --header, the .h that lets
    other C++ files call it; with --cubin or --ptx, NVRTC's output). Needs no GPU."""
    from .api import build_file

    _read_text(file)
    sizes = parse_assignments(size_text, "--size", _positive_int) if size_text else None
    if check_only and output is None:
        _fail(EXIT_BAD_INPUT, "error: --check needs -o OUTPUT, the file to compare")
    if check_only and (cubin or ptx):
        _fail(EXIT_BAD_INPUT, "error: --check compares the .cu and .h; drop --cubin and --ptx")
    named = [(option, path) for option, path in
             (("-o", output), ("--header", header), ("--cubin", cubin), ("--ptx", ptx))
             if path is not None]
    owner: dict[str, str] = {}
    for option, path in named:
        key = os.path.abspath(path)
        if key in owner:
            _fail(EXIT_BAD_INPUT, f"error: {option} and {owner[key]} name the same file")
        owner[key] = option
    if not check_only:
        for option, path in named:
            _check_writable(option, path)
    if seq_cli.sequence_named(file, kernel_name):
        return seq_cli.compile_sequence(file, output, header, cubin, ptx, arch, kernel_name,
                                        check_only, as_json, size_text)
    result = ptx_text = None
    with _watching_warnings():
        built = build_file(file, arch, kernel=kernel_name, output=output, header=header,
                           sizes=sizes)
        if sizes:
            _sizes_unused(built.kernel, built.plan.arch)
        if cubin or ptx:
            result, ptx_text = _nvrtc_outputs(built, cubin is not None, ptx is not None)
    texts = [(output, built.source)] + ([(header, built.header)] if header is not None else [])
    if check_only:
        _check_outputs(texts, as_json, lambda: {"kernel": built.plan.name})
        return
    _write_outputs(texts, result, ptx_text, cubin, ptx, as_json)
    if as_json:
        summary = _compile_summary(file, built, result, output, header, cubin, ptx, sizes)
        click.echo(json.dumps(summary, indent=2))


def _sizes_unused(kernel, arch) -> None:
    """Warn where --size can change nothing (every line written, a chain, not sm_90a, ...)."""
    from .lower import builder
    from .targets import target

    reason = builder.unsized_reason(kernel, target(arch))
    if reason is not None:
        _warn(f"--size changes nothing here: {reason}")


def _nvrtc_outputs(built, want_cubin: bool, want_ptx: bool):
    """NVRTC's cubin (with ptxas' report, warnings for spills) and PTX for the plan's arch."""
    from .runtime.nvrtc import compile_cubin, compile_ptx, warn_resources

    arch = built.plan.arch.value
    result = ptx_text = None
    with _stderr().status(f"compiling {built.plan.name} for {arch} with NVRTC"):
        if want_cubin:
            result = compile_cubin(built.source, built.plan.name, arch)
        if want_ptx:
            ptx_text = compile_ptx(built.source, built.plan.name, arch)
    if result is not None:
        warn_resources(result)
    return result, ptx_text


def _compile_summary(file, built, result, output, header, cubin, ptx,
                     sizes) -> dict[str, Any]:
    plan = built.plan
    summary: dict[str, Any] = {
        "file": file,
        "kernel": plan.name,
        "arch": plan.arch.value,
        "threads": plan.schedule.warps.threads,
        "smem_bytes": plan.smem_bytes,
        "smem_limit": plan.storage.limit_bytes,
        "outputs": {"cu": output, "header": header, "cubin": cubin, "ptx": ptx},
        # the lines kgen filled (the sizes', with --size), as kgen run --json shows them
        "schedule": {"lines": [[c.line, c.value] for c in plan.schedule.chosen]},
        "nvrtc": None,
        "warnings": _warnings_shown(),
        "sizes": sizes,  # --size's, the sizes the schedule was planned for
    }
    if result is not None:
        from .runtime.nvrtc import nvrtc_version

        summary["nvrtc"] = {"version": nvrtc_version(), "arch": result.arch,
                            "seconds": result.seconds, "cached": result.cached,
                            **result.resources()}
    if output is None:
        summary["source"] = built.source  # not written anywhere else
    return summary


def _check_writable(option: str, path: str) -> None:
    """A path the user names for an output must be writable: its folder exists (kgen makes
    none) and it is not a folder itself. A bad path is bad input (exit 2)."""
    target = Path(path)
    if target.is_dir():
        _fail(EXIT_BAD_INPUT, f"error: {option} {path}: is a directory", file=path)
    folder = target.parent
    if not folder.is_dir():
        _fail(EXIT_BAD_INPUT, f"error: {option} {path}: the folder {folder} does not exist "
                              "(kgen creates no folders)", file=path)


# ---------------------------------------------------------------------------------------------
# inspect


@cli.command("inspect")
@click.argument("file")
@_json_option("the plan")
@click.option("--resources", is_flag=True,
              help="Compile with NVRTC and show registers and spills (spills are warnings).")
@click.option("--arch", type=ARCH_CHOICE, default=None, help="Target instead of the kernels' own.")
@click.option("--kernel", "kernel_name", default=None, help="Only this kernel.")
@click.option("--size", "size_text", default=None,
              help="Plan with kgen tune's schedule for these sizes (e.g. M=4096,N=4096,K=4096) "
                   "on this GPU (or --gpu), when it has one.")
@click.option("--gpu", "gpu_name", default=None,
              help="With --size: the GPU of the tune entry, by name (default: the present one).")
@werror_option
@guarded
def inspect_command(file: str, as_json: bool, resources: bool, arch: str | None,
                    kernel_name: str | None, size_text: str | None, gpu_name: str | None,
                    werror: bool) -> None:
    """Show the plan: tiles, shared-memory layouts, storage map, params, resources."""
    from .api import arch_of, build_verified, compile_command as header_command, file_hash
    from .api import plan_kernel, read_module, safe_file_name, sized_config

    sizes = parse_assignments(size_text, "--size", _positive_int)
    if gpu_name is not None and size_text is None:
        _fail(EXIT_BAD_INPUT, "error: --gpu names the GPU of a tune entry: add --size")
    text = _read_text(file)
    summaries = []
    with _watching_warnings():
        module, _ = read_module(file)
        kernels, seqs = seq_cli.inspect_targets(module, kernel_name)
        target = arch_of(arch)
        for kernel in kernels:
            entry, tuning = _tune_entry(kernel, target, sizes, gpu_name) if size_text else \
                (None, None)
            config = entry.config if entry is not None else (
                sized_config(kernel, target, sizes, every=False) if size_text else None)
            if resources:
                name = safe_file_name(file)
                built = build_verified(kernel, target, source_name=name,
                                       source_hash=file_hash(text.encode()),
                                       command=header_command(name, target, kernel_name),
                                       config=config)
                plan = built.plan
                summary = plan_summary(plan, _resources(built))
            else:
                plan = plan_kernel(kernel, target, config=config, source=text)
                summary = plan_summary(plan)
            if tuning is not None:
                from .tune.select import describe

                summary["tuning"] = tuning or describe(plan, entry)
            summaries.append(summary)
    if as_json:
        document: dict[str, Any] = {"kernels": summaries, **seq_cli.sequence_json(seqs, target)}
        if _warnings_shown():
            document["warnings"] = _warnings_shown()
        click.echo(json.dumps(document, indent=2))
        return
    console = _stdout()
    for i, summary in enumerate(summaries):
        if i:
            console.print()
        print_plan(console, summary)
        if summary.get("tuning"):
            console.print(summary["tuning"])
    seq_cli.print_sequences(console, seqs, target)


def _tune_entry(kernel, target, sizes, gpu_name):
    """kgen tune's entry for `kgen inspect --size` and a line about it: (entry or None, "" to
    describe the plan, or why no entry was looked up)."""
    from .harness.inputs import resolve_sizes
    from .runtime.device import device_info, gpu_available
    from .tune.select import lookup

    dims = resolve_sizes(kernel, sizes)
    if gpu_name is None and not gpu_available():
        return None, "schedule: no GPU here to look up kgen tune's entry for (name one: --gpu)"
    gpu = gpu_name or device_info().name
    return lookup(kernel, target or kernel.target, gpu, dims), ""


def _resources(built) -> dict:
    from .runtime.nvrtc import compile_cubin, nvrtc_version, warn_resources

    with _stderr().status(f"compiling {built.plan.name} with NVRTC"):
        result = compile_cubin(built.source, built.plan.name, built.plan.arch.value)
    warn_resources(result)
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
@click.option("--size", "size_text", default=None,
              help="Sizes, e.g. M=4096,N=4096,K=4096 (L=8: a batch dimension L).")
@click.option("--check/--no-check", default=True, help="Compare with the NumPy reference.")
@click.option("--bench", is_flag=True, help="Time it (and PyTorch doing the same).")
@_json_option("the report")
@click.option("--arch", type=RUN_ARCH_CHOICE, default=None,
              help="Plan for this target instead (native: the GPU's own).")
@click.option("--kernel", "kernel_name", default=None, help="Which kernel, when FILE has several.")
@click.option("--seed", default=0, show_default=True, help="Seed of the random inputs.")
@click.option("--scalar", "scalar_text", default=None, help="Scalar values, e.g. alpha=1.5.")
@click.option("--iters", default=30, show_default=True, help="Timed runs (median taken).")
@click.option("--tuned/--no-tuned", default=True, show_default=True,
              help="Use kgen tune's schedule for these sizes on this GPU, when it has one.")
@click.option("--plot", "plot", default=None, metavar="FILE.png",
              help="With --bench, draw a roofline with the kernel and PyTorch on it "
                   "(needs matplotlib: kgen[plot]).")
@werror_option
@guarded
def run_command(file: str, size_text: str | None, check: bool, bench: bool, as_json: bool,
                arch: str | None, kernel_name: str | None, seed: int, scalar_text: str | None,
                iters: int, tuned: bool, plot: str | None, werror: bool) -> None:
    """Compile, run on random data, check against the reference, and benchmark."""
    from .api import arch_of, build_verified, compile_command as header_command, file_hash
    from .api import pick_kernel, read_module, safe_file_name, shown_path, sized_config
    from .api import warn_newer_gpu
    from .harness.inputs import check_scalar_names, resolve_sizes
    from .runtime.device import device_info, gpu_available

    # any size >= 0 (an empty M, N, K or L runs too); resolve_sizes refuses a negative one
    sizes = parse_assignments(size_text, "--size", int)
    scalars = parse_assignments(scalar_text, "--scalar", float)
    if iters < 1:
        _fail(EXIT_BAD_INPUT, "error: --iters must be at least 1")
    if plot is not None:
        if not bench:
            _fail(EXIT_BAD_INPUT, "error: --plot draws the timing: add --bench")
        _check_writable("--plot", plot)
        _require_matplotlib()
    _read_text(file)
    with _watching_warnings():
        module, text = read_module(file)
        kernel = pick_kernel(module, kernel_name)
        target = arch_of(arch)
        dims = resolve_sizes(kernel, sizes)  # a wrong size or scalar name is bad input
        check_scalar_names(kernel, scalars)
        if not gpu_available():
            _fail(EXIT_FAILED, "error: no CUDA GPU is available: kgen run needs one "
                               "(kgen compile and kgen inspect do not)")
        program = kernel.is_program  # a tile program: the loop rulebook's configuration
        entry = None
        if tuned and not program:
            from .tune.select import lookup

            entry = lookup(kernel, target or kernel.target, device_info().name, dims)
        name = safe_file_name(file)
        built = build_verified(kernel, target, source_name=name,
                               source_hash=file_hash(text.encode()),
                               command=header_command(shown_path(file), target, kernel_name),
                               config=entry.config if entry is not None else
                               None if program else
                               sized_config(kernel, target, sizes, every=False))
        result, device_id = _compile_for_device(built)  # --werror ends here, before the GPU
        if arch is None:  # the file's own target: is the GPU's faster?
            warn_newer_gpu(built.plan, device_info())
    from .harness.run import run
    from .runtime.launch import CompiledKernel
    from .runtime.program import CompiledProgram

    loaded = CompiledProgram if program else CompiledKernel
    compiled = loaded(built.plan, result.cubin, source=built.source, compiled=result,
                      device_id=device_id)

    with _stderr().status("starting") as status:
        report = run(built.kernel, built.plan, built.source, sizes, check=check, bench=bench,
                     seed=seed, progress=status.update, scalars=scalars, iters=iters,
                     compiled=compiled)
    from .tune.select import describe, tuned as took_tuned

    report.notes.insert(0, f"configuration: {built.plan.config.value} ({built.plan.config.why})"
                        if getattr(built.plan, "kind", None) == "loop_dag"
                        else describe(built.plan, entry))
    if plot is not None:
        from .plot import roofline

        roofline(report, plot)
    if as_json:
        document = report.as_dict()
        document["schedule"] = {"tuned": False, "entry": None, "lines": []} if program else {
            "tuned": took_tuned(built.plan),
            "entry": entry.as_dict() if entry is not None else None,
            "lines": [[c.line, c.value] for c in built.plan.schedule.chosen]}
        if plot is not None:
            document["plot"] = plot
        if _warnings_shown():
            document["warnings"] = _warnings_shown()
        click.echo(json.dumps(document, indent=2))
    else:
        print_run_report(_stdout(), report)
        if plot is not None:
            _stderr().print(f"roofline written to {plot}")
    if report.checked and not report.ok:
        sys.exit(EXIT_FAILED)


def _compile_for_device(built):
    """NVRTC's result for the present GPU's arch (ptxas' spills become warnings) and the
    GPU's id."""
    from .runtime.device import device_info
    from .runtime.nvrtc import compile_cubin, warn_resources

    info = device_info()
    with _stderr().status(f"compiling {built.plan.name} for {info.arch} with NVRTC"):
        result = compile_cubin(built.source, built.plan.name, info.arch)
    warn_resources(result)
    return result, info.device_id


def _require_matplotlib() -> None:
    from .plot import require_matplotlib

    require_matplotlib()  # KgenRuntimeError: exit 1, an environment problem



# `kgen tune` lives in its own module (it imports this one's helpers, so it comes last)
from .cli_tune import tune_command  # noqa: E402

cli.add_command(tune_command)


def main() -> None:
    cli(prog_name="kgen")


if __name__ == "__main__":
    main()
