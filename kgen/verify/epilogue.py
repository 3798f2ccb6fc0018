"""Verify epilogues: statements, expressions, stores and reductions, and their warnings.

Each statement of a gemm's epilogue is a `Let` (a local, visible only in its own epilogue and
only after it is bound) or a `Store` to an output tensor (the gemm's (M, N) shape), to a vector
or scalar (only a reduction of the matching axis and length), or to the gemm itself when it
feeds a later gemm. Expressions read the accumulator, constants (finite f32) and input
parameters of the right kind and shape; a reduction is only ever the whole right side of a
store. Each expression is bounded in depth and size once locals are substituted, as the
lowering will walk it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .. import ir
from ..diagnostics import (
    DTYPE_NAMES,
    arity_message,
    at_line,
    did_you_mean,
    f32_problem,
    loc_of,
    quote,
    shape_text,
    shown,
)
from ..errors import KgenError, KgenWarning, SourceLoc
from ..ir import Axis, DType, ParamKind, ReduceOp, Role
from ..language import MAX_EXPR_DEPTH, MAX_EXPR_NODES, reduction_name
from .state import KernelState, require_str

__all__ = ["check_epilogue", "expression_extent", "unused_local_warnings", "REDUCTIONS_SUPPORTED"]

# Reductions are checked in full below. This switch is the one place that refuses them, for a
# kgen whose lowering and emitters do not handle ir.Reduce.
REDUCTIONS_SUPPORTED = True


def _operands(node: object) -> tuple:
    if isinstance(node, ir.Call):
        return node.args if isinstance(node.args, tuple) else ()
    if isinstance(node, (ir.Cast, ir.Reduce)):
        return (node.arg,)
    return ()


def expression_extent(expr: object, locals_: dict[str, tuple[int, int]]) -> tuple[int, int]:
    """(depth, size) of `expr` once each local is replaced by its value (`locals_` holds the
    extents of the locals bound so far): the tree that the lowering walks. Iterative, and
    linear in the number of nodes however often the locals are shared."""
    done: dict[int, tuple[int, int]] = {}
    stack: list[tuple[object, bool]] = [(expr, False)]
    while stack:
        node, expanded = stack.pop()
        if id(node) in done:
            continue
        if isinstance(node, ir.LocalRef):
            name = node.name if isinstance(node.name, str) else ""
            done[id(node)] = locals_.get(name, (1, 1))
            continue
        children = _operands(node)
        if children and not expanded:
            stack.append((node, True))
            stack.extend((child, False) for child in children)
            continue
        depth = 1 + max((done[id(c)][0] for c in children), default=0)
        size = min(1 + sum(done[id(c)][1] for c in children), MAX_EXPR_NODES + 1)
        done[id(node)] = (depth, size)
    return done[id(expr)]


@dataclass
class EpilogueScope:
    gemm: ir.Gemm
    shape: tuple  # (M, N) the epilogue works on
    bound: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound so far
    later: dict[str, SourceLoc] = field(default_factory=dict)  # locals bound further down
    self_store: SourceLoc | None = None  # `g0 = ...` in a chained stage's epilogue


def check_epilogue(state: KernelState, g: ir.Gemm, shape: tuple) -> None:
    scope = EpilogueScope(g, shape)
    stmts = g.epilogue.stmts
    if not isinstance(stmts, tuple):
        raise KgenError(g.loc, f"epilogue of gemm '{g.name}' must hold a tuple of statements")
    for stmt in stmts:
        if isinstance(stmt, (ir.Let, ir.Store)):
            what = "a local name" if isinstance(stmt, ir.Let) else "a store target"
            require_str(stmt.name if isinstance(stmt, ir.Let) else stmt.target, stmt.loc, what)
        if isinstance(stmt, ir.Let):
            scope.later.setdefault(stmt.name, stmt.loc)
    extents: dict[str, tuple[int, int]] = {}
    for stmt in stmts:
        if isinstance(stmt, (ir.Let, ir.Store)):
            check_extent(state, stmt, extents)
    for stmt in stmts:
        if isinstance(stmt, ir.Let):
            check_let(state, stmt, scope)
        elif isinstance(stmt, ir.Store):
            check_store(state, stmt, scope)
        else:
            raise KgenError(
                g.loc, f"epilogue statements must be Let or Store, got {shown(stmt)}"
            )
    if g.name in state.consumer_names() and scope.self_store is None:
        feeds = state.consumer_of(g.name)
        raise KgenError(
            g.loc,
            f"gemm '{g.name}' feeds gemm '{feeds.name}' but its epilogue never sets "
            f"'{g.name}' (add e.g. '{g.name} = acc')",
        )
    state.warnings.extend(unused_local_warnings(stmts))


def unused_local_warnings(stmts: tuple) -> list[KgenWarning]:
    """A warning at each local whose value reaches no store, directly or through other locals:
    the lowering inlines locals into the stores' trees, so such a local is never computed, which
    is rarely what its author meant. Takes a verified epilogue (each local is bound once, before
    its uses)."""
    live: set[str] = set()
    users: dict[str, list[str]] = {}  # local -> the locals whose values read it, last first
    for stmt in reversed(stmts):  # a use comes after its local, so one backward pass suffices
        refs = local_refs(stmt.value)
        if isinstance(stmt, ir.Let):
            for name in refs:
                users.setdefault(name, []).append(stmt.name)
            if stmt.name not in live:
                continue
        live |= refs
    found = []
    for stmt in stmts:
        if not isinstance(stmt, ir.Let) or stmt.name in live:
            continue
        readers = users.get(stmt.name)  # all unused too, else this local would be live
        if readers:
            named = ", ".join(f"'{name}'" for name in reversed(readers))  # in source order
            message = f"local '{stmt.name}' is used only by {named}, which no store uses"
        else:
            message = f"local '{stmt.name}' is never used"
        found.append(KgenWarning(loc_of(stmt), message + "; it is not computed"))
    return found


def local_refs(expr: object) -> set[str]:
    """The names of the locals `expr` reads."""
    names: set[str] = set()
    stack = [expr]
    while stack:
        node = stack.pop()
        if isinstance(node, ir.LocalRef):
            names.add(node.name)
        else:
            stack.extend(_operands(node))
    return names


def check_extent(state: KernelState, stmt: ir.Let | ir.Store, extents: dict[str, tuple[int, int]]):
    """The lowering inlines locals: bound the depth (recursion) and the size (a local used
    twice by the next one, and so on, doubles the tree each time) of what it will walk."""
    depth, size = expression_extent(stmt.value, extents)
    if depth > MAX_EXPR_DEPTH:
        raise KgenError(
            stmt.loc,
            f"expression nested too deeply ({depth} levels once locals are substituted; "
            f"at most {MAX_EXPR_DEPTH})",
        )
    if size > MAX_EXPR_NODES:
        raise KgenError(
            stmt.loc,
            f"expression too large once locals are substituted (more than {MAX_EXPR_NODES} "
            "operations, counting a local each time it is used)",
        )
    if isinstance(stmt, ir.Let):
        extents[stmt.name] = (depth, size)


def check_let(state: KernelState, stmt: ir.Let, scope: EpilogueScope) -> None:
    if isinstance(stmt.value, ir.Reduce):
        raise KgenError(
            stmt.value.loc,
            "a reduction must be the whole right side of a store to a vector or scalar",
        )
    check_expr(state, stmt.value, scope, in_reduce=False)
    state.define(stmt.name, "local", stmt.loc)
    scope.bound[stmt.name] = stmt.loc
    state.local_owner[stmt.name] = scope.gemm.name


def check_store(state: KernelState, stmt: ir.Store, scope: EpilogueScope) -> None:
    name, value, g = stmt.target, stmt.value, scope.gemm
    param = state.params.get(name)
    if param is None:
        check_gemm_store(state, stmt, scope)
        return
    kind = param.kind.value
    if param.role is not Role.OUT:
        raise KgenError(stmt.loc, f"cannot store to input {kind} '{name}'")
    if name in state.written:
        raise KgenError(
            stmt.loc,
            f"output '{name}' is written twice (first{at_line(state.written[name])})",
        )

    if param.dtype.fp8:
        check_fp8_output(state, stmt, param, g)
    if param.kind is ParamKind.TENSOR:
        if isinstance(value, ir.Reduce):
            raise KgenError(
                value.loc,
                f"'{name}' is a tensor; a reduction can only be stored to a vector "
                "or a scalar",
            )
        check_expr(state, value, scope, in_reduce=False)
        if param.shape != scope.shape:
            raise KgenError(
                stmt.loc,
                f"tensor '{name}' has shape {shape_text(param.shape)} but gemm '{g.name}' "
                f"produces {shape_text(scope.shape)}",
            )
    else:
        if not isinstance(value, ir.Reduce):
            examples = "rowsum, colmax, ..." if param.kind is ParamKind.VECTOR else (
                "reduce_sum, reduce_max, ..."
            )
            raise KgenError(
                stmt.loc,
                f"'{name}' is a {kind}; only a reduction ({examples}) can be stored to it",
            )
        check_reduce_store(state, param, value, scope)
    state.written[name] = stmt.loc


def check_fp8_output(state: KernelState, stmt: ir.Store, param: ir.Param, g: ir.Gemm) -> None:
    """An FP8 output (f8e4m3, f8e5m2): written by an FP8 gemm's epilogue (sm_90a's wgmma
    kernel), each value rounded once and saturated to the format's finite range (e4m3: 448),
    never added into."""
    a, b = state.params.get(g.a.name), state.params.get(g.b.name)
    if a is None or b is None or not (a.dtype.fp8 and b.dtype.fp8):
        raise KgenError(stmt.loc, f"'{param.name}' is {param.dtype.dsl_name}: an FP8 output is "
                                  f"written by an FP8 gemm's epilogue, and gemm '{g.name}' "
                                  "multiplies 16-bit operands")
    if stmt.accumulate or param.accumulate:
        raise KgenError(stmt.loc, f"'{param.name}' is {param.dtype.dsl_name}: an FP8 output "
                                  "is stored, not added into")


def check_gemm_store(state: KernelState, stmt: ir.Store, scope: EpilogueScope) -> None:
    """`g0 = expr` in g0's own epilogue: the value g0 hands to the gemm it feeds."""
    name, g = stmt.target, scope.gemm
    if name == g.name:
        if name not in state.consumer_names():
            raise KgenError(
                stmt.loc,
                f"gemm '{name}' feeds no later gemm, so its epilogue cannot set '{name}'; "
                "store to an output instead",
            )
        if scope.self_store is not None:
            raise KgenError(
                stmt.loc,
                f"'{name}' is set twice (first{at_line(scope.self_store)})",
            )
        if isinstance(stmt.value, ir.Reduce):
            raise KgenError(
                stmt.value.loc,
                "a reduction must be the whole right side of a store to a vector or scalar",
            )
        check_expr(state, stmt.value, scope, in_reduce=False)
        scope.self_store = stmt.loc
        return
    if any(h.name == name for h in state.kernel.gemms):
        raise KgenError(
            stmt.loc, f"cannot store to gemm '{name}' from the epilogue of gemm '{g.name}'"
        )
    if name in scope.bound or name in state.local_owner:
        raise KgenError(stmt.loc, f"cannot store to local '{name}'; it is not an output")
    raise KgenError(
        stmt.loc,
        f"cannot store to unknown name {quote(name)}{did_you_mean(str(name), state.params)}",
    )


