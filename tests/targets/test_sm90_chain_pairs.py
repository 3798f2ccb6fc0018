"""sm_90a's ping-pong chain with its tiles paired (Pipeline.paired, the plan option with_paired of
kgen/targets/sm90/chain_pairs.py; the rulebook pairs where B0's rows split sectors): its refusals, the storage left as
it is, the emitted producer, consumers and barriers, `kgen inspect`'s row, and NVRTC with no
spill."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir
from kgen.api import build
from kgen.emit import emit
from kgen.parse import parse
from kgen.targets.sm90.chain_pairs import WHY_PAIRED, paired_refusal, with_paired
from kgen.verify import verify

from tests.kernels import B2B_CHAIN


def built(k0: int, n0: int, n1: int, dtype: str = "bf16"):
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")


def text(plan) -> str:
    return emit(plan, source_name="chain.kg", source_hash="test", command="test")


@pytest.mark.parametrize("k0, n0, n1, dtype", [(1000, 96, 192, "bf16"),
                                               (1000, 128, 320, "f16"),
                                               (1000, 160, 64, "bf16")])
def test_paired_tiles_share_b0_and_take_no_turns(k0, n0, n1, dtype):
    plan = with_paired(built(k0, n0, n1, dtype).plan, True)
    s = plan.schedule
    ring = s.gemms[0]
    assert s.scheduler.pingpong and s.chain_ring_b
    assert ring.pipeline.paired and ring.pipeline.why.startswith(WHY_PAIRED)
    assert not s.consumer_order  # no turns
    assert ring.overlap.wgmma_groups == 1
    assert ring.pipeline.stages % 2 == 0
    source = text(plan)
    assert "tiles paired" in source
    assert "int fill = local / 2 * 2 * k_tiles;" in source
    assert "s % 2 ? kWarpgroupThreads : 2 * kWarpgroupThreads" in source
    assert "order_bar" not in source
    rows = {row[0]: row for row in ring.describe()}
    assert rows["g0 tile pairs"][2] == ring.pipeline.why


@pytest.mark.parametrize("k0, n0, n1", [(1024, 96, 192), (256, 128, 128), (576, 160, 160),
                                        (160, 80, 96)])
def test_the_rulebook_pairs_no_chain_whose_rows_are_whole_sectors(k0, n0, n1):
    """Measured slower or not measured (chain_pairs' docstring): each tile its own fills."""
    s = built(k0, n0, n1).plan.schedule
    assert s.chain_ring_b and not s.gemms[0].pipeline.paired and s.consumer_order
    assert not any(row[0] == "g0 tile pairs" for row in s.gemms[0].describe())


@pytest.mark.parametrize("k0, n0, n1, dtype", [(1000, 96, 192, "bf16"), (1000, 128, 320, "f16"),
                                               (1000, 160, 64, "bf16")])
def test_the_rulebook_pairs_where_b0s_rows_split_sectors(k0, n0, n1, dtype):
    """K0 = 1000 in 16 bits: rows of 2000 bytes (measured 0.70-0.87 of the unpaired time)."""
    s = built(k0, n0, n1, dtype).plan.schedule
    ring = s.gemms[0]
    assert ring.pipeline.paired and not s.consumer_order
    assert "rows of 2000 bytes split 32-byte sectors" in ring.pipeline.why
    assert ring.overlap.wgmma_groups <= 1  # each slot back once its own group completes
    assert ring.pipeline.why.startswith(WHY_PAIRED)


def test_the_rulebook_pairs_no_resident_b0():
    """f16 1000/64/128 keeps B0 resident: no k tiles of it to share."""
    s = built(1000, 64, 128, "f16").plan.schedule
    assert not s.chain_ring_b and not s.gemms[0].pipeline.paired

def test_resident_b0_is_not_paired():
    """K0 = 1000 with N0 = 64: B0 fits resident (the split rows' rule), nothing to share."""
    plan = built(1000, 64, 128, "f16").plan
    assert not plan.schedule.chain_ring_b and not plan.schedule.gemms[0].pipeline.paired
    with pytest.raises(ValueError, match="B0 is not streamed"):
        with_paired(plan, True)


def test_with_paired_toggles_the_schedule_value_and_keeps_the_storage():
    plan = built(576, 96, 192).plan  # 9 k tiles: one wgmma group in flight either way
    assert plan.schedule.gemms[0].overlap.wgmma_groups == 1
    paired = with_paired(plan, True)
    assert paired.storage == plan.storage
    assert paired.schedule.gemms[0].pipeline.paired and not paired.schedule.consumer_order
    assert "the plan option with_paired" in paired.schedule.gemms[0].pipeline.why
    source = text(paired)
    assert "if (warpgroup) mbarrier_arrive(empty_bar + 8 * a_slot);" in source
    assert "const int halves = first + gridDim.x < tiles ? 2 : 1;" in source
    back = with_paired(paired, False)
    assert back.schedule == plan.schedule and text(back) == text(plan)


def test_pairing_takes_one_wgmma_group_in_flight():
    plan = built(256, 96, 192).plan  # 4 k tiles on 6 slots: two groups in flight unpaired
    assert plan.schedule.gemms[0].overlap.wgmma_groups == 2
    assert with_paired(plan, True).schedule.gemms[0].overlap.wgmma_groups == 1


def test_unpairing_takes_turns_again():
    plan = with_paired(built(1000, 96, 192).plan, True)
    unpaired = with_paired(plan, False)
    assert unpaired.schedule.consumer_order and "order_bar" in text(unpaired)


def test_pairs_need_an_even_ring_two_consumers_and_no_batch():
    plan = built(256, 96, 192).plan
    first = plan.gemms[0]
    odd = dataclasses.replace(first, stages=5)
    assert "odd" in paired_refusal(odd, True, 2, False)
    assert "2 consumer warpgroups" in paired_refusal(first, True, 3, False)
    assert "batch" in paired_refusal(first, True, 2, True)
    assert paired_refusal(first, True, 2, False) is None
    three = built(64, 64, 128).plan  # three consumer warpgroups (chain_values.consumer_count)
    assert three.schedule.warps.role("consumer").groups == 3
    with pytest.raises(ValueError, match="2 consumer warpgroups"):
        with_paired(three, True)


@pytest.mark.slow
@pytest.mark.parametrize("k0, n0, n1, dtype", [(1000, 96, 192, "bf16"),
                                               (1000, 128, 320, "f16"),
                                               (1000, 160, 64, "bf16")])
def test_paired_chains_compile_without_spills(k0, n0, n1, dtype):
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    plan = with_paired(built(k0, n0, n1, dtype).plan, True)
    compiled = compile_cubin(text(plan), plan.name, "sm_90a",
                             extra_options=fast_entry_options(plan.narrow_kernel))
    assert compiled.spill_stores + compiled.spill_loads == 0
