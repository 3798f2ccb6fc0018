"""The call path: a loaded kernel called from Python at the host cost of a torch op.

Every check `bind_arguments` makes depends on the arguments' signature alone: each array's
dtype, shape, strides, device and the low bits of its address (the alignments the plan can ask
for), the scalars given, and the sizes passed. The first call of a signature runs the whole
check and keeps a `Binding`: the entry point and grid, the params struct's layout with every
member but the addresses and scalars already packed, the outputs to allocate, the tensor maps
per address and the workspace. A later call of the signature reads the addresses, packs the
struct and launches. A bad argument still gets the same message: a signature not seen before
goes through `bind_arguments`.

Torch tensors are read directly (data_ptr, shape, stride, dtype, device; no DLPack), outputs
not given are allocated by torch's caching allocator, and the stream is torch's current one.
Workspaces (split-K, stream-K, deterministic reductions) are stream-ordered, so every call can
be captured into a CUDA graph on any stream: torch's allocator when a torch tensor is among the
arguments, else cuMemAllocAsync and cuMemFreeAsync on the launch's stream.

Tile programs (kgen/runtime/program.py's CompiledProgram) take the same path: their `bind` is
`bind_program`'s check in a BoundArguments, their members' kinds come from `member_kind`, and
a Binding of a program launches its one kernel (no tensor maps, workspace or clusters).
A sequence's call path (kgen/runtime/sequence_calls.py) finds its kernels' Bindings with
`kept` and launches them with `enqueue`, its arguments read once for all its kernels.
"""
from __future__ import annotations

import ctypes
import struct
import sys
import threading
from operator import itemgetter
from typing import Any, Callable, Mapping

from ..enums import Role
from ..errors import KgenRuntimeError
from ..plan import FieldKind, KernelPlan
from .tensors import TORCH_DTYPES, as_device_array

# The lowest address bits any check can read: element sizes (2, 4), the fast entry point's
# pointer alignments and the copy engine's 16 bytes. Addresses equal below them bind alike.
ADDRESS_BITS = 127
MAX_BINDINGS = 256  # signatures kept per kernel; past it the cache starts over
MAX_MAPS = 64  # tensor-map sets kept per binding (one per set of mapped addresses)

_FORMATS = {  # struct module codes of the params members' ctypes (native alignment, as C)
    ctypes.c_void_p: "P", ctypes.c_int32: "i", ctypes.c_uint32: "I", ctypes.c_int64: "q",
    ctypes.c_float: "f", ctypes.c_double: "d",
}
_MISSING = object()


def struct_format(plan: KernelPlan) -> struct.Struct:
    """The params struct as a `struct.Struct` in native alignment: the layout of
    launch.params_struct (ctypes), which the kernel's `<name>_params` has (checked at load)."""
    from .launch import ctype_of

    return struct.Struct("@" + "".join(_FORMATS[ctype_of(f.ctype)] for f in plan.fields))


def member_kind(plan, member) -> FieldKind:
    """What a params member takes: an address (POINTER), a scalar (SCALAR), the workspace, or
    a value the signature fixes (any other kind). A tile program's members (ProgramField) name
    their parameter; its address or scalar is the member named as the parameter."""
    if isinstance(plan, KernelPlan):
        return member.kind
    if member.param is not None and member.name == member.param:
        return FieldKind.POINTER if member.ctype == "ptr" else FieldKind.SCALAR
    if member.ctype == "ptr":  # a DAG loop's deterministic semaphores
        return FieldKind.WORKSPACE
    return FieldKind.SIZE


def _picker(indices: list[int]) -> Callable[[list], tuple]:
    if len(indices) == 1:
        (index,) = indices
        return lambda values: (values[index],)
    return itemgetter(*indices)


_context_getter = None


def primary_context(device_id: int) -> int:
    """The handle of the device's primary context, made current on this thread."""
    from .device import activate

    activate(device_id)
    return _current_context()


def _current_context() -> int:
    """The handle of this thread's current CUDA context (0: none)."""
    global _context_getter
    if _context_getter is None:
        from cuda.bindings import driver

        _context_getter = driver.cuCtxGetCurrent
    return int(_context_getter()[1])


