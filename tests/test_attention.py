"""kgen.attention on the CPU: the program it writes (parsed, verified, planned: bounds from the
masks), signatures, mods' mistakes located in the mod's own text, argument checks. Under
torch.compile: tests/test_attention_traced.py. The launch is tests/gpu/test_attention_gpu.py's."""
from __future__ import annotations

import math

import numpy as np
import pytest

import kgen
from kgen import attention as kattention
from kgen.api import build_verified
from kgen.errors import ArgumentError, KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.reference import evaluate


def sig(d_qk=64, d_v=None, causal=False, score_mod=None, mask_mod=None, scalars=(),
        dtype="bf16"):
    return kattention.Signature(dtype, d_qk, d_v or d_qk, causal, score_mod, mask_mod,
                                tuple(sorted(scalars)))


def test_the_export_is_callable_and_the_module(monkeypatch):
    import sys

    import kgen.attention
    from kgen.attention import Signature

    assert callable(kgen.attention)
    assert kgen.attention is kattention is sys.modules["kgen.attention"]
    assert kgen.attention.Signature is kattention.Signature is Signature
    assert kgen.attention.attention is kattention.attention
    # its attributes are the module's globals: a monkeypatch reaches the functions
    assert not kattention.lazy_maximum("sm_90a", 128)
    monkeypatch.setattr(kattention, "LAZY_MIN_DV", 128)
    assert kattention.lazy_maximum("sm_90a", 128)


@pytest.mark.parametrize("s, skips", [
    (sig(), False),
    (sig(causal=True), True),
    (sig(mask_mod="col > row - window", scalars=("window",)), True),
    (sig(causal=True, mask_mod="col > row - window", scalars=("window",)), True),
    (sig(mask_mod="col <= row + T - S"), True),
    (sig(score_mod="cap * tanh(score / cap)", scalars=("cap",)), False),
    (sig(score_mod="score - slope * (row - col)", causal=True, scalars=("slope",)), True),
    (sig(mask_mod="(row - col) * (row - col) < 100"), False),
])
def test_programs_verify_plan_and_skip_where_the_mask_is_linear(s, skips):
    plan = lower(kattention.program(s))
    assert plan.bounds.skips is skips, plan.bounds.why
    if not skips:
        assert plan.bounds.why.startswith("every block runs")


def test_the_program_is_deterministic_and_named_by_its_signature():
    a = kattention.program_text(sig(causal=True))
    assert a == kattention.program_text(sig(causal=True))
    assert a != kattention.program_text(sig())
    assert sig(causal=True).name != sig().name
    assert build_verified(kattention.program(sig(causal=True)), "sm_80").source == \
        build_verified(kattention.program(sig(causal=True)), "sm_80").source


@pytest.mark.parametrize("d_qk, d_v", [(64, 64), (96, 96), (128, 128), (192, 192), (256, 256),
                                       (192, 128)])
def test_head_dims_plan(d_qk, d_v):
    plan = lower(kattention.program(sig(d_qk, d_v, causal=True)))
    assert (plan.gemm0.k, plan.gemm1.n) == (d_qk, d_v)


@pytest.mark.parametrize("field, text, col, message", [
    ("score_mod", "score +* 2", 8, "expected an expression"),
    ("score_mod", "score * foo", 9, "unknown name 'foo'"),
    ("score_mod", "score * D", 9, "unknown name 'D'"),
    ("mask_mod", "col <= row + foo", 14, "unknown name 'foo'"),
    ("mask_mod", "col <= rowsum(row)", 8, "rowsum reduces the elements of a row"),
    ("score_mod", "tanh(score, 2)", 1, "tanh takes 1 argument"),
])
def test_mistakes_in_a_mod_are_located_in_the_mod(field, text, col, message):
    with pytest.raises(KgenError) as err:
        kattention.program(sig(**{field: text}))
    loc = err.value.loc
    assert (loc.file, loc.line, loc.col) == (field, 1, col), (loc, err.value.message)
    assert message in err.value.message, err.value.message


