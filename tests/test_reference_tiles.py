"""The NumPy reference of tile programs (kgen/reference_tiles.py) against direct NumPy formulas:
softmax attention (causal or not, softcap, ALiBi, masks that mask whole rows, GQA, two batch
dimensions), the looped MLP against gelu(X @ W0 + b0) @ W1, and the row kernel against
(dO * O).sum(-1), at ragged lengths."""
from __future__ import annotations

from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from kgen import ir
from kgen.parse import parse
from kgen.reference import checking_dtype, compare, evaluate, round_to
from kgen.verify import verify

PROGRAMS = Path(__file__).resolve().parent.parent / "examples"
BF16 = ml_dtypes.bfloat16
SCALE = 0.125


def kernel_of(text: str) -> ir.Kernel:
    module = parse(text, "t.kg")
    assert verify(module) == []
    return module.kernels[0]


def attention(score: str = "scale * acc", mask: str = "", extra: str = "", dtype: str = "bf16",
              d: int = 64) -> ir.Kernel:
    """The attention forward of examples, with its score `x` and mask replaced."""
    text = (PROGRAMS / "attention_fwd.kg").read_text()
    masked = f"where({mask}, {score}, -inf)" if mask else score
    text = text.replace("x = where(col <= row, scale * acc, -inf)", f"x = {masked}")
    text = text.replace("  scalar scale : f32 = 0.08838834764",
                        f"  scalar scale : f32 = {SCALE}\n{extra}")
    text = text.replace("128]", f"{d}]").replace("bf16[", f"{dtype}[")
    return kernel_of(text)


def attention_inputs(rng, b, h, hkv, s, t, d=64, dtype=BF16):
    return {
        "Q": rng.standard_normal((b, h, s, d)).astype(dtype),
        "K": rng.standard_normal((b, hkv, t, d)).astype(dtype),
        "V": rng.standard_normal((b, hkv, t, d)).astype(dtype),
    }


