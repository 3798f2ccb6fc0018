"""Verify the epilogues of tile programs: a loop's first gemm, a loop kernel's own epilogue, and
a row kernel's body. Every value has a rank, checked where a statement needs one.

A *row* value is one per row of the CTA's rows: carries, row reductions, `row`, `v[row]`,
scalars, constants and expressions of only those. A *tile* value is one per element of the
tile the epilogue works on (the first gemm's [rows, block] in a loop, the [rows, N1]
accumulator after it, the [rows, cols] of a row kernel's tensors): `acc`, `col`, `v[col]`, a
tensor, the accumulator by name after the loop, and anything mixing them with row values.
Carry updates, rescale factors and stores to row vectors need row values; a row reduction takes a
tile value. kgen/verify/loops.py owns the structure (which epilogue, which shape); the rules for
the values and statements are here, with `expr_text`, which quotes an expression in a message.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field

from .. import ir
from ..diagnostics import (
    DTYPE_NAMES,
    arity_message,
    at_line,
    did_you_mean,
    loc_of,
    loop_row_message,
    number_text,
    quote,
    shape_text,
    shown,
)
from ..errors import NOWHERE, KgenError, SourceLoc
from ..ir import Axis, DType, ParamKind, ReduceOp, Role
from ..language import F32_MAX, reduction_name
from .epilogue import check_extent, unused_local_warnings
from .loop_gemms import is_forward_loop
from .state import KernelState, require_str

__all__ = ["Rank", "TileScope", "check_tile_epilogue", "expr_text"]


class Rank(enum.IntEnum):
    ROW = 0  # one value per row
    TILE = 1  # one value per element of the tile


class Where(enum.Enum):
    LOOP = "loop"  # the epilogue of a loop's score gemm, once per block
    LOOP_ROWS = "loop rows"  # a loop-row gemm's epilogue: [block, N] at the loop's rows
    AFTER = "after"  # a loop kernel's epilogue, once after the loop
    ROWS = "rows"  # a row kernel's epilogue, its whole body


@dataclass
class TileScope:
    """What one tile-program epilogue can read and write."""

    where: Where
    tile: str  # the tile, in words: "s's tile", "o's [S, 128] tile", "the [S, 128] tile"
    rows: object  # the rows' dimension (S, M)
    cols: object  # the tile's columns: the loop's dimension, N1, or the row kernel's columns
    owner: str  # whose locals these are (a gemm name, or "the kernel's epilogue")
    carries: dict[str, ir.Carry] = field(default_factory=dict)
    accumulators: dict[str, ir.Gemm] = field(default_factory=dict)
    gemm: ir.Gemm | None = None  # the loop's first gemm (Where.LOOP)
    loop: ir.Loop | None = None
    bound: dict[str, Rank] = field(default_factory=dict)  # locals bound so far, their ranks
    later: dict[str, SourceLoc] = field(default_factory=dict)
    handed_on: SourceLoc | None = None  # `s = ...` in the first gemm's epilogue, once stored
    reads: set[str] = field(default_factory=set)  # carries and accumulators read
    # the parameter whose (batch, heads) dims are the instances (the loop's A, or under a
    # backward's GQA its streamed B, whose query head a visit is; the row kernel's first
    # tensor): `head` indexes its heads, `batch` its batch
    lead: ir.Param | None = None
    # the loop's loop-row gemms: their tiles are read only by their own `+=` stores
    loop_rows: dict[str, ir.Gemm] = field(default_factory=dict)
    used: set[str] = field(default_factory=set)  # locals read after this epilogue (later gemms)
    elsewhere: dict[str, str] = field(default_factory=dict)  # values not readable here: why


# ---------------------------------------------------------------------------------------------
# Quoting an expression in a message


_PRECEDENCE = {ir.Op.ADD: 1, ir.Op.SUB: 1, ir.Op.MUL: 2, ir.Op.DIV: 2}
_COMPARE = {ir.Op.LT, ir.Op.LE, ir.Op.GT, ir.Op.GE, ir.Op.EQ, ir.Op.NE}
MAX_QUOTE = 48


def expr_text(e: object) -> str:
    """The expression as the DSL writes it (`acc * 2`), shortened when long."""
    text = _text(e, 0)
    return text if len(text) <= MAX_QUOTE else text[: MAX_QUOTE - 3] + "..."


def _text(e: object, outer: int) -> str:
    if isinstance(e, ir.Acc):
        return "acc"
    if isinstance(e, ir.Const):
        value = e.value
        if isinstance(value, float) and math.isinf(value):
            return "-inf" if value < 0 else "inf"
        if isinstance(value, float) and value.is_integer() and abs(value) < 1e15:
            return str(int(value))
        return number_text(value)
    if isinstance(e, (ir.ScalarLoad, ir.TensorLoad, ir.LocalRef)):
        return str(e.name)
    if isinstance(e, ir.VectorLoad):
        return f"{e.name}[{getattr(e.axis, 'value', e.axis)}]"
    if isinstance(e, ir.Position):
        return getattr(e.axis, "value", str(e.axis))
    if isinstance(e, ir.Extent):
        return str(e.dim)
    if isinstance(e, ir.Random):
        return f"random{'_t' if e.transposed else ''}({e.seed}, {e.offset})"
    if isinstance(e, ir.Cast):
        return f"cast<{getattr(e.dtype, 'dsl_name', e.dtype)}>({_text(e.arg, 0)})"
    if isinstance(e, ir.Reduce):
        try:
            name = reduction_name(e.op, e.axis)
        except StopIteration:
            name = "reduce"
        return f"{name}({_text(e.arg, 0)})"
    if isinstance(e, ir.Call) and isinstance(e.args, tuple):
        if e.op is ir.Op.NEG and len(e.args) == 1:
            return "-" + _text(e.args[0], 3)
        if e.op in _PRECEDENCE and len(e.args) == 2:
            mine = _PRECEDENCE[e.op]
            text = f"{_text(e.args[0], mine)} {e.op.spelling} {_text(e.args[1], mine + 1)}"
            return f"({text})" if mine < outer else text
        if e.op in _COMPARE and len(e.args) == 2:
            text = f"{_text(e.args[0], 1)} {e.op.spelling} {_text(e.args[1], 1)}"
            return f"({text})" if outer > 0 else text
        spelled = getattr(e.op, "spelling", "?")
        return f"{spelled}({', '.join(_text(a, 0) for a in e.args)})"
    return shown(e)


# ---------------------------------------------------------------------------------------------
# Statements


def check_tile_epilogue(state: KernelState, epilogue: ir.Epilogue, scope: TileScope,
                        at: SourceLoc) -> None:
    """Check one tile-program epilogue in order; collect its unused-local warnings."""
    stmts = epilogue.stmts
    if not isinstance(stmts, tuple):
        raise KgenError(at, f"the epilogue of {scope.owner} must hold a tuple of statements")
    for stmt in stmts:
        if not isinstance(stmt, (ir.Let, ir.Store, ir.Update)):
            raise KgenError(at, f"epilogue statements must be Let, Store or Update, got "
                                f"{shown(stmt)}")
        name = stmt.target if isinstance(stmt, ir.Store) else stmt.name
        require_str(name, loc_of(stmt, at), "a statement's name")
        if isinstance(stmt, ir.Let):
            scope.later.setdefault(stmt.name, loc_of(stmt, at))
    extents: dict[str, tuple[int, int]] = {}
    for stmt in stmts:
        check_extent(state, stmt, extents)
    for stmt in stmts:
        loc = loc_of(stmt, at)
        if isinstance(stmt, ir.Let):
            rank = rank_of(state, stmt.value, scope)
            state.define(stmt.name, "local", loc)
            state.local_owner[stmt.name] = scope.owner
            scope.bound[stmt.name] = rank
        elif isinstance(stmt, ir.Update):
            _check_update(state, stmt, scope, loc)
        else:
            _check_store(state, stmt, scope, loc)
    # a local read by a later gemm (its operand, its epilogue) is used: a store stands for it
    uses = tuple(ir.Store("", ir.LocalRef(n)) for n in sorted(scope.used & set(scope.bound)))
    state.warnings.extend(unused_local_warnings(stmts + uses))


def _check_update(state: KernelState, stmt: ir.Update, scope: TileScope, loc) -> None:
    name = stmt.name
    if scope.where is Where.ROWS:
        raise KgenError(loc, f"a row kernel has no carries: '{name}' cannot be updated; bind "
                             f"a local instead")
    if scope.where is Where.LOOP_ROWS:
        raise KgenError(loc, f"{scope.owner}'s epilogue works at the loop's rows: it cannot "
                             f"update '{name}' (carried per row of the kernel); it only adds "
                             "its tile into an 'out accumulate' tensor")
    if scope.where is Where.AFTER and (name in scope.carries or name in scope.accumulators):
        raise KgenError(loc, f"the loop is over: '{name}' cannot be updated after it; bind a "
                             f"local instead (e.g. '{name}_final = ...')")
    if name in scope.accumulators:
        factor = _rescale_factor(stmt.value, name)
        if factor is None:
            raise KgenError(loc, f"'{name}' is an accumulator (gemm {name} +=): it can only be "
                                 f"rescaled by a row value, as in '{name} = {name} * r'")
        rank = rank_of(state, factor, scope)
        if rank is not Rank.ROW:
            raise KgenError(
                loc_of(factor, loc),
                f"'{name}' can only be rescaled by one value per row; `{expr_text(factor)}` is "
                f"one value per element of {scope.tile}",
            )
        return
    if name not in scope.carries:
        known = [*scope.carries, *scope.accumulators]
        raise KgenError(loc, f"unknown carry {quote(name)}{did_you_mean(name, known)}")
    rank = rank_of(state, stmt.value, scope)
    if rank is not Rank.ROW:
        raise KgenError(
            loc,
            f"{name} is one value per row; `{expr_text(stmt.value)}` is one value per element "
            f"of {scope.tile}",
        )


def _rescale_factor(value: object, name: str) -> ir.Expr | None:
    """r in `o * r` or `r * o`, where o is the accumulator `name` and r does not read it."""
    if not isinstance(value, ir.Call) or value.op is not ir.Op.MUL:
        return None
    if not isinstance(value.args, tuple) or len(value.args) != 2:
        return None
    left, right = value.args
    for mine, other in ((left, right), (right, left)):
        if isinstance(mine, ir.LocalRef) and mine.name == name and not _reads(other, name):
            return other
    return None


def _reads(e: object, name: str) -> bool:
    stack = [e]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.LocalRef) and node.name == name:
            return True
        stack.extend(_children(node))
    return False


def _children(node: object) -> tuple:
    if isinstance(node, ir.Call):
        return node.args if isinstance(node.args, tuple) else ()
    if isinstance(node, (ir.Cast, ir.Reduce)):
        return (node.arg,)
    return ()


def _check_store(state: KernelState, stmt: ir.Store, scope: TileScope, loc) -> None:
    name = stmt.target
    gemm = scope.gemm
    if not isinstance(stmt.accumulate, bool):
        raise KgenError(loc, f"Store.accumulate must be True or False, got "
                             f"{shown(stmt.accumulate)}")
    if scope.where is Where.LOOP_ROWS or stmt.accumulate:
        _check_add(state, stmt, scope, loc)
        return
    if scope.where is Where.LOOP and gemm is not None and name == gemm.name:
        if scope.handed_on is not None:
            raise KgenError(loc, f"'{name}' is set twice (first{at_line(scope.handed_on)})")
        rank_of(state, stmt.value, scope)
        scope.handed_on = loc
        scope.bound[name] = Rank.TILE  # later statements read the value (rowsum(s))
        return
    param = state.params.get(name)
    if param is None:
        if name in scope.carries or name in scope.accumulators:
            raise KgenError(loc, f"cannot store to '{name}': it is carried by the loop")
        if state.names.get(name, ("",))[0] == "gemm":
            raise KgenError(loc, f"cannot store to gemm '{name}' from {scope.owner}")
        if name in scope.bound or name in state.local_owner:
            raise KgenError(loc, f"cannot store to local '{name}'; it is not an output")
        raise KgenError(
            loc, f"cannot store to unknown name {quote(name)}{did_you_mean(name, state.params)}"
        )
    kind = param.kind.value
    if param.role is not Role.OUT:
        raise KgenError(loc, f"cannot store to input {kind} '{name}'")
    if param.accumulate:
        raise KgenError(loc, f"'{name}' is declared 'out accumulate': the kernel adds into it, "
                             f"'{name} += ...', in the epilogue of a loop-row gemm "
                             "('gemm dq = ds^T @ K')")
    if scope.where is Where.LOOP and _stores_score_tile(scope):
        _check_score_tile_store(state, stmt, param, scope, loc)
        return
    if scope.where is Where.LOOP:
        raise KgenError(
            loc,
            f"gemm '{gemm.name}' runs once per block of loop '{scope.loop.name}': store "
            f"outputs in the kernel's epilogue, after the loop (epilogue {{ {name} = ... }})",
        )
    _refuse_second_write(state, name, loc)
    rank = rank_of(state, stmt.value, scope)
    if param.kind is ParamKind.TENSOR:
        if param.shape != (scope.rows, scope.cols):
            raise KgenError(loc, f"tensor '{name}' has shape {shape_text(param.shape)} but "
                                 f"{scope.owner} computes {shape_text((scope.rows, scope.cols))}")
    elif param.kind is ParamKind.VECTOR:
        if param.shape != (scope.rows,):
            raise KgenError(loc, f"vector '{name}' has length {shape_text(param.shape)[1:-1]} "
                                 f"but {scope.owner} stores one value per row, "
                                 f"{shape_text((scope.rows,))}")
        if rank is not Rank.ROW:
            raise KgenError(
                loc,
                f"{name} is one value per row; `{expr_text(stmt.value)}` is one value per "
                f"element of {scope.tile}",
            )
    else:
        raise KgenError(loc, f"'{name}' is a scalar; {scope.owner} stores tensors and row "
                             "vectors only")
    state.written[name] = loc


def _refuse_second_write(state: KernelState, name: str, loc) -> None:
    """Each output is written by one statement of the kernel (a store, a tile store or an add)."""
    if name in state.written:
        raise KgenError(loc, f"output '{name}' is written twice "
                             f"(first{at_line(state.written[name])})")


def _stores_score_tile(scope: TileScope) -> bool:
    """A score gemm of a DAG loop (more gemms than the forward's: the backward's) may store a
    tile output: each (row, col) of it is one element of one block's tile."""
    return scope.loop is not None and not is_forward_loop(scope.loop)


