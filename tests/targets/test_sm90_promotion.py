"""kgen/targets/sm90/promotion.py: where a block-scaled gemm's k tile sums wait for their
promotion (PeriodSets: the rulebook's halves, one set on narrow tiles, the refusals), the tile
widths B's scale blocks allow and their split cases, the plan options (with_period_sets,
without_promotion's timing bounds) and the emitted mainloops; slow: NVRTC builds them without
spills or serialized wgmma."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen.parse import parse
from kgen.plan import PeriodSets, PromotionBound, ScaleLoads

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"

TEXT = """\
kernel f {
  target sm_90a
  SCHEDULE
  tensor A : f8e4m3[M, K] row
  tensor B : f8e4m3[K, N] col
  tensor SA : f32[M, KS] col
  tensor SB : f32[NS, KS] row
  tensor D : bf16[M, N] row out
  gemm g = A @ B accumulate f32 {
    LINES
    scale A by SA 1x128
    scale B by SB 128x128
    epilogue { D = acc }
  }
}
"""


def built(lines="", schedule=""):
    from kgen.api import build

    source = TEXT.replace("LINES", lines).replace("SCHEDULE", schedule)
    return build(parse(source, "f.kg").kernels[0], source_name="f.kg")


def emitted(plan) -> str:
    from kgen.emit import emit

    return emit(plan, source_name="f.kg", source_hash="0", command="test")


def halves(b):
    from kgen.targets.sm90.promotion import with_period_sets

    return with_period_sets(b.plan, PeriodSets.HALVES)


@pytest.mark.parametrize("n, cases", [(192, (16, 8)), (160, (16, 12, 8, 4)),
                                      (144, (16, 14, 12, 10, 8, 6, 4, 2)), (96, (12, 8, 4)),
                                      (128, (16,)), (64, (8,))])
def test_the_split_cases_are_every_tile_s_groups_in_b_s_first_block(n, cases):
    from kgen.targets.sm90.promotion import scale_split_cases

    g = built(f"tile 128x{n}x128  warps 2x4  stages 4").plan.gemms[0]
    assert scale_split_cases(g) == cases
    # brute force: tile t starts n t columns in, 128 - (n t) % 128 of its columns in the block
    assert set(cases) == {min((128 - n * t % 128) // 8, n // 8) for t in range(128)}


@pytest.mark.parametrize("n", [96, 136, 144, 160])
def test_tiles_over_two_scale_blocks_are_built(n):
    from kgen.targets.sm90.gemm import block_scale_values

    b = built(f"tile 128x{n}x128  warps 2x4  stages 4")
    values = block_scale_values(b.plan.gemms[0], b.plan.schedule.gemms[0].promotion)
    assert values["b_blocks"] == 2 and "switch (j_split)" in b.source


def test_the_rulebook_takes_halves_where_timed():
    for lines, sets in [("", PeriodSets.HALVES),
                        ("tile 128x128x128  warps 2x4  stages 6", PeriodSets.HALVES),
                        ("tile 128x144x128  warps 2x4  stages 5", PeriodSets.HALVES),
                        ("tile 128x64x128  warps 2x4  stages 8", PeriodSets.ONE),
                        ("tile 128x136x128  warps 2x4  stages 4", PeriodSets.ONE),
                        ("tile 256x64x128  warps 2x4  stages 4", PeriodSets.ONE)]:
        promotion = built(lines).plan.schedule.gemms[0].promotion
        assert promotion.sets is sets, lines
    why = built("tile 128x136x128  warps 2x4  stages 4").plan.schedule.gemms[0].promotion.why_sets
    assert "no halves of whole n8 groups" in why
    why = built("tile 256x64x128  warps 2x4  stages 4").plan.schedule.gemms[0].promotion.why_sets
    assert "built for consumers of 64 rows, not 128" in why


def test_with_period_sets_refuses_what_is_not_built():
    from kgen.targets.sm90.promotion import with_period_sets, with_promotion_overlap

    with pytest.raises(ValueError, match="no halves of whole n8 groups"):
        halves(built("tile 128x136x128  warps 2x4  stages 4"))
    with pytest.raises(ValueError, match="64 rows, not 128"):
        halves(built("tile 256x64x128  warps 2x4  stages 4"))
    overlap = with_promotion_overlap(built().plan, True, False)  # sets one period set
    assert overlap.schedule.gemms[0].promotion.sets is PeriodSets.ONE
    with pytest.raises(ValueError, match="built with one period set"):
        with_period_sets(overlap, PeriodSets.HALVES)
    from kgen.api import build_file

    with pytest.raises(ValueError, match="no block scales"):
        with_period_sets(build_file(EXAMPLES / "gemm_fp8_tensorwise.kg").plan, PeriodSets.ONE)


def test_the_halves_loop_walks_two_k_tiles_a_pass_without_a_group_across_its_back_edge():
    b = built()
    source = b.source
    assert "wgmma.mma_async.sync.aligned.m64n96k32.f32.e4m3.e4m3 " in source  # half of 192
    loop = source.split("for (; kt + 1 < k_tiles; kt += 2, it += 2) {")[1].split(
        "if (kt < k_tiles) {  // an odd count's last k tile")[0]
    # four groups a pass, three promoted while the next multiplies, the last after the drain
    assert loop.count("wgmma_step_half(period_lo,") == 2
    assert loop.count("wgmma_step_half(period_hi,") == 2
    assert loop.count("wgmma_wait<1>();") == 3 and loop.count("wgmma_wait<0>();") == 1
    assert loop.rstrip().endswith("}") and loop.rindex("wgmma_wait<0>();") > loop.rindex(
        "wgmma_commit();")
    # each slot released once its k tile's second half is done, once
    assert loop.count("mbarrier_arrive(empty + 8 * ((it) % kStages));") == 1
    assert loop.count("mbarrier_arrive(empty + 8 * ((it + 1) % kStages));") == 1
    tail = source.split("if (kt < k_tiles) {  // an odd count's last k tile")[1].split(
        "// Epilogue")[0]
    assert tail.count("mbarrier_arrive(empty") == 1 and "((it - 1) % kStages)" not in tail
    # the second half's B rows start kTileN / 2 rows into the stage
    assert "smem_descriptor(b_stage + kTileN / 2 * 128);" in loop and "descriptor_at(b_desc, 32 * kk)" in loop
    assert "fence_period(period_lo);" in loop and "fence_period(period_hi);" in loop


def test_one_set_keeps_its_mainloop():
    from kgen.targets.sm90.promotion import with_period_sets

    source = emitted(with_period_sets(built().plan, PeriodSets.ONE))
    assert "wgmma_step_half" not in source and "float period_acc[kFragM][kFragN][4];" in source
    assert "wgmma_wait<0>();  // the k tile's sums are in period_acc" in source


@pytest.mark.parametrize("bound", [PromotionBound.UNPROMOTED, PromotionBound.UNLOADED])
def test_the_timing_bounds_are_plan_options_only(bound):
    from kgen.targets.sm90.promotion import without_promotion

    plan = without_promotion(built().plan, bound)
    promotion = plan.schedule.gemms[0].promotion
    assert promotion.bound is bound and promotion.sets is PeriodSets.ONE
    assert any(r[0] == "g timing bound" for r in plan.schedule.gemms[0].describe())
    source = emitted(plan)
    if bound is PromotionBound.UNPROMOTED:
        assert "wgmma_step(acc[i]," in source and "promote_columns<" not in source.split(
            "kernel_body")[1]
    else:
        assert "load_block_scales(p, kt + 2" not in source
    assert built().plan.schedule.gemms[0].promotion.bound is PromotionBound.NONE  # the rulebook
    with pytest.raises(ValueError, match="no bound"):
        without_promotion(built().plan, PromotionBound.NONE)


def test_the_rulebook_keeps_the_consumers_scale_loads_where_timed():
    from kgen.targets.sm90.promotion import SCALE_LOADS, scale_buffer

    plan = built().plan
    assert plan.schedule.gemms[0].promotion.scale_loads is SCALE_LOADS is ScaleLoads.CONSUMERS
    assert all(b.name != scale_buffer("g") for b in plan.storage.buffers)
    source = emitted(plan)
    body = source.split("kernel_body")[1]
    assert "load_block_scales(p, 0, row_scale" in body and "__ldg(p.SA" in source
    assert "read_block_scales" not in source and "kScaleLanes" not in source
    assert "} else if (tid == 0) {" in body


@pytest.mark.parametrize("sets", [PeriodSets.HALVES, PeriodSets.ONE])
def test_with_scale_loads_has_the_producer_copy_the_scales_into_each_slot_s_buffer(sets):
    from kgen.targets.sm90.promotion import scale_buffer, with_period_sets, with_scale_loads

    rulebook = with_period_sets(built().plan, sets)
    plan = with_scale_loads(rulebook, ScaleLoads.PRODUCER)
    promotion = plan.schedule.gemms[0].promotion
    assert promotion.scale_loads is ScaleLoads.PRODUCER
    assert any(r[0] == "g scale loads" and r[1] == "producer's copies"
               for r in plan.schedule.gemms[0].describe())
    # the buffer after the rulebook's storage, 16-byte aligned, within the limit
    buffer = next(b for b in plan.storage.buffers if b.name == scale_buffer("g"))
    g = plan.gemms[0]
    assert buffer.bytes == g.stages * (g.tile[0] + 4) * 4 and buffer.offset % 16 == 0
    assert buffer.offset >= rulebook.storage.total_bytes
    assert plan.storage.total_bytes == buffer.end <= plan.storage.limit_bytes
    source = emitted(plan)
    body = source.split("kernel_body")[1]
    assert f"constexpr int kSmemBytes = {buffer.end};" in source
    # no global load of a scale in the consumers: they read the slot's buffer after its barrier
    assert "__ldg(p.S" not in source and "load_block_scales" not in source
    reads = 3 if sets is PeriodSets.HALVES else 2  # the halves loop's stages; one set's k tiles
    assert body.count("read_block_scales(scale_slots + ") == reads
    # the producer warp's copies, counted by the full barrier beside the copy engine's arrival
    assert "mbarrier_init(full + 8 * s, tma_loads ? 1 + kScaleLanes :" in body
    assert "} else if (tid < kScaleLanes) {" in body
    assert "cp_async_mbarrier_arrive(full + 8 * s);" in body
    # the narrow entry point's producer copies them in warp 0's cp.async groups
    narrow = source.split("void produce_narrow(")[1].split("cp_async_commit();")[0]
    assert "if (ptid < kScaleLanes) {" in narrow and "copy_block_scales(p, " in narrow
    # and back: the consumers' loads on the same plan
    back = emitted(with_scale_loads(plan, ScaleLoads.CONSUMERS))
    assert "load_block_scales(p, 0, row_scale" in back and "kScaleLanes" not in back


def test_the_timing_bounds_take_the_consumers_loads():
    from kgen.targets.sm90.promotion import without_promotion

    plan = without_promotion(built().plan, PromotionBound.UNLOADED)
    assert plan.schedule.gemms[0].promotion.scale_loads is ScaleLoads.CONSUMERS


@pytest.mark.slow
@pytest.mark.parametrize("lines, schedule", [
    ("", ""), ("tile 128x128x128  warps 2x4  stages 5", ""),
    ("tile 128x192x128  warps 2x4  stages 4  cluster 2x1", "")],
    ids=["builder", "128x128", "cluster2x1"])
@pytest.mark.parametrize("sets", [PeriodSets.HALVES, PeriodSets.ONE])
def test_the_producer_s_scale_loads_compile_without_spills(lines, schedule, sets, tmp_path,
                                                           monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.targets.sm90.promotion import with_scale_loads

    from kgen.targets.sm90.promotion import with_period_sets

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    plan = with_scale_loads(with_period_sets(built(lines, schedule).plan, sets),
                            ScaleLoads.PRODUCER)
    source = emitted(plan)
    for entry in (plan.name, plan.name + "_narrow"):
        result = compile_cubin(source, entry, "sm_90a")
        assert result.spill_stores == 0 and result.spill_loads == 0 and result.stack_bytes == 0
        assert "serialized" not in result.log and "warning" not in result.log.lower(), result.log


@pytest.mark.slow
@pytest.mark.parametrize("lines, schedule", [
    ("", ""), ("tile 128x128x128  warps 2x4  stages 6", ""),
    ("tile 128x160x128  warps 2x4  stages 4", ""), ("tile 128x144x128  warps 2x4  stages 5", ""),
    ("tile 64x128x128  warps 2x4  stages 8", "schedule pingpong"),
    ("tile 128x192x128  warps 2x4  stages 4  cluster 2x1", "")],
    ids=["builder", "128x128", "128x160", "128x144", "pingpong64x128", "cluster2x1"])
@pytest.mark.parametrize("sets", [PeriodSets.HALVES, PeriodSets.ONE])
def test_the_period_sets_compile_without_spills_or_serialized_wgmma(lines, schedule, sets,
                                                                     tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.targets.sm90.promotion import with_period_sets

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    plan = with_period_sets(built(lines, schedule).plan, sets)
    source = emitted(plan)
    for entry in (plan.name, plan.name + "_narrow"):
        result = compile_cubin(source, entry, "sm_90a")
        assert result.spill_stores == 0 and result.spill_loads == 0 and result.stack_bytes == 0
        assert "serialized" not in result.log and "warning" not in result.log.lower(), result.log


def test_with_scale_loads_refuses_a_buffer_past_the_limit():
    from kgen.targets.sm90.promotion import with_scale_loads

    full = built("tile 128x128x128  warps 2x4  stages 6").plan  # the target's whole budget
    with pytest.raises(ValueError, match="does not fit after its"):
        with_scale_loads(full, ScaleLoads.PRODUCER)
    from kgen.api import build_file

    tensorwise = build_file(EXAMPLES / "gemm_fp8_tensorwise.kg").plan
    with pytest.raises(ValueError, match="no block scales"):
        with_scale_loads(tensorwise, ScaleLoads.PRODUCER)
    pingpong = built("tile 64x128x128  warps 2x4  stages 7", "schedule pingpong").plan
    with pytest.raises(ValueError, match="built on the cooperative kernel"):
        with_scale_loads(pingpong, ScaleLoads.PRODUCER)
