"""The sm_90a backward's schedule (kgen/targets/sm90/loop_dag.py's wgmma group schedule, the
plan options of kgen/targets/sm90/loop_dag_schedule.with_schedule, the rulebook's choice in
kgen/targets/dag_wgmma_rules.py): where each wgmma group is issued, waited for and fenced, the
producer's staging of lse and D, the longest-first launch order; each option compiles without a
warning and, where the rulebook takes it, without spills."""
from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.parse import parse
from kgen.targets.sm90.loop_dag import emit
from kgen.targets import dag_wgmma_rules as rules
from kgen.targets.sm90.loop_dag_schedule import with_schedule
from kgen.verify import verify

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "examples" / "attention_bwd.kg").read_text()
MASKED = "where(row <= col, exp(scale * acc - lse[col]), 0)"


def built(d: int, causal: bool, **options):
    text = TEXT.replace("128]", f"{d}]").replace("    tile 128x32\n", "\n")
    if not causal:
        text = text.replace(MASKED, "exp(scale * acc - lse[col])")
    module = parse(text, "attention_bwd.kg")
    assert verify(module) == []
    b = build_verified(module.kernels[0], ir.Arch.SM90A)
    if options:
        plan = with_schedule(b.plan, **options)
        b = dataclasses.replace(b, plan=plan, source=emit(
            plan, source_name="attention_bwd.kg", source_hash="0", command="test"))
    return b


def body(source: str) -> str:
    """The consumers' loop over the blocks."""
    start = source.index("  for (int visit = 0; visit < visits; ++visit) {\n    const int block")
    return source[start:source.index("  // The kernel's epilogue, once")]


def checked(source: str) -> str:
    """The loop's checked body (the only one without the fast body)."""
    loop = body(source)
    return loop[loop.index("} else {"):] if "} else {" in loop else loop


def test_the_rulebook_schedules_by_head_dim_and_mask():
    for d, causal in itertools.product((64, 128), (False, True)):
        w = built(d, causal).plan.wgmma
        assert w.issue_ahead == (d == 64)  # at D 128 two score tiles in flight spill
        assert w.wait_accumulating == (d == 128)
        assert w.defer_accumulating and w.vector_offset is not None
        assert (w.lpt_l2_bytes is not None) == causal  # only where tiles visit unequal counts
        assert (w.producer_registers, w.consumer_registers) == (40, 232) and w.fast_body


def test_issue_ahead_waits_for_the_first_score_gemm_with_the_second_in_flight():
    loop = checked(built(64, False).source)
    st, dpt = loop.index("// st: the warpgroup's"), loop.index("// dpt: the warpgroup's")
    assert st < dpt < loop.index("// st's epilogue") < loop.index("// dpt: issued ahead")
    # st waited with dpt in flight; dpt waited with dv in flight; dq with dk in flight
    assert re.findall(r"wgmma_wait<(\d)>", loop) == ["1", "1", "1", "0"]
    # each at its statement: dv (issued before dpt) completes with dpt's wait
    off = checked(built(64, False, issue_ahead=False, defer_accumulating=False).source)
    assert "issued ahead" not in off
    assert re.findall(r"wgmma_wait<(\d)>", off) == ["0", "0", "0"]


def test_a_wait_that_an_earlier_wait_covered_is_left_out():
    loop = checked(built(128, False, issue_ahead=True, wait_accumulating=True).source)
    # dv is waited for at once (wait<0>), which completes dpt too: no second wait for dpt
    after = loop[loop.index("// dpt: issued ahead"):loop.index("// dpt's epilogue")]
    assert "wgmma_wait" not in after and "complete: waited for above" in after


def test_defer_issues_the_accumulating_gemm_after_the_loop_row_gemm():
    loop = checked(built(128, False).source)
    assert loop.index("// dk: issued after the loop-row gemm") < loop.index("// dq = (the staged")
    dq = loop[loop.index("// dq = (the staged"):]
    assert dq.index("wgmma_ss_mn_n64") < dq.index("wgmma_rs(acc_g3") < dq.index("wgmma_wait<1>")
    # dk (and its A registers) waited for and fenced at the block's end
    tail = loop[loop.index("the last gemms of the block"):]
    assert "fence_operand(acc_g3)" in tail and "fence_operand(hand_v" in tail


