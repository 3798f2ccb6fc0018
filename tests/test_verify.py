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
from kgen.parse import parse
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
        ("A", dict(dtype="f64"), "unknown dtype 'f64'; expected f16, bf16, f32, f8e4m3 or f8e5m2"),
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


# ---------------------------------------------------------------------------------------------
# Tile programs: the programs of examples with one line changed, each mistake named


PROGRAMS = Path(__file__).resolve().parent.parent / "examples"
TILE_PROGRAMS = {name: (PROGRAMS / f"{name}.kg").read_text()
                 for name in ("attention_fwd", "mlp_loop", "attention_bwd_dot")}


def test_tile_programs_verify_without_warnings():
    from kgen.parse import parse

    for name, text in TILE_PROGRAMS.items():
        assert verify(parse(text, f"{name}.kg")) == [], name


TILE_CASES = [
    ('attention_fwd',
     'gemm o += s @ V accumulate f32',
     'gemm o += s @ V^T accumulate f32',
     "p.kg:29:19: error: only a score gemm's B operand can be transposed for now; declare 'V' "
     "with T rows (the other layout, row or col, if its memory is the transpose)"),
    ('attention_fwd',
     'm = m_new',
     'm = acc * 2',
     "p.kg:26:9: error: m is one value per row; `acc * 2` is one value per element of s's tile"),
    ('attention_fwd',
     'lse = where(l == 0, -inf, m + log(l))',
     'lse = o / l',
     "p.kg:33:5: error: lse is one value per row; `o / l` is one value per element of o's [S, "
     '128] tile'),
    ('attention_fwd',
     'o = o * r',
     'o = o + 1',
     "p.kg:25:9: error: 'o' is an accumulator (gemm o +=): it can only be rescaled by a row "
     "value, as in 'o = o * r'"),
    ('attention_fwd',
     'o = o * r',
     'o = o * acc',
     "p.kg:25:17: error: 'o' can only be rescaled by one value per row; `acc` is one value per "
     "element of s's tile"),
    ('attention_fwd',
     'o = o * r',
     'o = o * o',
     "p.kg:25:9: error: 'o' is an accumulator (gemm o +=): it can only be rescaled by a row "
     "value, as in 'o = o * r'"),
    ('attention_fwd',
     'r = exp(m - m_use)',
     'r = exp(m - m_use) + o',
     "p.kg:23:30: error: 'o' is the accumulator of gemm o +=: in the loop it can only be "
     "rescaled ('o = o * r'); read it in the kernel's epilogue, after the loop"),
    ('attention_fwd',
     'm_new = max(m, rowmax(x))',
     'm_new = max(m, colmax(x))',
     'p.kg:20:24: error: colmax: column and whole-tile reductions are not supported inside a '
     'loop for now; row reductions (rowmax) are'),
    ('attention_fwd',
     'm_new = max(m, rowmax(x))',
     'm_new = max(m, reduce_max(x))',
     'p.kg:20:24: error: reduce_max: column and whole-tile reductions are not supported inside a '
     'loop for now; row reductions (rowmax) are'),
    ('attention_fwd',
     'm_new = max(m, rowmax(x))',
     'm_new = max(m, rowmax(m))',
     'p.kg:20:24: error: rowmax reduces the elements of a row, but `m` is already one value per '
     'row'),
    ('attention_fwd',
     'gemm s = Q @ K^T accumulate f32 {',
     'gemm s = Q @ K^T accumulate f32 {\n      tile 128x64x32',
     "p.kg:18:7: error: gemm 's' is in loop 'kv': its tile line goes on the loop (loop kv over T "
     '{ tile 128x64  warps 8  stages 2 ... })'),
    ('attention_fwd',
     'gemm s = Q @ K^T accumulate f32 {',
     'gemm s = Q @ K^T accumulate f32 {\n      stages 3',
     "p.kg:18:7: error: gemm 's' is in loop 'kv': its stages line goes on the loop (loop kv over "
     'T { tile 128x64  warps 8  stages 2 ... })'),
    ('attention_fwd',
     'gemm o += s @ V accumulate f32',
     'gemm o += s @ V accumulate f32 { split 2 }',
     "p.kg:29:38: error: gemm 'o' is in loop 'kv': its split line goes on the loop (loop kv over "
     'T { tile 128x64  warps 8  stages 2 ... })'),
    ('attention_fwd',
     'tensor V : bf16[B, HKV, T, 128] row',
     'tensor V : f16[B, HKV, T, 128] row',
     'p.kg:29:19: error: operand dtypes differ: Q is bf16 but V is f16'),
    ('attention_fwd',
     'tile 128x64  warps 8  stages 2',
     'tile 128x64  warps 4  stages 2',
     "p.kg:14:18: error: warps 4 cover 64 rows (16 each) but the loop's tile has 128"),
    ('attention_fwd',
     'tile 128x64  warps 8  stages 2',
     'tile 96x64',
     "p.kg:14:5: error: a loop's tile M (rows per CTA) must be 64, 128 or 192, got 96"),
    ('attention_fwd',
     'tile 128x64  warps 8  stages 2',
     'tile 128x48',
     "p.kg:14:5: error: a loop's tile N (its block of T) must be 32 or a multiple of 16 from "
     "64 to 256, got 48"),
    ('attention_fwd',
     'tile 128x64  warps 8  stages 2',
     'warps 8x2',
     "p.kg:14:5: error: a loop's warps run along its rows only: write warps 8 (or 8x1), not 8x2"),
    ('attention_fwd',
     'tile 128x64  warps 8  stages 2',
     'warps 2',
     "p.kg:14:5: error: a loop's warps must be 4, 8 or 12 (16 rows each), got 2"),
    ('attention_fwd',
     'tile 128x64  warps 8  stages 2',
     'stages 4',
     "p.kg:14:5: error: a loop's stages must be 1 to 3, got 4"),
    ('attention_fwd',
     'carry l : f32[row] = 0',
     'carry l : f16[row] = 0',
     "p.kg:16:5: error: carry 'l' is f16; carries are f32"),
    ('attention_fwd',
     'Q @ K^T',
     'Q @ K',
     'p.kg:17:18: error: inner dimensions differ: Q is [S, 128] but K is [T, 128]'),
    ('attention_fwd',
     'Q @ K^T',
     'Q^T @ K^T',
     "p.kg:17:14: error: only a B operand can be transposed; the A operand 'Q' holds the "
     "kernel's rows"),
    ('attention_fwd',
     'loop kv over T',
     'loop kv over Z',
     "p.kg:13:3: error: loop 'kv' runs over 'Z', which is not a dimension of any parameter"),
    ('attention_fwd',
     'l = l * r + rowsum(s)',
     'l = l * r + rowsum(s)\n        O = s',
     "p.kg:25:9: error: gemm 's' runs once per block of loop 'kv': store outputs in the kernel's "
     'epilogue, after the loop (epilogue { O = ... })'),
    ('attention_fwd',
     'O = where(l == 0, 0, o / l)',
     'O = where(l == 0, 0, acc / l)',
     "p.kg:32:26: error: after the loop, an accumulator is read by its name ('o'); acc is a "
     "gemm's own accumulator"),
    ('attention_fwd',
     'O = where(l == 0, 0, o / l)',
     'O = where(l == 0, 0, o / l)\n    m = 1',
     "p.kg:33:5: error: the loop is over: 'm' cannot be updated after it; bind a local instead "
     "(e.g. 'm_final = ...')"),
    ('attention_fwd',
     'O = where(l == 0, 0, o / l)',
     'O = where(l == 0, 0, o / rowsum(o))',
     "p.kg:32:30: error: rowsum after the loop is not supported for now; reduce in the loop's "
     'first gemm and carry the result'),
    ('attention_fwd',
     'vector lse : f32[B, H, S] out',
     'vector lse : f32[B, S] out',
     "p.kg:10:3: error: vector 'lse' has a batch dimension but no heads dimension, and 'Q' has "
     'heads H; declare it f32[B, H, S]'),
    ('attention_fwd',
     'tensor O : bf16[B, H, S, 128] row out',
     'tensor O : bf16[B, HKV, S, 128] row out',
     "p.kg:9:3: error: output 'O' has heads HKV but the kernel runs over the heads H of 'Q' at "
     'line 6'),
    ('attention_fwd',
     'tensor Q : bf16[B, H, S, 128] row',
     'tensor Q : bf16[B, S, 128] row',
     "p.kg:7:3: error: tensor 'K' has a heads dimension but 'Q', whose rows the kernel computes, "
     'has none'),
    ('attention_fwd',
     'l = l * r + rowsum(s)',
     'l = l * r + rowsum(s) + col',
     'p.kg:24:9: error: l is one value per row; `l * r + rowsum(s) + col` is one value per '
     "element of s's tile"),
    ('attention_fwd',
     's = exp(x - m_use)',
     't = exp(x - m_use)',
     "p.kg:24:28: error: 's' is read before gemm 's' sets it in its epilogue ('s = ...')"),
    ('attention_fwd',
     'x = where(col <= row, scale * acc, -inf)',
     'x = where(col <= row, scale * acc, -inf) + s',
     "p.kg:19:52: error: 's' is read before gemm 's' sets it in its epilogue ('s = ...')"),
    ('attention_fwd',
     'gemm o += s @ V accumulate f32',
     'gemm o += s @ V accumulate f16',
     "p.kg:29:5: error: gemm 'o' accumulates in f16; a loop's gemms accumulate in f32"),
    ('attention_fwd',
     'gemm o += s @ V accumulate f32',
     'gemm o += Q @ V accumulate f32',
     "p.kg:29:15: error: the accumulating gemm 'o' of loop 'kv' multiplies a tile value of an "
     "earlier score gemm's epilogue: write 'gemm o += s @ ...'"),
    ('attention_fwd',
     'gemm s = Q',
     'gemm s += Q',
     "p.kg:17:5: error: the first gemm of loop 'kv' computes a new tile each block: write 'gemm "
     "s = ...' (the gemms after it may accumulate, +=)"),
    ('attention_fwd',
     'tensor V : bf16[B, HKV, T, 128] row',
     'tensor V : bf16[B, HKV, S, 128] row',
     "p.kg:29:19: error: loop 'kv' runs over T, so the B operand of gemm 'o' needs T rows; V is "
     '[S, 128]'),
    ('attention_fwd',
     'kernel attention_fwd {',
     'kernel attention_fwd {\n  compute f16',
     "p.kg:4:1: error: loop and row kernels compute in f32; kernel 'attention_fwd' asks for "
     'compute f16'),
    ('attention_fwd',
     'x = where(col <= row, scale * acc, -inf)',
     'x = where(col <= row, scale * acc, -inf) + lse[row]',
     "p.kg:19:52: error: cannot read output vector 'lse'; to reuse a value, bind it to a local "
     '(t = ...) and use that'),
    ('mlp_loop',
     'tensor W1 : bf16[N0, 128] col',
     'tensor W1 : bf16[N0, N1] col',
     "p.kg:13:19: error: N1, the columns of 'W1' (the n of gemm 'y') must be a compile-time size "
     "(a multiple of 16 up to 256), got 'N1'"),
    ('mlp_loop',
     'tensor W1 : bf16[N0, 128] col',
     'tensor W1 : bf16[N0, 136] col',
     "p.kg:13:19: error: N1, the columns of 'W1' (the n of gemm 'y') must be a multiple of 16 up "
     'to 256, got 136'),
    ('mlp_loop',
     'tensor W1 : bf16[N0, 128] col',
     'tensor W1 : bf16[N0, 512] col',
     "p.kg:13:19: error: N1, the columns of 'W1' (the n of gemm 'y') must be a multiple of 16 up "
     'to 256, got 512'),
    ('mlp_loop',
     'tensor X : bf16[M, 256] row\n  tensor W0 : bf16[256, N0] col',
     'tensor X : bf16[M, K] row\n  tensor W0 : bf16[K, N0] col',
     "p.kg:12:14: error: K0, the columns of 'X' (the k of gemm 'h') must be a compile-time size "
     "(a multiple of 16 up to 256), got 'K'"),
    ('mlp_loop',
     'tensor Y : bf16[M, 128] row out',
     'tensor Y : bf16[M, 64] row out',
     "p.kg:15:14: error: tensor 'Y' has shape [M, 64] but the kernel's epilogue computes [M, 128]"),
    ('mlp_loop',
     'h = gelu(acc + b0[col])',
     'h = gelu(acc + b0[row])',
     "p.kg:12:64: error: vector 'b0' has length N0 but b0[row] needs length M"),
    ('mlp_loop',
     'h = gelu(acc + b0[col])',
     'h = gelu(acc + X)',
     "p.kg:12:64: error: tensor 'X' has shape [M, 256] but gemm 'h' reads it at (row, col) "
     'of [M, N0]'),
    ('mlp_loop',
     'Y = y',
     'Y = y + b0[col]',
     "p.kg:15:22: error: vector 'b0' has length N0 but b0[col] needs length 128"),
    ('mlp_loop',
     'Y = y',
     'Y = y\n    Y = y',
     "p.kg:16:5: error: output 'Y' is written twice (first at line 15)"),
    ('mlp_loop',
     '  epilogue { Y = y }\n',
     '',
     "p.kg:9:3: error: output 'Y' is never written"),
    ('mlp_loop',
     'loop j over N0 {',
     'gemm g = X @ W0 { epilogue { Y = acc } }\n  loop j over N0 {',
     "p.kg:11:3: error: gemm 'g' is outside loop 'j': a loop kernel's gemms are in its loop"),
    ('mlp_loop',
     'gemm y += h @ W1 accumulate f32\n',
     '',
     "p.kg:14:18: error: unknown name 'y'"),
    ('attention_bwd_dot',
     'D = rowsum(cast<f32>(dO) * O)',
     'D = cast<f32>(dO) * O',
     'p.kg:8:14: error: D is one value per row; `cast<f32>(dO) * O` is one value per element of '
     'the [S, 128] tile'),
    ('attention_bwd_dot',
     'D = rowsum(cast<f32>(dO) * O)',
     'D = colsum(dO)',
     'p.kg:8:18: error: colsum: column and whole-tile reductions are not supported in a row '
     'kernel for now; row reductions (rowsum) are'),
    ('attention_bwd_dot',
     'D = rowsum(cast<f32>(dO) * O)',
     'D = rowsum(dO * O) + acc',
     'p.kg:8:35: error: a row kernel has no gemm, so no acc; read its tensors by name'),
    ('attention_bwd_dot',
     'D = rowsum(cast<f32>(dO) * O)',
     'm = rowsum(dO)\n  m = m',
     "p.kg:9:3: error: duplicate name 'm' (first defined at line 8 as a local)"),
    ('attention_bwd_dot',
     'tensor O : bf16[B, H, S, 128] row',
     'tensor O : bf16[B, H, S, 64] row',
     "p.kg:8:41: error: tensor 'O' has shape [S, 64] but the row kernel works on [S, 128]"),
    ('attention_bwd_dot',
     'kernel attention_bwd_dot {',
     'kernel attention_bwd_dot {\n  schedule pingpong',
     "p.kg:4:3: error: a schedule line applies to gemm kernels; kernel 'attention_bwd_dot' is a "
     'row kernel'),
    ('attention_bwd_dot',
     'tensor dO : bf16[B, H, S, 128] row\n  tensor O : bf16[B, H, S, 128] row\n',
     '',
     "p.kg:6:35: error: unknown name 'dO'"),
]


