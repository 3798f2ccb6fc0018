"""For the tune tests: examples with their schedule lines deleted, and a stand-in for the GPU."""
from __future__ import annotations

import re
from pathlib import Path

from kgen.errors import ArgumentError
from kgen.harness.timing import Timing
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


class FakeBench:
    device_name = "Fake GPU 80GB"
    compile_arch = "sm_90a"

    def __init__(self, times=None, failing=(), unrunnable=()):
        self.times = times or {}
        self.failing = set(failing)
        self.unrunnable = set(unrunnable)
        self.dims = dict(SIZES)
        self.flops = 2 * 4096 ** 3
        self.timed: list[str] = []
        self.checked: list[str] = []

    def load(self, candidate, compiled):
        assert compiled.cubin == f"cubin {candidate.index}".encode()
        if candidate.label in self.unrunnable:
            raise ArgumentError(f"{candidate.label} cannot run these sizes")
        return candidate

    def time(self, loaded, iters):
        self.timed.append(loaded.label)
        ms = self.times.get(loaded.label, 2.0 + loaded.index / 100)
        return Timing(ms, ms, ms, iters, 1, (ms,) * iters)

    def check(self, candidate, loaded):
        self.checked.append(candidate.label)
        bad = candidate.label in self.failing
        return not bad, "D: 12 bad, 0 unwritten" if bad else ""
