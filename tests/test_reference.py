"""The NumPy reference: every op against hand-computed values, casts, store rounding,
broadcasting, chained gemms, reductions, row subsets, and the comparison."""
from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from kgen import ir
from kgen.reference import compare, erf, evaluate, needs_all_rows, tolerance

P, T, V, S = ir.Param, ir.ParamKind.TENSOR, ir.ParamKind.VECTOR, ir.ParamKind.SCALAR
OUT = ir.Role.OUT
F16, BF16, F32 = ir.DType.F16, ir.DType.BF16, ir.DType.F32


def call(op, *args):
    return ir.Call(op, tuple(args))


def const(v):
    return ir.Const(v)


def one_gemm(stmts, extra=(), out_dtype=F32, outputs=("D",)):
    """A [M, 1] @ [1, N] kernel: with B = ones, acc[r, c] = A[r, 0]."""
    params = (
        P("A", T, F16, ("M", "K")),
        P("B", T, F16, ("K", "N"), ir.Layout.COL),
        *[P(name, T, out_dtype, ("M", "N"), role=OUT) for name in outputs],
        *extra,
    )
    g = ir.Gemm("g", ir.OperandRef("A"), ir.OperandRef("B"), F32, ir.TileShape(128, 128, 32),
                ir.WarpGrid(2, 2), ir.StageCount(3), ir.Epilogue(tuple(stmts)))
    return ir.Kernel("k", ir.Arch.SM80, params, (g,))


def acc_inputs(values, n=1):
    a = np.asarray(values, dtype=np.float16).reshape(-1, 1)
    return {"A": a, "B": np.ones((1, n), dtype=np.float16)}


def eval_expr(expr, values, scalars=None, extra=(), inputs=None):
    kernel = one_gemm([ir.Store("D", expr)], extra=extra)
    data = acc_inputs(values)
    data.update(inputs or {})
    return evaluate(kernel, data, scalars or {})["D"][:, 0].astype(np.float64)


X = [-3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, 4.0]  # exact in f16


def expect(expr, want, **kw):
    got = eval_expr(expr, X, **kw)
    want = np.asarray(want, dtype=np.float64)
    # D is f32: the reference rounds once to f32 at the store.
    np.testing.assert_allclose(got, want.astype(np.float32).astype(np.float64), rtol=0,
                               atol=0, equal_nan=True)


ACC = ir.Acc()


@pytest.mark.parametrize("op, fn", [
    (ir.Op.NEG, lambda x: -x),
    (ir.Op.ABS, abs),
    (ir.Op.EXP, math.exp),
    (ir.Op.TANH, math.tanh),
    (ir.Op.SIGMOID, lambda x: 1 / (1 + math.exp(-x))),
    (ir.Op.RELU, lambda x: max(x, 0.0)),
    (ir.Op.GELU, lambda x: 0.5 * x * (1 + math.erf(x / math.sqrt(2)))),
    (ir.Op.GELU_TANH, lambda x: 0.5 * x * (1 + math.tanh(math.sqrt(2 / math.pi)
                                                         * (x + 0.044715 * x ** 3)))),
    (ir.Op.SILU, lambda x: x / (1 + math.exp(-x))),
    (ir.Op.HARDSWISH, lambda x: x * min(max(x + 3, 0), 6) / 6),
])
def test_unary_ops(op, fn):
    expect(call(op, ACC), [fn(x) for x in X])


def test_unary_ops_known_values():
    # Hand-computed: gelu(1) = 0.841344746..., gelu_tanh(1) = 0.841191990..., silu(1) = 0.7310585...
    got = {op: eval_expr(call(op, ACC), [1.0])[0] for op in
           (ir.Op.GELU, ir.Op.GELU_TANH, ir.Op.SILU, ir.Op.SIGMOID, ir.Op.HARDSWISH)}
    assert got[ir.Op.GELU] == pytest.approx(0.8413447460685429, rel=1e-7)
    assert got[ir.Op.GELU_TANH] == pytest.approx(0.8411919906082768, rel=1e-7)
    assert got[ir.Op.SILU] == pytest.approx(0.7310585786300049, rel=1e-7)
    assert got[ir.Op.SIGMOID] == pytest.approx(0.7310585786300049, rel=1e-7)
    assert got[ir.Op.HARDSWISH] == pytest.approx(4 / 6, rel=1e-7)
    assert eval_expr(call(ir.Op.HARDSWISH, ACC), [-4.0, 4.0]).tolist() == [0.0, 4.0]


