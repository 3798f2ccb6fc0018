"""Whether a block a DAG loop's mask zeroes in full adds nothing (kgen/lower/loop_dag.py's
skipped blocks): the values every gemm multiplies, and every loop-row epilogue's adds, traced
abstractly as 0, finite or unknown on such a block."""
from __future__ import annotations

import math

from .. import ir
from ..plan import epilogue as dag
from ..plan import loop_dag as ld
from ..plan import program as pp

_ZERO = 0.0
_FINITE = "finite"  # finite, not known when compiling


def zero_on_masked(body: pp.Section, gemms: list[ld.DagGemm], mask: int) -> str | None:
    """Why a block where value `mask` is 0 everywhere would change the outputs, or None: every
    handed-on and staged value must be 0 (the accumulators gain 0, the loop-row tiles are 0)
    and every loop-row epilogue must add 0 for a zero tile. Inputs are taken to be finite."""
    known: dict[int, object] = {}

    def get(values, index: int, zero_acc: bool, memo: dict):
        if index not in memo:
            memo[index] = _abstract(values, values[index], mask if values is body.values
                                    else None, zero_acc, lambda i: get(values, i, zero_acc,
                                                                       memo))
        return memo[index]

    for stmt in body.statements:
        if isinstance(stmt, (ld.HandTile, ld.StageTile)):
            if get(body.values, stmt.value, False, known) != _ZERO:
                return "a value a gemm multiplies is not 0"
    for g in gemms:
        if g.epilogue is None:
            continue
        memo: dict[int, object] = {}
        for stmt in g.epilogue.statements:
            if isinstance(stmt, ld.AddTile) and get(g.epilogue.values, stmt.value, True,
                                                    memo) != _ZERO:
                return f"gemm '{g.name}''s epilogue adds a value other than 0"
    return None


def _abstract(values, value: pp.Value, mask: int | None, zero_acc: bool, get):
    kind = value.kind
    if value.id == mask:
        return _ZERO
    if isinstance(kind, dag.Constant):
        return float(kind.value) if math.isfinite(kind.value) else None
    if isinstance(kind, ld.GemmResult):
        return _ZERO if zero_acc else _FINITE
    if isinstance(kind, (dag.ScalarArg, dag.VectorLoad, dag.TensorLoad, pp.PositionValue,
                         pp.ExtentValue, pp.RandomValue)):
        return _FINITE
    if isinstance(kind, dag.Cast):
        arg = get(kind.arg)
        return arg if arg in (_ZERO, _FINITE) else None
    if not isinstance(kind, dag.Apply):
        return None
    args = [get(a) for a in kind.args]
    if kind.op is ir.Op.MUL and _ZERO in args and all(a is not None for a in args):
        return _ZERO  # 0 times a finite value
    if kind.op in (ir.Op.ADD, ir.Op.SUB) and all(a == _ZERO for a in args):
        return _ZERO
    if kind.op is ir.Op.NEG and args[0] == _ZERO:
        return _ZERO
    if kind.op is ir.Op.WHERE and args[1] == _ZERO and args[2] == _ZERO:
        return _ZERO
    if (kind.op is ir.Op.WHERE and mask is not None and args[2] == _ZERO
            and kind.args[0] == values[mask].kind.args[0]):
        return _ZERO  # the mask's own predicate, false on the block: `dst = where(P, .., 0)`
    if kind.op in (ir.Op.ADD, ir.Op.SUB, ir.Op.MUL, ir.Op.NEG, ir.Op.WHERE, ir.Op.MIN,
                   ir.Op.MAX, ir.Op.ABS) and all(a is not None for a in args):
        return _FINITE
    if kind.op in (ir.Op.LT, ir.Op.LE, ir.Op.GT, ir.Op.GE, ir.Op.EQ, ir.Op.NE):
        return _FINITE  # 0 or 1, whatever the arguments (NaN compares false)
    return None
