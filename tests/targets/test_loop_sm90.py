"""sm_90a's loop skeleton (templates/sm90/loop.cu.j2): the rulebook's wgmma section chooses it
(or refuses it, with why, and the mma.sync skeleton runs), the plan holds its schedule
(plan.wgmma), the .cu and `kgen inspect` say which skeleton and why, and NVRTC compiles it
with 0 spills and no wgmma serialization across head dims, masks, GQA, f16 and configurations."""
from __future__ import annotations

import json

import numpy as np

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.errors import KgenError
from kgen.report_program import program_summary
from kgen.targets import loop_rules, target
from kgen.targets.loop_rules import LoopConfig

from tests import loop_kernels as lk

SM90A = ir.Arch.SM90A


def _built(kernel):
    return build_verified(kernel, SM90A)


def test_attention_runs_the_wgmma_skeleton_and_says_so():
    built = _built(lk.attention(128, causal=True, gqa=True, arch=SM90A))
    plan = built.plan
    assert plan.wgmma is not None and plan.wgmma.consumers == 2
    assert plan.threads == 384 and plan.config.value == "tile 128x128 warps 8 stages 2"
    assert plan.mma.value.startswith("wgmma.m64n128k16 (SS")
    assert [m.param for m in plan.wgmma.maps] == ["Q", "K", "V", "O"]  # O by the copy engine
    assert [m.kv for m in plan.wgmma.maps] == [False, True, True, False]
    assert plan.smem_bytes == loop_rules.wgmma_smem_bytes(LoopConfig(128, 128, 2), 128, 128)
    source = built.source
    assert "// Skeleton: sm_90a, warp-specialized wgmma" in source
    assert "__CUDA_ARCH__ != 900" in source  # the wgmma gate of the arch guard
    assert "setmaxnreg_dec<kProducerRegisters>" in source and "tma_load_box_4d" in source
    assert "__grid_constant__ attention_fwd_cfg::TensorMaps maps" in source
    summary = program_summary(plan)
    json.dumps(summary)  # the --json schema
    assert summary["skeleton"]["value"] == "sm_90a warp-specialized wgmma"
    assert [b["name"] for b in summary["buffers"]] == ["q_smem", "k_smem", "v_smem", "barriers"]


def test_exp_is_the_ex2_of_every_loop_skeleton_and_nothing_else_changes():
    source = _built(lk.attention(64, arch=SM90A)).source
    # the scores' exp(x - m) and the rescale exp(m - m_new): one multiply-add and the ex2 each
    body = source[source.index("s's epilogue"):]
    assert body.count("exp_diff(") >= 2 and "ex2.approx.ftz.f32" in source
    assert "expf(" not in source and "exp2f(" not in source
    assert "logf(" in source  # the user's log stays log


@pytest.mark.parametrize("kernel, reason", [
    (lambda: lk.mlp(arch=SM90A), "columns along the loop"),  # W1 column-major
    (lambda: lk.attention(128, tile=(64, 32), stages=3, arch=SM90A), "the block must be"),
    (lambda: lk.attention(96, causal=True, arch=SM90A), "must be multiples of 64"),
])
def test_a_refused_program_runs_mma_sync_and_says_why(kernel, reason):
    built = _built(kernel())
    assert built.plan.wgmma is None
    assert built.plan.mma.value == "mma.sync.m16n8k16"
    assert "refuses its wgmma skeleton" in built.plan.mma.why and reason in built.plan.mma.why
    assert "// Skeleton: sm_90a" not in built.source


def test_sm80_programs_never_take_the_wgmma_skeleton():
    assert _built(lk.attention(128, arch=SM90A)).plan.wgmma is not None
    assert build_verified(lk.attention(128), ir.Arch.SM80).plan.wgmma is None


def test_rulebook_refusals():
    tgt = target(SM90A)
    ok = LoopConfig(128, 128, 2)
    assert loop_rules.wgmma_refusal(ok, 128, 128, ir.DType.BF16, tgt, True, True) is None
    assert "K-major" in loop_rules.wgmma_refusal(ok, 128, 128, ir.DType.BF16, tgt, False, True)
    assert "multiples of 64" in loop_rules.wgmma_refusal(ok, 96, 128, ir.DType.BF16, tgt,
                                                          True, True)
    assert "shared memory" in loop_rules.wgmma_refusal(LoopConfig(128, 128, 2), 256, 256,
                                                       ir.DType.BF16, tgt, True, True)
    assert "no wgmma" in loop_rules.wgmma_refusal(ok, 128, 128, ir.DType.BF16,
                                                  target(ir.Arch.SM80), True, True)
    # the written lines are kept: 64 rows is one consumer warpgroup
    config, why = loop_rules.wgmma_default(64, 64, ir.DType.BF16, tgt, True, True, tile_m=64)
    assert config == LoopConfig(64, 128, 2) and "wgmma" in why