def test_log_sqrt_rsqrt_domain():
    got = eval_expr(call(ir.Op.LOG, ACC), [-1.0, 0.0, 1.0, 4.0])
    assert math.isnan(got[0]) and got[1] == -math.inf and got[2] == 0.0
    assert got[3] == pytest.approx(math.log(4.0), rel=1e-7)
    assert eval_expr(call(ir.Op.SQRT, ACC), [4.0, 2.0]).tolist() == pytest.approx([2.0, 2 ** .5])
    assert eval_expr(call(ir.Op.RSQRT, ACC), [4.0, 0.25]).tolist() == [0.5, 2.0]


@pytest.mark.parametrize("op, fn", [
    (ir.Op.ADD, lambda a, b: a + b),
    (ir.Op.SUB, lambda a, b: a - b),
    (ir.Op.MUL, lambda a, b: a * b),
    (ir.Op.DIV, lambda a, b: a / b if b else math.copysign(math.inf, a)),
    (ir.Op.MIN, min),
    (ir.Op.MAX, max),
    (ir.Op.LT, lambda a, b: float(a < b)),
    (ir.Op.LE, lambda a, b: float(a <= b)),
    (ir.Op.GT, lambda a, b: float(a > b)),
    (ir.Op.GE, lambda a, b: float(a >= b)),
    (ir.Op.EQ, lambda a, b: float(a == b)),
    (ir.Op.NE, lambda a, b: float(a != b)),
])
def test_binary_ops_with_constant(op, fn):
    expect(call(op, ACC, const(0.5)), [fn(x, 0.5) for x in X])
    expect(call(op, const(0.5), ACC), [fn(0.5, x) for x in X])


def test_comparisons_give_one_or_zero():
    assert eval_expr(call(ir.Op.GT, ACC, const(0.0)), [-1.0, 0.0, 2.0]).tolist() == [0, 0, 1]
    assert eval_expr(call(ir.Op.EQ, ACC, const(0.0)), [-1.0, 0.0, 2.0]).tolist() == [0, 1, 0]


def test_where_leaky_relu_clamp():
    expect(call(ir.Op.WHERE, call(ir.Op.GT, ACC, const(0.0)), ACC, const(-7.0)),
           [x if x > 0 else -7.0 for x in X])
    expect(call(ir.Op.WHERE, ACC, const(1.0), const(2.0)), [1.0 if x != 0 else 2.0 for x in X])
    expect(call(ir.Op.LEAKY_RELU, ACC, const(0.1)), [x if x > 0 else 0.1 * x for x in X])
    assert eval_expr(call(ir.Op.LEAKY_RELU, ACC, const(0.125)), [-2.0])[0] == -0.25
    expect(call(ir.Op.CLAMP, ACC, const(-1.0), const(1.5)), [min(max(x, -1.0), 1.5) for x in X])


def test_every_op_has_a_meaning():
    from kgen.reference import _NUMPY_OPS

    assert set(_NUMPY_OPS) == set(ir.Op)


def test_erf_matches_libm():
    x = np.linspace(-7, 7, 20001)
    np.testing.assert_allclose(erf(x), [math.erf(v) for v in x], rtol=0, atol=1e-15)
    assert erf(np.float64(0.5)) == math.erf(0.5)


def test_cast_rounds_to_dtype_and_back():
    third = [1.0 / 3.0]  # not exact in f16; use a scalar to carry it
    kernel = one_gemm([ir.Store("D", ir.Cast(F16, call(ir.Op.MUL, ACC, ir.ScalarLoad("s"))))],
                      extra=(P("s", S, F32),))
    got = evaluate(kernel, acc_inputs([1.0]), {"s": third[0]})["D"][0, 0]
    assert got == np.float32(np.float16(np.float32(1 / 3)))
    assert float(got) == 0.333251953125
    # bf16 keeps 8 significant bits: 1 + 2**-8 is a tie and rounds to even (1.0);
    # 1 + 3 * 2**-8 rounds up to 1 + 2**-6.
    kernel = one_gemm([ir.Store("D", ir.Cast(BF16, call(ir.Op.ADD, ACC, ir.ScalarLoad("s"))))],
                      extra=(P("s", S, F32),))
    assert evaluate(kernel, acc_inputs([1.0]), {"s": 2 ** -8})["D"][0, 0] == 1.0
    assert evaluate(kernel, acc_inputs([1.0]), {"s": 3 * 2 ** -8})["D"][0, 0] == 1 + 2 ** -6


