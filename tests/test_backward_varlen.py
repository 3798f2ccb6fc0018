"""The attention backward over packed variable-length sequences (issue 52; kgen.attention_varlen
trains): the varlen backward's program text (kgen/attention_varlen.py backward_text), the NumPy
reference of the packed DAG loop against an explicit float64 backward computed sequence by
sequence, the plan (packed dims, the grid's order), NVRTC builds for both skeletons, and the
refusals. The GPU runs are tests/gpu/test_attention_varlen_bwd_gpu.py."""
from __future__ import annotations

import numpy as np
import pytest

from kgen import attention_varlen as av
from kgen import ir
from kgen.api import build_verified
from kgen.attention_grad import BackwardSignature
from kgen.attention_grad_mods import Mods
from kgen.errors import ArgumentError, KgenError
from kgen.parse import parse
from kgen.reference import evaluate
from kgen.verify import verify


def signature(causal: bool, arch: str = "sm_80", gqa: bool = False, d: int = 32,
              deterministic: bool = False, d_v: int | None = None) -> BackwardSignature:
    return BackwardSignature("f16", d, causal, arch, gqa=gqa, deterministic=deterministic,
                             d_v=d_v)


def kernels(sig: BackwardSignature) -> dict[str, ir.Kernel]:
    module = av.backward_module(sig)
    name = av.backward_name(sig)
    return {k.name.removeprefix(name + "_"): k for k in module.kernels}


def sequence_backward(q, k, v, do, scale: float, causal: bool):
    """One sequence's attention and its gradients in float64, autograd-free: q, do [H, S, D],
    k, v [HKV, T, D] (GQA: repeated over each group); causal bottom-right (query i sees keys
    j <= i + T - S). Returns o, lse, dq, dk, dv (dk, dv summed over each KV head's group)."""
    group = q.shape[0] // k.shape[0]
    k, v = (np.repeat(x, group, axis=0) for x in (k, v))
    s_len, t_len = q.shape[1], k.shape[1]
    s = scale * q @ np.swapaxes(k, -1, -2)
    keep = np.ones((s_len, t_len), bool)
    if causal:
        keep = np.arange(t_len)[None, :] <= np.arange(s_len)[:, None] + t_len - s_len
    s = np.where(keep, s, -np.inf)
    top = s.max(-1, keepdims=True) if t_len else np.zeros(s.shape[:-1] + (1,))
    top = np.where(np.isfinite(top), top, 0.0)
    total = np.exp(s - top).sum(-1, keepdims=True)
    with np.errstate(divide="ignore"):
        lse = (top + np.log(total))[..., 0]  # -inf where a query sees no key
    p = np.where(keep, np.exp(s - np.where(np.isfinite(lse), lse, 0.0)[..., None]), 0.0)
    o = p @ v
    d = (do * o).sum(-1)
    dv = np.swapaxes(p, -1, -2) @ do
    dp = do @ np.swapaxes(v, -1, -2)
    ds = p * (dp - d[..., None])
    dq = scale * ds @ k
    dk = scale * np.swapaxes(ds, -1, -2) @ q
    heads_kv = k.shape[0] // group
    dk, dv = (x.reshape(heads_kv, group, t_len, x.shape[-1]).sum(1) for x in (dk, dv))
    return o, lse, dq, dk, dv


