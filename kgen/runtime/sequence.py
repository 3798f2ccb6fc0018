"""A sequence at run time: its kernels (CompiledPrograms) called in order on one stream.

    seq = kgen.load_sequence("attention_bwd.kg")
    dQ, dK, dV = seq(Q=q, K=k, V=v, O=o, dO=do, lse=lse, scale=0.125)

A call takes the sequence's parameters as keywords (a `SequencePlan`, which kgen/sequence.py
makes of kgen/verify/sequence.py's SequenceInfo: every parameter of the launched kernels but the
workspace), as a kernel's call does: torch
tensors, DeviceBuffers, anything kgen.runtime.tensors reads. It sizes the workspace buffers and
the outputs left out from the parameters' shapes (a size name is one size across the kernels;
`sizes` gives one no parameter has), allocates them, launches each kernel through its own call
path (which zeroes the kernel's `out accumulate` outputs first, unless the plan's
`zeroed_by_caller` names it: then the row kernel launched just before it, which takes those
buffers too, has zeroed them: kgen/sequence_zeroing.py), and returns the outputs in order (one
alone as itself). That whole check runs once per argument signature (`call_checked`); later
calls of the signature allocate and launch each kernel's kept Binding directly
(kgen/runtime/sequence_calls.py).

Nothing synchronizes the host, and every allocation is stream-ordered, so a call can be
captured into a CUDA graph: with a torch tensor among the arguments, the workspace and outputs
come from torch's caching allocator (a captured call allocates from the graph's pool); without
one, one block of cuMemAllocAsync on the stream holds the workspace, freed (cuMemFreeAsync)
once every kernel is enqueued, and the outputs left out are DeviceBuffers.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from ..enums import DType, ParamKind
from ..errors import ArgumentError
from .calls import CallPath
from .sequence_calls import SequenceCalls
from .tensors import TORCH_DTYPES, DeviceArray, as_device_array, contiguous_strides

__all__ = ["CompiledSequence", "SequenceBuffer", "SequencePlan", "WORKSPACE_ALIGN",
           "output_shapes", "shape_of", "workspace_layout"]

# Every workspace buffer starts at a multiple of this many bytes (the .cu's launcher too)
WORKSPACE_ALIGN = 256


@dataclass(frozen=True, slots=True)
class SequenceBuffer:
    """One name of a sequence, as a call takes it: its kind, dtype and shape as written (sizes
    by name, or numbers, the batch dimensions first); whether it is workspace, whether a kernel
    writes it, a scalar's default."""

    name: str
    kind: ParamKind
    dtype: DType
    shape: tuple = ()
    workspace: bool = False
    written: bool = False
    default: float | None = None


@dataclass(frozen=True, slots=True)
class SequencePlan:
    """A sequence as the runtime calls it: its buffers in order, the workspace's in the order
    of its `workspace` line, each launch's kernel with the names of its parameters (a row
    kernel's with the buffers it zeroes for a later kernel), and the kernels called without
    their own zeroing (an earlier row kernel zeroes their `out accumulate` buffers)."""

    name: str
    buffers: tuple[SequenceBuffer, ...]
    workspace: tuple[SequenceBuffer, ...]
    launches: tuple[tuple[str, tuple[str, ...]], ...]
    zeroed_by_caller: tuple[str, ...] = ()

    @property
    def params(self) -> tuple[SequenceBuffer, ...]:
        return tuple(b for b in self.buffers if not b.workspace)

    @property
    def outputs(self) -> tuple[SequenceBuffer, ...]:
        return tuple(b for b in self.params if b.written)


