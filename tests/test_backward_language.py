"""The attention backward's language (docs/language.md, "The backward"; issue 52): the program
of examples/attention_bwd.kg parsed to its IR, each misuse refused at its place, the NumPy
reference (kgen/reference_tiles.py) against a direct float64 attention backward, and the back
end's one refusal (no skeleton runs a loop of five gemms yet)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.reference import evaluate
from kgen.verify import verify

ROOT = Path(__file__).resolve().parent.parent
PROGRAM = ROOT / "examples" / "attention_bwd.kg"
TEXT = PROGRAM.read_text()
CAUSAL = "pt = where(row <= col, exp(scale * acc - lse[col]), 0)"


def kernel_of(text: str) -> ir.Kernel:
    module = parse(text, "b.kg")
    assert verify(module) == []
    return module.kernels[0]


# ---------------------------------------------------------------------------------------------
# Parse: the IR the back end will read


def test_the_backward_parses_to_five_gemms_in_statement_order():
    k = kernel_of(TEXT)
    names = [(g.name, g.a.name, g.a.transposed, g.b.name, g.b.transposed, g.accumulate)
             for g in k.loop.gemms]
    assert names == [("st", "K", False, "Q", True, False),
                     ("dv", "pt", False, "dO", False, True),
                     ("dpt", "V", False, "dO", True, False),
                     ("dk", "dst", False, "Q", False, True),
                     ("dq", "dst", True, "K", False, False)]
    assert k.param("dQ").accumulate and k.param("dQ").role is ir.Role.OUT
    assert not any(p.accumulate for p in k.params if p.name != "dQ")
    (add,) = k.loop.gemms[4].epilogue.stmts
    assert add == ir.Store("dQ", ir.Call(ir.Op.MUL, (ir.ScalarLoad("scale"), ir.Acc())),
                           accumulate=True)
    # `pt`, bound in st's epilogue, is read in dpt's
    (ds,) = k.loop.gemms[2].epilogue.stmts
    assert ds.value.args[0] == ir.LocalRef("pt")
    assert [type(s) for s in k.epilogue.stmts] == [ir.Store, ir.Store]


@pytest.mark.parametrize("old, new, message", [
    ("f32[B, H, S, 128] out accumulate", "f32[B, H, S, 128] out accumulate accumulate",
     "b.kg:13:48: error: 'dQ' is already marked 'accumulate'"),
    ("dQ += scale * acc", "dqq += scale * acc",
     "b.kg:29:18: error: 'dqq += ...' adds into an output tensor declared 'out accumulate'; "
     "'dqq' is not a parameter"),
    ("dQ += scale * acc", "dQ += scale * acc + dq",
     "b.kg:29:38: error: 'dq' is a loop-row tile (gemm dq = dst^T @ K): it lies at the loop's "
     "rows, so only its own epilogue reads it, as acc, to add it into an 'out accumulate' tensor "
     "(dq's epilogue: 'dQ += acc')"),
])
def test_parse_refuses(old, new, message):
    assert old in TEXT
    with pytest.raises(KgenError) as info:
        parse(TEXT.replace(old, new, 1), "b.kg")
    assert str(info.value) == message


def test_the_language_doc_shows_this_program():
    doc = (ROOT / "docs" / "language.md").read_text()
    section = doc[doc.index("### The backward: several gemms"):]
    code = "\n".join(line for line in TEXT.splitlines() if not line.startswith("#"))
    assert section.split("```")[1].strip() == code.strip()


# ---------------------------------------------------------------------------------------------
# Verify: each misuse, located


MISTAKES = [
    # a loop-row tile read anywhere but its += store
    ("dK = scale * dk", "dK = scale * dk + dq",
     "b.kg:33:23: error: 'dq' is a loop-row tile (gemm dq = dst^T @ K): it lies at the loop's "
     "rows, so only its own epilogue reads it, as acc, to add it into an 'out accumulate' tensor "
     "(dq's epilogue: 'dQ += acc')"),
    ("dQ += scale * acc", "dq = scale * acc",
     "b.kg:29:18: error: gemm 'dq' is a loop-row gemm: its epilogue only adds its tile into an "
     "'out accumulate' tensor ('dQ += acc'), and cannot store 'dq'"),
    # += into a tensor not declared out accumulate, and = into one that is
    ("tensor dQ : f32[B, H, S, 128] out accumulate", "tensor dQ : f32[B, H, S, 128] out",
     "b.kg:29:18: error: 'dQ += ...' adds into an output tensor declared 'out accumulate'; 'dQ' "
     "is not one (tensor 'dQ' at line 13)"),
    ("dQ += scale * acc", "dQ = scale * acc",
     "b.kg:29:18: error: gemm 'dq' is a loop-row gemm: its epilogue only adds its tile into an "
     "'out accumulate' tensor ('dQ += acc'), and cannot store 'dQ'"),
    ("dV = dv", "dV = dv\n    dQ = dk",
     "b.kg:35:5: error: 'dQ' is declared 'out accumulate': the kernel adds into it, 'dQ += "
     "...', in the epilogue of a loop-row gemm ('gemm dq = ds^T @ K')"),
    ("dV = dv", "dV += dv",
     "b.kg:34:5: error: 'dV += ...' adds a loop-row tile into an 'out accumulate' tensor: only "
     "in a loop-row gemm's epilogue ('gemm dq = ds^T @ K { epilogue { dV += acc } }'), not in "
     "the kernel's epilogue"),
    ("tensor dQ : f32[B, H, S, 128] out accumulate", "tensor dQ : f32[B, H, S, 128] accumulate",
     "b.kg:13:3: error: 'accumulate' marks an output tensor of a loop kernel that the kernel "
     "adds into ('tensor dQ : ... out accumulate', then 'dQ += acc' in a loop-row gemm's "
     "epilogue); tensor 'dQ' is an input"),
    ("vector D : f32[B, H, S]", "vector D : f32[B, H, S] out accumulate",
     "b.kg:12:3: error: 'accumulate' marks an output tensor of a loop kernel that the kernel "
     "adds into ('tensor D : ... out accumulate', then 'D += acc' in a loop-row gemm's "
     "epilogue); vector 'D' is not one"),
    # an accumulating gemm reading a value not yet bound, or not a tile value
    ("gemm dv += pt @ dO accumulate f32", "gemm dv += dst @ dO accumulate f32",
     "b.kg:23:16: error: 'dst' is not bound yet: gemm 'dv' reads it before gemm 'dpt' at line 24 "
     "binds it; the loop's statements run in order"),
    ("gemm dv += pt @ dO accumulate f32", "gemm dv += ptt @ dO accumulate f32",
     "b.kg:23:16: error: unknown operand 'ptt': the A operand of gemm 'dv' is a tile value of an "
     "earlier score gemm's epilogue; did you mean 'pt'?"),
    ("gemm dv += pt @ dO accumulate f32", "gemm dv += pt^T @ dO accumulate f32",
     "b.kg:23:16: error: the A operand of accumulating gemm 'dv' is a tile value as it is, "
     "[rows, block]; 'pt^T' is its transpose (a loop-row gemm's A: 'gemm x = pt^T @ ...')"),
    ("gemm dv += pt @ dO accumulate f32", "gemm dv += dq @ dO accumulate f32",
     "b.kg:23:16: error: 'dq' is a loop-row tile (gemm dq = dst^T @ K): it lies at the loop's "
     "rows, so only its own epilogue reads it, as acc, to add it into an 'out accumulate' tensor "
     "(dq's epilogue: 'dQ += acc')"),
    # a transposed value as B, a value as B
    ("gemm dk += dst @ Q accumulate f32", "gemm dk += pt @ dst^T accumulate f32",
     "b.kg:27:21: error: 'dst' is a tile value: it can only be a gemm's A operand (from "
     "registers); the B operand of gemm 'dk' is a tensor"),
    # a loop-row gemm: A a value transposed, B [rows, N]
    ("gemm dq = dst^T @ K accumulate f32", "gemm dq = dst @ K accumulate f32",
     "b.kg:28:15: error: gemm 'dq' multiplies tile value 'dst' [rows, block] without "
     "accumulating: write 'gemm dq += dst @ ...' (an accumulator), or 'gemm dq = dst^T @ ...' (a "
     "loop-row tile, added into an 'out accumulate' tensor)"),
    ("gemm dq = dst^T @ K accumulate f32", "gemm dq = dst^T @ Q accumulate f32",
     "b.kg:28:23: error: 'dst^T' is [S, T] (the loop's block by the kernel's rows), so the B "
     "operand of gemm 'dq' is the kernel's rows of a tensor like 'K', [B, H, T, N]; 'Q' is "
     "[B, H, S, 128]"),
    ("gemm dq = dst^T @ K accumulate f32", "gemm dq = dst^T @ K^T accumulate f32",
     "b.kg:28:23: error: the B operand of loop-row gemm 'dq' is loop-invariant [T, N] as "
     "declared; it cannot be transposed for now"),
    # shapes that do not match
    ("tensor dQ : f32[B, H, S, 128] out accumulate", "tensor dQ : f32[B, H, T, 128] out accumulate",
     "b.kg:29:18: error: tensor 'dQ' has shape [T, 128] but gemm 'dq' adds a [S, 128] tile at "
     "the loop's rows"),
    ("tensor V : bf16[B, H, T, 128] row", "tensor V : bf16[B, H, S, 128] row",
     "b.kg:24:16: error: every score gemm of loop 'q' computes the kernel's rows: 'V' is [B, H, "
     "S, 128] but 'K' (gemm A of the first) is [B, H, T, 128]"),
    ("tensor dO : bf16[B, H, S, 128] row", "tensor dO : bf16[B, H, S, 64] row",
     "b.kg:24:20: error: inner dimensions differ: V is [T, 128] but dO^T is [64, S]"),
    ("gemm dk += dst @ Q accumulate f32", "gemm dk += dst @ K accumulate f32",
     "b.kg:27:22: error: loop 'q' runs over S, so the B operand of gemm 'dk' needs S rows; K is "
     "[T, 128]"),
    ("tensor dO : bf16[B, H, S, 128] row", "tensor dO : f16[B, H, S, 128] row",
     "b.kg:23:21: error: operand dtypes differ: K is bf16 but dO is f16"),
    # values of one epilogue where another tile is computed
    ("dQ += scale * acc", "dQ += scale * acc * pt",
     "b.kg:29:38: error: 'pt' is a value of gemm 'st''s [T, S] tile; gemm 'dq''s epilogue works "
     "on its [S, 128] tile at the loop's rows"),
    ("dV = dv", "dV = dv * pt",
     "b.kg:34:15: error: 'pt' is a value of gemm 'st' in the loop; after it, read the "
     "accumulators and carries"),
    ("dQ += scale * acc", "dQ += scale * rowsum(acc)",
     "b.kg:29:32: error: rowsum in a loop-row gemm's epilogue is not supported for now; it only "
     "adds its tile into an 'out accumulate' tensor"),
    ("dst = pt * (acc - D[col])", "dst = pt * (acc - D[row])",
     "b.kg:25:36: error: vector 'D' has length S but D[row] needs length T"),
]


@pytest.mark.parametrize("old, new, message", MISTAKES,
                         ids=[f"mistake{i}" for i in range(len(MISTAKES))])
def test_verify_refuses(old, new, message):
    assert old in TEXT
    with pytest.raises(KgenError) as info:
        verify(parse(TEXT.replace(old, new, 1), "b.kg"))
    assert str(info.value) == message


def test_a_row_value_is_no_operand():
    text = TEXT.replace(CAUSAL, "r = scale * 2; " + CAUSAL).replace("gemm dv += pt @",
                                                                      "gemm dv += r @")
    with pytest.raises(KgenError) as info:
        verify(parse(text, "b.kg"))
    assert str(info.value) == ("b.kg:23:16: error: the A operand of gemm 'dv' is a tile value; "
                               "'r' is one value per row")


# D_v != D: V, dO and dV at 64 columns, Q, K, dK and dQ at 128 (dv's accumulator [T, 64], dk's
# [T, 128])
NARROW_V = (TEXT.replace("V : bf16[B, H, T, 128]", "V : bf16[B, H, T, 64]")
            .replace("dO : bf16[B, H, S, 128]", "dO : bf16[B, H, S, 64]")
            .replace("dV : bf16[B, H, T, 128]", "dV : bf16[B, H, T, 64]"))


def test_accumulators_of_different_widths_each_store_their_own():
    """dv [T, 64] and dk [T, 128]: each statement after the loop works on the accumulators of
    one N (a local reading none goes with its readers); the groups come in the accumulators'
    order."""
    from kgen.verify.loop_gemms import after_loop_groups

    k = kernel_of(NARROW_V)
    assert [int(p.shape[1]) for p in (k.param("dV"), k.param("dK"))] == [64, 128]
    text = NARROW_V.replace("    dK = scale * dk\n", "    two = scale * 2\n    dK = two * dk\n")
    k = kernel_of(text)
    groups = after_loop_groups(k.epilogue.stmts, {"dv": 64, "dk": 128},
                               {p.name: p.shape[1] for p in k.params
                                if p.kind is ir.ParamKind.TENSOR})
    assert [(n, [getattr(s, "target", getattr(s, "name", "")) for s in stmts])
            for n, stmts in groups] == [(64, ["dV"]), (128, ["two", "dK"])]


@pytest.mark.parametrize("old, new, message", [
    ("    dV = dv\n", "    dV = dv + dk\n",
     "b.kg:34:5: error: the store of 'dV' reads accumulators of different widths ('dv' N 64 and "
     "'dk' N 128): after the loop a statement works on the [rows, N] tile of the accumulators "
     "of one N; store each accumulator's value on its own"),
    ("    dV = dv\n", "    both = dv * dk\n    dV = dv\n",
     "b.kg:34:5: error: local 'both' reads accumulators of different widths ('dv' N 64 and 'dk' "
     "N 128): after the loop a statement works on the [rows, N] tile of the accumulators of "
     "one N; store each accumulator's value on its own"),
    ("    dK = scale * dk\n    dV = dv\n",
     "    s2 = scale * 2\n    dK = s2 * dk\n    dV = s2 * dv\n",
     "b.kg:33:5: error: local 's2' is read by statements of different widths ('dv' N 64 and "
     "'dk' N 128): after the loop a statement works on the [rows, N] tile of the accumulators "
     "of one N; bind one local per width"),
    ("    dV = dv\n", "    dV = dk\n",
     "b.kg:34:5: error: tensor 'dV' has shape [T, 64] but the kernel's epilogue computes "
     "[T, 128]"),
])
def test_accumulators_of_different_widths_are_not_mixed(old, new, message):
    assert old in NARROW_V
    with pytest.raises(KgenError) as info:
        verify(parse(NARROW_V.replace(old, new, 1), "b.kg"))
    assert str(info.value) == message


def test_gqa_dq_with_the_kv_heads_is_refused():
    """GQA (K, V, dK, dV of HKV heads): dQ is added per query head, so it has the query heads
    (tests/test_backward_gqa.py: the rest of GQA)."""
    text = TEXT.replace("K : bf16[B, H,", "K : bf16[B, HKV,").replace("V : bf16[B, H,",
                                                                      "V : bf16[B, HKV,")
    text = text.replace("dK : bf16[B, H,", "dK : bf16[B, HKV,").replace("dV : bf16[B, H,",
                                                                        "dV : bf16[B, HKV,")
    assert verify(parse(text, "b.kg")) == []
    with pytest.raises(KgenError, match="'dQ' is added into at the loop's rows, per query "
                                        "head: declare it with the heads H of 'Q'"):
        verify(parse(text.replace("dQ : f32[B, H,", "dQ : f32[B, HKV,"), "b.kg"))


def test_a_value_read_by_a_later_gemm_is_not_warned_about():
    """`pt` is read only by a later gemm and a later epilogue: no unused-local warning; a local
    no one reads still gets one."""
    assert verify(parse(TEXT, "b.kg")) == []
    text = TEXT.replace("epilogue { dst = pt * (acc - D[col]) }",
                        "epilogue { junk = acc * 2; dst = pt * (acc - D[col]) }")
    (warning,) = verify(parse(text, "b.kg"))
    assert "local 'junk' is never used" in str(warning)


# ---------------------------------------------------------------------------------------------
# The reference against a direct float64 attention backward


def numpy_backward(q, k, v, do, scale, causal):
    """Attention forward then backward in float64, per (batch, head): lse, D = rowsum(dO * O),
    dQ, dK, dV. Causal top-left: query i sees keys j <= i."""
    s = scale * q @ np.swapaxes(k, -1, -2)  # [B, H, S, T]
    if causal:
        keep = np.arange(s.shape[-1])[None, :] <= np.arange(s.shape[-2])[:, None]
        s = np.where(keep, s, -np.inf)
    top = s.max(-1, keepdims=True)
    lse = (top + np.log(np.exp(s - top).sum(-1, keepdims=True)))[..., 0]
    p = np.exp(s - lse[..., None])
    o = p @ v
    d = (do * o).sum(-1)
    return lse, d, p


def gradients(q, k, v, do, p, d, scale):
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - d[..., None])
    return scale * ds @ k, scale * np.swapaxes(ds, -1, -2) @ q, dv


def backward_case(causal: bool, text: str = TEXT, s=37, t=29, d=32, seed=0):
    program = text.replace("128]", f"{d}]").replace("bf16[", "f16[")
    program = program.replace("tile 128x64", "tile 64x64")  # 3 blocks of keys at t = 150
    if not causal:
        program = program.replace(CAUSAL, "pt = exp(scale * acc - lse[col])")
    kernel = kernel_of(program)
    scale = float(np.float32(1 / np.sqrt(d)))
    rng = np.random.default_rng(seed)
    q, k, v, do = (rng.standard_normal((2, 2, n, d)).astype(np.float16)
                   for n in (s, t, t, s))
    q64, k64, v64, do64 = (x.astype(np.float64) for x in (q, k, v, do))
    lse, dd, _ = numpy_backward(q64, k64, v64, do64, scale, causal)
    lse32, d32 = lse.astype(np.float32), dd.astype(np.float32)
    # the direct formulas from the same f32 lse and D the program reads
    p = np.exp(scale * q64 @ np.swapaxes(k64, -1, -2) - lse32.astype(np.float64)[..., None])
    if causal:
        p = np.where(np.arange(t)[None, :] <= np.arange(s)[:, None], p, 0)
    want = gradients(q64, k64, v64, do64, p, d32.astype(np.float64), scale)
    got = evaluate(kernel, {"Q": q, "K": k, "V": v, "dO": do, "lse": lse32, "D": d32},
                   {"scale": scale}, block=16)
    return want, got


def close(want, got) -> bool:
    """Within the f16 rounding of the handed-on values (pt, dst) and of the outputs, relative
    to the gradient's largest element (at least 0.05: a query that sees one key has dS = 0 up
    to the f32 rounding of D, which f16 cannot hold)."""
    return all(np.abs(g.astype(np.float64) - w).max() <= 4e-3 * max(np.abs(w).max(), 0.05)
               for w, g in zip(want, got))


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("s, t", [(37, 29), (1, 17), (16, 33), (40, 150)])
def test_reference_matches_a_direct_backward(causal, s, t):
    (dq, dk, dv), got = backward_case(causal, s=s, t=t)
    assert got["dQ"].dtype == np.float32 and got["dQ"].shape == dq.shape
    assert got["dK"].shape == dk.shape and got["dV"].shape == dv.shape
    assert close((dq, dk, dv), (got["dQ"], got["dK"], got["dV"]))


@pytest.mark.parametrize("old, new", [
    ("dst = pt * (acc - D[col])", "dst = pt * acc"),  # D forgotten
    ("dQ += scale * acc", "dQ += acc"),  # the scale forgotten
    (CAUSAL, "pt = where(row < col, exp(scale * acc - lse[col]), 0)"),  # the diagonal masked
])
def test_a_wrong_formula_does_not_match(old, new):
    """The comparison can fail: a program with one formula broken is far from the direct one."""
    assert old in TEXT
    want, got = backward_case(True, TEXT.replace(old, new, 1))
    assert not close(want, (got["dQ"], got["dK"], got["dV"]))


def test_reference_of_some_rows_adds_their_share():
    """Evaluated on a subset of the key rows, dQ holds those keys' share only: the += stores
    sum over the CTAs, and the shares of a partition add up to the whole."""
    program = TEXT.replace("128]", "32]")
    kernel = kernel_of(program)
    rng = np.random.default_rng(1)
    q, do = (rng.standard_normal((1, 1, 20, 32)).astype(np.float32) for _ in range(2))
    k, v = (rng.standard_normal((1, 1, 24, 32)).astype(np.float32) for _ in range(2))
    vectors = {"lse": rng.standard_normal((1, 1, 20)).astype(np.float32),
               "D": rng.standard_normal((1, 1, 20)).astype(np.float32)}
    inputs = {"Q": q, "K": k, "V": v, "dO": do, **vectors}
    whole = evaluate(kernel, inputs, block=16)["dQ"]
    parts = [evaluate(kernel, inputs, rows=np.arange(a, b), block=16)["dQ"]
             for a, b in ((0, 10), (10, 24))]
    np.testing.assert_allclose(parts[0] + parts[1], whole, rtol=1e-6, atol=1e-6)
    assert np.abs(parts[0]).max() > 0 and np.abs(parts[1]).max() > 0


# ---------------------------------------------------------------------------------------------
# The back end: the DAG loop's plan (tests/lower/test_loop_dag.py tests it in detail)


def test_lowering_plans_the_backward_as_a_dag_loop():
    from kgen.lower import lower
    from kgen.plan.loop_dag import GemmKind, LoopDagPlan

    (kernel,) = parse(TEXT, "b.kg").kernels
    plan = lower(kernel)
    assert isinstance(plan, LoopDagPlan)
    assert [(g.name, g.kind) for g in plan.gemms] == [
        ("st", GemmKind.SCORE), ("dv", GemmKind.ACCUMULATING), ("dpt", GemmKind.SCORE),
        ("dk", GemmKind.ACCUMULATING), ("dq", GemmKind.LOOP_ROW)]
    assert plan.zeroed == ("dQ",) and plan.accumulators == ("dv", "dk")


def test_a_two_gemm_loop_of_another_form_is_a_dag_loop():
    """Two gemms, but the accumulating one reads a local, not the score gemm's handed value:
    not the forward's form, so the DAG loop's lowering takes it (and says, at the operand,
    what its skeleton reads: W1 is column-major)."""
    from kgen.lower import lower

    text = (ROOT / "examples" / "mlp_loop.kg").read_text()
    old = "gemm h = X @ W0 accumulate f32 { epilogue { h = gelu(acc + b0[col]) } }"
    assert old in text
    text = text.replace(old, "gemm h = X @ W0 accumulate f32 { epilogue { g = gelu(acc + "
                             "b0[col]) } }").replace("gemm y += h @ W1", "gemm y += g @ W1")
    module = parse(text, "m.kg")
    assert verify(module) == []
    with pytest.raises(KgenError, match="m.kg:12:.*the DAG loop's skeleton"):
        lower(module.kernels[0])


def test_kgen_compile_writes_the_backward(tmp_path):
    result = subprocess.run([sys.executable, "-m", "kgen", "compile", str(PROGRAM), "-o",
                             str(tmp_path / "out.cu")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    source = (tmp_path / "out.cu").read_text()
    assert "attention_bwd_zero" in source and "atomicAdd" in source