def test_staged_vectors_are_read_from_shared_memory_and_released_by_every_thread():
    source = built(128, True).source
    loop = body(source)
    assert "g_lse" not in loop and "s_lse[col - kv0]" in loop and "s_D[col - kv0]" in loop
    assert "cp_async_4(smem_address(&smem.vec_lse[slot][c])" in source
    assert "mbarrier_init(full_q_ring + 8 * s, 1 + 32)" in source
    assert "mbarrier_init(empty_q_ring + 8 * s, kConsumers * kWarpgroupThreads)" in source
    assert "mbarrier_arrive(empty_q_ring + 8 * slot);\n\n    __syncwarp();" in loop
    off = built(128, True, stage_vectors=False)
    assert "vec_lse[j][e] = col < loop_len ? to_float(g_lse[col]) : 0.0f" in off.source
    assert off.plan.smem_bytes == built(128, True).plan.smem_bytes - 2 * 4 * 2 * 64
    assert off.plan.wgmma.producer_registers == 24


def test_the_fast_body_runs_the_blocks_inside_the_mask_without_checks():
    loop = body(built(128, True).source)
    fast = loop[loop.index("if (block >= fast_begin && block < fast_end) {"):loop.index("} else {")]
    edge = checked(built(128, True).source)
    assert "constexpr bool interior = true;" in fast and "col < loop_len ?" not in fast
    assert "const bool interior = block >= inside_begin && block < inside_end;" in edge
    assert edge.count("col < loop_len ?") == 2  # the two hand-ons
    assert "fast_begin = 0, fast_end = blocks - 1;" in built(128, False).source
    one = built(128, True, fast_body=False)
    assert "fast_begin" not in one.source and "interior" not in body(one.source)
    assert "known true" not in one.source


def test_lpt_order_only_with_a_mask():
    assert "kLptL2Bytes" in built(64, True).source
    assert "kLptL2Bytes" not in built(64, False).source
    assert "kLptL2Bytes" not in built(64, True, lpt=False).source
    assert "kLptL2Bytes" not in built(64, False, lpt=True).source  # the option too


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("options", [
    dict(issue_ahead=True), dict(issue_ahead=False), dict(stage_vectors=False),
    dict(defer_accumulating=False), dict(lpt=False), dict(fast_body=False),
    dict(issue_ahead=False, stage_vectors=False, defer_accumulating=False, lpt=False,
         fast_body=False)],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_every_option_compiles_without_a_warning(d, causal, options):
    from kgen.runtime.nvrtc import compile_cubin

    b = built(d, causal, **options)
    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    assert "warning" not in result.log.lower(), result.log


# ---------------------------------------------------------------------------------------------
# GQA: a CTA owns (key tile, KV head) and walks the blocks of each query head of its group


def gqa_built(d: int, mask: str, deterministic: bool = False, **options):
    """The GQA backward (K, V, dK, dV of HKV heads) at head dim `d`, `mask` (tests/gpu/
    attention_bwd_checks.MASKS), built for sm_90a by the rulebook, then `options`
    (with_schedule's)."""
    from tests.gpu.attention_bwd_checks import kernel_text

    text = kernel_text(d, mask, arch="sm_90a", gqa=True, deterministic=deterministic)
    b = build_verified(parse(text, "b.kg").kernels[0], ir.Arch.SM90A)
    assert b.plan.gqa
    if options:
        plan = with_schedule(b.plan, **options)
        b = dataclasses.replace(b, plan=plan, source=emit(
            plan, source_name="b.kg", source_hash="0", command="test"))
    return b


def gqa_body(source: str) -> str:
    """The consumers' GQA walk over the visits."""
    start = source.index("  for (int visit = 0; visit < here(p.group) * span; ++visit) {")
    return source[start:source.index("  // The kernel's epilogue, once")]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "top_left", "bottom_right"])
