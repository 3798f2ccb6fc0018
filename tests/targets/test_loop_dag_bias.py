"""The sm_90a backward's additive bias and its gradient (kgen/targets/sm90/loop_dag_schedule.py
`_bias`, `_staged_store`; kgen/targets/dag_wgmma_rules.py): BiasT staged by the producer's copy
engine in a ring of its own (the slots that fit the shared memory), dBiasT stored from the
staged dS^T slot by the copy engine, and on a causal mask the skipped blocks' zeros; the plan
options keep the storage consistent; `kgen inspect` shows the plan values."""
from __future__ import annotations

import dataclasses

import pytest

from kgen.attention_grad import BackwardSignature, backward_module
from kgen.attention_grad_mods import Mods
from kgen.sequence import build_sequence
from kgen.targets.sm90.loop_dag import emit
from kgen.targets.sm90.loop_dag_schedule import ADD_MODES, with_adds, with_schedule

GRAD = Mods(bias="tensor", bias_grad=True)


def main(d: int, causal: bool, mods: Mods = GRAD, arch: str = "sm_90a"):
    module = backward_module(BackwardSignature("bf16", d, causal, arch, mods=mods))
    built = build_sequence(module, module.sequences[0], arch)
    (plan,) = [p for p in built.plans if p.name.endswith("_main")]
    return plan, built.source


@pytest.mark.parametrize("d, slots", [(64, 2), (128, 1)])
def test_the_bias_is_staged_in_the_slots_that_fit(d, slots):
    plan, source = main(d, False)
    w = plan.wgmma
    # column-major (kgen.attention's sm_90a BiasT): boxes of [64 queries][64 keys]
    assert w.bias.param == "BiasT" and w.bias.slots == slots and w.bias.rows == 64
    assert w.bias.boxes == 2 and w.bias.slot_bytes == 128 * 64 * 2
    assert w.bias.offset == w.staged[-1].offset + w.staged[-1].bytes  # after the tiles
    assert plan.smem_bytes <= 232448 and w.vector_offset == w.bias.offset + w.bias.bytes
    assert [m.param for m in w.maps] == ["K", "V", "Q", "dO", "BiasT", "dBiasT", "dK", "dV"]
    assert [m.param for m in w.loads] == ["K", "V", "Q", "dO", "BiasT"]
    assert w.staging.value == ("BiasT's [128, 64] tile per block by the copy engine (column-major: "
                               f"boxes of [64][64] rows, read by ldmatrix .trans), a ring of {slots} slot(s)")
    assert ("one slot: 2 do not fit" in w.staging.why) == (slots == 1)
    assert "g_BiasT[" not in source and "load_staged_trans(staged, smem_address(smem.t_smem)" in source
    assert "pair_elem(Element(), staged[j][e >> 1], e & 1)" in source
    assert f"constexpr int kBiasStages = {slots};" in source


def test_the_bias_gradient_is_stored_from_the_staged_slot():
    plan, source = main(128, False)
    w = plan.wgmma
    assert w.store_param == "dBiasT" and w.store_tile == w.staged[0].name
    assert w.tile_store.value == "dBiasT from the staged tile's slot by the copy engine"
    assert "store_one(g_dBiasT" not in source and "tma_store_box_4d(maps.dBiasT" in source
    assert source.count("if (storer) bulk_wait_read();") == 3  # two bodies and the end
    assert "kept_begin" not in source  # no mask: no block skipped
    assert not plan.bounds.bounds


def test_a_causal_bias_gradient_skips_the_masked_blocks_and_stores_their_zeros():
    plan, source = main(64, True)
    assert plan.bounds.bounds and "'dBiasT' (the staged value, 0 there) written as zeros" \
        in plan.bounds.why
    assert "kept_begin" in source and "st.shared.v4.b32" in source
    # the mma.sync skeleton stores per element: it runs every block
    plan80, source80 = main(64, True, arch="sm_80")
    assert not plan80.bounds.bounds and "stores 'dBiasT' at every element" in plan80.bounds.why


def test_a_bias_without_gradient_is_staged_and_nothing_is_stored():
    plan, source = main(128, True, Mods(bias="tensor"))
    assert plan.wgmma.bias is not None and plan.wgmma.store_param is None
    assert plan.wgmma.tile_store.value == "none" and "tma_store_box_4d(maps.dBiasT" not in source


@pytest.mark.parametrize("options", [dict(stage_vectors=False), dict(fast_body=False, lpt=False)]
                         + [dict(adds=mode) for mode in ADD_MODES
                            if mode != "slots"])  # (slots: the split layout's, D 256)
def test_the_plan_options_keep_the_storage_consistent(options):
    plan, _ = main(128, True)
    if "adds" in options:
        plan = with_adds(plan, options["adds"])
    else:
        plan = with_schedule(plan, **options)
    w = plan.wgmma
    n_warp = plan.n_acc // w.consumers  # the loop-row gemm's columns per warpgroup (dQ's D)
    stage = (w.consumers * plan.block * w.add_row_bytes if w.add_map is None else
             w.consumers * plan.block * n_warp * 4)
    members = sorted([(t.offset, t.bytes) for t in w.tiles]
                     + ([(w.vector_offset, 4 * len(w.vectors) * plan.stages * plan.block)]
                        if w.vector_offset is not None else [])
                     + ([(w.add_offset, stage)] if w.add_offset is not None else []))
    at = 0
    for offset, size in members:
        if w.add_map is not None and offset == w.add_offset:
            at = -(-at // 1024) * 1024  # the tensor reduce-add's boxes are 1024-byte aligned
        assert offset == at
        at += size
    assert w.barrier_offset == at and w.bias is not None
    assert plan.smem_bytes <= 232448
    emit(plan, source_name="bwd.kg", source_hash="0", command="test")


def test_inspect_shows_the_staging_and_the_tile_store():
    from kgen.report_loop_dag import summary

    plan, _ = main(128, True)
    s = summary(plan)
    assert s["wgmma"]["staging"]["value"].startswith("BiasT's [128, 64] tile")
    assert s["wgmma"]["tile_store"]["value"].startswith("dBiasT from the staged tile's slot")
    assert any(b["name"] == "t_smem" and "read at (row, col)" in b["role"]
               for b in s["buffers"])


@pytest.mark.slow
@pytest.mark.parametrize("d, causal, mods", [(128, True, GRAD), (64, False, GRAD),
                                             (128, False, Mods(bias="tensor"))])
def test_the_bias_builds_compile_without_spills(d, causal, mods):
    """NVRTC 13.5: 0 B of spills (the per-element reads spilled 12 B at D 128, with the
    gradient's per-element stores 64 B)."""
    from kgen.runtime.nvrtc import compile_cubin

    plan, source = main(d, causal, mods)
    result = compile_cubin(source, plan.name, "sm_90a")
    assert result.spill_stores == 0, result.spill_stores
    assert not [w for w in result.warnings if "warning" in w.lower()]