@pytest.mark.parametrize("program, old, new, message", TILE_CASES,
                         ids=[f"tile{i}" for i in range(len(TILE_CASES))])
def test_tile_program_mistakes(program, old, new, message):
    from kgen.parse import parse

    text = TILE_PROGRAMS[program]
    assert old in text
    with pytest.raises(KgenError) as info:
        verify(parse(text.replace(old, new, 1), "p.kg"))
    assert str(info.value) == message


def test_unused_carry_and_local_warnings():
    from kgen.parse import parse

    text = TILE_PROGRAMS["attention_fwd"].replace(
        "carry l : f32[row] = 0",
        "carry l : f32[row] = 0\n    carry peak : f32[row] = -inf\n    carry echo : f32[row] = 0")
    text = text.replace("m = m_new", "m = m_new\n        peak = max(peak, m_new)\n"
                                     "        echo = echo + peak\n        unused = m_new")
    warnings = verify(parse(text, "w.kg"))
    assert [str(w) for w in warnings] == [
        "w.kg:31:9: warning: local 'unused' is never used; it is not computed",
        "w.kg:17:5: warning: carry 'peak' is never read (no output depends on it); its updates "
        "are not computed",
        "w.kg:18:5: warning: carry 'echo' is never read (no output depends on it); its updates "
        "are not computed",
    ]
    # A carry that an output reads through another carry is live.
    live = text.replace("lse = where(l == 0, -inf, m + log(l))",
                        "lse = where(l == 0, -inf, m + log(l)) + echo")
    assert [str(w) for w in verify(parse(live, "w.kg"))] == [
        "w.kg:31:9: warning: local 'unused' is never used; it is not computed"]