def test_a_mod_is_one_line():
    with pytest.raises(KgenError) as err:
        kattention.program(sig(score_mod="score\n* 2"))
    assert err.value.loc.file == "score_mod" and "one line" in err.value.message


class Fake:
    """Shape and dtype: what signature reads."""

    def __init__(self, shape, dtype="torch.bfloat16"):
        self.shape = tuple(shape)
        self.dtype = dtype


def test_signature_reads_shapes_and_dtypes():
    q, k, v = Fake((2, 8, 100, 192)), Fake((2, 2, 300, 192)), Fake((2, 2, 300, 128))
    s = kattention.signature(q, k, v, is_causal=True, scalars={"w": 3.0, "c": 1.0})
    assert (s.dtype, s.d_qk, s.d_v, s.causal, s.scalars) == ("bf16", 192, 128, True, ("c", "w"))
    f16 = kattention.signature(*(Fake(t.shape, "torch.float16") for t in (q, k, v)))
    assert f16.dtype == "f16"


@pytest.mark.parametrize("shapes, dtypes, scalars, message", [
    (((2, 8, 10, 64), (2, 8, 10, 64), (2, 8, 10)), None, None, "v must be [B, H, S, D]"),
    (((2, 8, 10, 64),) * 3, ("torch.float32",) * 3, None, "bfloat16 or float16"),
    (((2, 8, 10, 64),) * 3, ("torch.bfloat16", "torch.float16", "torch.bfloat16"), None,
     "k is torch.float16, but q is torch.bfloat16"),
    (((2, 8, 10, 64), (2, 8, 10, 32), (2, 8, 10, 64)), None, None, "k's head dim 32"),
    (((2, 8, 10, 64),) * 3, None, {"scale": 1.0}, "scalar name 'scale' is not usable"),
    (((2, 8, 10, 64),) * 3, None, {"exp": 1.0}, "scalar name 'exp' is not usable"),
])
def test_signature_refuses_bad_arguments(shapes, dtypes, scalars, message):
    dtypes = dtypes or ("torch.bfloat16",) * 3
    q, k, v = (Fake(s, d) for s, d in zip(shapes, dtypes))
    with pytest.raises(ArgumentError) as err:
        kattention.signature(q, k, v, scalars=scalars)
    assert message in str(err.value)


def test_the_program_means_attention_with_its_mods():
    """The reference of the written program (softcap and a window, bottom-right causal) against
    attention computed here in float64."""
    s = sig(64, 32, score_mod="cap * tanh(score / cap)",
            mask_mod="(col <= row + T - S) * (col > row + T - S - window)",
            scalars=("cap", "window"))
    kernel = kattention.program(s)
    rng = np.random.default_rng(11)
    rows, length = 50, 77
    q = rng.standard_normal((1, 2, rows, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, length, 64)).astype(np.float32)
    v = rng.standard_normal((1, 1, length, 32)).astype(np.float32)
    scale, cap, window = 0.125, 5.0, 20.0
    out = evaluate(kernel, {"Q": q, "K": k, "V": v},
                   scalars={"scale": scale, "cap": cap, "window": window}, block=64)
    for h in range(2):
        x = scale * (q[0, h].astype(np.float64) @ k[0, 0].T.astype(np.float64))
        x = cap * np.tanh(x / cap)
        row, col = np.arange(rows)[:, None], np.arange(length)[None, :]
        keep = (col <= row + length - rows) & (col > row + length - rows - window)
        x = np.where(keep, x, -np.inf)
        m = x.max(1, keepdims=True)
        p = np.exp(x - m)
        want = (p / p.sum(1, keepdims=True)) @ v[0, 0].astype(np.float64)
        got = np.asarray(out["O"], dtype=np.float64)[0, h]
        assert np.abs(got - want).max() < 0.05
        lse = np.asarray(out["lse"], dtype=np.float64)[0, h]
        assert np.abs(lse - (m[:, 0] + np.log(p.sum(1)))).max() < 1e-3
        assert math.isfinite(lse.max())


