"""kgen.verify on IR built directly in Python (no DSL): valid kernels pass, mistakes are named."""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from kgen import ir, verify as verify_module
from kgen.errors import NOWHERE, KgenError, KgenWarning, SourceLoc
from kgen.ir import (
    Acc,
    Arch,
    Axis,
    Call,
    Cast,
    Const,
    DType,
    Epilogue,
    Gemm,
    Kernel,
    Layout,
    Let,
    LocalRef,
    Module,
    Op,
    OperandRef,
    Param,
    ParamKind,
    Reduce,
    ReduceOp,
    Residency,
    Role,
    ScalarLoad,
    StageCount,
    Store,
    TensorLoad,
    TileShape,
    VectorLoad,
    WarpGrid,
)
from kgen.verify import RESERVED_IDENTIFIERS, check_identifier, verify, verify_kernel

TENSOR, VECTOR, SCALAR = ParamKind.TENSOR, ParamKind.VECTOR, ParamKind.SCALAR

A = Param("A", TENSOR, DType.F16, ("M", "K"))
B = Param("B", TENSOR, DType.F16, ("K", "N"), Layout.COL)
C = Param("C", TENSOR, DType.F16, ("M", "N"))
D = Param("D", TENSOR, DType.F16, ("M", "N"), role=Role.OUT)
BIAS = Param("bias", VECTOR, DType.F32, ("N",))
SCALE = Param("scale", VECTOR, DType.F32, ("M",))
ALPHA = Param("alpha", SCALAR, DType.F32, default=1.5)
PARAMS = (A, B, C, D, BIAS, SCALE, ALPHA)

# relu(alpha * acc + C + bias[col]) * scale[row], through a local
STMTS = (
    Let("t", Call(Op.ADD, (Call(Op.MUL, (ScalarLoad("alpha"), Acc())), TensorLoad("C")))),
    Store(
        "D",
        Call(
            Op.MUL,
            (
                Call(Op.RELU, (Call(Op.ADD, (LocalRef("t"), VectorLoad("bias", Axis.COL))),)),
                VectorLoad("scale", Axis.ROW),
            ),
        ),
    ),
)


def gemm(stmts=STMTS, **changes) -> Gemm:
    base = Gemm(
        name="mma",
        a=OperandRef("A"),
        b=OperandRef("B"),
        acc_dtype=DType.F32,
        tile=TileShape(128, 128, 32),
        warps=WarpGrid(2, 2),
        stages=StageCount(3),
        epilogue=Epilogue(tuple(stmts)),
    )
    return replace(base, **changes)


def kernel(params=PARAMS, gemms=None, **changes) -> Kernel:
    base = Kernel("fused", Arch.SM80, tuple(params), tuple(gemms or (gemm(),)))
    return replace(base, **changes)


def message(k: Kernel) -> str:
    with pytest.raises(KgenError) as info:
        verify_kernel(k)
    assert info.value.loc == NOWHERE or info.value.loc.line == 0
    return info.value.message


def with_param(which: str, /, **changes) -> tuple[Param, ...]:
    return tuple(replace(p, **changes) if p.name == which else p for p in PARAMS)


# ---------------------------------------------------------------------------------------------
# Valid kernels


def test_valid_kernel_verifies():
    verify(Module((kernel(),)))


@pytest.mark.parametrize("arch", list(Arch))
def test_every_target_verifies(arch):
    verify_kernel(kernel(target=arch))


def test_every_op_and_cast_verify():
    args = (Acc(), ScalarLoad("alpha"), Const(0.5))
    stmts = [Let(f"v{i}", Call(op, args[: op.arity])) for i, op in enumerate(Op)]
    total = LocalRef("v0")
    for i in range(1, len(Op)):
        total = Call(Op.ADD, (total, LocalRef(f"v{i}")))
    stmts.append(Store("D", Cast(DType.BF16, total)))
    verify_kernel(kernel(gemms=(gemm(stmts),)))