def _check_score_tile_store(state: KernelState, stmt: ir.Store, param: ir.Param,
                            scope: TileScope, loc) -> None:
    """`dBiasT = dst` in a score gemm's epilogue of a DAG loop: the tile's value stored at each
    (row, col) of a row-major output tensor [rows, loop dim] (the bias gradient dS^T), once."""
    name = param.name
    if param.kind is not ParamKind.TENSOR or param.layout is not ir.Layout.ROW:
        raise KgenError(loc, f"{scope.owner} stores its tile into a row-major output tensor "
                             f"[{scope.rows}, {scope.cols}]; '{name}' is not one")
    _refuse_second_write(state, name, loc)
    rank_of(state, stmt.value, scope)
    if param.shape != (scope.rows, scope.cols):
        raise KgenError(loc, f"tensor '{name}' has shape {shape_text(param.shape)} but "
                             f"{scope.owner} stores its {shape_text((scope.rows, scope.cols))} "
                             "tile, block by block")
    state.written[name] = loc


def _check_add(state: KernelState, stmt: ir.Store, scope: TileScope, loc) -> None:
    """`dQ += expr`: a loop-row gemm's epilogue adds its [block, N] tile into an `out
    accumulate` tensor [loop dim, N], at the loop's rows; nothing else stores there."""
    name = stmt.target
    if scope.where is not Where.LOOP_ROWS:
        raise KgenError(loc, f"'{name} += ...' adds a loop-row tile into an 'out accumulate' "
                             f"tensor: only in a loop-row gemm's epilogue ('gemm dq = ds^T @ K "
                             f"{{ epilogue {{ {name} += acc }} }}'), not in {scope.owner}")
    if not stmt.accumulate:
        raise KgenError(loc, f"{scope.owner} is a loop-row gemm: its epilogue only adds its "
                             f"tile into an 'out accumulate' tensor ('dQ += acc'), and cannot "
                             f"store '{name}'")
    param = state.params.get(name)
    if param is None:
        raise KgenError(loc, f"cannot add into unknown name {quote(name)}"
                             f"{did_you_mean(name, state.params)}")
    if param.role is not Role.OUT or not param.accumulate or param.kind is not ParamKind.TENSOR:
        raise KgenError(loc, f"'{name} += ...' adds into an output tensor declared 'out "
                             f"accumulate'; '{name}' is not one ({param.kind.value} "
                             f"'{name}'{at_line(param.loc)})")
    _refuse_second_write(state, name, loc)
    rank_of(state, stmt.value, scope)
    if param.shape != (scope.rows, scope.cols):
        raise KgenError(loc, f"tensor '{name}' has shape {shape_text(param.shape)} but "
                             f"{scope.owner} adds a {shape_text((scope.rows, scope.cols))} tile "
                             f"at the loop's rows")
    state.written[name] = loc


