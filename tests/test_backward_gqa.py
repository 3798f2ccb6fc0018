"""GQA / MQA and deterministic mode in the attention backward (issue 52; docs/language.md, "The
backward"): the language's head rules, the NumPy reference against a direct float64 backward
with K and V shared by the query heads of a group, the plan (a CTA per KV head walking its
group), `reductions deterministic` (its semaphores: plan, inspect, zeroing, launchers), and
kgen.attention's backward text. The GPU runs are tests/gpu/test_attention_bwd_gqa_gpu.py."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.reference import evaluate
from kgen.verify import verify
from tests.test_backward_language import CAUSAL, gradients, numpy_backward

ROOT = Path(__file__).resolve().parent.parent
TEXT = (ROOT / "examples" / "attention_bwd.kg").read_text()
NO_MASK = "pt = exp(scale * acc - lse[col])"


def gqa_text(text: str = TEXT) -> str:
    """K, V, dK, dV with the KV heads HKV."""
    for name in ("K", "V", "dK", "dV"):
        old = f"tensor {name} : bf16[B, H,"
        assert old in text, old
        text = text.replace(old, f"tensor {name} : bf16[B, HKV,")
    return text


def deterministic_text(text: str = TEXT) -> str:
    return text.replace("kernel attention_bwd {\n", "kernel attention_bwd {\n"
                        "  reductions deterministic\n", 1)


def kernel_of(text: str) -> ir.Kernel:
    module = parse(text, "b.kg")
    assert verify(module) == []
    return module.kernels[0]


def plan_of(text: str, arch: ir.Arch = ir.Arch.SM80, tile: bool = True):
    if not tile:
        text = text.replace("    tile 128x32\n", "")
    return build_verified(kernel_of(text), arch)


# ---------------------------------------------------------------------------------------------
# The language: which heads each parameter has


@pytest.mark.parametrize("change, message", [
    (("dK : bf16[B, HKV,", "dK : bf16[B, H,"),
     "'dK' is stored by the kernel's epilogue, once per KV head .* declare it with the heads "
     "HKV of 'K'"),
    (("dO : bf16[B, H,", "dO : bf16[B, HKV,"),
     "'dO' is streamed along loop 'q', which walks the query heads H of 'Q': declare it with "
     "them"),
    (("vector lse : f32[B, H, S]", "vector lse : f32[B, H2, S]"),
     "vector 'lse' has heads H2: in a loop whose rows are 'K''s .* an input has one of the two"),
    (("vector D : f32[B, H, S]", "vector D : f32[B, S]"),
     "vector 'D' has a batch dimension but no heads dimension; give it the query heads H of "
     "'Q' or the KV heads HKV of 'K'"),
])
def test_gqa_heads_are_checked_at_the_parameter(change, message):
    text = gqa_text()
    assert change[0] in text
    with pytest.raises(KgenError, match=message):
        verify(parse(text.replace(*change), "b.kg"))


def test_gqa_with_numbers_needs_a_multiple():
    text = gqa_text().replace("[B, H,", "[B, 6,").replace("[B, HKV,", "[B, 4,")
    with pytest.raises(KgenError, match="'Q' has 6 heads, not a multiple of the 4 heads of 'K'"):
        verify(parse(text, "b.kg"))
    assert verify(parse(gqa_text().replace("[B, H,", "[B, 8,").replace("[B, HKV,", "[B, 2,"),
                        "b.kg")) == []


def test_reductions_deterministic_needs_an_accumulate_tensor():
    text = (ROOT / "examples" / "attention_fwd.kg").read_text()
    assert "kernel attention_fwd {\n" in text
    text = text.replace("kernel attention_fwd {\n",
                        "kernel attention_fwd {\n  reductions deterministic\n")
    with pytest.raises(KgenError, match="'reductions deterministic' orders the adds .* kernel "
                                        "'attention_fwd' is a loop kernel with none"):
        verify(parse(text, "a.kg"))


# ---------------------------------------------------------------------------------------------
# The reference: K and V shared by the query heads of a group, dK and dV summed over it


def gqa_case(causal: bool, heads: int, kv_heads: int, s=37, t=29, d=32, seed=0):
    program = gqa_text().replace("128]", f"{d}]").replace("bf16[", "f16[")
    if not causal:
        program = program.replace(CAUSAL, NO_MASK)
    kernel = kernel_of(program)
    scale = float(np.float32(1 / np.sqrt(d)))
    rng = np.random.default_rng(seed)
    q, do = (rng.standard_normal((2, heads, s, d)).astype(np.float16) for _ in range(2))
    k, v = (rng.standard_normal((2, kv_heads, t, d)).astype(np.float16) for _ in range(2))
    group = heads // kv_heads
    q64, do64 = q.astype(np.float64), do.astype(np.float64)
    k64, v64 = (np.repeat(x.astype(np.float64), group, axis=1) for x in (k, v))
    lse, dd, _ = numpy_backward(q64, k64, v64, do64, scale, causal)
    lse32, d32 = lse.astype(np.float32), dd.astype(np.float32)
    p = np.exp(scale * q64 @ np.swapaxes(k64, -1, -2) - lse32.astype(np.float64)[..., None])
    if causal:
        p = np.where(np.arange(t)[None, :] <= np.arange(s)[:, None], p, 0)
    dq, dk, dv = gradients(q64, k64, v64, do64, p, d32.astype(np.float64), scale)
    # dK, dV of a KV head: the sum over the query heads of its group
    dk, dv = (x.reshape(2, kv_heads, group, t, d).sum(2) for x in (dk, dv))
    got = evaluate(kernel, {"Q": q, "K": k, "V": v, "dO": do, "lse": lse32, "D": d32},
                   {"scale": scale}, block=16)
    return (dq, dk, dv), got


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("heads, kv_heads", [(4, 2), (4, 1), (8, 2), (2, 2)])
def test_reference_gqa_matches_a_direct_backward(causal, heads, kv_heads):
    (dq, dk, dv), got = gqa_case(causal, heads, kv_heads)
    assert got["dQ"].shape == dq.shape and got["dK"].shape == dk.shape == got["dV"].shape
    for want, have in ((dq, got["dQ"]), (dk, got["dK"]), (dv, got["dV"])):
        assert np.abs(have.astype(np.float64) - want).max() <= 4e-3 * max(np.abs(want).max(),
                                                                           0.05)


def test_reference_gqa_sums_the_group_not_one_head():
    """The comparison can fail: dK of one query head alone is far from the group's sum."""
    (_, dk, _), got = gqa_case(False, 4, 1)
    (_, dk_one, _), _ = gqa_case(False, 1, 1)
    assert np.abs(got["dK"].astype(np.float64) - dk).max() < 0.05 * np.abs(dk).max()
    assert np.abs(dk_one - dk).max() > 0.2 * np.abs(dk).max()