def test_several_outputs_and_kernels():
    E = Param("E", TENSOR, DType.F32, ("M", "N"), role=Role.OUT)
    stmts = (
        Let("t", Acc()),
        Store("D", Call(Op.RELU, (LocalRef("t"),))),
        Store("E", LocalRef("t")),
    )
    first = kernel(params=PARAMS + (E,), gemms=(gemm(stmts),))
    verify(Module((first, replace(kernel(), name="other"))))


def test_chained_gemms_verify():
    B1 = Param("B1", TENSOR, DType.F16, ("N", "N1"), Layout.COL)
    E = Param("E", TENSOR, DType.F16, ("M", "N1"), role=Role.OUT)
    g0 = gemm((Store("g0", Call(Op.RELU, (Acc(),))),), name="g0")
    g1 = gemm((Store("E", Acc()),), name="g1", a=OperandRef("g0"), b=OperandRef("B1"),
              keep=Residency.REGISTERS)
    verify_kernel(kernel(params=(A, B, B1, E), gemms=(g0, g1)))


def test_fixed_dimensions():
    A64 = replace(A, shape=("M", 64))
    B64 = replace(B, shape=(64, "N"))
    verify_kernel(kernel(params=(A64, B64) + PARAMS[2:]))


# ---------------------------------------------------------------------------------------------
# Names


def test_duplicate_param():
    params = PARAMS + (replace(ALPHA, kind=VECTOR, shape=("N",), default=None, name="C"),)
    assert message(kernel(params=params)) == "duplicate name 'C' (first defined as a tensor)"


def test_duplicate_names_report_the_first_line():
    first = SourceLoc("x.kg", 3, 3, 3, 20)
    second = SourceLoc("x.kg", 9, 3, 9, 9)
    params = (replace(A, loc=first),) + PARAMS[1:] + (replace(A, loc=second),)
    with pytest.raises(KgenError) as info:
        verify_kernel(kernel(params=params))
    assert info.value.render() == (
        "x.kg:9:3: error: duplicate name 'A' (first defined at line 3 as a tensor)"
    )


def test_local_reusing_a_gemm_name():
    stmts = (Let("mma", Acc()), Store("D", LocalRef("mma")))
    assert message(kernel(gemms=(gemm(stmts),))) == (
        "duplicate name 'mma' (first defined as a gemm)"
    )


def test_local_rebound():
    stmts = (Let("t", Acc()), Let("t", Acc()), Store("D", LocalRef("t")))
    assert message(kernel(gemms=(gemm(stmts),))) == (
        "duplicate name 't' (first defined as a local)"
    )


@pytest.mark.parametrize(
    "name, expected",
    [
        ("class", "tensor name 'class' is a C++ keyword"),
        ("__global__", "tensor name '__global__' must not start with '_' or contain '__' "
                       "(such names are reserved in C++)"),
        ("D; system(x)", "tensor name 'D; system(x)' must start with a letter and use only "
                         "letters, digits and '_'"),
        ("a\nb", "tensor name 'a\\nb' must start with a letter and use only letters, digits "
                 "and '_'"),
        ("", "tensor name '' must start with a letter and use only letters, digits and '_'"),
        ("x" * 65, "tensor name is 65 characters long; at most 64 are allowed"),
        ("blockIdx", "tensor name 'blockIdx' is reserved (a CUDA or C library name)"),
        ("acc_frag", "tensor name 'acc_frag' is reserved (the generated code uses it)"),
        ("Ω", "tensor name 'Ω' is not ASCII; use only letters A-Z, a-z, digits and '_'"),
    ],
)
def test_unsafe_param_names(name, expected):
    assert message(kernel(params=with_param("C", name=name))) == expected