def test_bias_head_vectors_and_a_document_mask_mean_what_they_say():
    """Bias at (row, col), ALiBi by slopes[head], a document mask qd[row] == kd[col] and a
    score_mod reading batch: the reference of the written program against float64 here."""
    s = kattention.Signature("bf16", 32, 32, True, "score - slopes[head] * (row - col) + batch",
                             "qd[row] == kd[col]", (), "sm_80", True,
                             (("kd", "col"), ("qd", "row"), ("slopes", "head")))
    kernel = kattention.program(s)
    rng = np.random.default_rng(3)
    b, h, rows, length = 2, 3, 40, 70
    q = rng.standard_normal((b, h, rows, 32))
    k = rng.standard_normal((b, h, length, 32))
    v = rng.standard_normal((b, h, length, 32))
    bias = rng.standard_normal((b, h, rows, length))
    slopes = np.array([0.5, 0.25, 0.125])
    qd = np.sort(rng.integers(0, 3, (b, rows)), axis=1).astype(np.float64)
    kd = np.sort(rng.integers(0, 3, (b, length)), axis=1).astype(np.float64)
    out = evaluate(kernel, {"Q": q, "K": k, "V": v, "Bias": bias, "slopes": slopes,
                            "qd": np.repeat(qd[:, None], h, 1), "kd": np.repeat(kd[:, None], h, 1)},
                   scalars={"scale": 0.2}, block=32)
    row, col = np.arange(rows)[:, None], np.arange(length)[None, :]
    for bi in range(b):
        for hi in range(h):
            x = np.float32(0.2) * (q[bi, hi] @ k[bi, hi].T) + bias[bi, hi]
            x = x - slopes[hi] * (row - col) + bi
            keep = (col <= row) & (qd[bi][:, None] == kd[bi][None, :])
            x = np.where(keep, x, -np.inf)
            m = x.max(1, keepdims=True)
            m = np.where(np.isinf(m), 0, m)
            p = np.exp(x - m)
            total = p.sum(1, keepdims=True)
            want = np.where(total == 0, 0, (p / np.where(total == 0, 1, total)) @ v[bi, hi])
            got = np.asarray(out["O"], dtype=np.float64)[bi, hi]
            assert np.abs(got - want).max() < 0.05, (bi, hi)


@pytest.mark.parametrize("mods, vectors, message", [
    (("score", None), {"w": None}, "vector 'w' is not read"),
    (("score + d[row]", "d[col] > 0"), {"d": None}, "vector 'd' is read at col, row"),
    (("score", None), {"head": None}, "vector name 'head' is not usable"),
])
def test_signature_refuses_bad_vectors(mods, vectors, message):
    q = Fake((2, 8, 10, 64))
    with pytest.raises(ArgumentError) as err:
        kattention.signature(q, q, q, score_mod=mods[0], mask_mod=mods[1], vectors=vectors)
    assert message in str(err.value)


@pytest.mark.parametrize("shape, dtype, message", [
    ((2, 8, 10, 11), "torch.bool", "does not broadcast to [B, H, S, T] = [2, 8, 10, 12]"),
    ((3, 1, 1, 12), "torch.bool", "does not broadcast"),
    ((1, 2, 8, 10, 12), "torch.bool", "does not broadcast"),
    ((10, 12), "torch.float32", "attn_mask is float32: it must be bool"),
])
def test_signature_refuses_bad_masks(shape, dtype, message):
    q, k = Fake((2, 8, 10, 64)), Fake((2, 8, 12, 64))
    with pytest.raises(ArgumentError) as err:
        kattention.signature(q, k, k, attn_mask=Fake(shape, dtype))
    assert message in str(err.value)


def test_a_broadcast_mask_and_head_values_verify_and_mistakes_are_located():
    s = kattention.Signature("bf16", 64, 64, True, None, "col > row - slopes[head]", (), "sm_80",
                             True, (("slopes", "head"),))
    plan = lower(kattention.program(s))
    # slopes[head] is not a linear term: the causal bound alone skips blocks
    assert plan.bounds.skips and len(plan.bounds.bounds) == 1, plan.bounds.why
    doc = kattention.Signature("bf16", 64, 64, True, None, "qd[row] == kd[col]", (), "sm_80",
                               False, (("kd", "col"), ("qd", "row")))
    plan = lower(kattention.program(doc))
    assert plan.bounds.skips and len(plan.bounds.bounds) == 1, plan.bounds.why
    bad = kattention.Signature("bf16", 64, 64, False, "score * w[batch]", None, (), "sm_80",
                               False, (("w", "head"),))
    with pytest.raises(KgenError) as err:
        kattention.program(bad)
    assert (err.value.loc.file, err.value.loc.col) == ("score_mod", 9)
    assert "vector 'w' has length H but w[batch] needs length B" in err.value.message


