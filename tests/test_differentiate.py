"""kgen/differentiate.py: the derivative of an expression in a local, against float64 autograd of
the same expression (each op, and compositions), simplified where a factor is 0 or 1; the
backward's transposition; DSL text that parses back to the same expression; located refusals."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.differentiate import derivative, dsl_text, transposed
from kgen.errors import KgenError
from kgen.parse import parse

torch = pytest.importorskip("torch")

SCORE = ir.LocalRef("score")


def _parse_mod(text: str) -> ir.Expr:
    """`text` as the epilogue of a tiny kernel binds it (score, a scalar c, a vector w[row])."""
    program = f"""kernel k {{
  target sm_80
  tensor X : f32[M, N] row
  tensor C : f32[M, N] row out
  vector w : f32[M]
  scalar c : f32 = 0
  epilogue {{
    score = X
    m = {text}
    C = m
  }}
}}
"""
    kernel = parse(program, "mod").kernels[0]
    return next(s.value for s in kernel.epilogue.stmts if getattr(s, "name", "") == "m")


OPS = {ir.Op.ADD: torch.add, ir.Op.SUB: torch.sub, ir.Op.MUL: torch.mul, ir.Op.DIV: torch.div,
       ir.Op.NEG: torch.neg, ir.Op.EXP: torch.exp, ir.Op.LOG: torch.log, ir.Op.SQRT: torch.sqrt,
       ir.Op.RSQRT: torch.rsqrt, ir.Op.TANH: torch.tanh, ir.Op.SIGMOID: torch.sigmoid,
       ir.Op.ABS: torch.abs, ir.Op.RELU: torch.relu,
       ir.Op.SILU: torch.nn.functional.silu, ir.Op.HARDSWISH: torch.nn.functional.hardswish,
       ir.Op.MIN: torch.minimum, ir.Op.MAX: torch.maximum,
       ir.Op.LEAKY_RELU: lambda x, s: torch.where(x > 0, x, s * x),
       ir.Op.CLAMP: lambda x, lo, hi: torch.clamp(x, lo, hi),
       ir.Op.LT: lambda a, b: (a < b).double(), ir.Op.LE: lambda a, b: (a <= b).double(),
       ir.Op.GT: lambda a, b: (a > b).double(), ir.Op.GE: lambda a, b: (a >= b).double(),
       ir.Op.EQ: lambda a, b: (a == b).double(), ir.Op.NE: lambda a, b: (a != b).double(),
       ir.Op.WHERE: lambda c, a, b: torch.where(c != 0, a, b)}


def _evaluate(e, x, env):
    if isinstance(e, ir.LocalRef):
        return x
    if isinstance(e, ir.Const):
        return torch.full_like(x, float(e.value))
    if isinstance(e, (ir.ScalarLoad, ir.VectorLoad, ir.Position)):
        return env[getattr(e, "name", None) or e.axis.value]
    if isinstance(e, ir.Cast):
        return _evaluate(e.arg, x, env)
    args = [_evaluate(a, x, env) for a in e.args]
    if e.op in (ir.Op.CLAMP, ir.Op.LEAKY_RELU):
        return OPS[e.op](args[0], *(a for a in args[1:]))
    return OPS[e.op](*args)


MODS = ["score", "c * tanh(score / c)", "score - w[row] * (row - c)", "score * score - 3",
        "exp(score) / (1 + exp(score))", "log(score * score + 1)", "sqrt(abs(score) + 1)",
        "rsqrt(score * score + 2)", "sigmoid(score) * silu(score)", "relu(score - 0.5)",
        "leaky_relu(score, 0.1)", "clamp(score, -0.5, c)", "min(score, c) + max(score, -c)",
        "where(score > 0, score * 2, score / 3)", "hardswish(score * 4)",
        "cast<bf16>(score) * 2", "where(row > c, score, w[row])", "abs(score) * (score < 1)"]


@pytest.mark.parametrize("text", MODS)
def test_the_derivative_matches_float64_autograd(text):
    expr = _parse_mod(text)
    slope = derivative(expr, "score")
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(400, generator=gen, dtype=torch.float64) * 2).requires_grad_()
    env = {"c": torch.full((400,), 1.5, dtype=torch.float64),
           "w": torch.rand(400, generator=gen, dtype=torch.float64),
           "row": torch.arange(400, dtype=torch.float64) % 7}
    _evaluate(expr, x, env).sum().backward()
    got = _evaluate(slope, x.detach(), env)
    torch.testing.assert_close(got, x.grad, rtol=1e-9, atol=1e-9)


def test_constant_factors_simplify_away():
    assert derivative(_parse_mod("score"), "score") == ir.Const(1.0)
    assert derivative(_parse_mod("score - w[row] * (row - c)"), "score") == ir.Const(1.0)
    assert derivative(_parse_mod("w[row] * row + c"), "score") == ir.Const(0.0)
    assert dsl_text(derivative(_parse_mod("score * 2 + 1"), "score")) == "2.0"


@pytest.mark.parametrize("text", MODS)
def test_dsl_text_parses_back_to_the_expression(text):
    expr = _parse_mod(text)
    for e in (expr, derivative(expr, "score")):
        again = _parse_mod(dsl_text(e))
        assert dsl_text(again) == dsl_text(e)
        assert dsl_text(_parse_mod(dsl_text(e, bare=True))) == dsl_text(e)


def test_the_backward_reads_row_and_col_swapped():
    expr = _parse_mod("score - w[row] * (row - c)")
    assert dsl_text(transposed(expr)) == "(score - (w[col] * (col - c)))"


@pytest.mark.parametrize("text, name, span", [
    ("score + gelu(score)", "gelu()", (9, 20)),
    ("gelu_tanh(score) * 2", "gelu_tanh()", (1, 17)),
])
def test_an_op_without_a_derivative_is_refused_where_it_is(text, name, span):
    expr = _parse_mod(text)
    with pytest.raises(KgenError) as err:
        derivative(expr, "score")
    assert f"{name} is not differentiable by kgen" in err.value.message
    # the mod starts at column 9 of its line (`    m = `)
    assert (err.value.loc.col - 8, err.value.loc.end_col - 8) == span


def test_a_clamp_bound_that_depends_on_the_score_is_refused():
    with pytest.raises(KgenError, match="clamp\\(\\)'s bounds must not depend on 'score'"):
        derivative(_parse_mod("clamp(c, score, 3)"), "score")


def test_a_factor_over_itself_cancels():
    """softcap's derivative is 1 - tanh(score / cap)^2: no multiply by cap and 1 / cap."""
    slope = derivative(_parse_mod("c * tanh(score / c)"), "score")
    assert dsl_text(slope) == "(1.0 - (tanh((score / c)) * tanh((score / c))))"
    slope = derivative(_parse_mod("c * (score / (c * 2))"), "score")
    assert dsl_text(slope) == "0.5"
