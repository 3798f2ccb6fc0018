"""The loop's bounds (kgen/lower/loop_bounds.py): which masks let a tile of rows skip blocks,
the bounds solved for col, the refusals and their reasons, sizes as values (ir.Extent), and the
skeleton's bound arithmetic (templates/common/loop.cu.j2, modelled here in float32) checked
against the masks element by element."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import program as pp
from kgen.reference import evaluate
from kgen.verify import verify

from tests import loop_kernels as lk

PROGRAM = """kernel k {{
  target sm_80
  tensor Q : bf16[B, H, S, 64] row
  tensor K : bf16[B, H, T, 64] row
  tensor V : bf16[B, H, T, 64] row
  tensor O : bf16[B, H, S, 64] row out
  vector lse : f32[B, H, S] out
  scalar w : f32 = 8
  loop kv over T {{
    tile 64x32  warps 4  stages 2
    carry m : f32[row] = -inf
    carry l : f32[row] = 0
    gemm s = Q @ K^T accumulate f32 {{
      epilogue {{
        x = {x}
        m_new = max(m, rowmax(x))
        m_use = where(m_new == -inf, 0, m_new)
        s = exp(x - m_use)
        r = exp(m - m_use)
        l = {l}
        o = o * r
        m = m_new
      }}
    }}
    gemm o += s @ V accumulate f32
  }}
  epilogue {{
    O = where(l == 0, 0, o / l)
    lse = where(l == 0, -inf, m + log(l))
  }}
}}
"""


def program(x: str, l: str = "l * r + rowsum(s)") -> ir.Kernel:
    module = parse(PROGRAM.format(x=x, l=l), "k.kg")
    verify(module)
    return module.kernels[0]


def bounds(x: str, **kw) -> pp.LoopBounds:
    return lower(program(x, **kw)).bounds


def bound(upper, strict, slope, *terms) -> pp.ColumnBound:
    return pp.ColumnBound(upper, strict, slope, tuple(pp.OffsetTerm(*t) for t in terms))


ONE, SCALAR, ROWS, LOOP = pp.Term.ONE, pp.Term.SCALAR, pp.Term.ROWS, pp.Term.LOOP_LEN


@pytest.mark.parametrize("x, expected", [
    ("where(col <= row, acc, -inf)", [bound(True, False, 1)]),
    ("where(row >= col, acc, -inf)", [bound(True, False, 1)]),
    ("where(col <= row + T - S, acc, -inf)",
     [bound(True, False, 1, (1.0, LOOP, "T"), (-1.0, ROWS, "S"))]),
    ("where(col > row - w, acc, -inf)", [bound(False, True, 1, (-1.0, SCALAR, "w"))]),
    ("where((col <= row) * (col > row - w), acc, -inf)",
     [bound(True, False, 1), bound(False, True, 1, (-1.0, SCALAR, "w"))]),
    ("where(min(col <= row, col >= 3), acc, -inf)",
     [bound(True, False, 1), bound(False, False, 0, (3.0, ONE, None))]),
    ("where(col <= row, where(col + w > row, acc, -inf), -inf)",  # the inner mask first
     [bound(False, True, 1, (-1.0, SCALAR, "w")), bound(True, False, 1)]),
    ("where(-col >= -row - 2 * w, acc, -inf)", [bound(True, False, 1, (2.0, SCALAR, "w"))]),
    ("where(col < T - row, 0.5 * acc, -inf)", [bound(True, True, -1, (1.0, LOOP, "T"))]),
])
def test_linear_masks_give_bounds(x, expected):
    found = bounds(x)
    assert found.skips and list(found.bounds) == expected, found
    assert found.fold  # the predicates read 1 inside the mask
    assert "skipped" in found.why


@pytest.mark.parametrize("x, reason", [
    ("acc", "no value of the form where(P, e, -inf)"),
    ("where(col * 2 <= row, acc, -inf)", "must hold col with coefficient 1 or -1"),
    ("where(col <= 2 * row, acc, -inf)", "must hold row with coefficient -1, 0 or 1"),
    ("where(col == row, acc, -inf)", "is not a comparison of col"),
    ("where(col <= row * w, acc, -inf)", "is not linear in col and row"),
    ("where(acc > 0, acc, -inf)", "is not linear in col and row"),
])
def test_other_masks_visit_every_block_and_say_why(x, reason):
    found = bounds(x)
    assert not found.skips and found.bounds == () and found.fold == ()
    assert found.why.startswith("every block runs") and reason in found.why, found.why


def test_a_body_that_changes_its_state_on_a_masked_block_skips_nothing():
    """l counts the blocks (l + 1): a masked block changes it, so no block may be skipped."""
    found = bounds("where(col <= row, acc, -inf)", l="l * r + rowsum(s) + 1")
    assert not found.skips
    assert "changes carry 'l'" in found.why, found.why


def test_an_unguarded_max_is_refused_from_the_initial_state():
    """Without m_use's guard, exp(-inf - -inf) is NaN on a masked block from the start."""
    kernel = program("where(col <= row, acc, -inf)")
    g0 = kernel.loop.gemms[0]
    stmts = tuple(ir.Let(s.name, ir.LocalRef("m_new")) if getattr(s, "name", "") == "m_use"
                  else s for s in g0.epilogue.stmts)
    import dataclasses
    g0 = dataclasses.replace(g0, epilogue=ir.Epilogue(stmts))
    loop = dataclasses.replace(kernel.loop, gemms=(g0, kernel.loop.gemms[1]))
    found = lower(dataclasses.replace(kernel, loop=loop)).bounds
    assert not found.skips and "from the loop's initial state" in found.why, found.why


