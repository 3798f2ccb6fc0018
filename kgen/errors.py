"""User-facing errors: one exception type with a source location, rendered in one place."""
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


class KgenError(Exception):
    """A mistake in the user's kernel description. The CLI prints it and exits with code 2."""

    def __init__(self, loc: SourceLoc, message: str):
        super().__init__(message)
        self.loc = loc
        self.message = message

    def render(self, source: str | None = None) -> str:
        """`file:line:col: error: message`, then the source line and a caret span under it."""
        head = f"{self.loc}: error: {self.message}" if self.loc.line else f"error: {self.message}"
        if source is None or self.loc.line <= 0:
            return head
        lines = source.splitlines()
        if self.loc.line > len(lines):
            return head
        text = lines[self.loc.line - 1].expandtabs(1)
        start = max(self.loc.col - 1, 0)
        if self.loc.end_line == self.loc.line and self.loc.end_col > self.loc.col:
            width = self.loc.end_col - self.loc.col
        else:
            width = max(len(text.rstrip()) - start, 1)
        caret = " " * start + "^" + "~" * (width - 1)
        return f"{head}\n  {text}\n  {caret}"

    def __str__(self) -> str:
        return self.render()


class KgenRuntimeError(Exception):
    """A failure after the input was accepted: NVRTC, the driver, or a launch. Exit code 1."""


class ArgumentError(ValueError):
    """A runtime argument (tensor, scalar, size) the kernel cannot take; names the argument."""
