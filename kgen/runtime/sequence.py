"""A sequence at run time: its kernels (CompiledPrograms) called in order on one stream.

    seq = kgen.load_sequence("attention_bwd.kg")
    dQ, dK, dV = seq(Q=q, K=k, V=v, O=o, dO=do, lse=lse, scale=0.125)

A call takes the sequence's parameters as keywords (kgen/verify/sequence.py's SequenceInfo:
every parameter of the launched kernels but the workspace), as a kernel's call does: torch
tensors, DeviceBuffers, anything kgen.runtime.tensors reads. It sizes the workspace buffers and
the outputs left out from the parameters' shapes (a size name is one size across the kernels;
`sizes` gives one no parameter has), allocates them, zeroes each `out accumulate` buffer just
before the first kernel that adds into it (cuMemsetD8Async on the stream), launches each kernel
through its own call path, and returns the outputs in order (one alone as itself).

Nothing synchronizes the host, and every allocation is stream-ordered, so a call can be
captured into a CUDA graph: with a torch tensor among the arguments, the workspace and outputs
come from torch's caching allocator (a captured call allocates from the graph's pool); without
one, one block of cuMemAllocAsync on the stream holds the workspace, freed (cuMemFreeAsync)
once every kernel is enqueued, and the outputs left out are DeviceBuffers.
"""
from __future__ import annotations

import sys
from typing import Any, Mapping

from ..enums import DType, ParamKind
from ..errors import ArgumentError
from ..verify.sequence import Buffer, SequenceInfo
from .tensors import DeviceArray, as_device_array, contiguous_strides

__all__ = ["CompiledSequence", "WORKSPACE_ALIGN", "output_shapes", "shape_of",
           "workspace_layout"]

# Every workspace buffer starts at a multiple of this many bytes (the .cu's launcher too)
WORKSPACE_ALIGN = 256
_TORCH_DTYPES = {DType.F16: "float16", DType.BF16: "bfloat16", DType.F32: "float32"}