def _loop_kernel(**changes) -> Kernel:
    """The looped MLP built in Python, with fields replaced."""
    x = Param("X", TENSOR, DType.BF16, ("M", 64))
    w0 = Param("W0", TENSOR, DType.BF16, (64, "N0"), Layout.COL)
    w1 = Param("W1", TENSOR, DType.BF16, ("N0", 32), Layout.COL)
    y = Param("Y", TENSOR, DType.F32, ("M", 32), role=Role.OUT)
    h = Gemm("h", OperandRef("X"), OperandRef("W0"), DType.F32, None, None, None,
             Epilogue((Store("h", Acc()),)))
    acc = Gemm("y", OperandRef("h"), OperandRef("W1"), DType.F32, None, None, None,
               Epilogue(()), accumulate=True)
    loop = ir.Loop("j", "N0", (ir.Carry("m", DType.F32, 0.0),), (h, acc))
    fields = dict(params=(x, w0, w1, y), loop=loop,
                  epilogue=Epilogue((Store("Y", Call(Op.MUL, (LocalRef("y"), LocalRef("m")))),)))
    fields.update(changes)
    return Kernel("k", Arch.SM80, fields.pop("params"), (), **fields)


def test_python_loop_kernel_verifies():
    assert verify_kernel(_loop_kernel()) == []


