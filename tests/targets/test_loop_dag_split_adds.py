"""dQ's adds in the split layout (head dim 192 / 256 on sm_90a; kgen/targets/dag_wgmma_rules.py
DAG_WGMMA_SPLIT_ADDS, loop_dag_schedule.ADD_MODES): the rulebook keeps the f32 atomics and says
which copy-engine way it would take; flipped, it takes the add warp's tensor reduce-adds from a
staging of their own where it fits (D 192, 192 / 128, 128 / 256: "warp") and from each warpgroup's
own boxes of the block's streamed slots where it does not (D 256: "slots", no shared memory
added); 256 / 128 keeps the atomics (neither fits). The plan values, the refusals of with_adds,
the emitted staging and release, and NVRTC's build of every case with 0 spills, no stack and no
warning (every mask, GQA, deterministic, the mods' terms, a block mask's lists)."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.plan import loop_dag as ld
from kgen.plan import program as pp
from kgen.targets import dag_wgmma_rules as rules
from kgen.targets.sm90.loop_dag_schedule import add_mode, with_adds, with_schedule
from tests.targets.test_loop_dag_compile import MASKS, built
from tests.targets.test_loop_dag_split import _backward_main, _compiles, _emitted, _fast_body


def test_split_slot_refusal_counts_a_warpgroup_s_own_boxes():
    assert rules.split_slot_refusal((256, 256), 256) is None  # 2 + 2 boxes for 4 f32 boxes
    assert rules.split_slot_refusal((128, 256), 128) is None  # 1 + 2 for 2
    assert "not whole 64-column boxes" in rules.split_slot_refusal((192, 192), 192)
    assert "(3) fewer than its share's f32 boxes (4)" in rules.split_slot_refusal((256, 128),
                                                                                   256)


def test_split_adds_takes_warp_where_it_fits_then_slots_then_atomics():
    assert rules.split_adds(100, 50, 150, (256, 256), 256, True)[0] == "warp"
    mode, why = rules.split_adds(100, 51, 150, (256, 256), 256, True)
    assert mode == "slots" and "51 B beside 100 B within 150 B" in why
    mode, why = rules.split_adds(100, 51, 150, (256, 128), 256, True)
    assert mode == "atomics" and "fewer than its share's f32 boxes" in why
    mode, why = rules.split_adds(100, 51, 150, (256, 256), 256, False)
    assert mode == "atomics" and why.startswith("the split layout keeps f32 atomics") \
        and "slots: " in why


def test_the_rulebook_keeps_the_atomics_and_says_what_the_copy_engine_would_take(monkeypatch):
    monkeypatch.setattr(rules, "DAG_WGMMA_SPLIT_ADDS", "atomics")  # (the default until timed)
    for d, would in ((256, "slots: the split layout's tiles leave no room"),
                     (192, "warp: the split layout's warpgroup shares")):
        w = built(d, "top_left", ir.Arch.SM90A).plan.wgmma
        assert add_mode(w) == "atomics" and w.add_map is None and w.add_slots == ()
        assert "DAG_WGMMA_SPLIT_ADDS" in w.adds.why and would in w.adds.why, w.adds.why


def test_flipped_the_rulebook_takes_slots_at_d256_and_warp_at_d192(monkeypatch):
    monkeypatch.setattr(rules, "DAG_WGMMA_SPLIT_ADDS", "copy engine")
    plan = built(256, "top_left", ir.Arch.SM90A).plan
    assert add_mode(plan.wgmma) == "slots" and plan.wgmma.adds.why.startswith(
        "the split layout's tiles leave no room for dQ's f32 staging (65536 B")
    assert plan.smem_bytes == 230528 and plan.adders == 1
    w192 = built(192, "none", ir.Arch.SM90A).plan.wgmma
    assert add_mode(w192) == "warp" and "staged after the tiles (49152 B" in w192.adds.why
    assert w192.add_offset % 1024 == 0 and w192.smem_bytes <= 227 * 1024
    narrow = _backward_main(256, d_v=128).plan.wgmma  # neither fits: the atomics, and why
    assert add_mode(narrow) == "atomics" and "fewer than its share's f32 boxes" in narrow.adds.why
    assert add_mode(_backward_main(128, d_v=256).plan.wgmma) == "warp"
    # GQA: the vectors loaded by the consumers; deterministic, one body for every block
    gqa = _backward_main(256, gqa=True, deterministic=True).plan
    assert add_mode(gqa.wgmma) == "slots" and gqa.wgmma.vector_offset is None
    assert not gqa.wgmma.fast_body and gqa.wgmma.fast_body_why == \
        rules.DAG_WGMMA_SPLIT_GQA_ADDS_WHY


def test_slots_stage_in_each_warpgroup_s_own_boxes_of_do_then_q():
    base = with_adds(built(256, "none", ir.Arch.SM90A).plan, "atomics")
    plan = with_adds(base, "slots")
    w = plan.wgmma
    assert add_mode(w) == "slots" and w.add_warp and w.add_offset is None
    assert w.add_slots == (ld.AddBox("do_ring", 0, 2), ld.AddBox("do_ring", 1, 2),
                           ld.AddBox("q_ring", 0, 2), ld.AddBox("q_ring", 1, 2))
    assert w.add_map == pp.LoopTensorMap("dQ", ir.DType.F32, 64, 4, False)
    assert w.tensor_maps == w.maps + (w.add_map,)
    # no shared memory added: the atomics' layout, the mbarriers right after the vectors
    assert (plan.smem_bytes, w.barrier_offset) == (base.smem_bytes, base.wgmma.barrier_offset)
    assert all(w.tile_of(b.tile).box_bytes == 64 * 32 * 4 for b in w.add_slots)
    assert "do_ring box 0 + 2 x consumer" in w.adds.value
    import dataclasses

    back = with_adds(plan, "atomics").wgmma
    assert dataclasses.replace(back, adds=base.wgmma.adds) == base.wgmma
    assert with_schedule(base, adds="slots").wgmma == w


def test_with_adds_refuses_what_the_split_layout_does_not_build():
    d256 = built(256, "none", ir.Arch.SM90A).plan
    for mode in ("rows", "tensor"):
        with pytest.raises(ValueError, match=f"the split layout adds by f32 atomics or the add "
                                             f"warp \\(warp, slots\\), not {mode}"):
            with_adds(d256, mode)
    with pytest.raises(ValueError, match="warp's staging \\(65536 B\\) does not fit"):
        with_adds(d256, "warp")
    with pytest.raises(ValueError, match="slots: a warpgroup's half of a streamed tile"):
        with_adds(built(192, "none", ir.Arch.SM90A).plan, "slots")
    with pytest.raises(ValueError, match="slots is the split layout's"):
        with_adds(built(128, "none", ir.Arch.SM90A).plan, "slots")


def test_the_emitted_slots_stage_release_and_wait_for_dk_before_q():
    b = _emitted(with_adds(built(256, "top_left", ir.Arch.SM90A).plan, "slots"))
    src, body = b.source, _fast_body(b.source)
    assert "mbarrier_init(empty_q_ring + 8 * s, kConsumers * kWarpgroupThreads + 1);" in src
    assert "mbarrier_init(empty_do_ring + 8 * s, kConsumers * 4 + 1);" in src
    assert "add_stage" not in src and src.count("tma_reduce_add_4d(maps.dQ, smem_address(") == 4
    for t in ("do_ring", "q_ring"):
        assert f"mbarrier_arrive(empty_{t} + 8 * slot);" in src
    # dO's boxes, then (dK's wgmma, deferred, reads Q) the wait, then Q's
    at = [body.index(f"smem_address(smem.{t}) + slot * 32768 + ({box} + consumer * 2) * 8192 "
                     "+ row_at)") for t, box in (("do_ring", 0), ("do_ring", 1), ("q_ring", 0),
                                                ("q_ring", 1))]
    wait = body.index("wgmma_wait<0>();  // its wgmmas issued after the loop-row gemm")
    assert at == sorted(at) and at[1] < wait < at[2]
    assert "static_assert(8192 == kAddBoxBytes" in src
    # every accumulating gemm deferred (defer_all): the wait before the first box (dV reads dO)
    defer_all = _fast_body(_emitted(with_schedule(
        built(256, "top_left", ir.Arch.SM90A).plan, defer_all=True, adds="slots")).source)
    first = defer_all.index("smem_address(smem.do_ring) + slot * 32768 + (0 + consumer * 2)")
    assert defer_all.index("wgmma_wait<0>();  // its wgmmas issued after") < first


CASES = [
    (256, "slots", dict(causal=False)), (256, "slots", dict(causal=True)),
    (256, "slots", dict(gqa=True)), (256, "slots", dict(deterministic=True)),
    (256, "slots", dict(gqa=True, deterministic=True)),
    (256, "slots", dict(mods=dict(bias="tensor", bias_grad=True))),
    (256, "slots", dict(mods=dict(dropout=True))),
    (256, "slots", dict(mods=dict(score_mod="cap * tanh(score / cap)", scalars=("cap",)))),
    (256, "slots", dict(blocks=True)), (256, "slots", dict(blocks=True, gqa=True)),
    (192, "warp", dict(causal=False)), (192, "warp", dict(causal=True)),
    (192, "warp", dict(gqa=True)), (192, "warp", dict(deterministic=True)),
    (192, "warp", dict(gqa=True, deterministic=True)),
    (192, "warp", dict(causal=True, d_v=128)), (192, "warp", dict(causal=False, d_v=128)),
    (192, "warp", dict(mods=dict(bias="tensor", bias_grad=True))),
    (192, "warp", dict(mods=dict(dropout=True))),
    (128, "warp", dict(d_v=256)), (128, "slots", dict(d_v=256)),
    (128, "slots", dict(d_v=256, gqa=True)), (128, "warp", dict(d_v=256, deterministic=True)),
]


@pytest.mark.parametrize("d, mode, options", CASES,
                         ids=[f"d{d}-{m}-" + "-".join(f"{k}" if not isinstance(v, dict) else
                                                       "-".join(v) for k, v in o.items())
                              for d, m, o in CASES])
def test_the_copy_engine_s_adds_compile_without_spills(d, mode, options):
    b = _backward_main(d, **dict(options))
    plan = with_adds(b.plan, mode)
    assert add_mode(plan.wgmma) == mode and plan.wgmma.split is not None
    _compiles(_with_source(b, plan))


@pytest.mark.parametrize("mask", list(MASKS))
def test_d256_slots_compile_without_spills_under_every_mask(mask):
    _compiles(built(256, mask, ir.Arch.SM90A, adds="slots"))


def _with_source(b, plan):
    import dataclasses

    from kgen.targets.sm90.loop_dag import emit

    return dataclasses.replace(b, plan=plan, source=emit(plan, source_name="bwd.kg",
                                                         source_hash="0", command="test"))


def test_packed_sequences_keep_the_atomics_and_with_adds_refuses_them(monkeypatch):
    """kgen.attention_varlen's backward at D 256 (packed sequences): the tensor reduce-add's box
    would add rows past a sequence's end into the next one's; the atomics, flipped or not."""
    from kgen import attention_varlen as av
    from kgen.api import build_verified
    from kgen.attention_grad import BackwardSignature
    from kgen.parse import parse

    monkeypatch.setattr(rules, "DAG_WGMMA_SPLIT_ADDS", "copy engine")
    sig = BackwardSignature("bf16", 256, True, "sm_90a")
    module = parse(av.backward_text(sig), "varlen_bwd.kg")
    (main,) = [k for k in module.kernels if k.name.endswith("_main")]
    plan = build_verified(main, ir.Arch.SM90A).plan
    assert plan.packed and plan.wgmma.split is not None
    assert add_mode(plan.wgmma) == "atomics" and plan.wgmma.adds.why == \
        rules.DAG_WGMMA_SPLIT_PACKED_WHY
    for mode in ("slots", "warp"):
        with pytest.raises(ValueError, match="not built with packed sequences"):
            with_adds(plan, mode)


@pytest.mark.parametrize("d, options, mode", [
    (256, dict(gqa=True, deterministic=True), "slots"), (256, dict(causal=True), "slots"),
    (192, dict(gqa=True), "warp"), (192, dict(causal=True, d_v=128), "warp"),
    (256, dict(d_v=128), "atomics")], ids=["d256-gqa-det", "d256", "d192-gqa", "d192-dv128",
                                           "d256-dv128"])
def test_the_flipped_rulebook_s_builds_compile_without_spills(d, options, mode, monkeypatch):
    monkeypatch.setattr(rules, "DAG_WGMMA_SPLIT_ADDS", "copy engine")
    b = _backward_main(d, **dict(options))
    assert add_mode(b.plan.wgmma) == mode
    _compiles(b)