@pytest.mark.parametrize("positive", [True, False])
def test_a_scale_declared_positive_keeps_the_mask_through_its_product(positive):
    """exp(c * (x - m)) with the raw maximum: on a block masked in full c * -inf is -inf only
    for c > 0, which a scalar declared `positive` says (checked at every launch); without the
    declaration the sign is unknown and every block runs."""
    text = (PROGRAM.format(x="where(col <= row, acc, -inf)", l="l * r + rowsum(s)")
            .replace("scalar w : f32 = 8", "scalar c : f32 = 0.125" + " positive" * positive)
            .replace("exp(x - m_use)", "exp(c * (x - m_use))")
            .replace("exp(m - m_use)", "exp(c * (m - m_use))"))
    module = parse(text, "k.kg")
    verify(module)
    found = lower(module.kernels[0]).bounds
    if positive:
        assert found.skips and list(found.bounds) == [bound(True, False, 1)], found
    else:
        assert not found.skips and "every block runs" in found.why, found.why


def test_the_examples_bounds():
    assert lower(lk.attention(64, causal=True)).bounds.skips
    assert not lower(lk.attention(64)).bounds.skips
    assert not lower(lk.mlp()).bounds.skips
    # the shifted mask (col + shift <= row, a scalar) qualifies too
    assert lower(lk.attention(64, shift=True)).bounds.bounds == (
        bound(True, False, 1, (-1.0, SCALAR, "shift")),)


def test_the_skeleton_renders_bounds_only_for_a_mask():
    masked = build_verified(program("where(col <= row + T - S, acc, -inf)"), "sm_80").source
    # the blocks before the last in three runs (the middle one inside the mask), then the last
    assert "for (int block = first_block; block < inside_from; ++block)" in masked
    assert "for (int block = inside_from; block < inside_to; ++block)" in masked
    assert "constexpr bool interior = true;" in masked
    assert "const int block = end_block - 1;" in masked
    assert "interior ? 1.0f : (static_cast<float>(col) <= " in masked
    assert "static_cast<float>(loop_len)" in masked
    plain = build_verified(program("acc"), "sm_80").source
    assert "first_block" not in plain and "interior" not in plain
    assert "for (int block = 0; block < blocks - 1; ++block)" in plain
    assert "const int block = blocks - 1;" in plain


# ---------------------------------------------------------------------------------------------
# Sizes as values


def test_sizes_are_values_in_the_reference():
    """col <= row + T - S (bottom-right causal) in the reference, against NumPy by hand."""
    kernel = program("where(col <= row + T - S, 0.125 * acc, -inf)")
    rng = np.random.default_rng(3)
    s, t = 37, 90
    q = rng.standard_normal((1, 1, s, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, t, 64)).astype(np.float32)
    v = rng.standard_normal((1, 1, t, 64)).astype(np.float32)
    out = evaluate(kernel, {"Q": q, "K": k, "V": v}, block=32)
    x = 0.125 * (q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64))
    keep = np.arange(t)[None, :] <= np.arange(s)[:, None] + t - s
    x = np.where(keep, x, -np.inf)
    p = np.exp(x - x.max(1, keepdims=True))
    want = (p / p.sum(1, keepdims=True)) @ v[0, 0].astype(np.float64)
    assert np.abs(np.asarray(out["O"], dtype=np.float64)[0, 0] - want).max() < 0.05


@pytest.mark.parametrize("x, message", [
    ("where(col <= row + D, acc, -inf)", "unknown name 'D'"),
    ("where(col <= row + B, acc, -inf)",
     "'B' is a dimension, but only the kernel's rows and its loop's dimension are sizes"),
])
def test_other_sizes_are_refused_where_written(x, message):
    with pytest.raises(KgenError) as err:
        program(x)
    assert message in err.value.message
    assert err.value.loc.file == "k.kg" and err.value.loc.line == 15


def test_a_gemm_kernel_still_refuses_sizes_as_values():
    text = """kernel g {
  target sm_80
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor D : bf16[M, N] row out
  gemm mma0 = A @ B accumulate f32 { epilogue { D = acc * M } }
}
"""
    with pytest.raises(KgenError) as err:
        parse(text, "g.kg")
    assert "'M' is a dimension; sizes cannot be used in expressions" in err.value.message
    assert (err.value.loc.line, err.value.loc.col) == (6, 59)