def test_unsafe_kernel_gemm_and_local_names():
    assert message(kernel(name="template")) == "kernel name 'template' is a C++ keyword"
    assert message(kernel(gemms=(gemm(name="printf"),))) == (
        "gemm name 'printf' is reserved (a CUDA or C library name)"
    )
    stmts = (Let("tid", Acc()), Store("D", LocalRef("tid")))
    assert message(kernel(gemms=(gemm(stmts),))) == (
        "local name 'tid' is reserved (the generated code uses it)"
    )
    assert message(kernel(params=with_param("A", shape=("M", "K_")))) == (
        "dimension name 'K_' is reserved (the generated code uses it)"
    )


def test_reserved_identifiers():
    for name in ("int", "asm", "and", "not", "new", "delete", "register", "template",
                 "typename", "auto", "restrict", "threadIdx", "warpSize", "printf", "malloc",
                 "free", "assert", "NULL", "min", "max", "abs", "exp", "log", "sqrt", "acc",
                 "row", "col", "kernel", "tensor", "vector", "scalar", "gemm", "epilogue",
                 "tile", "warps", "stages", "keep", "target", "compute", "accumulate", "in",
                 "out", "cast", "where", "relu", "gelu_tanh", "rowsum", "reduce_absmax",
                 "p", "params", "smem", "tid", "lane", "warp_id", "M_", "N_", "K_", "tile_m",
                 "tile_n", "acc_frag", "a_smem", "b_smem"):
        assert name in RESERVED_IDENTIFIERS, name
    assert "alpha" not in RESERVED_IDENTIFIERS and "M" not in RESERVED_IDENTIFIERS
    check_identifier("bias_2", NOWHERE, "vector")  # a fine name passes silently


def test_dimension_clashing_with_a_param_name():
    params = PARAMS + (Param("K", SCALAR, DType.F32),)
    assert message(kernel(params=params)) == "duplicate name 'K' (first defined as a dimension)"


# ---------------------------------------------------------------------------------------------
# Kernel, parameters, gemm operands


def test_unknown_target_and_compute():
    assert message(kernel(target="sm_70")) == (
        "unknown target 'sm_70'; expected sm_80, sm_86, sm_89 or sm_90a"
    )
    verify_kernel(kernel(compute_dtype=DType.BF16))  # f16 and bf16 compute types are fine
    assert message(kernel(compute_dtype="f64")) == "compute type 'f64' is not one of f32, f16, bf16"


@pytest.mark.parametrize(
    "name, changes, expected",
    [
        ("A", dict(shape=("M",)), "tensor 'A' must have 2 dimensions [rows, cols], or 3 with a "
         "leading batch dimension [L, rows, cols], got [M]"),
        ("bias", dict(shape=("M", "N")),
         "vector 'bias' must have 1 dimension [length], or 2 with a leading batch dimension "
         "[L, length], got [M, N]"),
        ("alpha", dict(shape=("N",)), "scalar 'alpha' must have no shape, got [N]"),
        ("alpha", dict(dtype=DType.F16), "scalar 'alpha' must be f32, got f16"),
        ("A", dict(dtype="f64"), "unknown dtype 'f64'; expected f16, bf16 or f32"),
        ("A", dict(shape=("M", 0)), "dimension must be a positive integer, got 0"),
        ("A", dict(shape=("M", 2**31)), "dimension must be at most 1073741823, got 2147483648"),
        ("A", dict(shape=("M", 1.5)), "dimension must be a positive integer, got 1.5"),
        ("bias", dict(layout=Layout.COL), "only tensors have a layout; 'bias' is a vector"),
        ("bias", dict(default=1.0), "only input scalars can have a default; 'bias' is a vector"),
        ("alpha", dict(default=float("nan")),
         "default of scalar 'alpha' must be a finite f32 number, got nan"),
        ("alpha", dict(default=1e39),
         "default of scalar 'alpha' must be a finite f32 number, got 1e+39"),
    ],
)
def test_bad_params(name, changes, expected):
    assert message(kernel(params=with_param(name, **changes))) == expected