def test_store_rounds_once_to_output_dtype():
    kernel = one_gemm([ir.Store("D", call(ir.Op.MUL, ACC, ir.ScalarLoad("s")))],
                      extra=(P("s", S, F32),), out_dtype=BF16)
    out = evaluate(kernel, acc_inputs([1.0, 3.0]), {"s": 0.1})["D"]
    assert out.dtype == np.dtype(ml_dtypes.bfloat16)
    # The product is computed in f64 from the f32 scalar, then rounded to bf16 once.
    want = (np.array([1.0, 3.0]) * np.float64(np.float32(0.1))).astype(ml_dtypes.bfloat16)
    assert out[:, 0].tolist() == want.tolist()
    kernel16 = one_gemm([ir.Store("D", ACC)], out_dtype=F16)
    assert evaluate(kernel16, acc_inputs([2.0]))["D"].dtype == np.float16


def test_scalars_are_float32_and_default():
    kernel = one_gemm([ir.Store("D", call(ir.Op.MUL, ACC, ir.ScalarLoad("alpha")))],
                      extra=(P("alpha", S, F32, default=0.1),))
    got = evaluate(kernel, acc_inputs([1.0]), {})["D"][0, 0]
    assert got == np.float32(0.1)
    assert evaluate(kernel, acc_inputs([1.0]), {"alpha": 2.0})["D"][0, 0] == 2.0
    kernel = one_gemm([ir.Store("D", ir.ScalarLoad("beta"))], extra=(P("beta", S, F32),))
    with pytest.raises(KeyError, match="beta"):
        evaluate(kernel, acc_inputs([1.0]), {})


def test_broadcast_vectors_and_tensor_loads():
    rng = np.random.default_rng(1)
    m, n, k = 5, 3, 4
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    c = rng.standard_normal((m, n)).astype(np.float16)
    rv = rng.standard_normal(m).astype(np.float32)
    cv = rng.standard_normal(n).astype(np.float32)
    expr = call(ir.Op.ADD, call(ir.Op.MUL, ACC, ir.VectorLoad("rv", ir.Axis.ROW)),
                call(ir.Op.SUB, ir.TensorLoad("C"), ir.VectorLoad("cv", ir.Axis.COL)))
    kernel = one_gemm([ir.Store("D", expr)], extra=(
        P("C", T, F16, ("M", "N")), P("rv", V, F32, ("M",)), P("cv", V, F32, ("N",))))
    out = evaluate(kernel, {"A": a, "B": b, "C": c, "rv": rv, "cv": cv})["D"]
    acc = a.astype(np.float64) @ b.astype(np.float64)
    want = acc * rv.astype(np.float64)[:, None] + (c.astype(np.float64) - cv[None, :])
    assert out.shape == (m, n)
    np.testing.assert_array_equal(out, want.astype(np.float32))


def test_let_reuse_and_several_outputs():
    lets = [
        ir.Let("t", call(ir.Op.ADD, ACC, const(1.0))),
        ir.Store("D", call(ir.Op.MUL, ir.LocalRef("t"), ir.LocalRef("t"))),
        ir.Store("E", call(ir.Op.RELU, ir.LocalRef("t"))),
        ir.Store("F", ACC),
    ]
    kernel = one_gemm(lets, outputs=("D", "E", "F"))
    out = evaluate(kernel, acc_inputs([-3.0, 0.5]))
    assert out["D"][:, 0].tolist() == [4.0, 2.25]
    assert out["E"][:, 0].tolist() == [0.0, 1.5]
    assert out["F"][:, 0].tolist() == [-3.0, 0.5]


def test_constant_store_broadcasts_to_the_output_shape():
    kernel = one_gemm([ir.Store("D", const(2.5))])
    out = evaluate(kernel, acc_inputs([1.0, 2.0], n=3) | {"B": np.ones((1, 3), np.float16)})
    assert out["D"].shape == (2, 3) and (out["D"] == 2.5).all()