# ---------------------------------------------------------------------------------------------
# The plan and the emitted code


@pytest.mark.parametrize("arch, tile", [(ir.Arch.SM80, True), (ir.Arch.SM90A, True),
                                        (ir.Arch.SM90A, False)])
def test_gqa_plan_walks_the_group(arch, tile):
    b = plan_of(gqa_text(), arch, tile)
    plan = b.plan
    assert plan.gqa and plan.deterministic is None
    assert {p.name for p in plan.params if p.kv} == {"K", "V", "dK", "dV"}
    assert (plan.wgmma is not None) == (not tile)
    src = b.source
    # (the causal example on the wgmma skeleton: the longest-first order's tile gives the head)
    lpt = plan.wgmma is not None and plan.wgmma.lpt_l2_bytes is not None
    assert f"const int kv_head = {'tile_y' if lpt else 'blockIdx.y'};  // GQA" in src
    assert "visits = p.group * span" in src
    assert "p.heads / p.group, p.batches);" in src  # the launcher's grid: KV heads
    # the MHA program's code is unchanged: no group walk
    mha = plan_of(TEXT, arch, tile)
    assert not mha.plan.gqa and "visits = p.group * span" not in mha.source


def test_gqa_kernel_epilogue_cannot_read_a_query_head():
    text = gqa_text().replace("dV = dv\n", "dV = dv * head\n")
    assert text != gqa_text()
    with pytest.raises(KgenError, match="the kernel's epilogue runs once per KV head .* cannot "
                                        "read head"):
        plan_of(text)