def check_reduce_store(state: KernelState, param: ir.Param, red: ir.Reduce, scope: EpilogueScope):
    name, kind = param.name, param.kind.value
    if not isinstance(red.op, ReduceOp) or not isinstance(red.axis, Axis):
        raise KgenError(red.loc, "a reduction needs a kgen.ir.ReduceOp and a kgen.ir.Axis")
    spelled = reduction_name(red.op, red.axis)
    M, N = scope.shape
    if red.axis is Axis.ALL:
        if param.kind is not ParamKind.SCALAR:
            raise KgenError(
                red.loc,
                f"{spelled} gives one value; '{name}' is a {kind} (store it to a scalar)",
            )
    else:
        if param.kind is not ParamKind.VECTOR:
            raise KgenError(
                red.loc,
                f"{spelled} gives a vector; '{name}' is a {kind} "
                f"(use reduce_{red.op.value} for one value)",
            )
        per, need = ("row", M) if red.axis is Axis.ROW else ("column", N)
        if param.shape[0] != need:
            raise KgenError(
                red.loc,
                f"{spelled} gives one value per {per}, so vector '{name}' needs length "
                f"{need}, but it has length {param.shape[0]}",
            )
    check_expr(state, red.arg, scope, in_reduce=True)
    if not REDUCTIONS_SUPPORTED:
        raise KgenError(red.loc, "reductions are not supported by this kgen version yet")


