"""Tile programs at run time: the argument check and grid of a loop or row kernel (pure:
`bind_program`), and `CompiledProgram`, a loaded program called with keywords as a gemm is.

Arguments: a parameter with two batch dims is a 4-D tensor [B, H, rows, cols] (3-D vector
[B, H, rows]), one batch dim 3-D ([B, rows, cols]), none 2-D; any strides with a unit stride
along the layout's contiguous dim. Sizes (S, T, M, N0, B, H, HKV) are read from the arguments
and must agree. GQA: H % HKV == 0. The loop's operands are copied 16 bytes at a time, so every
tensor's address and strides are multiples of 16 bytes.
"""
from __future__ import annotations

import ctypes
import struct
import sys
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ..enums import Layout, Role
from ..errors import ArgumentError, KgenRuntimeError
from ..plan.program import LoopPlan, ProgramParam, ProgramPlan
from .tensors import DeviceArray, as_device_array

_FORMATS = {"ptr": "P", "i64": "q", "i32": "i", "f32": "f"}


@dataclass(frozen=True, slots=True)
class BoundProgram:
    values: tuple  # in the order of plan.fields (an output not given: its pointer 0)
    grid: tuple[int, int, int]
    sizes: dict[str, int]
    arrays: dict[str, DeviceArray]
    missing: dict[str, tuple[int, ...]]  # outputs not given: their (contiguous) shapes


def params_format(plan: ProgramPlan) -> struct.Struct:
    """The params struct in native alignment, as the kernel's `<name>_params` lays it out."""
    return struct.Struct("@" + "".join(_FORMATS[f.ctype] for f in plan.fields))


def _dims(param: ProgramParam) -> tuple:
    lead = (("B",) if param.batched else ()) + (("H",) if param.headed else ())
    return lead, param.shape


