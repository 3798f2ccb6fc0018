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


def test_gqa_and_deterministic_keep_the_pieces_not_built_with_them():
    """GQA's visits walk a group of query heads: no staged vectors, longest-first order or fast
    body with them; deterministic adds wait for the tile before by index: the grid's order. The
    plan says why, and with_schedule refuses to switch them on."""
    from tests.test_backward_gqa import deterministic_text, gqa_text

    def plan(text: str):
        text = text.replace("    tile 128x32\n", "\n")
        return build_verified(parse(text, "b.kg").kernels[0], ir.Arch.SM90A).plan

    grouped = plan(gqa_text()).wgmma
    assert grouped.vector_offset is None and grouped.lpt_l2_bytes is None
    assert not grouped.fast_body and "GQA" in grouped.fast_body_why
    assert "GQA" in grouped.lpt_why
    ordered = plan(deterministic_text())
    assert ordered.wgmma.lpt_l2_bytes is None and "deterministic" in ordered.wgmma.lpt_why
    assert ordered.wgmma.fast_body and ordered.wgmma.vector_offset is not None
    with pytest.raises(ValueError, match="not built with GQA"):
        with_schedule(plan(gqa_text()), fast_body=True)
    with pytest.raises(ValueError, match="deterministic"):
        with_schedule(ordered, lpt=True)
