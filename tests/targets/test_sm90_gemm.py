"""kgen/targets/sm90/warp_specialized.py and gemm.py, on the CPU: every gemm/evt example on
sm_90a plans the warp-specialized kernel, and its PTX holds wgmma, the copy engine's bulk tensor
copies and mbarriers; the rules refuse what the kernel cannot run, with their reasons, and kgen
falls back to the sm_80 mainloop."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build, build_file
from kgen.errors import KgenError
from kgen.plan import EpilogueVectors, KernelKind, LoadPath, Mma, StorePath

from tests.kernels import GEMM_TEXT, gemm_kernel

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SINGLE = sorted(p for p in EXAMPLES.glob("*.kg") if p.stem.startswith(("gemm", "evt")))


@pytest.mark.slow
@pytest.mark.parametrize("example", SINGLE, ids=lambda p: p.stem)
def test_every_gemm_example_runs_the_warp_specialized_kernel_on_sm90a(example):
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    built = build_file(example, "sm_90a")
    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert s.gemms[0].pipeline.a.load is s.gemms[0].pipeline.b.load is LoadPath.TMA
    assert [r.registers for r in s.warps.roles] == [40, 232]
    ptx = compile_ptx(built.source, built.plan.name, "sm_90a")
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        assert instruction in ptx, instruction
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_a_lone_16_bit_output_leaves_through_the_copy_engine():
    s = build_file(EXAMPLES / "gemm_bias_relu.kg", "sm_90a").plan.schedule
    assert s.gemms[0].output.path is StorePath.TMA
    assert [(m.param, m.store, m.box) for m in s.tensor_maps] == [
        ("A", False, (64, 128)), ("B", False, (64, 256)), ("D", True, (64, 64)),
        ("C", False, (64, 64))]


def _c_kernel(c="f16 row", extra="", epilogue="relu(alpha * acc + beta * C + bias[col])",
              schedule="", lines="tile 128x256x64  warps 2x4  stages 3", batch=""):
    from kgen.parse import parse
    from kgen.verify import verify

    dtype, layout = c.split()
    module = parse(f"""