def check_expr(state: KernelState, e: ir.Expr, scope: EpilogueScope, in_reduce: bool) -> None:
    loc = loc_of(e, scope.gemm.loc)
    if isinstance(e, ir.Acc):
        return
    if isinstance(e, ir.Const):
        if problem := f32_problem(e.value, "constant"):
            raise KgenError(loc, problem)
        return
    if isinstance(e, ir.Call):
        if not isinstance(e.op, ir.Op):
            raise KgenError(loc, f"a call needs a kgen.ir.Op, got {shown(e.op)}")
        spelled = e.op.spelling if e.op.spelling.isidentifier() else f"'{e.op.spelling}'"
        if not isinstance(e.args, tuple) or len(e.args) != e.op.arity:
            got = len(e.args) if isinstance(e.args, (tuple, list)) else shown(e.args)
            raise KgenError(loc, arity_message(spelled, e.op.arity, got))
        for arg in e.args:
            check_expr(state, arg, scope, in_reduce)
        return
    if isinstance(e, ir.Cast):
        if not isinstance(e.dtype, DType):
            raise KgenError(loc, f"unknown dtype {quote(e.dtype)}; expected {DTYPE_NAMES}")
        if e.dtype.fp8:
            raise KgenError(loc, f"cast<{e.dtype.dsl_name}>: FP8 values in an epilogue (FP8 "
                                 "outputs) are not built yet; cast to f16, bf16 or f32")
        check_expr(state, e.arg, scope, in_reduce)
        return
    if isinstance(e, ir.Reduce):
        if in_reduce:
            raise KgenError(loc, "cannot reduce a reduction")
        raise KgenError(
            loc, "a reduction must be the whole right side of a store to a vector or scalar"
        )
    if isinstance(e, ir.LocalRef):
        check_local_ref(state, e, scope)
        return
    if isinstance(e, (ir.ScalarLoad, ir.TensorLoad, ir.VectorLoad)):
        check_load(state, e, scope)
        return
    if isinstance(e, ir.Random):
        raise KgenError(loc, "random(seed, offset) is supported in loop and row kernels only")
    if isinstance(e, ir.Position):
        axis = getattr(e.axis, "value", shown(e.axis))
        raise KgenError(
            loc,
            f"'{axis}' as a value is supported in loop and row kernels only for now; in a "
            f"gemm's epilogue it indexes a vector (bias[{axis}])",
        )
    raise KgenError(loc, f"not an epilogue expression: {shown(e)}")


