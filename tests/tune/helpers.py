"""Kernels for the tune tests: examples with their schedule lines deleted."""
from __future__ import annotations

import re
from pathlib import Path

from kgen.parse import parse
from kgen.verify import verify

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
_LINES = re.compile(r"^[ \t]*(tile|warps|stages|split|schedule|keep)\b[^\n]*\n", re.M)


def strip_schedule(text: str) -> str:
    """The .kg text without its schedule lines (whole lines that start with one)."""
    return _LINES.sub("", text)


def example_text(name: str, *, stripped: bool = True) -> str:
    text = (EXAMPLES / f"{name}.kg").read_text()
    return strip_schedule(text) if stripped else text


def kernel_of(text: str, file: str = "t.kg"):
    module = parse(text, file)
    verify(module)
    return module.kernels[0]


SIZES = {"M": 4096, "N": 4096, "K": 4096}