def test_operand_dtypes():
    f32 = with_param("A", dtype=DType.F32)
    f32 = tuple(replace(p, dtype=DType.F32) if p.name == "B" else p for p in f32)
    assert message(kernel(params=f32)) == (
        "dtype f32 is not supported as an MMA operand on sm_80 (use f16 or bf16)"
    )
    assert message(kernel(params=with_param("B", dtype=DType.BF16))) == (
        "operand dtypes differ: A is f16 but B is bf16"
    )
    assert message(kernel(gemms=(gemm(acc_dtype=DType.F16),))) == (
        "accumulate type f16 is not supported on sm_80 (use f32)"
    )


def test_operand_kinds():
    assert message(kernel(gemms=(gemm(a=OperandRef("bias")),))) == (
        "A operand 'bias' must be a tensor, not a vector"
    )
    assert message(kernel(gemms=(gemm(b=OperandRef("D")),))) == (
        "B operand 'D' is an output tensor; operands must be inputs"
    )
    assert message(kernel(gemms=(gemm(b=OperandRef("Bx")),))) == (
        "unknown operand 'Bx'; did you mean 'B'?"
    )


def test_inner_dimensions():
    assert message(kernel(params=with_param("B", shape=("K2", "N")))) == (
        "inner dimensions differ: A is [M, K] but B is [K2, N]"
    )


@pytest.mark.parametrize(
    "changes, expected",
    [
        (dict(tile=TileShape(0, 128, 32)), "tile M must be a positive integer, got 0"),
        (dict(tile=TileShape(128, -64, 32)), "tile N must be a positive integer, got -64"),
        (dict(warps=WarpGrid(2, 2.0)), "warps N must be a positive integer, got 2.0"),
        (dict(stages=StageCount(2**63)),
         "stages must be at most 65536, got 9223372036854775808"),
        (dict(keep=Residency.SMEM),
         "keep applies only to a gemm whose A operand is an earlier gemm"),
    ],
)
def test_bad_gemm_settings(changes, expected):
    assert message(kernel(gemms=(gemm(**changes),))) == expected


# ---------------------------------------------------------------------------------------------
# Epilogues


def only(*stmts) -> Kernel:
    return kernel(gemms=(gemm(stmts),))


@pytest.mark.parametrize(
    "stmts, expected",
    [
        ((Store("C", Acc()),), "cannot store to input tensor 'C'"),
        ((Store("D", Acc()), Store("D", Acc())), "output 'D' is written twice (first)"),
        ((Let("t", Acc()),), "output 'D' is never written"),
        ((Store("D", TensorLoad("D")),),
         "cannot read output tensor 'D'; to reuse a value, bind it to a local (t = ...) "
         "and use that"),
        ((Store("D", LocalRef("t")), Let("t", Acc())), "'t' is used before it is defined"),
        ((Store("D", LocalRef("u")),), "unknown local 'u'"),
        ((Store("D", ScalarLoad("bias")),), "'bias' is a vector, not a scalar"),
        ((Store("D", TensorLoad("nope")),), "unknown tensor 'nope'"),
        ((Store("D", VectorLoad("bias", Axis.ROW)),),
         "vector 'bias' has length N but bias[row] needs length M"),
        ((Store("D", VectorLoad("scale", Axis.COL)),),
         "vector 'scale' has length M but scale[col] needs length N"),
        ((Store("D", VectorLoad("bias", Axis.ALL)),),
         "vector 'bias' must be indexed by row or col, got <Axis.ALL: 'all'>"),
        ((Store("D", Call(Op.RELU, (Acc(), Acc()))),), "relu takes 1 argument, got 2"),
        ((Store("D", Call(Op.ADD, (Acc(),))),), "'+' takes 2 arguments, got 1"),
        ((Store("D", Call(Op.CLAMP, (Acc(),))),), "clamp takes 3 arguments, got 1"),
        ((Store("D", Const(float("inf"))),), "constant must be a finite f32 number, got inf"),
        ((Store("D", 1.0),), "not an epilogue expression: 1.0"),
        ((Store("bias", Acc()),), "cannot store to input vector 'bias'"),
        ((Store("nowhere", Acc()),), "cannot store to unknown name 'nowhere'"),
        ((Store("mma", Acc()),),
         "gemm 'mma' feeds no later gemm, so its epilogue cannot set 'mma'; "
         "store to an output instead"),
    ],
)
def test_bad_epilogues(stmts, expected):
    assert message(only(*stmts)) == expected


