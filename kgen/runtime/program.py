"""Tile programs at run time: the argument check and grid of a loop or row kernel (pure:
`bind_program`), and `CompiledProgram`, a loaded program called with keywords as a gemm is.

Arguments: a parameter with two batch dims is a 4-D tensor [B, H, rows, cols] (3-D vector
[B, H, rows]), one batch dim 3-D ([B, rows, cols]), none 2-D; any strides with a unit stride
along the layout's contiguous dim. Sizes (S, T, M, N0, B, H, HKV) are read from the arguments
and must agree. GQA: H % HKV == 0. The loop's operands are copied 16 bytes at a time, so every
tensor's address and strides are multiples of 16 bytes. Packed sequences (a loop kernel's
`packed S by cu_seqlens_q`): kgen/runtime/packed.py.
"""
from __future__ import annotations

import copy
import sys
from dataclasses import dataclass
from typing import Any, Mapping

from ..enums import DType, Layout, Role
from ..errors import ArgumentError, KgenRuntimeError
from ..plan.loop_dag import ORDER_FIELD, LoopDagPlan
from ..plan.program import LoopPlan, ProgramParam, ProgramPlan
from . import blocks, packed
from .launch import BoundArguments, check_positive
from .tensors import DeviceArray, as_device_array

@dataclass(frozen=True, slots=True)
class BoundProgram:
    values: tuple  # in the order of plan.fields (an output not given: its pointer 0)
    grid: tuple[int, int, int]
    sizes: dict[str, int]
    arrays: dict[str, DeviceArray]
    missing: dict[str, tuple[int, ...]]  # outputs not given: their (contiguous) shapes


def _dims(param: ProgramParam) -> tuple:
    lead = (("B",) if param.batched else ()) + (("H",) if param.headed else ())
    return lead, param.shape


def bind_program(plan: ProgramPlan, args: Mapping[str, Any],
                 sizes: Mapping[str, int] | None = None,
                 ctas: int | None = None) -> BoundProgram:
    """Check the arguments against the plan; the params struct's values and the grid. A
    persistent sm_90a plan (plan.wgmma.persistent) runs min(tiles, `ctas`) CTAs (the resident
    CTAs of the device; every tile its own CTA when None) in x, each walking the tiles."""
    known = {p.name for p in plan.params}
    unknown = [name for name in args if name not in known]
    if unknown:
        raise ArgumentError(f"unknown argument {unknown[0]!r}; {plan.name} takes "
                            + ", ".join(p.name for p in plan.params))
    resolved: dict[str, int] = dict(sizes or {})
    arrays: dict[str, DeviceArray] = {}
    batch_dims: dict[str, int] = {}  # "B", "H", "HKV" as read
    totals: dict[str, int] = {}  # packed sequences: "rows", "loop" -> every sequence's together
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
        if p.kind == "offsets":
            packed.offsets_array(p, array, batch_dims)
            arrays[p.name] = array
            continue
        if p.kind in blocks.KINDS:  # a block mask's lists (kgen/runtime/blocks.py)
            blocks.block_array(p, array)
            arrays[p.name] = array
            continue
        if array.dtype is not p.dtype:
            raise ArgumentError(f"{p.name} must be {p.dtype.dsl_name}, got "
                                f"{array.describe_dtype()}")
        if p.packed:
            packed.packed_array(p, array, batch_dims, totals, resolved)
            arrays[p.name] = array
            continue
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
    if isinstance(plan, (LoopPlan, LoopDagPlan)) and plan.packed:
        packed.extents(plan, resolved, totals, sizes)
    shapes = {p.name: packed.output_shape(p, batch_dims, totals, resolved) if p.packed else
              _shape_of(p, batch_dims, resolved) for p in missing}
    heads = batch_dims.get("H", 1)
    kv_heads = batch_dims.get("HKV", heads)
    if heads % kv_heads:
        raise KgenRuntimeError(f"{plan.name}: the query heads H = {heads} must be a multiple "
                               f"of the KV heads HKV = {kv_heads} (GQA)")
    rows = resolved[plan.rows_dim] if isinstance(plan.rows_dim, str) else plan.rows_dim
    loop_len = 0
    if isinstance(plan, LoopDagPlan):
        loop_len = resolved[plan.loop_dim]
    if isinstance(plan, LoopPlan):
        loop_len = resolved[plan.loop_dim]
        for tile in (plan.b_tile, plan.c_tile):
            if not tile.rows_along_loop and loop_len % 8:
                raise KgenRuntimeError(
                    f"{plan.name}: {tile.param} is streamed along {plan.loop_dim} in 16-byte "
                    f"chunks, so {plan.loop_dim} must be a multiple of 8 (it is {loop_len})")
    if isinstance(plan, (LoopPlan, LoopDagPlan)) and plan.bounds.listed is not None:
        blocks.extents(plan, arrays, batch_dims, rows, loop_len)
    values = []
    for f in plan.fields:
        if f.param is None:
            sizes_of = {"rows": rows, "loop_len": loop_len, "heads": heads,
                        "group": heads // kv_heads, "batches": batch_dims.get("B", 1),
                        ORDER_FIELD: 0}  # a DAG loop's semaphores: the call's workspace
            sizes_of.update((d.total, totals.get(d.along, 0))
                            for d in getattr(plan, "packed", ()))
            values.append(sizes_of[f.name])
            continue
        p = plan.param(f.param)
        if p.kind == "scalar":
            value = args.get(p.name, p.default)
            if value is None:
                raise ArgumentError(f"{plan.name}: missing scalar {p.name!r}")
            if p.positive:
                check_positive(p.name, float(value))
            values.append(_u64_bits(p.name, value) if p.dtype is DType.U64 else float(value))
            continue
        if p.kind in blocks.KINDS:
            values.append(blocks.member(p, arrays[p.name], f.name))
            continue
        if p.packed and f.name != p.name:  # a stride along packed sequences
            strides = (_contiguous(shapes[p.name]) if p.name in shapes
                       else arrays[p.name].strides)
            values.append(packed.member(p, strides, f.name))
            continue
        if p.name in shapes:  # allocated by the caller: contiguous
            values.append(_contiguous_member(p, shapes[p.name], f.name))
            continue
        values.append(_member(p, arrays[p.name], f.name))
    grid_rows = -(-rows // (plan.tile_m if isinstance(plan, (LoopPlan, LoopDagPlan))
                            else plan.rows_per_cta))
    # a GQA DAG loop's CTA owns a KV head (its loop walks the group's query heads)
    grid_heads = kv_heads if isinstance(plan, LoopDagPlan) and plan.gqa else heads
    grid = (max(grid_rows, 0), grid_heads, batch_dims.get("B", 1))
    if isinstance(plan, LoopPlan) and plan.wgmma is not None and plan.wgmma.persistent:
        tiles = grid[0] * grid[1] * grid[2]
        grid = (min(tiles, ctas) if ctas is not None else tiles, 1, 1)
    return BoundProgram(tuple(values), grid, resolved, arrays, shapes)


