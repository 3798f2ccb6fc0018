"""A block mask at run time (a loop's `blocks MxN by COUNTS, INDICES[, full ...]`; the plan's
LoopBounds.listed): its lists' checks and their params-struct members.

Each counts tensor is int32 [B, H, row tiles] and each indices tensor int32 [B, H, row tiles,
blocks] (without the batch or heads dim where the kernel's rows operand has none), where the
row tiles are ceil(rows / tile M) and the blocks ceil(loop's length / block): a block mask
built at another block size has other extents and is refused by name. B and H may be 1 (the
lists shared, at stride 0: FlexAttention's BlockMask built with B=None or H=None). The last dim
has a unit stride; the lists are read by the kernel only (a call does not synchronize).
"""
from __future__ import annotations

from ..errors import ArgumentError
from ..plan.program import LoopPlan, ProgramParam
from .tensors import DeviceArray

KINDS = ("block_counts", "block_indices")


def block_array(p: ProgramParam, array: DeviceArray) -> None:
    """The dtype, dims and unit stride of one list; its extents: `extents`."""
    want = int(p.batched) + int(p.headed) + len(p.shape)
    if array.dtype_name != "int32" or array.ndim != want:
        raise ArgumentError(f"{p.name} must be an int32 tensor of {want} dims ({_dims(p)}), got "
                            f"{array.describe_dtype()} of shape {list(array.shape)}")
    if array.shape[-1] > 1 and array.strides[-1] != 1:
        raise ArgumentError(f"{p.name} needs a unit stride along its last dim, got strides "
                            f"{list(array.strides)}")
    span = sum((n - 1) * abs(s) for n, s in zip(array.shape, array.strides) if n > 0)
    if span >= 2**31 or min(array.strides, default=0) < 0:
        raise ArgumentError(f"{p.name} spans {span + 1} elements at strides "
                            f"{list(array.strides)}: the kernel addresses a list by int offsets, "
                            "non-negative and below 2^31")


def extents(plan: LoopPlan, arrays: dict[str, DeviceArray], batch_dims: dict[str, int],
            rows: int, loop_len: int) -> None:
    """Every list's extents against the launch: B and H (or 1), the tiles of rows and the
    blocks at the plan's tile."""
    tiles = -(-rows // plan.tile_m)
    blocks = -(-loop_len // plan.block)
    for p in plan.params:
        if p.kind not in KINDS:
            continue
        array = arrays[p.name]
        lead = []
        if p.batched:
            lead.append(("B", batch_dims.get("B", 1)))
        if p.headed:
            lead.append(("H", batch_dims.get("H", 1)))
        for (name, extent), given in zip(lead, array.shape):
            if given not in (1, extent):
                raise ArgumentError(f"{p.name} has {name} = {given}, but the call has {name} = "
                                    f"{extent} (1 shares the lists)")
        want = (tiles,) if p.kind == "block_counts" else (tiles, blocks)
        if tuple(array.shape[len(lead):]) != want:
            sizes = (f"{plan.rows_dim} = {rows} in tiles of {plan.tile_m} rows"
                     + ("" if p.kind == "block_counts" else
                        f", {plan.loop_dim} = {loop_len} in blocks of {plan.block}"))
            dims = ", ".join([name for name, _ in lead] + [str(w) for w in want])
            raise ArgumentError(
                f"{p.name} must be [{dims}] (a block mask of "
                f"{plan.tile_m}x{plan.block} blocks: {sizes}), got shape {list(array.shape)}; "
                f"a block mask built at another block size does not fit")


def member(p: ProgramParam, array: DeviceArray, field: str) -> int:
    """A list's pointer or stride member: `_ld` between tiles of rows, `_bs` and `_hs` between
    batches and heads (0 where the list has one, shared)."""
    if field == p.name:
        return array.ptr
    if field == f"{p.name}_ld":
        return int(array.strides[-2])
    index = 0 if field == f"{p.name}_bs" else int(p.batched)
    assert field in (f"{p.name}_bs", f"{p.name}_hs"), field
    present = p.batched if field == f"{p.name}_bs" else p.headed
    return int(array.strides[index]) if present and array.shape[index] != 1 else 0


def _dims(p: ProgramParam) -> str:
    lead = (["B"] if p.batched else []) + (["H"] if p.headed else [])
    return "[" + ", ".join(lead + list(p.shape)) + "]"