def _with_loop(**changes) -> Kernel:
    return _loop_kernel(loop=replace(_loop_kernel().loop, **changes))


@pytest.mark.parametrize("kernel, message", [
    (lambda: _with_loop(carries=(ir.Carry("m", DType.F32, float("nan")),)),
     "carry 'm' starts at nan; it must start at an f32 number, inf or -inf"),
    (lambda: _with_loop(dim=7), "loop 'j' runs over 7, which is not a dimension of any parameter"),
    (lambda: _with_loop(gemms=_loop_kernel().loop.gemms[:1]),
     "loop 'j' must hold a score gemm 'gemm s = A @ B { epilogue { s = ... } }' then gemms that "
     "use its values, e.g. 'gemm o += s @ C'; it holds 1"),
    (lambda: _with_loop(tile=ir.BlockShape(64, 64), warps=WarpGrid(8, 1)),
     "warps 8 cover 128 rows (16 each) but the loop's tile has 64"),
    (lambda: _with_loop(gemms=(replace(_loop_kernel().loop.gemms[0], epilogue=Epilogue((
        Store("h", Acc()), ir.Update("q", Const(1.0))))), _loop_kernel().loop.gemms[1])),
     "unknown carry 'q'"),
    (lambda: _with_loop(gemms=(replace(_loop_kernel().loop.gemms[0], epilogue=Epilogue((
        Store("h", Acc()), ir.Update("m", ir.Position(Axis.COL))))),
        _loop_kernel().loop.gemms[1])),
     "m is one value per row; `col` is one value per element of h's tile"),
    (lambda: _loop_kernel(params=(*_loop_kernel().params,
                                  Param("Z", TENSOR, DType.BF16, ("M", 32), heads="H"))),
     "tensor 'Z' has a heads dimension but no batch one; heads come after the batch: [B, H, ...]"),
    (lambda: _loop_kernel(epilogue=Epilogue((Store("Y", Const(float("nan"))),))),
     "constant must be an f32 number, inf or -inf, got nan"),
])
def test_python_loop_kernel_mistakes(kernel, message):
    with pytest.raises(KgenError) as info:
        verify_kernel(kernel())
    assert info.value.message == message


