"""The call path (kgen.runtime.calls) on the CPU: the packed params struct is the one the
kernel declares, each argument signature is checked once, and anything a check reads (dtype,
shape, strides, alignment, sizes) starts a new check with the same message. The driver's launch
is replaced by a recorder of the parameter block it would copy."""
from __future__ import annotations

import ctypes
import struct
from pathlib import Path

import pytest
from cuda.bindings import driver

from kgen.api import build_file
from kgen.enums import DType
from kgen.errors import ArgumentError
from kgen.plan import FieldKind
from kgen.runtime import calls, tma
from kgen.runtime.calls import CallPath, struct_format
from kgen.runtime.launch import bind_arguments, params_struct
from kgen.runtime.tensors import DeviceArray, contiguous_strides

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


GOLDEN = Path(__file__).resolve().parents[1] / "golden"


@pytest.mark.parametrize("example, arch", sorted(
    tuple(p.name.split(".")[:2]) for p in GOLDEN.glob("*.cu")))
def test_the_packed_struct_is_the_params_struct(example, arch):
    plan = build_file(EXAMPLES / f"{example}.kg", arch).plan
    fmt = struct_format(plan)
    ctype = params_struct(plan)
    codes = fmt.format[1:]
    for i, member in enumerate(plan.fields):
        offset = struct.calcsize("@" + codes[:i + 1]) - struct.calcsize(codes[i])
        assert offset == getattr(ctype, member.name).offset, member.name
    assert fmt.size <= ctypes.sizeof(ctype)


class FakeKernel:
    """What the call path reads of a CompiledKernel, with the real argument check."""

    def __init__(self, plan):
        self.plan = plan
        self.device_id = 0
        self.persistent_ctas = 132 if plan.schedule.scheduler.persistent else None
        self.persistent_clusters = None
        self._function = "fast"
        self._init_function = self._finalize_function = self._split_function = None
        self.checks = 0

    def _narrow_entry(self):
        return "narrow"

    def bind(self, sizes=None, **args):
        self.checks += 1
        return bind_arguments(self.plan, args, sizes=sizes, device_id=0, device_of=lambda p: 0,
                              persistent_ctas=self.persistent_ctas)


def array(ptr, shape, dtype, strides=None):
    return DeviceArray(ptr=ptr, shape=shape, strides=strides or contiguous_strides(shape),
                       dtype=dtype, device_id=0, kind="kgen")