def packed_case(lengths_q, lengths_k, causal: bool, heads: int = 2, kv_heads: int = 2,
                d: int = 32, seed: int = 0, d_v: int | None = None):
    """Packed f16 inputs [H, total, D] (as the runtime takes them; v and dO at `d_v`), the
    offsets, and the float64 per-sequence results packed the same way."""
    rng = np.random.default_rng(seed)
    d_v = d_v or d
    cu_q = np.concatenate([[0], np.cumsum(lengths_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lengths_k)]).astype(np.int32)
    q, do = (rng.standard_normal((heads, cu_q[-1], n)).astype(np.float16) for n in (d, d_v))
    k, v = (rng.standard_normal((kv_heads, cu_k[-1], n)).astype(np.float16) for n in (d, d_v))
    scale = float(np.float32(1 / np.sqrt(d)))
    o = np.zeros((heads, cu_q[-1], d_v))
    lse = np.zeros((heads, cu_q[-1]))
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(len(lengths_q)):
        sq, sk = slice(cu_q[b], cu_q[b + 1]), slice(cu_k[b], cu_k[b + 1])
        found = sequence_backward(*(x.astype(np.float64)[:, r] for x, r in
                                    ((q, sq), (k, sk), (v, sk), (do, sq))), scale, causal)
        for out, r, value in zip((o, lse, dq, dk, dv), (sq, sq, sq, sk, sk), found):
            out[:, r] = value
    inputs = dict(Q=q, K=k, V=v, dO=do, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    return inputs, scale, dict(O=o, lse=lse, dQ=dq, dK=dk, dV=dv)


def close(have, want, rel=4e-3):
    have = np.asarray(have, np.float64)
    assert have.shape == want.shape
    assert np.abs(have - want).max() <= rel * max(np.abs(want).max(), 0.05)


# ---------------------------------------------------------------------------------------------
# The program text


def test_backward_text_is_the_dense_backward_packed():
    text = av.backward_text(signature(True, "sm_90a"))
    name = av.backward_name(signature(True, "sm_90a"))
    assert name.startswith("attention_varlen_bwd_32_")
    assert f"kernel {name}_dot {{" in text and f"kernel {name}_main {{" in text
    assert f"kernel {name}_dq {{" in text and "sequence" not in text
    main = text[text.index(f"kernel {name}_main"):text.index(f"kernel {name}_dq")]
    assert "  packed T by cu_seqlens_k\n  packed S by cu_seqlens_q\n  loop q over S {" in main
    # the forward's bottom-right term, transposed (kgen/attention_grad_mods.py)
    assert "pt = where(row <= ((col + T) - S), exp(score - lse[col]), 0)" in main
    assert "where" not in av.backward_text(signature(False))
    # the causal and the non-causal backward are two programs
    assert av.backward_name(signature(True)) != av.backward_name(signature(False))


def test_backward_text_gqa_declares_the_kv_heads():
    text = av.backward_text(signature(False, gqa=True))
    for name in ("K", "V", "dK", "dV"):
        assert f"tensor {name} : f16[B, HKV, T, 32] row" in text


@pytest.mark.parametrize("mods, what", [
    (Mods(bias="tensor"), "attn_mask"), (Mods(bias="cols"), "attn_mask"),
    (Mods(vectors=(("w", "row"),)), "vectors read at row, col or batch"),
    (Mods(dropout=True), "dropout")])
def test_backward_text_refuses_the_mods_varlen_has_not(mods, what):
    sig = BackwardSignature("f16", 32, False, "sm_80", mods=mods)
    with pytest.raises(ArgumentError, match=f"takes no {what}"):
        av.backward_text(sig)


# ---------------------------------------------------------------------------------------------
# The reference: the packed backward, sequence by sequence


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(2, 2), (4, 2)])
@pytest.mark.parametrize("lengths_q, lengths_k", [
    ((1, 17, 70, 33), (1, 17, 70, 33)),  # one length per sequence: causal top-left
    ((5, 40, 17), (9, 23, 17)),  # ragged, queries and keys unlike: bottom-right
    ((3, 0, 20), (0, 6, 12)),  # a sequence without keys, one without queries
])
def test_reference_packed_backward_matches_per_sequence(causal, heads, kv_heads, lengths_q,
                                                        lengths_k, d_v=None):
    sig = signature(causal, gqa=heads != kv_heads, d_v=d_v)
    inputs, scale, want = packed_case(lengths_q, lengths_k, causal, heads, kv_heads, d_v=d_v)
    ks = kernels(sig)
    o16 = want["O"].astype(np.float16)
    lse32 = want["lse"].astype(np.float32)
    # the row kernels over every sequence's rows together: [1, H, total, D]
    d = evaluate(ks["dot"], {"dO": inputs["dO"][None], "O": o16[None]}, {})["D"][0]
    close(d, (inputs["dO"].astype(np.float64) * o16.astype(np.float64)).sum(-1))
    got = evaluate(ks["main"], dict(inputs, lse=lse32, D=d), {"scale": scale}, block=16)
    dq = evaluate(ks["dq"], {"dQacc": got["dQacc"][None].astype(np.float32)}, {})["dQ"][0]
    for key, have in (("dQ", dq), ("dK", got["dK"]), ("dV", got["dV"])):
        close(have, want[key])


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d_v, heads", [(16, 2), (48, 2), (16, 4)], ids=["16", "48", "16-gqa"])
def test_reference_packed_backward_with_a_value_head_dim_unlike_the_query_s(causal, d_v, heads):
    """D 32 and D_v 16 or 48 (dO, O, V, dV at D_v): per sequence as the dense one, GQA once."""
    test_reference_packed_backward_matches_per_sequence(causal, heads, 2, (5, 40, 17),
                                                        (9, 23, 17), d_v=d_v)
    text = av.backward_text(signature(causal, d_v=d_v))
    for line in (f"tensor dO : f16[B, H, S, {d_v}] row", f"tensor O : f16[B, H, S, {d_v}] row",
                 f"tensor V : f16[B, H, T, {d_v}] row", f"tensor dV : f16[B, H, T, {d_v}] row out",
                 "tensor K : f16[B, H, T, 32] row", "tensor dQacc : f32[B, H, S, 32] row out"):
        assert line in text
    name = av.backward_name(signature(causal, d_v=d_v))
    assert name.startswith(f"attention_varlen_bwd_32_{d_v}_")


