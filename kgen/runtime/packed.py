"""Packed sequences at run time (`packed S by cu_seqlens_q`; kgen/plan/program.py PackedDim):
the offsets vectors and the parameters whose batch is fused into their packed dimension.

A packed parameter declared [B, H, S, D] is passed as [H, total, D] (a vector [B, H, S] as
[H, total]) at any strides with a unit stride along its last dim: FlashAttention's [total, H, D]
is its `.transpose(0, 1)`. Each offsets vector is int32, contiguous, of B + 1 entries, read by
the kernel only (never on the host: a call does not synchronize). The grid covers
`sizes[S]`, which must be at least the longest sequence's length (max_seqlen_q); the loop's
packed dimension takes sizes[T] (max_seqlen_k) when given, else every sequence's together.
"""
from __future__ import annotations

from typing import Mapping

from ..errors import ArgumentError
from ..plan.program import LoopPlan, ProgramParam
from .tensors import DeviceArray

def offsets_array(p: ProgramParam, array: DeviceArray, batch_dims: dict[str, int]) -> None:
    """Check an offsets vector; its length sets the batch count B."""
    if array.dtype_name != "int32" or array.ndim != 1 or (array.shape[0] > 1
                                                           and array.strides[0] != 1):
        raise ArgumentError(f"{p.name} must be a contiguous int32 vector of B + 1 offsets, got "
                            f"{array.describe_dtype()} of shape {list(array.shape)}")
    if array.shape[0] < 1:
        raise ArgumentError(f"{p.name} must hold B + 1 offsets (at least one: 0), got none")
    batches = array.shape[0] - 1
    if batch_dims.setdefault("B", batches) != batches:
        raise ArgumentError(f"{p.name} holds {array.shape[0]} offsets, so B = {batches}; an "
                            f"earlier argument has B = {batch_dims['B']}")


def packed_array(p: ProgramParam, array: DeviceArray, batch_dims: dict[str, int],
                 totals: dict[str, int], resolved: dict[str, int]) -> None:
    """Check a packed parameter's shape: [H, total, cols] ([H, total] for a vector)."""
    lead = int(p.headed)
    want = lead + len(p.shape)
    dims = (["HKV" if p.kv else "H"] if p.headed else []) + [f"total {p.shape[0]}"] + [
        str(d) for d in p.shape[1:]]
    if array.ndim != want:
        raise ArgumentError(f"{p.name} holds packed sequences: it must have {want} dims "
                            f"([{', '.join(dims)}], its batch fused into {p.shape[0]}), got shape "
                            f"{list(array.shape)}")
    if p.headed:
        name = "HKV" if p.kv else "H"
        if batch_dims.setdefault(name, array.shape[0]) != array.shape[0]:
            raise ArgumentError(f"{p.name} has {name} = {array.shape[0]}, but an earlier "
                                f"argument has {name} = {batch_dims[name]}")
    total = array.shape[lead]
    if totals.setdefault(p.packed, total) != total:
        raise ArgumentError(f"{p.name} holds {total} packed {p.shape[0]}-rows, but an earlier "
                            f"argument holds {totals[p.packed]}")
    for dim, extent in zip(p.shape[1:], array.shape[lead + 1:]):
        if isinstance(dim, int) and extent != dim:
            raise ArgumentError(f"{p.name} must be [{', '.join(dims)}], got shape "
                                f"{list(array.shape)}")
        if not isinstance(dim, int) and resolved.setdefault(dim, extent) != extent:
            raise ArgumentError(f"{p.name} has {dim} = {extent}, but an earlier argument (or "
                                f"sizes) has {dim} = {resolved[dim]}")


def extents(plan: LoopPlan, resolved: dict[str, int], totals: dict[str, int],
            sizes: Mapping[str, int] | None) -> None:
    """The packed dimensions' sizes: the rows' from `sizes` (the grid's), the loop's from
    `sizes` or every sequence's together; set in `resolved`."""
    for d in plan.packed:
        given = (sizes or {}).get(d.dim)
        if given is None and d.along == "rows":
            raise ArgumentError(f"{plan.name} packes {d.dim} by {d.offsets}: pass the longest "
                                f"sequence's length as sizes={{{d.dim!r}: max_seqlen}} (the "
                                "grid covers it)")
        value = int(given) if given is not None else totals.get(d.along, 0)
        if value < 0:
            raise ArgumentError(f"sizes[{d.dim!r}] = {value} is negative")
        resolved[d.dim] = value


def member(p: ProgramParam, strides: tuple[int, ...], field: str) -> int | None:
    """A stride member of a packed parameter (None: the member is its pointer): `_ld` the
    packed dim's stride, `_hs` the heads', `_bs` 0 (a sequence starts at its offset)."""
    if field == f"{p.name}_bs":
        return 0
    lead = int(p.headed)
    if field == f"{p.name}_hs":
        value = strides[0] if p.headed else 0
    elif field == f"{p.name}_ld":
        value = strides[lead]
    else:
        return None
    if p.kind == "tensor" and (value * p.dtype.nbytes) % 16:
        raise ArgumentError(f"{p.name}'s strides must be multiples of 16 bytes (the kernel "
                            f"copies 16-byte chunks); got strides {list(strides)}")
    return int(value)


def output_shape(p: ProgramParam, batch_dims: dict[str, int], totals: dict[str, int],
                 resolved: dict[str, int]) -> tuple[int, ...]:
    """The contiguous shape of a packed output not given: [H, total, cols]."""
    if p.packed not in totals:
        raise ArgumentError(f"{p.name} is not given and no packed input sets its total "
                            f"{p.shape[0]}: pass {p.name}")
    lead = [batch_dims.get("HKV" if p.kv else "H", 1)] if p.headed else []
    rest = [d if isinstance(d, int) else resolved[d] for d in p.shape[1:]]
    return (*lead, totals[p.packed], *rest)