def test_dropout_means_kept_probabilities_scaled_and_a_full_normalizer():
    """The program with dropout: O = sum_j keep_ij p_ij / (1 - p) V_j / sum_j p_ij, keep from
    the reference's Philox (counted by batch, head, row, col), lse of every probability."""
    from kgen.reference_tiles import random_uniform

    s = kattention.Signature("bf16", 32, 32, True, None, None, (), "sm_80", False, (), True)
    kernel = kattention.program(s)
    assert lower(kernel).bounds.skips  # the causal blocks still skipped
    rng = np.random.default_rng(5)
    b, h, rows, length = 2, 2, 30, 50
    q, k, v = (rng.standard_normal((b, h, n, 32)) for n in (rows, length, length))
    seed, offset, drop = 2**63 + 11, 12, 0.25
    out = evaluate(kernel, {"Q": q, "K": k, "V": v},
                   scalars={"scale": 0.2, "seed": seed, "offset": offset, "dropout_p": drop,
                            "dropout_scale": 1 / (1 - drop)}, block=16)
    row, col = np.arange(rows)[:, None], np.arange(length)[None, :]
    for bi in range(b):
        for hi in range(h):
            x = np.where(col <= row, np.float32(0.2) * (q[bi, hi] @ k[bi, hi].T), -np.inf)
            p = np.exp(x - x.max(1, keepdims=True))
            keep = random_uniform(seed, offset, bi, hi, h, np.arange(rows),
                                  np.arange(length)) >= np.float32(drop)
            want = (np.where(keep, p / (1 - drop), 0) @ v[bi, hi]) / p.sum(1, keepdims=True)
            assert np.abs(np.asarray(out["O"], np.float64)[bi, hi] - want).max() < 0.05
            lse = np.log(p.sum(1)) + x.max(1)
            assert np.abs(np.asarray(out["lse"], np.float64)[bi, hi] - lse).max() < 1e-4


@pytest.mark.parametrize("drop", [-0.1, 1.0, 1.5, True, "0.1"])
def test_dropout_p_outside_0_1_is_refused(drop):
    q = Fake((2, 8, 10, 64))
    with pytest.raises(ArgumentError) as err:
        kattention.signature(q, q, q, dropout_p=drop)
    assert "dropout_p must be a number in [0, 1)" in str(err.value)


@pytest.mark.parametrize("shape, cols", [
    ((2, 8, 100, 300), False), ((100, 300), False), ((2, 1, 1, 300), True), ((300,), True),
    ((8, 1, 300), True),
])
def test_a_bias_the_same_for_every_row_is_a_vector_at_col(shape, cols):
    """attn_mask [..., 1, T] is read as the vector Bias[col] (no tensor map takes a row stride
    of 0); otherwise the tensor Bias at (row, col), which sm_90a stages per block."""
    q, k = Fake((2, 8, 100, 128)), Fake((2, 8, 300, 128))
    s = kattention.signature(q, k, k, attn_mask=Fake(shape), arch="sm_90a")
    assert s.bias and s.bias_cols is cols
    text = kattention.program_text(s)
    assert ("vector Bias : f32[B, H, T]" in text and "+ Bias[col]" in text) is cols
    assert ("tensor Bias : bf16[B, H, S, T] row" in text) is not cols
    plan = build_verified(kattention.program(s), kgen.ir.Arch.SM90A).plan
    staged = plan.wgmma.staged_tile
    assert (staged is not None and staged.param == "Bias") is not cols
    assert plan.wgmma.staging.value == ("none" if cols else
                                        "Bias's [128, 128] tile per block by the copy engine, "
                                        "a ring of 2 slot(s)")