# ---------------------------------------------------------------------------------------------
# Values


def rank_of(state: KernelState, e: object, scope: TileScope) -> Rank:
    """Check `e` as a value of this epilogue and return its rank."""
    loc = loc_of(e, NOWHERE)
    if isinstance(e, ir.Acc):
        if scope.where is Where.AFTER:
            names = ", ".join(f"'{n}'" for n in scope.accumulators)
            raise KgenError(loc, f"after the loop, an accumulator is read by its name ({names}); "
                                 "acc is a gemm's own accumulator")
        if scope.where is Where.ROWS:
            raise KgenError(loc, "a row kernel has no gemm, so no acc; read its tensors by name")
        return Rank.TILE
    if isinstance(e, ir.Const):
        value = e.value
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise KgenError(loc, f"constant must be a number, got {shown(value)}")
        if (isinstance(value, float) and math.isnan(value)) or (
                math.isfinite(value) and abs(value) > F32_MAX):
            raise KgenError(loc, f"constant must be an f32 number, inf or -inf, got "
                                 f"{number_text(value)}")
        return Rank.ROW
    if isinstance(e, ir.Position):
        if e.axis not in (Axis.ROW, Axis.COL, Axis.BATCH, Axis.HEAD):
            raise KgenError(loc, f"a position is row, col, batch or head, got {shown(e.axis)}")
        return Rank.TILE if e.axis is Axis.COL else Rank.ROW
    if isinstance(e, ir.Extent):
        return _extent_rank(state, e, scope, loc)
    if isinstance(e, ir.Random):
        return _random_rank(state, e, scope, loc)
    if isinstance(e, ir.Call):
        if not isinstance(e.op, ir.Op):
            raise KgenError(loc, f"a call needs a kgen.ir.Op, got {shown(e.op)}")
        if not isinstance(e.args, tuple) or len(e.args) != e.op.arity:
            got = len(e.args) if isinstance(e.args, (tuple, list)) else shown(e.args)
            raise KgenError(loc, arity_message(e.op.spelling, e.op.arity, got))
        return max((rank_of(state, a, scope) for a in e.args), default=Rank.ROW)
    if isinstance(e, ir.Cast):
        if not isinstance(e.dtype, DType):
            raise KgenError(loc, f"unknown dtype {quote(e.dtype)}; expected {DTYPE_NAMES}")
        return rank_of(state, e.arg, scope)
    if isinstance(e, ir.Reduce):
        return _reduce_rank(state, e, scope, loc)
    if isinstance(e, ir.LocalRef):
        return _local_rank(e, scope, loc)
    if isinstance(e, (ir.ScalarLoad, ir.TensorLoad, ir.VectorLoad)):
        return _load_rank(state, e, scope, loc)
    raise KgenError(loc, f"not an epilogue expression: {shown(e)}")


