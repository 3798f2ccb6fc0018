"""sm_90a's ping-pong chain with its last gemm in column passes (ColumnPasses):
a last tile of 256 columns runs two passes of 128 from the same A fragments, and the output
staging holds one pass (beside N0 = 128 a consumer thread would hold 224 values with the whole
tile, 160 in halves). The rule, the builder's rings, the plan and inspect, the emitted pass
loop, and NVRTC with no spill."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.api import build
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.plan import Overlap, StorePath
from kgen.targets.sm90 import chain as sm90_chain
from kgen.targets.sm90 import chain_values, schedules
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, b2b_chain_text, with_gemm_schedule


def chain(k0: int, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


def test_consumer_values_against_the_staging_limit():
    assert chain_values.consumer_values(128, 256) > chain_values.STAGING_MAX_VALUES
    assert chain_values.consumer_values(128, 128) <= chain_values.STAGING_MAX_VALUES
    assert chain_values.consumer_values(64, 256) <= chain_values.STAGING_MAX_VALUES


@pytest.mark.parametrize("k0, dtype", [(256, "f16"), (576, "bf16"), (1024, "f16")])
def test_the_builder_stages_n1_256_in_two_passes_beside_five_slots(k0, dtype):
    plan = build(chain(k0, 128, 256, dtype), ir.Arch.SM90A, source_name="chain.kg").plan
    last = plan.schedule.gemms[-1]
    assert plan.schedule.scheduler.pingpong and plan.schedule.chain_ring_b
    assert last.passes.count == 2 and last.output.path is StorePath.TMA
    assert plan.schedule.gemms[0].passes.count == 1
    assert plan.gemms[0].stages == 5
    # the staging holds one pass: 128 columns of 64 rows, 16-bit, per consumer warpgroup
    staging = next(b for b in plan.storage.buffers if b.name.endswith("_d_staging"))
    assert staging.bytes == 2 * 64 * 128 * 2
    assert plan.smem_bytes <= 232448
    rows = {label: (value, why) for label, value, why in plan.schedule.describe()}
    value, why = rows["g1 column passes"]
    assert value == "2" and "128 columns" in why and "160" in why and "224" in why


@pytest.mark.parametrize("n0, n1", [(128, 128), (64, 128), (128, 64)])
def test_tiles_of_at_most_128_columns_take_one_pass(n0, n1):
    result = build(chain(256, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    assert all(g.passes.count == 1 for g in result.plan.schedule.gemms)
    assert "for (int pass = 0;" not in result.source


@pytest.mark.parametrize("k0", [256, 576])
def test_n1_256_beside_n0_64_takes_two_passes_on_six_slots(k0):
    """The whole tile's staging fits there too (176 values), but halves ran faster on the same
    ring; its staging fits beside 6 slots, so the ring list is the usual one."""
    plan = build(chain(k0, 64, 256), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.schedule.gemms[-1].passes.count == 2
    assert plan.schedule.gemms[-1].output.path is StorePath.TMA
    assert plan.gemms[0].stages == 6


def test_six_slots_leave_no_room_for_the_staging_so_no_passes():
    """The builder's third configuration for N1 = 256 (6 slots): one pass's staging does not
    fit beside that ring, so the output leaves from registers, in one pass."""
    from kgen.lower import builder
    from kgen.targets import target

    kern = chain(256, 128, 256)
    configs = [c for c, _, _ in builder.listed(kern, target(ir.Arch.SM90A))]
    assert [c.gemms[0].stages for c in configs[:3]] == [5, 4, 6]
    plan = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=configs[2]).plan
    assert plan.gemms[0].stages == 6
    assert plan.schedule.gemms[-1].output.path is StorePath.WIDE
    assert plan.schedule.gemms[-1].passes.count == 1


def test_the_pass_loop_multiplies_each_pass_by_its_rows_of_b1_and_stores_its_columns():
    """One pass at a time (the builder keeps two in flight here: test_sm90_passes_in_flight)."""
    plan = build(chain(256, 128, 256), ir.Arch.SM90A, source_name="chain.kg").plan
    plan = with_gemm_schedule(plan, -1, overlap=Overlap())
    source = sm90_chain.emit(plan, source_name="chain.kg", source_hash="", command="test")
    body = source[source.index("// ---- g1 = g0 @ B1"):]
    order = ["for (int pass = 0; pass < 2; ++pass) {",
             "constexpr int kTileN = g1_cfg::kTileN / 2;  // this pass's columns",
             "constexpr int kFragN = g1_cfg::kFragN / 2;",
             "const int n0 = tile_n * g1_cfg::kTileN + pass * kTileN;",
             "float acc[kFragM][kFragN][4];",
             "const unsigned b_smem = smem_address(smem.g1_b_smem()) + pass * (kTileN * kTileK * 2);",
             "wgmma_step_rs(acc, g1_a_frag[0][0], smem_descriptor(b_smem));",
             "wgmma_wait<0>();",
             "bulk_wait_read();",
             "stmatrix_x4(",
             "tma_store_box(&maps.D1, staging + box * kStagingBoxBytes, n0 + box * 64, m0);"]
    at = 0
    for text in order:
        at = body.index(text, at)
    # the outer n0 is not declared: the pass loop declares its own
    assert "const int n0 = tile_n * kTileN;" not in body
    # the tiles cover N1 exactly: no element copy-out helper (the one-gemm kernel's)
    assert "copy_box_out" not in source
    # the m64n128k16 wgmma the passes issue
    assert "wgmma.mma_async.sync.aligned.m64n128k16" in source
    assert "wgmma.mma_async.sync.aligned.m64n256k16" not in source


@pytest.mark.parametrize("k0, dtype", [(256, "f16"), (576, "bf16")])
def test_column_passes_compile_without_spills(k0, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, 128, 256, dtype), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.gemms[-1].passes.count == 2
    resources = compile_cubin(result.source, result.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0


@pytest.mark.parametrize("k0, n0, n1", [(768, 96, 256), (256, 96, 384), (256, 32, 384)])
def test_n0_a_multiple_of_32_runs_g1_on_wgmma_in_passes(k0, n0, n1):
    """N0 = 96 or 32: g1's k tiles are 32 wide, its resident B1 in the 64-byte swizzle, read by
    wgmma (smem_descriptor_64) with A from registers, so g1 takes column passes and stages
    each. It ran on mma.sync: N1 = 256 spilled and N1 = 384 ran the persistent chain."""
    from kgen.plan import Mma
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    plan, last = result.plan, result.plan.schedule.gemms[-1]
    assert plan.schedule.scheduler.pingpong and plan.gemms[-1].tile[2] == 32
    assert last.atom.instruction is Mma.WGMMA_RS and last.passes.count == n1 // 128
    assert last.output.path is StorePath.TMA
    assert "smem_descriptor_64(b_smem + 32)" in result.source
    resources = compile_cubin(result.source, plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


@pytest.mark.parametrize("n0, n1, needs", [(128, 256, True), (64, 256, False), (96, 256, True),
                                           (128, 128, False), (48, 256, False)])
def test_staging_needs_passes(n0, n1, needs):
    """The builder's 5-slot-first ring list: only where the staging fits in passes alone."""
    assert chain_values.staging_needs_passes(n0, n1) is needs


