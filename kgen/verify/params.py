"""Verify a kernel's parameters: tensors, vectors and scalars.

Each parameter's name (unique, safe as a C++ identifier), kind, rank, dimensions (a named one
is defined where first used), dtype (scalars are f32; outputs in a dtype the target can store),
layout (tensors only), default (input scalars only, a finite f32) and positivity (input f32
scalars only, a default > 0).
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import (
    DTYPE_NAMES,
    at_line,
    dim_problem,
    f32_problem,
    loc_of,
    or_list,
    quote,
    shape_text,
    shown,
)
from ..errors import KgenError
from ..ir import DType, ParamKind, Role
from .state import KernelState

__all__ = ["check_param", "check_batched_kernel"]


def check_param(state: KernelState, p: ir.Param) -> None:
    loc = loc_of(p, state.kernel.loc)
    if not isinstance(p, ir.Param):
        raise KgenError(loc, f"kernel params must be kgen.ir.Param, got {shown(p)}")
    if not isinstance(p.kind, ParamKind):
        raise KgenError(loc, f"param kind must be a kgen.ir.ParamKind, got {shown(p.kind)}")
    kind = p.kind.value
    state.define(p.name, kind, loc)
    if not isinstance(p.dtype, DType):
        raise KgenError(loc, f"unknown dtype {quote(p.dtype)}; expected {DTYPE_NAMES}")
    if not isinstance(p.layout, ir.Layout):
        raise KgenError(loc, f"layout must be a kgen.ir.Layout, got {shown(p.layout)}")
    if not isinstance(p.role, Role):
        raise KgenError(loc, f"role must be a kgen.ir.Role, got {shown(p.role)}")
    if not isinstance(p.accumulate, bool):
        raise KgenError(loc, f"accumulate must be True or False, got {shown(p.accumulate)}")
    if p.accumulate and (p.role is not Role.OUT or p.kind is not ParamKind.TENSOR
                         or state.kernel.loop is None):
        raise KgenError(loc, f"'accumulate' marks an output tensor of a loop kernel that the "
                             f"kernel adds into ('tensor {p.name} : ... out accumulate', then "
                             f"'{p.name} += acc' in a loop-row gemm's epilogue); {kind} "
                             f"'{p.name}' is {'an input' if p.role is Role.IN else 'not one'}")
    if not isinstance(p.shape, tuple):
        raise KgenError(
            loc, f"shape of {kind} '{p.name}' must be a tuple, got {shown(p.shape)}"
        )

    rank = {ParamKind.TENSOR: 2, ParamKind.VECTOR: 1, ParamKind.SCALAR: 0}[p.kind]
    tile_program = state.kernel.loop is not None or state.kernel.epilogue is not None
    if len(p.shape) != rank or (p.heads is not None and not tile_program):
        what = {2: "2 dimensions [rows, cols], or 3 with a leading batch dimension [L, rows, cols]",
                1: "1 dimension [length], or 2 with a leading batch dimension [L, length]",
                0: "no shape, or one batch dimension [L] (one value per batch)"
                if p.role is Role.OUT else "no shape"}
        two = {2: "[B, H, rows, cols]", 1: "[B, H, length]"}.get(rank)
        if two is None or (not tile_program and p.heads is None):
            where = ""
        elif tile_program:
            where = f", or {rank + 2} with a batch and a heads dimension {two}"
        else:
            where = (f" (two batch dimensions, {two}, are for loop kernels and row kernels "
                     "only)")
        raise KgenError(
            loc,
            f"{kind} '{p.name}' must have {what[rank]}{where}, got {shape_text(p.full_shape)}",
        )
    if p.heads is not None:
        if p.kind is ParamKind.SCALAR or p.batch is None:
            raise KgenError(loc, f"{kind} '{p.name}' has a heads dimension but "
                                 f"{'is a scalar' if p.batch is not None else 'no batch one'}; "
                                 "heads come after the batch: [B, H, ...]")
        if not isinstance(p.heads, (int, str)) or isinstance(p.heads, bool):
            raise KgenError(loc, f"heads dimension of '{p.name}' must be a name or a number, "
                                 f"got {shown(p.heads)}")
    if p.batch is not None:
        _check_batch(state, p, loc)
    for dim in p.full_shape:
        if isinstance(dim, str):
            # A dimension is defined where it is first used; later uses share it.
            if state.names.get(dim, ("",))[0] != "dimension":
                state.define(dim, "dimension", loc)
        elif problem := dim_problem(dim):
            raise KgenError(loc, problem)

    allowed = {DType.F32} if p.kind is ParamKind.SCALAR else {DType.F16, DType.BF16, DType.F32}
    if p.kind is ParamKind.TENSOR:
        # gemm operands (kgen/verify/gemms.py fp8 rules), and outputs of an FP8 gemm's
        # epilogue, saturated to the format's finite range (kgen/verify/epilogue.py)
        allowed |= {DType.F8E4M3, DType.F8E5M2}
    if p.dtype is DType.U64 and p.kind is ParamKind.SCALAR:
        _check_u64(state, p, loc)
    elif p.dtype not in allowed:
        names = or_list([d.dsl_name for d in DType if d in allowed])
        raise KgenError(loc, f"{kind} '{p.name}' must be {names}, got {p.dtype.dsl_name}")
    if p.dtype.fp8 and (state.kernel.loop is not None or not state.kernel.gemms):
        raise KgenError(loc, f"tensor '{p.name}' is {p.dtype.dsl_name}: FP8 tensors are operands "
                             "of a kernel's gemms; a tile program takes f16, bf16 or f32")
    if p.kind is not ParamKind.TENSOR and p.layout is not ir.Layout.ROW:
        raise KgenError(loc, f"only tensors have a layout; '{p.name}' is a {kind}")
    if p.default is not None and p.dtype is not DType.U64:
        if p.kind is not ParamKind.SCALAR or p.role is Role.OUT:
            what = "an output scalar" if p.kind is ParamKind.SCALAR else f"a {kind}"
            raise KgenError(
                loc, f"only input scalars can have a default; '{p.name}' is {what}"
            )
        if problem := f32_problem(p.default, f"default of scalar '{p.name}'"):
            raise KgenError(loc, problem)
    _check_positive(p, loc)
    # an FP8 output: verify/epilogue.py's check_fp8_output (an FP8 gemm's, on wgmma targets)
    if p.role is Role.OUT and not p.dtype.fp8 and p.dtype not in state.target.output_dtypes:
        raise KgenError(
            loc,
            f"output dtype {p.dtype.dsl_name} is not supported on {state.target.arch.value}",
        )
    state.params[p.name] = p


def _check_positive(p: ir.Param, loc) -> None:
    """`positive` marks an input f32 scalar whose every value is > 0 (checked at launch)."""
    if not isinstance(p.positive, bool):
        raise KgenError(loc, f"positive must be True or False, got {shown(p.positive)}")
    if not p.positive:
        return
    if p.kind is not ParamKind.SCALAR or p.role is Role.OUT or p.dtype is not DType.F32:
        what = (f"a {p.kind.value}" if p.kind is not ParamKind.SCALAR else
                "an output scalar" if p.role is Role.OUT else f"a {p.dtype.dsl_name} scalar")
        raise KgenError(loc, f"'positive' marks an input f32 scalar, checked > 0 at every "
                             f"launch; '{p.name}' is {what}")
    if p.default is not None and not p.default > 0:
        raise KgenError(loc, f"scalar '{p.name}' is marked 'positive' but its default is "
                             f"{p.default:g}; give a default > 0 or none")


def _check_batch(state: KernelState, p: ir.Param, loc) -> None:
    """A batched parameter: a tensor, a vector or an output scalar (one value per batch), with
    the kernel's one batch dimension."""
    if p.kind is ParamKind.SCALAR and p.role is not Role.OUT:
        raise KgenError(loc, f"input scalar '{p.name}' cannot have a batch dimension: every "
                        "batch reads the same value (a per-batch input is a batched vector)")
    if not isinstance(p.batch, (int, str)) or isinstance(p.batch, bool):
        raise KgenError(loc, f"batch dimension of '{p.name}' must be a name or a number, "
                        f"got {shown(p.batch)}")
    if state.batch is None:
        state.batch = (p.batch, p.name, loc)
        return
    first, owner, owner_loc = state.batch
    if p.batch != first:
        raise KgenError(
            loc,
            f"{p.kind.value} '{p.name}' has the batch dimension {p.batch} but '{owner}'"
            f"{at_line(owner_loc)} has {first}: every batched parameter of a kernel has the "
            "same batch dimension",
        )