def _reduce_rank(state: KernelState, e: ir.Reduce, scope: TileScope, loc) -> Rank:
    if not isinstance(e.op, ReduceOp) or not isinstance(e.axis, Axis):
        raise KgenError(loc, "a reduction needs a kgen.ir.ReduceOp and a kgen.ir.Axis")
    spelled = reduction_name(e.op, e.axis)
    if e.axis is not Axis.ROW:
        where = {Where.LOOP: "inside a loop", Where.AFTER: "after a loop",
                 Where.ROWS: "in a row kernel",
                 Where.LOOP_ROWS: "in a loop-row gemm's epilogue"}[scope.where]
        raise KgenError(loc, f"{spelled}: column and whole-tile reductions are not supported "
                             f"{where} for now; row reductions (row{e.op.value}) are")
    if scope.where is Where.AFTER:
        raise KgenError(loc, f"{spelled} after the loop is not supported for now; reduce in the "
                             "loop's first gemm and carry the result")
    if scope.where is Where.LOOP_ROWS:
        raise KgenError(loc, f"{spelled} in a loop-row gemm's epilogue is not supported for "
                             "now; it only adds its tile into an 'out accumulate' tensor")
    if rank_of(state, e.arg, scope) is not Rank.TILE:
        raise KgenError(loc, f"{spelled} reduces the elements of a row, but "
                             f"`{expr_text(e.arg)}` is already one value per row")
    return Rank.ROW