@pytest.mark.parametrize("arch, tile", [(ir.Arch.SM80, True), (ir.Arch.SM90A, False)])
@pytest.mark.parametrize("gqa", [False, True])
def test_deterministic_plan_semaphores_and_zeroing(arch, tile, gqa):
    text = deterministic_text(gqa_text() if gqa else TEXT)
    b = plan_of(text, arch, tile)
    plan = b.plan
    assert plan.deterministic is not None and "semaphores" in plan.deterministic.value
    assert plan.fields[-1].name == "add_order" and plan.fields[-1].param is None
    # the sm_90a wgmma skeleton's add warp adds the CTA's whole tile: one semaphore a block
    assert plan.adders == (1 if plan.wgmma is not None else plan.warps)
    values = {"loop_len": 100, "batches": 2, "heads": 3}
    assert plan.order_words(values) == 2 * 3 * -(-100 // plan.block) * plan.adders
    src = b.source
    assert "int* add_order;" in src
    order = r"(order|p.add_order \+ [^,;]*)"
    # (the sm_90a skeleton's rank: the tile's place in its pair's launch order)
    rank = r"(blockIdx.x|order_rank)"
    assert re.search(r"wait_order\(" + order + ", " + rank + " > 0 && block >= ", src)
    assert re.search(r"release_order\(" + order + r", (static_cast<int>\(blockIdx.x\)|order_rank)"
                     r" \+ 1\)", src)
    # causal: the tile before's bounds decide whether it is waited for
    assert "before_first = first_block;" in src
    # the zeroing kernel zeroes the semaphores; the launcher sizes them
    zero = src[src.index("_zero(const"):]
    assert "order[first *" in zero
    assert "size_t attention_bwd_workspace_bytes(const attention_bwd_params& p) {" in src
    assert "p.add_order == nullptr" in src
    if plan.wgmma is not None:  # the add warp's adds complete before its release
        release = src.index("release_order(p.add_order")
        assert "bulk_group_wait();\n          __threadfence();\n          release_order" in src
        # the staging freed once read (the consumers stage the next block meanwhile)
        assert src.rindex("named_barrier_arrive(kAddFree", 0, release) > \
            src.rindex("bulk_group_wait_read();", 0, release)


@pytest.mark.parametrize("gqa", [False, True])
def test_deterministic_causal_order_is_decreasing_on_sm90a(gqa):
    """The rulebook's order (dag_wgmma_rules.DAG_WGMMA_DESCENDING): under a causal mask the
    tile after adds each block first, the CTAs launched in decreasing tile order (the grid's:
    DAG_WGMMA_ORDERED_SKIPS_WHY); the option lpt=True launches them in sections of pairs, a
    pair's tiles in the adds' order; descending=False gives the increasing order."""
    from kgen.targets.sm90.loop_dag import emit
    from kgen.targets.sm90.loop_dag_schedule import with_schedule

    sm90 = dict(arch=ir.Arch.SM90A, tile=False)
    b = plan_of(deterministic_text(gqa_text() if gqa else TEXT), **sm90)
    w = b.plan.wgmma
    assert w.descending and "decreasing order" in w.order_why and w.lpt_l2_bytes is None
    src = b.source
    assert ("const int row0 = (static_cast<int>(gridDim.x) - 1 - static_cast<int>(blockIdx.x))"
            " * kRowsPerCta;") in src
    assert "const int order_rank = blockIdx.x;" in src and "kLptL2Bytes" not in src
    assert "const int row0_before = row0 + kRowsPerCta;" in src
    assert "if (order_rank > 0 && row0_before < rows) {" in src
    emitted = lambda plan: emit(plan, source_name="t", source_hash="0", command="t")  # noqa
    sections = emitted(with_schedule(b.plan, lpt=True))
    assert "order_rank = r / width;" in sections
    assert "tile_x = static_cast<int>(gridDim.x) - 1 - order_rank;" in sections
    old = with_schedule(b.plan, descending=False)
    assert not old.wgmma.descending and b.plan.deterministic == old.deterministic
    src = emitted(old)
    assert "const int row0 = blockIdx.x * kRowsPerCta;" in src
    assert "const int row0_before = row0 - kRowsPerCta;" in src
    assert "if (order_rank > 0) {" in src
    assert "tile_x = order_rank;" in emitted(with_schedule(old, lpt=True))
    # no mask: every tile reaches a block at the same visit, the increasing order
    plain = plan_of(deterministic_text().replace(CAUSAL, NO_MASK), **sm90).plan
    assert not plain.wgmma.descending and "increasing order" in plain.wgmma.order_why
    # ... launched in sections of pairs, a pair's tiles a section's width apart
    assert plain.wgmma.lpt_l2_bytes and "tile_x = order_rank;" in emitted(plain)
    with pytest.raises(ValueError, match="decreasing order is deterministic mode's"):
        with_schedule(plain, descending=True)
    # not deterministic: no order
    assert not plan_of(TEXT, **sm90).plan.wgmma.descending


def test_deterministic_without_a_mask_waits_for_every_tile_before():
    src = plan_of(deterministic_text().replace(CAUSAL, NO_MASK)).source
    assert "before_first" not in src
    assert "wait_order(order, blockIdx.x > 0 ? static_cast<int>(blockIdx.x) : 0)" in src


def test_inspect_shows_gqa_and_deterministic():
    from kgen.report_loop_dag import summary

    s = summary(plan_of(deterministic_text(gqa_text())).plan)
    assert s["grid"] == "(ceil(T / 128), KV heads, batch)"
    assert "walks the blocks of every query head" in s["gqa"]
    assert "semaphores" in s["deterministic"]["value"]
    s = summary(plan_of(TEXT).plan)
    assert s["gqa"] is None and s["deterministic"] is None


def test_deterministic_refuses_bounds_moving_both_ways():
    text = deterministic_text().replace(
        CAUSAL, "pt = where((row <= col) * (col <= 4000 - row), exp(scale * acc - lse[col]), 0)")
    kernel = kernel_of(text)
    with pytest.raises(KgenError, match="needs the mask's bounds on col to move the same way"):
        build_verified(kernel, ir.Arch.SM80)
    # not deterministic, the same mask skips blocks by both bounds
    plan = build_verified(kernel_of(text.replace("  reductions deterministic\n", "")),
                          ir.Arch.SM80).plan
    assert len(plan.bounds.bounds) == 2


def test_runtime_grid_and_workspace_member():
    from kgen.plan.loop_dag import ORDER_FIELD
    from kgen.runtime.calls import member_kind
    from kgen.plan import FieldKind

    plan = plan_of(deterministic_text(gqa_text())).plan
    field = next(f for f in plan.fields if f.name == ORDER_FIELD)
    assert member_kind(plan, field) is FieldKind.WORKSPACE


# ---------------------------------------------------------------------------------------------
# kgen.attention's backward and the sequence's launcher


def test_backward_text_gqa_and_deterministic():
    from kgen.attention_grad import BackwardSignature, backward_module, backward_text

    text = backward_text(BackwardSignature("bf16", 64, True, "sm_80", gqa=True,
                                           deterministic=True))
    assert "reductions deterministic" in text
    assert re.search(r"tensor K : bf16\[B, HKV, T, 64\]", text)
    assert re.search(r"tensor dV : bf16\[B, HKV, T, 64\] row out", text)
    assert re.search(r"tensor Q : bf16\[B, H, S, 64\]", text)
    plain = backward_text(BackwardSignature("bf16", 64, True, "sm_80"))
    assert "HKV" not in plain and "reductions" not in plain
    backward_module(BackwardSignature("bf16", 64, False, "sm_90a", gqa=True, deterministic=True))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_sequence_launcher_carries_the_kernel_s_own_workspace(arch):
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.sequence import build_sequence

    sig = BackwardSignature("bf16", 128, True, arch, gqa=True, deterministic=True)
    module = backward_module(sig)
    built = build_sequence(module, module.sequences[0], arch)
    main = f"{sig.name}_main"
    src = built.source
    assert f"unsigned long long own_{main};" in src
    assert f"w.own_{main} = at;" in src
    assert ("k.add_order = reinterpret_cast<int*>(reinterpret_cast<unsigned long long>"
            f"(workspace) + w.own_{main});") in src


def test_refuse_gqa_without_enable_gqa():
    torch = pytest.importorskip("torch")
    from kgen.attention_grad import _refuse
    from kgen.errors import ArgumentError

    q = torch.empty(1, 4, 8, 64)
    k = torch.empty(1, 2, 8, 64)
    _refuse(q, k, k, {"enable_gqa": True})
    with pytest.raises(ArgumentError, match="GQA takes enable_gqa=True"):
        _refuse(q, k, k, {})
    with pytest.raises(ArgumentError, match="GQA takes enable_gqa=True"):
        _refuse(q, torch.empty(1, 3, 8, 64), torch.empty(1, 3, 8, 64), {"enable_gqa": True})


@pytest.mark.slow
@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("gqa, deterministic", [(True, False), (False, True), (True, True)])
def test_nvrtc_compiles_without_spills(arch, gqa, deterministic):
    from kgen.runtime.nvrtc import compile_cubin

    text = gqa_text() if gqa else TEXT
    text = deterministic_text(text) if deterministic else text
    b = plan_of(text, arch, tile=arch is ir.Arch.SM80)
    result = compile_cubin(b.source, b.plan.name, arch.value)
    resources = result.resources()
    # the wgmma skeleton's deterministic build (causal, D 128) spills one register around the
    # semaphore's wait (NVRTC 13: 4 bytes; none without the wait): at most 8 bytes allowed
    allowed = 8 if deterministic and arch is ir.Arch.SM90A else 0
    assert resources.get("spill_stores", 0) <= allowed, resources
    assert resources.get("spill_loads", 0) <= allowed, resources


@pytest.mark.slow
@pytest.mark.skipif(__import__("shutil").which("nvcc") is None, reason="needs nvcc on PATH")
def test_the_launcher_sizes_and_requires_the_semaphores(tmp_path):
    """The .cu's host API (nvcc, no GPU): `<name>_workspace_bytes` is the plan's semaphore
    words x 4, a null `p.add_order` is refused (with a loop to order), and the grid's y is the
    KV heads."""
    from tests.kernels import run_host_probe

    b = plan_of(deterministic_text(gqa_text()))
    plan, name = b.plan, b.plan.name
    (tmp_path / "k.cu").write_text(b.source)
    sizes = {"rows": 300, "loop_len": 1000, "heads": 8, "group": 4, "batches": 3}
    body = [f"  {name}_params p{{}};"]
    body += [f"  p.{key} = {value};" for key, value in sizes.items()]
    body += [f'  std::printf("bytes|%zu\\n", {name}_workspace_bytes(p));',
             f"  const char* why = {name}_cfg::params_reason(p);",
             '  std::printf("null|%s\\n", why ? why : "");',
             "  p.add_order = reinterpret_cast<int*>(0x100000ull);",
             f"  why = {name}_cfg::params_reason(p);",
             '  std::printf("given|%s\\n", why ? why : "");']
    printed = run_host_probe(tmp_path, ['#include "k.cu"'], body, "sm_80")
    assert int(printed["bytes"]) == 4 * plan.order_words(sizes)
    assert printed["null"].startswith("p.add_order, deterministic mode's semaphores")
    assert printed["given"] == ""
    assert "p.heads / p.group, p.batches);" in b.source


def test_gqa_stores_a_score_gemms_tile_per_visit_with_the_query_heads():
    """A tile stored from a score gemm's epilogue (attn_mask's gradient, dBiasT = dst) is one
    tile per visit, at its query head: declared with the heads H of Q (the KV heads refused,
    said at the tensor); both skeletons address it per visit."""
    text = gqa_text().replace("  tensor dV : bf16[B, HKV, T, 128] out\n",
                              "  tensor dV : bf16[B, HKV, T, 128] out\n"
                              "  tensor dBiasT : bf16[B, H, T, S] row out\n")
    text = text.replace("epilogue { dst = pt * (acc - D[col]) }",
                        "epilogue {\n        dst = pt * (acc - D[col])\n        dBiasT = dst\n      }")
    assert text.count("dBiasT") == 2
    for arch in (ir.Arch.SM80, ir.Arch.SM90A):
        source = plan_of(text, arch, tile=arch is ir.Arch.SM80).source
        head = source.index("const int head = ")  # a visit's query head, then its pointer
        assert source.index("g_dBiasT = p.dBiasT + batch * p.dBiasT_bs + head * p.dBiasT_hs",
                            head) > head
    with pytest.raises(KgenError, match="'dBiasT' is stored by a score gemm in the loop, a tile "
                                        "per visit of a query head: declare it with the heads H"):
        plan_of(text.replace("tensor dBiasT : bf16[B, H,", "tensor dBiasT : bf16[B, HKV,"))
