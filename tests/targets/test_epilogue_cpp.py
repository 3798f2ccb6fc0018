"""The epilogue DAG rendered as C++: value names, loads, conversions, stores and literals."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir, plan
from kgen.enums import Axis, DType, Layout, Op
from kgen.lower import lower
from kgen.targets.common import epilogue_cpp
from kgen.targets.common.epilogue_cpp import EpilogueLines, float_literal, render

from tests.kernels import P, S, T, V, gemm_kernel

acc = ir.Acc()


def call(op, *args):
    return ir.Call(op, tuple(args))


def lines_of(kernel) -> tuple[EpilogueLines, str]:
    code = render(lower(kernel).gemms[0].epilogue)
    return code, "\n".join(code.loads + code.compute + code.stores)


def dag(*kinds_uniform, effects=(), packed=None) -> plan.EpilogueDag:
    nodes = tuple(plan.EpilogueNode(i, k, u) for i, (k, u) in enumerate(kinds_uniform))
    return plan.EpilogueDag(nodes, tuple(effects), packed_store=packed)


def test_accumulator_stored_directly():
    code, _ = lines_of(gemm_kernel((ir.Store("D", acc),)))
    assert code.loads == code.compute == ()
    assert code.stores == (
        "*reinterpret_cast<__half2*>(p.D + row * p.ld_D + col) = __floats2half2_rn(acc_0, acc_1);",
    )
    assert code.packed == ("__half2", "__floats2half2_rn(acc_0, acc_1)")


def test_value_used_twice_is_computed_once():
    e = call(Op.EXP, acc)
    _, text = lines_of(gemm_kernel((ir.Store("D", call(Op.ADD, e, e)),)))
    assert text.count("expf(") == 2  # once per element, not once per use


def test_unary_minus_and_negative_literals():
    _, text = lines_of(gemm_kernel((ir.Store("D", call(Op.NEG, acc)),)))
    assert "= -acc_0;" in text and "= -acc_1;" in text
    code = render(dag((plan.Accumulator(), False), (plan.Constant(-2.0), True),
                      (plan.Apply(Op.MUL, (0, 1)), False)))
    assert code.compute == ("const float v1_0 = acc_0 * (-2.0f);",
                            "const float v1_1 = acc_1 * (-2.0f);")


def test_uniform_values_are_computed_once_per_pair():
    extra = (P("alpha", S, DType.F32, default=2.0), P("scale", V, DType.F32, ("M",)))
    e = call(Op.MUL, call(Op.MUL, ir.ScalarLoad("alpha"), ir.VectorLoad("scale", Axis.ROW)), acc)
    code, _ = lines_of(gemm_kernel((ir.Store("D", e),), extra=extra))
    assert code.loads == ("const float v1 = p.alpha;", "const float v2 = p.scale[row];")
    assert "const float v3 = v1 * v2;" in code.compute  # no per-element copy
    assert "const float v4_0 = v3 * acc_0;" in code.compute


def test_pair_loads_and_conversions():
    extra = (P("C", T, DType.BF16, ("M", "N")), P("bias", V, DType.F32, ("N",)),
             P("E", T, DType.F32, ("M", "N"), Layout.COL, ir.Role.OUT))
    e = call(Op.ADD, ir.TensorLoad("C"), ir.VectorLoad("bias", Axis.COL))
    code, text = lines_of(gemm_kernel((ir.Store("D", e), ir.Store("E", e)), extra=extra))
    assert "const __nv_bfloat162 v1 = *reinterpret_cast<const __nv_bfloat162*>(p.C + row * p.ld_C + col);" in code.loads
    assert "const float v1_1 = __high2float(v1);" in code.loads
    assert "const float2 v2 = *reinterpret_cast<const float2*>(p.bias + col);" in code.loads
    assert "const float v2_0 = v2.x;" in code.loads
    assert "p.E[(col + 0) * p.ld_E + row] = v3_0;" in code.stores
    assert text.count("v1_0 + v2_0") == 1  # shared by both stores
    assert code.packed is None


def test_column_major_loads_and_stores_per_element():
    code = render(dag((plan.TensorLoad("C", DType.F16, Layout.COL), False),
                      effects=[plan.StoreEffect("E", 0, DType.BF16, Layout.COL)]))
    assert code.loads == ("const float v1_0 = __half2float(p.C[(col + 0) * p.ld_C + row]);",
                          "const float v1_1 = __half2float(p.C[(col + 1) * p.ld_C + row]);")
    assert code.stores == ("p.E[(col + 0) * p.ld_E + row] = __float2bfloat16_rn(v1_0);",
                           "p.E[(col + 1) * p.ld_E + row] = __float2bfloat16_rn(v1_1);")


def test_feeds_and_reductions():
    code = render(dag((plan.Accumulator(), False), (plan.Apply(Op.EXP, (0,)), False),
                      effects=[plan.FeedEffect(0), plan.ReduceEffect(0, 1)]))
    assert code.stores == ("inter_0 = acc_0;", "inter_1 = acc_1;", "red0_0 = v1_0;", "red0_1 = v1_1;")


def test_cast_rounds_and_returns_to_float():
    _, text = lines_of(gemm_kernel((ir.Store("D", ir.Cast(DType.BF16, acc)),)))
    assert "__bfloat162float(__float2bfloat16_rn(acc_0))" in text


def test_narrow_compute_type_rounds_every_value():
    k = dataclasses.replace(gemm_kernel((ir.Store("D", call(Op.MUL, acc, ir.Const(0.1))),)),
                            compute_dtype=DType.F16)
    _, text = lines_of(k)
    assert "__half2float(__float2half_rn(acc_0))" in text  # the accumulator enters as f16
    assert "0.099975586f" in text  # the constant 0.1 as the nearest f16
    assert text.count("__float2half_rn(") >= 4  # acc and the product, both elements


@pytest.mark.parametrize("op", list(Op))
def test_every_op_renders(op):
    assert op in epilogue_cpp.OP_CPP
    args = [acc, ir.Const(0.5), ir.Const(2.0)][: op.arity]
    code, text = lines_of(gemm_kernel((ir.Store("D", call(op, *args)),)))
    assert code.compute, op
    assert "{" not in text  # every placeholder substituted


def test_uniform_op_is_one_line():
    code = render(dag((plan.ScalarArg("alpha"), True), (plan.Apply(Op.SQRT, (0,)), True)))
    assert code.compute == ("const float v2 = sqrtf(v1);",)


@pytest.mark.parametrize("value,literal", [(1.5, "1.5f"), (1.0, "1.0f"), (0.1, "0.1f"),
                                           (1e-5, "1e-05f"), (-2.0, "-2.0f"), (3e38, "3e+38f"),
                                           (3.4028234663852886e38, "3.4028235e+38f")])
def test_float_literals_round_trip(value, literal):
    assert float_literal(value) == literal


@pytest.mark.parametrize("value", [float("inf"), float("nan"), 1e39])
def test_non_finite_constant_is_refused(value):
    with pytest.raises(ValueError):
        float_literal(value)


@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A])
def test_a_reduction_takes_the_value_before_the_stores_conversion(arch):
    """`t = relu(acc); D = t; s = rowsum(t)`: the store converts t to f16, the reduction gets
    t itself, in f32 (docs/language.md, section 7)."""
    t = call(Op.RELU, acc)
    kernel = gemm_kernel((ir.Let("t", t), ir.Store("D", ir.LocalRef("t")),
                          ir.Store("s", ir.Reduce(ir.ReduceOp.SUM, Axis.ROW, ir.LocalRef("t")))),
                         extra=(P("s", V, DType.F32, ("M",), role=ir.Role.OUT),), arch=arch)
    code = render(lower(kernel, arch).gemms[0].epilogue)
    store, *reductions = code.stores
    assert "__floats2half2_rn(v1_0, v1_1)" in store
    assert reductions == ["red0_0 = v1_0;", "red0_1 = v1_1;"]
