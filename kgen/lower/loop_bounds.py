"""The blocks of a loop that a tile of rows visits: a mask's dead blocks, derived when compiling
(or, with a block mask, listed at run time: `listed`).

A mask is a body value `where(P, e, -inf)` whose predicate P is a conjunction (`a * b`,
`min(a, b)`, nested `where(a, b, 0)`) of comparisons linear in `col` and `row`: the coefficient
of `col` is 1 or -1, that of `row` -1, 0 or 1, the rest a sum of constants, scalars and sizes
(the rows, the loop's length) times constants. Each comparison solved for `col` is a
pp.ColumnBound; an equality of a row and a column vector (`qd[row] == kd[col]`) is a
pp.EqualBound, which the kernel resolves per tile of rows by scanning the column vector; a
conjunct that is another comparison not linear (0 or 1) gives no bound and leaves the others'
(where they are 0, P is 0). A block where P is false for every element is skipped when the body provably
leaves the loop's state as it was on such a block. The proof runs the body once in each of two
abstract states, with the masked value -inf everywhere:
- the initial state: every carry at its init, the accumulator zero;
- a running state: every carry some finite value, the accumulator anything;
(a row's carries are either all at their initial values or all finite: the premise, which
docs/language.md states) and asks that every carry update gives the carry's own value, every
rescale of the accumulator is by 1 (by a finite value in the initial state: zero stays zero),
and the value handed on is 0. The inputs are taken to be finite. Values are abstracted as a
constant, a finite unknown (equal to itself: `m - m` is 0), a positive one (a scalar declared
`positive`, checked > 0 at launch: an infinity times it keeps its sign, so `scale * (x - m)`
stays -inf where x is) or unknown.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..enums import Axis, Op, ReduceOp
from ..plan import epilogue as dag
from ..plan import loop_dag as ld
from ..plan import program as pp

_COMPARE = {Op.LE: (True, False), Op.LT: (True, True), Op.GE: (False, False),
            Op.GT: (False, True)}  # op -> (upper, strict) for `col op ...`
_FLIP = {Op.LE: Op.GE, Op.LT: Op.GT, Op.GE: Op.LE, Op.GT: Op.LT}


def derive(body: pp.Section, carries: tuple[tuple[str, float], ...],
           positive: frozenset[str] = frozenset()) -> pp.LoopBounds:
    """The loop's bounds from the body's masks (every block, with why, when none qualifies);
    `positive`: the scalars declared positive."""
    values = body.values
    masks = [v for v in values if _is_mask(values, v)]
    if not masks:
        return pp.LoopBounds((), (), "every block runs: no value of the form where(P, e, -inf) "
                                     "masks the scores")
    bounds: list[pp.ColumnBound] = []
    fold: list[int] = []
    refused: list[str] = []
    for mask in masks:
        cond = mask.kind.args[0]
        text = _text(values, mask.id)
        found = _conjunction(values, cond, equalities=True)
        if isinstance(found, str):
            refused.append(f"`{text}`: {found}")
            continue
        problem = _changes_state(body, carries, mask.id, positive)
        if problem is not None:
            refused.append(f"`{text}`: a block it masks in full {problem}")
            continue
        bounds += [b for b in found[0] if b not in bounds]
        fold += [i for i in found[1] if i not in fold]
    if not bounds:
        return pp.LoopBounds((), (), "every block runs: " + "; ".join(refused))
    linear, equal = split(bounds)
    why = (f"blocks masked in full for every row of the tile are skipped "
           f"({bound_parts(linear, equal)}); "
           "inside the mask its predicate is known true")
    if refused:
        why += "; not used: " + "; ".join(refused)
    return pp.LoopBounds(linear, tuple(fold), why, equal)


def listed(body: pp.Section, blocks, tile_m: int, block: int) -> pp.LoopBounds:
    """The bounds of a loop with a block mask (ir.BlockMask): the blocks listed at run time,
    every mask where(P, e, -inf) reading e on a full block; no bound derived (the list alone
    says which blocks a tile of rows visits, FlexAttention's meaning)."""
    values = body.values
    masks = tuple(v.id for v in values if _is_mask(values, v))
    full = blocks.full_counts is not None
    why = (f"the block mask lists the blocks each tile of rows visits ({tile_m}x{block}): "
           f"{blocks.counts} partial blocks per tile from {blocks.indices}, the body as written")
    if full:
        why += (f", then {blocks.full_counts} full blocks from {blocks.full_indices}, "
                + ("where " + ", ".join(f"`{_text(values, m)}`" for m in masks)
                   + " read" + ("s" if len(masks) == 1 else "") + " the value kept"
                   if masks else "alike (the body has no mask where(P, e, -inf))"))
    why += "; a block listed in neither is not visited"
    return pp.LoopBounds((), (), why, listed=pp.BlockList(
        blocks.counts, blocks.indices, blocks.full_counts, blocks.full_indices,
        masks if full else ()))


def _is_mask(values, v: pp.Value) -> bool:
    kind = v.kind
    if not (isinstance(kind, dag.Apply) and kind.op is Op.WHERE):
        return False
    other = values[kind.args[2]].kind
    return isinstance(other, dag.Constant) and other.value == -math.inf


# ---------------------------------------------------------------------------------------------
# The predicate: a conjunction of linear comparisons


def _conjunction(values, index: int, equalities: bool = False):
    """(bounds, predicate ids) of a conjunction of comparisons, or why it is not one; with
    `equalities`, an equality of a row and a column vector is a bound (pp.EqualBound, which
    the loop skeletons scan: templates/common/loop_bounds.inc.j2), else a predicate not
    linear."""
    kind = values[index].kind
    if isinstance(kind, dag.Apply) and kind.op in (Op.MUL, Op.MIN) or (
            isinstance(kind, dag.Apply) and kind.op is Op.WHERE
            and _constant(values, kind.args[2]) == 0.0):
        parts = kind.args[:2]
        bounds, ids, why = [], [], None
        for part in parts:
            found = _conjunction(values, part, equalities)
            if isinstance(found, str) and not _predicate(values, part):
                return found
            if isinstance(found, str):  # a 0/1 predicate not linear (doc[row] == doc[col]):
                why = why or found  # where the others are 0 the conjunction is 0 too, but
                continue  # it is not known true inside their mask
            bounds += found[0]
            ids += found[1]
        if not bounds:
            return why
        return bounds, ([index] if why is None else []) + ids
    equal = _equality(values, index) if equalities else None
    if equal is not None:
        return [equal], [index]
    if not (isinstance(kind, dag.Apply) and kind.op in _COMPARE):
        return (f"its condition `{_text(values, index)}` is not a comparison of col "
                "(<, <=, >, >=) or a conjunction of them")
    left, right = (_linear(values, a) for a in kind.args)
    if left is None or right is None:
        return (f"`{_text(values, index)}` is not linear in col and row (constants, scalars "
                "and sizes times constants)")
    diff = dict(left)
    for key, coef in right.items():
        diff[key] = diff.get(key, 0.0) - coef
    op = kind.op
    col = diff.pop("col", 0.0)
    if col not in (1.0, -1.0):
        return f"`{_text(values, index)}` must hold col with coefficient 1 or -1"
    if col < 0:
        diff = {key: -coef for key, coef in diff.items()}
        op = _FLIP[op]
    # col + row_coef * row + rest  op  0  ->  col  op  -row_coef * row - rest
    slope = -diff.pop("row", 0.0)
    if slope not in (-1.0, 0.0, 1.0):
        return f"`{_text(values, index)}` must hold row with coefficient -1, 0 or 1"
    upper, strict = _COMPARE[op]
    offset = tuple(pp.OffsetTerm(-coef, *key) for key, coef in sorted(
        diff.items(), key=lambda item: (item[0][0].value, item[0][1] or "")) if coef != 0.0)
    return [pp.ColumnBound(upper, strict, int(slope), offset)], [index]


def _equality(values, index: int) -> pp.EqualBound | None:
    """`a[row] == b[col]` (either order) of two vectors, as an EqualBound, else None."""
    kind = values[index].kind
    if not (isinstance(kind, dag.Apply) and kind.op is Op.EQ):
        return None
    loads = [values[a].kind for a in kind.args]
    if not all(isinstance(k, dag.VectorLoad) for k in loads):
        return None
    axes = {k.axis: k.param for k in loads}
    if set(axes) != {Axis.ROW, Axis.COL}:
        return None
    return pp.EqualBound(axes[Axis.ROW], axes[Axis.COL])


def _predicate(values, index: int) -> bool:
    """A value that is 0 or 1: a comparison, or a product, min or where(a, b, 0) of them."""
    kind = values[index].kind
    if not isinstance(kind, dag.Apply):
        return False
    if kind.op in _COMPARE or kind.op in (Op.EQ, Op.NE):
        return True
    if kind.op in (Op.MUL, Op.MIN) or (kind.op is Op.WHERE
                                       and _constant(values, kind.args[2]) == 0.0):
        return all(_predicate(values, a) for a in kind.args[:2])
    return False


def _linear(values, index: int) -> dict | None:
    """A value as {"col": c, "row": r, (Term, param): coef}, or None when not linear."""
    kind = values[index].kind
    if isinstance(kind, dag.Constant):
        return {(pp.Term.ONE, None): kind.value} if math.isfinite(kind.value) else None
    if isinstance(kind, pp.PositionValue) and kind.axis in (Axis.ROW, Axis.COL):
        return {kind.axis.value: 1.0}
    if isinstance(kind, dag.ScalarArg):
        return {(pp.Term.SCALAR, kind.param): 1.0}
    if isinstance(kind, pp.ExtentValue):
        return {(pp.Term.LOOP_LEN if kind.loop else pp.Term.ROWS, kind.dim): 1.0}
    if not isinstance(kind, dag.Apply):
        return None
    args = [_linear(values, a) for a in kind.args]
    if any(a is None for a in args):
        return None
    if kind.op is Op.NEG:
        return {key: -coef for key, coef in args[0].items()}
    if kind.op in (Op.ADD, Op.SUB):
        sign = 1.0 if kind.op is Op.ADD else -1.0
        out = dict(args[0])
        for key, coef in args[1].items():
            out[key] = out.get(key, 0.0) + sign * coef
        return out
    if kind.op in (Op.MUL, Op.DIV):
        factor = _pure_constant(args[1])
        if kind.op is Op.MUL and factor is None:
            factor, args = _pure_constant(args[0]), args[::-1]
        if factor is None or (kind.op is Op.DIV and factor == 0.0):
            return None
        scale = factor if kind.op is Op.MUL else 1.0 / factor
        return {key: coef * scale for key, coef in args[0].items()}
    return None


def _pure_constant(form: dict) -> float | None:
    if set(form) <= {(pp.Term.ONE, None)}:
        return form.get((pp.Term.ONE, None), 0.0)
    return None


def _constant(values, index: int) -> float | None:
    kind = values[index].kind
    return kind.value if isinstance(kind, dag.Constant) else None


# ---------------------------------------------------------------------------------------------
# The proof that a block masked in full leaves the state as it was


@dataclass(frozen=True, slots=True)
class _Finite:
    """A finite value not known when compiling; equal to itself only."""

    key: object


@dataclass(frozen=True, slots=True)
class _Positive(_Finite):
    """A finite value known to be > 0 (a scalar declared `positive`)."""


def _changes_state(body: pp.Section, carries, mask: int,
                   positive: frozenset[str] = frozenset()) -> str | None:
    """Why the body changes the state on a block where value `mask` is -inf, or None."""
    initial = {name: float(init) for name, init in carries}
    running = {name: _Finite(("carry", name)) for name, _ in carries}
    for state, start in (("from the loop's initial state", initial),
                         ("from a running state", running)):
        problem = _run(body, dict(start), mask, state == "from the loop's initial state",
                       positive)
        if problem is not None:
            return f"{problem} ({state})"
    return None


def _run(body: pp.Section, state: dict, mask: int, initial: bool,
         positive: frozenset[str]) -> str | None:
    known: dict[int, object] = {}
    values = body.values

    def get(index: int):
        if index not in known:
            known[index] = _abstract(values[index], get, state, mask, positive)
        return known[index]

    for stmt in body.statements:
        if isinstance(stmt, pp.UpdateCarry):
            if not _same(get(stmt.value), state[stmt.carry]):
                return f"changes carry '{stmt.carry}'"
        elif isinstance(stmt, pp.Rescale):
            factor = get(stmt.value)
            keeps = _same(factor, 1.0) or (initial and (
                isinstance(factor, _Finite) or (isinstance(factor, float)
                                                and math.isfinite(factor))))
            if not keeps:
                return f"rescales accumulator '{stmt.gemm}'"
        elif isinstance(stmt, pp.HandOn):
            if not _same(get(stmt.value), 0.0):
                return "hands a value other than 0 to the accumulating gemm"
    return None


def _same(a, b) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        return a == b
    return isinstance(a, _Finite) and a == b


def _abstract(value: pp.Value, get, state: dict, mask: int, positive: frozenset[str]):
    """The value on a block masked in full: a float, a _Finite (a _Positive), or None
    (unknown)."""
    kind = value.kind
    if value.id == mask:
        return -math.inf
    if isinstance(kind, dag.Constant):
        return float(kind.value)
    if isinstance(kind, pp.CarryValue):
        return state[kind.carry]
    if isinstance(kind, dag.ScalarArg) and kind.param in positive:
        return _Positive(kind)
    if isinstance(kind, (dag.Accumulator, dag.ScalarArg, dag.VectorLoad, dag.TensorLoad,
                         pp.PositionValue, pp.ExtentValue, pp.RandomValue)):
        return _Finite(kind)
    if isinstance(kind, pp.RowReduction):
        arg = get(kind.arg)
        if isinstance(arg, float):  # the block has at least one column: a constant reduces
            if kind.op is ReduceOp.SUM:  # to itself, a sum only when it is 0
                return 0.0 if arg == 0.0 else None
            return abs(arg) if kind.op is ReduceOp.ABSMAX else arg
        return _Finite(("reduce", kind.op, arg)) if isinstance(arg, _Finite) else None
    if isinstance(kind, dag.Cast):
        arg = get(kind.arg)
        if isinstance(arg, float):
            return _rounded(arg, kind.dtype)
        return _Finite(("cast", kind.dtype, arg)) if isinstance(arg, _Finite) else None
    if isinstance(kind, dag.Apply):
        return _apply(kind.op, [get(a) for a in kind.args])
    return None


_BOUNDED = {Op.TANH, Op.SIGMOID, Op.RELU, Op.ABS, Op.NEG}  # finite in, finite out


def _apply(op: Op, args: list):
    if all(isinstance(a, float) for a in args):
        out = _numeric(op, args)
        return None if math.isnan(out) else out
    if op is Op.WHERE:
        cond, a, b = args
        if isinstance(cond, float):
            return a if cond != 0.0 else b
        return a if a is not None and (a == b) else None
    if any(a is None for a in args):
        return None
    if op in _BOUNDED:
        return _Finite((op, args[0]))
    if len(args) != 2:
        return None
    a, b = args
    return _binary(op, a, b)


def _binary(op: Op, a, b):
    """One float and one _Finite, or two _Finite."""
    fa, fb = isinstance(a, _Finite), isinstance(b, _Finite)
    if op in (Op.ADD, Op.SUB):
        if op is Op.SUB and a == b:
            return 0.0
        if fb and isinstance(a, float) and math.isinf(a):
            return a
        if fa and isinstance(b, float) and math.isinf(b):
            return b if op is Op.ADD else -b
        if b == 0.0:
            return a
        if op is Op.ADD and a == 0.0:
            return b
        return _Finite((op, a, b))
    if op is Op.MUL:
        for x, y in ((a, b), (b, a)):
            if isinstance(x, float):
                if x == 1.0:
                    return y
                if x == 0.0:
                    return 0.0
                if math.isinf(x) and isinstance(y, _Positive):
                    return x  # an infinity times a value > 0 keeps its sign
                return _Finite((op, a, b)) if math.isfinite(x) else None
        return _Finite((op, a, b))
    if op is Op.DIV:
        return a if b == 1.0 else None
    if op in (Op.MAX, Op.MIN):
        lost, wins = (-math.inf, math.inf) if op is Op.MAX else (math.inf, -math.inf)
        for x, y in ((a, b), (b, a)):
            if x == lost:
                return y
            if x == wins:
                return wins
        return a if a == b else _Finite((op, a, b))
    if op in (Op.EQ, Op.NE, Op.LT, Op.LE, Op.GT, Op.GE):
        if a == b:
            return 1.0 if op in (Op.EQ, Op.LE, Op.GE) else 0.0
        inf = a if isinstance(a, float) and math.isinf(a) else (
            b if isinstance(b, float) and math.isinf(b) else None)
        if inf is None:
            return None
        # a finite value against an infinity: compare any finite number the same way
        probe = [0.0 if isinstance(x, _Finite) else x for x in (a, b)]
        return _numeric(op, probe)
    return None


# exp where its value is exact: e^-inf = 0, e^0 = 1, e^inf = inf, e^NaN = NaN (else None: numpy)
_EXACT_EXP = {-math.inf: 0.0, 0.0: 1.0, math.inf: math.inf}


def _exp(x: float) -> float | None:
    return x if math.isnan(x) else _EXACT_EXP.get(x)


def _extreme(first_if):  # numpy's maximum and minimum: NaN if either is, else the one that wins
    return lambda a, b: a + b if math.isnan(a) or math.isnan(b) else (
        a if first_if(a, b) else b)


# The ops the bounds fold most (the softmax's constants: infinities, 0 and 1) in Python floats,
# which are IEEE float64 as numpy's: the same bits (tests/lower/test_loop_bounds_numeric.py holds
# each to kgen.reference's numpy_op), so that planning an attention kernel imports no numpy
# (50 ms of kgen compile's 0.3 s). exp only where its value is exact (_exp; None: numpy's).
_PYTHON_OPS = {
    Op.ADD: lambda a, b: a + b,
    Op.SUB: lambda a, b: a - b,
    Op.MUL: lambda a, b: a * b,
    Op.NEG: lambda a: -a,
    Op.MAX: _extreme(lambda a, b: a > b),  # a tie (0 and -0) gives b, as numpy
    Op.MIN: _extreme(lambda a, b: a < b),
    Op.EXP: _exp,
    Op.LT: lambda a, b: float(a < b),
    Op.LE: lambda a, b: float(a <= b),
    Op.GT: lambda a, b: float(a > b),
    Op.GE: lambda a, b: float(a >= b),
    Op.EQ: lambda a, b: float(a == b),
    Op.NE: lambda a, b: float(a != b),
    Op.WHERE: lambda c, a, b: a if c != 0 else b,
}


def _numeric(op: Op, values) -> float:
    """`op` of constants as the reference computes it (float64): the common ops in Python
    floats (_PYTHON_OPS), the others by numpy, imported here (not when kgen plans a kernel with
    no such constant to fold)."""
    python = _PYTHON_OPS.get(op)
    value = python(*(float(v) for v in values)) if python is not None else None
    if value is not None:
        return float(value)
    import numpy as np

    from ..reference import numpy_op

    with np.errstate(all="ignore"):
        return float(numpy_op(op, *(np.float64(v) for v in values)))


def _rounded(value: float, dtype) -> float:
    """A constant rounded to `dtype` as the reference rounds it."""
    import numpy as np

    from ..reference import round_to

    return float(round_to(np.float64(value), dtype))


# ---------------------------------------------------------------------------------------------
# Quoting a value in a message

_INFIX = {Op.ADD, Op.SUB, Op.MUL, Op.DIV, *_COMPARE, Op.EQ, Op.NE}


def _text(values, index: int, depth: int = 0) -> str:
    kind = values[index].kind
    if depth > 6:
        return "..."
    if isinstance(kind, dag.Constant):
        v = kind.value
        return ("-inf" if v < 0 else "inf") if math.isinf(v) else f"{v:g}"
    if isinstance(kind, dag.ScalarArg):
        return kind.param
    if isinstance(kind, pp.PositionValue):
        return kind.axis.value
    if isinstance(kind, pp.ExtentValue):
        return kind.dim
    if isinstance(kind, pp.RandomValue):
        return f"random{'_t' if kind.transposed else ''}({kind.seed}, {kind.offset})"
    if isinstance(kind, pp.CarryValue):
        return kind.carry
    if isinstance(kind, (dag.Accumulator, ld.GemmResult)):  # (a DAG loop's gemm's own)
        return "acc"
    if isinstance(kind, dag.VectorLoad):
        return f"{kind.param}[{kind.axis.value}]"
    if isinstance(kind, dag.TensorLoad):
        return kind.param
    if isinstance(kind, pp.RowReduction):
        return f"row{kind.op.value}({_text(values, kind.arg, depth + 1)})"
    if isinstance(kind, dag.Cast):
        return f"cast<{kind.dtype.dsl_name}>({_text(values, kind.arg, depth + 1)})"
    if isinstance(kind, dag.Apply):
        args = [_text(values, a, depth + 1) for a in kind.args]
        if kind.op in _INFIX:
            return f"({args[0]} {kind.op.spelling} {args[1]})" if depth else \
                f"{args[0]} {kind.op.spelling} {args[1]}"
        if kind.op is Op.NEG:
            return f"-{args[0]}"
        return f"{kind.op.spelling}({', '.join(args)})"
    return type(kind).__name__


def split(bounds) -> tuple[tuple[pp.ColumnBound, ...], tuple[pp.EqualBound, ...]]:
    """The linear bounds and the equalities of ids among `bounds`, in order."""
    return (tuple(b for b in bounds if isinstance(b, pp.ColumnBound)),
            tuple(b for b in bounds if isinstance(b, pp.EqualBound)))


def bound_parts(linear, equal) -> str:
    """The bounds a loop takes, in words (the forward's and the backward's why): the linear
    ones counted, each equality of ids named."""
    parts = [f"{len(linear)} bound{'s' if len(linear) > 1 else ''} on col"] if linear else []
    parts += [f"{b.row_vector}[row] == {b.col_vector}[col], its columns scanned per tile of "
              "rows" for b in equal]
    return "; ".join(parts)
