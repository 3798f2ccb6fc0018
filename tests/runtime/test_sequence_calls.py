"""A sequence's call path (kgen.runtime.sequence_calls), on the CPU: the attention backward's
three kernels as CompiledPrograms without a cubin, the driver's launch replaced by a recorder of
each parameter block, its allocations by stand-ins. One whole check per argument signature;
a later call of it launches each kernel's kept Binding with the call's addresses (the blocks
the whole check's path packs for the same arguments); a new signature, or a bad argument on a
later call, takes the whole check and its message; outputs given or allocated; torch tensors
(CPU ones standing in for CUDA ones) allocated per call by torch."""
from __future__ import annotations

import ctypes
import types

import numpy as np
import pytest
from cuda.bindings import driver

from kgen.attention_grad import BackwardSignature, backward_module
from kgen.enums import DType
from kgen.errors import ArgumentError
from kgen.runtime import buffers, calls, device, tensors
from kgen.runtime.calls import CallPath, struct_format
from kgen.runtime.launch import params_struct
from kgen.runtime.program import CompiledProgram
from kgen.runtime.sequence import CompiledSequence
from kgen.runtime.tensors import DeviceArray, contiguous_strides
from kgen.sequence import build_sequence, sequence_plan

WORKSPACE = 1 << 40  # the stand-in cuMemAllocAsync's block (a pool hands the freed one back)


class Counted(CompiledProgram):
    """A CompiledProgram without a GPU: the real argument check, counted in `checks`."""

    def __init__(self, plan, checks: list, zeroes: bool):  # noqa: D107 - no cubin to load
        self.plan = plan
        self.device_id = 0
        self._function = plan.name
        self._zero_function = f"{plan.name}_zero" if zeroes else None
        self._calls = CallPath(plan, lambda args, sizes: self)
        self._checks = checks

    def bind(self, sizes=None, **args):
        self._checks.append(self.plan.name)
        return super().bind(sizes, **args)


class Buffer:
    """DeviceBuffer's stand-in: an address, a shape, a dtype."""

    made = 0

    def __init__(self, shape, dtype, *, strides=None, device_id=None):
        Buffer.made += 1
        self.shape, self.dtype = tuple(shape), dtype
        self.strides = strides or contiguous_strides(self.shape)
        self.ptr = (1 << 36) + (Buffer.made << 24)

    def as_array(self):
        return DeviceArray(self.ptr, self.shape, self.strides, self.dtype, 0, kind="kgen",
                           owner=self)


@pytest.fixture
def launches(monkeypatch):
    """Each launch: (function, grid, stream, the params struct's bytes)."""
    seen = []
    sizes = {}

    def launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        (struct_at,) = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0:1]
        seen.append((function, (gx, gy, gz), int(stream),
                     ctypes.string_at(struct_at, sizes[function])))
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(driver, "cuLaunchKernel", launch)
    monkeypatch.setattr(driver, "cuMemAllocAsync", lambda size, stream: (
        driver.CUresult.CUDA_SUCCESS, WORKSPACE))
    monkeypatch.setattr(driver, "cuMemFreeAsync", lambda ptr, stream: (
        driver.CUresult.CUDA_SUCCESS,))
    monkeypatch.setattr(calls, "primary_context", lambda device_id: 0)
    monkeypatch.setattr(calls, "_current_context", lambda: 0)
    monkeypatch.setattr(device, "activate", lambda device_id: None)
    monkeypatch.setattr(buffers, "DeviceBuffer", Buffer)
    return types.SimpleNamespace(records=seen, sizes=sizes)  # sizes: the structs', by kernel


def backward(launches, checks: list | None = None, d: int = 64) -> CompiledSequence:
    module = backward_module(BackwardSignature("bf16", d, False, "sm_80"))
    built = build_sequence(module, module.sequences[0], "sm_80")
    checks = [] if checks is None else checks
    programs = tuple(Counted(b.plan, checks, b.plan.name.endswith("_main"))
                     for b in built.kernels)
    for program in programs:
        launches.sizes[program.plan.name] = struct_format(program.plan).size
    return CompiledSequence(sequence_plan(built.info, built.zeroing), programs)