def test_a_tensor_load_must_have_the_output_shape():
    params = PARAMS + (Param("Ct", TENSOR, DType.F16, ("N", "M")),)
    k = kernel(params=params, gemms=(gemm((Store("D", TensorLoad("Ct")),)),))
    assert message(k) == "tensor 'Ct' has shape [N, M] but gemm 'mma' produces [M, N]"
    wide = with_param("D", shape=("M", "N2"))
    assert message(kernel(params=wide)) == (
        "tensor 'D' has shape [M, N2] but gemm 'mma' produces [M, N]"
    )


# Reductions: rowsum(acc) stored to a vector of length M.
ROWSUM = Reduce(ReduceOp.SUM, Axis.ROW, Acc())
V_OUT = Param("v", VECTOR, DType.F32, ("M",), role=Role.OUT)
S_OUT = Param("s", SCALAR, DType.F32, role=Role.OUT)


def reducing(*stmts) -> Kernel:
    return kernel(params=PARAMS + (V_OUT, S_OUT), gemms=(gemm((Store("D", Acc()),) + stmts),))


@pytest.mark.parametrize(
    "stmts, expected",
    [
        ((Store("v", Acc()), Store("s", Acc())),
         "'v' is a vector; only a reduction (rowsum, colmax, ...) can be stored to it"),
        ((Store("s", Acc()),),
         "'s' is a scalar; only a reduction (reduce_sum, reduce_max, ...) can be stored to it"),
        ((Let("t", ROWSUM),),
         "a reduction must be the whole right side of a store to a vector or scalar"),
        ((Store("v", Call(Op.NEG, (ROWSUM,))),),
         "'v' is a vector; only a reduction (rowsum, colmax, ...) can be stored to it"),
        ((Store("v", Reduce(ReduceOp.SUM, Axis.ROW, ROWSUM)),), "cannot reduce a reduction"),
        ((Store("v", Reduce(ReduceOp.MAX, Axis.COL, Acc())),),
         "colmax gives one value per column, so vector 'v' needs length N, but it has length M"),
        ((Store("v", Reduce(ReduceOp.ABSMAX, Axis.ALL, Acc())),),
         "reduce_absmax gives one value; 'v' is a vector (store it to a scalar)"),
        ((Store("s", ROWSUM),),
         "rowsum gives a vector; 's' is a scalar (use reduce_sum for one value)"),
    ],
)
def test_reductions(stmts, expected):
    assert message(reducing(*stmts)) == expected


def test_reductions_verify():
    k = reducing(Store("v", ROWSUM), Store("s", Reduce(ReduceOp.MIN, Axis.ALL, Acc())))
    verify_kernel(k)
    assert message(reducing(Store("v", ROWSUM))) == "output 's' is never written"


# ---------------------------------------------------------------------------------------------
# Chains, modules, order


def chain(g0_stmts, **g1_changes) -> Kernel:
    B1 = Param("B1", TENSOR, DType.F16, ("N", "N1"), Layout.COL)
    E = Param("E", TENSOR, DType.F16, ("M", "N1"), role=Role.OUT)
    g0 = gemm(tuple(g0_stmts), name="g0")
    g1 = gemm((Store("E", Acc()),), name="g1", a=OperandRef("g0"), b=OperandRef("B1"))
    return kernel(params=(A, B, B1, E), gemms=(g0, replace(g1, **g1_changes)))


