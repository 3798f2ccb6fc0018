"""The epilogue lowering: a DAG of typed nodes with sharing, uniform values and effects."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir, plan as P_
from kgen.errors import KgenError, SourceLoc
from kgen.lower import lower

from tests.kernels import P, S, T, V, gemm_kernel

acc = ir.Acc()


def call(op, *args):
    return ir.Call(op, tuple(args))


def dag_of(kernel) -> P_.EpilogueDag:
    return lower(kernel).gemms[0].epilogue


def kinds(dag, cls):
    return [n for n in dag.nodes if isinstance(n.kind, cls)]


def assert_topological(dag):
    for i, node in enumerate(dag.nodes):
        assert node.id == i
        args = node.kind.args if isinstance(node.kind, P_.Apply) else (
            (node.kind.arg,) if isinstance(node.kind, (P_.Cast, P_.Round)) else ())
        assert all(a < i for a in args), node
    assert all(e.node < len(dag.nodes) for e in dag.effects)


def test_accumulator_stored_directly():
    dag = dag_of(gemm_kernel((ir.Store("D", acc),)))
    assert [n.kind for n in dag.nodes] == [P_.Accumulator()]
    assert not dag.nodes[0].uniform
    assert dag.effects == (P_.StoreEffect("D", 0, ir.DType.F16, ir.Layout.ROW),)
    assert dag.packed_store == P_.PackedStore("D", ir.DType.F16)
    assert dag.value_count == 0


def test_value_used_twice_is_one_node():
    e = call(ir.Op.EXP, acc)
    dag = dag_of(gemm_kernel((ir.Store("D", call(ir.Op.ADD, e, e)),)))
    assert_topological(dag)
    (exp,) = [n for n in kinds(dag, P_.Apply) if n.kind.op is ir.Op.EXP]
    (add,) = [n for n in kinds(dag, P_.Apply) if n.kind.op is ir.Op.ADD]
    assert add.kind.args == (exp.id, exp.id)
    assert len(kinds(dag, P_.Accumulator)) == 1
    # the same through a Let bound once and used twice
    k2 = gemm_kernel((ir.Let("t", e), ir.Store("D", call(ir.Op.MUL, ir.LocalRef("t"), ir.LocalRef("t")))))
    dag2 = dag_of(k2)
    assert len([n for n in kinds(dag2, P_.Apply) if n.kind.op is ir.Op.EXP]) == 1
    assert dag2.value_count == 2


def test_uniform_values():
    extra = (P("alpha", S, ir.DType.F32, default=2.0), P("scale", V, ir.DType.F32, ("M",)),
             P("bias", V, ir.DType.F32, ("N",)))
    scaled = call(ir.Op.MUL, ir.ScalarLoad("alpha"), ir.VectorLoad("scale", ir.Axis.ROW))
    e = call(ir.Op.ADD, call(ir.Op.MUL, scaled, acc), ir.VectorLoad("bias", ir.Axis.COL))
    dag = dag_of(gemm_kernel((ir.Store("D", e),), extra=extra))
    assert_topological(dag)
    uniform = {type(n.kind).__name__: n.uniform for n in dag.nodes if not isinstance(n.kind, P_.Apply)}
    assert uniform == {"ScalarArg": True, "VectorLoad": False, "Accumulator": False}
    (row,) = [n for n in kinds(dag, P_.VectorLoad) if n.kind.axis is ir.Axis.ROW]
    assert row.uniform and row.kind == P_.VectorLoad("scale", ir.Axis.ROW, ir.DType.F32)
    ops = {n.kind.op: n.uniform for n in kinds(dag, P_.Apply) if n.kind.op is not ir.Op.MUL}
    assert ops == {ir.Op.ADD: False}
    muls = [n.uniform for n in kinds(dag, P_.Apply) if n.kind.op is ir.Op.MUL]
    assert muls == [True, False]  # alpha * scale[row] once per pair, then per element


def test_loads_and_stores_carry_dtype_and_layout():
    extra = (P("C", T, ir.DType.BF16, ("M", "N"), ir.Layout.COL), P("bias", V, ir.DType.F32, ("N",)),
             P("E", T, ir.DType.F32, ("M", "N"), ir.Layout.COL, ir.Role.OUT))
    e = call(ir.Op.ADD, ir.TensorLoad("C"), ir.VectorLoad("bias", ir.Axis.COL))
    dag = dag_of(gemm_kernel((ir.Store("D", e), ir.Store("E", e)), extra=extra))
    assert kinds(dag, P_.TensorLoad)[0].kind == P_.TensorLoad("C", ir.DType.BF16, ir.Layout.COL)
    (add,) = kinds(dag, P_.Apply)
    assert dag.effects == (P_.StoreEffect("D", add.id, ir.DType.F16, ir.Layout.ROW),
                           P_.StoreEffect("E", add.id, ir.DType.F32, ir.Layout.COL))
    assert dag.packed_store is None  # two stores


def test_casts():
    dag = dag_of(gemm_kernel((ir.Store("D", ir.Cast(ir.DType.BF16, acc)),)))
    assert [n.kind for n in dag.nodes] == [P_.Accumulator(), P_.Cast(ir.DType.BF16, 0)]
    # a cast to f32 is the value itself
    dag = dag_of(gemm_kernel((ir.Store("D", ir.Cast(ir.DType.F32, acc)),)))
    assert [n.kind for n in dag.nodes] == [P_.Accumulator()]


@pytest.mark.parametrize("op", [op for op in ir.Op])
def test_every_op_lowers(op):
    args = [acc, ir.Const(0.5), ir.Const(2.0)][: op.arity]
    dag = dag_of(gemm_kernel((ir.Store("D", call(op, *args)),)))
    assert_topological(dag)
    assert dag.nodes[-1].kind.op is op
    assert [n.kind.value for n in kinds(dag, P_.Constant)] == [0.5, 2.0][: op.arity - 1]
    assert all(n.uniform for n in kinds(dag, P_.Constant))


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
    dag = plan.gemms[0].epilogue
    (exp,) = kinds(dag, P_.Apply)
    assert dag.effects[-1] == P_.ReduceEffect(0, exp.id)
    assert dag.packed_store is None  # a store and a reduction
    assert [f.ctype for f in plan.fields if f.name == "r"] == ["float*"]


def test_reduction_output_must_be_f32():
    with pytest.raises(KgenError, match="reduction output 'r' must be f32"):
        lower(_reducing(ir.ReduceOp.SUM, ir.Axis.ROW, out_dtype=ir.DType.F16))


def test_deterministic_reductions_use_a_workspace_and_a_finalize_kernel():
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
    k = dataclasses.replace(gemm_kernel((ir.Store("D", call(ir.Op.MUL, acc, ir.Const(0.1))),)),
                            compute_dtype=ir.DType.F16)
    dag = dag_of(k)
    assert_topological(dag)
    # the accumulator enters as f16, the product is rounded to f16; the constant is stored as
    # the nearest f16 already (no rounding node)
    assert [type(n.kind).__name__ for n in dag.nodes] == [
        "Accumulator", "Round", "Constant", "Apply", "Round"]
    assert all(n.kind.dtype is ir.DType.F16 for n in kinds(dag, P_.Round))
    assert kinds(dag, P_.Constant)[0].kind.value == 0.0999755859375


def test_constant_out_of_the_compute_range_is_a_located_error():
    loc = SourceLoc("t.kg", 3, 7, 3, 11)
    big = gemm_kernel((ir.Store("D", call(ir.Op.MUL, acc, ir.Const(1e39, loc))),))
    with pytest.raises(KgenError, match="the constant 1e[+]39 does not fit the compute type f32") as e:
        lower(big)
    assert e.value.loc == loc
    for dtype in (ir.DType.F16, ir.DType.BF16):
        value = 1e5 if dtype is ir.DType.F16 else 1e39
        narrow = dataclasses.replace(gemm_kernel((ir.Store("D", call(ir.Op.MUL, acc, ir.Const(value))),)),
                                     compute_dtype=dtype)
        with pytest.raises(KgenError, match=f"does not fit the compute type {dtype.dsl_name}"):
            lower(narrow)
