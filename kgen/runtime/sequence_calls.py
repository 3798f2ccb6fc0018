"""A sequence's call path: its whole check once per argument signature, then its kernels
launched straight through their kept Bindings (kgen/runtime/calls.py), as one kernel's call is.

A call's signature is what kgen/runtime/calls.py keys a kernel's call on, over the sequence's
parameters: each array's dtype, shape, strides, device and the low bits of its address (or its
absence: an output left out), the scalars being numbers (those a kernel declares positive,
> 0), and the sizes passed. The first call of a signature is CompiledSequence's whole check
(its messages) and its launches through each kernel's own call path; the sequence then keeps,
under the signature, each kernel's Binding with where its addresses and scalars come from,
and what the signature fixes: the shapes and dtypes of the workspace and of the outputs left
out. A later call of the signature reads each argument's address once, allocates as the first
call did (the workspace one block at workspace_layout's offsets: with torch from its caching
allocator on the launch's stream, held until the kernels are enqueued; without torch one
stream-ordered cuMemAllocAsync, freed once they are; each missing output a torch tensor or a
DeviceBuffer) and enqueues the Bindings in order. Nothing synchronizes the host or reads
device memory, so a call can be captured into a CUDA graph.

Addresses allocated per call are multiples of 256 bytes (torch's caching allocator: 512;
cuMemAllocAsync; the workspace's buffers at WORKSPACE_ALIGN), so their low bits, all that a
kernel's signature reads of an address, are the first call's: its Bindings serve.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Mapping

from ..enums import ParamKind
from ..errors import ArgumentError
from .calls import MAX_BINDINGS, Binding, CallPath, array_signature, scalar_values
from .tensors import TORCH_DTYPES

__all__ = ["SequenceBinding", "SequenceCalls"]


@dataclass(frozen=True, slots=True)
class SequenceBinding:
    """One argument signature of a sequence, ready to launch."""

    torch_device: Any  # the device of the call's torch tensors; None: the driver's path
    device_index: int  # its index (torch's current stream there), -1 without torch
    # the outputs a call allocates (those left out), in order: (slot, name, shape, dtype:
    # torch's, or kgen's without torch)
    made: tuple[tuple[int, str, tuple[int, ...], Any], ...]
    # the workspace's buffers in one block, (slot, byte offset), and the block's bytes
    blocks: tuple[tuple[int, int], ...]
    block_bytes: int
    # each kernel: its call path, its Binding, the slots of its addresses and the positions
    # of its scalars (in its Binding's order)
    launches: tuple[tuple[CallPath, Binding, tuple[int, ...], tuple[int, ...]], ...]


class SequenceCalls:
    """The signature cache in front of a CompiledSequence's launches (see the module's note).
    Slots: the sequence's array parameters in plan order, then its workspace buffers."""

    def __init__(self, sequence):
        plan = sequence.plan
        self.sequence = sequence
        self._names = frozenset(b.name for b in plan.params)
        self._arrays = tuple(b.name for b in plan.params if b.kind is not ParamKind.SCALAR)
        self._slots = {name: i for i, name in
                       enumerate(self._arrays + tuple(b.name for b in plan.workspace))}
        scalars = [b for b in plan.params if b.kind is ParamKind.SCALAR]
        self._scalars = {b.name: i for i, b in enumerate(scalars)}
        self._defaults = tuple((b.name, b.default) for b in scalars)
        self._positive = frozenset().union(*(p.call_path.positive for p in sequence.programs))
        self._outputs = tuple(b.name for b in plan.outputs)
        self._bindings: dict[tuple, SequenceBinding] = {}
        self._lock = threading.Lock()

    # -- the hot path --------------------------------------------------------------------

    def __call__(self, stream: Any, sizes: Mapping[str, int] | None, args: dict):
        """Check (once per signature), allocate, launch; the outputs in order, one alone as
        itself."""
        torch = sys.modules.get("torch")
        tensor = torch.Tensor if torch is not None else None
        if not self._names.issuperset(args):
            return self.sequence.call_checked(stream, sizes, args)  # its message
        key = []
        pointers = [0] * len(self._slots)
        try:  # anything the signature cannot read: the whole check's message, in its order
            for slot, name in enumerate(self._arrays):
                part, pointers[slot] = array_signature(args.get(name), name, tensor)
                key.append(part)
            if sizes:
                key.append(tuple(sorted(sizes.items())))
            key = tuple(key)
            binding = self._bindings.get(key)
        except (ArgumentError, TypeError):
            return self.sequence.call_checked(stream, sizes, args)
        scalars = scalar_values(self._defaults, self._positive, args)
        if scalars is None:  # not a number, missing, or not positive: the whole check
            return self.sequence.call_checked(stream, sizes, args)
        if binding is None:
            return self.sequence.call_checked(stream, sizes, args, key)
        made: dict[str, Any] = {}
        if binding.torch_device is not None:
            native = torch._C
            current = native._cuda_getCurrentRawStream(binding.device_index)
            raw = current if stream is None else _raw(stream)
            if raw == current:
                block = self._allocate_torch(torch, binding, pointers, made)
            else:  # allocated for the launch's stream, as torch ops on it would be
                device = binding.torch_device
                with torch.cuda.stream(torch.cuda.ExternalStream(raw, device=device)):
                    block = self._allocate_torch(torch, binding, pointers, made)
            self._enqueue(binding, pointers, scalars, raw)
            del block  # (held until the kernels are enqueued: the allocator's stream order)
        else:
            self._call_driver(binding, pointers, scalars, 0 if stream is None else _raw(stream),
                              made)
        outputs = [made[name] if name in made else args[name] for name in self._outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    @staticmethod
    def _allocate_torch(torch, binding: SequenceBinding, pointers: list[int],
                        made: dict[str, Any]) -> Any:
        """The workspace's block (returned: the caller holds it past the launches) and the
        outputs left out."""
        empty = torch.empty
        device = binding.torch_device
        block = None
        if binding.blocks:
            block = empty((binding.block_bytes,), dtype=torch.uint8, device=device)
            base = block.data_ptr()
            for slot, offset in binding.blocks:
                pointers[slot] = base + offset
        for slot, name, shape, dtype in binding.made:
            out = made[name] = empty(shape, dtype=dtype, device=device)
            pointers[slot] = out.data_ptr()
        return block

    def _call_driver(self, binding: SequenceBinding, pointers: list[int], scalars: list,
                     raw: int, made: dict[str, Any]) -> None:
        """Without torch: DeviceBuffers for the outputs left out, the workspace one
        stream-ordered block (CompiledSequence._call_driver's way)."""
        from .buffers import DeviceBuffer
        from .device import activate, check

        device_id = self.sequence.device_id
        activate(device_id)
        for slot, name, shape, dtype in binding.made:
            out = made[name] = DeviceBuffer(shape, dtype, device_id=device_id)
            pointers[slot] = out.ptr
        if not binding.blocks:
            self._enqueue(binding, pointers, scalars, raw)
            return
        from cuda.bindings import driver

        handle = driver.CUstream(raw)
        base = int(check(driver.cuMemAllocAsync(max(binding.block_bytes, 1), handle),
                         "cuMemAllocAsync"))
        try:
            for slot, offset in binding.blocks:
                pointers[slot] = base + offset
            self._enqueue(binding, pointers, scalars, raw)
        finally:
            check(driver.cuMemFreeAsync(base, handle), "cuMemFreeAsync")

    @staticmethod
    def _enqueue(binding: SequenceBinding, pointers: list[int], scalars: list,
                 raw: int) -> None:
        for calls, kernel, slots, picks in binding.launches:
            calls.enqueue(kernel, [pointers[i] for i in slots], [scalars[i] for i in picks], raw)

    # -- after the first call of a signature ---------------------------------------------

    def keep(self, key: tuple, values: Mapping[str, Any], dims: Mapping[str, int],
             like: Any) -> None:
        """Keep the signature `key` of a call the whole check passed and launched: `values`
        every buffer and scalar as its kernels took them, `dims` its sizes, `like` its first
        torch tensor (None: the driver's path). Nothing is kept where a kernel kept no
        Binding for its part of the call."""
        from .sequence import shape_of, workspace_layout

        sequence = self.sequence
        plan = sequence.plan
        launches = []
        for program, names in sequence.launch_names:
            calls = program.call_path
            given = {name: values[name] for name in names if values.get(name) is not None}
            kernel = calls.kept(given)
            if kernel is None or not (given.keys() >= set(calls.array_names)
                                      and self._scalars.keys() >= set(calls.scalar_names)):
                return
            launches.append((calls, kernel, tuple(self._slots[n] for n in calls.array_names),
                             tuple(self._scalars[n] for n in calls.scalar_names)))
        torch = sys.modules.get("torch") if like is not None else None
        made = tuple((self._slots[b.name], b.name, shape_of(b, dims),
                      getattr(torch, TORCH_DTYPES[b.dtype]) if torch is not None else b.dtype)
                     for b in plan.outputs if key[self._arrays.index(b.name)] is None)
        layout, block_bytes = workspace_layout(plan, dims)
        blocks = tuple((self._slots[b.name], offset) for b, offset, _ in layout)
        device = like.device if like is not None else None
        binding = SequenceBinding(
            device, -1 if device is None else (device.index or 0), made, blocks, block_bytes,
            tuple(launches))
        with self._lock:
            if len(self._bindings) >= MAX_BINDINGS:
                self._bindings.clear()
            self._bindings[key] = binding


def _raw(stream: Any) -> int:
    if type(stream) is int:
        return stream
    from .launch import resolve_stream

    return resolve_stream(stream)