def _u64_bits(name: str, value: Any) -> int:
    """A u64 scalar's 64 bits as the signed int the params struct's long long holds: the caller
    passes them so (seed - 2**64 when seed >= 2**63), as kgen.attention does."""
    if isinstance(value, bool) or not isinstance(value, int) or not (
            -2**63 <= value < 2**63):
        raise ArgumentError(f"u64 scalar {name!r} takes its 64 bits as an int in "
                            f"[-2**63, 2**63), got {value!r}")
    return value


def output_shapes(plan: ProgramPlan, shapes: Mapping[str, tuple],
                  sizes: Mapping[str, int] | None = None) -> dict[str, tuple]:
    """The (contiguous) shapes of the outputs absent from `shapes`, from the other arguments'
    shapes (any int-like extents: torch.compile's symbolic ones too). Nothing is checked here:
    the call's bind_program checks the arguments."""
    batch_dims: dict[str, Any] = {}
    resolved: dict[str, Any] = dict(sizes or {})
    for p in plan.params:
        shape = shapes.get(p.name)
        if shape is None or p.kind == "scalar":
            continue
        lead = int(p.batched) + int(p.headed)
        if p.batched:
            batch_dims.setdefault("B", shape[0])
        if p.headed:
            batch_dims.setdefault("HKV" if p.kv else "H", shape[int(p.batched)])
        for dim, extent in zip(p.shape, shape[lead:]):
            if isinstance(dim, str):
                resolved.setdefault(dim, extent)
    return {p.name: _shape_of(p, batch_dims, resolved) for p in plan.params
            if p.role is Role.OUT and p.name not in shapes}


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


