"""A block mask on the backward's DAG loop with GQA (K and V at the KV heads HKV, Q and dO at
the query heads H): a CTA walks, for each query head of its KV head's group in turn, that head's
listed blocks (partial, then full; templates' group_visit). The plan takes it, the lists are
bound at the query heads, the reference sums dK and dV over the group's listed blocks as a dense
float64 backward of FlexAttention's meaning does, both skeletons' walks compile with NVRTC
without spills (kgen.attention's backward with GQA and a block mask too), and kgen.attention's
backward program with transposed_lists' lists per query head is float64 autograd on the CPU."""
from __future__ import annotations

import numpy as np
import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.lower import lower
from kgen.reference import evaluate, round_to
from tests.lower.test_loop_dag_blocks import (LISTS, TEXT, TEXT_90, _lists, gqa_text,
                                              kernel_of)
from tests.test_block_mask import spill_free

GQA = gqa_text(TEXT)
GQA_90 = gqa_text(TEXT_90)


@pytest.mark.parametrize("text", [GQA, GQA_90], ids=["sm_80", "sm_90a"])
def test_the_plan_takes_gqa_beside_a_block_mask(text):
    plan = lower(kernel_of(text))
    assert plan.gqa and plan.bounds.listed.names == LISTS
    lists = [p for p in plan.params if p.name in LISTS]
    assert [p.kind for p in lists] == ["block_counts", "block_indices"] * 2
    # the lists have the query heads (the runtime checks them against H, not HKV)
    assert all(p.headed and p.batched and not p.kv for p in lists)
    assert {p.name for p in plan.params if p.kv} == {"K", "V", "dK", "dV"}


def test_binding_checks_the_lists_at_the_query_heads():
    from kgen.enums import DType
    from kgen.errors import ArgumentError
    from kgen.runtime.program import bind_program
    from kgen.runtime.tensors import DeviceArray, contiguous_strides

    def arr(shape, dtype=DType.BF16, name=""):
        return DeviceArray(1 << 20, tuple(shape), contiguous_strides(shape), dtype, 0,
                           dtype_name=name)

    b, h, hkv, s, t = 2, 4, 2, 300, 200  # keys in tiles of 128: 2; queries in blocks of 32: 10
    given = dict(Q=arr((b, h, s, 128)), K=arr((b, hkv, t, 128)), V=arr((b, hkv, t, 128)),
                 dO=arr((b, h, s, 128)), lse=arr((b, h, s), DType.F32),
                 D=arr((b, h, s), DType.F32))
    for counts, indices in (LISTS[:2], LISTS[2:]):
        given[counts] = arr((b, h, 2), None, "int32")
        given[indices] = arr((b, h, 2, 10), None, "int32")
    plan = lower(kernel_of(GQA))
    values = dict(zip([f.name for f in plan.fields], bind_program(plan, given, None).values))
    assert (values["q_indices_ld"], values["q_indices_hs"], values["q_indices_bs"]) == (10, 20, 80)
    assert (values["q_num_blocks_hs"], values["q_num_blocks_bs"]) == (2, 8)
    assert values["group"] == 2
    shared = {**given, "q_num_blocks": arr((b, 1, 2), None, "int32"),
              "q_indices": arr((b, 1, 2, 10), None, "int32")}
    values = dict(zip([f.name for f in plan.fields], bind_program(plan, shared, None).values))
    assert values["q_indices_hs"] == 0 and values["q_num_blocks_hs"] == 0  # one for every head
    with pytest.raises(ArgumentError, match=r"q_indices has H = 2, but the call has H = 4"):
        bind_program(plan, {**given, "q_indices": arr((b, hkv, 2, 10), None, "int32")}, None)


# ---------------------------------------------------------------------------------------------
# The reference: each query head's listed blocks, dK and dV summed over the group


