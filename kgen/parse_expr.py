"""Epilogue expressions: the transformer rules that turn them into resolvers, and the scope that
resolves them.

A name in an epilogue can refer to a parameter, a local bound earlier, or nothing valid (a gemm,
a dimension, a function used as a value, a local of another epilogue, a local bound further down);
which it is becomes known only once the whole kernel is read. So each expression rule returns a
`Resolver`, a function of the `Scope`, and kgen/parse_tree.py calls it per epilogue. The unknown-
name messages ("'t' is used before it is defined at line 9", did-you-mean) are worded here.

`ExpressionRules` is also the transformer's base: the one place a Lark position becomes a
SourceLoc (`_loc`), and dtype names.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from lark import Token, Transformer, v_args

from . import ir
from .diagnostics import (DTYPE_NAMES, arity_message, at_line, did_you_mean, loop_row_message,
                          number_text, quote)
from .errors import KgenError, SourceLoc
from .ir import Axis, DType, Op, ParamKind
from .language import F32_MAX, REDUCTIONS


@dataclass
class Scope:
    """What a name in an epilogue can refer to, while one epilogue is being resolved."""

    params: dict[str, ir.Param]
    gemms: set[str]
    dims: set[str]
    other_locals: dict[str, str]  # local -> its gemm, from earlier epilogues
    bound: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound so far
    later: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound further down
    # a loop's carries and accumulators (also in `bound`): `name = expr` updates them
    carried: set[str] = field(default_factory=set)
    # in a loop: after `s = expr` in gemm s's epilogue, `s` reads that value (rowsum(s))
    stores_readable: bool = False
    # in a tile program's epilogues: a dimension's name is its size, as a value (ir.Extent)
    sizes: bool = False
    # a loop's loop-row gemms (`dq = ds^T @ K`) -> (A, B): read by nothing but their `+=` store
    loop_rows: dict[str, tuple[str, str]] = field(default_factory=dict)
    loop_locals: set[str] = field(default_factory=set)  # the loop's values, after the loop

    def unknown(self, name: str, loc: SourceLoc) -> KgenError:
        """The error for a name that is not a value here, saying what it is if anything."""
        if name in self.loop_rows:
            return KgenError(loc, loop_row_message(name, *self.loop_rows[name]))
        if name in self.later:
            line = at_line(self.later[name])
            return KgenError(loc, f"'{name}' is used before it is defined{line}")
        if name in self.other_locals and name in self.loop_locals:
            return KgenError(loc, f"'{name}' is a value of gemm '{self.other_locals[name]}' in "
                                  "the loop; after it, read the accumulators and carries")
        if name in self.other_locals:
            return KgenError(
                loc,
                f"'{name}' is a local of gemm '{self.other_locals[name]}'; a local is visible "
                "only in its own epilogue",
            )
        if name in self.gemms and self.stores_readable:
            return KgenError(
                loc, f"'{name}' is read before gemm '{name}' sets it in its epilogue "
                     f"('{name} = ...')"
            )
        if name in self.gemms:
            return KgenError(
                loc, f"'{name}' is a gemm; its output can only be the A operand of a later gemm"
            )
        if name in self.dims:
            return KgenError(loc, f"'{name}' is a dimension; sizes cannot be used in expressions")
        if name in ir.FUNCTIONS or name in REDUCTIONS or name in (RANDOM, RANDOM_T):
            return KgenError(loc, f"'{name}' is a function; call it as {name}(...)")
        if name in ("row", "col"):
            return KgenError(loc, f"'{name}' can only be an index, as in bias[{name}]")
        candidates = ["acc", *self.params, *self.bound]
        return KgenError(loc, f"unknown name {quote(name)}{did_you_mean(name, candidates)}")


Resolver = Callable[[Scope], ir.Expr]


@dataclass(frozen=True)
class _Literal:
    """A number literal: a resolver like any other, which unary minus folds into."""

    value: float
    text: str
    loc: SourceLoc

    def __call__(self, scope: Scope) -> ir.Expr:
        if not math.isfinite(self.value) or abs(self.value) > F32_MAX:
            raise KgenError(self.loc, f"number {number_text(self.text)} does not fit in f32")
        return ir.Const(self.value, self.loc)


# `row` and `col` as values (when no parameter or local has the name): the global indices;
# `batch` and `head`, the (batch, query head) a tile program's instance computes.
_POSITIONS = {"row": Axis.ROW, "col": Axis.COL, "batch": Axis.BATCH, "head": Axis.HEAD}


@dataclass(frozen=True)
class _Infinity:
    """`inf` as a value, which unary minus folds into: `-inf` is the one constant Const(-inf),
    not neg(inf). A parameter or local named `inf` wins, as names did before `inf` was a
    value; then `-inf` is neg of it, at `inner`'s place."""

    loc: SourceLoc
    negative: bool = False
    inner: "_Infinity | None" = None

    def __call__(self, scope: Scope) -> ir.Expr:
        if "inf" in scope.bound or "inf" in scope.params:
            if self.inner is None:
                return _name_value("inf", self.loc, scope)
            return ir.Call(Op.NEG, (self.inner(scope),), self.loc)
        return ir.Const(-math.inf if self.negative else math.inf, self.loc)