kernel k {{
  target sm_90a
  {schedule}
  tensor A : f16[{batch}M, K] row
  tensor B : f16[{batch}K, N] col
  tensor C : {dtype}[{batch}M, N] {layout}
  tensor D : f16[{batch}M, N] row out
  {extra}
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {epilogue} }}
  }}
}}""", "k.kg")
    verify(module)
    return module.kernels[0]


def test_c_arrives_by_the_copy_engine_in_the_output_staging():
    """ReuseSmemC: C's tile lands in D's staging during the mainloop; the epilogue reads it
    there. Its rows must then be 16-byte aligned for the fast entry point."""
    built = build(_c_kernel())
    g = built.plan.schedule.gemms[0]
    assert g.staged.param == "C" and "staging" in g.staged.why
    (align,) = [a for a in built.plan.alignments if a.param == "C"]
    assert (align.ptr_bytes, align.ld_multiple) == (16, 8)
    assert "staging" in align.reason
    rows = {label: (value, why) for label, value, why in built.plan.schedule.describe()}
    assert rows["g epilogue input"][0] == "C"
    src = built.source
    assert "unsigned staged_C" in src and "&maps.C, input_full + 8 * consumer" in src
    assert "p.ld_C % 8 != 0" in src  # narrow_reason: an unaligned C runs the narrow entry point


@pytest.mark.parametrize("c, why", [
    ("f32 row", "row-major 16-bit"),
    ("f16 col", "row-major 16-bit"),
])
def test_a_c_the_staging_cannot_take_is_read_from_global_memory(c, why):
    built = build(_c_kernel(c))
    g = built.plan.schedule.gemms[0]
    assert g.staged.param is None and why in g.staged.why
    assert "staged_C" not in built.source
    assert [m.param for m in built.plan.schedule.tensor_maps] == ["A", "B", "D"]


def test_one_input_in_the_staging_the_other_from_global_memory():
    g = build(_c_kernel(extra="tensor E : bf16[M, N] row",
                        epilogue="acc + C + E")).plan.schedule.gemms[0]
    assert g.staged.param == "C" and "E from global memory" in g.staged.why


def test_no_staged_input_without_the_copy_engine_store():
    """Two outputs leave as pairs from registers: no staging, so C is read where it lies."""
    built = build(_c_kernel(extra="tensor E : f16[M, N] row out",
                            epilogue="acc + C\n E = acc"))
    g = built.plan.schedule.gemms[0]
    assert g.output.path is StorePath.PAIRS and g.staged.param is None


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["pingpong", "batched"])
def test_staged_c_compiles_without_spills(variant, tmp_path, monkeypatch):
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    kernel = (_c_kernel(schedule="schedule pingpong", lines="tile 128x128x64  warps 2x4  stages 5")
              if variant == "pingpong" else _c_kernel(batch="L, "))
    built = build(kernel)
    assert built.plan.schedule.gemms[0].staged.param == "C"
    ptx = compile_ptx(built.source, built.plan.name, "sm_90a")
    rank = "3d" if variant == "batched" else "2d"
    assert ptx.count(f"cp.async.bulk.tensor.{rank}.shared::cluster.global") >= 3  # A, B and C
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_reductions_and_several_outputs_store_pairs_from_registers():
    for name in ("evt_colsum", "evt_multi_output", "evt_softmax_stats"):
        s = build_file(EXAMPLES / f"{name}.kg", "sm_90a").plan.schedule
        assert s.gemms[0].output.path is StorePath.PAIRS, name
        assert [m.store for m in s.tensor_maps] == [False, False], name


def test_pingpong_on_request():
    k = dataclasses.replace(gemm_kernel(tile=(128, 128, 64), warps=(2, 4), stages=5,
                                        arch=ir.Arch.SM90A), schedule=ir.Schedule.PINGPONG)
    plan = build(k).plan
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG
    assert "kPingpong = true" in build(k).source


@pytest.mark.parametrize("cluster", [None, (2, 1), (1, 2)], ids=["1x1", "2x1", "1x2"])
@pytest.mark.parametrize("a_layout", [ir.Layout.ROW, ir.Layout.COL], ids=["a_k", "a_mn"])
def test_a_256_row_tile_runs_cooperative_with_two_m64_halves_per_consumer(a_layout, cluster):
    """256x128: each consumer multiplies 128 rows (two m64 halves), starting at row
    consumer x 128; it compiles without a spill."""
    from kgen.runtime.nvrtc import compile_cubin

    k = gemm_kernel(tile=(256, 128, 64), warps=(2, 4), stages=4, arch=ir.Arch.SM90A,
                    a_layout=a_layout)
    if cluster is not None:
        g = dataclasses.replace(k.gemms[0], cluster=ir.ClusterShape(*cluster))
        k = dataclasses.replace(k, gemms=(g,))
    built = build(k)
    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert built.plan.gemms[0].frags == (2, 16) and "constexpr int kTileM = 256;" in built.source
    assert "share each 256-row tile, 128 rows each" in s.scheduler.why
    assert "kConsumerRows = kPingpong ? kTileM : kTileM / 2;" in built.source
    assert "const int row0 = kPingpong ? 0 : consumer * kConsumerRows;" in built.source
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


@pytest.mark.parametrize("n", [144, 160, 176, 192])
def test_a_256_row_tile_up_to_192_columns_plans_what_only_wgmma_runs(n):
    """256xN beyond 128 columns: the sm_80 mainloop's warp split (2x4 warps: N a multiple of 64)
    or accumulators (192 a thread) refuse it, so only the cooperative kernel plans it; its last
    staging box holds N % 64 columns where N is not a multiple of 64, copied out by the threads
    in 16-byte chunks. It compiles without a spill."""
    from kgen.runtime.nvrtc import compile_cubin

    from kgen.lower import candidates, mainloops
    from kgen.targets import target

    kernel = gemm_kernel(tile=(256, n, 64), warps=(2, 4), stages=3, arch=ir.Arch.SM90A)
    built = build(kernel)
    g, s = built.plan.gemms[0], built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE and s.gemms[0].output.path is StorePath.TMA
    assert s.gemms[0].staging.boxes == 2  # the whole tile's staging does not fit beside the ring
    refused = mainloops.run(kernel, target(ir.Arch.SM90A), None).mma_sync_refusal
    assert refused and refused[0] == 0
    assert g.a.copies_per_thread == 0 and g.b.frag_steps == ()
    # the mma.sync kernel refuses it with the sm_80 mainloop's reason
    tiled = next(c for c in candidates(kernel) if c.kind is KernelKind.TILED)
    assert not tiled.legal and tiled.reason == refused[1]
    assert "does not split over 4 warps" in tiled.reason or "accumulator" in tiled.reason
    part = n % 64
    assert ("constexpr int kPartCols = kTileN % 64;" in built.source) == bool(part)
    assert ("copy_part_box_out(p.D, p.ld_D, buffer" in built.source) == bool(part)
    if part:
        assert "constexpr int kBoxesN = (kTileN + 63) / 64;" in built.source
        assert "if (box == 0) bulk_wait_read(); else bulk_wait_read_pending<kStagesD - 1>();" \
            in built.source
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_an_odd_number_of_n8_groups_on_a_ring_of_4_beside_one_staging_box():
    """256x152 (cuBLAS's tile at 3000x5000x2000): 19 n8 column groups, the last written by
    stmatrix.x2; the narrow producer's last pass copies B's last 8 rows; its ring of 4 leaves
    room for one staging box per consumer. It compiles without a spill."""
    from kgen.runtime.nvrtc import compile_cubin

    built = build(gemm_kernel(tile=(256, 152, 64), warps=(2, 4), stages=4, arch=ir.Arch.SM90A))
    gs = built.plan.schedule.gemms[0]
    assert gs.output.path is StorePath.TMA and gs.pipeline.stages == 4 and gs.staging.boxes == 1
    assert "holds 1 64x64 box, and" in gs.staging.why
    src = built.source
    assert "constexpr int kStagesD = 1;" in src and "constexpr int kFragN = kTileN / 8;" in src
    assert "stmatrix_x2(at, pairs);" in src and "if (box == kBoxesN - 1) {" in src
    assert "if (16 * i + r < kRows)" in src
    result = compile_cubin(src, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_a_cluster_shares_no_half_of_b_short_of_whole_swizzle_groups():
    k = gemm_kernel(tile=(256, 152, 64), warps=(2, 4), stages=4, arch=ir.Arch.SM90A)
    g = dataclasses.replace(k.gemms[0], cluster=ir.ClusterShape(2, 1))
    with pytest.raises(KgenError, match="whole 8-row groups of the 128-byte swizzle"):
        build(dataclasses.replace(k, gemms=(g,)))


def test_the_whole_tiles_staging_copies_its_part_boxes_out_by_the_threads():
    """128x96: a consumer's whole tile fits its staging (two boxes per 64 rows, the second part
    full); the copy engine stores the first, the threads the part box, then all wait."""
    built = build(gemm_kernel(tile=(128, 96, 64), warps=(2, 4), stages=4, arch=ir.Arch.SM90A))
    assert built.plan.schedule.gemms[0].staging.boxes == 0
    src = built.source
    assert "copy_part_box_out(p.D, p.ld_D, staging + (i * kBoxesN + kBoxesN - 1) * " in src
    assert "for (int box = 0; box < kBoxesN - 1; ++box)" in src
    assert "warpgroup_barrier(consumer);  // the part boxes are read out of the staging" in src
    # a tile that ends inside a 16-byte chunk copies every box element by element, up to the
    # tile's last column
    assert "M, min(N, n0 + kTileN));" in src


def test_a_column_major_output_with_a_part_box_leaves_as_pairs():
    from kgen.parse import parse
    from kgen.verify import verify

    text = (GEMM_TEXT.replace("TARGET", "sm_90a").replace("N] row out", "N] col out")
            .replace("LINES", "tile 256x160x64  warps 2x4  stages 3"))
    module = parse(text, "col.kg")
    verify(module)
    s = build(module.kernels[0]).plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE and s.gemms[0].output.path is StorePath.PAIRS
    assert "part box is not built" in s.gemms[0].output.why


@pytest.mark.parametrize("tile, schedule, reason", [
    ((256, 208, 64), None, "does not split over 4 warps"),  # wider than the cooperative's 192
    ((128, 160, 64), ir.Schedule.PINGPONG, "up to 128"),  # a ping-pong consumer of 128 rows
])
def test_a_consumer_of_128_rows_wider_than_it_holds_is_refused(tile, schedule, reason):
    """Wider than the consumers hold: every kernel refuses it, the mma.sync one last (its
    refusal is the one raised without a schedule line)."""
    k = dataclasses.replace(gemm_kernel(tile=tile, warps=(2, 4), stages=3, arch=ir.Arch.SM90A),
                            schedule=schedule)
    with pytest.raises(KgenError, match=reason):
        build(k)


@pytest.mark.parametrize("tile, reason", [
    ((256, 160, 64), "does not split over 4 warps"),
    ((256, 152, 64), "tile N must be a multiple of 16"),
])
def test_the_mma_sync_mainloops_refusal_stays_on_sm_80(tile, reason):
    k = gemm_kernel(tile=tile, warps=(2, 4), stages=3, arch=ir.Arch.SM80)
    with pytest.raises(KgenError, match=reason):
        build(k)


@pytest.mark.parametrize("change, reason", [
    (dict(b_layout=ir.Layout.ROW, tile=(128, 32, 64), warps=(4, 2)), "multiple of 64"),
    (dict(tile=(64, 128, 64), warps=(2, 2)), "a 128- or 256-row tile"),
    (dict(tile=(128, 128, 32)), "128-byte k tiles"),
    (dict(warps=(2, 2), tile=(128, 128, 64)), "8 math warps"),
])
def test_what_the_copy_engine_cannot_serve_falls_back_with_its_reason(change, reason):
    """Where TMA with wgmma cannot serve, kgen plans the sm_80 mainloop and says why."""
    options = dict(tile=(128, 128, 64), warps=(2, 4), arch=ir.Arch.SM90A) | change
    s = build(gemm_kernel(**options)).plan.schedule
    assert s.scheduler.kind is KernelKind.TILED and s.gemms[0].atom.instruction is Mma.MMA_SYNC
    why = dict((kind, text) for kind, text in s.rejected)[KernelKind.COOPERATIVE]
    assert reason in why, why
    # the gemm's mma row gives the same reason (a one-gemm kernel has no `keep B resident`)
    assert s.gemms[0].atom.why == ("not wgmma: the cooperative warp-specialized kernel refuses "
                                  f"this gemm: {why}")


def test_a_chain_on_mma_sync_says_wgmma_needs_resident_b():
    """A chain's wgmma is the resident chain's: its mma row says so, not the one-gemm reason."""
    s = build_file(EXAMPLES / "b2b_gemm_smem.kg", "sm_90a").plan.schedule
    assert s.scheduler.kind is KernelKind.TILED
    assert [g.atom.why for g in s.gemms] == ["wgmma is planned for resident chains only "
                                            "('keep B resident')"] * 2


def test_a_tile_no_kernel_takes_gets_the_advice_that_keeps_it_on_wgmma():
    """Issue 49: `tile 256x256x64` was refused with "use more warps or a smaller tile", and more
    warps planned the mma.sync kernel. The refusal names both kernels' rules and advises a
    tile the warp-specialized kernel takes."""
    with pytest.raises(KgenError) as err:
        build(gemm_kernel(tile=(256, 256, 64), warps=(2, 4), arch=ir.Arch.SM90A))
    message = err.value.message
    assert message.startswith("tile 256x256x64 runs on neither of sm_90a's kernels for one gemm: "
                              "the cooperative warp-specialized kernel refuses it: tile N a "
                              "multiple of 8 up to 192, not 256")
    assert "warp tile 128x64 needs 256 f32 accumulator registers per thread" in message
    assert "use more warps" not in message
    assert message.endswith("use a tile the warp-specialized kernel takes (more warps would run "
                            "this one on the mma.sync kernel, the slower path on sm_90a)")
    # where the warp-specialized kernel refuses the warps, not the tile, both reasons stand
    with pytest.raises(KgenError) as err:
        build(gemm_kernel(tile=(128, 256, 64), warps=(2, 2), arch=ir.Arch.SM90A))
    assert err.value.message == (
        "warp tile 64x128 needs 256 f32 accumulator registers per thread (at most 128); use "
        "more warps or a smaller tile (on the mma.sync kernel; the cooperative "
        "warp-specialized kernel refuses this gemm: 8 math warps (two consumer warpgroups), "
        "not 2x2)")
    # on sm_80 the mma.sync kernel's own words
    with pytest.raises(KgenError, match="at most 128[)]; use more warps or a smaller tile$"):
        build(gemm_kernel(tile=(256, 256, 64), warps=(2, 4), arch=ir.Arch.SM80))


def test_a_ping_pong_consumers_grid_is_a_warps_line_of_its_own():
    """`warps 4x1` under `schedule pingpong` names one consumer warpgroup's grid (the ping-pong
    chain's rule): the same kernel as 8 math warps. The cooperative kernel refuses it."""
    def pingpong(warps):
        return dataclasses.replace(gemm_kernel(warps=warps, stages=4, arch=ir.Arch.SM90A),
                                   schedule=ir.Schedule.PINGPONG)

    same = dict(source_hash="0")  # the headers' hash is the IR's, and the IRs differ
    own, eight = build(pingpong((4, 1)), **same), build(pingpong((2, 4)), **same)
    assert own.plan.schedule.scheduler.kind is KernelKind.PINGPONG and own.source == eight.source
    assert own.plan.gemms[0].warps == eight.plan.gemms[0].warps == (4, 1)
    s = build(gemm_kernel(warps=(4, 1), arch=ir.Arch.SM90A)).plan.schedule
    assert s.scheduler.kind is KernelKind.TILED
    assert "8 math warps (two consumer warpgroups), not 4x1" in s.gemms[0].atom.why