def bind_program(plan: ProgramPlan, args: Mapping[str, Any],
                 sizes: Mapping[str, int] | None = None) -> BoundProgram:
    """Check the arguments against the plan; the params struct's values and the grid."""
    known = {p.name for p in plan.params}
    unknown = [name for name in args if name not in known]
    if unknown:
        raise ArgumentError(f"unknown argument {unknown[0]!r}; {plan.name} takes "
                            + ", ".join(p.name for p in plan.params))
    resolved: dict[str, int] = dict(sizes or {})
    arrays: dict[str, DeviceArray] = {}
    batch_dims: dict[str, int] = {}  # "B", "H", "HKV" as read
    missing = []
    for p in plan.params:
        if p.kind == "scalar":
            continue
        if args.get(p.name) is None:
            if p.role is not Role.OUT:
                raise ArgumentError(f"{plan.name}: missing argument {p.name!r}")
            missing.append(p)
            continue
        array = as_device_array(args[p.name], p.name)
        if array.dtype is not p.dtype:
            raise ArgumentError(f"{p.name} must be {p.dtype.dsl_name}, got "
                                f"{array.describe_dtype()}")
        lead = int(p.batched) + int(p.headed)
        want = lead + len(p.shape)
        if array.ndim != want:
            raise ArgumentError(f"{p.name} must have {want} dims ({_described(p)}), got shape "
                                f"{list(array.shape)}")
        if p.batched:
            _agree(batch_dims, "B", array.shape[0], p.name)
        if p.headed:
            _agree(batch_dims, "HKV" if p.kv else "H", array.shape[int(p.batched)], p.name)
        for dim, extent in zip(p.shape, array.shape[lead:]):
            if isinstance(dim, int):
                if extent != dim:
                    raise ArgumentError(f"{p.name} must be {_described(p)}, got shape "
                                        f"{list(array.shape)}")
            else:
                _agree(resolved, dim, extent, p.name)
        arrays[p.name] = array
    shapes = {p.name: _shape_of(p, batch_dims, resolved) for p in missing}
    heads = batch_dims.get("H", 1)
    kv_heads = batch_dims.get("HKV", heads)
    if heads % kv_heads:
        raise KgenRuntimeError(f"{plan.name}: the query heads H = {heads} must be a multiple "
                               f"of the KV heads HKV = {kv_heads} (GQA)")
    rows = resolved[plan.rows_dim] if isinstance(plan.rows_dim, str) else plan.rows_dim
    loop_len = 0
    if isinstance(plan, LoopPlan):
        loop_len = resolved[plan.loop_dim]
        for tile in (plan.b_tile, plan.c_tile):
            if not tile.rows_along_loop and loop_len % 8:
                raise KgenRuntimeError(
                    f"{plan.name}: {tile.param} is streamed along {plan.loop_dim} in 16-byte "
                    f"chunks, so {plan.loop_dim} must be a multiple of 8 (it is {loop_len})")
    values = []
    for f in plan.fields:
        if f.param is None:
            values.append({"rows": rows, "loop_len": loop_len, "heads": heads,
                           "group": heads // kv_heads}[f.name])
            continue
        p = plan.param(f.param)
        if p.kind == "scalar":
            value = args.get(p.name, p.default)
            if value is None:
                raise ArgumentError(f"{plan.name}: missing scalar {p.name!r}")
            values.append(float(value))
            continue
        if p.name in shapes:  # allocated by the caller: contiguous
            values.append(_contiguous_member(p, shapes[p.name], f.name))
            continue
        values.append(_member(p, arrays[p.name], f.name))
    grid_rows = -(-rows // (plan.tile_m if isinstance(plan, LoopPlan) else plan.rows_per_cta))
    return BoundProgram(tuple(values), (max(grid_rows, 0), heads, batch_dims.get("B", 1)),
                        resolved, arrays, shapes)


def _shape_of(p: ProgramParam, batch_dims: dict[str, int], resolved: dict[str, int]
              ) -> tuple[int, ...]:
    """The shape of output `p`, not given, from the sizes the other arguments set."""
    lead = (("B",) if p.batched else ()) + (("HKV" if p.kv else "H",) if p.headed else ())
    shape = []
    for dim in lead:
        shape.append(batch_dims.get(dim, 1))
    for dim in p.shape:
        if isinstance(dim, int):
            shape.append(dim)
        elif dim in resolved:
            shape.append(resolved[dim])
        else:
            raise ArgumentError(f"{p.name} is not given and no other argument sets {dim}: pass "
                                f"{p.name} (or sizes={{{dim!r}: ...}})")
    return tuple(shape)


def _contiguous_member(p: ProgramParam, shape: tuple[int, ...], field: str) -> int:
    """A stride member of an output allocated contiguous (its pointer: 0 until allocated)."""
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    if field == p.name:
        return 0
    if field == f"{p.name}_ld":
        return strides[-2]
    if field == f"{p.name}_bs":
        return strides[0] if p.batched else 0
    return strides[int(p.batched)] if p.headed else 0


def _described(p: ProgramParam) -> str:
    lead, shape = _dims(p)
    if p.kv:
        lead = tuple("HKV" if d == "H" else d for d in lead)
    return "[" + ", ".join(str(d) for d in lead + tuple(shape)) + "]"


def _agree(table: dict[str, int], name: str, extent: int, param: str) -> None:
    if table.setdefault(name, extent) != extent:
        raise ArgumentError(f"{param} has {name} = {extent}, but an earlier argument (or "
                            f"sizes) has {name} = {table[name]}")


def _member(p: ProgramParam, array: DeviceArray, field: str) -> int:
    """A pointer or stride member of `p`, checked (unit stride, 16-byte rows for tensors)."""
    strides = array.strides
    if field == p.name:
        if p.kind == "tensor" and array.ptr % 16:
            raise ArgumentError(f"{p.name}'s address must be 16-byte aligned (the kernel "
                                "copies 16-byte chunks)")
        unit = -1 if p.kind == "vector" or p.layout is Layout.ROW else -2
        extent = array.shape[unit]
        if extent > 1 and strides[unit] != 1:
            raise ArgumentError(f"{p.name} needs a unit stride along its "
                                f"{'last' if unit == -1 else 'second last'} dim, got strides "
                                f"{list(strides)}")
        return array.ptr
    if field == f"{p.name}_ld":
        value = strides[-2] if p.layout is Layout.ROW else strides[-1]
    elif field == f"{p.name}_bs":
        value = strides[0] if p.batched else 0
    else:
        assert field == f"{p.name}_hs", field
        value = strides[int(p.batched)] if p.headed else 0
    if p.kind == "tensor" and (value * p.dtype.nbytes) % 16:
        raise ArgumentError(f"{p.name}'s strides must be multiples of 16 bytes (the kernel "
                            f"copies 16-byte chunks); got strides {list(strides)}")
    return int(value)


@dataclass(frozen=True, slots=True)
class _Signature:
    """One argument signature, checked: the params struct's values but the addresses and
    scalars, where those go, the outputs to allocate and the grid."""

    values: tuple
    pointers: tuple[tuple[int, str], ...]  # (field index, parameter)
    scalars: tuple[tuple[int, str, float | None], ...]  # (field index, parameter, default)
    missing: dict[str, tuple[int, ...]]
    grid: tuple[int, int, int]


ADDRESS_BITS = 15  # the address bits a check reads (16-byte alignment)
MAX_SIGNATURES = 256


class CompiledProgram:
    """A program plan and its loaded cubin: call it with the kernel's arguments as keywords
    (`k(Q=q, K=k, V=v, O=o, lse=lse)`); outputs left out are allocated (torch, contiguous).
    Returns the outputs in declaration order (one alone as itself), as a gemm's call does.
    The whole check runs once per argument signature (dtypes, shapes, strides, devices, the
    addresses' low bits, the sizes); a later call of it packs the addresses and scalars and
    launches."""

    def __init__(self, plan: ProgramPlan, cubin: bytes, *, source: str | None = None,
                 compiled=None, device_id: int | None = None):
        from cuda.core import ObjectCode

        from .device import activate, current_device_id, device_info
        from .entries import allow_smem, function_of

        self.plan = plan
        self.cubin = cubin
        self.source = source
        self.compiled = compiled
        self.device_id = current_device_id() if device_id is None else device_id
        activate(self.device_id)
        info = device_info(self.device_id)
        if plan.smem_bytes > info.smem_optin_bytes:
            raise KgenRuntimeError(f"{plan.name} needs {plan.smem_bytes} bytes of shared "
                                   f"memory; {info.name} allows {info.smem_optin_bytes}")
        self._object = ObjectCode.from_cubin(cubin, name=plan.name)
        self._function = function_of(self._object, plan.name)
        allow_smem(self._function, plan.smem_bytes)
        self._format = params_format(plan)
        self._buffer = ctypes.create_string_buffer(16 + max(self._format.size, 8))
        self._params = ctypes.addressof(self._buffer)
        struct.pack_into("@P", self._buffer, 0, self._params + 16)
        self._arrays = tuple(p.name for p in plan.params if p.kind != "scalar")
        self._outputs = tuple(p.name for p in plan.params if p.role is Role.OUT)
        self._names = frozenset(p.name for p in plan.params)
        self._signatures: dict[tuple, _Signature] = {}
        self._lock = threading.Lock()

    @property
    def name(self) -> str:
        return self.plan.name

    def bind(self, sizes: Mapping[str, int] | None = None, **args) -> BoundProgram:
        return bind_program(self.plan, args, sizes)

    def _key(self, args: dict, sizes) -> tuple | None:
        """The signature of a call whose arrays are all torch tensors (or left out), else
        None (it is then checked whole)."""
        torch = sys.modules.get("torch")
        if torch is None or not self._names.issuperset(args):
            return None
        key = []
        for name in self._arrays:
            value = args.get(name)
            if value is None:
                key.append(None)
            elif isinstance(value, torch.Tensor):
                key.append((value.dtype, value.shape, value.stride(), value.get_device(),
                            value.data_ptr() & ADDRESS_BITS))
            else:
                return None
        key.append(tuple(sorted(p for p in args if args[p] is not None)))
        if sizes:
            key.append(tuple(sorted(sizes.items())))
        return tuple(key)

    def _signature(self, args: dict, sizes) -> _Signature:
        bound = self.bind(sizes, **args)
        for name, array in bound.arrays.items():
            if array.device_id not in (None, self.device_id):
                raise ArgumentError(f"{name} is on cuda:{array.device_id}; {self.plan.name} is "
                                    f"loaded on cuda:{self.device_id}")
        pointers, scalars = [], []
        for index, f in enumerate(self.plan.fields):
            p = self.plan.param(f.param) if f.param is not None else None
            if p is not None and f.name == p.name:
                if p.kind == "scalar":
                    scalars.append((index, p.name, p.default))
                else:
                    pointers.append((index, p.name))
        return _Signature(bound.values, tuple(pointers), tuple(scalars), bound.missing,
                          bound.grid)

    def __call__(self, stream: Any = None, sizes: Mapping[str, int] | None = None, **args):
        key = self._key(args, sizes)
        signature = self._signatures.get(key) if key is not None else None
        if signature is None:
            signature = self._signature(args, sizes)
            if key is not None:
                if len(self._signatures) >= MAX_SIGNATURES:
                    self._signatures.clear()
                self._signatures[key] = signature
        args = dict(args)
        if signature.missing:
            args.update(self._allocate(signature.missing, args))
        values = list(signature.values)
        for index, name in signature.pointers:
            values[index] = _address(args[name], name)
        for index, name, default in signature.scalars:
            value = args.get(name, default)
            if value is None:
                raise ArgumentError(f"{self.plan.name}: missing scalar {name!r}")
            values[index] = float(value)
        self._launch(values, signature.grid, stream, args)
        outputs = [args[name] for name in self._outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _allocate(self, shapes: dict[str, tuple[int, ...]], args: dict) -> dict[str, Any]:
        torch = sys.modules.get("torch")
        if torch is None:
            raise ArgumentError(f"{self.plan.name}: pass {', '.join(shapes)} (outputs are "
                                "allocated with torch, which is not imported)")
        dtypes = {"f16": torch.float16, "bf16": torch.bfloat16, "f32": torch.float32}
        device = torch.device("cuda", self.device_id)
        return {name: torch.empty(shape, dtype=dtypes[self.plan.param(name).dtype.dsl_name],
                                  device=device) for name, shape in shapes.items()}

    def _launch(self, values: list, grid: tuple[int, int, int], stream: Any, args: dict) -> None:
        from cuda.bindings import driver

        from .device import activate, error_text
        from .launch import resolve_stream

        if 0 in grid:
            return
        activate(self.device_id)
        torch = sys.modules.get("torch")
        if stream is None and torch is not None and any(
                isinstance(args.get(name), torch.Tensor) for name in self._arrays):
            handle = int(torch.cuda.current_stream(self.device_id).cuda_stream)
        else:
            handle = resolve_stream(stream)
        with self._lock:  # the parameter block is shared; each launch copies it
            self._format.pack_into(self._buffer, 16, *values)
            (err,) = driver.cuLaunchKernel(self._function, grid[0], grid[1], grid[2],
                                           self.plan.threads, 1, 1, self.plan.smem_bytes,
                                           driver.CUstream(handle), self._params, 0)
        if err != driver.CUresult.CUDA_SUCCESS:
            raise KgenRuntimeError(f"launching {self.plan.name} (grid {grid}, block "
                                   f"{self.plan.threads}, {self.plan.smem_bytes} B shared) "
                                   f"failed: {error_text(err)}")

    def __repr__(self) -> str:
        return (f"CompiledProgram({self.plan.name}, {self.plan.arch.value}, cuda:{self.device_id}, "
                f"{self.plan.threads} threads, {self.plan.smem_bytes} B smem)")


def _address(value: Any, name: str) -> int:
    data_ptr = getattr(value, "data_ptr", None)
    if data_ptr is not None:
        return int(data_ptr())
    return as_device_array(value, name).ptr