def check_batched_kernel(state: KernelState) -> None:
    """What a kernel with a batch dimension must hold, once every parameter is checked: the
    batch dimension is no matrix or vector dimension, every output has it (a shared output
    would be written by every batch at once: a scalar output too, one value per batch), and a
    B kept resident (loaded once per CTA, for every batch) has none."""
    if state.batch is None:
        return
    batch, owner, owner_loc = state.batch
    kernel = state.kernel
    for p in kernel.params:
        if isinstance(p.heads, str) and (p.heads in p.shape or p.heads == batch):
            raise KgenError(
                loc_of(p, kernel.loc),
                f"'{p.heads}' is the heads dimension of '{p.name}' but also its "
                f"{'batch' if p.heads == batch else 'matrix or vector'} dimension; heads need "
                "a name of their own",
            )
        if isinstance(batch, str) and batch in p.shape:
            raise KgenError(
                owner_loc,
                f"'{batch}' is the batch dimension of '{owner}' but also a dimension of "
                f"'{p.name}'{at_line(loc_of(p, kernel.loc))}; a batch dimension needs a name of "
                "its own",
            )
        if p.role is not Role.OUT:
            continue
        if p.batch is None and p.kind is ParamKind.SCALAR:
            raise KgenError(
                loc_of(p, kernel.loc),
                f"scalar output '{p.name}' has no batch dimension, so every batch would write "
                f"it; declare it 'scalar {p.name} : f32[{batch}] out' (one value per batch)",
            )
        if p.batch is None:
            shape = shape_text((batch, *p.shape))
            raise KgenError(
                loc_of(p, kernel.loc),
                f"output '{p.name}' has no batch dimension, so every batch would write it; "
                f"declare it {p.dtype.dsl_name}{shape}",
            )
    for g in kernel.gemms:
        b = kernel.param(getattr(getattr(g, "b", None), "name", None) or "")
        if getattr(g, "resident", False) and b is not None and b.batch is not None:
            where = g.resident_loc or loc_of(g, kernel.loc)
            raise KgenError(
                where,
                f"keep {b.name} resident loads {b.name} once per CTA, for the tiles of every "
                f"batch, but {b.name} has the batch dimension {batch}; keep a {b.name} shared "
                f"by every batch resident ({b.dtype.dsl_name}{shape_text(b.shape)}), or drop "
                f"'keep {b.name} resident'",
            )


def _check_u64(state: KernelState, p: ir.Param, loc) -> None:
    """A u64 scalar: an input of a tile program, given at each call (a random stream's seed or
    offset, read only by random(seed, offset))."""
    k = state.kernel
    if k.loop is None and (k.gemms or k.epilogue is None):
        raise KgenError(loc, f"u64 scalar '{p.name}' keys random(seed, offset), which loop and "
                             "row kernels have; a gemm's scalars are f32")
    if p.role is Role.OUT or p.batch is not None:
        raise KgenError(loc, f"u64 scalar '{p.name}' must be a plain input scalar")
    if p.default is not None:
        raise KgenError(loc, f"u64 scalar '{p.name}' has no default: give it at each call")