def test_head_dim_256_runs_wgmma_at_a_block_of_80():
    """O [64, 256] f32 per consumer warpgroup is 128 registers a thread: a block of 128 would
    spill (refused by the estimate; with 2 slots it overflows shared memory first), a block of
    80 (measured faster than 64) fits under setmaxnreg 240 with 2 slots, 3 do not fit shared
    memory; a written 128x64 stays legal."""
    tgt = target(SM90A)
    plan = _built(lk.attention(256, causal=True, arch=SM90A)).plan
    assert plan.wgmma is not None and plan.config.value == "tile 128x80 warps 8 stages 2"
    assert plan.mma.value.startswith("wgmma.m64n80k16 (SS")
    assert "m64n256k16 (RS" in plan.mma.value
    assert "registers" in loop_rules.wgmma_refusal(LoopConfig(128, 128, 1), 256, 256,
                                                   ir.DType.BF16, tgt, True, True)
    for block in (64, 80):
        assert "shared memory" in loop_rules.wgmma_refusal(LoopConfig(128, block, 3), 256, 256,
                                                           ir.DType.BF16, tgt, True, True)
        assert loop_rules.wgmma_refusal(LoopConfig(128, block, 2), 256, 256, ir.DType.BF16, tgt,
                                        True, True) is None
    # the smaller head dims keep their 128x128
    for d in (64, 128):
        assert _built(lk.attention(d, arch=SM90A)).plan.config.value == \
            "tile 128x128 warps 8 stages 2"


def test_flashattention3_shapes_are_written_tiles():
    """FlashAttention-3's tiles (hopper/tile_size.h): three consumer warpgroups of 64 rows and
    blocks that are not a power of two are written tile lines; the rulebook refuses what the
    consumers' registers do not hold (its estimate against NVRTC's spills)."""
    tgt = target(SM90A)
    plan = _built(lk.attention(64, causal=True, arch=SM90A, tile=(192, 112), stages=2)).plan
    assert plan.config.value == "tile 192x112 warps 12 stages 2"
    w = plan.wgmma
    assert (w.consumers, w.consumer_registers, w.pingpong, plan.threads) == (3, 160, True, 512)
    assert w.mma.value.startswith("wgmma.m64n112k16 (SS") and "m64n64k16 (RS" in w.mma.value
    assert (plan.gemm0.n8_tiles, plan.gemm1.k_steps) == (14, 7)
    assert (w.k_tile.rows, w.k_tile.box_bytes) == (112, 112 * 128)
    source = _built(lk.attention(128, arch=SM90A, tile=(128, 160), stages=2)).source
    assert "wgmma.mma_async.sync.aligned.m64n160k16" in source
    assert "constexpr int kBlock = 160;" in source
    # the estimate: 232 registers at 128x176 D 128 (NVRTC spilled 64 B), 164 at 192x128 D 64
    for config, d in ((LoopConfig(128, 176, 2), 128), (LoopConfig(192, 128, 2), 64),
                      (LoopConfig(192, 96, 2), 128)):
        assert "registers" in loop_rules.wgmma_refusal(config, d, d, ir.DType.BF16, tgt,
                                                       True, True)
    for config, d in ((LoopConfig(128, 160, 2), 128), (LoopConfig(192, 112, 2), 64),
                      (LoopConfig(128, 192, 2), 64), (LoopConfig(192, 80, 2), 128)):
        assert loop_rules.wgmma_refusal(config, d, d, ir.DType.BF16, tgt, True, True) is None
    assert "multiple of 16" in loop_rules.wgmma_refusal(LoopConfig(128, 72, 2), 64, 64,
                                                        ir.DType.BF16, tgt, True, True)
    # a written tile the wgmma rulebook refuses falls to mma.sync's rules, which lack it
    from kgen.errors import KgenError
    with pytest.raises(KgenError, match="tile 128x176"):
        _built(lk.attention(128, arch=SM90A, tile=(128, 176), stages=2))


COMPILED = {
    "d256_causal": lambda: lk.attention(256, causal=True, arch=SM90A),
    "d256_gqa": lambda: lk.attention(256, gqa=True, arch=SM90A),
    "d256_128x64": lambda: lk.attention(256, tile=(128, 64), stages=2, arch=SM90A),
    "d64": lambda: lk.attention(64, arch=SM90A),
    "d128_causal_gqa": lambda: lk.attention(128, causal=True, gqa=True, arch=SM90A),
    "d128_alibi_softcap": lambda: lk.attention(128, alibi=True, softcap=30.0, arch=SM90A),
    "d64_shift_f16": lambda: lk.attention(64, shift=True, dtype=ir.DType.F16, arch=SM90A),
    "d128_128x64_s3": lambda: lk.attention(128, tile=(128, 64), stages=3, arch=SM90A),
    "d64_64x128_s1": lambda: lk.attention(64, tile=(64, 128), stages=1, arch=SM90A),
    # masks whose blocks are skipped (plan.bounds): first/middle runs/last copies
    "d128_bottom_right": lambda: masked(BOTTOM_RIGHT),
    "d128_window": lambda: masked(WINDOW),
    "d64_top_window_s3": lambda: masked(TOP_WINDOW, d=64, tile=(128, 64), stages=3),
    # FlashAttention-3's shapes: three consumers, blocks that are not a power of two
    "d64_192x112": lambda: lk.attention(64, tile=(192, 112), stages=2, arch=SM90A),
    "d64_192x112_causal_gqa": lambda: lk.attention(64, causal=True, gqa=True,
                                                   tile=(192, 112), stages=2, arch=SM90A),
    "d128_128x160": lambda: lk.attention(128, tile=(128, 160), stages=2, arch=SM90A),
    "d128_128x160_causal": lambda: lk.attention(128, causal=True, tile=(128, 160), stages=2,
                                                arch=SM90A),
}