def arr(shape, at: int, dtype=DType.BF16, by: int = 0):
    return DeviceArray(((at + 1) << 24) + by, tuple(shape), contiguous_strides(shape), dtype, 0,
                       kind="kgen")


def inputs(b=2, h=3, s=100, d=64, by=0, **changed):
    x = (b, h, s, d)
    args = dict(Q=arr(x, 0, by=by), K=arr(x, 1, by=by), V=arr(x, 2, by=by), O=arr(x, 3, by=by),
                dO=arr(x, 4, by=by), lse=arr(x[:3], 5, DType.F32, by=by), scale=0.125)
    args.update(changed)
    return args


def outputs(b=2, h=3, s=100, d=64, by=0):
    x = (b, h, s, d)
    return dict(dQ=arr(x, 6, by=by), dK=arr(x, 7, by=by), dV=arr(x, 8, by=by))


def address(seq, record, name: str) -> int:
    """The address member `name` of a recorded launch's params struct."""
    plan = next(p.plan for p in seq.programs if p.plan.name == record[0])
    offset = getattr(params_struct(plan), name).offset
    return int.from_bytes(record[3][offset:offset + 8], "little")


def test_one_check_per_signature_and_the_blocks_of_the_whole_check(launches):
    checks = []
    seq = backward(launches, checks)
    seq(**inputs(), **outputs())
    assert len(checks) == 3 and len(launches.records) == 3  # each kernel checked once
    moved = dict(inputs(by=0x100000), **outputs(by=0x100000), scale=0.25)  # same low bits
    seq(stream=7, **moved)
    seq(stream=7, **moved)
    assert len(checks) == 3  # later calls of the signature: no check
    fast = launches.records[3:6]
    assert fast == launches.records[6:9]
    # the whole check's path packs the same blocks for the same arguments
    other = backward(launches)
    del launches.records[:]
    other.call_checked(7, None, moved)
    assert launches.records == fast
    assert [f for f, *_ in fast] == [p.plan.name for p in seq.programs]
    assert all(stream == 7 for _, _, stream, _ in fast)


def test_a_new_shape_is_checked_again_and_a_bad_later_call_has_its_message(launches):
    checks = []
    seq = backward(launches, checks)
    seq(**inputs(), **outputs())
    seq(**inputs(s=200), **outputs(s=200))
    assert len(checks) == 6
    assert launches.records[3][1] != launches.records[0][1]  # another grid for S = 200
    seq(**inputs(), **outputs())
    assert len(checks) == 6
    kept = launches.records[6:9]
    assert kept == launches.records[:3]
    bad = [  # a later call's bad argument: the message a first call gets
        inputs(K=arr((2, 3, 100, 32), 1)),
        inputs(Q=arr((2, 3, 100, 64), 0, DType.F16)),
        inputs(Q=arr((2, 3, 100, 64), 0, by=8)),
        inputs(lse=arr((2, 3, 99), 5, DType.F32)),
        inputs(lse=np.zeros((2, 3, 100), np.float32)),
        dict(inputs(), sizes_extra=1),
        dict(inputs(), dQ=arr((2, 3, 100, 32), 6)),
    ]
    for args in bad:
        messages = []
        for sequence in (backward(launches), seq, seq):  # a fresh one's first call, seq's
            with pytest.raises(ArgumentError) as info:
                sequence(**args)
            messages.append(str(info.value))
        assert messages[1] == messages[2] == messages[0], args
    with pytest.raises(ArgumentError, match=r"sizes\['S'\] must be a non-negative int"):
        seq(sizes={"S": -1}, **inputs())
    seq(**inputs(), **outputs())  # the signature still kept, its blocks as before
    assert launches.records[-3:] == kept