def test_chained_gemm_uses_first_store_rounded_to_operand_dtype():
    rng = np.random.default_rng(2)
    m, k0, n0, n1 = 6, 8, 4, 5
    params = (
        P("A", T, BF16, ("M", "K0")),
        P("B0", T, BF16, ("K0", "N0"), ir.Layout.COL),
        P("B1", T, BF16, ("N0", "N1"), ir.Layout.COL),
        P("D0", T, F32, ("M", "N0"), role=OUT),
        P("D1", T, F32, ("M", "N1"), role=OUT),
    )
    g0 = ir.Gemm("g0", ir.OperandRef("A"), ir.OperandRef("B0"), F32, ir.TileShape(64, 64, 32),
                 ir.WarpGrid(2, 2), ir.StageCount(2),
                 ir.Epilogue((ir.Store("D0", call(ir.Op.RELU, ACC)),)))
    g1 = ir.Gemm("g1", ir.OperandRef("g0"), ir.OperandRef("B1"), F32, ir.TileShape(64, 64, 32),
                 ir.WarpGrid(2, 2), ir.StageCount(2), ir.Epilogue((ir.Store("D1", ACC),)))
    kernel = ir.Kernel("b2b", ir.Arch.SM80, params, (g0, g1))
    bf = ml_dtypes.bfloat16
    data = {"A": rng.standard_normal((m, k0)).astype(bf),
            "B0": rng.standard_normal((k0, n0)).astype(bf),
            "B1": rng.standard_normal((n0, n1)).astype(bf)}
    out = evaluate(kernel, data)
    h = np.maximum(data["A"].astype(np.float64) @ data["B0"].astype(np.float64), 0)
    np.testing.assert_array_equal(out["D0"], h.astype(np.float32))
    inter = h.astype(bf).astype(np.float64)  # the intermediate in B1's dtype
    np.testing.assert_array_equal(out["D1"], (inter @ data["B1"].astype(np.float64))
                                  .astype(np.float32))
    assert not np.array_equal(inter, h)  # the rounding matters for this data


@pytest.mark.parametrize("op", list(ir.ReduceOp))
@pytest.mark.parametrize("axis", [ir.Axis.ROW, ir.Axis.COL, ir.Axis.ALL])  # reductions
def test_reductions(op, axis):
    rng = np.random.default_rng(3)
    m, n, k = 7, 5, 3
    length = {ir.Axis.ROW: "M", ir.Axis.COL: "N", ir.Axis.ALL: None}[axis]
    target = P("r", V, F32, (length,), role=OUT) if length else P("r", S, F32, role=OUT)
    kernel = ir.Kernel("red", ir.Arch.SM80, (
        P("A", T, F16, ("M", "K")), P("B", T, F16, ("K", "N"), ir.Layout.COL), target),
        (ir.Gemm("g", ir.OperandRef("A"), ir.OperandRef("B"), F32, ir.TileShape(64, 64, 32),
                 ir.WarpGrid(2, 2), ir.StageCount(2),
                 ir.Epilogue((ir.Store("r", ir.Reduce(op, axis, call(ir.Op.SUB, ACC,
                                                                     const(0.25)))),))),))
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((k, n)).astype(np.float16)
    x = a.astype(np.float64) @ b.astype(np.float64) - 0.25
    fn = {ir.ReduceOp.SUM: np.sum, ir.ReduceOp.MAX: np.max, ir.ReduceOp.MIN: np.min,
          ir.ReduceOp.ABSMAX: lambda v, axis: np.max(np.abs(v), axis=axis)}[op]
    want = fn(x, axis={ir.Axis.ROW: 1, ir.Axis.COL: 0, ir.Axis.ALL: None}[axis])
    got = evaluate(kernel, {"A": a, "B": b})["r"]
    np.testing.assert_array_equal(got, np.asarray(want).astype(np.float32))
    assert needs_all_rows(kernel) == (axis is not ir.Axis.ROW)
    if axis is not ir.Axis.ROW:
        with pytest.raises(ValueError, match="every row"):
            evaluate(kernel, {"A": a, "B": b}, rows=np.array([0, 2]))


def test_row_subset_matches_full_rows():
    rng = np.random.default_rng(4)
    m, n, k = 40, 6, 8
    expr = call(ir.Op.ADD, call(ir.Op.MUL, ACC, ir.VectorLoad("rv", ir.Axis.ROW)),
                ir.TensorLoad("C"))
    kernel = one_gemm([ir.Store("D", expr), ir.Store("R", ir.Reduce(
        ir.ReduceOp.MAX, ir.Axis.ROW, ACC))], extra=(
        P("C", T, F16, ("M", "N")), P("rv", V, F32, ("M",)), P("R", V, F32, ("M",), role=OUT)))
    data = {"A": rng.standard_normal((m, k)).astype(np.float16),
            "B": rng.standard_normal((k, n)).astype(np.float16),
            "C": rng.standard_normal((m, n)).astype(np.float16),
            "rv": rng.standard_normal(m).astype(np.float32)}
    full = evaluate(kernel, data)
    rows = np.array([0, 3, 17, 39])
    part = evaluate(kernel, data, rows=rows)
    np.testing.assert_array_equal(part["D"], full["D"][rows])
    np.testing.assert_array_equal(part["R"], full["R"][rows])