def test_chain_mistakes():
    assert message(chain([])) == (
        "gemm 'g0' feeds gemm 'g1' but its epilogue never sets 'g0' (add e.g. 'g0 = acc')"
    )
    assert message(chain([Store("g0", Acc()), Store("g0", Acc())])) == "'g0' is set twice (first)"
    assert message(chain([], b=OperandRef("g0"), a=OperandRef("A"))) == (
        "B operand 'g0' is a gemm; only the A operand can be an earlier gemm"
    )
    assert message(chain([Store("g0", Acc())], b=OperandRef("A"))) == (
        "inner dimensions differ: A is [M, N] but B is [M, K]"
    )
    ok = chain([Store("g0", Acc())])
    reversed_order = replace(ok, gemms=ok.gemms[::-1])
    assert message(reversed_order) == (
        "A operand 'g0' is not an earlier gemm; a gemm can only use the output of a gemm "
        "defined before it"
    )


def test_modules():
    assert message_of_module(Module(())) == "<python> holds no kernel"
    twice = Module((kernel(), kernel()))
    assert message_of_module(twice) == "duplicate kernel name 'fused' (first defined)"
    with pytest.raises(KgenError, match="takes a kgen.ir.Module"):
        verify(kernel())


def message_of_module(module: Module) -> str:
    with pytest.raises(KgenError) as info:
        verify(module)
    return info.value.message


def test_first_problem_in_source_order_wins():
    # Both the param list (a duplicate) and the epilogue (an input store) are wrong; the
    # param comes first in the source, so it is the one reported.
    params = PARAMS + (replace(C, loc=SourceLoc("f.kg", 9, 1, 9, 5)),)
    stmts = (Store("C", Acc()),)
    with pytest.raises(KgenError) as info:
        verify_kernel(kernel(params=params, gemms=(gemm(stmts),)))
    assert info.value.message.startswith("duplicate name 'C'")


def test_errors_point_at_the_node():
    where = SourceLoc("f.kg", 12, 9, 12, 15)
    stmts = (Store("D", Call(Op.EXP, (Acc(), Acc()), where)),)
    with pytest.raises(KgenError) as info:
        verify_kernel(only(*stmts))
    assert info.value.loc == where


def test_deep_python_ir_is_a_message_not_a_crash():
    deep = Acc()
    for _ in range(50000):
        deep = Call(Op.NEG, (deep,))
    with pytest.raises(KgenError, match="nested too deeply"):
        verify_kernel(only(Store("D", deep)))


def test_ir_is_unchanged_by_verify():
    k = kernel()
    before = repr(k)
    verify_kernel(k)
    assert repr(k) == before and isinstance(ir.FUNCTIONS, dict)


def test_damaged_python_ir_gives_messages_only():
    """Fields of a valid kernel replaced by wrong types or absurd values: verify answers with a
    KgenError whose message renders, never with another exception."""
    import dataclasses
    import random

    rng = random.Random(7)
    weird = [None, [], ["A"], 0, -1, 1.5, float("nan"), 10**5000, "", "x", "A", "D", "M", True,
             Acc(), DType.F32, Arch.SM90A, Axis.ALL, Op.WHERE, Role.OUT, ParamKind.VECTOR,
             Layout.COL, (), ("M",), ("M", "N", "K"), Residency.SMEM, ReduceOp.SUM]

    def nodes(x, path=()):
        if isinstance(x, SourceLoc):
            return
        if dataclasses.is_dataclass(x):
            yield path, x
            for f in dataclasses.fields(x):
                yield from nodes(getattr(x, f.name), path + (f.name,))
        elif isinstance(x, tuple):
            for i, item in enumerate(x):
                yield from nodes(item, path + (i,))

    def put(x, path, value):
        if not path:
            return value
        head, rest = path[0], path[1:]
        if isinstance(x, tuple):
            return x[:head] + (put(x[head], rest, value),) + x[head + 1:]
        return replace(x, **{head: put(getattr(x, head), rest, value)})

    base = kernel()
    for _ in range(500):
        path, node = rng.choice(list(nodes(base)))
        names = [f.name for f in dataclasses.fields(node) if not f.name.endswith("loc")]
        if not names:
            continue
        damaged = put(base, path + (rng.choice(names),), rng.choice(weird))
        try:
            verify(Module((damaged,)))
        except KgenError as error:
            assert error.render("")