def _local_rank(e: ir.LocalRef, scope: TileScope, loc) -> Rank:
    name = e.name
    if not isinstance(name, str):
        raise KgenError(loc, f"a local name must be a string, got {shown(name)}")
    if name in scope.bound:
        return scope.bound[name]
    if name in scope.loop_rows:
        g = scope.loop_rows[name]
        raise KgenError(loc, loop_row_message(name, g.a.name, g.b.name))
    if name in scope.elsewhere:
        raise KgenError(loc, scope.elsewhere[name])
    if scope.where is Where.LOOP_ROWS and (name in scope.carries or name in scope.accumulators):
        raise KgenError(loc, f"'{name}' is carried per row of the kernel; {scope.owner}'s "
                             f"epilogue works on {scope.tile} at the loop's rows and cannot read "
                             "it")
    if name in scope.carries:
        scope.reads.add(name)
        return Rank.ROW
    if name in scope.accumulators:
        scope.reads.add(name)
        if scope.where is Where.AFTER:
            return Rank.TILE
        raise KgenError(loc, f"'{name}' is the accumulator of gemm {name} +=: in the loop it "
                             f"can only be rescaled ('{name} = {name} * r'); read it in the "
                             "kernel's epilogue, after the loop")
    if name in scope.later:
        raise KgenError(loc, f"'{name}' is used before it is defined{at_line(scope.later[name])}")
    if scope.gemm is not None and name == scope.gemm.name:
        raise KgenError(loc, f"'{name}' is read before it is set ('{name} = ...')")
    candidates = [*scope.bound, *scope.carries, *scope.accumulators]
    raise KgenError(loc, f"unknown local {quote(name)}{did_you_mean(name, candidates)}")


