"""The builder: schedule lines left out are filled per target, written ones always win."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import builder, lower
from kgen.parse import parse
from kgen.plan import KernelKind, Mma
from kgen.targets import Config, GemmConfig, configs, target
from kgen.verify import verify

from tests.kernels import EXAMPLES, GEMM_TEXT as GEMM, gemm_kernel, without_schedule_lines


def gemm(lines: str = "", arch: str = "sm_80") -> ir.Kernel:
    module = parse(GEMM.replace("TARGET", arch).replace("LINES", lines), "t.kg")
    verify(module)
    return module.kernels[0]


def bare(path) -> ir.Kernel:
    module = parse(without_schedule_lines(path.read_text()), path.name)
    verify(module)
    return module.kernels[0]


def test_the_stripped_examples_have_no_schedule_line():
    for path in EXAMPLES:
        for g in bare(path).gemms:
            assert (g.tile, g.warps, g.stages, g.keep, g.split) == (None,) * 5 and not g.resident


@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM86, ir.Arch.SM90A])
def test_every_example_plans_without_its_schedule_lines(arch):
    for path in EXAMPLES:
        kernel = bare(path)
        if not kernel.gemms:
            continue
        if arch is not ir.Arch.SM90A and any(p.dtype.fp8 for p in kernel.params):
            continue  # FP8 runs on wgmma only (tests/test_fp8.py: refused, located, elsewhere)
        plan = lower(kernel, arch)
        chosen = {c.line for c in plan.schedule.chosen}
        for g in kernel.gemms:
            assert {f"{g.name} tile", f"{g.name} warps", f"{g.name} stages"} <= chosen, path
        assert plan.storage.total_bytes <= plan.storage.limit_bytes


def test_sm90a_plans_every_chain_without_schedule_lines_on_wgmma():
    """Ping-pong over resident B where a consumer's accumulators fit its registers, else the
    resident chain on 128-row tiles; both gemms on wgmma either way."""
    chains = [p for p in EXAMPLES if len(bare(p).gemms) == 2]
    assert len(chains) >= 8
    for path in chains:
        plan = lower(bare(path), ir.Arch.SM90A)
        assert plan.schedule.wgmma and plan.schedule.resident, path
        assert plan.schedule.gemms[1].atom.instruction is Mma.WGMMA_RS, path
        fits = plan.gemms[0].n_dim * 3 // 4 + plan.gemms[1].n_dim // 2 <= 224
        kind = KernelKind.PINGPONG if fits else KernelKind.PERSISTENT
        assert plan.schedule.scheduler.kind is kind, path


def test_a_resident_ring_runs_at_most_one_tile_ahead():
    text = next(p for p in EXAMPLES if p.name == "b2b_gemm_rf_sm90a.kg").read_text()
    with pytest.raises(KgenError) as info:  # K0 = 256: 4 k tiles, at most 5 stages
        lower(parse(text.replace("576", "256"), "t.kg").kernels[0])
    assert "stages 6 must be at most 5" in info.value.message
    assert info.value.loc.line == text.splitlines().index(
        next(line for line in text.splitlines() if "stages 6" in line)) + 1


def test_one_gemm_defaults_per_target():
    kernel = gemm()
    hopper = lower(kernel, ir.Arch.SM90A)
    assert hopper.schedule.scheduler.kind is KernelKind.COOPERATIVE
    assert hopper.gemms[0].tile == (128, 256, 64)
    ampere = lower(kernel, ir.Arch.SM80)
    assert ampere.schedule.scheduler.kind is KernelKind.TILED
    assert (ampere.gemms[0].tile, ampere.gemms[0].warps) == ((128, 256, 64), (2, 4))
    # sm_86's 99 KB take a smaller tile, deepest pipeline first
    small = lower(kernel, ir.Arch.SM86)
    assert small.storage.total_bytes <= 99 * 1024
    assert small.gemms[0].tile == (128, 128, 64) and small.gemms[0].stages == 3
    assert [u[0] for u in small.schedule.untaken] == ["128x256x64 w2x4 s3", "128x128x64 w2x2 s4"]


def test_a_written_schedule_is_not_explained_as_another_kind():
    """Lines filled beside a written `schedule pingpong` from a configuration listed for the
    cooperative kernel do not say the cooperative kernel runs."""
    kernel = dataclasses.replace(gemm("tile 64x128x64\n    stages 8"),
                                 schedule=ir.Schedule.PINGPONG)
    plan = lower(kernel, ir.Arch.SM90A)
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG
    (warps,) = plan.schedule.chosen
    assert warps.line == "g warps" and "cooperative" not in warps.why
    # every written line the configuration would write otherwise, the schedule first
    assert warps.why.endswith("beside the written lines (`schedule pingpong`, `tile 64x128x64`, "
                              "`stages 8`)")
    free = lower(gemm(""), ir.Arch.SM90A)  # no line written: the configuration's own why
    assert any("cooperative" in c.why for c in free.schedule.chosen)
    # a written `schedule cooperative` is the kind the configuration describes: its own why
    written = lower(dataclasses.replace(gemm(""), schedule=ir.Schedule.COOPERATIVE),
                    ir.Arch.SM90A)
    assert written.schedule.scheduler.kind is KernelKind.COOPERATIVE
    assert [(c.line, c.why) for c in written.schedule.chosen] == [
        (c.line, c.why) for c in free.schedule.chosen if c.line != "schedule"]
    assert not any("beside the written lines" in c.why for c in written.schedule.chosen)


def test_a_written_line_always_wins():
    plan = lower(gemm("tile 64x64x32"), ir.Arch.SM90A)
    assert plan.gemms[0].tile == (64, 64, 32)
    assert [c.line for c in plan.schedule.chosen] == ["g warps", "g stages"]
    # 64 rows: not the warp-specialized kernel
    assert plan.schedule.scheduler.kind is KernelKind.TILED
    plan = lower(gemm("stages 2"), ir.Arch.SM80)
    assert plan.gemms[0].stages == 2 and plan.gemms[0].tile == (128, 256, 64)


def test_a_written_line_that_cannot_plan_is_refused_at_its_line():
    with pytest.raises(KgenError) as info:
        lower(gemm("tile 128x128x24"))
    assert info.value.loc.line == 7
    assert info.value.message == "tile K must be a power of two between 16 and 512, got 24"
    # refused for every configuration kgen tried around it: the message says so
    with pytest.raises(KgenError) as info:
        lower(gemm("tile 256x256x64"), ir.Arch.SM80)
    assert info.value.loc.line == 7 and "configurations for the schedule lines" in info.value.message


def test_a_fixed_small_size_takes_a_tile_that_fits_it():
    text = GEMM.replace("TARGET", "sm_80").replace("LINES", "").replace("[K, N]", "[K, 64]")
    kernel = parse(text.replace("[M, N]", "[M, 64]"), "t.kg").kernels[0]
    assert lower(kernel).gemms[0].tile[1] == 64


def fixed_n(n: int, lines: str = "", b_layout: str = "col") -> ir.Kernel:
    text = GEMM.replace("TARGET", "sm_80").replace("LINES", lines)
    text = text.replace("[K, N] col", f"[K, {n}] {b_layout}").replace("[M, N]", f"[M, {n}]")
    return parse(text, "t.kg").kernels[0]


@pytest.mark.parametrize("n, width", [(192, 192), (160, 192), (384, 192), (576, 192),
                                      (256, 256), (448, 256), (512, 256), (100, 128)])
def test_sm80_takes_the_tile_width_that_pads_n_least(n, width):
    """N = 192 on 128x256 tiles leaves a quarter of the mma.sync columns idle: where whole
    192-column tiles pad N less than 256-column ones, the 192-wide twin (same rows, K, warps
    and stages) is tried first, and says why."""
    plan = lower(fixed_n(n), ir.Arch.SM80)
    g = plan.gemms[0]
    assert g.tile[1] == width
    if width == 192:
        assert (g.tile, g.warps, g.stages) == ((128, 192, 64), (2, 4), 3)
        assert "192-column tiles" in plan.schedule.chosen[0].why
        assert not plan.schedule.untaken


def test_the_192_wide_twins_need_a_known_n_and_a_k_major_b():
    sm80 = target(ir.Arch.SM80)
    tiles = [c.gemms[0].tile for c in configs(sm80, builder.shapes(gemm()), wide=False)]
    assert all(t[1] != 192 for t in tiles) and tiles[0] == (128, 256, 64)  # a runtime N
    # a runtime N given as a size (the tuner's wide list): every 256-wide tile's twin
    wide = [c.gemms[0] for c in configs(sm80, builder.shapes(gemm()), wide=True,
                                        sizes=dict(M=4096, N=192, K=4096))]
    twins = [(g.tile[0], 256, g.tile[2], g.warps, g.stages) for g in wide if g.tile[1] == 192]
    assert twins and twins == [(g.tile + (g.warps, g.stages)) for g in wide if g.tile[1] == 256]
    # an N-major B: a 192-wide B tile has no constant-offset layout for 256 threads
    row_b = fixed_n(192, b_layout="row")
    assert all(c.gemms[0].tile[1] != 192
               for c in configs(sm80, builder.shapes(row_b), wide=True))
    assert lower(row_b, ir.Arch.SM80).gemms[0].tile == (128, 256, 64)


def test_a_written_64x192_tile_plans_on_sm80():
    plan = lower(fixed_n(192, "tile 64x192x32"), ir.Arch.SM80)
    assert (plan.gemms[0].tile, plan.gemms[0].warps) == ((64, 192, 32), (2, 4))


def test_split_and_small_k_configs_need_their_sizes():
    shape = builder.shapes(gemm())
    sm90 = target(ir.Arch.SM90A)
    assert not any(c.gemms[0].split > 1 for c in configs(sm90, shape, wide=True))
    few_tiles = configs(sm90, shape, sizes=dict(M=64, N=64, K=65536), wide=True)
    assert {c.gemms[0].split for c in few_tiles} >= {16, 32, 64}
    many_tiles = configs(sm90, shape, sizes=dict(M=4096, N=4096, K=4096), wide=True)
    assert all(c.gemms[0].split == 1 for c in many_tiles)
    small_k = configs(sm90, shape, sizes=dict(M=8192, N=8192, K=512))
    assert small_k[0].schedule is KernelKind.PINGPONG
    assert configs(sm90, shape)[0].schedule is None


def test_listed_fills_only_free_lines_and_never_repeats():
    kernel = gemm("tile 128x128x64 warps 2x2")
    listed = builder.listed(kernel, target(ir.Arch.SM80), wide=True)
    filled = [k for _, k, _ in listed]
    assert len({(k.gemms, k.schedule) for k in filled}) == len(filled) > 1
    for k in filled:
        assert (k.gemms[0].tile.m, k.gemms[0].tile.n, k.gemms[0].tile.k) == (128, 128, 64)
        assert (k.gemms[0].warps.m, k.gemms[0].warps.n) == (2, 2)


def test_a_tuned_config_is_tried_first():
    tuned = Config((GemmConfig((64, 128, 64), (2, 2), 4),), why="test")
    plan = lower(gemm(), ir.Arch.SM80, config=tuned)
    assert (plan.gemms[0].tile, plan.gemms[0].stages) == ((64, 128, 64), 4)
    assert all(c.why.startswith("tuned") for c in plan.schedule.chosen)
    # the source's lines still win over it
    plan = lower(gemm("stages 3"), ir.Arch.SM80, config=tuned)
    assert (plan.gemms[0].tile, plan.gemms[0].stages) == ((64, 128, 64), 3)


def test_python_ir_may_leave_the_lines_out():
    kernel = gemm_kernel()
    g = dataclasses.replace(kernel.gemms[0], tile=None, warps=None, stages=None)
    kernel = dataclasses.replace(kernel, gemms=(g,))
    verify(ir.Module((kernel,)))
    assert lower(kernel).gemms[0].tile == (128, 256, 64)


def test_the_filled_lines_show_in_inspect():
    rows = lower(gemm(), ir.Arch.SM86).schedule.describe()
    labels = [r[0] for r in rows]
    assert labels[:3] == ["line g tile", "line g warps", "line g stages"]
    assert rows[0][1] == "128x128x64" and rows[0][2].startswith("chosen by kgen: ")
    assert "not chosen" in labels


def test_a_chain_takes_pingpong_with_b0_streamed_on_sm90a():
    """B0 streams through the ring beside A (bench/chain_ring.py: the fastest or within 5% of
    it on 16 chains); B1 stays resident."""
    text = next(p for p in EXAMPLES if p.name == "b2b_gemm_smem.kg").read_text()
    narrow = parse(without_schedule_lines(text).replace("256", "128"), "t.kg").kernels[0]
    plan = lower(narrow, ir.Arch.SM90A)
    assert plan.schedule.scheduler.pingpong
    assert plan.schedule.resident
    assert plan.schedule.chain_ring_b
    lines = {c.line: c.value for c in plan.schedule.chosen}
    assert lines["schedule"] == "pingpong" and lines["g1 keep"] == "keep g0 in registers"
    assert lines["g1 resident"] == "keep B1 resident" and "g0 resident" not in lines


@pytest.mark.parametrize("sizes, label", [
    (dict(M=4096, N=4096, K=4096), None),  # 512 tiles of 128x256: 3.9 waves, the default's
    # 960 tiles of 128x256: 7.3 waves; 1296 of 128x192: 9.8; 648 of 256x192: 4.9
    (dict(M=6144, N=5120, K=3072), "256x192x64 w2x4 s3"),
    # 264 tiles of 128x176: two waves, each tile half of 256x176's (132: one), and cheaper per
    # element; 264 of 128x192 two, 132 of 256x192 one but wider
    (dict(M=3000, N=1936, K=4096), "128x176x64 w2x4 s4"),
    (dict(M=8192, N=8192, K=8192), None),  # 256x192 fills its waves no better: the default
    # 132 tiles of 256x152, one wave, on a ring of 4 (one staging box per consumer)
    (dict(M=3000, N=1672, K=4096), "256x152x64 w2x4 s4"),
    # 132 tiles of 128x144, one wave (cuBLAS's width there); 96 of 128x192
    (dict(M=1536, N=1536, K=6144), "128x144x64 w2x4 s4"),
    # 132 tiles of 128x176 or of 128x192: the narrower computes fewer columns past N
    (dict(M=2800, N=976, K=5184), "128x176x64 w2x4 s4"),
    # 128x144 would make 252 tiles, two waves: it is weighed for one at most
    (dict(M=1792, N=2464, K=8064), "256x152x64 w2x4 s4"),
    # 340 tiles of 128x160 (2.6 waves) gain under the narrow widths' margin over 221 of
    # 128x256 (1.7): the default
    (dict(M=2064, N=3176, K=5376), None),
    (dict(M=128, N=4096, K=4096), "pingpong: 64x64x64 w2x4 s12"),  # 64 k tiles: no split;
    # 128 tiles of 64x64, one wave
    (dict(M=64, N=8192, K=4096), "pingpong: 64x64x64 w2x4 s12"),  # 128 tiles of 64x64
    (dict(M=64, N=4096, K=8192), "pingpong: 64x64x64 w2x4 s12"),  # 64 tiles of one row: no split
    (dict(M=320, N=2048, K=4096), "pingpong: 64x128x64 w2x4 s8"),  # 80 tiles of 64x128
    (dict(M=128, N=4096, K=8192), "128x128x64 w2x4 s5 split 4"),  # 128 k tiles: parts of 32
    (dict(M=256, N=2048, K=16384), "128x128x64 w2x4 s5 split 4"),  # parts of 64 k tiles
    (dict(M=1024, N=1024, K=1024), "pingpong: 64x128x64 w2x4 s8"),  # 16 k tiles: no split
    (dict(M=96, N=12288, K=4096), "pingpong: 64x192x64 w2x4 s7"),  # 128 tiles: one wave
    (dict(M=512, N=4096, K=4096), "128x128x64 w2x4 s6"),  # 128 tiles: one wave
    # 656 tiles of 256x128: 4.97 waves; 672 of 128x256 5.09, 896 of 128x192 6.8
    (dict(M=4000, N=5200, K=2048), "256x128x64 w2x4 s4"),
    (dict(M=4000, N=5200, K=1024), "256x128x64 w2x4 s4"),  # K <= 1024: still cooperative
    (dict(M=3072, N=5280, K=2048), None),  # 504 tiles either way: 128x256 on the tie
    (dict(M=64, N=64, K=65536), "128x64x64 w2x4 s6 split 64"),  # 16 k tiles per part
    (dict(M=1, N=4096, K=11008), "32x128x64 w1x4 s4 split 4"),
])
def test_the_runtime_sizes_pick_a_tile_or_split_k_on_sm90a(sizes, label):
    """builder.sized: the wave model's choice where the size-blind 128x256 default leaves SMs
    idle, labelled with its reason; the plan it fills runs it."""
    sm90 = target(ir.Arch.SM90A)
    config = builder.sized(gemm(arch="sm_90a"), sm90, sizes)
    assert (config.label if config else None) == label
    if config is not None:
        assert config.why.startswith("the runtime sizes:")
        plan = lower(gemm(arch="sm_90a"), config=config)
        assert plan.schedule.scheduler.split_k == config.gemms[0].split
        assert all(c.why.startswith("the runtime sizes:") for c in plan.schedule.chosen)


def test_the_narrow_widths_are_timed_by_the_tuner_and_last_in_the_builders_list():
    """128 x 176, 160 and 144 (the wave model's) come after every other cooperative tile: the
    size-blind builder takes them only where nothing before them fits; the tuner times them."""
    sm90 = target(ir.Arch.SM90A)
    kernel = gemm(arch="sm_90a")
    narrow = {(128, 176, 64), (128, 160, 64), (128, 144, 64)}
    wide = builder.listed(kernel, sm90, sizes=dict(M=4096, N=4096, K=4096), wide=True)
    assert narrow <= {c.gemms[0].tile for c, _, _ in wide}
    short = [c.gemms[0] for c, _, _ in builder.listed(kernel, sm90)]
    cooperative = [g.tile for g in short if g.warps == (2, 4)]  # the sm_80 tiles follow
    assert set(cooperative[-3:]) == narrow and cooperative[0] == (128, 256, 64)


def test_the_runtime_sizes_leave_written_lines_and_other_targets_alone():
    sizes = dict(M=128, N=4096, K=4096)
    sm90 = target(ir.Arch.SM90A)
    assert builder.sized(gemm("stages 3", arch="sm_90a"), sm90, sizes) is None
    assert not builder.sizable(gemm("stages 3", arch="sm_90a"), sm90)
    assert builder.sized(gemm(), target(ir.Arch.SM80), sizes) is None
    assert not builder.sizable(gemm(), target(ir.Arch.SM80))
    assert builder.sizable(gemm(arch="sm_90a"), sm90)
    reducing = bare(next(p for p in EXAMPLES if p.stem == "evt_colsum"))
    assert builder.sized(reducing, sm90, dict(M=128, N=4096, K=4096)) is None
    assert not builder.sizable(reducing, sm90)
    # a size left unknown, or a batch count unknown: nothing to choose from
    assert builder.sized(gemm(arch="sm_90a"), sm90, dict(M=128, N=4096)) is None


def _with_c(epilogue: str) -> ir.Kernel:
    """The sm_90a GEMM with no schedule lines, an input C shaped like D, and `epilogue`."""
    module = parse(GEMM.replace("TARGET", "sm_90a").replace("LINES", "").replace(
        "tensor D : f16[M, N] row out", "tensor C : f16[M, N] row\n  tensor D : f16[M, N] row out")
        .replace("D = acc", epilogue), "t.kg")
    verify(module)
    return module.kernels[0]


def test_a_fused_epilogue_at_a_short_k_takes_pingpong():
    """K at most 1024 with an epilogue beyond D = acc: ping-pong 128x128 (its epilogues run
    under the other consumer's mainloop); the bare GEMM stays cooperative."""
    sm90 = target(ir.Arch.SM90A)
    fused = _with_c("D = C + 0.5 * gelu(acc)")
    sizes = dict(M=8192, N=8192, K=1024)
    config = builder.sized(fused, sm90, sizes)
    assert config.label == "pingpong: 128x128x64 w2x4 s4"
    assert lower(fused, config=config).schedule.scheduler.kind is KernelKind.PINGPONG
    assert builder.sized(fused, sm90, dict(sizes, K=2048)) is None
    assert builder.sized(gemm(arch="sm_90a"), sm90, sizes) is None


def test_a_fused_epilogue_leaves_out_the_64x192_tile():
    """64x192's ring leaves no room for the staging: the bare GEMM takes it at 192x6144x4096,
    a fused epilogue that reads C the cooperative 128x128 (configs.SIZED_BARE_ONLY)."""
    sm90 = target(ir.Arch.SM90A)
    fused = _with_c("D = relu(acc + C)")
    sizes = dict(M=192, N=6144, K=4096)
    assert builder.sized(gemm(arch="sm_90a"), sm90, sizes).label == "pingpong: 64x192x64 w2x4 s7"
    assert builder.sized(fused, sm90, sizes).label == "128x128x64 w2x4 s6"
    # a 64-row tile that keeps its staging serves both
    sizes = dict(M=128, N=4096, K=4096)
    assert builder.sized(fused, sm90, sizes).label == "pingpong: 64x64x64 w2x4 s12"
    plan = lower(fused, config=builder.sized(fused, sm90, sizes))
    assert plan.gemms[0].tile == (64, 64, 64) and plan.schedule.gemms[0].staged.param == "C"


@pytest.mark.parametrize("layouts, sizes, label", [
    (("row", "col"), dict(M=5000, N=3000, K=1000), "128x256x64 w2x4 s4 cluster 2x1"),
    (("row", "col"), dict(M=4096, N=4096, K=8200), "128x256x64 w2x4 s4 cluster 2x1"),
    # rows of 32- and 64-byte multiples split lines too
    (("row", "col"), dict(M=5000, N=3000, K=1008), "128x256x64 w2x4 s4 cluster 2x1"),
    (("row", "col"), dict(M=5000, N=3000, K=1056), "128x256x64 w2x4 s4 cluster 2x1"),
    # whole lines, or rows not of 16 bytes (the narrow entry point): the wave model's
    (("row", "col"), dict(M=5000, N=3000, K=1024), "128x192x64 w2x4 s4"),
    (("row", "col"), dict(M=5000, N=3000, K=1004), "128x192x64 w2x4 s4"),
    # a row-major B: its rows are N long; its MN-major boxes shared all the same
    (("row", "row"), dict(M=4096, N=4104, K=4096), "128x256x64 w2x4 s4 cluster 2x1"),
    (("row", "row"), dict(M=4096, N=4112, K=4096), "128x256x64 w2x4 s4 cluster 2x1"),
    (("row", "row"), dict(M=4096, N=4096, K=4104), None),  # only A's rows split
    # a column-major A beside a K-major B: B's rows decide
    (("col", "col"), dict(M=5000, N=3000, K=1000), "128x256x64 w2x4 s4 cluster 2x1"),
    (("col", "col"), dict(M=5000, N=3000, K=1024), "128x192x64 w2x4 s4"),  # only A's split
    # both MN-major: not measured, the wave model's (528 tiles of 256x128: 4 waves)
    (("col", "row"), dict(M=4096, N=4104, K=4096), "256x128x64 w2x4 s4"),
    # fewer 128x256 tiles than SMs: the wave model's 64-row tiles
    (("row", "col"), dict(M=128, N=4096, K=4104), "pingpong: 64x64x64 w2x4 s12"),
    # the wave model's 256x152 (396 tiles: 3.0 waves) keeps its tile: no cluster shares its
    # halves of B (76 rows); beside N = 4600 (31 tiles of 152 wide) the rule's cluster
    (("row", "col"), dict(M=3000, N=5000, K=2000), "256x152x64 w2x4 s4"),
    (("row", "col"), dict(M=3000, N=4600, K=2000), "128x256x64 w2x4 s4 cluster 2x1"),
    # a row-major B takes no tile N that is not a multiple of 64 (its boxes are 64 columns)
    (("row", "row"), dict(M=3000, N=5000, K=2000), "128x256x64 w2x4 s4 cluster 2x1"),
])
def test_rows_that_split_lines_take_a_cluster(layouts, sizes, label):
    """B's rows 16-byte multiples but not whole 128-byte lines (configs.line_split_rows):
    128x256 on a cluster 2x1 that multicasts B, K-major or not, labelled why."""
    module = parse(GEMM.replace("TARGET", "sm_90a").replace("LINES", "")
                   .replace("f16[M, K] row", f"f16[M, K] {layouts[0]}")
                   .replace("f16[K, N] col", f"f16[K, N] {layouts[1]}"), "t.kg")
    verify(module)
    kernel = module.kernels[0]
    config = builder.sized(kernel, target(ir.Arch.SM90A), sizes)
    assert (config.label if config else None) == label
    if config is not None and config.gemms[0].cluster != (1, 1):
        assert "B's rows are not whole 128-byte L2 lines" in config.why
        plan = lower(kernel, config=config)
        assert plan.schedule.scheduler.cluster.shape == config.gemms[0].cluster


@pytest.mark.parametrize("m, n, k, tile, cluster", [
    (5000, 3000, 1000, (128, 256, 64), (2, 1)),  # rows that split sectors
    (6144, 5120, 3072, (256, 192, 64), (1, 1)),  # the wave model's tile
    (4096, 4096, 4096, (128, 256, 64), (1, 1)),  # the size-blind default serves it
])
def test_sizes_the_source_fixes_plan_as_the_runtime_sizes_would(m, n, k, tile, cluster):
    """A kernel whose every size is a number plans, and so compiles, the configuration that
    the runtime sizes would call for (builder.sized with no runtime sizes)."""
    module = parse(GEMM.replace("TARGET", "sm_90a").replace("LINES", "")
                   .replace("f16[M, K]", f"f16[{m}, {k}]").replace("f16[K, N]", f"f16[{k}, {n}]")
                   .replace("f16[M, N]", f"f16[{m}, {n}]"), "t.kg")
    verify(module)
    plan = lower(module.kernels[0])
    assert plan.gemms[0].tile == tile and plan.schedule.scheduler.cluster.shape == cluster


def test_a_column_major_output_takes_no_part_box_tile():
    """Tiles whose N is not a multiple of 64 leave a column-major output as pairs: the wave
    model weighs them only for a row-major one (3000x1936x4096: 264 tiles of 128x176, two
    waves)."""
    sm90 = target(ir.Arch.SM90A)
    sizes = dict(M=3000, N=1936, K=4096)
    for layout, label in (("row", "128x176x64 w2x4 s4"), ("col", "256x192x64 w2x4 s3")):
        module = parse(GEMM.replace("TARGET", "sm_90a").replace("LINES", "")
                       .replace("f16[M, N] row out", f"f16[M, N] {layout} out"), "t.kg")
        verify(module)
        assert builder.sized(module.kernels[0], sm90, sizes).label == label


def test_the_runtime_sizes_count_every_batch():
    """A batched kernel's tiles are L x one batch's: 4096 batches of 64x128 fill 31 waves of
    128x256 tiles (each mostly empty), of 128x128 ones or of 64x128 ones, which the wave model
    prefers; one batch of 128x4096x16384 splits K."""
    batched = parse(GEMM.replace("TARGET", "sm_90a").replace("LINES", "")
                    .replace("f16[M, K]", "f16[L, M, K]").replace("f16[K, N]", "f16[L, K, N]")
                    .replace("f16[M, N]", "f16[L, M, N]"), "t.kg")
    verify(batched)
    sm90 = target(ir.Arch.SM90A)
    kernel = batched.kernels[0]
    assert builder.sized(kernel, sm90, dict(L=4096, M=64, N=128, K=64)).label == \
        "pingpong: 64x128x64 w2x4 s8"  # 64-row tiles: no rows computed past M
    # the same tiles at K = 2048 (a 128-row tile there: the cooperative 128x128)
    assert builder.sized(kernel, sm90, dict(L=4096, M=64, N=128, K=2048)).label == \
        "pingpong: 64x128x64 w2x4 s8"
    assert builder.sized(kernel, sm90, dict(L=1, M=128, N=4096, K=16384)).label == \
        "128x128x64 w2x4 s5 split 4"
    assert builder.sized(kernel, sm90, dict(M=128, N=4096, K=4096)) is None  # L unknown


def _example(name: str) -> ir.Kernel:
    (path,) = [p for p in EXAMPLES if p.name == name]
    return bare(path)


def test_sm90a_takes_pingpong_first_where_the_output_leaves_as_pairs():
    """Two outputs (or an f32 one) leave as pairs from registers, the longest epilogue: ping-pong
    128x128 on 4 stages hides it (kgen/targets/sm90/configs.py, PINGPONG_PAIRS_STAGES)."""
    plan = lower(_example("evt_multi_output.kg"), ir.Arch.SM90A)
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG
    assert plan.gemms[0].tile == (128, 128, 64) and plan.gemms[0].stages == 4
    chosen = {c.line: c.why for c in plan.schedule.chosen}
    assert "the output leaves as pairs from registers" in chosen["schedule"]
    sm90 = target(ir.Arch.SM90A)
    # the runtime sizes keep it: no 128x192 cooperative tile at 6144x5120x3072
    assert builder.sized(_example("evt_multi_output.kg"), sm90,
                         dict(M=6144, N=5120, K=3072)) is None


@pytest.mark.parametrize("name", ["evt_softmax_stats.kg", "gemm_bias_relu.kg",
                                  "gemm_gelu_rowscale.kg", "gemm.kg"])
def test_sm90a_keeps_the_cooperative_tile_for_one_16bit_output_or_reductions(name):
    plan = lower(_example(name), ir.Arch.SM90A)
    assert plan.schedule.scheduler.kind is KernelKind.COOPERATIVE
    assert plan.gemms[0].tile == (128, 256, 64)


def test_an_f32_output_leaves_as_pairs_under_pingpong():
    f32 = gemm(arch="sm_90a")
    f32 = dataclasses.replace(f32, params=tuple(
        dataclasses.replace(p, dtype=ir.DType.F32) if p.name == "D" else p for p in f32.params))
    shape = builder.shapes(f32)[0]
    assert shape.pairs and not builder.shapes(gemm(arch="sm_90a"))[0].pairs
    plan = lower(f32, ir.Arch.SM90A)
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG and plan.gemms[0].stages == 4


def test_why_runtime_sizes_cannot_change_a_schedule():
    """builder.unsized_reason: None where `sized` may fill the lines, else the reason (what
    `kgen compile --size` warns with)."""
    sm90, sm80 = target(ir.Arch.SM90A), target(ir.Arch.SM80)
    free = gemm(arch="sm_90a")
    assert builder.unsized_reason(free, sm90) is None and builder.sizable(free, sm90)
    assert "sm_90a only, not sm_80" in builder.unsized_reason(free, sm80)
    written = gemm("tile 128x128x64 warps 2x4 stages 4", arch="sm_90a")
    assert "writes its schedule lines" in builder.unsized_reason(written, sm90)
    chain = bare(next(p for p in EXAMPLES if p.name == "b2b_gemm_rf_sm90a.kg"))
    assert "not of a chain" in builder.unsized_reason(chain, sm90)
    colsum = bare(next(p for p in EXAMPLES if p.name == "evt_colsum.kg"))
    assert "epilogue reductions" in builder.unsized_reason(colsum, sm90)


def test_a_configuration_refused_beside_written_lines_says_which_it_ran_with():
    """A configuration's label names its own lines; where the source writes some of them, its
    refusal (`not chosen` in kgen inspect) says which written lines it ran with, and a line it
    fills says it was the first that planned beside them."""
    plan = lower(gemm("tile 256x256x64\n    warps 4x4", "sm_90a"), ir.Arch.SM90A)
    label, reason = plan.schedule.untaken[0]
    assert label == "128x256x64 w2x4 s4"  # as kgen tune's entries name a configuration
    assert reason.startswith("beside the written `tile 256x256x64`, `warps 4x4`: shared memory "
                             "over budget")
    (stages,) = plan.schedule.chosen
    assert stages.line == "g stages"
    assert stages.why.endswith("beside the written lines (`tile 256x256x64`, `warps 4x4`)")
    # a written line equal to the configuration's leaves its why alone
    plan = lower(gemm("tile 128x256x64", "sm_90a"), ir.Arch.SM90A)
    assert all("beside" not in c.why for c in plan.schedule.chosen)


@pytest.mark.parametrize("schedule, warps", [(None, (8, 1)), (ir.Schedule.PINGPONG, (4, 1))])
def test_a_filled_warps_line_is_the_warps_the_kernel_runs(schedule, warps):
    """The warp-specialized kernels run a configuration's `warps 2x4` (8 math warps) as 8x1, or
    a ping-pong consumer's 4x1: the filled line says so, and written back plans the same."""
    from kgen.api import build

    same = dict(source_hash="0")  # the headers' hash is the IR's, and the IRs differ
    kernel = dataclasses.replace(gemm("", "sm_90a"), schedule=schedule)
    built = build(kernel, "sm_90a", **same)
    lines = {c.line: c.value for c in built.plan.schedule.chosen}
    assert built.plan.gemms[0].warps == warps
    assert lines["g warps"] == f"{warps[0]}x{warps[1]}"
    written = gemm(f"tile {lines['g tile']}\n    warps {lines['g warps']}\n    "
                   f"stages {lines['g stages']}", "sm_90a")
    assert build(dataclasses.replace(written, schedule=schedule), "sm_90a", **same).source == \
        built.source
    # the mma.sync kernel runs the filled warps as they are (sm_80)
    plan = lower(gemm(""), ir.Arch.SM80)
    assert {c.line: c.value for c in plan.schedule.chosen}["g warps"] == "2x4"