def test_gqa_takes_the_fast_body_the_longest_first_and_the_staged_vectors(d, mask):
    """The rulebook's GQA schedule is MHA's: the blocks inside the mask are the same in each
    query head's visits, a tile's work is the group's heads times its blocks (MHA's ranking by
    tile), and the producer's vector warp takes each visit's head."""
    causal = mask != "none"
    b = gqa_built(d, mask)
    w = b.plan.wgmma
    assert w.fast_body and w.fast_body_why == rules.DAG_WGMMA_FAST_BODY_WHY
    assert (w.lpt_l2_bytes is not None) == causal
    assert w.lpt_why == (rules.DAG_WGMMA_LPT_WHY if causal else "the grid's order")
    assert w.vector_offset is not None and b.plan.vectors == ("lse", "D")
    assert (w.producer_registers, w.consumer_registers) == rules.DAG_WGMMA_VECTOR_REGISTERS
    src = b.source
    loop = gqa_body(src)
    # the fast body: block (= first_block + visit % span) inside the mask but each head's last
    assert "if (block >= fast_begin && block < fast_end) {" in loop
    assert "constexpr bool interior = true;" in loop if causal else "interior" not in loop
    # the vectors read from shared memory, staged per visit at its query head
    assert "g_lse" not in loop and "s_lse[col - kv0]" in loop
    vec = src[src.index("The producer's second warp"):src.index("else if (tid / 32 == kAddWarp)")]
    head = vec.index("const int head = kv_head * p.group + visit / span;")
    assert head < vec.index("const float* g_lse = p.lse + batch * p.lse_bs + head * p.lse_hs;")
    assert "const int kv0 = (first_block + visit % span) * kBlock;" in vec
    if causal:  # the longest first: the KV head is the LPT order's, the L2 bytes the group's
        assert "const int kv_head = tile_y;  // GQA" in src
        assert "const int head = tile_y;" not in src
        assert "static_cast<long long>(loop_len) * p.group * kStreamedRowBytes" in src
        assert "const int head = kv_head * p.group + visit / span;" in loop
        kernel = src[src.index("const int kv_head = tile_y;"):src.index("_zero(const")]
        assert "blockIdx.y" not in kernel  # (the zeroing kernel's grid is the query heads')
    else:
        assert "const int kv_head = blockIdx.y;  // GQA" in src
        assert "const int head = static_cast<int>(blockIdx.y) * p.group + visit / span;" in loop


def test_gqa_options_switch_each_piece_off_and_on():
    """with_schedule takes the fast body, the longest-first order and the staged vectors with
    GQA (each off as the session-8 schedule had them; each back on)."""
    off = gqa_built(128, "top_left", lpt=False, fast_body=False, stage_vectors=False)
    w = off.plan.wgmma
    assert not w.fast_body and w.lpt_l2_bytes is None and w.vector_offset is None
    assert off.plan.vectors == () and (w.producer_registers, w.consumer_registers) == (24, 240)
    loop = gqa_body(off.source)
    assert "fast_begin" not in off.source and "kLptL2Bytes" not in off.source
    assert "const float* __restrict__ g_lse = p.lse + batch * p.lse_bs + head * p.lse_hs;" in loop
    on = with_schedule(off.plan, lpt=True, fast_body=True, stage_vectors=True)
    assert on.wgmma == gqa_built(128, "top_left").plan.wgmma
    assert on.smem_bytes == gqa_built(128, "top_left").plan.smem_bytes