def direct_attention(inputs, score, operand=None):
    """Softmax attention written directly: the guarded program's meaning in one block. With
    `operand`, P is rounded to it before P @ V, as the program's handed-on value is (exact for
    one block); without, P is exact."""
    q = inputs["Q"].astype(np.float64)
    h, hkv = q.shape[1], inputs["K"].shape[1]
    k = np.repeat(inputs["K"].astype(np.float64), h // hkv, axis=1)
    v = np.repeat(inputs["V"].astype(np.float64), h // hkv, axis=1)
    acc = q @ k.transpose(0, 1, 3, 2)
    s, t = acc.shape[-2:]
    rows = np.arange(s, dtype=np.float64)[:, None]
    cols = np.arange(t, dtype=np.float64)[None, :]
    with np.errstate(all="ignore"):
        x = score(acc, rows, cols)
        m = np.max(x, axis=-1, keepdims=True, initial=-np.inf)
        m_use = np.where(m == -np.inf, 0.0, m)
        p = np.exp(x - m_use)
        l = p.sum(-1, keepdims=True)
        if operand is not None:
            p = round_to(p, operand)
        o = np.where(l == 0, 0.0, (p @ v) / l)
        lse = np.where(l == 0, -np.inf, m + np.log(l))[..., 0]
    return o, lse


def causal(acc, rows, cols):
    return np.where(cols <= rows, np.float32(SCALE) * acc, -np.inf)


def plain(acc, rows, cols):
    return np.float32(SCALE) * acc


@pytest.mark.parametrize("s, t", [(1, 1), (17, 17), (17, 1000), (1000, 17), (1000, 1000)])
@pytest.mark.parametrize("masked", [False, True])
def test_attention_matches_softmax(s, t, masked):
    rng = np.random.default_rng(s * 7 + t)
    kernel = attention(mask="col <= row" if masked else "")
    inputs = attention_inputs(rng, 1, 2, 1, s, t)
    score = causal if masked else plain
    # One block: the same computation as the direct formula, to float64 rounding.
    one = evaluate(kernel, inputs, block=1024)
    o, lse = direct_attention(inputs, score, ir.DType.BF16)
    np.testing.assert_array_equal(one["O"], o.astype(BF16))
    np.testing.assert_allclose(one["lse"], lse.astype(np.float32), rtol=1e-6)
    # Blocks of 64 (the last one partial): only the rounding of P differs from exact softmax.
    blocked = evaluate(kernel, inputs, block=64)
    exact_o, exact_lse = direct_attention(inputs, score)
    assert compare(blocked["O"], exact_o, ir.DType.BF16).ok
    assert compare(blocked["lse"], exact_lse, ir.DType.F32, rtol=1e-6, atol=1e-6).ok
    assert checking_dtype(kernel, "O") is ir.DType.BF16
    assert checking_dtype(kernel, "lse") is ir.DType.F32  # lse never reads the rounded P


@pytest.mark.parametrize("s, t", [(17, 1), (1000, 17), (40, 0)])
def test_masks_that_mask_whole_rows(s, t):
    """Bottom-right causal alignment with S > T: the first S - T rows see no key; the guards
    give O = 0 and lse = -inf there, and the other rows are softmax attention."""
    rng = np.random.default_rng(s + t)
    kernel = attention(mask="col + offset <= row", extra="  scalar offset : f32")
    inputs = attention_inputs(rng, 2, 2, 2, s, t)
    out = evaluate(kernel, inputs, {"offset": s - t}, block=32)

    def score(acc, rows, cols):
        return np.where(cols + (s - t) <= rows, np.float32(SCALE) * acc, -np.inf)

    o, lse = direct_attention(inputs, score)
    assert np.all(out["O"][:, :, : s - t].astype(np.float64) == 0)
    assert np.all(out["lse"][:, :, : s - t] == -np.inf)
    assert compare(out["O"], o, ir.DType.BF16).ok
    assert compare(out["lse"], lse, ir.DType.F32, rtol=1e-6, atol=1e-6).ok
    if t:
        assert np.all(np.isfinite(out["lse"][:, :, s - t:]))


def test_unguarded_program_gives_nan_where_the_formula_does():
    """Without the where(...) guards, a fully masked row computes -inf - -inf = NaN in the
    reference, as in the kernel: the reference computes the program, not what was meant."""
    text = (PROGRAMS / "attention_fwd.kg").read_text()
    text = text.replace("m_use = where(m_new == -inf, 0, m_new)", "m_use = m_new")
    text = text.replace("x = where(col <= row, scale * acc, -inf)",
                        "x = where(col + 4 <= row, scale * acc, -inf)")
    kernel = kernel_of(text)
    out = evaluate(kernel, attention_inputs(np.random.default_rng(1), 1, 1, 1, 8, 8, d=128),
                   block=64)
    assert np.all(np.isnan(out["lse"][0, 0, :4].astype(np.float64)) |
                  (out["lse"][0, 0, :4] == -np.inf))
    assert np.all(np.isnan(out["O"][0, 0, :4].astype(np.float64)))
    assert np.all(np.isfinite(out["O"][0, 0, 4:].astype(np.float64)))


def test_softcap_and_alibi():
    rng = np.random.default_rng(5)
    s, t = 17, 100
    cap = 2.5
    slope = 0.25
    kernel = attention(score="cap * tanh(scale * acc / cap) - slope * (row - col)",
                       mask="col <= row",
                       extra="  scalar cap : f32\n  scalar slope : f32")
    inputs = attention_inputs(rng, 1, 2, 2, s, t)

    def score(acc, rows, cols):
        x = np.float32(cap) * np.tanh(np.float32(SCALE) * acc / np.float32(cap))
        return np.where(cols <= rows, x - np.float32(slope) * (rows - cols), -np.inf)

    one = evaluate(kernel, inputs, {"cap": cap, "slope": slope}, block=128)
    o, lse = direct_attention(inputs, score, ir.DType.BF16)
    np.testing.assert_array_equal(one["O"], o.astype(BF16))
    np.testing.assert_allclose(one["lse"], lse.astype(np.float32), rtol=1e-6)


def test_alibi_with_a_slope_per_row_and_head():
    """ALiBi with v[row]: a [B, H, S] vector (one slope per head, repeated along S)."""
    rng = np.random.default_rng(6)
    b, h, s, t = 2, 4, 33, 70
    kernel = attention(score="scale * acc - slope[row] * (row - col)", mask="col <= row",
                       extra="  vector slope : f32[B, H, S]")
    inputs = attention_inputs(rng, b, h, 2, s, t)
    per_head = 2.0 ** -np.arange(1, h + 1)
    inputs["slope"] = np.broadcast_to(per_head[None, :, None], (b, h, s)).astype(np.float32)
    out = evaluate(kernel, inputs, block=32)

    def score(acc, rows, cols):
        slopes = per_head[None, :, None, None]
        return np.where(cols <= rows, np.float32(SCALE) * acc - slopes * (rows - cols), -np.inf)

    o, lse = direct_attention(inputs, score)
    assert compare(out["O"], o, ir.DType.BF16).ok
    assert compare(out["lse"], lse, ir.DType.F32, rtol=1e-6, atol=1e-6).ok


def test_gqa_heads_and_batches():
    """Query head h reads KV head h // (H / HKV); batches are independent."""
    rng = np.random.default_rng(7)
    kernel = attention()
    inputs = attention_inputs(rng, 3, 6, 2, 9, 20)
    out = evaluate(kernel, inputs, block=8)
    assert out["O"].shape == (3, 6, 9, 64) and out["lse"].shape == (3, 6, 9)
    for b in range(3):
        for h in range(6):
            one = {"Q": inputs["Q"][b:b + 1, h:h + 1], "K": inputs["K"][b:b + 1, h // 3:h // 3 + 1],
                   "V": inputs["V"][b:b + 1, h // 3:h // 3 + 1]}
            alone = evaluate(kernel, one, block=8)
            np.testing.assert_array_equal(out["O"][b, h], alone["O"][0, 0])
    bad = attention_inputs(rng, 1, 6, 4, 9, 20)
    with pytest.raises(ValueError, match="does not divide"):
        evaluate(kernel, bad, block=8)


def test_block_size_changes_only_the_rounding():
    rng = np.random.default_rng(8)
    kernel = attention(mask="col <= row", dtype="f16")
    inputs = attention_inputs(rng, 1, 1, 1, 50, 300, dtype=np.float16)
    runs = [evaluate(kernel, inputs, block=block) for block in (32, 64, 128, 1000)]
    for run in runs[1:]:
        np.testing.assert_allclose(run["lse"], runs[0]["lse"], rtol=1e-6)
        assert compare(run["O"], runs[0]["O"], ir.DType.F16).ok
    assert not all(np.array_equal(run["O"], runs[0]["O"]) for run in runs[1:])


def test_row_subset_matches_all_rows():
    rng = np.random.default_rng(9)
    kernel = attention(mask="col <= row")
    inputs = attention_inputs(rng, 2, 2, 1, 40, 40)
    full = evaluate(kernel, inputs, block=16)
    rows = np.array([0, 7, 39])
    part = evaluate(kernel, inputs, rows=rows, block=16)
    np.testing.assert_array_equal(part["O"], full["O"][:, :, rows])
    np.testing.assert_array_equal(part["lse"], full["lse"][:, :, rows])


def test_default_block_is_64():
    rng = np.random.default_rng(10)
    kernel = attention(mask="col <= row", dtype="f16")
    inputs = attention_inputs(rng, 1, 1, 1, 20, 200, dtype=np.float16)
    np.testing.assert_array_equal(evaluate(kernel, inputs)["O"],
                                  evaluate(kernel, inputs, block=64)["O"])


# Attention from a saved log-sum-exp (the backward's P, in a forward loop of two gemms):
# exp(scale * acc - lse[row]), the form exp(c * a - b) that the loop skeletons compute in one
# multiply-add (exp_diff_scaled: tests/targets/test_loop_sm90.py emits it)
SAVED_LSE = """kernel attention_saved_lse {
  target sm_90a
  tensor Q : bf16[B, H, S, 64] row
  tensor K : bf16[B, H, T, 64] row
  tensor V : bf16[B, H, T, 64] row
  vector lse : f32[B, H, S]
  tensor O : bf16[B, H, S, 64] row out
  scalar scale : f32 = 0.125

  loop kv over T {
    gemm s = Q @ K^T accumulate f32 { epilogue { s = exp(scale * acc - lse[row]) } }
    gemm o += s @ V accumulate f32
  }
  epilogue { O = o }
}
"""


@pytest.mark.parametrize("s, t", [(1, 1), (17, 130), (100, 64)])
def test_attention_from_a_saved_lse(s, t):
    """exp(scale * acc - lse[row]) @ V in blocks: softmax attention when lse is the rows'
    log-sum-exp of the scaled scores (P rounded to the operand's bf16 per block)."""
    kernel = kernel_of(SAVED_LSE)
    rng = np.random.default_rng(s + 3 * t)
    inputs = attention_inputs(rng, 2, 3, 3, s, t)
    q, k, v = (inputs[n].astype(np.float64) for n in ("Q", "K", "V"))
    x = SCALE * q @ k.transpose(0, 1, 3, 2)
    m = x.max(-1, keepdims=True)
    inputs["lse"] = (m + np.log(np.exp(x - m).sum(-1, keepdims=True)))[..., 0].astype(np.float32)
    p = np.exp(x - inputs["lse"].astype(np.float64)[..., None])
    out = evaluate(kernel, inputs, block=64)["O"]
    assert out.shape == (2, 3, s, 64)
    np.testing.assert_allclose(p.sum(-1), 1.0, rtol=1e-5)  # the saved lse normalizes P
    assert compare(out, round_to(p, ir.DType.BF16) @ v, ir.DType.BF16).ok
    assert compare(out, p @ v, ir.DType.BF16).ok  # softmax attention, to P's rounding


def mlp(out_dtype="bf16") -> ir.Kernel:
    text = (PROGRAMS / "mlp_loop.kg").read_text()
    return kernel_of(text.replace("tensor Y : bf16", f"tensor Y : {out_dtype}"))


@pytest.mark.parametrize("m, n0", [(1, 1), (17, 17), (1000, 17), (17, 1000)])
def test_mlp_loop_matches_the_unlooped_mlp(m, n0):
    from kgen.reference import numpy_op

    rng = np.random.default_rng(m + n0)
    inputs = {
        "X": rng.standard_normal((m, 256)).astype(BF16),
        "W0": (rng.standard_normal((256, n0)) / 16).astype(BF16),
        "W1": (rng.standard_normal((n0, 128)) / 16).astype(BF16),
        "b0": rng.standard_normal(n0).astype(np.float32),
    }
    x, w0, w1 = (inputs[n].astype(np.float64) for n in ("X", "W0", "W1"))
    hidden = numpy_op(ir.Op.GELU, x @ w0 + inputs["b0"].astype(np.float64)[None, :])
    # The hidden value is rounded to W1's dtype block by block, element by element: the same
    # for any block, so only the order of the sums differs.
    want = round_to(hidden, ir.DType.BF16) @ w1
    for block in (32, 64):
        got = evaluate(mlp("f32"), inputs, block=block)["Y"]
        np.testing.assert_allclose(got, want.astype(np.float32), rtol=1e-5, atol=1e-6)
    bf = evaluate(mlp(), inputs, block=64)["Y"]
    assert bf.dtype == BF16
    assert compare(bf, hidden @ w1, ir.DType.BF16).ok


@pytest.mark.parametrize("s", [1, 17, 1000])
def test_row_kernel_matches_rowsum(s):
    rng = np.random.default_rng(s)
    kernel = kernel_of((PROGRAMS / "attention_bwd_dot.kg").read_text())
    inputs = {"dO": rng.standard_normal((2, 3, s, 128)).astype(BF16),
              "O": rng.standard_normal((2, 3, s, 128)).astype(BF16)}
    got = evaluate(kernel, inputs)["D"]
    want = (inputs["dO"].astype(np.float64) * inputs["O"].astype(np.float64)).sum(-1)
    assert got.shape == (2, 3, s) and got.dtype == np.float32
    np.testing.assert_array_equal(got, want.astype(np.float32))


def test_row_kernel_values_and_positions():
    """Row reductions as values, row and col as values, v[row] and v[col], tensor outputs."""
    text = """kernel rows {
  target sm_80
  tensor X : f16[M, N] row
  vector u : f32[M]
  vector w : f32[N]
  tensor Y : f32[M, N] row out
  vector r : f32[M] out
  epilogue {
    mx = rowmax(X * w[col])
    Y = exp(X * w[col] - mx) + row * 1000 + col
    r = rowsum(X) * u[row] + mx
  }
}
"""
    kernel = kernel_of(text)
    rng = np.random.default_rng(11)
    x = rng.standard_normal((17, 5)).astype(np.float16)
    u = rng.standard_normal(17).astype(np.float32)
    w = rng.standard_normal(5).astype(np.float32)
    out = evaluate(kernel, {"X": x, "u": u, "w": w})
    xw = x.astype(np.float64) * w.astype(np.float64)[None, :]
    mx = xw.max(-1, keepdims=True)
    y = np.exp(xw - mx) + np.arange(17)[:, None] * 1000.0 + np.arange(5)[None, :]
    r = x.astype(np.float64).sum(-1) * u + mx[:, 0]
    np.testing.assert_array_equal(out["Y"], y.astype(np.float32))
    np.testing.assert_array_equal(out["r"], r.astype(np.float32))


# ---------------------------------------------------------------------------------------------
# random(seed, offset): Philox 4x32-10


def test_philox_matches_random123_known_answers():
    from kgen.reference_tiles import philox4x32

    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
    ]
    for counter, key, want in cases:
        assert tuple(int(w) for w in philox4x32(counter, key)) == want


RANDOM_ROWS = """kernel rng {
  target sm_80
  tensor X : f32[B, H, S, 64] row
  tensor U : f32[B, H, S, 64] row out
  scalar seed : u64
  scalar offset : u64
  epilogue {
    U = random(seed, offset) + 0 * X
  }
}
"""


def test_random_is_philox_per_batch_head_row_and_col():
    from kgen.reference_tiles import random_uniform

    kernel = parse(RANDOM_ROWS, "r.kg").kernels[0]
    assert verify(parse(RANDOM_ROWS, "r.kg")) == []
    x = np.zeros((2, 3, 5, 64), np.float32)
    seed, offset = 2**64 - 3, 2**40 + 9
    u = evaluate(kernel, {"X": x}, scalars={"seed": seed, "offset": offset})["U"]
    for b in range(2):
        for h in range(3):
            want = random_uniform(seed, offset, b, h, 3, np.arange(5), np.arange(64))
            assert np.array_equal(u[b, h], want.astype(np.float32))
    assert len(np.unique(u)) > 0.95 * u.size  # 1920 draws of 2^16 values: a few repeat
    assert 0.0 <= u.min() and u.max() < 1.0
    other = evaluate(kernel, {"X": x}, scalars={"seed": seed, "offset": offset + 1})["U"]
    assert not np.array_equal(u, other)
    big = np.zeros((1, 1, 64, 4096), np.float32)
    kept = random_uniform(1, 2, 0, 0, 1, np.arange(64), np.arange(4096)) >= 0.1
    assert abs(kept.mean() - 0.9) < 0.01


def test_random_takes_16_bits_of_one_philox_call_per_group_of_eight():
    """random(seed, offset) at (row, col) is the low (col even) or high (col odd) 16 bits of
    word 2 * (bit 3 of row) + (bit 3 of col) of the Philox call at the counter (col, row) with
    bits 0 and 3 of col and bit 3 of row cleared, times 2^-16: the group {r, r + 8} x {c, c + 1,
    c + 8, c + 9} is a call's eight halves."""
    from kgen.reference_tiles import MASK32, philox4x32, random_uniform

    seed, offset, batch, head, heads = 2**63 + 11, 2**35 + 6, 1, 2, 3
    rows, cols = np.arange(40), np.arange(72)
    u = random_uniform(seed, offset, batch, head, heads, rows, cols)
    key = (seed & MASK32, (seed >> 32) ^ (offset >> 32))
    for r in (0, 5, 8, 13, 16, 31, 39):
        for c in (0, 1, 7, 8, 9, 24, 63, 71):
            words = philox4x32((c & ~9, r & ~8, batch * heads + head, offset & MASK32), key)
            word = int(words[2 * ((r >> 3) & 1) + ((c >> 3) & 1)])
            assert u[r, c] == ((word >> 16) if c & 1 else (word & 0xFFFF)) * 2.0 ** -16
    # the eight values of a group are a call's eight halves; transposing the element
    # transposes the counter (col, row), which is not symmetric
    group = [u[r, c] for r in (17, 25) for c in (34, 35, 42, 43)]
    assert len(set(group)) == 8
    t = random_uniform(seed, offset, batch, head, heads, cols, rows)
    assert not np.array_equal(t.T, u)
    assert np.all(u * 2**16 == np.floor(u * 2**16))  # multiples of 2^-16
    assert len(np.unique(u)) > 0.95 * u.size  # 2880 draws of 2^16 values: a few repeat


def test_random_s_group_is_random123_s_known_answer_halves():
    """Seed 0, offset 0, instance 0: the group {0, 8} x {0, 1, 8, 9} is the call at counter
    (0, 0, 0, 0) under key (0, 0), whose words are Random123's known answer 6627e8d5 e169c58d
    bc57ac4c 9b00dbd8: (row 0, col 0) is word 0's low half 0xe8d5, (0, 1) its high half
    0x6627, (0, 8) and (0, 9) word 1's, (8, *) words 2 and 3's."""
    from kgen.reference_tiles import random_uniform

    u = random_uniform(0, 0, 0, 0, 1, np.array([0, 8]), np.array([0, 1, 8, 9]))
    want = np.array([[0xE8D5, 0x6627, 0xC58D, 0xE169], [0xAC4C, 0xBC57, 0xDBD8, 0x9B00]])
    assert np.array_equal(u * 2**16, want)
    # the instance, the offset's low and high words and the seed's each move the counter or key
    for args in ((0, 0, 0, 1, 2), (0, 1, 0, 0, 1), (0, 2**32, 0, 0, 1), (2**32, 0, 0, 0, 1)):
        other = random_uniform(*args, np.array([0, 8]), np.array([0, 1, 8, 9]))
        assert not np.array_equal(other * 2**16, want), args