def test_the_example_is_the_causal_packed_backward():
    """examples/attention_bwd_varlen.kg (f16, D 32 here) against the per-sequence backward."""
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "examples" / "attention_bwd_varlen.kg"
            ).read_text().replace("bf16[", "f16[").replace("128]", "32]")
    module = parse(text, "attention_bwd_varlen.kg")
    assert verify(module) == []
    inputs, scale, want = packed_case((5, 40, 17), (9, 23, 17), True, seed=7)
    d = (inputs["dO"].astype(np.float64) * want["O"]).sum(-1).astype(np.float32)
    got = evaluate(module.kernels[0], dict(inputs, lse=want["lse"].astype(np.float32), D=d),
                   {"scale": scale}, block=16)
    for key in ("dQ", "dK", "dV"):
        close(got[key], want[key])


def test_reference_keeps_each_sequence_apart():
    """The packed backward is not the dense one over the concatenation: a key of one sequence
    adds nothing to another's queries."""
    inputs, scale, want = packed_case((20, 20), (20, 20), False, seed=3)
    ks = kernels(signature(False))
    lse32 = want["lse"].astype(np.float32)
    d = (inputs["dO"].astype(np.float64) * want["O"]).sum(-1).astype(np.float32)
    got = evaluate(ks["main"], dict(inputs, lse=lse32, D=d), {"scale": scale}, block=16)
    close(got["dK"], want["dK"])
    merged, _, whole = packed_case((40,), (40,), False, seed=3)
    assert np.abs(whole["dK"] - want["dK"]).max() > 0.05  # the two meanings differ here


# ---------------------------------------------------------------------------------------------
# The plan and the builds


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_plan_is_packed_along_rows_and_loop(arch):
    built = build_verified(kernels(signature(True, arch, d=128))["main"], arch)
    plan = built.plan
    assert plan.packed_along("rows").offsets == "cu_seqlens_k"
    assert plan.packed_along("loop").offsets == "cu_seqlens_q"
    assert {p.name: p.packed for p in plan.params if p.packed} == {
        "Q": "loop", "K": "rows", "V": "rows", "dO": "loop", "lse": "loop", "D": "loop",
        "dQacc": "loop", "dK": "rows", "dV": "rows"}
    fields = [f.name for f in plan.fields]
    assert "rows_total" in fields and "loop_total" in fields
    source = built.source
    assert "const int row_start = p.cu_seqlens_k[batch];" in source
    assert "if (row0 >= rows) return;" in source
    assert "float* g = p.dQacc + loop_start * p.dQacc_ld + head * p.dQacc_hs;" in source
    if arch == "sm_90a":
        assert plan.wgmma is not None and plan.wgmma.lpt_l2_bytes is None
        assert "packed sequences" in plan.wgmma.lpt_why
        assert "row_start + row0, K_head" in source and "loop_start + kv0, Q_head" in source
    else:
        assert "p.Q + loop_start * p.Q_ld + head * p.Q_hs + start * p.Q_ld" in source


def test_dense_backward_is_unchanged_by_the_packed_path():
    dense = build_verified(kernels(signature(True, "sm_90a", d=128))["main"], "sm_90a")
    from kgen.attention_grad import backward_module

    module = backward_module(BackwardSignature("bf16", 128, True, "sm_90a"))
    main = next(k for k in module.kernels if k.name.endswith("_main"))
    plain = build_verified(main, "sm_90a")
    assert "loop_start" not in plain.source and "row_start" not in plain.source
    assert plain.plan.packed == () and dense.plan.packed != ()


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal, gqa, deterministic, d_v", [
    (False, False, False, 128), (True, False, False, 128), (True, True, False, 128),
    (True, False, True, 128), (True, False, False, 64), (True, True, False, 64)])
def test_nvrtc_compiles_the_packed_backward(arch, causal, gqa, deterministic, d_v):
    from kgen.runtime.nvrtc import compile_cubin

    sig = BackwardSignature("bf16", 128, causal, arch, gqa=gqa, deterministic=deterministic,
                            d_v=d_v)
    for kernel in kernels(sig).values():
        built = build_verified(kernel, arch)
        resources = compile_cubin(built.source, built.plan.name, arch).resources()
        # GQA over packed sequences spills a little (NVRTC 13: 8 bytes stored)
        allowed = 16 if gqa else 0
        assert resources.get("spill_stores", 0) <= allowed, resources


# ---------------------------------------------------------------------------------------------
# Refusals


def test_packed_backward_lines_are_checked_as_the_forward_s():
    text = av.backward_text(signature(False)).replace("packed S by cu_seqlens_q",
                                                      "packed D by cu_seqlens_q")
    with pytest.raises(KgenError, match="only the kernel's rows .T. and its loop's dimension"):
        verify(parse(text, "v.kg"))


def test_with_schedule_refuses_the_longest_first_over_packed_sequences():
    from kgen.targets.sm90.loop_dag_schedule import with_schedule

    plan = build_verified(kernels(signature(True, "sm_90a", d=128))["main"], "sm_90a").plan
    with pytest.raises(ValueError, match="packed sequences"):
        with_schedule(plan, lpt=True)
