"""`kgen compile` and `kgen inspect` of a file's sequence (kgen/sequence.py).

`kgen compile FILE` writes the file's sequence when it has one (or the sequence `--kernel NAME`
names): one .cu holding every launched kernel and the sequence's launcher, the .h with
--header, NVRTC's cubin or PTX with --cubin / --ptx, --check as for a kernel. `kgen inspect
FILE` shows each kernel's plan, then the sequence: its launches, parameters and workspace.
kgen/cli.py calls these; its helpers (warnings, atomic writes, the stale check) serve both.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click

__all__ = ["compile_sequence", "inspect_targets", "print_sequences", "sequence_json",
           "sequence_named"]


def sequence_named(file: str, name: str | None) -> bool:
    """Whether `kgen compile FILE [--kernel NAME]` means a sequence: NAME is a sequence's, or
    no NAME is given and the file has a sequence. Parses only: a file that does not parse is
    not a sequence's, and gets its message from the kernel's path (kgen compile verifies)."""
    from .errors import KgenError
    from .parse import parse_file

    try:
        module = parse_file(file)
    except KgenError:
        return False
    if name is not None:
        return any(s.name == name for s in module.sequences)
    return bool(module.sequences)


def compile_sequence(file: str, output: str | None, header: str | None, cubin: str | None,
                     ptx: str | None, arch: str | None, name: str | None, check_only: bool,
                     as_json: bool, size_text: str | None) -> None:
    """`kgen compile` of a sequence (the options are the command's, already checked)."""
    from .cli import EXIT_BAD_INPUT, _fail, _warnings_shown, _watching_warnings
    from .cli_outputs import _check_outputs, _write_outputs
    from .runtime.nvrtc import compile_cubin, compile_ptx, warn_resources
    from .sequence import build_sequence_file

    if size_text is not None:
        _fail(EXIT_BAD_INPUT, "error: --size plans one kernel for its sizes; a sequence's "
                              "kernels are planned without it (compile one with --kernel)")
    result = ptx_text = None
    with _watching_warnings():
        built = build_sequence_file(file, arch, name=name, output=output, header=header)
        if cubin:
            result = compile_cubin(built.source, built.name, built.arch.value)
            warn_resources(result)
        if ptx:
            ptx_text = compile_ptx(built.source, built.name, built.arch.value)
    texts = [(output, built.source)] + ([(header, built.header)] if header is not None else [])
    if check_only:
        _check_outputs(texts, as_json, lambda: {"sequence": built.name})
        return
    _write_outputs(texts, result, ptx_text, cubin, ptx, as_json)
    if as_json:
        summary: dict[str, Any] = {
            "file": file, "sequence": built.name, "arch": built.arch.value,
            "kernels": [b.plan.name for b in built.kernels],
            "outputs": {"cu": output, "header": header, "cubin": cubin, "ptx": ptx},
            "nvrtc": None if result is None else {"arch": result.arch, "cached": result.cached,
                                                  **result.resources()},
            "warnings": _warnings_shown(),
        }
        if output is None:
            summary["source"] = built.source
        click.echo(json.dumps(summary, indent=2))


def inspect_targets(module, name: str | None) -> tuple[list, list]:
    """What `kgen inspect FILE [--kernel NAME]` shows: (the kernels, the sequences' infos). A
    sequence's NAME shows its kernels and itself; a kernel's, that kernel alone."""
    from .api import pick_kernel
    from .sequence import pick_sequence
    from .verify.sequence import resolve

    if name is not None:
        sequence = pick_sequence(module, name)
        if sequence is None:
            return [pick_kernel(module, name)], []
        info = resolve(module, sequence)
        return list(info.kernels), [info]
    return list(module.kernels), [resolve(module, s) for s in module.sequences]


def sequence_json(infos: list, target) -> dict:
    """The sequences of `kgen inspect --json`: {"sequences": [...]}, or {} when none."""
    from .sequence import sequence_summary

    return {"sequences": [sequence_summary(info, target) for info in infos]} if infos else {}


def print_sequences(console, infos: list, target) -> None:
    """Print the sequences' summaries on `console`, after the kernels' plans."""
    from .sequence import print_sequence, sequence_summary

    for info in infos:
        console.print()
        print_sequence(console, sequence_summary(info, target))