@pytest.mark.parametrize("causal", [False, True])
def test_the_raw_max_program_means_the_same_attention(causal):
    """Signature.raw_max: the maximum of the raw scores and exp(scale * (x - m)); the reference
    of the written program against float64 attention, whole rows masked included."""
    import dataclasses

    s = dataclasses.replace(sig(64, 32, causal=causal), raw_max=True)
    text = kattention.program_text(s)
    assert "score = scale * acc" not in text and "exp(scale * (x - m_use))" in text
    assert "scale * m + log(l)" in text and s.name != sig(64, 32, causal=causal).name
    kernel = kattention.program(s)
    rng = np.random.default_rng(5)
    rows, length = 40, 30  # causal bottom rows see every key; top-left aligned
    q = rng.standard_normal((1, 1, rows, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, length, 64)).astype(np.float32)
    v = rng.standard_normal((1, 1, length, 32)).astype(np.float32)
    scale = 0.3
    out = evaluate(kernel, {"Q": q, "K": k, "V": v}, scalars={"scale": scale}, block=64)
    _matches_softmax(out, q, k, v, scale, causal)


def _matches_softmax(out, q, k, v, scale: float, causal: bool) -> None:
    """The program's O and lse (a reference evaluation, one (batch, head)) against float64
    softmax attention, causal top-left."""
    rows, length = q.shape[2], k.shape[2]
    x = scale * (q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64))
    if causal:
        x = np.where(np.arange(length)[None, :] <= np.arange(rows)[:, None], x, -np.inf)
    m = x.max(1, keepdims=True)
    p = np.exp(x - m)
    want = (p / p.sum(1, keepdims=True)) @ v[0, 0].astype(np.float64)
    assert np.abs(np.asarray(out["O"], dtype=np.float64)[0, 0] - want).max() < 0.05
    lse = np.asarray(out["lse"], dtype=np.float64)[0, 0]
    assert np.abs(lse - (m[:, 0] + np.log(p.sum(1)))).max() < 1e-3


@pytest.mark.parametrize("scale, mods, allowed", [
    (0.125, {}, True),
    (0.0, {}, False),  # max(0 * x) is not 0 * max(x) where x holds -inf
    (-0.5, {}, False),
    (float("inf"), {}, False),
    (0.125, {"score_mod": "score + 1"}, False),
    (0.125, {"bias": True}, False),  # added to the scaled score
    (0.125, {"mask_mod": "col <= row"}, True),  # the scale is declared positive: the mask's
    (0.125, {"causal": True}, True),  # -inf stays -inf through scale * (x - m)
    (0.125, {"mask_mod": "score > -5"}, False),  # a mask of the scaled score
])
def test_the_raw_max_is_taken_only_where_it_is_the_same_value(scale, mods, allowed):
    s = kattention.Signature("bf16", 64, 64, mods.get("causal", False), mods.get("score_mod"),
                             mods.get("mask_mod"), (), bias=mods.get("bias", False))
    assert kattention.raw_max_allowed(s, scale) is allowed


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_a_masked_raw_max_program_skips_the_masked_blocks(arch):
    """The raw maximum under a mask: the program declares the scale `positive`, so
    scale * (x - m) on a block masked in full is -inf and the blocks are skipped as with
    scale * acc; the same program without the declaration would run every block."""
    import dataclasses

    s = dataclasses.replace(sig(64, causal=True), raw_max=True, arch=arch)
    text = kattention.program_text(s)
    assert "  scalar scale : f32 = 1 positive\n" in text
    kept = build_verified(kattention.program(s), arch).plan.bounds
    assert kept.bounds == build_verified(kattention.program(
        dataclasses.replace(sig(64, causal=True), arch=arch)), arch).plan.bounds.bounds
    assert kept.skips and kept.fold
    undeclared = parse(text.replace(" positive\n", "\n"), "a.kg").kernels[0]
    bounds = build_verified(undeclared, arch).plan.bounds
    assert not bounds.skips and "every block runs" in bounds.why


