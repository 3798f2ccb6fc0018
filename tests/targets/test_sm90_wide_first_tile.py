"""sm_90a's ping-pong chain with a wide first tile (N0 of 160 to 256; issue 53, chains at any
shape): the last gemm in narrow column passes (chain_values.narrow_passes, NARROW_PASS columns each,
staged for the copy engine) where whole or in passes of 128 its staging would spill, and B0
streamed through a short ring (configs.SHORT_RINGS) where no deeper ring fits beside the
resident B1. The rule, the builder's list, the plans, the emitted pass loop, and NVRTC with no
spill. Issue 17's 24 tuned chains keep their plans."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.api import build
from kgen.lower import builder
from kgen.parse import parse
from kgen.plan import Mma, StorePath
from kgen.targets import target
from kgen.targets.sm90 import chain_values, configs
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, biased_chain_text


def chain(k0: int, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("n0, n1, passes", [
    (256, 256, 4), (224, 192, 3), (192, 128, 2), (160, 192, 3), (256, 512, 8),
    (256, 64, 1),  # one box already: no passes
    (128, 256, 2), (64, 256, 2), (128, 128, 1), (96, 256, 2), (64, 384, 3),  # as before
    (112, 256, 2),  # N0 not a multiple of 32: g1 cannot take passes of 64 on wgmma
])
def test_column_passes_narrow_only_where_the_wider_ones_spill(n0, n1, passes):
    assert chain_values.column_passes(n0, n1) == passes
    narrow = chain_values.narrow_passes(n0, n1)
    assert narrow == (passes > 1 and n1 // passes == chain_values.NARROW_PASS
                      and chain_values.consumer_values(n0, n1 // chain_values.wide_passes(n0, n1))
                      > chain_values.STAGING_MAX_VALUES)


NARROW, WIDE = chain_values.NARROW_STAGING_MAX_VALUES, chain_values.STAGING_MAX_VALUES


@pytest.mark.parametrize("n1, passes, limit", [(256, 4, NARROW), (64, 1, NARROW), (256, 2, WIDE),
                                               (128, 1, WIDE), (384, 3, WIDE)])
def test_the_staging_limit_of_a_pass_of_one_box(n1, passes, limit):
    assert chain_values.staging_max_values(n1, passes) == limit
    # a later gemm of a longer chain keeps its own, lower limit
    assert chain_values.staging_max_values(n1, passes, 2) == min(limit,
                                                                 chain_values.CHAINED_MAX_VALUES)


@pytest.mark.parametrize("k0, n0, n1, dtype, passes", [
    (256, 256, 256, "f16", 4), (384, 224, 192, "f16", 3), (1024, 256, 128, "bf16", 2),
    (512, 192, 128, "bf16", 2), (576, 160, 160, "f16", 3), (256, 192, 128, "f16", 2),
])
def test_a_wide_first_tile_stays_on_the_pingpong_chain_in_narrow_passes(k0, n0, n1, dtype,
                                                                        passes):
    """N0 of 160 to 256: g1 on wgmma (A from registers) in passes of 64 columns, each staged
    and stored by the copy engine; these ran the mma.sync chains or stored from registers."""
    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    schedule = result.plan.schedule
    last = schedule.gemms[-1]
    assert schedule.scheduler.pingpong and schedule.chain_ring_b
    assert last.atom.instruction is Mma.WGMMA_RS and last.passes.count == passes
    assert result.plan.gemms[-1].tile[1] // passes == chain_values.NARROW_PASS
    assert last.output.path is StorePath.TMA
    staging = next(b for b in result.plan.storage.buffers if b.name.endswith("_d_staging"))
    assert staging.bytes == chain_values.CONSUMERS * 64 * chain_values.NARROW_PASS * 2
    assert f"for (int pass = 0; pass < {passes}; ++pass)" in result.source
    assert "wgmma.mma_async.sync.aligned.m64n64k16" in result.source
    rows = {label: value for label, value, _ in schedule.describe()}
    assert rows["g1 column passes"] == str(passes)


@pytest.mark.parametrize("k0, n0, n1, slots", [(256, 256, 256, 2), (384, 224, 192, 3),
                                               (1024, 256, 128, 3), (192, 224, 448, 2)])
def test_a_short_ring_where_no_deeper_one_fits(k0, n0, n1, slots):
    """B0's k tiles (28-32 KB a slot) and the resident B1 leave room for 2 or 3 slots only."""
    plan = build(chain(k0, n0, n1, "bf16"), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.schedule.scheduler.pingpong and plan.schedule.chain_ring_b
    assert plan.gemms[0].stages == slots
    assert plan.smem_bytes <= 232448
    choices = {c.line: c.why for c in plan.schedule.chosen}
    assert choices["g0 stages"] == configs.WHY_CHAIN_SHORT_RING + (
        configs.WHY_COLUMN_BLOCKS.format(blocks=plan.column_blocks)
        if plan.column_blocks > 1 else "")


def test_the_short_rings_come_after_the_deeper_ones_and_before_the_128_row_chain():
    """Only chains that plan no deeper ping-pong ring take a short one; it ran 0.68-0.74 of the
    128-row chain's time where both plan (f16 256/256/128 and 256/192/256)."""
    listed = configs.chain(builder.shapes(chain(256, 256, 256)))
    whys = [c.why for c in listed]
    short = [i for i, why in enumerate(whys) if why.startswith(configs.WHY_CHAIN_SHORT_RING)]
    deeper = [i for i, why in enumerate(whys) if why.startswith(configs.WHY_CHAIN_RING_B)]
    wgmma_128 = [i for i, why in enumerate(whys) if why == configs.WHY_CHAIN_WGMMA]
    assert [listed[i].gemms[0].stages for i in short] == list(configs.SHORT_RINGS)
    assert short and deeper and wgmma_128
    assert max(deeper) < min(short) and max(short) < min(wgmma_128)
    assert all(c.schedule is None for c in listed[max(wgmma_128) + 1:])  # then the sm_80 chains
    for k0, n0, n1 in ((256, 256, 128), (256, 192, 256)):
        plan = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg").plan
        assert plan.schedule.scheduler.pingpong and plan.gemms[0].stages == 3


@pytest.mark.parametrize("k0, n0, n1, blocks, slots", [
    (256, 160, 320, 1, 2), (576, 160, 384, 1, 2),  # one block on a short ring
    (256, 128, 512, 2, 5),  # N0 = 128: column blocks first, as before
    (192, 224, 448, 2, 2),  # no ring fits one block of 448 columns beside B0's k tiles
])
def test_a_wide_first_tile_takes_a_short_ring_over_one_block_before_column_blocks(
        k0, n0, n1, blocks, slots):
    plan = build(chain(k0, n0, n1, "bf16"), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.schedule.scheduler.pingpong and plan.schedule.chain_ring_b
    assert plan.column_blocks == blocks and plan.gemms[0].stages == slots


ISSUE_17 = [(k0, n0, n1) for k0 in (256, 576) for n0 in (64, 128) for n1 in (64, 128, 256)]


@pytest.mark.parametrize("k0, n0, n1", ISSUE_17)
def test_the_tuned_chains_take_neither_narrow_passes_nor_a_short_ring(k0, n0, n1):
    for dtype in ("f16", "bf16"):
        plan = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg").plan
        assert plan.gemms[0].stages >= 4
        assert plan.gemms[-1].tile[1] // plan.schedule.gemms[-1].passes.count >= 128 or (
            n1 == 64)
        assert not any(c.why.startswith(configs.WHY_CHAIN_SHORT_RING)
                       for c in plan.schedule.chosen)


def test_an_overhanging_last_tile_in_narrow_passes_skips_the_columns_past_n():
    """N1 = 200 beside N0 = 224: four passes of 64 over a 256-column tile, the tensor map
    clipping the last pass's columns past N, the epilogue skipping them (bias1 has 200)."""
    module = parse(biased_chain_text("bf16", 256, 224, 200), "chain.kg")
    verify(module)
    result = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    schedule = result.plan.schedule
    assert schedule.scheduler.pingpong and schedule.gemms[-1].passes.count == 4
    assert schedule.tma_output is not None and result.plan.gemms[-1].tile[1] == 256
    assert "n0 + c < 200" in result.source


@pytest.mark.parametrize("k0, n0, n1, dtype", [
    (256, 256, 256, "f16"), (384, 224, 192, "bf16"), (192, 224, 448, "bf16"),
    (256, 192, 128, "f16"), (576, 224, 64, "bf16"), (64, 256, 512, "f16"),
])
def test_wide_first_tiles_compile_without_spills(k0, n0, n1, dtype):
    """NVRTC allocates the wide first tiles' chains (224 values a consumer thread at N0 = 256)
    with no local memory and no serialized wgmma."""
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.scheduler.pingpong
    compiled = compile_cubin(result.source, result.plan.name, "sm_90a")
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0
    assert "serialized" not in compiled.log
