"""The forward's mods in the attention backward (kgen/attention_grad_mods.py): the program kgen
writes for each mod, evaluated by the NumPy reference, gives float64 autograd's gradients of a
reference attention with the same terms (tests/attention_mods_cases.py), fully masked queries
included; its masked blocks are skipped where the mask is linear; the bias gradient's store."""
from __future__ import annotations

import math

import numpy as np
import pytest

from tests.attention_mods_cases import (BIAS_LAYOUT_CASES, CASES, MOD_FIELDS, inputs_of,
                                        reference_attention)

torch = pytest.importorskip("torch")


def _grads(case, b, h, s, t, d, seed, kv_heads=None, arch="sm_80"):
    """(inputs of the backward's sequence, scalars, the reference's grads) for one case; K and
    V with `kv_heads` heads (GQA) where given; the bias as kgen.attention hands `arch`'s
    program it."""
    import ml_dtypes

    from kgen.attention_grad import BackwardSignature
    from kgen.attention_grad_mods import bias_layout, call_inputs, call_mods

    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = (torch.randn(b, heads, n, d, generator=gen).bfloat16().double()
                   for n, heads in ((s, h), (t, kv_heads or h), (t, kv_heads or h), (s, h)))
    vectors, bias = inputs_of(case, torch, gen, b, h, s, t)
    if bias is not None and bias.dtype != torch.bool:
        bias = bias.bfloat16().double()
    scale = 1 / math.sqrt(d)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    bias_leaf = bias.clone().requires_grad_() if case.bias_grad else bias
    out, lse = reference_attention(torch, case, *leaves, bias_leaf, vectors, scale)
    out.backward(do)
    ref = {"dQ": leaves[0].grad, "dK": leaves[1].grad, "dV": leaves[2].grad}
    if case.bias_grad:
        ref["dBias"] = bias_leaf.grad
    options = dict(case.options, vectors=vectors or None,
                   attn_mask=None if bias is None else
                   bias if bias.dtype == torch.bool else bias.bfloat16())
    qb = q.bfloat16()
    mods = call_mods(qb, k.bfloat16(), v.bfloat16(), options, case.bias_grad)
    sig = BackwardSignature("bf16", d, bool(case.options.get("is_causal")), arch,
                            gqa=kv_heads is not None, mods=mods)
    extra = call_inputs(mods, options, qb, k.bfloat16(), bias_layout(sig))
    bf16 = ml_dtypes.bfloat16
    host = {"Q": q, "K": k, "V": v, "dO": do, "O": out.detach()}
    inputs = {name: x.numpy().astype(bf16) for name, x in host.items()}
    inputs["lse"] = lse.detach().numpy().astype(np.float32)
    scalars = {"scale": scale}
    for name, value in extra.items():
        if isinstance(value, (int, float)):
            scalars[name] = value
        elif name == "BiasT":
            inputs[name] = value.float().numpy().astype(bf16)
        else:
            inputs[name] = value.float().numpy()
    return mods, inputs, scalars, ref


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
@pytest.mark.parametrize("s, t", [(37, 45), (45, 37)], ids=["S37-T45", "S45-T37"])
def test_the_backward_of_each_mod_evaluates_to_float64_autograd(case, s, t):
    _check_backward(case, s, t)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_backward_of_each_mod_with_gqa_evaluates_to_float64_autograd(case):
    """GQA 4:2 (the loop walks each KV head's group; `head` in the mods the visit's query head:
    ALiBi's slopes[head], the dropout's Philox key; attn_mask's gradient stored per visit): dK
    and dV summed over the group."""
    _check_backward(case, 48, 37, heads=4, kv_heads=2)


# the mods with GQA on both skeletons, D 64 and 128 causal. NVRTC 13.5 spills some of the MHA
# builds already (sm_90a softcap D 128: 200 / 276 bytes, GQA 228 / 292; dropout D 128 36 / 88;
# sm_80 dropout D 64 48 / 80, GQA 40 / 116); where MHA's does not, GQA's spills 4 bytes at most
# (sm_90a document: 4 / 4), but for attn_mask's gradient at D 128 (sm_80 8 / 16; sm_90a
# 132 / 192: stored from registers, the staged store not built with GQA)
GQA_MODS = MOD_FIELDS


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("mod", list(GQA_MODS))
def test_each_mod_with_gqa_compiles_as_without(arch, mod):
    """A mod's backward with GQA (a CTA per KV head walking its group; `head` the visit's query
    head, an unheaded vector's pointer at the CTA's KV head) compiles; where the same backward
    without GQA spills nothing, it spills 4 bytes at most."""
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.sequence import build_sequence

    for d in (64, 128):
        spills = []
        for gqa in (False, True):
            sig = BackwardSignature("bf16", d, True, arch, gqa=gqa, mods=Mods(**GQA_MODS[mod]))
            module = backward_module(sig)
            built = build_sequence(module, module.sequences[0], arch)
            (main,) = [p for p in built.plans if p.name.endswith("_main")]
            result = compile_cubin(built.source, main.name, arch)
            spills.append((result.spill_stores, result.spill_loads))
        if spills[0] == (0, 0) and (mod, d) != ("bias_grad", 128):
            assert max(spills[1]) <= 4, (d, spills)


