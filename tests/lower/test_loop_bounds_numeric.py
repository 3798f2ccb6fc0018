"""The loop bounds' constant folding in Python floats (kgen/lower/loop_bounds.py _PYTHON_OPS):
the same float64 bits as the reference's numpy_op on every pair (and triple) of special and
ordinary values, and an attention kernel planned without importing numpy."""
from __future__ import annotations

import itertools
import math
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kgen.lower import loop_bounds
from kgen.reference import numpy_op

VALUES = (-math.inf, -1e308, -2.5, -1.0, -0.0, 0.0, 5e-324, 1.0, 3.0, 1e308, math.inf,
          math.nan)
ARITY = {"NEG": 1, "EXP": 1, "WHERE": 3}


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


@pytest.mark.parametrize("op", sorted(loop_bounds._PYTHON_OPS, key=lambda o: o.name),
                         ids=lambda o: o.name)
def test_python_floats_give_numpy_s_bits(op):
    for args in itertools.product(VALUES, repeat=ARITY.get(op.name, 2)):
        with np.errstate(all="ignore"):
            want = float(numpy_op(op, *(np.float64(a) for a in args)))
        got = loop_bounds._numeric(op, args)
        if math.isnan(want):
            assert math.isnan(got), (op, args, got)
        else:
            assert _bits(got) == _bits(want), (op, args, got, want)


def test_exp_of_an_ordinary_value_is_numpy_s():
    assert loop_bounds._exp(0.5) is None  # not exact: the numpy path computes it
    with np.errstate(all="ignore"):
        assert loop_bounds._numeric(loop_bounds.Op.EXP, (0.5,)) == float(np.exp(0.5))


def test_planning_an_attention_kernel_imports_no_numpy():
    example = Path(__file__).resolve().parents[2] / "examples" / "attention_fwd.kg"
    code = ("import sys; from kgen.api import build_file; "
            f"build_file({str(example)!r}); print('numpy' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == "False", out.stdout + out.stderr