def test_a_g1_on_mma_sync_stages_its_whole_tile():
    """N0 = 48: g1's k tiles are 16 wide, so g1 runs on mma.sync and cannot take passes; its
    176 values fit the staging of the whole tile, which it keeps (not stores from registers)."""
    plan = build(chain(768, 48, 256), ir.Arch.SM90A, source_name="chain.kg").plan
    last = plan.schedule.gemms[-1]
    assert last.passes.count == 1 and last.output.path is StorePath.TMA


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 384, "f16"), (256, 128, 384, "bf16"),
                                               (576, 64, 512, "f16"), (1024, 64, 384, "bf16")])
def test_a_last_tile_wider_than_256_runs_passes_of_128(k0, n0, n1, dtype):
    """N1 of 384 and 512 keep one tile over all of N1 (B1 resident) in passes of 128 columns,
    each staged and stored; they ran the sm_80 tiled chain before (3.0-4.2x a copy of their
    bytes on an H200, 1.15-1.30x now)."""
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    plan = result.plan
    last = plan.schedule.gemms[-1]
    assert plan.schedule.scheduler.pingpong and plan.gemms[-1].tile[1] == n1
    assert last.passes.count == n1 // 128 and last.output.path is StorePath.TMA
    assert f"for (int pass = 0; pass < {n1 // 128}; ++pass) {{" in result.source
    assert "wgmma_step_rs(float (&acc)[1][16][4]" in result.source  # m64n128 per pass
    resources = compile_cubin(result.source, plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 320, "f16"), (256, 128, 320, "bf16"),
                                               (576, 64, 448, "f16"), (256, 64, 280, "bf16")])
