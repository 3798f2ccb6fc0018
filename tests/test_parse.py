"""The DSL front end: the examples, every operator, precedence, layout of the text, locations."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen import ir
from kgen.errors import KgenError, SourceLoc
from kgen.ir import (
    Acc,
    Arch,
    Axis,
    Call,
    Cast,
    Const,
    DType,
    Layout,
    LocalRef,
    Op,
    ParamKind,
    Reduce,
    ReduceOp,
    Residency,
    Role,
    ScalarLoad,
    TensorLoad,
    VectorLoad,
)
from kgen.parse import parse, parse_file
from kgen.verify import REDUCTIONS, verify

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def position(text: str, needle: str, nth: int = 0) -> tuple[int, int]:
    """(line, col) of the nth occurrence of needle, both counted from 1."""
    index = -1
    for _ in range(nth + 1):
        index = text.index(needle, index + 1)
    line = text.count("\n", 0, index) + 1
    col = index - (text.rfind("\n", 0, index) + 1) + 1
    return line, col


def span(text: str, needle: str, nth: int = 0) -> tuple[int, int, int, int]:
    line, col = position(text, needle, nth)
    return line, col, line, col + len(needle)


def loc_tuple(loc: SourceLoc) -> tuple[int, int, int, int]:
    return loc.line, loc.col, loc.end_line, loc.end_col


KERNEL = """\
kernel k {{
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor C : f16[M, N]
  tensor D : f32[M, N] out
  vector v : f32[N]
  vector u : f32[M]
  scalar a : f32
  scalar b : f32
  scalar c : f32
  gemm g = A @ B {{
    tile 128x128x32 warps 2x2 stages 3
    epilogue {{
      {body}
    }}
  }}
}}
"""


def stmts_of(body: str) -> tuple[ir.Stmt, ...]:
    return parse(KERNEL.format(body=body)).kernels[0].gemms[0].epilogue.stmts


def expr_of(text: str) -> ir.Expr:
    (store,) = stmts_of(f"D = {text}")
    assert isinstance(store, ir.Store) and store.target == "D"
    return store.value


a, b, c = ScalarLoad("a"), ScalarLoad("b"), ScalarLoad("c")


# ---------------------------------------------------------------------------------------------
# The examples


def test_gemm_example():
    module = parse_file(EXAMPLES / "gemm.kg")
    verify(module)
    assert module.file == str(EXAMPLES / "gemm.kg")
    (kernel,) = module.kernels
    assert kernel.name == "gemm_bf16"
    assert kernel.target is Arch.SM80
    assert kernel.compute_dtype is DType.F32
    A, B, D = kernel.params
    assert (A.name, A.kind, A.dtype, A.shape, A.layout, A.role) == (
        "A", ParamKind.TENSOR, DType.BF16, ("M", "K"), Layout.ROW, Role.IN,
    )
    assert (B.shape, B.layout, B.role) == (("K", "N"), Layout.COL, Role.IN)
    assert (D.dtype, D.shape, D.layout, D.role) == (DType.BF16, ("M", "N"), Layout.ROW, Role.OUT)
    (gemm,) = kernel.gemms
    assert (gemm.name, gemm.a.name, gemm.b.name, gemm.acc_dtype) == ("mma0", "A", "B", DType.F32)
    assert (gemm.tile.m, gemm.tile.n, gemm.tile.k) == (128, 256, 64)
    assert (gemm.warps.m, gemm.warps.n, gemm.stages.count) == (2, 4, 3)
    assert gemm.keep is None
    assert gemm.epilogue.stmts == (ir.Store("D", Acc()),)


def test_gemm_bias_relu_example():
    path = EXAMPLES / "gemm_bias_relu.kg"
    text = path.read_text()
    module = parse_file(path)
    verify(module)
    (kernel,) = module.kernels
    assert kernel.name == "gemm_bias_relu"
    params = {p.name: p for p in kernel.params}
    assert [p.name for p in kernel.params] == ["A", "B", "C", "D", "bias", "alpha", "beta"]
    assert params["A"].dtype is params["B"].dtype is params["C"].dtype is DType.F16
    assert params["C"].role is Role.IN and params["D"].role is Role.OUT
    assert (params["bias"].kind, params["bias"].dtype, params["bias"].shape) == (
        ParamKind.VECTOR, DType.F32, ("N",),
    )
    assert params["alpha"].default == 1.5 and params["beta"].default == 0.5
    assert params["alpha"].shape == ()

    (store,) = kernel.gemms[0].epilogue.stmts
    expected = Call(Op.RELU, (
        Call(Op.ADD, (
            Call(Op.ADD, (
                Call(Op.MUL, (ScalarLoad("alpha"), Acc())),
                Call(Op.MUL, (ScalarLoad("beta"), TensorLoad("C"))),
            )),
            VectorLoad("bias", Axis.COL),
        )),
    ))
    assert store == ir.Store("D", expected)

    # Locations point at the user's text.
    statement = "D = relu(alpha * acc + beta * C + bias[col])"
    assert loc_tuple(store.loc) == span(text, statement)
    assert store.loc.file == str(path)
    bias_load = store.value.args[0].args[1]
    assert loc_tuple(bias_load.loc) == span(text, "bias[col]")
    alpha_load = store.value.args[0].args[0].args[0].args[0]
    line, col = position(text, "alpha * acc")
    assert loc_tuple(alpha_load.loc) == (line, col, line, col + len("alpha"))
    assert loc_tuple(params["bias"].loc) == span(text, "vector bias : f32[N]")
    assert loc_tuple(kernel.target_loc) == span(text, "target sm_80")
    gemm = kernel.gemms[0]
    assert loc_tuple(gemm.tile.loc) == span(text, "tile 128x256x64")
    line, col = position(text, "mma0 = A @ B")
    assert loc_tuple(gemm.a.loc) == (line, col + 7, line, col + 8)
    assert loc_tuple(gemm.b.loc) == (line, col + 11, line, col + 12)
    assert position(text, "gemm mma0") == (gemm.loc.line, gemm.loc.col)
    assert position(text, "kernel gemm_bias_relu") == (kernel.loc.line, kernel.loc.col)


def test_gemm_gelu_rowscale_example():
    module = parse_file(EXAMPLES / "gemm_gelu_rowscale.kg")
    verify(module)
    (kernel,) = module.kernels
    params = {p.name: p for p in kernel.params}
    assert params["scale"].shape == ("M",) and params["scale"].kind is ParamKind.VECTOR
    assert params["D"].dtype is DType.BF16
    (store,) = kernel.gemms[0].epilogue.stmts
    assert store == ir.Store(
        "D", Call(Op.GELU, (Call(Op.MUL, (Acc(), VectorLoad("scale", Axis.ROW))),))
    )


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("*.kg")), ids=lambda p: p.name)
def test_examples_start_with_a_comment(path):
    lines = path.read_text().splitlines()
    assert lines[0].startswith("# ") and lines[1].startswith("# ")


# ---------------------------------------------------------------------------------------------
# Expressions


def _spelled(op: Op) -> str:
    names = ["a", "b", "c"][: op.arity]
    if op is Op.NEG:
        return "-a"
    if op.spelling.isidentifier():
        return f"{op.spelling}({', '.join(names)})"
    return f"a {op.spelling} b"


@pytest.mark.parametrize("op", list(Op), ids=lambda op: op.name)
def test_every_op_parses(op):
    expected = Call(op, (a, b, c)[: op.arity])
    assert expr_of(_spelled(op)) == expected


@pytest.mark.parametrize("name", sorted(REDUCTIONS))
def test_every_reduction_parses(name):
    op, axis = REDUCTIONS[name]
    assert expr_of(f"{name}(acc * a)") == Reduce(op, axis, Call(Op.MUL, (Acc(), a)))


def test_reduction_spellings():
    assert REDUCTIONS["rowsum"] == (ReduceOp.SUM, Axis.ROW)
    assert REDUCTIONS["colabsmax"] == (ReduceOp.ABSMAX, Axis.COL)
    assert REDUCTIONS["reduce_max"] == (ReduceOp.MAX, Axis.ALL)
    # max with two arguments is the element-wise maximum, not a reduction
    assert expr_of("max(a, b)") == Call(Op.MAX, (a, b))


def test_loads_and_leaves():
    assert expr_of("acc") == Acc()
    assert expr_of("C") == TensorLoad("C")
    assert expr_of("a") == ScalarLoad("a")
    assert expr_of("v[col]") == VectorLoad("v", Axis.COL)
    assert expr_of("u[row]") == VectorLoad("u", Axis.ROW)
    assert expr_of("cast<bf16>(acc)") == Cast(DType.BF16, Acc())
    assert expr_of("2") == Const(2.0)
    assert isinstance(expr_of("2").value, float)


@pytest.mark.parametrize(
    "text, value",
    [("1", 1.0), ("1.5", 1.5), ("1e-3", 1e-3), (".5", 0.5), ("2.", 2.0), ("3E2", 300.0)],
)
def test_number_forms(text, value):
    assert expr_of(text) == Const(value)


def test_unary_minus():
    # A minus on a number literal folds into the constant; on anything else it is Op.NEG.
    assert expr_of("-2") == Const(-2.0)
    assert expr_of("-(2)") == Const(-2.0)
    assert expr_of("-acc") == Call(Op.NEG, (Acc(),))
    assert expr_of("--a") == Call(Op.NEG, (Call(Op.NEG, (a,)),))
    assert expr_of("a - -1") == Call(Op.SUB, (a, Const(-1.0)))


@pytest.mark.parametrize(
    "text, expected",
    [
        ("a + b * c", Call(Op.ADD, (a, Call(Op.MUL, (b, c))))),
        ("a * b + c", Call(Op.ADD, (Call(Op.MUL, (a, b)), c))),
        ("(a + b) * c", Call(Op.MUL, (Call(Op.ADD, (a, b)), c))),
        ("a - b - c", Call(Op.SUB, (Call(Op.SUB, (a, b)), c))),
        ("a / b / c", Call(Op.DIV, (Call(Op.DIV, (a, b)), c))),
        ("a - b + c", Call(Op.ADD, (Call(Op.SUB, (a, b)), c))),
        ("-a * b", Call(Op.MUL, (Call(Op.NEG, (a,)), b))),
        ("a * -b", Call(Op.MUL, (a, Call(Op.NEG, (b,))))),
        ("a < b + c", Call(Op.LT, (a, Call(Op.ADD, (b, c))))),
        ("a * b >= c", Call(Op.GE, (Call(Op.MUL, (a, b)), c))),
        ("(a < b) == c", Call(Op.EQ, (Call(Op.LT, (a, b)), c))),
        (
            "where(a > 0, a, 0.1 * a)",
            Call(Op.WHERE, (Call(Op.GT, (a, Const(0.0))), a, Call(Op.MUL, (Const(0.1), a)))),
        ),
    ],
)
def test_precedence(text, expected):
    assert expr_of(text) == expected


# ---------------------------------------------------------------------------------------------
# Statements, layout of the text, comments


def test_let_and_local_refs():
    let, store = stmts_of("t = acc * a; D = relu(t) + t")
    assert let == ir.Let("t", Call(Op.MUL, (Acc(), a)))
    assert store == ir.Store("D", Call(Op.ADD, (Call(Op.RELU, (LocalRef("t"),)), LocalRef("t"))))


def test_statements_by_newline_and_semicolon():
    body = "t = acc\n      t2 = t * 2;;   t3 = t2\n\n      D = t3"
    stmts = stmts_of(body)
    assert [type(s).__name__ for s in stmts] == ["Let", "Let", "Let", "Store"]
    assert [s.loc.line for s in stmts] == [15, 16, 16, 18]


def test_expression_continues_across_lines():
    inside_parens = stmts_of("D = relu(acc +\n  a\n  )")
    after_operator = stmts_of("D = acc +\n        a")
    assert inside_parens[0].value == Call(Op.RELU, (Call(Op.ADD, (Acc(), a)),))
    assert after_operator[0].value == Call(Op.ADD, (Acc(), a))


def test_layout_and_comments_do_not_change_the_ir():
    compact = KERNEL.format(body="D = acc")
    spread = (
        "# leading comment\n"
        + compact.replace(
            "tile 128x128x32 warps 2x2 stages 3",
            "stages 3  # depth\n tile 128 x 128 x 32\n warps 2x2",
        )
        .replace("  target sm_80\n", "  target   sm_80   # arch\n\n")
        .replace("epilogue {\n", "epilogue {   # start\n\n")
        + "# trailing comment"
    )
    assert parse(spread).kernels == parse(compact).kernels
    assert parse(compact.replace("\n", "\r\n")).kernels == parse(compact).kernels


def test_one_line_kernel():
    text = (
        "kernel k { target sm_90a tensor A : f16[M, K] tensor B : f16[K, N] col "
        "tensor D : f16[M, N] out gemm g = A @ B { warps 2x2 tile 64x64x32 stages 2 "
        "epilogue { D = acc } } }"
    )
    module = parse(text)
    verify(module)
    assert module.kernels[0].target is Arch.SM90A


def test_multiple_kernels():
    one = KERNEL.format(body="D = acc")
    two = one.replace("kernel k", "kernel k2").replace("target sm_80", "target sm_89")
    module = parse(one + "\n# the second one\n" + two, "two.kg")
    verify(module)
    assert [k.name for k in module.kernels] == ["k", "k2"]
    assert module.kernels[1].target is Arch.SM89
    assert module.kernels[1].loc.line == one.count("\n") + 3
    assert module.file == "two.kg"


def test_param_options():
    text = """\