def test_outputs_given_are_the_ones_returned_and_missing_ones_allocated(launches):
    seq = backward(launches)
    given = outputs()
    for _ in range(2):
        assert seq(**inputs(), **given) == (given["dK"], given["dV"], given["dQ"])
    for _ in range(2):
        made = Buffer.made
        dk, dv, dq = seq(**inputs())
        assert Buffer.made == made + 3  # per call
        assert [x.shape for x in (dk, dv, dq)] == [(2, 3, 100, 64)] * 3
        last = launches.records[-1]
        assert address(seq, last, "dQ") == dq.ptr
        # dQacc: the workspace block's second buffer, after D's f32 [2, 3, 100] (256-aligned)
        assert address(seq, last, "dQacc") == WORKSPACE + 2560
    half = dict(outputs(), dK=None)  # one given, two left out
    dk, dv, dq = seq(**inputs(), **half)
    assert dq is half["dQ"] and dv is half["dV"] and isinstance(dk, Buffer)


def test_a_scalar_not_a_python_number_takes_the_whole_check_each_call(launches):
    checks = []
    seq = backward(launches, checks)
    seq(**inputs(scale=np.float32(0.5)), **outputs())
    seq(**inputs(scale=np.float32(0.5)), **outputs())
    # the main kernel, which takes the scale, checks each call; the others keep theirs
    assert checks[3:] == [seq.programs[1].plan.name]
    seq(**inputs(scale=0.5), **outputs())
    seq(**inputs(scale=0.5), **outputs())
    assert len(checks) == 5  # the main kernel's first call of a float scale, then none
    assert launches.records[-3:] == launches.records[:3]  # 0.5 packed alike


def test_torch_tensors_are_allocated_per_call_on_their_device(launches, monkeypatch):
    """CPU tensors standing in for CUDA ones (their device read as cuda:0), the stream 0."""
    torch = pytest.importorskip("torch")

    def from_torch(t, name):
        return DeviceArray(int(t.data_ptr()), tuple(t.shape), tuple(t.stride()),
                           tensors._TORCH_NAMES.get(str(t.dtype)), 0, kind="torch", owner=t)

    monkeypatch.setattr(tensors, "_from_torch", from_torch)
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda index: 0, raising=False)
    monkeypatch.setattr(torch.cuda, "current_stream",
                        lambda device=None: types.SimpleNamespace(cuda_stream=0))
    empty = torch.empty
    made = []

    def counted_empty(*shape, **kwargs):
        made.append(shape)
        return empty(*shape, **kwargs)

    monkeypatch.setattr(torch, "empty", counted_empty)
    checks = []
    seq = backward(launches, checks)
    x = (1, 2, 40, 64)
    args = {n: torch.randn(x).to(torch.bfloat16) for n in ("Q", "K", "V", "O", "dO")}
    args["lse"] = torch.randn(x[:3])
    first = seq(**args)
    later = seq(**args)
    # each call: the workspace one block (D's f32 [1, 2, 40] in 512 bytes, then dQacc's
    # 20480), then dK, dV, dQ
    assert len(checks) == 3 and made == [((20992,),)] + [(x,)] * 3 + [((20992,),)] + [(x,)] * 3
    for a, b in zip(first, later):
        assert a.shape == b.shape == x and a.dtype == b.dtype == torch.bfloat16
    dk, dv, dq = later
    *_, main, last = launches.records
    assert address(seq, last, "dQ") == dq.data_ptr()
    assert (address(seq, main, "Q"), address(seq, main, "dK"), address(seq, main, "dV")) == (
        args["Q"].data_ptr(), dk.data_ptr(), dv.data_ptr())
    assert address(seq, main, "dQacc") == address(seq, last, "dQacc") != 0
    assert address(seq, main, "dQacc") == address(seq, main, "D") + 512