def test_gqa_heads_must_divide_when_fixed():
    from kgen.parse import parse

    text = TILE_PROGRAMS["attention_fwd"].replace("H, S", "6, S").replace("HKV", "4")
    with pytest.raises(KgenError) as info:
        verify(parse(text, "g.kg"))
    assert str(info.value) == ("g.kg:7:3: error: 'Q' has 6 heads, not a multiple of the 4 heads "
                               "of 'K' (each of its heads serves heads / its heads query heads)")
    assert verify(parse(text.replace("[B, 4,", "[B, 3,"), "g.kg")) == []


@pytest.mark.parametrize("body, message", [
    ("D = acc * row", "'row' as a value is supported in loop and row kernels only for now; in a "
                      "gemm's epilogue it indexes a vector (bias[row])"),
    ("D = acc + inf", "constant must be a finite f32 number, got inf"),
])
def test_gemm_kernels_refuse_tile_values(body, message):
    kernel = one_gemm_kernel(body)
    with pytest.raises(KgenError) as info:
        verify_kernel(kernel)
    assert info.value.message == message


def one_gemm_kernel(body: str) -> Kernel:
    from kgen.parse import parse

    text = ("kernel k { target sm_80 tensor A : f16[M, K] row tensor B : f16[K, N] col "
            f"tensor D : f16[M, N] out gemm g = A @ B {{ epilogue {{ {body} }} }} }}")
    return parse(text).kernels[0]


