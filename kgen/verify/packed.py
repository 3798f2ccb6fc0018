"""Verify `packed DIM by OFFSETS` lines (docs/language.md, "Packed sequences").

A loop kernel's rows dimension (S), its loop's dimension (T), or both may hold the batch's
sequences one after another, FlashAttention's varlen layout: OFFSETS is an int32 argument of
B + 1 entries and sequence b is DIM-rows OFFSETS[b] to OFFSETS[b + 1]. Every parameter with
that dimension is declared as if it were dense ([B, H, S, D], a vector [B, H, S]) and passed
with its batch and DIM fused into DIM's place ([H, total, D], [H, total]): so DIM must be its
rows, memory rows (a row-major tensor's first dim, a vector's only one), and it must have the
batch dimension. Inside a batch, DIM, `row` and `col` are that sequence's own.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import at_line, first_located, loc_of, quote, shape_text, shown
from ..errors import KgenError
from ..ir import ParamKind
from .state import KernelState, require_str

__all__ = ["check_packed", "refuse_packed"]


def _lines(kernel: ir.Kernel) -> tuple[ir.Packed, ...]:
    packed = kernel.packed
    if not isinstance(packed, tuple) or not all(isinstance(p, ir.Packed) for p in packed):
        raise KgenError(kernel.loc, f"kernel packed must be a tuple of kgen.ir.Packed, got "
                                    f"{shown(packed)}")
    for line in packed:
        at = first_located(line.loc, kernel.loc)
        require_str(line.dim, at, "a packed dimension")
        require_str(line.offsets, at, "an offsets name")
    return packed


def refuse_packed(kernel: ir.Kernel) -> None:
    """Packed sequences are a loop kernel's: refuse them anywhere else."""
    if _lines(kernel):
        first = kernel.packed[0]
        what = "row kernel" if kernel.epilogue is not None and not kernel.gemms else "gemm kernel"
        raise KgenError(first_located(first.loc, kernel.loc),
                        f"'packed {first.dim} by {first.offsets}' applies to loop kernels (a "
                        f"CTA's rows and its loop over packed sequences); kernel "
                        f"'{kernel.name}' is a {what}")


def check_packed(state: KernelState, rows_dim: ir.Dim, loop_dim: str) -> None:
    """Each packed line names the rows or the loop's dimension once, and a fresh offsets name;
    every parameter with a packed dimension can be addressed per sequence."""
    k = state.kernel
    seen: dict[str, ir.Packed] = {}
    for line in _lines(k):
        at = first_located(line.loc, k.loc)
        if line.dim in seen:
            raise KgenError(at, f"{line.dim} is packed twice (first{at_line(seen[line.dim].loc)})")
        if line.dim not in (rows_dim, loop_dim):
            known = state.names.get(line.dim, ("",))[0] == "dimension"
            what = "a dimension of the kernel's parameters" if known else \
                "not a dimension of any parameter"
            raise KgenError(at, f"packed {quote(line.dim)}: {what}, but only the kernel's rows "
                                f"({rows_dim}) and its loop's dimension ({loop_dim}) can hold "
                                "packed sequences")
        seen[line.dim] = line
        state.define(line.offsets, "offsets vector", at)
        batched = [p for p in k.params if p.batch is not None]
        if not batched:
            raise KgenError(at, f"packed {line.dim}: the kernel has no batch dimension to pack "
                                f"(declare e.g. Q : bf16[B, H, {line.dim}, 128])")
        for p in k.params:
            _check_param(p, line, k)


def _check_param(p: ir.Param, line: ir.Packed, k: ir.Kernel) -> None:
    if line.dim not in p.full_shape:
        return
    at = loc_of(p, k.loc)
    dense = p.dtype.dsl_name + shape_text(p.full_shape)
    if p.batch is None:
        raise KgenError(at, f"{p.kind.value} '{p.name}' has the packed dimension {line.dim} but "
                            "no batch dimension: packed sequences are the batch's, so declare "
                            f"it with one (e.g. [B, H, {line.dim}, ...])")
    if p.kind is ParamKind.SCALAR or not p.shape or p.shape[0] != line.dim or (
            line.dim in p.shape[1:]):
        raise KgenError(at, f"{p.kind.value} '{p.name}' : {dense} has {line.dim} among its "
                            f"columns; a packed dimension is the rows of each parameter that "
                            "holds it (its first dim after the batch and heads)")
    if p.kind is ParamKind.TENSOR and p.layout is not ir.Layout.ROW:
        raise KgenError(at, f"tensor '{p.name}' is col; a packed dimension must be a row-major "
                            f"tensor's rows (its sequences start anywhere along "
                            f"{line.dim}): declare it row")