def _name_value(name: str, loc: SourceLoc, scope: Scope) -> ir.Expr:
    """A name as a value: a local (or a carry), a parameter, `row`/`col`, or an error."""
    if name in scope.bound:
        return ir.LocalRef(name, loc)
    param = scope.params.get(name)
    if param is None and name in _POSITIONS:
        return ir.Position(_POSITIONS[name], loc)
    if param is None and scope.sizes and name in scope.dims:
        return ir.Extent(name, loc)
    if param is None:
        raise scope.unknown(name, loc)
    if param.kind is ParamKind.SCALAR:
        return ir.ScalarLoad(name, loc)
    if param.kind is ParamKind.TENSOR:
        return ir.TensorLoad(name, loc)
    raise KgenError(loc, f"vector '{name}' needs an index: {name}[row] or {name}[col]")


RANDOM = "random"  # random(seed, offset): ir.Random
RANDOM_T = "random_t"  # random_t(seed, offset): ir.Random counted at (col, row)


def _random(args: list, scope: Scope, loc: SourceLoc, transposed: bool = False) -> ir.Expr:
    """random(seed, offset): both arguments scalars named as they are (verify checks u64)."""
    if len(args) != 2:
        raise KgenError(loc, arity_message(RANDOM_T if transposed else RANDOM, 2, len(args)))
    names = []
    for arg in args:
        value = arg(scope)
        if not isinstance(value, ir.ScalarLoad):
            raise KgenError(getattr(value, "loc", loc), "random(seed, offset) takes two u64 "
                                                        "scalars by name")
        names.append(value.name)
    return ir.Random(names[0], names[1], loc, transposed)


def _binary(op: Op):
    def rule(self, meta, children):
        left, right = children
        loc = self._loc(meta)
        return lambda scope: ir.Call(op, (left(scope), right(scope)), loc)

    return rule


# ---------------------------------------------------------------------------------------------
# The rules