def _load_rank(state: KernelState, e, scope: TileScope, loc) -> Rank:
    want = {ir.ScalarLoad: ParamKind.SCALAR, ir.TensorLoad: ParamKind.TENSOR,
            ir.VectorLoad: ParamKind.VECTOR}[type(e)]
    name = require_str(e.name, loc, "a parameter name")
    param = state.params.get(name)
    if param is None:
        raise KgenError(loc, f"unknown {want.value} {quote(name)}"
                             f"{did_you_mean(name, state.params)}")
    kind = param.kind.value
    if param.kind is not want:
        raise KgenError(loc, f"'{name}' is a {kind}, not a {want.value}")
    if param.role is Role.OUT:
        raise KgenError(loc, f"cannot read output {kind} '{name}'; to reuse a value, bind it to "
                             "a local (t = ...) and use that")
    if isinstance(e, ir.ScalarLoad):
        if param.dtype is DType.U64:
            raise KgenError(loc, f"'{name}' is a u64 scalar: it keys random(seed, offset) and "
                                 "is not a value")
        return Rank.ROW
    if isinstance(e, ir.TensorLoad):
        return _tensor_rank(param, scope, loc)
    if e.axis not in (Axis.ROW, Axis.COL, Axis.BATCH, Axis.HEAD):
        raise KgenError(loc, f"vector '{name}' must be indexed by row, col, batch or head, got "
                             f"{shown(e.axis)}")
    if e.axis in (Axis.BATCH, Axis.HEAD):
        return _instance_vector_rank(param, e.axis, scope, loc)
    need = scope.rows if e.axis is Axis.ROW else scope.cols
    if param.shape != (need,):
        raise KgenError(loc, f"vector '{name}' has length {shape_text(param.shape)[1:-1]} but "
                             f"{name}[{e.axis.value}] needs length {shape_text((need,))[1:-1]}")
    return Rank.ROW if e.axis is Axis.ROW else Rank.TILE