def _contiguous(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = [1] * len(shape)
    for i in range(len(shape) - 2, -1, -1):
        strides[i] = strides[i + 1] * shape[i + 1]
    return tuple(strides)


def _contiguous_member(p: ProgramParam, shape: tuple[int, ...], field: str) -> int:
    """A stride member of an output allocated contiguous (its pointer: 0 until allocated)."""
    strides = _contiguous(shape)
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


class CompiledProgram:
    """A program plan and its loaded cubin: call it with the kernel's arguments as keywords
    (`k(Q=q, K=k, V=v, O=o, lse=lse)`); outputs left out are allocated (torch tensors when an
    argument is one, else DeviceBuffers; contiguous). Returns the outputs in declaration
    order (one alone as itself), as a gemm's call does. Calls go through the gemms' call path
    (kgen.runtime.calls.CallPath): the whole check once per argument signature, then the
    addresses and scalars packed into the kept params block and one launch on torch's current
    stream (or the stream given), so a call can be captured into a CUDA graph."""

    # a persistent sm_90a plan's CTAs: the device's resident ones (None: one CTA per tile)
    persistent_ctas: int | None = None
    _zero_function = None  # a DAG loop's zeroing kernel of its `out accumulate` tensors

    def __init__(self, plan: ProgramPlan, cubin: bytes, *, source: str | None = None,
                 compiled=None, device_id: int | None = None):
        from cuda.core import ObjectCode

        from .calls import CallPath
        from .device import activate, can_run, current_device_id, device_info
        from .entries import allow_smem, function_of

        self.plan = plan
        self.cubin = cubin
        self.source = source
        self.compiled = compiled
        self.device_id = current_device_id() if device_id is None else device_id
        activate(self.device_id)
        info = device_info(self.device_id)
        why = can_run(plan.arch.value, info.compute_capability)
        if why:
            raise KgenRuntimeError(f"{plan.name} cannot run on {info.name}: {why}")
        if plan.smem_bytes > info.smem_optin_bytes:
            raise KgenRuntimeError(f"{plan.name} needs {plan.smem_bytes} bytes of shared "
                                   f"memory; {info.name} allows {info.smem_optin_bytes}")
        self._object = ObjectCode.from_cubin(cubin, name=plan.name)
        self._function = function_of(self._object, plan.name)
        allow_smem(self._function, plan.smem_bytes)
        # A persistent plan runs one CTA per resident slot: SM count x CTAs per SM (occupancy),
        # as a persistent gemm does (kgen/runtime/launch.py)
        if isinstance(plan, LoopPlan) and plan.wgmma is not None and plan.wgmma.persistent:
            from cuda.bindings import driver

            from .device import check

            per_sm = check(driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                self._function, plan.threads, plan.smem_bytes),
                "cuOccupancyMaxActiveBlocksPerMultiprocessor")
            self.persistent_ctas = info.sm_count * max(int(per_sm), 1)
        # A DAG loop's `out accumulate` tensors are zeroed by the .cu's own zeroing kernel,
        # launched first on the same stream
        self._zero_function = (function_of(self._object, f"{plan.name}_zero")
                               if isinstance(plan, LoopDagPlan) and plan.zeroed else None)
        self._calls = CallPath(plan, lambda args, sizes: self)

    def program_launches(self, bound: BoundArguments) -> list[tuple]:
        """The launches of one call, in order: (function, grid, threads, shared bytes, name).
        The zeroing kernel of the `out accumulate` tensors (a DAG loop's) runs even where the
        main kernel has no tile of rows: the sum of no adds is zero."""
        out = []
        if self._zero_function is not None:
            from ..targets.common.loop_dag import ZERO_THREADS, zero_grid

            values = bound.values
            grid = zero_grid(values["loop_len"], values["heads"], values["batches"])
            if 0 not in grid:
                out.append((self._zero_function, grid, ZERO_THREADS, 0, f"{self.plan.name}_zero"))
        if 0 not in bound.grid:
            out.append((self._function, bound.grid, self.plan.threads, self.plan.smem_bytes,
                        self.plan.name))
        return out

    def zeroed_by_caller(self) -> "CompiledProgram":
        """This program without its zeroing launch, for a caller that zeroes its `out
        accumulate` outputs itself before calling it (a sequence's row kernel launched just
        before it: kgen/sequence_zeroing.py); itself when it zeroes nothing. Deterministic
        mode's semaphores are zeroed by that launch too: such a plan is refused."""
        if self._zero_function is None:
            return self
        if getattr(self.plan, "deterministic", None) is not None:
            raise KgenRuntimeError(f"{self.plan.name} zeroes its deterministic mode's "
                                   "semaphores itself: it cannot leave its zeroing to a caller")
        from .calls import CallPath

        other = copy.copy(self)
        other._zero_function = None
        other._calls = CallPath(self.plan, lambda args, sizes: other)
        return other

    @property
    def name(self) -> str:
        return self.plan.name

    @property
    def call_path(self):
        """Its kgen.runtime.calls.CallPath (a sequence launches through its Bindings)."""
        return self._calls

    @property
    def registers(self) -> int | None:
        return self.compiled.registers if self.compiled is not None else None

    def bind(self, sizes: Mapping[str, int] | None = None, **args) -> BoundArguments:
        """The whole check of one call whose outputs are all given (CallPath allocates the
        others first): the params struct's values by member, the arrays, the grid."""
        bound = bind_program(self.plan, args, sizes, self.persistent_ctas)
        if bound.missing:
            raise ArgumentError(f"{self.plan.name}: missing argument "
                                f"{next(iter(bound.missing))!r}")
        for name, array in bound.arrays.items():
            if array.device_id not in (None, self.device_id):
                raise ArgumentError(f"{name} is on cuda:{array.device_id}; {self.plan.name} is "
                                    f"loaded on cuda:{self.device_id}")
        scalars = {p.name: value for p, value in
                   ((self.plan.param(f.param), value)
                    for f, value in zip(self.plan.fields, bound.values) if f.param is not None)
                   if p.kind == "scalar"}
        return BoundArguments(
            values={f.name: value for f, value in zip(self.plan.fields, bound.values)},
            sizes=bound.sizes, arrays=bound.arrays, scalars=scalars, grid=bound.grid,
            owners=tuple(a.owner for a in bound.arrays.values()))

    def __call__(self, stream: Any = None, sizes: Mapping[str, int] | None = None, **args):
        return self._calls(stream, sizes, args)

    def launch(self, bound: BoundArguments, stream: int = 0) -> None:
        """Launch already-checked arguments on a raw stream handle (asynchronous)."""
        self._calls.launch_bound(self, bound, stream)

    def _allocate(self, names: list[str], args: Mapping[str, Any],
                  sizes: Mapping[str, int] | None) -> dict[str, Any]:
        """The outputs `names`, contiguous, in the shapes the other arguments set: torch
        tensors on the device of a torch argument, else DeviceBuffers."""
        shapes = bind_program(self.plan, {k: v for k, v in args.items() if k not in names},
                              sizes).missing
        torch = sys.modules.get("torch")
        like = next((v for v in args.values()
                     if torch is not None and isinstance(v, torch.Tensor)), None)
        out = {}
        for name in names:
            dtype = self.plan.param(name).dtype
            if like is not None:
                torch_dtype = {"f16": torch.float16, "bf16": torch.bfloat16,
                               "f32": torch.float32}[dtype.dsl_name]
                out[name] = torch.empty(shapes[name], dtype=torch_dtype, device=like.device)
            else:
                from .buffers import DeviceBuffer

                out[name] = DeviceBuffer(shapes[name], dtype, device_id=self.device_id)
        return out

    def __repr__(self) -> str:
        return (f"CompiledProgram({self.plan.name}, {self.plan.arch.value}, cuda:{self.device_id}, "
                f"{self.plan.threads} threads, {self.plan.smem_bytes} B smem)")