@pytest.mark.parametrize("d", [64, 128])
def test_gqa_deterministic_launch_order(d):
    """Deterministic adds: without a mask the CTAs launched in sections of pairs, a pair's
    tiles in the adds' order (dag_wgmma_rules.DAG_WGMMA_ORDERED_SECTIONS; the grid's order the
    plan option lpt=False); under a causal mask the grid's order (sections the option lpt=True);
    at N 128 neither the fast body nor the staged vectors (either spills beside the add warp's
    semaphore waits: DAG_WGMMA_GQA_ORDERED_N), at N 64 both."""
    plain = gqa_built(d, "none", deterministic=True).plan.wgmma
    assert plain.lpt_l2_bytes == rules.DAG_WGMMA_LPT_L2_BYTES and not plain.descending
    assert plain.lpt_why == rules.DAG_WGMMA_ORDERED_SECTIONS_WHY
    ordered = gqa_built(d, "top_left", deterministic=True).plan
    w = ordered.wgmma
    assert w.lpt_l2_bytes is None and w.descending
    assert w.lpt_why == rules.DAG_WGMMA_ORDERED_SKIPS_WHY
    sections = with_schedule(ordered, lpt=True).wgmma
    assert sections.lpt_l2_bytes and sections.lpt_why == rules.DAG_WGMMA_ORDERED_SECTIONS_WHY
    spills = d > rules.DAG_WGMMA_GQA_ORDERED_N
    assert w.fast_body == (not spills) and (w.vector_offset is None) == spills
    if spills:
        assert w.fast_body_why == rules.DAG_WGMMA_GQA_ORDERED_WHY.format(n=d)
    grid = with_schedule(gqa_built(d, "none", deterministic=True).plan, lpt=False).wgmma
    assert grid.lpt_l2_bytes is None and grid.lpt_why == "the grid's order"
    on = with_schedule(ordered, fast_body=True, stage_vectors=True)  # the options still build
    assert on.wgmma.fast_body and on.wgmma.vector_offset is not None
    # MHA's deterministic build keeps both at N 128
    mha = built(128, True)
    assert mha.plan.wgmma.fast_body and mha.plan.wgmma.vector_offset is not None


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "top_left", "bottom_right"])
@pytest.mark.parametrize("deterministic", [False, True], ids=["default", "deterministic"])
def test_gqa_rulebook_builds_without_spills(d, mask, deterministic):
    from kgen.runtime.nvrtc import compile_cubin

    b = gqa_built(d, mask, deterministic)
    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    resources = result.resources()
    assert resources["spill_stores"] == resources["spill_loads"] == 0, result.log
    assert "warning" not in result.log.lower(), result.log


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "top_left"])
@pytest.mark.parametrize("options", [
    dict(fast_body=False), dict(lpt=False), dict(stage_vectors=False),
    dict(fast_body=False, lpt=False, stage_vectors=False)],
    ids=lambda o: "-".join(f"{k}={v}" for k, v in o.items()))
def test_gqa_options_compile_without_a_warning(d, mask, options):
    from kgen.runtime.nvrtc import compile_cubin

    b = gqa_built(d, mask, **options)
    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    assert "warning" not in result.log.lower(), result.log


def test_inspect_says_the_gqa_order_and_body_with_why():
    """kgen inspect (report_loop_dag.summary and its printout): the launch order and the fast
    body, each with why, for GQA by default and deterministic at N 128."""
    import io

    from rich.console import Console

    from kgen.report_loop_dag import print_summary, summary

    s = summary(gqa_built(128, "top_left").plan)
    assert s["wgmma"]["order"]["value"].startswith("the first tile of rows first")
    assert s["wgmma"]["order"]["why"] == rules.DAG_WGMMA_LPT_WHY
    assert s["wgmma"]["fast_body"]["why"] == rules.DAG_WGMMA_FAST_BODY_WHY
    ordered = summary(gqa_built(128, "top_left", deterministic=True).plan)
    assert ordered["wgmma"]["order"] == {"value": "the grid's order",
                                         "why": rules.DAG_WGMMA_ORDERED_SKIPS_WHY}
    assert ordered["wgmma"]["fast_body"] == {
        "value": "one checked body", "why": rules.DAG_WGMMA_GQA_ORDERED_WHY.format(n=128)}
    out = io.StringIO()
    print_summary(Console(file=out, width=1000), ordered)
    text = out.getvalue()
    assert "order: the grid's order (the grid's order: deterministic adds under a mask" in text
    assert "fast_body: one checked body (GQA with deterministic adds at N 128" in text
