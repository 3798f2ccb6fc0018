"""The sm_90a backward's epilogue tiles (dK, dV) stored by the copy engine from the Q and dO
rings (kgen/targets/sm90/loop_dag_schedule.py `_tail`, the rulebook's
dag_wgmma_rules.DAG_WGMMA_TAIL_TMA): which ring stages which output, the maps, the refusals
with why, the emitted order (both warpgroups done with the rings before either writes them, the
writes fenced for the copy engine before one thread stores), the plan option that stores them
from registers, and NVRTC builds without spills."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.attention_grad import BackwardSignature, backward_text
from kgen.attention_grad_mods import Mods
from kgen.parse import parse
from kgen.targets import dag_wgmma_rules as rules
from kgen.targets.sm90.loop_dag import emit
from kgen.targets.sm90.loop_dag_schedule import with_schedule
from kgen.verify import verify


def main(sig: BackwardSignature):
    """The backward's main kernel built for sm_90a."""
    module = parse(backward_text(sig), "attention_bwd.kg")
    assert verify(module) == []
    kernel = next(k for k in module.kernels if k.name.endswith("_main"))
    return build_verified(kernel, ir.Arch.SM90A)


def epilogue(source: str) -> str:
    """The consumers' code after the loop."""
    start = source.index("  // The kernel's epilogue, once")
    return source[start:source.index("\n}\n", start)]


@pytest.mark.parametrize("d, d_v", [(64, 64), (128, 128), (128, 64), (64, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_each_output_is_staged_in_the_ring_of_its_columns(d, d_v, causal):
    b = main(BackwardSignature("bf16", d, causal, "sm_90a", d_v=d_v))
    w = b.plan.wgmma
    assert dict(w.tail_stores) == {"dK": "q_ring", "dV": "do_ring"}
    maps = {m.param: m for m in w.maps}
    assert (maps["dK"].box_rows, maps["dK"].boxes) == (64, d // 64)
    assert (maps["dV"].box_rows, maps["dV"].boxes) == (64, d_v // 64)
    assert {m.param for m in w.loads} == {"K", "V", "Q", "dO"}  # the producer loads no output
    assert "by the copy engine" in w.tail_store.value
    tail = epilogue(b.source)
    assert "store_fragments" not in tail and "g_dK" not in tail and "g_dV" not in tail
    for name, ring, boxes in (("dK", "q_ring", d // 64), ("dV", "do_ring", d_v // 64)):
        slot = 64 * 128 * boxes
        n8 = "kNAccN8" if d == d_v else f"kNAcc{64 * boxes}N8"
        assert (f"stage_fragments<{n8}>(smem_address(smem.{ring}) + consumer * {slot}, 8192, "
                "out,") in tail
        assert f"tma_store_box_4d(maps.{name}, smem_address(smem.{ring}) + c * {slot}" in tail


def test_the_rings_are_written_after_every_warpgroup_left_the_loop_and_stored_once_fenced():
    tail = epilogue(main(BackwardSignature("bf16", 128, True, "sm_90a")).source)
    first_barrier = tail.index("consumer_barrier();")
    staged = tail.index("stage_fragments<")
    fence = tail.index("fence_proxy_async();")
    second_barrier = tail.index("consumer_barrier();", fence)
    store = tail.index("tma_store_box_4d(")
    assert first_barrier < staged < fence < second_barrier < store
    assert tail.index("bulk_commit();") > store and tail.index("bulk_wait_read();") > store
    assert tail.count("if (tid == kWarpgroupThreads) {") == 1  # one thread stores every box


def test_gqa_stores_at_the_kv_head():
    b = main(BackwardSignature("bf16", 128, True, "sm_90a", gqa=True))
    maps = {m.param: m for m in b.plan.wgmma.maps}
    assert maps["dK"].kv and maps["dV"].kv
    tail = epilogue(b.source)
    assert "p.dK_hs != 0 ? kv_head : 0" in tail and "p.dV_hs != 0 ? kv_head : 0" in tail


def test_deterministic_mode_and_the_bias_gradient_keep_it():
    for sig in (BackwardSignature("bf16", 128, True, "sm_90a", deterministic=True),
                BackwardSignature("bf16", 128, True, "sm_90a",
                                  mods=Mods(bias="tensor", bias_grad=True))):
        w = main(sig).plan.wgmma
        assert dict(w.tail_stores) == {"dK": "q_ring", "dV": "do_ring"}, sig


def test_the_split_layout_stores_from_registers_and_says_why():
    w = main(BackwardSignature("bf16", 256, False, "sm_90a")).plan.wgmma
    assert w.split is not None and w.tail_stores == ()
    assert w.tail_store.value == "per element from registers"
    assert "split layout" in w.tail_store.why
    assert not {"dK", "dV"} & {m.param for m in w.maps}


def test_the_rulebook_switch_and_the_plan_option(monkeypatch):
    sig = BackwardSignature("bf16", 128, False, "sm_90a")
    b = main(sig)
    plan = with_schedule(b.plan, tail_tma=False)
    w = plan.wgmma
    assert w.tail_stores == () and not {"dK", "dV"} & {m.param for m in w.tensor_maps}
    source = emit(plan, source_name="x.kg", source_hash="0", command="test")
    tail = epilogue(source)
    assert "store_fragments<kNAccN8>(g_dK" in tail and "tma_store_box_4d" not in tail
    assert with_schedule(b.plan, tail_tma=True) == b.plan  # the rulebook's already
    monkeypatch.setattr(rules, "DAG_WGMMA_TAIL_TMA", False)
    off = main(sig).plan.wgmma
    assert off.tail_stores == () and "DAG_WGMMA_TAIL_TMA" in off.tail_store.why
    with pytest.raises(ValueError, match="from registers here"):
        with_schedule(dataclasses.replace(plan, wgmma=off), tail_tma=True)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [
    BackwardSignature("bf16", 64, True, "sm_90a"),
    BackwardSignature("bf16", 128, False, "sm_90a"),
    BackwardSignature("f16", 128, True, "sm_90a"),
    BackwardSignature("bf16", 128, True, "sm_90a", gqa=True, deterministic=True),
    BackwardSignature("bf16", 128, True, "sm_90a", mods=Mods(bias="tensor", bias_grad=True)),
    BackwardSignature("bf16", 64, True, "sm_90a", d_v=128)],
    ids=lambda s: s.name)
def test_builds_without_spills(sig):
    from kgen.runtime.nvrtc import compile_cubin

    b = main(sig)
    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    assert "warning" not in result.log.lower(), result.log
    resources = result.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
        resources
