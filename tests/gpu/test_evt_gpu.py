"""On a GPU: every epilogue op, built through the Python IR, against the float64 reference at
ragged sizes; and the three gaps users report in other tools (a direct accumulator store, a
value used twice, unary minus)."""
from __future__ import annotations

import json

import pytest

from kgen import ir

from tests.kernels import P, S, T, V, gemm_kernel

pytestmark = pytest.mark.gpu

SIZES = [(130, 258, 72), (1000, 1000, 40)]
acc = ir.Acc()
EXTRA = (
    P("C", T, ir.DType.F16, ("M", "N")),
    P("bias", V, ir.DType.F32, ("N",)),
    P("rs", V, ir.DType.BF16, ("M",)),
    P("alpha", S, ir.DType.F32, default=0.75),
)


def call(op, *args):
    return ir.Call(op, tuple(args))


POSITIVE = call(ir.Op.ADD, call(ir.Op.ABS, acc), ir.Const(0.5))
ARGS = {
    1: lambda op: (POSITIVE,) if op in (ir.Op.LOG, ir.Op.SQRT, ir.Op.RSQRT) else (acc,),
    2: lambda op: (acc, ir.TensorLoad("C")) if op is not ir.Op.DIV
    else (acc, call(ir.Op.ADD, call(ir.Op.ABS, ir.TensorLoad("C")), ir.Const(1.0))),
    3: lambda op: (call(ir.Op.GT, acc, ir.Const(0.0)), acc, ir.VectorLoad("bias", ir.Axis.COL))
    if op is ir.Op.WHERE else (acc, ir.Const(-0.5), ir.ScalarLoad("alpha")),
}


def _run(kernel, mnk):
    from kgen.api import build
    from kgen.harness.run import run

    built = build(kernel)
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return report


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("op", list(ir.Op), ids=lambda o: o.name.lower())
def test_every_op(op, mnk):
    value = call(op, *ARGS[op.arity](op))
    # mix in the other loads so every op sees scalars, both broadcasts and an aux tensor
    value = call(ir.Op.ADD, value, call(ir.Op.MUL, ir.ScalarLoad("alpha"),
                                        ir.VectorLoad("rs", ir.Axis.ROW)))
    _run(gemm_kernel((ir.Store("D", value),), extra=EXTRA, name=f"op_{op.name.lower()}"), mnk)


@pytest.mark.parametrize("dtype", [ir.DType.F16, ir.DType.BF16])
def test_accumulator_stored_directly(dtype):
    _run(gemm_kernel((ir.Store("D", acc),), dtype=dtype), (1000, 1000, 40))


def test_value_used_twice_and_unary_minus():
    extra = (P("E", T, ir.DType.F32, ("M", "N"), ir.Layout.COL, ir.Role.OUT),)
    t = call(ir.Op.EXP, call(ir.Op.NEG, call(ir.Op.ABS, acc)))
    stmts = (ir.Let("t", t), ir.Store("D", call(ir.Op.MUL, ir.LocalRef("t"), ir.LocalRef("t"))),
             ir.Store("E", call(ir.Op.NEG, ir.LocalRef("t"))))
    _run(gemm_kernel(stmts, extra=extra), (130, 258, 72))


@pytest.mark.parametrize("cast", [ir.DType.F16, ir.DType.BF16, ir.DType.F32])
def test_casts(cast):
    extra = (P("E", T, ir.DType.F32, ("M", "N"), role=ir.Role.OUT),)
    stmts = (ir.Store("D", acc), ir.Store("E", ir.Cast(cast, call(ir.Op.MUL, acc, ir.Const(3.0)))))
    _run(gemm_kernel(stmts, extra=extra), (130, 258, 72))


@pytest.mark.parametrize("compute", [ir.DType.F16, ir.DType.BF16])
def test_narrow_compute_types(compute):
    import dataclasses

    value = call(ir.Op.ADD, call(ir.Op.SILU, call(ir.Op.MUL, ir.ScalarLoad("alpha"), acc)),
                 ir.VectorLoad("bias", ir.Axis.COL))
    kernel = dataclasses.replace(gemm_kernel((ir.Store("D", value),), extra=EXTRA),
                                 compute_dtype=compute)
    _run(kernel, (130, 258, 72))