def test_gemm_kernels_refuse_loop_only_constructs():
    base = one_gemm_kernel("D = acc")
    g = base.gemms[0]
    cases = [
        (replace(base, gemms=(replace(g, b=OperandRef("B", transposed=True)),)),
         "a transposed operand (B^T) is supported inside a loop only for now; outside one, "
         "declare 'B' with the other layout (row or col)"),
        (replace(base, gemms=(replace(g, accumulate=True),)),
         "gemm 'g' accumulates (+=), which only a loop's accumulating gemms do; write "
         "'gemm g = ...'"),
        (replace(base, epilogue=Epilogue((Store("D", Const(1.0)),))),
         "a kernel's own epilogue follows a loop, or is the whole body of a row kernel (no "
         "gemm); kernel 'k' has gemms: put these statements in the epilogue of gemm 'g'"),
    ]
    for kernel, message in cases:
        with pytest.raises(KgenError) as info:
            verify_kernel(kernel)
        assert info.value.message == message


# ---------------------------------------------------------------------------------------------
# u64 scalars and random(seed, offset)

RANDOM_KERNEL = """kernel rng {
  target sm_80
  tensor X : f32[B, H, S, 64] row
  tensor U : f32[B, H, S, 64] row out
  scalar seed : u64
  scalar offset : u64
  scalar w : f32 = 1
  epilogue {
    U = EXPR
  }
}
"""


@pytest.mark.parametrize("expr, message", [
    ("random(seed, offset) + X", None),
    ("random(seed, offset) * w[head]", "'w' is a scalar; only vectors take an index"),
    ("X + seed", "r.kg:9:13: error: 'seed' is a u64 scalar: it keys random(seed, offset) and "
                 "is not a value"),
    ("random(seed, w)", "r.kg:9:9: error: random(seed, offset) takes u64 scalars; 'w' is a "
                        "f32 scalar"),
    ("random(seed)", "r.kg:9:9: error: random takes 2 arguments"),
    ("random(seed, X)", "r.kg:9:22: error: random(seed, offset) takes two u64 scalars by name"),
    ("random(seed, offset) + X * head + batch", None),
])
def test_random_and_u64_scalars(expr, message):
    text = RANDOM_KERNEL.replace("EXPR", expr)
    if message is None:
        verify(parse(text, "r.kg"))
        return
    with pytest.raises(KgenError) as err:
        verify(parse(text, "r.kg"))
    assert message in str(err.value), str(err.value)


def test_u64_scalars_belong_to_tile_programs():
    text = """kernel g {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] row
  tensor C : f16[M, N] row out
  scalar seed : u64
  gemm c = A @ B accumulate f32 {
    epilogue { C = acc }
  }
}
"""
    with pytest.raises(KgenError) as err:
        verify(parse(text, "g.kg"))
    assert "g.kg:6:3: error: u64 scalar 'seed' keys random(seed, offset)" in str(err.value)
    with pytest.raises(KgenError) as err:
        verify(parse(RANDOM_KERNEL.replace("EXPR", "X").replace(
            "scalar offset : u64", "scalar offset : u64 = 3"), "r.kg"))
    assert "u64 scalar 'offset' has no default" in str(err.value)