def _random_rank(state: KernelState, e: ir.Random, scope: TileScope, loc) -> Rank:
    """random(seed, offset): one value per element of the tile, keyed by two u64 input
    scalars."""
    if scope.where in (Where.AFTER, Where.LOOP_ROWS):
        raise KgenError(loc, "random(seed, offset) is one value per element of a loop's score "
                             "gemm (or of a row kernel), not after the loop nor at its rows")
    for name in (e.seed, e.offset):
        param = state.params.get(require_str(name, loc, "a scalar name"))
        if param is None:
            raise KgenError(loc, f"unknown scalar {quote(name)}{did_you_mean(name, state.params)}")
        if param.kind is not ParamKind.SCALAR or param.dtype is not DType.U64:
            what = (f"a {param.dtype.dsl_name} scalar" if param.kind is ParamKind.SCALAR
                    else f"a {param.kind.value}")
            raise KgenError(loc, f"random(seed, offset) takes u64 scalars; '{name}' is {what}")
    return Rank.TILE


def _tensor_rank(param: ir.Param, scope: TileScope, loc) -> Rank:
    """`Bias` at the element's (row, col): in a row kernel, a tensor of its shape; in a loop's
    score gemm, a [rows, loop dim] tensor of either layout (per batch and head, each of which
    may be shared: a stride of 0), read element by element or from a staged tile (an additive
    bias, a mask; the attention backward's BiasT is column-major on sm_90a); in a loop-row
    gemm's epilogue a row-major one."""
    name = param.name
    if scope.where is Where.AFTER:
        raise KgenError(loc, f"tensor '{name}' cannot be read after the loop for now; read it "
                             f"in the loop's first gemm (at its row and col)")
    if param.shape != (scope.rows, scope.cols):
        what = ("the row kernel works on" if scope.where is Where.ROWS else
                f"{scope.owner} reads it at (row, col) of")
        raise KgenError(loc, f"tensor '{name}' has shape {shape_text(param.shape)} but {what} "
                             f"{shape_text((scope.rows, scope.cols))}")
    if scope.where is Where.LOOP_ROWS and param.layout is not ir.Layout.ROW:
        raise KgenError(loc, f"tensor '{name}' is read at (row, col) in the loop: it must be "
                             "row-major (not yet col)")
    return Rank.TILE


def _instance_vector_rank(param: ir.Param, axis: Axis, scope: TileScope, loc) -> Rank:
    """`slopes[head]`: an unbatched vector with one value per query head (or per batch)."""
    name, lead = param.name, scope.lead
    dim = None if lead is None else (lead.heads if axis is Axis.HEAD else lead.batch)
    if dim is None:
        whose = f"'{lead.name}'" if lead is not None else "the kernel's rows"
        raise KgenError(loc, f"{name}[{axis.value}]: {whose} has no {axis.value} dimension "
                             f"to index")
    if param.batch is not None:
        raise KgenError(loc, f"{name}[{axis.value}] reads one value per {axis.value}, so "
                             f"'{name}' must be a plain vector [{dim}], not batched")
    if param.shape != (dim,):
        raise KgenError(loc, f"vector '{name}' has length {shape_text(param.shape)[1:-1]} but "
                             f"{name}[{axis.value}] needs length {dim} ('{lead.name}''s "
                             f"{'heads' if axis is Axis.HEAD else 'batch'})")
    return Rank.ROW


def _extent_rank(state: KernelState, e: ir.Extent, scope: TileScope, loc) -> Rank:
    """A dimension's size as a value: the kernel's rows or its loop's dimension (the sizes the
    kernel is launched with); one value for every row."""
    name = require_str(e.dim, loc, "a dimension name")
    allowed = [d for d in (scope.rows, scope.loop.dim if scope.loop else None)
               if isinstance(d, str)]
    if name not in allowed:
        known = state.names.get(name, ("",))[0] == "dimension"
        what = f"'{name}' is a dimension, but" if known else f"unknown dimension {quote(name)}:"
        listed = " or ".join(f"'{d}'" for d in allowed) or "none here"
        raise KgenError(loc, f"{what} only the kernel's rows and its loop's dimension are "
                             f"sizes usable as values ({listed})")
    return Rank.ROW