def test_a_last_n_over_256_not_a_multiple_of_128_rounds_up_to_whole_passes(k0, n0, n1, dtype):
    """N1 over 256 and not a multiple of 128 (320, 448, 280) takes the next multiple of 128 as
    its tile, in passes of 128, the last one clipped at N by the tensor map and the epilogue's
    column guard; it ran the sm_80 tiled chain, 64x256 tiles recomputing g0 for each."""
    from kgen.report import instruction
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    plan = result.plan
    last = plan.schedule.gemms[-1]
    tile_n = -(-n1 // 128) * 128
    assert plan.schedule.scheduler.pingpong and plan.gemms[-1].tile[1] == tile_n
    assert last.passes.count == tile_n // 128 and last.output.path is StorePath.TMA
    # kgen inspect names the instruction each pass issues
    assert instruction(plan, plan.gemms[-1]) == "wgmma m64n128k16, A from registers"
    resources = compile_cubin(result.source, plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


def test_a_wider_tile_is_refused_off_the_ping_pong_chain():
    """Only the ping-pong chain runs column passes: written on the sm_80 chain, a 384-column
    tile is refused at its tile line with the accumulators it would need."""
    text = b2b_chain_text("f16", 256, 64, 384, target="sm_80",
                          g0=("tile 64x64x64 warps 4x1 stages 4",),
                          g1=("tile 64x384x64 warps 4x1 stages 3", "keep g0 in registers"))
    module = parse(text, "chain.kg")
    verify(module)
    with pytest.raises(KgenError, match=r"chain.kg:\d+:\d+: .*warp tile 16x384 needs 192 f32 "
                       r"accumulator registers per thread"):
        build(module.kernels[0], ir.Arch.SM80, source_name="chain.kg")


def test_a_wider_tile_written_on_sm90a_without_pingpong_is_refused():
    """On sm_90a without `schedule pingpong` (here: B1 not resident), the persistent and tiled
    chains refuse the tile the passes alone would serve, at its tile line."""
    text = b2b_chain_text("f16", 256, 64, 384, g0=("tile 64x64x64 warps 4x1 stages 4",),
                          g1=("tile 64x384x64 warps 4x1 stages 3", "keep g0 in registers"))
    module = parse(text, "chain.kg")
    verify(module)
    with pytest.raises(KgenError, match=r"warp tile 16x384 needs 192 f32 accumulator"):
        build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")


@pytest.mark.parametrize("n1, tile_n", [(96, 128), (160, 192), (224, 256)])
def test_tiles_over_n_store_by_tma_and_skip_the_columns_past_it(n1, tile_n):
    """A last N over 64 that is not a multiple of the 64-column box: whole boxes, stored by the
    copy engine (the tensor map clips at N), the epilogue guarded at N; a tile that covers N
    exactly has no guard."""
    result = build(chain(256, 64, n1), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.gemms[-1].tile[1] == tile_n
    assert result.plan.schedule.tma_output is not None
    assert f"live[h] && n0 + c < {n1} ? g1_epilogue(" in result.source
    exact = build(chain(256, 64, 192), ir.Arch.SM90A, source_name="chain.kg").source
    assert "live[h] ? g1_epilogue(" in exact and "n0 + c <" not in exact


def test_every_row_width_wgmma_takes_for_a_resident_b_has_its_descriptor():
    """schedules.RS_B_ROW_BYTES (the rule) and the emitter's descriptor functions agree."""
    from kgen.targets.sm90 import chain as sm90_chain

    assert set(sm90_chain.DESCRIPTORS) == set(schedules.RS_B_ROW_BYTES)