def test_a_schedule_line_that_cannot_be_served_is_refused_where_it_stands():
    k = dataclasses.replace(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), arch=ir.Arch.SM90A),
                            schedule=ir.Schedule.PINGPONG)
    with pytest.raises(KgenError, match="up to 128"):
        build(k)
    k = dataclasses.replace(gemm_kernel(arch=ir.Arch.SM80), schedule=ir.Schedule.COOPERATIVE)
    with pytest.raises(KgenError, match="schedule cooperative needs target sm_90a"):
        build(k)


def test_the_cu_launcher_encodes_every_map():
    source = build_file(EXAMPLES / "gemm_bias_relu.kg", "sm_90a").source
    assert "unsigned long long A[16];" in source and "unsigned long long D[16];" in source
    assert source.count("reinterpret_cast<CUtensorMap*>(&maps.") == 4  # A, B, D and C
    # A's and B's loads pull 128-byte lines, the staged C's 256-byte ones, D's stores none
    promotions = [line.split("CU_TENSOR_MAP_L2_PROMOTION_")[1].split(",")[0]
                  for line in source.splitlines() if "CU_TENSOR_MAP_L2_PROMOTION_" in line]
    assert promotions == ["L2_128B", "L2_128B", "NONE", "L2_256B"]


def _split(kernel: ir.Kernel, count: int) -> ir.Kernel:
    g = dataclasses.replace(kernel.gemms[0], split=ir.SplitK(count))
    return dataclasses.replace(kernel, gemms=(g,))