# ---------------------------------------------------------------------------------------------
# Warnings: accepted, located, collected (never raised)


def test_a_valid_kernel_has_no_warnings():
    assert verify(Module((kernel(),))) == []
    assert verify_kernel(kernel()) == []


def test_every_example_has_no_warnings():
    from kgen.parse import parse_file

    examples = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.kg"))
    assert examples
    for path in examples:
        assert verify(parse_file(path)) == [], path.name


def test_an_unused_local_is_a_located_warning():
    loc = SourceLoc("k.kg", 9, 7, 9, 18)
    stmts = (*STMTS, Let("spare", Call(Op.EXP, (Acc(),)), loc))
    (warning,) = verify(Module((kernel(gemms=(gemm(stmts),)),)))
    assert isinstance(warning, KgenWarning)
    assert warning.loc == loc
    assert warning.message == "local 'spare' is never used; it is not computed"
    assert str(warning) == "k.kg:9:7: warning: local 'spare' is never used; it is not computed"


def test_a_local_used_only_by_unused_locals_is_warned_too():
    stmts = (
        Let("t", Call(Op.MUL, (Acc(), Acc()))),
        Let("u", Call(Op.ADD, (LocalRef("t"), LocalRef("t")))),
        Let("v", Call(Op.EXP, (LocalRef("t"),))),
        Store("D", Acc()),
    )
    warnings = verify_kernel(kernel(gemms=(gemm(stmts),)))
    assert [w.message for w in warnings] == [
        "local 't' is used only by 'u', 'v', which no store uses; it is not computed",
        "local 'u' is never used; it is not computed",
        "local 'v' is never used; it is not computed",
    ]


def test_locals_a_store_reads_through_other_locals_are_not_warned():
    stmts = (
        Let("t", Call(Op.MUL, (Acc(), Acc()))),
        Let("u", Call(Op.ADD, (LocalRef("t"), Const(1.0)))),
        Store("D", LocalRef("u")),
    )
    assert verify_kernel(kernel(gemms=(gemm(stmts),))) == []


DSL = """kernel k {
  target sm_80
  tensor A : f16[M, K] row
  tensor B0 : f16[K, 64] col
  tensor B1 : f16[64, N] col
  tensor D : f16[M, N] row out
  vector stats : f32[M] out
  gemm g0 = A @ B0 {
    tile 128x64x32 warps 4x1 stages 3
    epilogue {
      s = acc * 2
      g0 = s
      unused = s + 1
    }
  }
  gemm g1 = g0 @ B1 {
    tile 128x64x32 warps 4x1 stages 3
    epilogue {
      e = exp(acc)
      stats = rowsum(e)
      D = acc
    }
  }
}
"""


def test_warnings_from_the_dsl_render_like_errors():
    """Locals read by a chained gemm's own store and by a reduction are used; the CLI shows a
    warning as `file:line:col: warning: message`, the line and a caret, as it shows errors."""
    from kgen.parse import parse

    (warning,) = verify(parse(DSL, "k.kg"))
    assert warning.render(DSL) == (
        "k.kg:13:7: warning: local 'unused' is never used; it is not computed\n"
        "        unused = s + 1\n"
        "        ^~~~~~~~~~~~~~"
    )