@pytest.mark.slow
@pytest.mark.parametrize("which", list(COMPILED))
def test_nvrtc_compiles_without_spills_or_wgmma_serialization(which):
    from kgen.runtime.nvrtc import compile_cubin

    built = _built(COMPILED[which]())
    assert built.plan.wgmma is not None
    compiled = compile_cubin(built.source, built.plan.name, SM90A.value)
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    assert resources["registers"] >= 128, resources  # the body, not the compute_90 pass's trap
    assert "serialized" not in compiled.log, compiled.log


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [True, False], ids=["issue_ahead", "in_order"])
def test_both_overlaps_compile_without_spills_or_serialization(ahead):
    """The overlap is a plan value: the skeleton renders either (the rulebook picks ahead)."""
    import dataclasses

    from kgen.runtime.nvrtc import compile_cubin
    from kgen.targets.sm90.loop import emit_loop

    plan = _built(lk.attention(128, causal=True, gqa=True, arch=SM90A)).plan
    assert plan.wgmma.issue_ahead
    assert plan.wgmma.pingpong  # two consumers, overlapped: they take turns
    plan = dataclasses.replace(plan, wgmma=dataclasses.replace(plan.wgmma, issue_ahead=ahead,
                                                               pingpong=ahead))
    source = emit_loop(plan, source_name="t.kg", source_hash="0", command="kgen compile t.kg")
    assert ("wgmma_wait<1>()" in source) is ahead
    assert ("named_barrier_sync(2 + consumer" in source) is ahead
    compiled = compile_cubin(source, plan.name, SM90A.value)
    assert compiled.resources().get("spill_stores", 0) == 0
    assert "serialized" not in compiled.log and "C7517" not in compiled.log, compiled.log


# ---------------------------------------------------------------------------------------------
# The blocks a tile of rows visits (plan.bounds) in the wgmma skeleton: the producer and the
# consumers take the same blocks in the same order, the interior run only blocks inside the
# mask, every block the mask touches visited

MASKED = """kernel attention_fwd {{
  target sm_90a
  tensor Q : bf16[B, H, S, {d}] row
  tensor K : bf16[B, HKV, T, {d}] row
  tensor V : bf16[B, HKV, T, {d}] row
  tensor O : bf16[B, H, S, {d}] row out
  vector lse : f32[B, H, S] out
  scalar scale : f32 = 0.125
  scalar w : f32 = 256
  loop kv over T {{
{tile}    carry m : f32[row] = -inf
    carry l : f32[row] = 0
    gemm s = Q @ K^T accumulate f32 {{
      epilogue {{
        x = where({mask}, scale * acc, -inf)
        m_new = max(m, rowmax(x))
        m_use = where(m_new == -inf, 0, m_new)
        s = exp(x - m_use)
        r = exp(m - m_use)
        l = l * r + rowsum(s)
        o = o * r
        m = m_new
      }}
    }}
    gemm o += s @ V accumulate f32
  }}
  epilogue {{
    O = where(l == 0, 0, o / l)
    lse = where(l == 0, -inf, m + log(l))
  }}
}}
"""

CAUSAL = "col <= row"
BOTTOM_RIGHT = "col <= row + T - S"
WINDOW = "(col <= row + T - S) * (col > row + T - S - w)"
TOP_WINDOW = "(col <= row) * (col > row - w)"
ANTI = "col < T - row"  # the last column falls with the row


def masked(mask: str, d: int = 128, tile: tuple[int, int] | None = None, stages: int = 2):
    from kgen.parse import parse
    from kgen.verify import verify

    lines = f"    tile {tile[0]}x{tile[1]}  warps {tile[0] // 16}  stages {stages}\n" if tile \
        else ""
    module = parse(MASKED.format(d=d, mask=mask, tile=lines), "masked.kg")
    verify(module)
    return module.kernels[0]


def _consumer_visits(visits, first_block, inside_begin, inside_end, first_middle):
    """The consumers' visits as templates/sm90/loop.cu.j2 lays them out: (visit, interior),
    the copy's constexpr interior: True where the mask's predicates read 1 (the interior's run
    nested in the edge's loop: the same order as three runs)."""
    seq = [(0, False)] if first_middle == 1 and visits > 0 else []
    middle_end = max(visits - 1, first_middle)
    inside_from = min(max(inside_begin - first_block, first_middle), middle_end)
    inside_to = min(max(inside_end - first_block, inside_from), middle_end)
    seq += [(v, False) for v in range(first_middle, inside_from)]
    seq += [(v, True) for v in range(inside_from, inside_to)]
    seq += [(v, False) for v in range(inside_to, middle_end)]
    if visits > first_middle:
        seq.append((visits - 1, False))
    return seq


# the lines of the emitted kernel _consumer_visits and the producer's range mirror
# ({m}: the first middle visit, 1 with the first block apart, 0 in order)
MIRRORED = [
    "const int visits = max(end_block - first_block, 0);",
    "for (int visit = 0; visit < visits; ++visit) {  // block first_block + visit",
    "const int middle_end = max(visits - 1, {m});",
    "const int inside_from = min(max(inside_begin - first_block, {m}), middle_end);",
    "const int inside_to = min(max(inside_end - first_block, inside_from), middle_end);",
    "for (int middle = {m}; middle < middle_end; ++middle) {\n    if (middle == inside_from) {\n"
    "      for (; middle < inside_to; ++middle) {",
    "      if (middle == middle_end) break;",
    "if (visits > {m}) {\n    const int visit = visits - 1;",
    "const int block = first_block + visit;",
]


def _source(kernel, ahead=True):
    import dataclasses

    from kgen.targets.sm90.loop import emit_loop

    plan = _built(kernel).plan
    assert plan.wgmma is not None and plan.bounds.skips, plan.mma.why
    plan = dataclasses.replace(plan, wgmma=dataclasses.replace(
        plan.wgmma, issue_ahead=ahead, pingpong=ahead and plan.wgmma.consumers >= 2))
    return plan, emit_loop(plan, source_name="t.kg", source_hash="0", command="kgen compile t.kg")


