"""A block mask on a DAG loop, the attention backward's (`blocks by q_num_blocks, q_indices,
full full_q_num_blocks, full_q_indices`; docs/language.md, "Masked blocks skipped"): the plan
(kgen/lower/loop_dag.py `_listed`: the lists as parameters, the masks a full block skips), the
located refusals (deterministic adds, a tile store), the reference against a dense float64
backward of FlexAttention's meaning, kgen.attention's backward program with the line, and both
skeletons' walks compiled by NVRTC with 0 spills."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.reference import evaluate, round_to
from kgen.verify import verify_kernel
from tests.test_block_mask import spill_free

ROOT = Path(__file__).resolve().parents[2]
BACKWARD = (ROOT / "examples" / "attention_bwd.kg").read_text()
LINE = "    blocks by q_num_blocks, q_indices, full full_q_num_blocks, full_q_indices\n"
LISTS = ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")
# sm_80 at its written tile; sm_90a at the wgmma skeleton's (no tile line)
TEXT = BACKWARD.replace("    tile 128x32\n", "    tile 128x32\n" + LINE)
TEXT_90 = BACKWARD.replace("target sm_80", "target sm_90a").replace("    tile 128x32\n", LINE)


def kernel_of(text: str = TEXT):
    kernel = parse(text, "bwd.kg").kernels[0]
    verify_kernel(kernel)
    return kernel


def _line(text: str, needle: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if needle in line)


# ---------------------------------------------------------------------------------------------
# The plan


@pytest.mark.parametrize("text, tile", [(TEXT, (128, 32)), (TEXT_90, (128, 64))],
                         ids=["sm_80", "sm_90a"])
def test_the_plan_lists_the_blocks_and_skips_the_mask_on_full_ones(text, tile):
    from kgen.lower.loop_bounds import _text

    plan = lower(kernel_of(text))
    listed = plan.bounds.listed
    assert (plan.tile_m, plan.block) == tile and listed.names == LISTS
    assert [_text(plan.body.values, m) for m in listed.masks] == [
        "where((row <= col), exp(((scale * acc) - lse[col])), 0)"]
    assert plan.bounds.bounds == () and plan.bounds.skips
    assert "a block listed in neither is not visited" in plan.bounds.why
    kinds = [(p.name, p.kind) for p in plan.params]
    assert kinds[-5:] == [("q_num_blocks", "block_counts"), ("q_indices", "block_indices"),
                          ("full_q_num_blocks", "block_counts"),
                          ("full_q_indices", "block_indices"), ("scale", "scalar")]
    assert (plan.wgmma is not None) == (plan.arch.value == "sm_90a")


def test_without_full_lists_no_mask_is_skipped():
    plan = lower(kernel_of(TEXT.replace(", full full_q_num_blocks, full_q_indices", "")))
    assert plan.bounds.listed.masks == () and plan.bounds.listed.full_counts is None


def test_a_dropouts_where_is_no_mask():
    """kgen.attention's backward with a causal mask and a dropout: the dropout's where(kept, ..,
    0) reads a random value, so a full block keeps it; only the causal mask is skipped."""
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods
    from kgen.lower.loop_bounds import _text

    sig = BackwardSignature("bf16", 64, True, "sm_90a", mods=Mods(dropout=True), blocks=True)
    main = next(k for k in backward_module(sig).kernels if k.name.endswith("_main"))
    plan = lower(main)
    texts = [_text(plan.body.values, m) for m in plan.bounds.listed.masks]
    assert len(texts) == 1 and texts[0].startswith("where((row <= col), exp(")


@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_deterministic_adds_beside_a_block_mask_are_refused_at_the_line(gqa):
    text = TEXT.replace("  target sm_80\n", "  target sm_80\n  reductions deterministic\n")
    if gqa:
        text = gqa_text(text)
    with pytest.raises(KgenError) as err:
        lower(kernel_of(text))
    assert "a block mask and 'reductions deterministic' together are not supported" in \
        err.value.message
    assert err.value.loc.line == _line(text, "q_num_blocks")


def gqa_text(text: str) -> str:
    """The backward with GQA: K, V, dK and dV at the KV heads HKV."""
    for name in ("K", "V", "dK", "dV"):
        text = text.replace(f"tensor {name} : bf16[B, H, T", f"tensor {name} : bf16[B, HKV, T")
    assert text.count("HKV") == 4
    return text


def test_a_tile_store_beside_a_block_mask_is_refused_at_the_line():
    """kgen.attention's backward storing attn_mask's gradient (dBiasT = dst, a tile store)."""
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.attention_grad_mods import Mods

    sig = BackwardSignature("bf16", 64, False, "sm_80", blocks=True,
                            mods=Mods(bias="tensor", bias_grad=True))
    text = backward_text(sig)
    main = next(k for k in parse(text, "bwd.kg").kernels if k.name.endswith("_main"))
    verify_kernel(main)
    with pytest.raises(KgenError) as err:
        lower(main)
    assert "takes no tile store ('dBiasT')" in err.value.message
    assert err.value.loc.line == _line(text, "q_num_blocks")


# ---------------------------------------------------------------------------------------------
# The reference: FlexAttention's meaning, transposed


def _lists(state: np.ndarray, value: int, rng):
    b, h, tiles, blocks = state.shape
    counts = np.zeros((b, h, tiles), np.int32)
    indices = np.full((b, h, tiles, blocks), 7777, np.int32)  # unused entries: never read
    for i in np.ndindex(b, h, tiles):
        found = rng.permutation(np.flatnonzero(state[i] == value))
        counts[i] = len(found)
        indices[i][:len(found)] = found
    return counts, indices


def _dense_backward(q, k, v, do, lse, dvec, state, scale, m, n):
    """dQ, dK, dV in float64 with the reference's roundings (the handed-on pt and dst in bf16):
    an element (key, query) counts where its block is full, or partial and causal keeps it."""
    b, h, s, _ = q.shape
    t = k.shape[2]
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    keys, queries = np.arange(t)[:, None], np.arange(s)[None, :]
    for i in np.ndindex(b, h):
        st = np.repeat(np.repeat(state[i], m, 0)[:t], n, 1)[:, :s]
        kept = (st == 2) | ((st == 1) & (keys <= queries))
        pt = np.where(kept, np.exp(scale * (k[i] @ q[i].T) - lse[i][None, :]), 0)
        dst = pt * (v[i] @ do[i].T - dvec[i][None, :])
        pt16, dst16 = round_to(pt, ir.DType.BF16), round_to(dst, ir.DType.BF16)
        dv[i], dk[i] = pt16 @ do[i], scale * (dst16 @ q[i])
        dq[i] = scale * (dst16.T @ k[i])
    return dq, dk, dv


@pytest.mark.parametrize("s, t, seed", [(17, 300, 0), (200, 129, 1), (100, 17, 2)])
def test_the_reference_is_the_dense_backward_of_the_listed_blocks(s, t, seed):
    rng = np.random.default_rng(seed)
    b, h, d, m, n = 2, 2, 128, 128, 32
    q, do = (rng.standard_normal((b, h, s, d)) for _ in range(2))
    k, v = (rng.standard_normal((b, h, t, d)) for _ in range(2))
    q, k, v, do = (round_to(x, ir.DType.BF16) for x in (q, k, v, do))
    scale = float(np.float32(0.08838834764))
    lse = (scale * np.einsum("bhsd,bhtd->bhst", q, k)).max(-1) + 1.0
    dvec = rng.standard_normal((b, h, s)) * 0.1
    state = rng.integers(0, 3, (b, h, -(-t // m), -(-s // n)))  # 0 skip, 1 partial, 2 full
    counts, indices = _lists(state, 1, rng)
    full_counts, full_indices = _lists(state, 2, rng)
    inputs = dict(Q=q.astype(np.float32), K=k.astype(np.float32), V=v.astype(np.float32),
                  dO=do.astype(np.float32), lse=lse.astype(np.float32),
                  D=dvec.astype(np.float32), q_num_blocks=counts, q_indices=indices,
                  full_q_num_blocks=full_counts, full_q_indices=full_indices)
    got = evaluate(kernel_of(), inputs, {}, block=n)
    want = _dense_backward(q, k, v, do, lse.astype(np.float32).astype(np.float64),
                           dvec.astype(np.float32).astype(np.float64), state, scale, m, n)
    for name, w in zip(("dQ", "dK", "dV"), want):
        g = got[name].astype(np.float64)
        assert np.abs(g - w).max() <= 1e-2 * max(np.abs(w).max(), 1e-3), name
    # the lists change the result: every block partial is the plain causal backward
    every = np.ones_like(state)
    plain = evaluate(kernel_of(), dict(inputs, **dict(zip(LISTS, (*_lists(every, 1, rng),
                                                                  *_lists(every, 2, rng))))),
                     {}, block=n)
    causal = evaluate(kernel_of(BACKWARD), {name: inputs[name] for name in
                                            ("Q", "K", "V", "dO", "lse", "D")}, {}, block=n)
    assert np.array_equal(plain["dQ"], causal["dQ"])
    if (state != 1).any():
        assert not np.allclose(got["dQ"], causal["dQ"])


# ---------------------------------------------------------------------------------------------
# kgen.attention's backward program, and NVRTC


def test_kgen_attentions_backward_has_the_line_and_the_plain_one_keeps_its_name():
    from kgen.attention_grad import BackwardSignature, backward_text

    plain = BackwardSignature("bf16", 128, True, "sm_90a")
    masked = BackwardSignature("bf16", 128, True, "sm_90a", blocks=True)
    assert plain.name == "attention_bwd_128_6e907904cde1"  # the name before block masks
    assert masked.name != plain.name
    assert "blocks" not in backward_text(plain) and "sequence" in backward_text(plain)
    assert LINE in backward_text(masked) and "sequence" not in backward_text(masked)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("full", [True, False], ids=["full", "partial"])
def test_nvrtc_compiles_both_skeletons_walks_without_spills(arch, full):
    text = TEXT if arch == "sm_80" else TEXT_90
    if not full:
        text = text.replace(", full full_q_num_blocks, full_q_indices", "")
    built = build_verified(kernel_of(text), arch)
    src = built.source
    assert "const bool interior = visit >= partial_visits;" in src if full else \
        "interior" not in src
    assert 'return "p.q_indices, a list of the block mask (int32), is null";' in src
    walk = "listed_block(p.q_indices, list_partial"
    if arch == "sm_90a":  # the producer loads the blocks the consumers take and the adds add
        producer = src.split("// The producer: ")[1].split("// A consumer warpgroup")[0]
        loads, vectors_and_adds = producer.split("The producer's second warp")
        assert f"const int kv0 = {walk}" in loads
        assert vectors_and_adds.count(walk) == 2  # the vectors' warp, the add warp
        assert src.split("// A consumer warpgroup")[1].count(f"const int block = {walk}") == 1
    else:  # the ring refilled with the block of visit + kStages - 1
        assert "if (s < visits) load_block(smem, p, batch, head, listed_block(" in src
        assert "if (next < visits) load_block(smem, p, batch, head, listed_block(" in src
    spill_free(built, arch)


# (arch, head dim, mods) whose plain backward spills too (NVRTC 13.5: softcap 196 B and dropout
# 36 B at D 128 on sm_90a, softcap 8 B on sm_80; with a block mask 224, 28 and 60 B, the last at
# the 128x32 tile the walk's registers take): not the walk's, left out here
PLAIN_SPILLS = {("sm_90a", 128, "softcap"), ("sm_90a", 128, "dropout"), ("sm_80", 128, "softcap")}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mods", ["causal", "mask_mod", "softcap", "dropout"])
def test_kgen_attentions_backward_with_a_block_mask_compiles_without_spills(arch, d, mods):
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods

    if d == 256 and arch == "sm_80":
        pytest.skip("sm_80's backward keeps dK and dV in registers: no head dim 256")
    if (arch, d, mods) in PLAIN_SPILLS:
        pytest.skip("the plain backward spills here too")
    given = {"causal": Mods(), "mask_mod": Mods(mask_mod="(col > row - 300) * (col < row + 50)"),
             "softcap": Mods(score_mod="30 * tanh(score / 30)"),
             "dropout": Mods(dropout=True)}[mods]
    sig = BackwardSignature("bf16", d, mods != "mask_mod", arch, mods=given, blocks=True)
    kernel = next(k for k in backward_module(sig).kernels if k.name.endswith("_main"))
    main = build_verified(kernel, arch)  # (as kgen.attention loads it: a program)
    assert main.plan.bounds.listed is not None
    spill_free(main, arch)


def test_a_sequence_refuses_a_kernel_with_a_block_mask_by_name():
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.verify import verify

    sig = BackwardSignature("bf16", 64, True, "sm_80", blocks=True)
    n = sig.name
    text = backward_text(sig) + (f"sequence {n} {{\n  workspace D, dQacc\n  launch {n}_dot\n"
                                 f"  launch {n}_main\n  launch {n}_dq\n}}\n")
    with pytest.raises(KgenError) as err:
        verify(parse(text, "bwd.kg"))
    assert "has a block mask (line" in err.value.message
    assert "a sequence does not launch a kernel with a block mask yet" in err.value.message


# ---------------------------------------------------------------------------------------------
# The run-time checks of the lists (kgen/runtime/blocks.py), at the DAG loop's tile


def test_binding_checks_the_lists_at_the_dag_loops_tile():
    from kgen.enums import DType
    from kgen.errors import ArgumentError
    from kgen.runtime.program import bind_program
    from kgen.runtime.tensors import DeviceArray, contiguous_strides

    def arr(shape, dtype=DType.BF16, name=""):
        return DeviceArray(1 << 20, tuple(shape), contiguous_strides(shape), dtype, 0,
                           dtype_name=name)

    b, h, s, t = 2, 4, 300, 200  # keys T in tiles of 128: 2; queries S in blocks of 32: 10
    given = dict(Q=arr((b, h, s, 128)), K=arr((b, h, t, 128)), V=arr((b, h, t, 128)),
                 dO=arr((b, h, s, 128)), lse=arr((b, h, s), DType.F32),
                 D=arr((b, h, s), DType.F32))
    for counts, indices in (LISTS[:2], LISTS[2:]):
        given[counts] = arr((1, h, 2), None, "int32")
        given[indices] = arr((1, h, 2, 10), None, "int32")
    plan = lower(kernel_of())
    bound = bind_program(plan, given, None)
    values = dict(zip([f.name for f in plan.fields], bound.values))
    assert (values["q_indices_ld"], values["q_indices_hs"], values["q_indices_bs"]) == (10, 20, 0)
    with pytest.raises(ArgumentError, match=r"q_indices must be \[B, H, 2, 10\] \(a block mask "
                       r"of 128x32 blocks: T = 200 in tiles of 128 rows, S = 300 in blocks of "
                       r"32\)"):
        bind_program(plan, {**given, "q_indices": arr((1, h, 2, 5), None, "int32")}, None)
