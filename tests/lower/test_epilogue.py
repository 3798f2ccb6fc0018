"""The epilogue lowering: sharing, uniform values, loads, stores and conversions."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.lower import epilogue, lower

from tests.kernels import P, S, T, V, gemm_kernel

acc = ir.Acc()


def call(op, *args):
    return ir.Call(op, tuple(args))


def lines_of(kernel):
    code = lower(kernel).gemms[0].epilogue
    return code, "\n".join(code.loads + code.compute + code.stores)


def test_accumulator_stored_directly():
    code, text = lines_of(gemm_kernel((ir.Store("D", acc),)))
    assert code.compute == ()
    assert code.stores == (
        "*reinterpret_cast<__half2*>(p.D + row * p.ld_D + col) = __floats2half2_rn(acc_0, acc_1);",
    )


def test_value_used_twice_is_computed_once():
    e = call(ir.Op.EXP, acc)
    k = gemm_kernel((ir.Store("D", call(ir.Op.ADD, e, e)),))
    code, text = lines_of(k)
    assert text.count("expf(") == 2  # once per element, not once per use
    # the same through a Let bound once and used twice
    k2 = gemm_kernel((ir.Let("t", e), ir.Store("D", call(ir.Op.MUL, ir.LocalRef("t"), ir.LocalRef("t")))))
    _, text2 = lines_of(k2)
    assert text2.count("expf(") == 2


def test_unary_minus():
    code, text = lines_of(gemm_kernel((ir.Store("D", call(ir.Op.NEG, acc)),)))
    assert "= -acc_0;" in text and "= -acc_1;" in text


def test_uniform_values_are_computed_once_per_pair():
    extra = (P("alpha", S, ir.DType.F32, default=2.0), P("scale", V, ir.DType.F32, ("M",)))
    e = call(ir.Op.MUL, call(ir.Op.MUL, ir.ScalarLoad("alpha"), ir.VectorLoad("scale", ir.Axis.ROW)), acc)
    code, text = lines_of(gemm_kernel((ir.Store("D", e),), extra=extra))
    assert "const float v1 = p.alpha;" in code.loads
    assert "const float v2 = p.scale[row];" in code.loads
    assert "const float v3 = v1 * v2;" in code.compute  # no per-element copy
    assert "const float v4_0 = v3 * acc_0;" in code.compute


def test_pair_loads_and_conversions():
    extra = (P("C", T, ir.DType.BF16, ("M", "N")), P("bias", V, ir.DType.F32, ("N",)),
             P("E", T, ir.DType.F32, ("M", "N"), ir.Layout.COL, ir.Role.OUT))
    e = call(ir.Op.ADD, ir.TensorLoad("C"), ir.VectorLoad("bias", ir.Axis.COL))
    code, text = lines_of(gemm_kernel((ir.Store("D", e), ir.Store("E", e)), extra=extra))
    assert "const __nv_bfloat162 v1 = *reinterpret_cast<const __nv_bfloat162*>(p.C + row * p.ld_C + col);" in code.loads
    assert "const float2 v2 = *reinterpret_cast<const float2*>(p.bias + col);" in code.loads
    assert "p.E[(col + 0) * p.ld_E + row] = v3_0;" in code.stores
    assert text.count("v1_0 + v2_0") == 1  # shared by both stores


def test_cast_rounds_and_returns_to_float():
    e = ir.Cast(ir.DType.BF16, acc)
    _, text = lines_of(gemm_kernel((ir.Store("D", e),)))
    assert "__bfloat162float(__float2bfloat16_rn(acc_0))" in text


@pytest.mark.parametrize("op", [op for op in ir.Op])
def test_every_op_lowers(op):
    args = [acc, ir.Const(0.5), ir.Const(2.0)][: op.arity]
    code, text = lines_of(gemm_kernel((ir.Store("D", call(op, *args)),)))
    assert code.compute, op
    assert "{" not in text  # every placeholder substituted


@pytest.mark.parametrize("value,literal", [(1.5, "1.5f"), (1.0, "1.0f"), (0.1, "0.1f"),
                                           (1e-5, "1e-05f"), (-2.0, "-2.0f"), (3e38, "3e+38f")])
def test_float_literals_round_trip(value, literal):
    assert epilogue.float_literal(value) == literal


def test_non_finite_constant_is_refused():
    with pytest.raises(ValueError):
        epilogue.float_literal(float("inf"))


def _reducing(op, axis, out_dtype=ir.DType.F32, length="M"):
    shape = () if axis is ir.Axis.ALL else (length,)
    kind = S if axis is ir.Axis.ALL else V
    extra = (P("r", kind, out_dtype, shape, role=ir.Role.OUT),)
    stmts = (ir.Store("D", acc), ir.Store("r", ir.Reduce(op, axis, call(ir.Op.EXP, acc))))
    return gemm_kernel(stmts, extra=extra)


@pytest.mark.parametrize("axis,length,floats", [(ir.Axis.ROW, "M", 2 * 128), (ir.Axis.COL, "N", 2 * 128),
                                                (ir.Axis.ALL, None, 4)])
def test_reductions_get_scratch_after_the_mainloop(axis, length, floats):
    plan = lower(_reducing(ir.ReduceOp.MAX, axis, length=length or "M"))
    (red,) = plan.reductions
    assert (red.target, red.op, red.axis, red.scratch_floats) == ("r", ir.ReduceOp.MAX, axis, floats)
    scratch = next(b for b in plan.storage.buffers if b.name == red.scratch)
    assert scratch.live == (1, 1) and scratch.offset == 0  # reuses the dead operand stages
    assert plan.init_kernel == "k_init"
    code = plan.gemms[0].epilogue
    assert code.stores[-2:] == ("red0_0 = v1_0;", "red0_1 = v1_1;")
    assert [f.ctype for f in plan.fields if f.name == "r"] == ["float*"]


def test_reduction_output_must_be_f32():
    from kgen.errors import KgenError

    with pytest.raises(KgenError, match="reduction output 'r' must be f32"):
        lower(_reducing(ir.ReduceOp.SUM, ir.Axis.ROW, out_dtype=ir.DType.F16))


def test_deterministic_reductions_use_a_workspace_and_a_finalize_kernel():
    import dataclasses

    from kgen.emit import emit

    kernel = dataclasses.replace(_reducing(ir.ReduceOp.SUM, ir.Axis.COL, length="N"), deterministic=True)
    plan = lower(kernel)
    assert plan.init_kernel is None and plan.finalize_kernel == "k_finalize"
    assert [f.name for f in plan.fields if f.kind.value == "workspace"] == ["workspace"]
    # 1000 columns, 2100 rows in tiles of 128: 17 partial slots of N floats
    assert plan.workspace_floats({"M": 2100, "N": 1000, "K": 64}) == 17 * 1000
    src = emit(plan, source_name="x.kg", source_hash="0", command="c")
    assert "k_finalize(const __grid_constant__ k_params p)" in src
    assert "atomic" not in src.split("// Epilogue")[1].split("k_finalize")[0]


def test_narrow_compute_type_rounds_every_value():
    import dataclasses

    k = dataclasses.replace(gemm_kernel((ir.Store("D", call(ir.Op.MUL, acc, ir.Const(0.1))),)),
                            compute_dtype=ir.DType.F16)
    code, text = lines_of(k)
    assert "__half2float(__float2half_rn(acc_0))" in text  # the accumulator enters as f16
    assert "0.099975586f" in text  # the constant 0.1 as the nearest f16
    assert text.count("__float2half_rn(") >= 4  # acc and the product, both elements


def test_constant_out_of_the_compute_range_is_a_located_error():
    import dataclasses

    from kgen.errors import KgenError

    big = gemm_kernel((ir.Store("D", call(ir.Op.MUL, acc, ir.Const(1e39))),))
    with pytest.raises(KgenError, match="does not fit the compute type f32"):
        lower(big)
    half = dataclasses.replace(gemm_kernel((ir.Store("D", call(ir.Op.MUL, acc, ir.Const(1e5))),)),
                               compute_dtype=ir.DType.F16)
    with pytest.raises(KgenError, match="does not fit the compute type f16"):
        lower(half)
