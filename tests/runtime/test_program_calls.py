"""Tile programs through the gemms' call path (kgen.runtime.calls.CallPath), on the CPU: a
CompiledProgram's calls are checked once per argument signature, and the packed parameter
block is the params struct with each call's addresses and scalars. The driver's launch is
replaced by a recorder, as in test_calls."""
from __future__ import annotations

import ctypes

import pytest
from cuda.bindings import driver

from kgen.enums import DType
from kgen.errors import ArgumentError
from kgen.lower import lower
from kgen.runtime import calls
from kgen.runtime.calls import CallPath, struct_format
from kgen.runtime.launch import params_struct
from kgen.runtime.program import CompiledProgram

from tests import loop_kernels as lk
from tests.runtime.test_program_binding import arr, attention_args


class Counted(CompiledProgram):
    """A CompiledProgram without a GPU: the real argument check, counted."""

    def __init__(self, plan):  # noqa: D107 - no cubin to load
        self.plan = plan
        self.device_id = 0
        self._function = "program"
        self._calls = CallPath(plan, lambda args, sizes: self)
        self.checks = 0

    def bind(self, sizes=None, **args):
        self.checks += 1
        return super().bind(sizes, **args)


@pytest.fixture
def launches(monkeypatch):
    seen = []

    def launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        (struct_at,) = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0:1]
        seen.append((function, (gx, gy, gz), bx, smem, int(stream), struct_at))
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(driver, "cuLaunchKernel", launch)
    monkeypatch.setattr(calls, "primary_context", lambda device_id: 0)
    monkeypatch.setattr(calls, "_current_context", lambda: 0)
    return seen


def moved(args, by):
    return {name: arr(a.shape, a.dtype, a.strides, a.ptr + by) for name, a in args.items()}


def expected(program, args, **scalars) -> bytes:
    bound = CompiledProgram.bind(program, None, **args, **scalars)
    return bytes(params_struct(program.plan)(**bound.values))[:struct_format(program.plan).size]


def test_one_check_per_signature_and_each_calls_struct(launches):
    program = Counted(lower(lk.attention(64, gqa=True)))
    first = attention_args()
    program(7, None, **first)
    later = moved(first, 0x100000)  # other addresses, same low bits: the same signature
    program(7, None, **later, scale=0.5)
    assert program.checks == 1
    (function, grid, threads, smem, stream, _), (*_, struct_at) = launches
    assert (function, grid, threads, smem, stream) == (
        "program", (1, 8, 2), program.plan.threads, program.plan.smem_bytes, 7)
    packed = ctypes.string_at(struct_at, struct_format(program.plan).size)
    assert packed == expected(program, later, scale=0.5)


def test_a_new_shape_is_checked_again_with_its_message(launches):
    program = Counted(lower(lk.attention(64, gqa=True)))
    program(0, None, **attention_args())
    program(0, None, **attention_args(s=200))
    assert program.checks == 2 and launches[1][1] == (2, 8, 2)
    with pytest.raises(ArgumentError, match="16-byte aligned"):
        program(0, None, **moved(attention_args(), 8))


def test_a_row_kernel_goes_the_same_way(launches):
    program = Counted(lower(lk.rowdot()))
    args = dict(dO=arr((2, 4, 33, 128)), O=arr((2, 4, 33, 128)), D=arr((2, 4, 33), DType.F32))
    assert program(0, None, **args) is args["D"]
    assert launches[0][1] == (-(-33 // program.plan.rows_per_cta), 4, 2)