@v_args(meta=True)
class ExpressionRules(Transformer):
    """Epilogue expression rules, each returning a Resolver; the declarations subclass it."""

    def __init__(self, file: str):
        super().__init__(visit_tokens=False)
        self.file = file

    def _loc(self, node) -> SourceLoc:
        """The one place a Lark position (a rule's meta or a token) becomes a SourceLoc."""
        line = getattr(node, "line", None)
        if line is None or getattr(node, "empty", False):
            return SourceLoc(self.file, 0, 0, 0, 0)
        return SourceLoc(self.file, line, node.column, node.end_line, node.end_column)

    def _dtype(self, token: Token) -> DType:
        dtype = DType.from_name(str(token))
        if dtype is None:
            raise KgenError(
                self._loc(token), f"unknown dtype {quote(token)}; expected {DTYPE_NAMES}"
            )
        return dtype

    # -- expressions: each returns a Resolver ----------------------------------------------------

    lt = _binary(Op.LT)
    le = _binary(Op.LE)
    gt = _binary(Op.GT)
    ge = _binary(Op.GE)
    eq = _binary(Op.EQ)
    ne = _binary(Op.NE)
    add = _binary(Op.ADD)
    sub = _binary(Op.SUB)
    mul = _binary(Op.MUL)
    div = _binary(Op.DIV)

    def neg(self, meta, children):
        (arg,) = children
        loc = self._loc(meta)
        if isinstance(arg, _Literal):  # -2 is the constant -2, not neg(2)
            return _Literal(-arg.value, "-" + arg.text, loc)
        if isinstance(arg, _Infinity):  # -inf is the constant -inf too
            return _Infinity(loc, negative=not arg.negative, inner=arg)
        return lambda scope: ir.Call(Op.NEG, (arg(scope),), loc)

    def number(self, meta, children):
        (token,) = children
        return _Literal(float(token), str(token), self._loc(meta))

    def acc(self, meta, children):
        loc = self._loc(meta)
        return lambda scope: ir.Acc(loc)

    def name(self, meta, children):
        (token,) = children
        name, loc = str(token), self._loc(meta)
        if name == "inf":
            return _Infinity(loc)
        return lambda scope: _name_value(name, loc, scope)

    def axis(self, meta, children):
        return Axis(str(children[0]))

    def index(self, meta, children):
        token, axis = children
        name, loc = str(token), self._loc(meta)

        def resolve(scope: Scope) -> ir.Expr:
            param = scope.params.get(name)
            if param is not None and param.kind is ParamKind.VECTOR:
                return ir.VectorLoad(name, axis, loc)
            if param is not None:
                raise KgenError(
                    self._loc(token),
                    f"'{name}' is a {param.kind.value}; only vectors take an index",
                )
            if name in scope.bound:
                raise KgenError(
                    self._loc(token), f"'{name}' is a local; only vectors take an index"
                )
            raise scope.unknown(name, self._loc(token))

        return resolve

    def call(self, meta, children):
        token, *args = children
        name, loc, name_loc = str(token), self._loc(meta), self._loc(token)

        def resolve(scope: Scope) -> ir.Expr:
            if name in (RANDOM, RANDOM_T):
                return _random(args, scope, loc, name == RANDOM_T)
            if name in ir.FUNCTIONS:
                op = ir.FUNCTIONS[name]
                if len(args) != op.arity:
                    raise KgenError(loc, arity_message(name, op.arity, len(args)))
                return ir.Call(op, tuple(arg(scope) for arg in args), loc)
            if name in REDUCTIONS:
                if len(args) != 1:
                    raise KgenError(loc, arity_message(name, 1, len(args)))
                op, axis = REDUCTIONS[name]
                return ir.Reduce(op, axis, args[0](scope), loc)
            param = scope.params.get(name)
            if param is not None:
                raise KgenError(
                    name_loc, f"'{name}' is a {param.kind.value}, not a function"
                )
            if name in scope.bound:
                raise KgenError(name_loc, f"'{name}' is a local, not a function")
            functions = [*ir.FUNCTIONS, *REDUCTIONS, RANDOM, RANDOM_T]
            raise KgenError(
                name_loc, f"unknown function {quote(name)}{did_you_mean(name, functions)}"
            )

        return resolve

    def cast(self, meta, children):
        dtype_token, arg = children
        loc = self._loc(meta)

        def resolve(scope: Scope) -> ir.Expr:
            return ir.Cast(self._dtype(dtype_token), arg(scope), loc)

        return resolve