def test_tolerances_order():
    assert tolerance(F32)[1] < tolerance(F16)[1] < tolerance(BF16)[1]


def test_compare_ok_bad_and_unwritten():
    ref = np.linspace(-2, 2, 12, dtype=np.float64).reshape(3, 4)
    out = ref.astype(np.float16)
    result = compare(out, ref, F16)
    assert result.ok and result.unwritten == 0 and result.bad == 0
    assert result.max_abs <= 2 ** -10 * 2

    poisoned = out.copy()
    poisoned[2, 1] = np.nan
    result = compare(poisoned, ref, F16)
    assert not result.ok and result.unwritten == 1 and result.worst == (2, 1)

    wrong = out.astype(np.float32)
    wrong[0, 3] += 0.1
    result = compare(wrong, ref, F16)
    assert not result.ok and result.bad == 1 and result.unwritten == 0
    assert result.worst == (0, 3) and result.max_abs == pytest.approx(0.1, rel=1e-3)
    assert "outside" in result.summary()


def test_compare_nan_and_inf_in_reference():
    ref = np.array([np.nan, np.inf, -np.inf, 1.0])
    assert compare(np.array([np.nan, np.inf, -np.inf, 1.0]), ref, F32).ok
    result = compare(np.array([1.0, np.inf, -np.inf, 1.0]), ref, F32)
    assert not result.ok and result.unwritten == 0  # a number where NaN was expected
    assert not compare(np.array([np.nan, -np.inf, -np.inf, 1.0]), ref, F32).ok


def test_compare_uses_relative_tolerance_for_large_values():
    ref = np.array([1000.0, -2000.0])
    out = ref * (1 + 0.01)  # 1% off: within bf16's tolerance, not within f16's
    assert compare(out, ref, BF16).ok
    assert not compare(out, ref, F16).ok


def test_checking_dtype_follows_casts():
    from kgen import ir
    from kgen.reference import checking_dtype
    from tests.kernels import P, T, gemm_kernel

    extra = (P("E", T, ir.DType.F32, ("M", "N"), role=ir.Role.OUT),)
    plain = gemm_kernel((ir.Store("D", ir.Acc()), ir.Store("E", ir.Acc())), extra=extra)
    assert checking_dtype(plain, "E") is ir.DType.F32
    cast = gemm_kernel((ir.Store("D", ir.Acc()), ir.Store("E", ir.Cast(ir.DType.BF16, ir.Acc()))),
                       extra=extra)
    assert checking_dtype(cast, "E") is ir.DType.BF16
    assert checking_dtype(cast, "D") is ir.DType.BF16  # conservative: any cast in the epilogue


def test_a_reduction_sees_the_value_before_the_stores_rounding():
    """`t = relu(1.001 * acc); D = t; s = rowsum(t)` with an f16 D: s sums t's values as
    computed, not D's f16 ones (docs/language.md, section 7); rowsum(cast<f16>(t)) sums those."""
    t = call(ir.Op.RELU, call(ir.Op.MUL, const(1.001), ACC))
    extra = (P("s", V, F32, ("M",), role=OUT),)

    def kernel(reduced):
        return one_gemm([ir.Let("t", t), ir.Store("D", ir.LocalRef("t")),
                         ir.Store("s", ir.Reduce(ir.ReduceOp.SUM, ir.Axis.ROW, reduced))],
                        extra=extra, out_dtype=F16)

    rng = np.random.default_rng(7)
    data = {"A": rng.standard_normal((4, 16)).astype(np.float16),
            "B": rng.standard_normal((16, 64)).astype(np.float16)}
    out = evaluate(kernel(ir.LocalRef("t")), data)
    product = data["A"].astype(np.float64) @ data["B"].astype(np.float64)
    exact = np.maximum(float(np.float32(1.001)) * product, 0)  # constants are f32 values
    stored = out["D"].astype(np.float64)
    np.testing.assert_array_equal(stored, exact.astype(np.float16))
    np.testing.assert_array_equal(out["s"], exact.sum(axis=1).astype(np.float32))
    assert np.all(out["s"] != stored.sum(axis=1).astype(np.float32))  # the rounding shows
    rounded = evaluate(kernel(ir.Cast(F16, ir.LocalRef("t"))), data)
    np.testing.assert_array_equal(rounded["s"], stored.sum(axis=1).astype(np.float32))