@pytest.mark.parametrize("kind", [None, ir.Schedule.PINGPONG], ids=["cooperative", "pingpong"])
def test_a_configuration_with_split_and_a_cluster(kind):
    """A configuration that fills `split S` and a cluster (the API's, the tuner's) runs on the
    cooperative kernel; ping-pong refuses the split in the plan, not in NVRTC, and the builder
    goes on to its own list and says why."""
    from kgen.targets import Config, GemmConfig

    base = gemm_kernel(arch=ir.Arch.SM90A)
    free = dataclasses.replace(base.gemms[0], tile=None, warps=None, stages=None)
    k = dataclasses.replace(base, gemms=(free,), schedule=kind)
    config = Config((GemmConfig((128, 128, 64), (2, 4), 5, split=4, cluster=(2, 1)),))
    schedule = build(k, config=config).plan.schedule
    if kind is None:
        assert schedule.scheduler.split_k == 4 and schedule.scheduler.cluster.shape == (2, 1)
    else:
        assert schedule.scheduler.split_k == 1 and schedule.scheduler.cluster.shape == (1, 1)
        assert any("split 4 runs on the cooperative schedule" in why
                   for _, why in schedule.untaken)


@pytest.mark.parametrize("batch", [False, True], ids=["plain", "batched"])
def test_split_k_runs_on_the_cooperative_kernel(batch):
    """`split S` with a 128-row tile on sm_90a: S units of the persistent walk per output tile,
    each over its part of the k tiles by TMA and wgmma, its f32 partials to the workspace (no
    staging, no output tensor map), and <kernel>_splitk after it; compiled without spills."""
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    kernel = _split(_c_kernel(c="f16 row", epilogue="gelu(acc + bias[col])",
                              lines="tile 128x128x64  warps 2x4  stages 5",
                              batch="L, " if batch else ""), 4)
    built = build(kernel)
    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE and s.scheduler.split_k == 4
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS and s.gemms[0].output.path is StorePath.PAIRS
    assert "split-K" in s.gemms[0].output.why
    assert [m.param for m in s.tensor_maps] == ["A", "B"]
    assert built.plan.split_kernel == "k_splitk"
    sizes = dict(M=1000, N=300, K=5000, L=3)
    assert built.plan.grid(sizes) == (8 * 3 * 4 * (3 if batch else 1), 1, 1)
    assert built.plan.grid(sizes, persistent_ctas=132) == (min(132, 96 * (3 if batch else 1)), 1, 1)
    src = built.source
    assert "constexpr int kSplitK = 4;" in src
    assert "(k_first + kt) * kTileK" in src and "k_splitk<<<" in src
    ptx = compile_ptx(src, "k", "sm_90a")
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    result = compile_cubin(src, "k", "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
    rows = dict((label, value) for label, value, _ in s.describe())
    assert rows["split-K"] == "4 units of the persistent walk per output tile"


def test_split_k_with_pingpong_or_reductions_is_not_the_cooperative_kernels():
    k = _split(dataclasses.replace(gemm_kernel(tile=(128, 128, 64), warps=(2, 4), stages=5,
                                               arch=ir.Arch.SM90A),
                                   schedule=ir.Schedule.PINGPONG), 2)
    with pytest.raises(KgenError, match="split 2 runs on the cooperative schedule"):
        build(k)
    reducing = _split(build_file(EXAMPLES / "evt_colsum.kg", "sm_90a").kernel, 2)
    s = build(dataclasses.replace(reducing, target=ir.Arch.SM90A)).plan.schedule
    assert s.scheduler.kind is KernelKind.TILED and s.scheduler.split_k == 2
    why = dict(s.rejected)[KernelKind.COOPERATIVE]
    assert "epilogue reductions runs on the tiled kernel" in why, why


def test_a_192_column_tile_runs_three_staging_boxes():
    """Tile N need not be a power of two: 128x192 (three 64-column boxes) on the cooperative
    kernel, without spills."""
    from kgen.runtime.nvrtc import compile_cubin

    built = build(gemm_kernel(tile=(128, 192, 64), warps=(2, 4), stages=4, arch=ir.Arch.SM90A))
    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE and s.gemms[0].output.path is StorePath.TMA
    assert [m.box for m in s.tensor_maps] == [(64, 128), (64, 192), (64, 64)]
    result = compile_cubin(built.source, "k", "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_the_staged_c_is_loaded_halfway_through_the_mainloop():
    """StagedInput.late: the load waits for the previous tile's output to leave
    the staging, so it issues once half the tile's k tiles are issued (or at the tile's start
    when K has none), not as the mainloop starts."""
    built = build_file(EXAMPLES / "gemm_bias_relu.kg", "sm_90a")
    g = built.plan.schedule.gemms[0]
    assert g.staged.param == "C" and g.staged.late
    src = built.source
    assert "const auto load_staged = [&]() {" in src
    assert "if (k_tiles == 0) load_staged();" in src
    assert "if (kt == k_tiles / 2) load_staged();" in src
    rows = {label: why for label, _, why in built.plan.schedule.describe()}
    assert rows["mma0 epilogue input"].endswith("issued halfway through the tile's mainloop")
    plain = build_file(EXAMPLES / "gemm.kg", "sm_90a").source
    assert "load_staged" not in plain


def test_the_staging_epilogue_is_branch_free_where_it_reads_no_memory():
    """Every input of gemm_bias_relu's staging epilogue is staged (C in the staging, bias in
    its buffer): it computes every pair, those past M or N too, with no predicate, since the
    copy engine's store leaves them out. With the vectors back in global memory
    (staged_vectors = ()), the pairs past M or N are skipped, so that no read leaves the vector."""
    from kgen.emit import emit
    from kgen.targets.sm90.gemm import staging_reads_memory

    built = build_file(EXAMPLES / "gemm_bias_relu.kg", "sm_90a")
    plan, g = built.plan, built.plan.gemms[0]
    assert not staging_reads_memory(plan, g)
    assert "const bool live[2]" not in built.source
    assert "pairs[q] = mma0_epilogue_packed(p, " in built.source
    plan_off = plan.with_gemm_schedule(vectors=EpilogueVectors())
    assert staging_reads_memory(plan_off, g)
    src = emit(plan_off, source_name="x.kg", source_hash="", command="x")
    assert "const bool live[2] = {m0 + row0 + r < M, m0 + row0 + r + 8 < M};" in src
    assert "pairs[q] = live[h] && n0 + c < N ? mma0_epilogue_packed(" in src


def test_a_part_box_on_pingpong_leaves_through_the_copy_engine():
    """A ping-pong tile N that is not a multiple of 64 stages its last box part full, as the
    cooperative kernel does: each consumer copies its own tile's part box out (0 spills)."""
    from kgen.runtime.nvrtc import compile_cubin

    for tile, stages in (((128, 96, 64), 5), ((64, 160, 64), 6)):
        k = dataclasses.replace(gemm_kernel(tile=tile, warps=(2, 4), stages=stages,
                                            arch=ir.Arch.SM90A), schedule=ir.Schedule.PINGPONG)
        built = build(k)
        s = built.plan.schedule
        assert s.scheduler.kind is KernelKind.PINGPONG and s.gemms[0].output.path is StorePath.TMA
        assert "copy_part_box_out(" in built.source
        assert "the last box of each 64 rows holds 32 columns, copied out by the consumer's " \
            "threads" in s.gemms[0].output.why
        result = compile_cubin(built.source, "k", "sm_90a")
        assert result.spill_stores == 0 and result.spill_loads == 0, result.log