# ---------------------------------------------------------------------------------------------
# The skeleton's arithmetic (loop.cu.j2's bound block and loop_helpers' two functions) in
# float32, against the bounds' comparisons element by element


def _f(x) -> np.float32:
    return np.float32(x)


def _first_col(x, strict, loop_len):
    c = _f(math.floor(x) + 1) if strict else _f(math.ceil(x))
    return int(min(max(c, _f(-1)), _f(loop_len)))


def _last_col(x, strict, loop_len):
    c = _f(math.ceil(x) - 1) if strict else _f(math.floor(x))
    return int(min(max(c, _f(-1)), _f(loop_len)))


def _offset(b: pp.ColumnBound, scalars, rows, loop_len) -> np.float32:
    total = _f(0)
    for t in b.offset:
        value = {ONE: _f(1), SCALAR: _f(scalars.get(t.param, 0)), ROWS: _f(rows),
                 LOOP: _f(loop_len)}[t.term]
        total = _f(total + _f(t.coef) * value)
    return total


def _visits(plan_bounds, row0, tile_m, rows, loop_len, block, scalars):
    blocks = -(-loop_len // block)
    first, end, inside_begin, inside_end = 0, blocks, 0, blocks
    row_lo, row_hi = _f(row0), _f(min(row0 + tile_m, rows) - 1)
    for b in plan_bounds:
        off = _offset(b, scalars, rows, loop_len)
        high, low = (row_hi, row_lo) if b.slope >= 0 else (row_lo, row_hi)
        any_row, all_row = (high, low) if b.upper else (low, high)
        at_any = _f(_f(b.slope) * any_row + off)
        at_all = _f(_f(b.slope) * all_row + off)
        if b.upper:
            any_col, all_col = (_last_col(v, b.strict, loop_len) for v in (at_any, at_all))
            end = min(end, 0 if any_col < 0 else any_col // block + 1)
            inside_end = min(inside_end, 0 if all_col < 0 else (all_col + 1) // block)
        else:
            any_col, all_col = (_first_col(v, b.strict, loop_len) for v in (at_any, at_all))
            first = max(first, 0 if any_col <= 0 else any_col // block)
            inside_begin = max(inside_begin, 0 if all_col <= 0 else -(-all_col // block))
    return blocks, first, end, inside_begin, inside_end


def _keeps(plan_bounds, rows_idx, cols, scalars, rows, loop_len):
    keep = np.ones((len(rows_idx), len(cols)), dtype=bool)
    for b in plan_bounds:
        rhs = (_f(b.slope) * rows_idx.astype(np.float32)[:, None]
               + _offset(b, scalars, rows, loop_len))
        c = cols.astype(np.float32)[None, :]
        keep &= ((c < rhs) if b.strict else (c <= rhs)) if b.upper else (
            (c > rhs) if b.strict else (c >= rhs))
    return keep


@pytest.mark.parametrize("x, scalars", [
    ("where(col <= row, acc, -inf)", {}),
    ("where(col <= row + T - S, acc, -inf)", {}),
    ("where((col <= row + T - S) * (col > row + T - S - w), acc, -inf)", {"w": 40}),
    ("where((col <= row) * (col > row - w), acc, -inf)", {"w": 7.5}),
    ("where(col < T - row, acc, -inf)", {}),
    ("where(min(col >= row - 100, col < row + w), acc, -inf)", {"w": 3}),
])
def test_skipped_blocks_are_masked_and_inside_blocks_are_not(x, scalars):
    plan_bounds = bounds(x).bounds
    rng = np.random.default_rng(7)
    for _ in range(60):
        rows, loop_len = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        tile_m, block = int(rng.choice([64, 128])), int(rng.choice([32, 64, 128]))
        for row0 in range(0, rows, tile_m):
            blocks, first, end, i0, i1 = _visits(plan_bounds, row0, tile_m, rows, loop_len,
                                                 block, scalars)
            rows_idx = np.arange(row0, min(row0 + tile_m, rows))
            for j in range(blocks):
                cols = np.arange(j * block, min((j + 1) * block, loop_len))
                keep = _keeps(plan_bounds, rows_idx, cols, scalars, rows, loop_len)
                if not first <= j < end:
                    assert not keep.any(), (x, rows, loop_len, row0, j)
                if i0 <= j < i1:
                    assert keep.all(), (x, rows, loop_len, row0, j)
                    assert first <= j < end


def test_inspect_says_which_blocks_run_and_why():
    from kgen.report_program import program_summary

    masked = program_summary(lower(program(
        "where((col <= row + T - S) * (col > row + T - S - 2 * w), acc, -inf)")))
    assert masked["loop_bounds"]["bounds"] == ["col <= row + T - S",
                                               "col > row + T - S - 2 * w"]
    assert masked["loop_bounds"]["skips"] is True
    plain = program_summary(lower(program("where(col * 2 <= row, acc, -inf)")))["loop_bounds"]
    assert plain["skips"] is False and plain["bounds"] == []
    assert "must hold col with coefficient 1 or -1" in plain["why"]