def shape_of(buffer: Buffer, dims: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of `buffer` for the sizes `dims` (every size name of it resolved)."""
    out = []
    for dim in buffer.param.full_shape:
        if isinstance(dim, int):
            out.append(dim)
        elif dim in dims:
            out.append(int(dims[dim]))
        else:
            raise ArgumentError(f"{buffer.name} is not given and no argument sets {dim}: pass "
                                f"{buffer.name} (or sizes={{{dim!r}: ...}})")
    return tuple(out)


def workspace_layout(info: SequenceInfo, dims: Mapping[str, int]
                     ) -> tuple[list[tuple[Buffer, int, tuple[int, ...]]], int]:
    """(buffer, byte offset, shape) of each workspace buffer for the sizes `dims`, and the
    bytes of the whole workspace: the buffers one after another, each at a multiple of
    WORKSPACE_ALIGN (the .cu's `<sequence>_workspace_bytes` lays them out the same way)."""
    out = []
    offset = 0
    for buffer in info.workspace:
        shape = shape_of(buffer, dims)
        out.append((buffer, offset, shape))
        count = 1
        for extent in shape:
            count *= extent
        nbytes = count * buffer.param.dtype.nbytes
        offset += -(-nbytes // WORKSPACE_ALIGN) * WORKSPACE_ALIGN
    return out, offset


def output_shapes(info: SequenceInfo, shapes: Mapping[str, tuple],
                  sizes: Mapping[str, int] | None = None) -> dict[str, tuple]:
    """The (contiguous) shapes of the outputs absent from `shapes` (a parameter's name -> its
    shape; any int-like extents: torch.compile's symbolic ones too), as a call allocates them.
    Only the sizes are read here: the call checks the arguments."""
    dims: dict[str, Any] = dict(sizes or {})
    for buffer in info.params:
        shape = shapes.get(buffer.name)
        if shape is None or buffer.kind is ParamKind.SCALAR:
            continue
        for dim, extent in zip(buffer.param.full_shape, shape):
            if isinstance(dim, str):
                dims.setdefault(dim, extent)
    return {b.name: shape_of(b, dims) for b in info.outputs if b.name not in shapes}


class CompiledSequence:
    """A checked sequence and its loaded kernels, in launch order (see the module's note)."""

    def __init__(self, info: SequenceInfo, programs: tuple, *, source: str | None = None):
        self.info = info
        self.programs = tuple(programs)
        self.source = source
        self.device_id = self.programs[0].device_id
        self._params = {b.name: b for b in info.params}
        self._arrays = tuple(b for b in info.params if b.kind is not ParamKind.SCALAR)
        self._scalars = tuple(b for b in info.params if b.kind is ParamKind.SCALAR)
        self._launches = tuple((program, tuple(p.name for p in kernel.params))
                               for program, kernel in zip(self.programs, info.kernels))

    @property
    def name(self) -> str:
        return self.info.name

    def __call__(self, stream: Any = None, sizes: Mapping[str, int] | None = None, **args):
        info = self.info
        unknown = [name for name in args if name not in self._params]
        if unknown:
            raise ArgumentError(f"unknown argument {unknown[0]!r}; {info.name} takes "
                                + ", ".join(b.name for b in info.params))
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
                    raise ArgumentError(f"{info.name}: missing argument {buffer.name!r}")
                continue
            array = arrays[buffer.name] = as_device_array(value, buffer.name)
            _read_sizes(buffer, array, dims)
        for buffer in self._scalars:
            if args.get(buffer.name, buffer.param.default) is None:
                raise ArgumentError(f"{info.name}: missing scalar {buffer.name!r}")
        torch = sys.modules.get("torch")
        like = next((a.owner for a in arrays.values() if a.kind == "torch"), None)
        from .launch import resolve_stream

        raw = resolve_stream(stream, arrays)
        values = dict(args)
        for b in self._scalars:
            values.setdefault(b.name, b.param.default)
        if like is not None:
            self._call_torch(torch, like, raw, dims, values)
        else:
            self._call_driver(raw, dims, values)
        outputs = [values[b.name] for b in info.outputs]
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
        for buffer in (*self.info.workspace, *self.info.outputs):
            if values.get(buffer.name) is None:
                dtype = getattr(torch, _TORCH_DTYPES[buffer.param.dtype])
                values[buffer.name] = torch.empty(shape_of(buffer, dims), dtype=dtype,
                                                  device=device)

    # -- without torch: one stream-ordered block for the workspace -----------------------------

    def _call_driver(self, raw: int, dims: dict, values: dict) -> None:
        from cuda.bindings import driver

        from .buffers import DeviceBuffer
        from .device import activate, check

        activate(self.device_id)
        for buffer in self.info.outputs:
            if values.get(buffer.name) is None:
                values[buffer.name] = DeviceBuffer(shape_of(buffer, dims), buffer.param.dtype,
                                                   device_id=self.device_id)
        layout, total = workspace_layout(self.info, dims)
        if not layout:
            self._launch(raw, values)
            return
        handle = driver.CUstream(raw)
        base = int(check(driver.cuMemAllocAsync(max(total, 1), handle), "cuMemAllocAsync"))
        try:
            for buffer, offset, shape in layout:
                values[buffer.name] = DeviceArray(base + offset, shape, contiguous_strides(shape),
                                                  buffer.param.dtype, self.device_id,
                                                  kind="kgen")
            self._launch(raw, values)
        finally:
            check(driver.cuMemFreeAsync(base, handle), "cuMemFreeAsync")

    # -- the launches ----------------------------------------------------------------------------

    def _launch(self, raw: int, values: dict) -> None:
        zero: dict[int, list] = {}  # launch -> the (address, bytes) zeroed just before it
        for buffer in self.info.buffers:
            if buffer.zero_before is not None:
                zero.setdefault(buffer.zero_before, []).append(_span(buffer, values[buffer.name]))
        for index, (program, names) in enumerate(self._launches):
            for address, nbytes in zero.get(index, ()):
                _zero(address, nbytes, raw)
            program(stream=raw, **{name: values[name] for name in names
                                   if values.get(name) is not None})

    def __repr__(self) -> str:
        kernels = ", ".join(p.name for p in self.programs)
        return f"CompiledSequence({self.info.name}: {kernels}, cuda:{self.device_id})"


def _read_sizes(buffer: Buffer, array: DeviceArray, dims: dict[str, int]) -> None:
    """The sizes `array` sets, checked against those already read."""
    shape = buffer.param.full_shape
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


def _span(buffer: Buffer, value: Any) -> tuple[int, int]:
    """The (address, bytes) of an `out accumulate` buffer, which must be one contiguous block
    (the sequence zeroes it before the kernels add into it)."""
    array = as_device_array(value, buffer.name)
    count = 1
    for extent in array.shape:
        count *= extent
    if any(extent > 1 and stride != want for extent, stride, want in
           zip(array.shape, array.strides, contiguous_strides(array.shape))):
        raise ArgumentError(f"{buffer.name} must be contiguous: the sequence zeroes it before "
                            f"the kernels add into it (strides {list(array.strides)})")
    return array.ptr, count * buffer.param.dtype.nbytes


def _zero(address: int, nbytes: int, raw: int) -> None:
    """Zero `nbytes` at `address` on raw stream `raw` (asynchronously)."""
    if nbytes == 0:
        return
    from cuda.bindings import driver

    from .device import check

    check(driver.cuMemsetD8Async(address, 0, nbytes, driver.CUstream(raw)), "cuMemsetD8Async")