@pytest.mark.parametrize("raw_max, causal", [(True, False), (True, True), (False, True)])
def test_the_lazy_maximum_means_the_same_attention(raw_max, causal):
    """The program's reference maximum moves only where a block's maximum passes it by more
    than LAZY_MAX (r is then exactly 1): scores that grow along the keys by more than that per
    block exercise both branches; the reference of the program against float64 attention,
    whole rows masked included (causal, 40 rows against 30 keys top-left)."""
    import dataclasses

    s = dataclasses.replace(sig(64, 256, causal=causal), raw_max=raw_max, arch="sm_90a")
    text = kattention.program_text(s)
    assert f"> {kattention.LAZY_MAX}, m_blk, m)" in text and "r = where(m_new == m, 1, " in text
    eager = kattention.program_text(dataclasses.replace(s, d_v=128))  # lazy_maximum: D_v 256
    assert "m_blk" not in eager and "m_new = max(m, rowmax(x))" in eager
    assert "m_blk" not in kattention.program_text(dataclasses.replace(s, arch="sm_80"))
    kernel = kattention.program(s)
    rng = np.random.default_rng(9)
    rows, length, scale = 40, 130, 0.5
    q = rng.standard_normal((1, 1, rows, 64)).astype(np.float32)
    k = rng.standard_normal((1, 1, length, 64)).astype(np.float32)
    k *= (1 + np.arange(length) / 16)[None, None, :, None]  # the maximum climbs block by block
    v = rng.standard_normal((1, 1, length, 256)).astype(np.float32)
    out = evaluate(kernel, {"Q": q, "K": k, "V": v}, scalars={"scale": scale}, block=32)
    _matches_softmax(out, q, k, v, scale, causal)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_lazy_maximums_rescale_is_voted_on_the_wgmma_skeleton(arch):
    """o * r with r = where(m_new == m, 1, ...): the plan marks the factor (Rescale.ones); the
    sm_90a skeleton skips the multiplies where a warp's rows all read 1 (WgmmaLoop.rescale, one
    __all_sync a block), the sm_80 skeleton multiplies (at 255 registers the vote spilled)."""
    import dataclasses

    from kgen.plan import program as pp

    s = dataclasses.replace(sig(256, causal=True), raw_max=True, arch=arch)
    built = build_verified(kattention.program(dataclasses.replace(s, arch="sm_90a")), arch)
    (rescale,) = [x for x in built.plan.body.statements if isinstance(x, pp.Rescale)]
    assert rescale.ones
    voted = "if (!__all_sync(0xffffffffu, ones_o)) {" in built.source
    assert voted == (arch == "sm_90a")
    if arch == "sm_90a":
        assert built.plan.wgmma.vote and built.plan.wgmma.rescale.value.startswith("vote")
    from kgen import ir
    from tests import loop_kernels as lk

    # the eager maximum's factor, exp(m - m_use), is not 1 by construction: no vote
    plain = build_verified(lk.attention(128, causal=True, arch=ir.Arch(arch)), arch)
    assert "ones_o" not in plain.source
    assert plain.plan.wgmma is None or not plain.plan.wgmma.vote


def test_the_target_is_asked_once_per_cuda_device(monkeypatch):
    """_arch reads a CUDA device's compute capability once (torch reads its properties at each
    ask): sm_90a on 9.0, sm_80 elsewhere; an index-less device is the current one."""
    torch = pytest.importorskip("torch")
    capabilities = {0: (9, 0), 1: (8, 0), 2: (10, 0)}
    asked = []

    def capability(device):
        asked.append(device)
        return capabilities[device]

    monkeypatch.setattr(torch.cuda, "get_device_capability", capability)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    kattention._cuda_arch.cache_clear()
    try:
        for _ in range(3):
            assert [kattention._arch(torch.device("cuda", i)) for i in (0, 1, 2)] == [
                "sm_90a", "sm_80", "sm_80"]
            assert kattention._arch(torch.device("cuda")) == "sm_80"
        assert asked == [0, 1, 2]
    finally:
        kattention._cuda_arch.cache_clear()