class Binding:
    """One argument signature of one CompiledKernel, ready to launch (see the module's note).
    `launch` takes the arrays' addresses in the kernel's array order (0 for an output to
    allocate), the scalars in declaration order, and a raw stream."""

    def __init__(self, kernel, bound, array_names: tuple[str, ...],
                 scalar_names: tuple[str, ...], allocate: tuple[str, ...] = ()):
        from cuda.bindings import driver

        plan = kernel.plan  # a KernelPlan, or a tile program's plan (no schedule)
        gemm = isinstance(plan, KernelPlan)
        self.kernel = kernel
        self.plan = plan
        self.sizes = dict(bound.sizes)
        fmt = struct_format(plan)
        # The launch's parameter block, packed in one go: the kernel's parameters' addresses
        # [&struct, &tensor maps], then the struct (16 bytes in: its alignment holds)
        self._pack_into = struct.Struct("@PP" + fmt.format[1:]).pack_into
        self._buffer = ctypes.create_string_buffer(16 + max(fmt.size, 8))
        self.params = ctypes.addressof(self._buffer)
        self._struct_at = self.params + 16
        self._lock = threading.Lock()
        # What each member takes: an address, a scalar, a packed constant or the workspace
        arrays = {name: i for i, name in enumerate(array_names)}
        scalars = {name: len(array_names) + i for i, name in enumerate(scalar_names)}
        constants: list[Any] = []
        indices = []
        first_constant = len(array_names) + len(scalar_names)
        self._workspace_index = None
        kinds = [member_kind(plan, member) for member in plan.fields]
        for member, kind in zip(plan.fields, kinds):
            if kind is FieldKind.POINTER:
                indices.append(arrays[member.param])
            elif kind is FieldKind.SCALAR:
                indices.append(scalars[member.param])
            elif kind is FieldKind.WORKSPACE:
                self._workspace_index = first_constant + len(constants)
                indices.append(self._workspace_index)
                constants.append(0)
            else:
                indices.append(first_constant + len(constants))
                constants.append(bound.values[member.name])
        self._constants = constants
        self._pick = _picker(indices)
        self._values = dict(bound.values)  # the members, for the tensor maps' encoding
        self._pointer_members = [(f.name, arrays[f.param]) for f, kind in zip(plan.fields, kinds)
                                 if kind is FieldKind.POINTER]
        # Outputs to allocate: their position among the arrays, shape, strides and dtype; by
        # torch on the device of the torch tensors among the arguments, if any
        self.allocate = [(arrays[name], name, (bound.arrays[name].shape,
                                               bound.arrays[name].strides,
                                               plan.param(name).dtype)) for name in allocate]
        self.torch_device = next((array.owner.device for array in bound.arrays.values()
                                  if array.kind == "torch"), None)
        self.torch_dtypes = {}
        if self.torch_device is not None:
            torch = sys.modules["torch"]
            self.torch_dtypes = {name: getattr(torch, TORCH_DTYPES[plan.param(name).dtype])
                                 for name in allocate}
        self.device_index = next((array.device_id for array in bound.arrays.values()
                                  if array.kind == "torch"), -1)
        # Tensor maps: encoded once per set of the mapped parameters' addresses
        self._mapped = [arrays[m.param] for m in
                        (plan.schedule.tensor_maps if gemm else _program_maps(plan))]
        self._map_key = _picker(self._mapped) if self._mapped else None
        self._maps: dict[tuple, ctypes.Array] = {}  # key -> the maps (kept alive)
        self._map_at: dict[tuple, int] = {}  # key -> their address
        # Workspace: floats per launch; stream-K's flags, past the slots, start zero
        self.workspace_bytes = 0
        self._flag_offset = self._flag_words = 0
        if self._workspace_index is not None:
            floats = max(plan.workspace_floats(self.sizes, kernel.persistent_ctas) if gemm
                         else plan.order_words(bound.values), 1)  # a DAG loop's semaphores
            self.workspace_bytes = 4 * floats
            if gemm and plan.schedule.scheduler.stream_k:
                ctas = plan.grid(self.sizes, kernel.persistent_ctas)[0]
                self._flag_words = ctas * plan.STREAM_FLAGS
                self._flag_offset = 4 * (floats - self._flag_words)
        # The launches, in order: (function, grid, threads, shared bytes, name)
        self.launches = (self._launches(kernel, bound) if gemm
                         else kernel.program_launches(bound))  # a tile program's kernels
        self._cluster = None
        if gemm and plan.schedule.scheduler.cluster.size > 1 and not bound.narrow and bound.grid[0]:
            self._cluster = kernel._cluster_config(bound.grid[0], 0)
        self._driver = driver
        self._success = driver.CUresult.CUDA_SUCCESS
        self.context = primary_context(kernel.device_id)  # current at every launch

    def _launches(self, kernel, bound) -> list[tuple]:
        plan = self.plan
        sizes = self.sizes
        helpers = []
        if kernel._init_function is not None:
            helpers.append((kernel._init_function, plan.init_grid(sizes), plan.INIT_THREADS, 0,
                            plan.init_kernel))
        empty = 0 in bound.grid
        if empty and (not plan.reductions or plan.batches(sizes) == 0):
            return []  # nothing to compute (reduction outputs over an empty axis still get
            # their identity from the init or finalize kernel below)
        if not empty:
            function = kernel._narrow_entry() if bound.narrow else kernel._function
            helpers.append((function, bound.grid, plan.schedule.warps.threads, plan.smem_bytes,
                            plan.narrow_kernel if bound.narrow else plan.name))
            if kernel._split_function is not None:
                helpers.append((kernel._split_function, plan.split_grid(sizes),
                                plan.INIT_THREADS, 0, plan.split_kernel))
        if kernel._finalize_function is not None:
            helpers.append((kernel._finalize_function, plan.init_grid(sizes), plan.INIT_THREADS,
                            0, plan.finalize_kernel))
        return helpers

    def _tensor_maps(self, key) -> int:
        """The address of the kernel's tensor maps for the mapped parameters' addresses `key`,
        encoded on first use."""
        from . import tma

        pointers = [0] * (max(self._mapped) + 1)
        for index, address in zip(self._mapped, key):
            pointers[index] = address
        values = dict(self._values)
        values.update((name, pointers[i]) for name, i in self._pointer_members
                      if i in self._mapped)
        if isinstance(self.plan, KernelPlan):
            data = tma.encode(tma.maps_args(self.plan, values, self.sizes))
        else:  # a tile program on the sm_90a skeleton
            from .program import encode_maps

            data = encode_maps(self.plan, values, self.sizes)
        maps = (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        if len(self._maps) >= MAX_MAPS:
            self._maps.clear()
            self._map_at.clear()
        self._maps[key] = maps
        self._map_at[key] = address = ctypes.addressof(maps)
        return address

    def launch(self, pointers: list[int], scalars: list, stream: int, workspace: int = 0) -> None:
        """Pack and launch (asynchronously) on raw stream `stream`."""
        launches = self.launches
        if not launches:
            return
        values = pointers + scalars + self._constants
        if self._workspace_index is not None:
            values[self._workspace_index] = workspace
        driver = self._driver
        handle = driver.CUstream(stream)
        with self._lock:  # the parameter block is the binding's; each launch copies it
            maps = 0
            if self._map_key is not None:
                key = self._map_key(pointers)
                maps = self._map_at.get(key) or self._tensor_maps(key)
            self._pack_into(self._buffer, 0, self._struct_at, maps, *self._pick(values))
            for function, grid, threads, smem, name in launches:
                if self._cluster is not None and function is self.kernel._function:
                    self._cluster.hStream = handle
                    (err,) = driver.cuLaunchKernelEx(self._cluster, function, self.params, 0)
                else:
                    (err,) = driver.cuLaunchKernel(function, grid[0], grid[1], grid[2], threads,
                                                   1, 1, smem, handle, self.params, 0)
                if err != self._success:
                    from .device import error_text

                    raise KgenRuntimeError(
                        f"launching {name} (grid {grid}, block {threads}, {smem} B shared) "
                        f"failed: {error_text(err)}")

    def zero_flags(self, workspace: int, stream: int) -> None:
        """Stream-K's flags start zero: set them on the stream before the launch."""
        if self._flag_words:  # stream-K only
            from .device import check

            driver = self._driver
            check(driver.cuMemsetD32Async(workspace + self._flag_offset, 0, self._flag_words,
                                          driver.CUstream(stream)), "cuMemsetD32Async")


def _program_maps(plan) -> tuple:
    """A tile program's tensor maps: those of the sm_90a loop skeleton (plan.wgmma), else
    none."""
    wgmma = getattr(plan, "wgmma", None)
    return wgmma.tensor_maps if wgmma is not None else ()


def array_signature(value: Any, name: str, tensor) -> tuple[Any, int]:
    """One array argument's part of a call's signature and its address ((None, 0) where it is
    left out): a torch tensor's read directly, anything else's through as_device_array (which
    raises ArgumentError naming it). `tensor`: torch.Tensor, or None without torch."""
    if tensor is not None and isinstance(value, tensor):
        ptr = value.data_ptr()
        return (value.dtype, value.shape, value.stride(), value.get_device(),
                ptr & ADDRESS_BITS), ptr
    if value is None:
        return None, 0
    array = as_device_array(value, name)
    return (array.dtype, array.shape, array.strides, array.device_id, array.ptr & ADDRESS_BITS,
            array.kind), array.ptr


def scalar_values(defaults: tuple, positive: frozenset, args: dict) -> list | None:
    """The scalars of a call in declaration order (`defaults`: (name, default) pairs), or None
    where one is not a number, is missing, or is not the positive value it must be (the whole
    check then says why)."""
    scalars = []
    for name, default in defaults:
        value = args.get(name, default)
        kind = type(value)
        if kind is not float and kind is not int or (positive and name in positive
                                                      and not value > 0):
            return None
        scalars.append(value)
    return scalars


class CallPath:
    """The signature cache in front of a kernel's launches. `choose(args, sizes)` names the
    CompiledKernel that runs a signature not seen before (the kernel itself, or a tuned
    kernel's variant for the call's sizes)."""

    def __init__(self, plan, choose: Callable[[dict, Any], Any]):
        from .launch import _takes_array

        self.plan = plan
        self._choose = choose
        self._names = frozenset(p.name for p in plan.params)
        self._arrays = tuple(p.name for p in plan.params if _takes_array(p))
        scalars = [p for p in plan.params if not _takes_array(p)]
        self._scalars = tuple(p.name for p in scalars)
        self._defaults = tuple((p.name, _MISSING if p.default is None else float(p.default))
                               for p in scalars)
        # the scalars declared positive: a value not > 0 takes the first call's path, which
        # says why (launch.check_positive)
        self._positive = frozenset(p.name for p in scalars if p.positive)
        self._outputs = tuple(p.name for p in plan.params if p.role is Role.OUT)
        self._bindings: dict[tuple, Binding] = {}
        self._lock = threading.Lock()

    @property
    def array_names(self) -> tuple[str, ...]:
        """The array parameters, in the order of a Binding's pointers."""
        return self._arrays

    @property
    def scalar_names(self) -> tuple[str, ...]:
        """The scalar parameters, in the order of a Binding's scalars."""
        return self._scalars

    @property
    def positive(self) -> frozenset[str]:
        """The scalars declared positive (a call with one not > 0 takes the whole check)."""
        return self._positive

    # -- the hot path --------------------------------------------------------------------

    def _signature(self, args: dict, sizes: Mapping[str, int] | None, torch
                   ) -> tuple[tuple, list[int], list] | None:
        """(the signature, the arrays' addresses, the scalars) of a call, or None for one the
        signature cannot stand for (an unknown name; a scalar that is not a number, missing,
        or not the positive value it must be): the whole check says why."""
        tensor = torch.Tensor if torch is not None else None
        if not self._names.issuperset(args):
            return None
        key = []
        pointers = []
        for name in self._arrays:
            part, ptr = array_signature(args.get(name), name, tensor)
            key.append(part)
            pointers.append(ptr)
        scalars = scalar_values(self._defaults, self._positive, args)
        if scalars is None:
            return None
        if sizes:
            key.append(tuple(sorted(sizes.items())))
        return tuple(key), pointers, scalars

    def kept(self, args: dict, sizes: Mapping[str, int] | None = None) -> Binding | None:
        """The Binding kept for the signature of `args` (None: no call of it has been checked,
        or the signature cannot stand for it): a caller launching through it directly (a
        sequence's call path, kgen/runtime/sequence_calls.py) gives the addresses in
        `array_names`' order and the scalars in `scalar_names`'."""
        found = self._signature(args, sizes, sys.modules.get("torch"))
        return None if found is None else self._bindings.get(found[0])

    def __call__(self, stream: Any, sizes: Mapping[str, int] | None, args: dict):
        """Check (once per signature), allocate the missing outputs, launch; the outputs in
        declaration order, one alone as itself."""
        torch = sys.modules.get("torch")
        found = self._signature(args, sizes, torch)
        if found is None:
            return self._first_call(stream, sizes, args)  # its message, or a call not keyed
        key, pointers, scalars = found
        binding = self._bindings.get(key)
        if binding is None:
            return self._first_call(stream, sizes, args, key)
        torch_device = binding.torch_device
        if stream is None:
            stream = (torch._C._cuda_getCurrentRawStream(binding.device_index)
                      if torch_device is not None else 0)
        elif type(stream) is not int:
            from .launch import resolve_stream

            stream = resolve_stream(stream)
        made = None
        if binding.allocate:
            made = self._allocate(binding, pointers, torch if torch_device is not None else None)
        self.enqueue(binding, pointers, scalars, stream)
        if made is None:
            outputs = [args[name] for name in self._outputs]
        else:
            outputs = [made[name] if name in made else args[name] for name in self._outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def _allocate(binding: Binding, pointers: list[int], torch) -> dict[str, Any]:
        """The outputs the call leaves out, allocated; their addresses put in `pointers`."""
        made = {}
        for position, name, (shape, strides, dtype) in binding.allocate:
            if torch is not None:
                out = torch.empty_strided(shape, strides, dtype=binding.torch_dtypes[name],
                                          device=binding.torch_device)
                pointers[position] = out.data_ptr()
            else:
                from .buffers import DeviceBuffer

                out = DeviceBuffer(shape, dtype, strides=strides,
                                   device_id=binding.kernel.device_id)
                pointers[position] = out.ptr
            made[name] = out
        return made

    @staticmethod
    def _activate(binding: Binding) -> None:
        """Make the binding's device's primary context current on this thread."""
        from .device import activate

        activate(binding.kernel.device_id)

    def _with_workspace(self, binding: Binding, pointers: list[int], scalars: list, stream: int,
                        torch) -> None:
        """Launch with a stream-ordered workspace, freed once the launches are enqueued."""
        if torch is not None:
            # torch's caching allocator on the launch's stream: the raw calls behind
            # torch.cuda.caching_allocator_alloc/_delete, whose device switch is not needed
            # where the binding's device is torch's current one
            native = torch._C
            if native._cuda_getDevice() == binding.device_index:
                address = native._cuda_cudaCachingAllocator_raw_alloc(binding.workspace_bytes,
                                                                       stream)
            else:
                address = torch.cuda.caching_allocator_alloc(binding.workspace_bytes,
                                                             binding.device_index, stream)
            try:
                binding.zero_flags(address, stream)
                binding.launch(pointers, scalars, stream, address)
            finally:
                native._cuda_cudaCachingAllocator_raw_delete(address)
            return
        from cuda.bindings import driver

        from .device import check

        handle = driver.CUstream(stream)
        address = int(check(driver.cuMemAllocAsync(binding.workspace_bytes, handle),
                            "cuMemAllocAsync"))
        try:
            binding.zero_flags(address, stream)
            binding.launch(pointers, scalars, stream, address)
        finally:
            check(driver.cuMemFreeAsync(address, handle), "cuMemFreeAsync")

    # -- a signature not seen before -----------------------------------------------------

    def _first_call(self, stream: Any, sizes: Mapping[str, int] | None, args: dict,
                    key: tuple | None = None):
        """The whole check (its message for a bad argument), then the binding kept under `key`
        (None: a call the fast path does not key, e.g. a scalar passed as a numpy number)."""
        kernel = self._choose(args, sizes)
        if not self._names.issuperset(args):
            kernel.bind(sizes, **args)  # raises: the unknown argument's message
        missing = tuple(name for name in self._outputs if args.get(name) is None)
        call_args = dict(args)
        if missing:
            call_args.update(kernel._allocate(list(missing), args, sizes))
        bound = kernel.bind(sizes, **call_args)
        binding = Binding(kernel, bound, self._arrays, self._scalars, missing)
        if key is not None:
            self._keep(key, binding)
        from .launch import resolve_stream

        pointers = [bound.arrays[name].ptr for name in self._arrays]
        self.enqueue(binding, pointers, [bound.scalars[n] for n in self._scalars],
                     resolve_stream(stream, bound.arrays))
        outputs = [call_args[name] for name in self._outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def _keep(self, key: tuple, binding: Binding) -> None:
        with self._lock:
            if len(self._bindings) >= MAX_BINDINGS:
                self._bindings.clear()
            self._bindings[key] = binding

    def launch_bound(self, kernel, bound, stream: int) -> None:
        """Launch arguments `bind` checked (kgen's harness times this way)."""
        key = ("bound", tuple((name, a.dtype, a.shape, a.strides, a.device_id,
                               a.ptr & ADDRESS_BITS) for name, a in bound.arrays.items()),
               tuple(sorted(bound.sizes.items())))
        binding = self._bindings.get(key)
        if binding is None:
            binding = Binding(kernel, bound, self._arrays, self._scalars)
            self._keep(key, binding)
        self.enqueue(binding, [bound.arrays[name].ptr for name in self._arrays],
                     [bound.scalars[name] for name in self._scalars], stream)

    def enqueue(self, binding: Binding, pointers: list[int], scalars: list, stream: int) -> None:
        """Launch `binding` (asynchronously) with these addresses and scalars on raw stream
        `stream`, its workspace if any stream-ordered."""
        if _current_context() != binding.context:
            self._activate(binding)
        if binding.workspace_bytes:
            torch = sys.modules.get("torch") if binding.torch_device is not None else None
            self._with_workspace(binding, pointers, scalars, stream, torch)
        else:
            binding.launch(pointers, scalars, stream)