@pytest.mark.parametrize("ahead", [True, False], ids=["issue_ahead", "in_order"])
def test_the_kernel_reads_the_bounds_in_producer_and_consumers(ahead):
    plan, source = _source(masked(WINDOW), ahead)
    m = 1 if ahead else 0
    for line in MIRRORED:
        assert line.replace("{m}", str(m)) in source, line
    if ahead:
        assert "if (visits > 0) {\n    const int visit = 0;" in source
    # one ring count: the producer's and each consumer copy's slot and phase from `visit` (the
    # mask's edge compiled once: its run before the interior and its run after share a copy)
    copies = 4 if ahead else 3
    assert source.count("const int slot = visit % kStages;") == 1 + copies
    assert source.count("const unsigned phase = (visit / kStages) & 1;") == 1 + copies
    assert "block % kStages" not in source and "blocks - 1" not in source
    assert source.count("constexpr bool interior = true;") == 1
    assert source.count("constexpr bool interior = false;") == copies - 1
    assert "const bool interior" not in source  # no flag read per element: registers
    # the inside run: its predicates fold to 1 where the compiler sees interior's value
    assert "interior ? 1.0f : (static_cast<float>(col) <= " in source
    assert "(gridDim.x - 1 - blockIdx.x) * kRowsPerCta" in source
    if ahead:  # the last block's accumulating gemm, after the loop, at the last visit's slot
        assert "const int prev_slot = (visits - 1) % kStages;" in source
        assert "const unsigned prev_phase = ((visits - 1) / kStages) & 1;" in source


def test_a_program_without_a_mask_visits_every_block():
    source = _built(lk.attention(128, arch=SM90A)).source
    assert "const int first_block = 0, visits = blocks;  // no mask: every block" in source
    assert "interior" not in source and "inside_begin" not in source
    assert "const int row0 = blockIdx.x * kRowsPerCta;" in source
    assert "// Tile order: in order" in source


@pytest.mark.parametrize("mask, order", [
    (CAUSAL, "longest first"), (BOTTOM_RIGHT, "longest first"), (WINDOW, "longest first"),
    (ANTI, "in order"), ("col >= row", "in order"),
])
def test_row_tiles_run_longest_first_where_the_last_column_rises(mask, order):
    plan = _built(masked(mask)).plan
    assert plan.wgmma.tile_order.value == order, plan.wgmma.tile_order
    assert plan.wgmma.rows_reversed is (order == "longest first")
    assert ("(gridDim.x - 1 - blockIdx.x)" in _built(masked(mask)).source) is \
        plan.wgmma.rows_reversed
    assert not _built(lk.attention(64, arch=SM90A)).plan.wgmma.rows_reversed