BIAS_CASES = [c for c in CASES if c.bias] + BIAS_LAYOUT_CASES


@pytest.mark.parametrize("case", BIAS_CASES, ids=[c.name for c in BIAS_CASES])
def test_the_sm90a_backward_s_column_major_bias_evaluates_to_float64_autograd(case):
    """sm_90a's program declares BiasT `col` and takes attn_mask seen transposed (no copy; a
    bool mask as 0 / -inf, rows padded to 16 bytes where T is ragged, broadcast dims at
    stride 0); with GQA `row` (read per element there: the transposed copy)."""
    _check_backward(case, 37, 45, arch="sm_90a", d=64)
    _check_backward(case, 48, 37, heads=4, kv_heads=2, arch="sm_90a", d=64)


def _check_backward(case, s, t, heads=2, kv_heads=None, arch="sm_80", d=32):
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import bias_gradient
    from kgen.reference_sequence import evaluate_sequence

    mods, inputs, scalars, ref = _grads(case, 1, heads, s, t, d, 3, kv_heads, arch)
    module = backward_module(BackwardSignature("bf16", d, bool(case.options.get("is_causal")),
                                               arch, gqa=kv_heads is not None, mods=mods))
    if mods.bias == "tensor":  # the layout kgen.attention hands the program: sm_90a's MHA col
        layout = "col" if arch == "sm_90a" and kv_heads is None else "row"
        assert module.kernels[1].param("BiasT").layout.value == layout
    out = evaluate_sequence(module, module.sequences[0], inputs, scalars, block=16)
    if case.bias_grad:
        mask = torch.zeros(ref["dBias"].shape)
        out["dBias"] = bias_gradient(torch.from_numpy(out["dBiasT"].astype(np.float64)),
                                     mask.double()).numpy()
    for name, want in ref.items():
        got = np.asarray(out[name], dtype=np.float64)
        want = want.numpy()
        assert got.shape == want.shape, name
        assert np.isfinite(got).all(), name
        err = np.abs(got - want).max()
        assert err <= 0.02 * max(1.0, np.abs(want).max()), (name, err)


def test_a_query_keeping_no_key_has_zero_gradients():
    """Bottom-right causal with more queries than keys: the first S - T queries keep no key
    (lse -inf); their dQ is 0, and they add nothing to dK, dV (no NaN from exp(-inf + inf))."""
    case = next(c for c in CASES if c.name == "causal_bottom_right")
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.reference_sequence import evaluate_sequence

    mods, inputs, scalars, ref = _grads(case, 1, 1, 40, 9, 16, 4)
    assert np.isinf(inputs["lse"][0, 0, :31]).all()
    module = backward_module(BackwardSignature("bf16", 16, False, "sm_80", mods=mods))
    out = evaluate_sequence(module, module.sequences[0], inputs, scalars, block=16)
    assert (np.asarray(out["dQ"], dtype=np.float64)[0, 0, :31] == 0).all()
    assert np.isfinite(np.asarray(out["dK"], dtype=np.float64)).all()


def test_softcap_s_derivative_is_kgen_s_own():
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.attention_grad_mods import Mods

    text = backward_text(BackwardSignature("bf16", 64, True, "sm_80", mods=Mods(
        score_mod="cap * tanh(score / cap)", scalars=("cap",))))
    assert "modded = cap * tanh((score / cap))" in text
    # 1 - tanh^2, kgen's (cap and 1 / cap cancelled)
    assert "* (1.0 - (tanh((score / cap)) * tanh((score / cap)))), 0)" in text
    assert "where(row <= col, exp(modded - lse[col]), 0)" in text
    masked = backward_text(BackwardSignature("bf16", 64, False, "sm_80", mods=Mods(
        score_mod="where(score > cap, -inf, score)", scalars=("cap",))))
    assert "lse_use = where(lse[col] == -inf, 0, lse[col])" in masked


