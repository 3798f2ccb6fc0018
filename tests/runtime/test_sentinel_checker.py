"""The sentinel checker of tests/gpu/test_sentinel.py, on the CPU (needs torch, not a GPU): a
simulated kernel writes the reference into the outputs, then one byte too many somewhere, and
the checker must say where."""
from __future__ import annotations

import numpy as np
import pytest

from tests.gpu.test_sentinel import (
    EXAMPLES,
    MARGIN,
    check_guards,
    guarded_arguments,
    sizes_of,
)


def _simulate(torch, kernel, guards, host, scalars, stray=None):
    from kgen.reference import evaluate

    for name, values in evaluate(kernel, host, scalars).items():
        guard = guards[name]
        cpu = torch.from_numpy(np.asarray(values, dtype=np.float32)).reshape(guard.view.shape)
        guard.view.copy_(cpu.to(guard.view.dtype))
    if stray is not None:
        name, offset = stray
        buffer = guards[name].buffer
        buffer[MARGIN + offset] = int(buffer[MARGIN + offset]) ^ 0x01


def test_the_checker_catches_stray_writes():
    torch = pytest.importorskip("torch")
    from kgen.api import build_file

    example = next((p for p in EXAMPLES if p.stem == "gemm_bias_relu"), None)
    if example is None:
        pytest.skip("no gemm_bias_relu example")
    kernel = build_file(example).kernel
    sizes = sizes_of(kernel, (130, 258, 72))

    def run(stray=None):
        guards, host, scalars = guarded_arguments(torch, kernel, sizes, "cpu")
        for guard in guards.values():
            guard.snapshot()
        _simulate(torch, kernel, guards, host, scalars, stray)
        return guards, check_guards(torch, kernel, guards, host, scalars)

    guards, problems = run()
    assert problems == []
    d = guards["D"]
    item = d.param.dtype.nbytes
    row_bytes = d.inner * item
    for where, offset in [("before", -1), ("row padding", row_bytes),
                          ("last row's padding", (d.outer - 1) * d.ld * item + row_bytes),
                          ("after", d.nbytes)]:
        _, problems = run(("D", offset))
        assert any("outside the output" in p and f"[{offset}]" in p for p in problems), where
    _, problems = run(("A", 0))
    assert any(p.startswith("A: bytes changed in an input") for p in problems)
    _, problems = run(("bias", -2))
    assert any(p.startswith("bias:") for p in problems)

    # an element left unwritten (still the NaN poison) is an output mismatch
    guards, host, scalars = guarded_arguments(torch, kernel, sizes, "cpu")
    for guard in guards.values():
        guard.snapshot()
    _simulate(torch, kernel, guards, host, scalars)
    guards["D"].view[129, 257] = float("nan")
    problems = check_guards(torch, kernel, guards, host, scalars)
    assert any(p.startswith("D:") and "unwritten" in p for p in problems), problems