@pytest.mark.parametrize("mask, scalars", [
    (CAUSAL, {}), (BOTTOM_RIGHT, {}), (WINDOW, {"w": 256}), (WINDOW, {"w": 100}),
    (TOP_WINDOW, {"w": 300}), (ANTI, {}), ("col + w <= row", {"w": 70}),
])
@pytest.mark.parametrize("first_middle", [1, 0], ids=["issue_ahead", "in_order"])
def test_producer_and_consumers_take_the_blocks_the_mask_touches(mask, scalars, first_middle):
    """The skeleton's arithmetic (float32, as tests/lower/test_program_bounds.py models it) for
    many sizes and every tile: the consumers take visits 0..visits-1 in order (the producer's
    range, so slots and phases agree), every block with a kept element among them, the
    constexpr-interior run only blocks every row keeps whole, an empty range where no row of
    the tile keeps a column."""
    from tests.lower.test_program_bounds import _keeps, _visits

    plan_bounds = _built(masked(mask)).plan.bounds.bounds
    rng = np.random.default_rng(11)
    sizes = [(1, 1), (17, 1000), (1000, 17), (4097, 1000), (1000, 4097), (4097, 4097),
             (128, 128), (129, 256), (300, 64)]
    sizes += [tuple(int(x) for x in rng.integers(1, 1500, 2)) for _ in range(12)]
    for rows, loop_len in sizes:
        for tile_m, block in ((128, 128), (128, 64), (64, 128), (192, 64)):
            tiles = -(-rows // tile_m)
            reversed_rows = [(tiles - 1 - x) * tile_m for x in range(tiles)]
            assert sorted(reversed_rows) == list(range(0, rows, tile_m))
            for row0 in reversed_rows:
                blocks, first, end, i0, i1 = _visits(plan_bounds, row0, tile_m, rows,
                                                     loop_len, block, scalars)
                visits = max(end - first, 0)
                seq = _consumer_visits(visits, first, i0, i1, first_middle)
                assert [v for v, _ in seq] == list(range(visits)), (mask, rows, loop_len, row0)
                rows_idx = np.arange(row0, min(row0 + tile_m, rows))
                for j in range(blocks):
                    cols = np.arange(j * block, min((j + 1) * block, loop_len))
                    keep = _keeps(plan_bounds, rows_idx, cols, scalars, rows, loop_len)
                    if keep.any():
                        assert first <= j < first + visits, (mask, rows, loop_len, row0, j)
                for v, interior in seq:
                    j = first + v
                    cols = np.arange(j * block, min((j + 1) * block, loop_len))
                    keep = _keeps(plan_bounds, rows_idx, cols, scalars, rows, loop_len)
                    if interior:
                        assert keep.all(), (mask, rows, loop_len, row0, j)
                    if first_middle <= v < visits - 1:  # a middle copy: every column exists
                        assert (j + 1) * block <= loop_len


# ---------------------------------------------------------------------------------------------
# The persistent scheduler (plan.wgmma.scheduler, a plan option; the rulebook's default tiled):
# min(tiles, resident CTAs) CTAs each walk the tiles blockIdx.x, + gridDim.x, ...; the model
# below mirrors the kernel's lines (PERSISTENT_MIRRORED, checked in the emitted source)

def _persistent_source(kernel):
    from kgen.targets.sm90.loop import emit_loop
    from kgen.targets.sm90.loop_schedule import with_scheduler

    plan = with_scheduler(_built(kernel).plan, True)
    return plan, emit_loop(plan, source_name="t.kg", source_hash="0", command="kgen compile t.kg")


PERSISTENT_MIRRORED = [
    "const int tiles = row_tiles * p.heads * p.batches;",
    "const int group_pairs = min((static_cast<int>(gridDim.x) + row_tiles - 1) / row_tiles, "
    "p.heads * p.batches);",
    "for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x, ++round) {",
    "const int first_pair = tile / (group_pairs * row_tiles) * group_pairs;",
    "const int pairs = min(group_pairs, p.heads * p.batches - first_pair);",
    "const int in_group = tile - first_pair * row_tiles;",
    "const int row_tile = in_group / pairs;",
    "const int pair = first_pair + in_group % pairs;",
    "const int head = pair % p.heads;",
    "const int batch = pair / p.heads;",
    "mbarrier_wait(q_empty, (round & 1) ^ 1);",
    "mbarrier_wait(q_full, round & 1);",
    "const int slot = (ring + visit) % kStages;",
    "const unsigned phase = ((ring + visit) / kStages) & 1;",
    "const int ring_visit = ring + visit;",
    "const int slot = ring_visit % kStages;",
    "const unsigned phase = (ring_visit / kStages) & 1;",
    "const int prev_slot = (ring_visit + kStages - 1) % kStages;",
    "const unsigned prev_phase = ((ring_visit - 1) / kStages) & 1;",
    "const int prev_slot = (ring + visits - 1) % kStages;",
    "const unsigned prev_phase = ((ring + visits - 1) / kStages) & 1;",
    "ring += visits;",
]


def _walk(cta, ctas, row_tiles, heads, batches, reversed_rows):
    """The tiles CTA `cta` of `ctas` walks, in its order: (row tile, head, batch)."""
    out = []
    everything = heads * batches
    group_pairs = min(-(-ctas // row_tiles), everything)
    for tile in range(cta, row_tiles * everything, ctas):
        first_pair = tile // (group_pairs * row_tiles) * group_pairs
        pairs = min(group_pairs, everything - first_pair)
        in_group = tile - first_pair * row_tiles
        row_tile, pair = in_group // pairs, first_pair + in_group % pairs
        out.append(((row_tiles - 1 - row_tile) if reversed_rows else row_tile,
                    pair % heads, pair // heads))
    return out


def test_persistent_is_a_plan_option_and_the_default_stays_tiled():
    assert "27 %" in loop_rules.wgmma_scheduler()[1]  # the measurement behind the rule
    from kgen.targets.sm90.loop_schedule import with_scheduler

    plan = _built(lk.attention(128, causal=True, arch=SM90A)).plan
    assert plan.wgmma.scheduler.value == "tiled" and not plan.wgmma.persistent
    assert not loop_rules.WGMMA_PERSISTENT
    persistent = with_scheduler(plan, True)
    assert persistent.wgmma.persistent and "walk the tiles" in persistent.wgmma.scheduler.why
    assert with_scheduler(persistent, False).wgmma == plan.wgmma
    _, source = _persistent_source(lk.attention(128, causal=True, arch=SM90A))
    assert "// Scheduler: persistent (" in source
    assert "blockIdx.y" not in source and "blockIdx.z" not in source
    assert "cudaDevAttrMultiProcessorCount" in source
    # Q's empty mbarrier after its full one; the storage holds both
    assert "unsigned long long barriers[2 + 4 * kStages];" in source
    assert "mbarrier_init(q_empty, kConsumers * 4);" in source
    for line in PERSISTENT_MIRRORED:
        assert line in source, line
    tiled = _built(lk.attention(128, causal=True, arch=SM90A)).source
    assert "q_empty" not in tiled and "ring_visit" not in tiled and "blockIdx.y" in tiled


@pytest.mark.parametrize("reversed_rows", [True, False])
def test_the_persistent_walk_visits_every_tile_once(reversed_rows):
    for row_tiles, heads, batches in ((1, 1, 1), (33, 4, 2), (8, 16, 1), (3, 5, 7), (1, 32, 3)):
        tiles = row_tiles * heads * batches
        everything = sorted((r, h, b) for r in range(row_tiles) for h in range(heads)
                            for b in range(batches))
        for ctas in sorted({1, 2, 3, 7, 64, 132, 263, tiles, tiles + 5}):
            grid = min(tiles, ctas)
            walked = [t for c in range(grid)
                      for t in _walk(c, grid, row_tiles, heads, batches, reversed_rows)]
            assert sorted(walked) == everything, (row_tiles, heads, batches, ctas)
            # every CTA has a tile; the first tiles launched are the first row tile walked of
            # their group's pairs; the tiles in flight together (one per CTA) read the K and V
            # of at most two groups' pairs, a group no larger than the grid needs
            walks = [_walk(c, grid, row_tiles, heads, batches, reversed_rows)
                     for c in range(grid)]
            assert all(walks)
            group_pairs = min(-(-grid // row_tiles), heads * batches)
            first = {w[0][0] for w in walks[:min(grid, group_pairs)]}
            assert first == {row_tiles - 1 if reversed_rows else 0}
            for wave in range(max(len(w) for w in walks)):
                pairs = {(h, b) for w in walks if len(w) > wave for _, h, b in [w[wave]]}
                assert len(pairs) <= 2 * group_pairs, (row_tiles, heads, batches, ctas)
            assert group_pairs == heads * batches or (group_pairs - 1) * row_tiles < grid


def _ring(visit_counts, first_middle):
    """Per tile of a CTA's walk, the producer's and each consumer's (slot, phase) sequences
    as the kernel lays them out with a running count (`ring`), and the final accumulating
    gemm's (prev_slot, prev_phase); stages 2 and 3."""
    out = {}
    for stages in (1, 2, 3):
        ring, producer, consumer, last = 0, [], [], []
        for visits in visit_counts:
            producer += [((ring + v) % stages, ((ring + v) // stages) & 1)
                         for v in range(visits)]
            for visit, _ in _consumer_visits(visits, 0, 0, 0, first_middle):
                ring_visit = ring + visit
                consumer.append((ring_visit % stages, (ring_visit // stages) & 1))
                if visit > 0:  # the previous block's gemm (issued ahead) reads its V slot
                    prev = ((ring_visit + stages - 1) % stages, ((ring_visit - 1) // stages) & 1)
                    assert prev == consumer[-2], (stages, visit_counts)
            if visits > 0:
                last.append(((ring + visits - 1) % stages, ((ring + visits - 1) // stages) & 1))
                assert last[-1] == consumer[-1]
            ring += visits
        out[stages] = (producer, consumer)
    return out


@pytest.mark.parametrize("first_middle", [1, 0], ids=["issue_ahead", "in_order"])
def test_the_running_ring_count_agrees_on_producer_and_consumers(first_middle):
    import random

    rng = random.Random(5)
    walks = [[0], [1], [3, 0, 2], [0, 0, 5, 1], [7, 7, 7]] + [
        [rng.choice((0, 0, 1, 2, 3, 4, 9, 33)) for _ in range(rng.randint(1, 12))]
        for _ in range(40)]
    for visit_counts in walks:
        for stages, (producer, consumer) in _ring(visit_counts, first_middle).items():
            assert producer == consumer, (stages, visit_counts)
            # the sequence is the ring's: slot = n % stages, phase flips every `stages` loads
            assert producer == [(n % stages, (n // stages) & 1)
                                for n in range(sum(visit_counts))]


def _protocol_finishes(visit_counts, stages, ahead, final_release):
    """A CTA's walk through the mbarrier protocol: the producer (Q per tile behind Q's empty
    mbarrier, then K and V per block behind their slots' empty mbarriers) and the consumers
    (the S of block n releases K's slot; issued ahead, the accumulating gemm of block n - 1 is
    waited and its V slot released with block n's S, the last block's after the loop if
    `final_release`), each advancing while its next wait is satisfied. True when both reach
    the end; False on a deadlock."""
    completed = {}  # (barrier, slot): completed phases

    def done(name, slot=0):
        return completed.get((name, slot), 0)

    def arrive(name, slot=0):
        completed[(name, slot)] = done(name, slot) + 1

    def producer():
        n = 0
        for r, visits in enumerate(visit_counts):
            yield lambda r=r: done("q_empty") >= r
            arrive("q_full")
            for _ in range(visits):
                for ring in ("k", "v"):
                    yield lambda ring=ring, n=n: done(ring + "_empty", n % stages) >= n // stages
                    arrive(ring + "_full", n % stages)
                n += 1

    def loaded(ring, n):
        return lambda: done(ring + "_full", n % stages) >= n // stages + 1

    def consumers():
        ring = 0
        for r, visits in enumerate(visit_counts):
            yield lambda r=r: done("q_full") >= r + 1
            for v in range(visits):
                n = ring + v
                yield loaded("k", n)
                if ahead and v > 0:
                    yield loaded("v", n - 1)
                arrive("k_empty", n % stages)
                if not ahead:
                    yield loaded("v", n)
                    arrive("v_empty", n % stages)
                elif v > 0:
                    arrive("v_empty", (n - 1) % stages)
            arrive("q_empty")
            if ahead and visits > 0:
                last = ring + visits - 1
                yield loaded("v", last)
                if final_release:
                    arrive("v_empty", last % stages)
            ring += visits

    sides = [producer(), consumers()]
    waits = [next(side, None) for side in sides]
    while any(w is not None for w in waits):
        moved = False
        for i, side in enumerate(sides):
            while waits[i] is not None and waits[i]():
                waits[i] = next(side, None)
                moved = True
        if not moved:
            return False
    return True


@pytest.mark.parametrize("ahead", [True, False], ids=["issue_ahead", "in_order"])
def test_the_persistent_protocol_releases_every_slot_and_never_deadlocks(ahead):
    """The emitted kernel releases the last block's V slot after the loop (with the first
    block apart); with that, every walk of tiles (empty ones among them) reaches its end
    at 1 to 3 slots, and without it a walk whose ring wraps past a tile's last block waits
    forever: the hang the persistent scheduler first had."""
    import re

    _, source = _persistent_source(lk.attention(128, causal=True, arch=SM90A))
    tiled = _built(lk.attention(128, causal=True, arch=SM90A)).source
    for text in (source, tiled):
        after_loop = re.search(r"the last block's .*?// The kernel's epilogue", text, re.S)
        assert after_loop and "mbarrier_arrive(v_empty + 8 * (prev_slot))" in after_loop[0]
    walks = [[1], [3], [0], [1, 1], [2, 0, 3], [0, 0, 1], [5, 5, 5], [1, 2, 3, 4], [7, 0, 7]]
    for stages in (1, 2, 3):
        for walk in walks:
            assert _protocol_finishes(walk, stages, ahead, final_release=True), (stages, walk)
    if ahead:  # the model can fail: without the release, a wrapping walk deadlocks
        assert not _protocol_finishes([1, 1, 1], 2, True, final_release=False)
        assert not _protocol_finishes([4, 4], 3, True, final_release=False)
        assert _protocol_finishes([4], 3, True, final_release=False)  # one tile: no wrap


def test_the_persistent_grid_is_the_resident_ctas_at_most_one_per_tile():
    from kgen.runtime.program import bind_program
    from kgen.targets.sm90.loop_schedule import with_scheduler
    from tests.runtime.test_program_binding import attention_args

    plan = _built(lk.attention(64, gqa=True, arch=SM90A)).plan
    tiled = bind_program(plan, attention_args(s=1000), None, 132)
    assert tiled.grid == (8, 8, 2)  # the tiled plan ignores the CTAs
    plan = with_scheduler(plan, True)
    assert bind_program(plan, attention_args(s=1000), None, 132).grid == (128, 1, 1)
    assert bind_program(plan, attention_args(s=1000), None, 100).grid == (100, 1, 1)
    assert bind_program(plan, attention_args(s=4097), None, 132).grid == (132, 1, 1)
    assert bind_program(plan, attention_args(s=1000), None, None).grid == (128, 1, 1)
    assert bind_program(plan, attention_args(s=0), None, 132).grid == (0, 1, 1)


PERSISTENT_COMPILED = {
    "d256_causal": lambda: lk.attention(256, causal=True, arch=SM90A),
    "d128_causal": lambda: lk.attention(128, causal=True, arch=SM90A),
    "d64_full": lambda: lk.attention(64, arch=SM90A),
    "d128_causal_gqa": lambda: lk.attention(128, causal=True, gqa=True, arch=SM90A),
    "d128_window": lambda: masked(WINDOW),
    "d64_top_window_s3": lambda: masked(TOP_WINDOW, d=64, tile=(128, 64), stages=3),
    "d64_64x128": lambda: lk.attention(64, causal=True, tile=(64, 128), arch=SM90A),
}


@pytest.mark.slow
@pytest.mark.parametrize("which", list(PERSISTENT_COMPILED))
def test_nvrtc_compiles_the_persistent_variant_without_spills(which):
    from kgen.runtime.nvrtc import compile_cubin

    plan, source = _persistent_source(PERSISTENT_COMPILED[which]())
    compiled = compile_cubin(source, plan.name, SM90A.value)
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    assert resources["registers"] >= 128, resources
    assert "serialized" not in compiled.log and "C7517" not in compiled.log, compiled.log


@pytest.mark.slow
def test_nvcc_compiles_the_persistent_launcher_and_kernel_without_warnings(tmp_path):
    """The host API too (NVRTC skips it): the grid from the SM count and the occupancy."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("nvcc not installed")
    _, source = _persistent_source(masked(WINDOW))
    unit = tmp_path / "persistent.cu"
    unit.write_text(source)
    proc = subprocess.run([nvcc, "-std=c++17", "-gencode", "arch=compute_90a,code=sm_90a",
                           "-Xcompiler", "-Wall,-Wextra", "-c", str(unit), "-o",
                           str(tmp_path / "persistent.o")], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert "warning" not in (proc.stderr + proc.stdout).lower(), proc.stderr


# O through the copy engine (the rulebook's where O can be staged: loop_schedule.o_store_refusal;
# with_o_store, a plan option, gives the other): staged in each consumer warpgroup's rows of Q's
# buffer, stored by one thread as [64][64] boxes of its own map

def _o_store_source(kernel):
    from kgen.targets.sm90.loop import emit_loop
    from kgen.targets.sm90.loop_schedule import with_o_store

    plan = with_o_store(_built(kernel).plan, True)
    return plan, emit_loop(plan, source_name="t.kg", source_hash="0", command="kgen compile t.kg")


def test_o_by_the_copy_engine_is_the_rulebooks_and_registers_a_plan_option():
    from kgen.targets.sm90.loop import emit_loop
    from kgen.targets.sm90.loop_schedule import with_o_store, with_scheduler

    built = _built(lk.attention(128, causal=True, gqa=True, arch=SM90A))
    plan, source = _o_store_source(lk.attention(128, causal=True, gqa=True, arch=SM90A))
    assert plan == built.plan  # the rulebook's already
    assert [(m.param, m.box_rows, m.boxes) for m in plan.wgmma.maps] == [
        ("Q", 128, 2), ("K", 128, 2), ("V", 128, 2), ("O", 64, 2)]
    assert "O staged in Q's buffer" in plan.wgmma.pipeline.value
    assert "18 of 20 points" in plan.wgmma.pipeline.why
    registers = with_o_store(plan, False)
    assert [m.param for m in registers.wgmma.maps] == ["Q", "K", "V"]
    assert "O staged" not in registers.wgmma.pipeline.value
    assert "18 of 20" not in registers.wgmma.pipeline.why
    assert with_o_store(registers, True) == plan
    from_registers = emit_loop(registers, source_name="t.kg", source_hash="0",
                               command="kgen compile t.kg")
    assert "O staged" not in from_registers and "g_O" in from_registers
    assert "g_O" not in source and "unsigned long long O[16];  // O: boxes of [64][64]" in source
    assert "stage_fragments<kN1N8>(q_rows, k_q_smem_box_bytes, out" in source
    assert "tma_store_box_4d(maps.O, q_rows + box * k_q_smem_box_bytes, box * 64, " \
           "row0 + consumer * 64, o_head, o_batch);" in source
    # the copy engine reads the staging only after every thread's writes, and before exit
    tail = source[source.index("stage_fragments<kN1N8>(q_rows"):]
    order = ["fence_proxy_async();", "named_barrier_sync(2 + kConsumers + consumer",
             "tma_store_box_4d(maps.O", "bulk_commit();", "bulk_wait_read();"]
    assert [tail.index(x) for x in order] == sorted(tail.index(x) for x in order)
    with pytest.raises(AssertionError):  # a persistent CTA loads the next Q into the staging
        with_o_store(with_scheduler(built.plan, True), True)
    persistent = with_scheduler(built.plan, True)  # so its O leaves from registers
    assert [m.param for m in persistent.wgmma.maps] == ["Q", "K", "V"]
    assert with_scheduler(persistent, False) == built.plan


@pytest.mark.parametrize("kernel, why", [
    (lk.attention(128, causal=True, arch=SM90A), None),
    (lk.attention(128, lse=False, arch=SM90A), None),
])
def test_o_store_refusal(kernel, why):
    from kgen.targets.sm90.loop_schedule import o_store_refusal

    plan = _built(kernel).plan
    stores = tuple(s for s in plan.epilogue.statements if s.__class__.__name__ == "StoreTile")
    w = plan.wgmma
    assert o_store_refusal(False, False, stores, plan.dtype, plan.gemm1.n, w.q_tile.boxes) == why
    assert "persistent" in o_store_refusal(True, False, stores, plan.dtype, plan.gemm1.n, 2)
    assert "packed" in o_store_refusal(False, True, stores, plan.dtype, plan.gemm1.n, 2)
    assert "wider than Q" in o_store_refusal(False, False, stores, plan.dtype, 256, 2)
    assert "one bf16 tile" in o_store_refusal(False, False, stores * 2, plan.dtype, 128, 2)


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128, 256])
def test_nvrtc_compiles_o_by_the_copy_engine_without_spills(d):
    from kgen.runtime.nvrtc import compile_cubin

    plan, source = _o_store_source(lk.attention(d, causal=True, gqa=True, arch=SM90A))
    compiled = compile_cubin(source, plan.name, SM90A.value)
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
        resources
    assert "warning" not in compiled.log.lower(), compiled.log


def test_a_tile_both_skeletons_refuse_names_both_reasons():
    # 128x176 at D 128: mma.sync takes no block of 176, and the wgmma consumers would spill
    with pytest.raises(KgenError) as err:
        _built(lk.attention(128, tile=(128, 176), arch=SM90A))
    assert "the block must be one of (32, 64, 128)" in str(err.value)
    assert "sm_90a's wgmma skeleton refuses it too" in str(err.value)
    assert "registers per consumer thread" in str(err.value)


@pytest.mark.parametrize("arch", [SM90A, ir.Arch.SM80])
def test_the_raw_maximum_multiplies_no_score_by_the_scale(arch):
    """exp(scale * (x - m)) with the scale a scalar: one exp_scaled_diff per score, the score
    itself never multiplied (kgen.attention's program for a positive scale, no mask)."""
    source = _built(lk.attention(64, arch=arch, raw_max=True)).source
    body = source[source.index("s's epilogue"):]
    assert "exp_scaled_diff(acc0[j][e], " in body and "p.scale * acc0" not in body
    plain = _built(lk.attention(64, arch=arch)).source
    assert "p.scale * acc0" in plain and "exp_scaled_diff(acc0" not in plain


@pytest.mark.parametrize("arch", [SM90A, ir.Arch.SM80])
def test_exp_of_a_scaled_score_minus_a_row_value_is_one_multiply_add(arch):
    """exp(c * a - b) with c a scalar (tests/test_reference_tiles.py SAVED_LSE: P from a saved
    lse): exp_diff_scaled(a, c, b), the product c * a never a value of its own
    (common/loop.py _fused_differences); the helper it calls is defined."""
    from kgen.parse import parse
    from kgen.verify import verify

    from tests.test_reference_tiles import SAVED_LSE

    module = parse(SAVED_LSE, "attention_saved_lse.kg")
    assert verify(module) == []
    built = build_verified(module.kernels[0], arch)
    assert (built.plan.wgmma is not None) == (arch is SM90A)
    source = built.source
    body = source[source.index("s's epilogue"):]
    assert "exp_diff_scaled(acc0[j][e], p.scale, (row < rows ? g_lse[row] : 0.0f))" in body
    assert "p.scale * acc0" not in body and "exp_diff(" not in body
    assert "__device__ __forceinline__ float exp_diff_scaled(float a, float c, float b)" in source


@pytest.mark.slow
@pytest.mark.parametrize("arch", [SM90A, ir.Arch.SM80])
def test_the_saved_lse_program_compiles_without_spills(arch):
    from kgen.parse import parse
    from kgen.runtime.nvrtc import compile_cubin

    from tests.test_reference_tiles import SAVED_LSE

    built = build_verified(parse(SAVED_LSE, "attention_saved_lse.kg").kernels[0], arch)
    result = compile_cubin(built.source, built.plan.name, arch.value)
    resources = result.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
        resources