def shape_of(buffer: SequenceBuffer, dims: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of `buffer` for the sizes `dims` (every size name of it resolved)."""
    out = []
    for dim in buffer.shape:
        if isinstance(dim, int):
            out.append(dim)
        elif dim in dims:
            out.append(int(dims[dim]))
        else:
            raise ArgumentError(f"{buffer.name} is not given and no argument sets {dim}: pass "
                                f"{buffer.name} (or sizes={{{dim!r}: ...}})")
    return tuple(out)


def workspace_layout(plan: SequencePlan, dims: Mapping[str, int]
                     ) -> tuple[list[tuple[SequenceBuffer, int, tuple[int, ...]]], int]:
    """(buffer, byte offset, shape) of each workspace buffer for the sizes `dims`, and the
    bytes of the whole workspace: the buffers one after another, each at a multiple of
    WORKSPACE_ALIGN (the .cu's `<sequence>_workspace_bytes` lays them out the same way)."""
    out = []
    offset = 0
    for buffer in plan.workspace:
        shape = shape_of(buffer, dims)
        out.append((buffer, offset, shape))
        count = 1
        for extent in shape:
            count *= extent
        nbytes = count * buffer.dtype.nbytes
        offset += -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return out, offset


def output_shapes(plan: SequencePlan, shapes: Mapping[str, tuple],
                  sizes: Mapping[str, int] | None = None) -> dict[str, tuple]:
    """The (contiguous) shapes of the outputs absent from `shapes` (a parameter's name -> its
    shape; any int-like extents: torch.compile's symbolic ones too), as a call allocates them.
    Only the sizes are read here: the call checks the arguments."""
    dims: dict[str, Any] = dict(sizes or {})
    for buffer in plan.params:
        shape = shapes.get(buffer.name)
        if shape is None or buffer.kind is ParamKind.SCALAR:
            continue
        for dim, extent in zip(buffer.shape, shape):
            if isinstance(dim, str):
                dims.setdefault(dim, extent)
    return {b.name: shape_of(b, dims) for b in plan.outputs if b.name not in shapes}


class CompiledSequence:
    """A checked sequence and its loaded kernels, in launch order (see the module's note)."""

    def __init__(self, plan: SequencePlan, programs: tuple, *, source: str | None = None):
        self.plan = plan
        # the CompiledPrograms, in launch order; those an earlier row kernel zeroes for,
        # without their own zeroing launch
        self.programs = tuple(p.zeroed_by_caller() if p.name in plan.zeroed_by_caller else p
                              for p in programs)
        self.source = source
        self.device_id = self.programs[0].device_id
        self._params = {b.name: b for b in plan.params}
        self._arrays = tuple(b for b in plan.params if b.kind is not ParamKind.SCALAR)
        self._scalars = tuple(b for b in plan.params if b.kind is ParamKind.SCALAR)
        # each kernel and the names of its parameters, in launch order
        self.launch_names = tuple((program, names)
                                  for program, (_, names) in zip(self.programs, plan.launches))
        # the call path (kgen/runtime/sequence_calls.py): where every kernel has its own
        self._calls = None
        if all(isinstance(getattr(p, "call_path", None), CallPath) for p in self.programs):
            self._calls = SequenceCalls(self)

    @property
    def name(self) -> str:
        return self.plan.name

    def __call__(self, stream: Any = None, sizes: Mapping[str, int] | None = None, **args):
        calls = self._calls
        if calls is not None:  # the whole check once per argument signature
            return calls(stream, sizes, args)
        return self.call_checked(stream, sizes, args)

    def call_checked(self, stream: Any, sizes: Mapping[str, int] | None, args: dict,
                     key: tuple | None = None):
        """A call through the whole check (its messages), each kernel called through its own
        call path; with `key`, the call's signature, what later calls of it need kept
        (SequenceCalls.keep)."""
        plan = self.plan
        unknown = [name for name in args if name not in self._params]
        if unknown:
            raise ArgumentError(f"unknown argument {unknown[0]!r}; {plan.name} takes "
                                + ", ".join(b.name for b in plan.params))
        arrays: dict[str, DeviceArray] = {}
        dims: dict[str, int] = {}
        for name, value in (sizes or {}).items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ArgumentError(f"sizes[{name!r}] must be a non-negative int, got "
                                    f"{value!r}")
            dims[name] = value
        for buffer in self._arrays:
            value = args.get(buffer.name)
            if value is None:
                if not buffer.written:
                    raise ArgumentError(f"{plan.name}: missing argument {buffer.name!r}")
                continue
            array = arrays[buffer.name] = as_device_array(value, buffer.name)
            _read_sizes(buffer, array, dims)
        for buffer in self._scalars:
            if args.get(buffer.name, buffer.default) is None:
                raise ArgumentError(f"{plan.name}: missing scalar {buffer.name!r}")
        torch = sys.modules.get("torch")
        like = next((a.owner for a in arrays.values() if a.kind == "torch"), None)
        from .launch import resolve_stream

        raw = resolve_stream(stream, arrays)
        values = dict(args)
        for b in self._scalars:
            values.setdefault(b.name, b.default)
        if like is not None:
            self._call_torch(torch, like, raw, dims, values)
        else:
            self._call_driver(raw, dims, values)
        if key is not None:
            self._calls.keep(key, values, dims, like)
        outputs = [values[b.name] for b in plan.outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    # -- with torch: the caching allocator on the launch's stream ------------------------------

    def _call_torch(self, torch, like, raw: int, dims: dict, values: dict) -> None:
        device = like.device
        current = torch.cuda.current_stream(device)
        if int(current.cuda_stream) == raw:
            self._allocate_torch(torch, device, dims, values)
        else:  # allocated for the launch's stream, as torch ops on it would be
            with torch.cuda.stream(torch.cuda.ExternalStream(raw, device=device)):
                self._allocate_torch(torch, device, dims, values)
        self._launch(raw, values)

    def _allocate_torch(self, torch, device, dims: dict, values: dict) -> None:
        """The workspace as views of one block (its buffers at workspace_layout's offsets),
        then each output left out, by torch's caching allocator."""
        layout, total = workspace_layout(self.plan, dims)
        if layout:
            block = torch.empty((total,), dtype=torch.uint8, device=device)
            for buffer, offset, shape in layout:
                dtype = getattr(torch, TORCH_DTYPES[buffer.dtype])
                count = math.prod(shape)
                values[buffer.name] = block[offset:offset + count * buffer.dtype.nbytes].view(
                    dtype).view(shape)
        for buffer in self.plan.outputs:
            if values.get(buffer.name) is None:
                dtype = getattr(torch, TORCH_DTYPES[buffer.dtype])
                values[buffer.name] = torch.empty(shape_of(buffer, dims), dtype=dtype,
                                                  device=device)

    # -- without torch: one stream-ordered block for the workspace -----------------------------

    def _call_driver(self, raw: int, dims: dict, values: dict) -> None:
        from cuda.bindings import driver

        from .buffers import DeviceBuffer
        from .device import activate, check

        activate(self.device_id)
        for buffer in self.plan.outputs:
            if values.get(buffer.name) is None:
                values[buffer.name] = DeviceBuffer(shape_of(buffer, dims), buffer.dtype,
                                                   device_id=self.device_id)
        layout, total = workspace_layout(self.plan, dims)
        if not layout:
            self._launch(raw, values)
            return
        handle = driver.CUstream(raw)
        base = int(check(driver.cuMemAllocAsync(max(total, 1), handle), "cuMemAllocAsync"))
        try:
            for buffer, offset, shape in layout:
                values[buffer.name] = DeviceArray(base + offset, shape, contiguous_strides(shape),
                                                  buffer.dtype, self.device_id,
                                                  kind="kgen")
            self._launch(raw, values)
        finally:
            check(driver.cuMemFreeAsync(base, handle), "cuMemFreeAsync")

    # -- the launches ----------------------------------------------------------------------------

    def _launch(self, raw: int, values: dict) -> None:
        for program, names in self.launch_names:
            program(stream=raw, **{name: values[name] for name in names
                                   if values.get(name) is not None})

    def __repr__(self) -> str:
        kernels = ", ".join(p.name for p in self.programs)
        return f"CompiledSequence({self.plan.name}: {kernels}, cuda:{self.device_id})"


def _read_sizes(buffer: SequenceBuffer, array: DeviceArray, dims: dict[str, int]) -> None:
    """The sizes `array` sets, checked against those already read."""
    shape = buffer.shape
    if array.ndim != len(shape):
        raise ArgumentError(f"{buffer.name} must have {len(shape)} dims ("
                            f"[{', '.join(str(d) for d in shape)}]), got shape "
                            f"{list(array.shape)}")
    for dim, extent in zip(shape, array.shape):
        if isinstance(dim, int):
            if extent != dim:
                raise ArgumentError(f"{buffer.name} must be [{', '.join(str(d) for d in shape)}]"
                                    f", got shape {list(array.shape)}")
        elif dims.setdefault(dim, extent) != extent:
            raise ArgumentError(f"{buffer.name} has {dim} = {extent}, but an earlier argument "
                                f"(or sizes) has {dim} = {dims[dim]}")

