"""User-facing errors and warnings: one exception type and one warning record, each with a source
location, rendered in one place (`render`)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SourceLoc:
    """A span in a source file; lines and columns count from 1, end_col is exclusive."""

    file: str
    line: int
    col: int
    end_line: int
    end_col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


# The location of IR built from Python without a source file.
NOWHERE = SourceLoc("<python>", 0, 0, 0, 0)


def render(loc: SourceLoc, severity: str, message: str, source: str | None = None) -> str:
    """`file:line:col: severity: message`, then the source line and a caret span under it."""
    head = f"{loc}: {severity}: {message}" if loc.line else f"{severity}: {message}"
    if source is None or loc.line <= 0:
        return head
    lines = source.splitlines()
    if loc.line > len(lines):
        return head
    text = lines[loc.line - 1].expandtabs(1)
    start = max(loc.col - 1, 0)
    if loc.end_line == loc.line and loc.end_col > loc.col:
        width = loc.end_col - loc.col
    else:
        width = max(len(text.rstrip()) - start, 1)
    caret = " " * start + "^" + "~" * (width - 1)
    return f"{head}\n  {text}\n  {caret}"


class KgenError(Exception):
    """A mistake in the user's kernel description. The CLI prints it and exits with code 2."""

    def __init__(self, loc: SourceLoc, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message

    def render(self, source: str | None = None) -> str:
        """`file:line:col: error: message`, then the source line and a caret span under it."""
        return render(self.loc, "error", self.message, source)

    def __str__(self) -> str:
        return self.render()


@dataclass(frozen=True, slots=True)
class KgenWarning:
    """Something accepted that is probably not what the user meant (a local no store uses).

    Collected, never raised: `kgen.verify.verify` returns them. The CLI prints each as
    `file:line:col: warning: message` with the source line and a caret, like an error."""

    loc: SourceLoc
    message: str

    def render(self, source: str | None = None) -> str:
        return render(self.loc, "warning", self.message, source)

    def __str__(self) -> str:
        return self.render()


class KgenSourceWarning(UserWarning):
    """A KgenWarning raised as a Python warning by `kgen.api.read_module`, its message already
    rendered (`file:line:col: warning: ...`, the source line, a caret): the CLI prints it as is,
    or fails under --werror."""


class KgenSlowPathWarning(KgenSourceWarning):
    """A written schedule line that makes the target plan a slower path than it plans without
    the line (the mma.sync kernel on sm_90a, where the warp-specialized wgmma kernel plans):
    `kgen.lower.slow_path_warning` finds it, `kgen.api` warns with it, rendered like its base class.
    `warnings.simplefilter("error", KgenSlowPathWarning)` makes it an exception; --werror makes
    it exit 2."""


class KgenTargetWarning(RuntimeWarning):
    """A kernel planned for its own target runs on a newer GPU whose own target has a faster
    path (an sm_80 file on an H100): `kgen.load` and `kgen run` warn once, with how to plan for
    the GPU's target (`kgen.runtime.device.newer_target`)."""


class KgenRuntimeError(Exception):
    """A failure after the input was accepted: NVRTC, the driver, or a launch. Exit code 1."""


class ArgumentError(ValueError):
    """A runtime argument (tensor, scalar, size) the kernel cannot take; names the argument."""
