"""`kgen compile`'s outputs: written atomically where the user names them, or checked against
the files on disk (`--check`), for one kernel (kgen/cli.py) and for a sequence
(kgen/cli_sequence.py) alike."""
from __future__ import annotations

import difflib
import json
import os
import sys
from pathlib import Path

import click

from . import __version__

DIFF_LINES = 20


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


def _check_outputs(texts, as_json: bool, what) -> None:
    """`--check`: the written outputs against the ones emitted now (exit 1 where stale);
    `what()`: the JSON's name of what was compiled (asked only under --json)."""
    from .cli import EXIT_FAILED, _fail

    stale = [message for path, text in texts if (message := _stale(path, text))]
    if as_json:
        click.echo(json.dumps({**what(), "check": {
            "ok": not stale, "stale": [p for p, t in texts if _stale(p, t)],
            "messages": stale}}, indent=2))
        sys.exit(EXIT_FAILED if stale else 0)
    if stale:
        _fail(EXIT_FAILED, "\n".join(stale))


def _write_outputs(texts, result, ptx_text, cubin, ptx, as_json: bool) -> None:
    """The emitted texts to their paths (stdout where none is given), then the cubin and PTX."""
    for path, text in texts:
        if path is not None:
            _write_atomic(Path(path), text)
        elif not (cubin or ptx or as_json):
            click.echo(text, nl=False)
    if cubin:
        _write_atomic(Path(cubin), result.cubin)
    if ptx:
        _write_atomic(Path(ptx), ptx_text)


def _write_atomic(path: Path, data: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.kgen-tmp")
    try:
        if isinstance(data, bytes):
            tmp.write_bytes(data)
        else:
            tmp.write_text(data)
        os.replace(tmp, path)
    except OSError as err:  # a path the user gave that cannot be written: bad input
        from .cli import EXIT_BAD_INPUT, _fail

        _fail(EXIT_BAD_INPUT, f"error: cannot write {path}: {err.strerror or err}",
              file=str(path))