def check_local_ref(state: KernelState, e: ir.LocalRef, scope: EpilogueScope) -> None:
    name = require_str(e.name, e.loc, "a local name")
    if name in scope.bound:
        return
    if name in scope.later:
        raise KgenError(
            e.loc, f"'{name}' is used before it is defined{at_line(scope.later[name])}"
        )
    if name in state.local_owner:
        raise KgenError(
            e.loc,
            f"'{name}' is a local of gemm '{state.local_owner[name]}'; a local is visible "
            "only in its own epilogue",
        )
    raise KgenError(
        e.loc, f"unknown local {quote(name)}{did_you_mean(str(name), scope.bound)}"
    )


def check_load(state: KernelState, e, scope: EpilogueScope) -> None:
    want = {
        ir.ScalarLoad: ParamKind.SCALAR,
        ir.TensorLoad: ParamKind.TENSOR,
        ir.VectorLoad: ParamKind.VECTOR,
    }[type(e)]
    param = state.params.get(require_str(e.name, e.loc, "a parameter name"))
    if param is None:
        raise KgenError(
            e.loc,
            f"unknown {want.value} {quote(e.name)}{did_you_mean(str(e.name), state.params)}",
        )
    kind = param.kind.value
    if param.kind is not want:
        raise KgenError(e.loc, f"'{e.name}' is a {kind}, not a {want.value}")
    if param.role is Role.OUT:
        raise KgenError(
            e.loc,
            f"cannot read output {kind} '{e.name}'; to reuse a value, bind it to a local "
            "(t = ...) and use that",
        )
    if param.dtype.fp8:
        raise KgenError(e.loc, f"tensor '{e.name}' is {param.dtype.dsl_name}: an FP8 tensor is "
                               "a gemm operand only (an epilogue reads f16, bf16 or f32)")
    M, N = scope.shape
    if isinstance(e, ir.TensorLoad) and param.shape != scope.shape:
        raise KgenError(
            e.loc,
            f"tensor '{e.name}' has shape {shape_text(param.shape)} but gemm "
            f"'{scope.gemm.name}' produces {shape_text(scope.shape)}",
        )
    if isinstance(e, ir.VectorLoad):
        if e.axis not in (Axis.ROW, Axis.COL):
            raise KgenError(
                e.loc, f"vector '{e.name}' must be indexed by row or col, got {shown(e.axis)}"
            )
        need = M if e.axis is Axis.ROW else N
        if param.shape[0] != need:
            raise KgenError(
                e.loc,
                f"vector '{e.name}' has length {param.shape[0]} but "
                f"{e.name}[{e.axis.value}] needs length {need}",
            )
