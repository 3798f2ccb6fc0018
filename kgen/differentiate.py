"""The derivative of a kgen expression with respect to one of its locals: how the attention
backward (kgen/attention_grad.py) differentiates a forward's `score_mod`, so that a user writes
the forward's terms once.

    d = derivative(expr, "score")        # an ir.Expr: d expr / d score
    text = dsl_text(d)                   # the same expression as DSL text

The rules are the chain rule over the element-wise ops (ir.Op), each written as a kgen
expression of the same leaves, simplified where a factor is a constant 0 or 1 (so a mod that
ignores the score differentiates to 0, and `score + bias` to 1). The leaves other than the
local (constants, scalars, vectors, positions, sizes, tensors, random values) have derivative
0. Piecewise ops follow torch's autograd: `where(c, a, b)` takes a's derivative where c holds
(c's own is 0); min, max pick the argument they return (the first on a tie), relu and clamp
pass the derivative inside their range (at its ends too, as torch's clamp does), abs has 0 at
0, comparisons have 0. A cast's derivative is its argument's (rounding counts as the
identity, as torch's `.to()` backward). An op with no derivative here (erf-based gelu, a row
reduction) is a KgenError at its own location, naming it.
"""
from __future__ import annotations

import math

from . import ir
from .errors import KgenError

__all__ = ["derivative", "dsl_text", "transposed"]

_ZERO, _ONE = 0.0, 1.0


def derivative(expr: ir.Expr, wrt: str) -> ir.Expr:
    """d expr / d wrt, where `wrt` is a local (ir.LocalRef) of the expression."""
    return _d(expr, wrt)


def _d(e: ir.Expr, wrt: str) -> ir.Expr:
    if isinstance(e, ir.LocalRef):
        return _const(_ONE if e.name == wrt else _ZERO)
    if isinstance(e, (ir.Const, ir.ScalarLoad, ir.VectorLoad, ir.TensorLoad, ir.Position,
                      ir.Extent, ir.Random)):
        return _const(_ZERO)
    if isinstance(e, ir.Cast):
        return _d(e.arg, wrt)
    if isinstance(e, ir.Call):
        return _call(e, wrt)
    what = "a row reduction" if isinstance(e, ir.Reduce) else type(e).__name__
    raise KgenError(e.loc, f"score_mod's derivative: {what} is not differentiable by kgen "
                    "(a score_mod is an element-wise expression of the score)")


def _call(e: ir.Call, wrt: str) -> ir.Expr:
    op, args = e.op, e.args
    d = [_d(a, wrt) for a in args]
    if op in _COMPARE:
        return _const(_ZERO)
    if op is ir.Op.ADD:
        return add(d[0], d[1])
    if op is ir.Op.SUB:
        return sub(d[0], d[1])
    if op is ir.Op.NEG:
        return neg(d[0])
    if op is ir.Op.MUL:
        return add(mul(d[0], args[1]), mul(args[0], d[1]))
    if op is ir.Op.DIV:  # a / b: da / b - a db / b^2
        return sub(div(d[0], args[1]), div(mul(args[0], d[1]), mul(args[1], args[1])))
    if op is ir.Op.WHERE:
        return where(args[0], d[1], d[2])
    if op is ir.Op.MIN:
        return where(_call2(ir.Op.LE, args[0], args[1]), d[0], d[1])
    if op is ir.Op.MAX:
        return where(_call2(ir.Op.GE, args[0], args[1]), d[0], d[1])
    if op in (ir.Op.LEAKY_RELU, ir.Op.CLAMP):
        _constant_in(e, wrt, args[1:])
    x, dx = args[0], d[0]
    if _is_zero(dx):
        return _const(_ZERO)
    if op is ir.Op.ABS:
        return where(_call2(ir.Op.GT, x, _const(_ZERO)), dx,
                     where(_call2(ir.Op.LT, x, _const(_ZERO)), neg(dx), _const(_ZERO)))
    if op is ir.Op.EXP:
        return mul(e, dx)
    if op is ir.Op.LOG:
        return div(dx, x)
    if op is ir.Op.SQRT:  # 1 / (2 sqrt(x))
        return div(dx, mul(_const(2.0), e))
    if op is ir.Op.RSQRT:  # -rsqrt(x) / (2 x)
        return neg(div(mul(e, dx), mul(_const(2.0), x)))
    if op is ir.Op.TANH:
        return mul(sub(_const(_ONE), mul(e, e)), dx)
    if op is ir.Op.SIGMOID:
        return mul(mul(e, sub(_const(_ONE), e)), dx)
    if op is ir.Op.SILU:  # sigmoid(x) (1 + x (1 - sigmoid(x)))
        s = ir.Call(ir.Op.SIGMOID, (x,), e.loc)
        return mul(mul(s, add(_const(_ONE), mul(x, sub(_const(_ONE), s)))), dx)
    if op is ir.Op.RELU:
        return where(_call2(ir.Op.GT, x, _const(_ZERO)), dx, _const(_ZERO))
    if op is ir.Op.LEAKY_RELU:
        return where(_call2(ir.Op.GT, x, _const(_ZERO)), dx, mul(args[1], dx))
    if op is ir.Op.CLAMP:
        inside = mul(_call2(ir.Op.GE, x, args[1]), _call2(ir.Op.LE, x, args[2]))
        return where(inside, dx, _const(_ZERO))
    if op is ir.Op.HARDSWISH:  # x relu6(x + 3) / 6: 0 below -3, 1 above 3, (2x + 3) / 6 between
        between = div(add(mul(_const(2.0), x), _const(3.0)), _const(6.0))
        return mul(where(_call2(ir.Op.LT, x, _const(-3.0)), _const(_ZERO),
                         where(_call2(ir.Op.GT, x, _const(3.0)), _const(_ONE), between)), dx)
    raise KgenError(e.loc, f"score_mod's derivative: {op.spelling}() is not differentiable by "
                    "kgen yet (differentiable: + - * /, neg, min, max, abs, exp, log, sqrt, "
                    "rsqrt, tanh, sigmoid, silu, relu, leaky_relu, clamp, hardswish, where, "
                    "comparisons, casts)")