def _dense_backward(q, k, v, do, lse, dvec, state, scale, m, n):
    """dQ, dK, dV in float64 (the handed-on pt and dst rounded to bf16, as the reference): an
    element (key, query) of query head h counts where its block in h's state is full, or
    partial and causal keeps it; dK and dV of KV head h // group sum the group's heads."""
    b, h, s, _ = q.shape
    hkv, t = k.shape[1], k.shape[2]
    group = h // hkv
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    keys, queries = np.arange(t)[:, None], np.arange(s)[None, :]
    for i, j in np.ndindex(b, h):
        kv = (i, j // group)
        st = np.repeat(np.repeat(state[i, j % state.shape[1]], m, 0)[:t], n, 1)[:, :s]
        kept = (st == 2) | ((st == 1) & (keys <= queries))
        pt = np.where(kept, np.exp(scale * (k[kv] @ q[i, j].T) - lse[i, j][None, :]), 0)
        dst = pt * (v[kv] @ do[i, j].T - dvec[i, j][None, :])
        pt16, dst16 = round_to(pt, ir.DType.BF16), round_to(dst, ir.DType.BF16)
        dv[kv] += pt16 @ do[i, j]
        dk[kv] += scale * (dst16 @ q[i, j])
        dq[i, j] = scale * (dst16.T @ k[kv])
    return dq, dk, dv


@pytest.mark.parametrize("s, t, h, hkv, list_heads, seed", [
    (17, 300, 4, 2, 4, 0), (200, 129, 4, 1, 4, 1), (100, 17, 4, 2, 1, 2),
    (150, 260, 2, 1, 2, 3)])
def test_the_reference_is_the_dense_backward_of_each_heads_listed_blocks(s, t, h, hkv,
                                                                        list_heads, seed):
    rng = np.random.default_rng(seed)
    b, d, m, n = 2, 128, 128, 32
    q, do = (rng.standard_normal((b, h, s, d)) for _ in range(2))
    k, v = (rng.standard_normal((b, hkv, t, d)) for _ in range(2))
    q, k, v, do = (round_to(x, ir.DType.BF16) for x in (q, k, v, do))
    scale = float(np.float32(0.08838834764))
    kq = np.repeat(k, h // hkv, axis=1)
    lse = (scale * np.einsum("bhsd,bhtd->bhst", q, kq)).max(-1) + 1.0
    dvec = rng.standard_normal((b, h, s)) * 0.1
    # 0 skip, 1 partial, 2 full: per query head (list_heads = h) or one shared (1)
    state = rng.integers(0, 3, (b, list_heads, -(-t // m), -(-s // n)))
    counts, indices = _lists(state, 1, rng)
    full_counts, full_indices = _lists(state, 2, rng)
    inputs = dict(Q=q.astype(np.float32), K=k.astype(np.float32), V=v.astype(np.float32),
                  dO=do.astype(np.float32), lse=lse.astype(np.float32),
                  D=dvec.astype(np.float32), q_num_blocks=counts, q_indices=indices,
                  full_q_num_blocks=full_counts, full_q_indices=full_indices)
    kernel = kernel_of(GQA)
    got = evaluate(kernel, inputs, {}, block=n)
    exact = (lse.astype(np.float32).astype(np.float64),
             dvec.astype(np.float32).astype(np.float64))
    want = _dense_backward(q, k, v, do, *exact, state, scale, m, n)
    for name, w in zip(("dQ", "dK", "dV"), want):
        g = got[name].astype(np.float64)
        assert g.shape == w.shape, name
        assert np.abs(g - w).max() <= 1e-2 * max(np.abs(w).max(), 1e-3), name
    if list_heads > 1 and not (state == state[:, :1]).all():
        # each head's own lists: the group's first head's lists for all of them differ
        first = np.repeat(state[:, ::h // hkv], h // hkv, axis=1)
        other = _dense_backward(q, k, v, do, *exact, first, scale, m, n)
        assert not all(np.allclose(o, w) for o, w in zip(other, want))


# ---------------------------------------------------------------------------------------------
# NVRTC: both skeletons' walks of the group, 0 spills


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("full", [True, False], ids=["full", "partial"])
def test_nvrtc_compiles_both_skeletons_group_walks_without_spills(arch, full):
    text = GQA if arch == "sm_80" else GQA_90
    if not full:
        text = text.replace(", full full_q_num_blocks, full_q_indices", "")
    built = build_verified(kernel_of(text), arch)
    src = built.source
    walk = "group_visit(p.q_num_blocks + count_partial, p.q_num_blocks_hs, "
    assert ("p.full_q_num_blocks + count_full" in src) == full
    assert "const int visits = group_visits(" in src
    assert ("const bool interior = listed_at.at >= listed_at.partial;" in src) == full
    if arch == "sm_90a":  # the producer, the vectors' warp, the add warp and the consumers
        producer = src.split("// The producer: ")[1].split("// A consumer warpgroup")[0]
        loads, vectors_and_adds = producer.split("The producer's second warp")
        assert loads.count(walk) == 1 and vectors_and_adds.count(walk) == 2
        assert src.split("// A consumer warpgroup")[1].count(walk) == 1
    else:  # the ring's first blocks, its refills (in both bodies) and the visits
        assert src.count(walk) == 4
    spill_free(built, arch)


# (arch, head dim, mods) that spill with GQA and a block mask (NVRTC 13.5, causal, bytes of
# spill stores with GQA / without): sm_90a D 128 softcap 244 / 224, dropout 16 / 28, where the
# plain backward spills too (tests/lower/test_loop_dag_blocks.py PLAIN_SPILLS). sm_80's walk is
# a call (templates/common/loop_helpers.inc.j2 group_visit): inlined, its D 128 builds spilled,
# softcap 144 B and dropout 12 B (without GQA 60 and 0), and none does now
GQA_SPILLS = {("sm_90a", 128, "softcap"), ("sm_90a", 128, "dropout")}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mods", ["causal", "mask_mod", "softcap", "dropout"])
def test_kgen_attentions_backward_with_gqa_and_a_block_mask_compiles_without_spills(arch, d,
                                                                                   mods):
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods

    if d == 256 and arch == "sm_80":
        pytest.skip("sm_80's backward keeps dK and dV in registers: no head dim 256")
    if (arch, d, mods) in GQA_SPILLS:
        pytest.skip("spills (GQA_SPILLS)")
    given = {"causal": None, "mask_mod": Mods(mask_mod="(col > row - 300) * (col < row + 50)"),
             "softcap": Mods(score_mod="30 * tanh(score / 30)"),
             "dropout": Mods(dropout=True)}[mods]
    sig = BackwardSignature("bf16", d, mods != "mask_mod", arch, gqa=True, mods=given,
                            blocks=True)
    kernel = next(k for k in backward_module(sig).kernels if k.name.endswith("_main"))
    main = build_verified(kernel, arch)
    assert main.plan.gqa and main.plan.bounds.listed is not None
    spill_free(main, arch)


# ---------------------------------------------------------------------------------------------
# kgen.attention's backward program with GQA and a block mask, end to end on the CPU: the lists
# transposed per query head (transposed_lists), the main kernel evaluated by the reference


@pytest.mark.parametrize("list_heads, causal", [(4, True), (4, False), (1, True)])
def test_kgen_attentions_backward_program_is_float64_autograd_of_each_heads_blocks(list_heads,
                                                                                  causal):
    torch = pytest.importorskip("torch")
    from kgen.attention_blocks import from_dense, transposed_lists
    from kgen.attention_grad import BackwardSignature, backward_module, backward_tile

    b, h, hkv, s, t, d = 1, 4, 2, 300, 260, 64
    gen = torch.Generator().manual_seed(list_heads + 2 * causal)
    kind = torch.randint(0, 3, (b, list_heads, 3, 3), generator=gen)  # 128x128 blocks
    kind[..., 0] = 2  # the first keys full for every query block: every row sees a key
    kind = kind.repeat_interleave(128, 2)[:, :, :s].repeat_interleave(128, 3)[..., :t]
    pattern = (kind == 2) | ((kind == 1) & (torch.rand(b, list_heads, s, t, generator=gen) < .5))
    bm = from_dense(pattern, 128)
    q, do = (torch.randn(b, h, s, d, generator=gen).bfloat16().double() for _ in "qd")
    k, v = (torch.randn(b, hkv, t, d, generator=gen).bfloat16().double() for _ in "kv")
    scale = 1 / d ** 0.5
    # the elementwise meaning: a full block's elements, a partial one's that the mask keeps
    state = torch.zeros(b, list_heads, s, t, dtype=torch.long)
    for value, counts, indices in ((1, bm.kv_num_blocks, bm.kv_indices),
                                   (2, bm.full_kv_num_blocks, bm.full_kv_indices)):
        for i in np.ndindex(*counts.shape):
            for j in indices[i][:counts[i]].tolist():
                state[i[0], i[1], i[2] * 128:(i[2] + 1) * 128, j * 128:(j + 1) * 128] = value
    keep = (torch.arange(t)[None, :] <= torch.arange(s)[:, None]) if causal else True
    visible = ((state == 2) | ((state == 1) & keep)).expand(b, h, s, t)
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    kr, vr = (x.repeat_interleave(h // hkv, dim=1) for x in leaves[1:])
    x = torch.where(visible, scale * leaves[0] @ kr.transpose(-1, -2), -float("inf"))
    lse = torch.logsumexp(x, -1)
    out = torch.softmax(x, -1) @ vr
    out.backward(do)
    sig = BackwardSignature("bf16", d, causal, "sm_80", gqa=True, blocks=True)
    main = next(k for k in backward_module(sig).kernels if k.name.endswith("_main"))
    tile = backward_tile(sig)
    lists = transposed_lists(bm, tile, q.bfloat16(), k.bfloat16())
    assert lists[0].shape[:2] == (b, list_heads)
    dvec = (do * out.detach()).sum(-1)
    inputs = dict(Q=q.numpy(), K=k.numpy(), V=v.numpy(), dO=do.numpy(),
                  lse=lse.detach().float().numpy(), D=dvec.float().numpy(),
                  **{name: x.numpy() for name, x in zip(LISTS, lists)})
    got = evaluate(main, inputs, {"scale": scale}, block=tile[1])
    for name, want in zip(("dQacc", "dK", "dV"), (x.grad for x in leaves)):
        g = torch.from_numpy(got[name].astype(np.float64))
        assert g.shape == want.shape, name
        assert (g - want).abs().max() <= 2e-2 * max(want.abs().max(), 1e-3), name


def test_kgen_inspect_says_the_group_walks_each_heads_lists():
    from kgen.report_loop_dag import summary

    text = summary(lower(kernel_of(GQA)))["gqa"]
    assert "each head's listed blocks: the sum of the group's counts" in text
    assert "group x blocks" not in text