kernel k {
  target sm_86
  compute f32
  tensor A : bf16[M, 64] col in
  tensor D : f32[M, N] out row
  vector s : f16[N] out
  scalar x : f32 = -2.5
  scalar y : f32 = +3
  scalar z : f32
}
"""
    A, D, s, x, y, z = parse(text).kernels[0].params
    assert (A.shape, A.layout, A.role) == (("M", 64), Layout.COL, Role.IN)
    assert (D.layout, D.role) == (Layout.ROW, Role.OUT)
    assert (s.kind, s.role, s.layout) == (ParamKind.VECTOR, Role.OUT, Layout.ROW)
    assert (x.default, y.default, z.default) == (-2.5, 3.0, None)
    assert isinstance(A.shape[1], int)


def test_chain_with_keep():
    text = """\
kernel b2b {
  target sm_80
  tensor A : f16[M, K0]
  tensor B0 : f16[K0, N0] col
  tensor B1 : f16[N0, N1] col
  tensor D : f16[M, N1] out
  vector bias0 : f32[N0]
  gemm g0 = A @ B0 {
    tile 128x64x32 warps 4x1 stages 3
    epilogue { g0 = relu(acc + bias0[col]) }
  }
  gemm g1 = g0 @ B1 accumulate f32 {
    tile 128x128x32 warps 4x1 stages 3
    keep g0 in smem
    epilogue { D = relu(acc) }
  }
}
"""
    module = parse(text)
    verify(module)
    g0, g1 = module.kernels[0].gemms
    assert g0.keep is None and g1.keep is Residency.SMEM
    assert g1.a == ir.OperandRef("g0") and g1.b == ir.OperandRef("B1")
    assert g0.epilogue.stmts[0] == ir.Store(
        "g0", Call(Op.RELU, (Call(Op.ADD, (Acc(), VectorLoad("bias0", Axis.COL))),))
    )
    short = parse(text.replace("keep g0 in smem", "keep registers"))
    assert short.kernels[0].gemms[1].keep is Residency.REGISTERS


def test_accumulate_defaults_to_f32():
    gemm = parse(KERNEL.format(body="D = acc")).kernels[0].gemms[0]
    assert gemm.acc_dtype is DType.F32


def test_identifiers_may_contain_keywords_and_x():
    # `x`, `tensorA` and `tile_size` are plain names; the shape lexer only works after tile/warps.
    body = "x = acc; tensorA = x * 2; tile_size = tensorA; D = tile_size - x"
    stmts = stmts_of(body)
    assert [s.name for s in stmts[:3]] == ["x", "tensorA", "tile_size"]
    assert stmts[3].value == Call(Op.SUB, (LocalRef("tile_size"), LocalRef("x")))


def test_locations_of_small_nodes():
    text = KERNEL.format(body="D = acc * -a")
    store = parse(text, "t.kg").kernels[0].gemms[0].epilogue.stmts[0]
    assert store.loc == SourceLoc("t.kg", 15, 7, 15, 19)
    mul = store.value
    assert loc_tuple(mul.loc) == (15, 11, 15, 19)
    assert loc_tuple(mul.args[0].loc) == (15, 11, 15, 14)  # acc
    assert loc_tuple(mul.args[1].loc) == (15, 17, 15, 19)  # -a
    assert loc_tuple(mul.args[1].args[0].loc) == (15, 18, 15, 19)  # a


def test_parse_file_problems(tmp_path):
    missing = tmp_path / "missing.kg"
    with pytest.raises(KgenError, match="cannot read .*missing.kg"):
        parse_file(missing)
    binary = tmp_path / "binary.kg"
    binary.write_bytes(b"kernel k {\n  target \xff\n}\n")
    with pytest.raises(KgenError) as info:
        parse_file(binary)
    assert info.value.render().startswith(f"{binary}:2:10: error: {binary} is not UTF-8 text")
    bom = tmp_path / "bom.kg"
    bom.write_bytes(b"\xef\xbb\xbf" + KERNEL.format(body="D = acc").encode())
    assert parse_file(bom).kernels[0].name == "k"


def test_deep_nesting_is_a_message_not_a_crash():
    deep = KERNEL.format(body="D = " + " + ".join(["acc"] * 20000))
    with pytest.raises(KgenError, match="nested too deeply"):
        parse(deep)


def test_reduction_mode():
    text = (
        "kernel k {\n  target sm_80\n  reductions deterministic\n"
        "  tensor A : f16[M, K] row\n  tensor B : f16[K, N] col\n  vector s : f32[N] out\n"
        "  gemm g = A @ B accumulate f32 {\n    tile 128x128x64 warps 2x2 stages 3\n"
        "    epilogue { s = colsum(acc) }\n  }\n}\n"
    )
    (kernel,) = parse(text, "k.kg").kernels
    assert kernel.deterministic is True
    (plain,) = parse(text.replace("  reductions deterministic\n", ""), "k.kg").kernels
    assert plain.deterministic is False
    with pytest.raises(KgenError, match="unknown reduction mode 'often'; expected atomic or deterministic"):
        parse(text.replace("deterministic", "often"), "k.kg")


# ---------------------------------------------------------------------------------------------
# Tile programs: loops, carries, K^T, gemm +=, kernel epilogues, row/col/inf as values

PROGRAMS = Path(__file__).resolve().parent.parent / "examples"


def test_attention_program():
    text = (PROGRAMS / "attention_fwd.kg").read_text()
    kernel = parse(text, "a.kg").kernels[0]
    assert kernel.gemms == ()
    q, k, v, o, lse, scale = kernel.params
    assert (q.batch, q.heads, q.shape) == ("B", "H", ("S", 128))
    assert (k.batch, k.heads, k.shape) == ("B", "HKV", ("T", 128))
    assert (lse.kind, lse.batch, lse.heads, lse.shape) == (ParamKind.VECTOR, "B", "H", ("S",))
    assert q.full_shape == ("B", "H", "S", 128)
    loop = kernel.loop
    assert (loop.name, loop.dim) == ("kv", "T")
    assert loop.tile == ir.BlockShape(128, 64) and loop.warps == ir.WarpGrid(8, 1)
    assert loop.stages == ir.StageCount(2)
    assert loop.carries == (ir.Carry("m", DType.F32, float("-inf")), ir.Carry("l", DType.F32, 0.0))
    s, acc_o = loop.gemms
    assert s.a == ir.OperandRef("Q") and s.b == ir.OperandRef("K", transposed=True)
    assert not s.accumulate and acc_o.accumulate
    assert acc_o.a == ir.OperandRef("s") and acc_o.epilogue.stmts == ()
    kinds = [type(stmt).__name__ for stmt in s.epilogue.stmts]
    assert kinds == ["Let", "Let", "Let", "Store", "Let", "Update", "Update", "Update"]
    x = s.epilogue.stmts[0].value
    assert x == Call(Op.WHERE, (Call(Op.LE, (ir.Position(Axis.COL), ir.Position(Axis.ROW))),
                                Call(Op.MUL, (ScalarLoad("scale"), Acc())), Const(float("-inf"))))
    m_new = s.epilogue.stmts[1].value
    assert m_new == Call(Op.MAX, (LocalRef("m"), Reduce(ReduceOp.MAX, Axis.ROW, LocalRef("x"))))
    l_update = s.epilogue.stmts[5]
    assert l_update.value.args[1] == Reduce(ReduceOp.SUM, Axis.ROW, LocalRef("s"))
    assert s.epilogue.stmts[6] == ir.Update("o", Call(Op.MUL, (LocalRef("o"), LocalRef("r"))))
    out_o, out_lse = kernel.epilogue.stmts
    assert out_o.target == "O" and out_lse.target == "lse"
    assert out_o.value.args[2] == Call(Op.DIV, (LocalRef("o"), LocalRef("l")))
    # locations: the loop, a carry, the transposed operand, a position, the kernel epilogue
    assert position(text, "loop kv") == (loop.loc.line, loop.loc.col)
    assert loc_tuple(loop.carries[0].loc)[:2] == position(text, "carry m")
    assert loc_tuple(s.b.loc) == span(text, "K^T")
    line, col = position(text, "col <= row")
    assert loc_tuple(x.args[0].args[0].loc) == (line, col, line, col + 3)
    assert loc_tuple(x.args[2].loc) == span(text, "-inf", 1)
    line = text.splitlines().index("  epilogue {") + 1
    assert (kernel.epilogue.loc.line, kernel.epilogue.loc.col) == (line, 3)


def test_mlp_and_row_kernel_programs():
    mlp = parse_file(PROGRAMS / "mlp_loop.kg").kernels[0]
    h, y = mlp.loop.gemms
    assert (mlp.loop.name, mlp.loop.dim, mlp.loop.carries) == ("j", "N0", ())
    assert mlp.loop.tile is None and mlp.loop.warps is None and mlp.loop.stages is None
    assert h.epilogue.stmts == (ir.Store("h", Call(Op.GELU, (Call(Op.ADD, (
        Acc(), VectorLoad("b0", Axis.COL))),))),)
    assert y.accumulate and mlp.epilogue.stmts == (ir.Store("Y", LocalRef("y")),)
    row = parse_file(PROGRAMS / "attention_bwd_dot.kg").kernels[0]
    assert row.gemms == () and row.loop is None
    (store,) = row.epilogue.stmts
    assert store == ir.Store("D", Reduce(ReduceOp.SUM, Axis.ROW, Call(Op.MUL, (
        Cast(DType.F32, TensorLoad("dO")), TensorLoad("O")))))


LOOP = """\
kernel k {{
  target sm_80
  tensor A : f16[M, 64] row
  tensor B : f16[64, T] col
  tensor C : f16[T, 32] row
  tensor D : f32[M, 32] out
  {extra}
  loop i over T {{
    {loop_lines}
    gemm g = A @ B {{ epilogue {{
      {body}
    }} }}
    gemm o += g @ C
  }}
  epilogue {{ D = o }}
}}
"""


def loop_kernel(body="g = acc", loop_lines="", extra="") -> ir.Kernel:
    return parse(LOOP.format(body=body, loop_lines=loop_lines, extra=extra)).kernels[0]


def test_scale_sugar_is_an_update_of_a_product():
    kernel = loop_kernel("g = acc\n      o *= 2")
    assert kernel.loop.gemms[0].epilogue.stmts[1] == ir.Update(
        "o", Call(Op.MUL, (LocalRef("o"), Const(2.0))))
    assert kernel.loop.gemms[0].epilogue.stmts == loop_kernel(
        "g = acc\n      o = o * 2").loop.gemms[0].epilogue.stmts


@pytest.mark.parametrize("lines, warps", [("warps 4", (4, 1)), ("warps 4x1", (4, 1)),
                                          ("warps 8 x 1", (8, 1)), ("warps 2x2", (2, 2))])
def test_loop_warps_spellings(lines, warps):
    grid = loop_kernel(loop_lines=lines).loop.warps
    assert (grid.m, grid.n) == warps


def test_inf_and_positions_as_values():
    stmts = loop_kernel("t = -inf + inf * row - col\n      g = acc + t").loop.gemms[0]
    value = stmts.epilogue.stmts[0].value
    assert value == Call(Op.SUB, (Call(Op.ADD, (Const(float("-inf")), Call(Op.MUL, (
        Const(float("inf")), ir.Position(Axis.ROW))))), ir.Position(Axis.COL)))
    # --inf folds too; `inf` named by a parameter stays that parameter
    assert loop_kernel("g = --inf").loop.gemms[0].epilogue.stmts[0].value == Const(float("inf"))
    named = loop_kernel("g = -inf", extra="scalar inf : f32").loop.gemms[0]
    assert named.epilogue.stmts[0].value == Call(Op.NEG, (ScalarLoad("inf"),))


def test_gemm_kernels_parse_as_before():
    """The new fields stay at their defaults in a gemm kernel: same IR as before."""
    kernel = parse(KERNEL.format(body="D = acc")).kernels[0]
    assert kernel.loop is None and kernel.epilogue is None
    assert all(p.heads is None for p in kernel.params)
    g = kernel.gemms[0]
    assert not g.accumulate and not g.a.transposed and not g.b.transposed


@pytest.mark.parametrize("text, message", [
    (LOOP.format(body="g = acc", loop_lines="carry m : f32[row]", extra=""),
     "<string>:9:5: error: carry 'm' needs an initial value, e.g. 'carry m : f32[row] = 0'"),
    (LOOP.format(body="g = acc", loop_lines="carry m : f32[col] = 0", extra=""),
     "<string>:9:19: error: a carry holds one value per row: write f32[row], not f32[col]"),
    (LOOP.format(body="g = acc", loop_lines="carry m : f32[row] = nan", extra=""),
     "<string>:9:26: error: a carry starts at a number, inf or -inf, not 'nan'"),
    (LOOP.format(body="g = acc", loop_lines="carry m : f32[row] = 1e999", extra=""),
     "<string>:9:26: error: initial value 1e999 does not fit in f32"),
    (LOOP.format(body="g = acc", loop_lines="tile 128x64x32", extra=""),
     "<string>:9:10: error: tile needs two sizes MxN (rows x block), got 128x64x32"),
    (LOOP.format(body="g = acc", loop_lines="tile 128x64 tile 64x64", extra=""),
     "<string>:9:17: error: tile given twice in loop 'i' (first at line 9)"),
    (LOOP.format(body="g = acc", loop_lines="", extra="").replace("@ B {", "@ B^X {"),
     "<string>:10:20: error: '^' after an operand takes T (the transpose, as in B^T), not 'X'"),
    (LOOP.format(body="g = acc\n      t *= 2", loop_lines="", extra=""),
     "<string>:12:7: error: 't *= ...' rescales a carried value (a loop's carry or "
     "accumulator); 't' is not one: write 't = ...'"),
    (LOOP.format(body="g = acc", loop_lines="", extra="").replace(
        "  loop i", "  epilogue { D = 1 }\n  loop i").replace("  epilogue { D = o }\n", ""),
     "<string>:8:3: error: the kernel's epilogue runs after loop 'i' at line 9: write it "
     "below the loop"),
    (LOOP.format(body="g = acc", loop_lines="", extra="").replace(
        "  epilogue { D = o }", "  loop j over T { }"),
     "<string>:15:3: error: a kernel holds one loop (the first is 'i' at line 8)"),
    (LOOP.format(body="g = acc", loop_lines="", extra="").replace(
        "gemm g = A @ B {", "gemm g = A @ B"),
     "<string>:10:20: error: expected a loop item (tile, warps, stages, blocks, carry or gemm) or '}', "
     "found 'epilogue'"),
])
def test_loop_parse_errors(text, message):
    with pytest.raises(KgenError) as info:
        parse(text)
    assert str(info.value) == message


def test_language_doc_shows_the_tile_programs():
    """docs/language.md, section 15, shows the three programs of examples (without their
    comments), and each parses and verifies."""
    doc = (Path(__file__).resolve().parent.parent / "docs" / "language.md").read_text()
    section = doc[doc.index("## 15. Tile programs"):]
    blocks = section.split("```")[1::2]
    shown = {parse(block).kernels[0].name: block for block in blocks if block.strip()}
    checked = []
    for path in sorted(PROGRAMS.glob("*.kg")):
        code = "\n".join(line for line in path.read_text().splitlines()
                         if not line.startswith("#"))
        kernel = parse(code).kernels[0]
        if kernel.loop is None and (kernel.gemms or kernel.epilogue is None):
            continue  # a gemm kernel (or a storage declaration): not a tile program
        name = kernel.name
        checked.append(name)
        assert shown[name].strip() == code.strip(), name
        assert verify(parse(shown[name])) == []
    assert sorted(checked) == ["attention_bwd", "attention_bwd_dot", "attention_bwd_storage",
                               "attention_bwd_varlen", "attention_fwd", "attention_fwd_varlen",
                               "attention_fwd_window", "mlp_loop"]