_COMPARE = frozenset({ir.Op.LT, ir.Op.LE, ir.Op.GT, ir.Op.GE, ir.Op.EQ, ir.Op.NE})


def _constant_in(e: ir.Call, wrt: str, args) -> None:
    """leaky_relu's slope and clamp's bounds: constant in `wrt` (their derivative is not
    written)."""
    for a in args:
        if not _is_zero(_d(a, wrt)):
            raise KgenError(getattr(a, "loc", e.loc), f"score_mod's derivative: "
                            f"{e.op.spelling}()'s {'slope' if e.op is ir.Op.LEAKY_RELU else 'bounds'}"
                            f" must not depend on '{wrt}' (kgen does not differentiate them)")


# ---------------------------------------------------------------------------------------------
# Building, simplified where a constant 0 or 1 decides


def _const(value: float) -> ir.Const:
    return ir.Const(float(value))


def _value(e: ir.Expr) -> float | None:
    return float(e.value) if isinstance(e, ir.Const) else None


def _is_zero(e: ir.Expr) -> bool:
    return _value(e) == 0.0


def _call2(op: ir.Op, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    return ir.Call(op, (a, b))


def add(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is_zero(a):
        return b
    if _is_zero(b):
        return a
    if _value(a) is not None and _value(b) is not None:
        return _const(_value(a) + _value(b))
    return _call2(ir.Op.ADD, a, b)


def sub(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is_zero(b):
        return a
    if _is_zero(a):
        return neg(b)
    if _value(a) is not None and _value(b) is not None:
        return _const(_value(a) - _value(b))
    return _call2(ir.Op.SUB, a, b)


def neg(a: ir.Expr) -> ir.Expr:
    if _value(a) is not None:
        return _const(-_value(a))
    if isinstance(a, ir.Call) and a.op is ir.Op.NEG:
        return a.args[0]
    return ir.Call(ir.Op.NEG, (a,))


def mul(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    # 0 times anything is 0 here: a derivative's factor is finite where it is used (the
    # backward selects it only where the forward's score is finite)
    if _is_zero(a) or _is_zero(b):
        return _const(_ZERO)
    if _value(a) == 1.0:
        return b
    if _value(b) == 1.0:
        return a
    if _value(a) is not None and _value(b) is not None:
        return _const(_value(a) * _value(b))
    return _cancelled(a, b) or _call2(ir.Op.MUL, a, b)


def _cancelled(a: ir.Expr, b: ir.Expr) -> ir.Expr | None:
    """a * b with a factor of the numerator and the same of the denominator cancelled
    (`cap * (x * (1 / cap))` is x: softcap's derivative), or None when none cancels."""
    num_a, den_a = _factors(a)
    num_b, den_b = _factors(b)
    num, den = num_a + num_b, den_a + den_b
    keys = [_dsl_text(d) for d in den]
    kept: list[ir.Expr] = []
    for factor in num:
        key = _dsl_text(factor)
        if key in keys:
            index = keys.index(key)
            del keys[index], den[index]
        else:
            kept.append(factor)
    if len(kept) == len(num):
        return None
    product = _const(_ONE)
    for factor in kept:
        product = mul(product, factor)
    for factor in den:
        product = div(product, factor)
    return product


def _factors(e: ir.Expr) -> tuple[list[ir.Expr], list[ir.Expr]]:
    """The factors of a product's numerator and denominator (`a * (b / c)`: [a, b], [c])."""
    if isinstance(e, ir.Call) and e.op is ir.Op.MUL:
        (na, da), (nb, db) = _factors(e.args[0]), _factors(e.args[1])
        return na + nb, da + db
    if isinstance(e, ir.Call) and e.op is ir.Op.DIV:
        (na, da), (nb, db) = _factors(e.args[0]), _factors(e.args[1])
        return na + db, da + nb
    if _value(e) == 1.0:
        return [], []
    return [e], []


def div(a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if _is_zero(a):
        return _const(_ZERO)
    if _value(b) == 1.0:
        return a
    if _value(a) is not None and _value(b) not in (None, 0.0):
        return _const(_value(a) / _value(b))
    return _call2(ir.Op.DIV, a, b)


def where(c: ir.Expr, a: ir.Expr, b: ir.Expr) -> ir.Expr:
    if a == b:
        return a
    if _value(c) is not None:
        return a if _value(c) != 0.0 else b
    return ir.Call(ir.Op.WHERE, (c, a, b))


# ---------------------------------------------------------------------------------------------
# The backward's orientation, and DSL text


def transposed(e: ir.Expr) -> ir.Expr:
    """The expression with `row` and `col` swapped (positions and the vectors' indices): the
    forward's (query row, key col) read in the backward, whose rows are keys and columns
    queries."""
    swap = {ir.Axis.ROW: ir.Axis.COL, ir.Axis.COL: ir.Axis.ROW}
    if isinstance(e, ir.Position):
        return ir.Position(swap.get(e.axis, e.axis), e.loc)
    if isinstance(e, ir.VectorLoad):
        return ir.VectorLoad(e.name, swap.get(e.axis, e.axis), e.loc)
    if isinstance(e, ir.Call):
        return ir.Call(e.op, tuple(transposed(a) for a in e.args), e.loc)
    if isinstance(e, ir.Cast):
        return ir.Cast(e.dtype, transposed(e.arg), e.loc)
    return e


def dsl_text(e: ir.Expr, bare: bool = False) -> str:
    """The expression as DSL text the parser reads back to it (every operation parenthesized,
    but the outermost with `bare`; constants exact)."""
    text = _dsl_text(e)
    if bare and isinstance(e, ir.Call) and text.startswith("("):
        return text[1:-1]
    return text


def _dsl_text(e: ir.Expr) -> str:
    if isinstance(e, ir.Const):
        value = float(e.value)
        if math.isinf(value):
            return "-inf" if value < 0 else "inf"
        text = repr(value)
        return f"({text})" if value < 0 else text
    if isinstance(e, (ir.ScalarLoad, ir.TensorLoad, ir.LocalRef)):
        return e.name
    if isinstance(e, ir.VectorLoad):
        return f"{e.name}[{e.axis.value}]"
    if isinstance(e, ir.Position):
        return e.axis.value
    if isinstance(e, ir.Extent):
        return e.dim
    if isinstance(e, ir.Random):
        return f"random{'_t' if e.transposed else ''}({e.seed}, {e.offset})"
    if isinstance(e, ir.Cast):
        return f"cast<{e.dtype.dsl_name}>({_dsl_text(e.arg)})"
    if isinstance(e, ir.Call) and e.op is ir.Op.NEG:
        return f"(-{_dsl_text(e.args[0])})"
    if isinstance(e, ir.Call) and (e.op in _COMPARE or not e.op.spelling.isidentifier()):
        return f"({_dsl_text(e.args[0])} {e.op.spelling} {_dsl_text(e.args[1])})"
    if isinstance(e, ir.Call):
        return f"{e.op.spelling}({', '.join(_dsl_text(a) for a in e.args)})"
    raise KgenError(getattr(e, "loc", None) or ir.Const(0).loc,
                    f"{type(e).__name__} has no DSL text here")