def test_a_mod_kgen_cannot_differentiate_is_located_in_the_mod():
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.attention_grad_mods import Mods
    from kgen.errors import KgenError

    with pytest.raises(KgenError) as err:
        backward_text(BackwardSignature("bf16", 64, False, "sm_80", mods=Mods(
            score_mod="score + gelu(score)")))
    assert err.value.loc.file == "score_mod"
    assert (err.value.loc.col, err.value.loc.end_col) == (9, 20)
    assert "gelu() is not differentiable" in err.value.message


def test_the_plain_backward_keeps_its_name_and_text():
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.attention_grad_mods import Mods

    plain = BackwardSignature("bf16", 64, True, "sm_80")
    assert plain == BackwardSignature("bf16", 64, True, "sm_80", mods=Mods())
    assert plain.name == "attention_bwd_64_" + __import__("hashlib").sha256(
        repr(("bf16", 64, True, "sm_80", False, False)).encode()).hexdigest()[:12]
    assert "pt = where(row <= col, exp(score - lse[col]), 0)" in backward_text(plain)


def test_a_bias_gradient_needs_queries_in_multiples_of_8():
    from kgen.attention_grad import attention_with_grad
    from kgen.errors import ArgumentError

    q = torch.zeros(1, 2, 17, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(1, 2, 24, 64, dtype=torch.bfloat16)
    bias = torch.zeros(1, 2, 17, 24, dtype=torch.bfloat16, requires_grad=True)
    with pytest.raises(ArgumentError, match="multiple of 8 \\(got 17\\)"):
        attention_with_grad(q, k, k, attn_mask=bias)


def test_the_call_s_mods_and_inputs():
    """call_mods / call_inputs (CPU tensors): the bias transposed with its broadcast dims at
    stride 0 and rows padded to 16 bytes; a [..., 1, T] bias without grad as the vector Bias;
    with grad as the tensor."""
    from kgen.attention_grad_mods import Mods, bias_gradient, call_inputs, call_mods

    q = torch.zeros(2, 3, 13, 64, dtype=torch.bfloat16)
    k = torch.zeros(2, 3, 20, 64, dtype=torch.bfloat16)
    bias = torch.randn(1, 3, 13, 20).bfloat16()
    mods = call_mods(q, k, k, {"attn_mask": bias}, False)
    assert mods == Mods(bias="tensor")
    found = call_inputs(mods, {"attn_mask": bias}, q, k, "row")["BiasT"]
    assert found.shape == (2, 3, 20, 13) and found.stride()[0] == 0 and found.stride()[2] == 16
    assert torch.equal(found[1], bias[0].transpose(-1, -2))
    # sm_90a: attn_mask itself seen transposed (column-major: the keys contiguous)
    view = call_inputs(mods, {"attn_mask": bias}, q, k, "col")["BiasT"]
    assert view.shape == (2, 3, 20, 13) and view.stride() == (0, 13 * 24, 1, 24)  # T padded
    assert torch.equal(view[1], bias[0].transpose(-1, -2))
    aligned = torch.randn(3, 13, 24).bfloat16()  # rows 16 bytes apart: nothing copied
    k24 = torch.zeros(2, 3, 24, 64, dtype=torch.bfloat16)
    view = call_inputs(mods, {"attn_mask": aligned}, q, k24, "col")["BiasT"]
    assert view.data_ptr() == aligned.data_ptr() and view.stride() == (0, 13 * 24, 1, 24)
    rows = torch.randn(2, 1, 1, 20).bfloat16()  # one row for every query, with its gradient
    view = call_inputs(call_mods(q, k, k, {"attn_mask": rows}, True), {"attn_mask": rows}, q, k,
                       "col")["BiasT"]
    assert view.stride()[3] == 24 and torch.equal(view, rows.expand(2, 3, 13, 20).transpose(-1, -2))
    row = torch.randn(2, 1, 1, 20).bfloat16()
    assert call_mods(q, k, k, {"attn_mask": row}, False).bias == "cols"
    assert call_mods(q, k, k, {"attn_mask": row}, True).bias == "tensor"
    grad = bias_gradient(torch.ones(2, 3, 20, 13, dtype=torch.bfloat16), bias)
    assert grad.shape == bias.shape and (grad == 2).all()


# ---------------------------------------------------------------------------------------------
# The language pieces the mods use: a score gemm's tile store, random_t


def _main_text(**mods):
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.attention_grad_mods import Mods

    text = backward_text(BackwardSignature("bf16", 64, True, "sm_80", mods=Mods(**mods)))
    start = text.index("kernel ", 1)  # the main kernel, the second
    return text[start:text.index("kernel ", start + 1)]


@pytest.mark.parametrize("old, new, message", [
    ("tensor dBiasT : bf16[B, H, T, S] row out", "tensor dBiasT : bf16[B, H, S, T] row out",
     "tensor 'dBiasT' has shape [S, T] but gemm 'dpt' stores its [T, S] tile, block by block"),
    ("        dBiasT = dst\n", "        dBiasT = dst\n        dBiasT = pt\n",
     "output 'dBiasT' is written twice"),
    ("tensor dBiasT : bf16[B, H, T, S] row out", "vector dBiasT : f32[B, H, T] out",
     "gemm 'dpt' stores its tile into a row-major output tensor [T, S]; 'dBiasT' is not one"),
])
def test_a_score_gemm_s_tile_store_is_checked(old, new, message):
    from kgen.errors import KgenError
    from kgen.parse import parse
    from kgen.verify import verify

    text = _main_text(bias="tensor", bias_grad=True)
    assert old in text
    with pytest.raises(KgenError, match=__import__("re").escape(message)):
        verify(parse(text.replace(old, new), "bwd.kg"))


def test_a_loop_that_stores_a_tile_runs_every_block():
    from kgen.lower import program as lowering
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(_main_text(bias="tensor", bias_grad=True), "bwd.kg")
    verify(module)
    plan = lowering.run(module.kernels[0])
    assert not plan.bounds.bounds
    assert "the loop stores 'dBiasT' at every element of every block" in plan.bounds.why
    module = parse(_main_text(score_mod="cap * tanh(score / cap)", scalars=("cap",)), "bwd.kg")
    verify(module)
    assert lowering.run(module.kernels[0]).bounds.bounds  # dst = where(P, .., 0) is 0 there


def test_random_t_is_random_at_the_transposed_element():
    import numpy as np

    from kgen.parse import parse
    from kgen.reference import evaluate
    from kgen.verify import verify

    text = """kernel k {
  target sm_80
  tensor X : f32[B, H, M, N] row
  tensor Y : f32[B, H, M, N] row out
  tensor Z : f32[B, H, M, N] row out
  scalar seed : u64
  scalar offset : u64
  epilogue {
    Y = random(seed, offset)
    Z = random_t(seed, offset)
  }
}
"""
    module = parse(text, "r.kg")
    verify(module)
    out = evaluate(module.kernels[0], {"X": np.zeros((2, 3, 9, 9), np.float32)},
                   {"seed": 2**63 + 5, "offset": 12})
    assert np.array_equal(out["Z"], out["Y"].transpose(0, 1, 3, 2))
    assert not np.array_equal(out["Z"], out["Y"])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_softcaps_backward_spells_tanh_and_division_as_the_forward(arch):
    """The backward's loop takes the forward's tanh.approx; its score / cap is a multiply by the
    reciprocal on the wgmma skeleton only (on mma.sync the two together spilled), and neither
    build spills more than the tanhf one did (sm_90a: 176 B before; 92 B with dQ's bulk adds
    per row, 104 B with the add warp's tensor reduce-adds, NVRTC 13)."""
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.sequence import build_sequence

    sig = BackwardSignature("bf16", 128, False, arch, mods=Mods(
        score_mod="cap * tanh(score / cap)", scalars=("cap",)))
    module = backward_module(sig)
    built = build_sequence(module, module.sequences[0], arch)
    (main,) = [p for p in built.plans if p.name.endswith("_main")]
    assert main.tanh.value == "tanh.approx.f32"
    assert (main.division.value == "a * (1 / b)") == (arch == "sm_90a")
    assert "tanh_approx(" in built.source and "tanhf(" not in built.source
    result = compile_cubin(built.source, main.name, arch)
    assert result.spill_stores <= (0 if arch == "sm_80" else 104), result.spill_stores


def test_dropout_s_philox_call_is_drawn_once_per_group_and_lane_pair():
    """The loop skeletons draw random_t in the loop of its first reader: at a group's first
    element (i, j, e even) each lane calls Philox for the columns of its row's parity and
    hands the lane holding row ^ 1 (lane ^ 4) that lane's halves; each element then reads its
    own call's halves or the ones handed over (kgen/targets/common/loop.py: CRandom)."""
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods
    from kgen.sequence import build_sequence

    for arch in ("sm_80", "sm_90a"):
        sig = BackwardSignature("bf16", 64, False, arch, mods=Mods(dropout=True))
        module = backward_module(sig)
        source = build_sequence(module, module.sequences[0], arch).source
        draw = ("        if (((i | j | e) & 1) == 0) {\n"
                "          const uint4 words = philox_group(p.seed, p.offset, batch, head, "
                "p.heads, col + (row & 1), row);\n"
                "          v6_own = philox_halves(words, row & 1);\n"
                "          v6_other = philox_exchange(philox_halves(words, (row & 1) ^ 1));\n"
                "        }\n"
                "        v6[j][e] = philox_half((e & 1) == (row & 1) ? v6_own : v6_other, j & 1, "
                "i & 1);\n")
        assert source.count(draw) == 2  # the body and the body of full blocks
        assert source.count("philox_group(p.") == 2 and "philox_uniform(p." not in source
        assert "v8[j][e] = v6[j][e] >= p.dropout_p ? 1.0f : 0.0f;" in source


@pytest.mark.slow
def test_dropout_s_group_is_one_philox_call_in_the_ptx():
    """The sm_90a backward with dropout at D 128 has 136 mul.hi in its PTX (NVRTC 13.5): a
    call per eight elements, made by one lane of the pair holding them (264 where each lane
    made both calls of its four elements, 878 with one call per element)."""
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods
    from kgen.runtime.nvrtc import compile_ptx
    from kgen.sequence import build_sequence

    sig = BackwardSignature("bf16", 128, False, "sm_90a", mods=Mods(dropout=True))
    module = backward_module(sig)
    built = build_sequence(module, module.sequences[0], "sm_90a")
    (main,) = [p for p in built.plans if p.name.endswith("_main")]
    ptx = compile_ptx(built.source, main.name, "sm_90a")
    assert ptx.count("mul.hi.u32") <= 160, ptx.count("mul.hi.u32")


# ---------------------------------------------------------------------------------------------
# A document mask's blocks: the forward's equality bound, transposed (kd[row] == qd[col])

DOCUMENT = dict(mask_mod="qd[row] == kd[col]", vectors=(("kd", "col"), ("qd", "row")))


def _document_main(arch, causal=False, d=128, **options):
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods
    from kgen.sequence import build_sequence

    module = backward_module(BackwardSignature("bf16", d, causal, arch, mods=Mods(**DOCUMENT),
                                               **options))
    built = build_sequence(module, module.sequences[0], arch)
    (main,) = [p for p in built.plans if p.name.endswith("_main")]
    return main, built.source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_a_document_mask_s_backward_scans_each_tile_of_keys(arch):
    from kgen.plan import program as pp
    from kgen.report_loop_dag import summary as loop_dag_summary

    main, source = _document_main(arch)
    assert main.bounds.equalities == (pp.EqualBound("kd", "qd"),) and main.bounds.fold
    assert "__shared__ int scan[5];" in source and "g_qd[c]" in source
    summary = loop_dag_summary(main)
    assert summary["loop_bounds"]["bounds"] == ["kd[row] == qd[col] (scanned per tile)"]
    if arch == "sm_90a":  # every thread scans, before the roles split (setmaxnreg)
        assert (main.wgmma.fast_body and
                source.index("__shared__ int scan[5];") < source.index("setmaxnreg_dec<"))
    causal, _ = _document_main(arch, causal=True)
    assert len(causal.bounds.bounds) == 1 and causal.bounds.equalities == main.bounds.equalities


@pytest.mark.parametrize("options", [dict(deterministic=True), dict(gqa=True)],
                         ids=["deterministic", "gqa"])
def test_a_document_mask_runs_every_block_where_the_equality_is_refused(options):
    from kgen.lower.loop_dag import DETERMINISTIC_EQUALITY_WHY, GQA_EQUALITY_WHY

    for arch in ("sm_80", "sm_90a"):
        main, source = _document_main(arch, **options)
        assert not main.bounds.skips and "scan[5]" not in source
        why = DETERMINISTIC_EQUALITY_WHY if options.get("deterministic") else GQA_EQUALITY_WHY
        assert why in main.bounds.why


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_a_document_mask_s_backward_compiles_without_spills(arch):
    """As the plain causal backward (0 B on both skeletons, NVRTC 13.5, D 64 and 128; sm_90a's
    D 256 split layout 0 B too)."""
    from kgen.runtime.nvrtc import compile_cubin

    for d, causal in ((64, False), (128, False), (128, True)):
        main, source = _document_main(arch, causal, d)
        result = compile_cubin(source, main.name, arch)
        assert result.spill_stores == 0 and result.spill_loads == 0, (d, causal)