@pytest.fixture
def launches(monkeypatch):
    """Each launch: (function, grid, the params struct's bytes, the tensor maps' address)."""
    seen = []

    def launch(function, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        struct_at, maps_at = ctypes.cast(params, ctypes.POINTER(ctypes.c_void_p))[0:2]
        seen.append((function, (gx, gy, gz), struct_at, maps_at))
        return (driver.CUresult.CUDA_SUCCESS,)

    monkeypatch.setattr(driver, "cuLaunchKernel", launch)
    monkeypatch.setattr(calls, "primary_context", lambda device_id: 0)
    monkeypatch.setattr(calls, "_current_context", lambda: 0)
    monkeypatch.setattr(tma, "encode", lambda keys: bytes(str(keys), "ascii")[:128].ljust(
        128 * len(keys), b"\0"))
    return seen


def gemm(arch="sm_90a"):
    kernel = FakeKernel(build_file(EXAMPLES / "gemm_bias_relu.kg", arch).plan)
    return kernel, CallPath(kernel.plan, lambda args, sizes: kernel)


def arguments(base=0x10000, m=1000, n=520, k=136, ld_a=None):
    return dict(A=array(base, (m, k), DType.F16, (ld_a or k, 1)),
                B=array(base + 0x100000, (k, n), DType.F16, (1, k)),
                C=array(base + 0x200000, (m, n), DType.F16),
                D=array(base + 0x300000, (m, n), DType.F16),
                bias=array(base + 0x400000, (n,), DType.F32))


def packed(kernel, struct_at) -> bytes:
    return ctypes.string_at(struct_at, struct_format(kernel.plan).size)


def expected(kernel, args, **scalars) -> bytes:
    bound = kernel.bind(**args, **scalars)
    kernel.checks -= 1
    values = {name: value for name, value in bound.values.items()}
    return bytes(params_struct(kernel.plan)(**values))[:struct_format(kernel.plan).size]


def test_one_check_per_signature_and_the_struct_of_each_call(launches):
    kernel, call = gemm()
    first = arguments()
    call(None, None, dict(first))
    moved = arguments(base=0x7000000)  # other addresses, same low bits: the same signature
    call(None, None, dict(moved, alpha=0.25))
    assert kernel.checks == 1
    (_, grid, _, maps_first), (_, _, struct_at, maps_moved) = launches
    assert grid[0] >= 1 and maps_first and maps_moved
    # the block holds the last call's struct: its addresses and its scalar
    assert packed(kernel, struct_at) == expected(kernel, moved, alpha=0.25)


def test_tensor_maps_follow_the_addresses(launches):
    kernel, call = gemm()
    call(None, None, arguments())
    call(None, None, arguments(base=0x7000000))
    call(None, None, arguments())
    maps = [m for *_, m in launches]
    assert maps[0] != maps[1] and maps[2] == maps[0]  # encoded once per address set


@pytest.mark.parametrize("change", ["padded rows", "misaligned", "sizes"])
def test_what_a_check_reads_checks_again(launches, change):
    kernel, call = gemm("sm_80")
    call(None, None, arguments())
    if change == "padded rows":
        call(None, None, arguments(ld_a=144))
    elif change == "misaligned":
        args = arguments()
        args["A"] = array(0x10008, (1000, 136), DType.F16)  # 8 bytes off: the narrow one
        call(None, None, args)
        assert launches[-1][0] == "narrow"
    else:
        call(None, {"M": 1000}, arguments())
    assert kernel.checks == 2
    assert launches[0][0] == "fast"


def test_a_bad_argument_has_its_message_every_time(launches):
    kernel, call = gemm()
    good = arguments()
    call(None, None, dict(good))
    bad = dict(good, bias=array(0x500000, (521,), DType.F32))
    for _ in range(2):
        with pytest.raises(ArgumentError, match="N differs"):
            call(None, None, dict(bad))
    with pytest.raises(ArgumentError, match="unknown argument 'bais'"):
        call(None, None, dict(good, bais=good["bias"]))
    with pytest.raises(ArgumentError, match="alpha is a scalar"):
        call(None, None, dict(good, alpha="1.5"))
    assert len(launches) == 1


def test_the_workspace_and_stream_k_flags(launches, monkeypatch):
    """A split-K or stream-K plan gets a workspace per launch, stream-ordered; stream-K's
    flags (past every CTA's slot) are zeroed on the launch's stream first."""
    plan = build_file(EXAMPLES / "splitk_gelu.kg", "sm_90a").plan
    kernel = FakeKernel(plan)
    kernel._split_function = "split" if plan.split_kernel else None
    call = CallPath(plan, lambda args, sizes: kernel)
    events = []
    monkeypatch.setattr(driver, "cuMemAllocAsync",
                        lambda size, stream: events.append(("alloc", size)) or (
                            driver.CUresult.CUDA_SUCCESS, 0x9000000))
    monkeypatch.setattr(driver, "cuMemFreeAsync",
                        lambda ptr, stream: events.append(("free", ptr)) or (
                            driver.CUresult.CUDA_SUCCESS,))
    args = {p.name: array(0x10000 * (i + 1), tuple(512 if d == "M" else 256 if d == "N" else
                                                     4096 if d == "K" else d for d in p.shape),
                          p.dtype, (1, 4096) if p.layout.value == "col" and len(p.shape) == 2
                          else None)
            for i, p in enumerate(plan.params) if p.kind is not plan.params[0].kind.SCALAR}
    call(None, None, args)
    fields = {f.name: f for f in plan.fields}
    workspace = [name for name, f in fields.items() if f.kind is FieldKind.WORKSPACE]
    assert workspace
    floats = plan.workspace_floats(kernel.bind(**args).sizes, kernel.persistent_ctas)
    assert events == [("alloc", 4 * floats), ("free", 0x9000000)]
    assert [f for f, *_ in launches][-1] == ("split" if plan.split_kernel else "fast")


def test_bindings_are_bounded(launches, monkeypatch):
    monkeypatch.setattr(calls, "MAX_BINDINGS", 3)
    kernel, call = gemm()
    for m in range(1, 8):
        call(None, None, arguments(m=m))
    assert len(call._bindings) <= 3


def test_a_variant_is_chosen_once_per_signature(launches):
    """A tuned kernel's call path asks for the variant of a signature once (its sizes fix it)."""
    plan = build_file(EXAMPLES / "gemm_bias_relu.kg", "sm_90a").plan
    variants = {1000: FakeKernel(plan), 64: FakeKernel(plan)}
    asked = []

    def choose(args, sizes):
        asked.append(args["A"].shape[0])
        return variants[args["A"].shape[0]]

    call = CallPath(plan, choose)
    for m in (1000, 64, 1000, 64):
        call(None, None, arguments(m=m))
    assert asked == [1000, 64]
    assert variants[1000].checks == 1 and variants[64].checks == 1