def encode_maps(plan: LoopPlan, values: Mapping[str, int], sizes: Mapping[str, int]) -> bytes:
    """The sm_90a skeleton's tensor maps (plan.wgmma.tensor_maps, the kernel's second
    parameter) for one launch's params-struct members `values` and sizes: per operand a rank-4
    map (columns, rows, heads, batches) in boxes of [box_rows][128 bytes] (64 16-bit columns,
    32 f32 ones) of one (head, batch), the 128-byte swizzle, zeros past the rows; a
    column-major operand's in its memory's order (rows, columns, heads, batches). A head or
    batch stride of 0 (one operand shared) is mapped with extent 1 (the kernel then reads index
    0); an empty operand stays zeros (never read)."""
    from . import tma

    out = b""
    for m in plan.wgmma.tensor_maps:
        p = plan.param(m.param)
        rows_dim, cols = p.shape  # cols: a size (a tensor the body reads at (row, col))
        rows = int(sizes[rows_dim]) if isinstance(rows_dim, str) else int(rows_dim)
        cols = int(sizes[cols]) if isinstance(cols, str) else int(cols)
        if p.packed:  # every sequence together; a sequence starts at its offset's row
            rows = int(values[plan.packed_along(p.packed).total])
        heads = int(values["heads"]) // int(values["group"]) if m.kv else int(values["heads"])
        ld, hs, bs = (int(values[f"{p.name}{suffix}"]) for suffix in ("_ld", "_hs", "_bs"))
        nbytes = p.dtype.nbytes
        inner = [rows, int(cols)] if p.layout is Layout.COL else [int(cols), rows]
        dims = [*inner, heads if p.headed and hs else 1,
                int(values["batches"]) if p.batched and bs else 1]
        pitches = [ld * nbytes]
        pitches.append((hs or ld * max(dims[1], 1)) * nbytes)
        pitches.append((bs or pitches[-1] // nbytes * dims[2]) * nbytes)
        address = int(values[p.name])
        if min(dims) == 0 or address == 0:
            out += bytes(tma.MAP_BYTES)
            continue
        out += tma.encode_tiled(p.dtype, address, dims, pitches,
                                [128 // nbytes, m.box_rows, 1, 1], "L2_256B")
    return out
