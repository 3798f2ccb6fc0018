"""`cluster MxN` on the sm_90a warp-specialized GEMM (no GPU): the line in the DSL and the Python
IR, its refusals where it cannot run, the plan (the shared operand's load path and half box),
the emitted kernel (multicast loads, the cluster-wide release, both launchers), NVRTC and nvcc
builds, `kgen inspect`, and the tuner's space and cache."""
from __future__ import annotations

import dataclasses
import shutil
import subprocess
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.plan import Cluster, KernelKind, LoadPath
from kgen.verify import verify

from tests.kernels import gemm_kernel

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SOURCE = """\
kernel k {{
  target {target}
  {schedule}
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor D : bf16[M, N] row out
  gemm g = A @ B {{
    {settings}
    epilogue {{ D = acc }}
  }}
}}
"""


def _source(settings="cluster 2x1", target="sm_90a", schedule=""):
    return SOURCE.format(settings=settings, target=target, schedule=schedule)


def _built(settings="cluster 2x1", schedule=""):
    return build(parse(_source(settings, schedule=schedule), "c.kg").kernels[0])


def _ir(cluster, kind="cooperative", **options):
    schedule, tile, stages = {"cooperative": (None, (128, 256, 64), 3),
                              "pingpong": (ir.Schedule.PINGPONG, (128, 128, 64), 5)}[kind]
    k = gemm_kernel(tile=options.pop("tile", tile), warps=(2, 4), stages=stages,
                    arch=ir.Arch.SM90A, dtype=ir.DType.BF16, **options)
    g = dataclasses.replace(k.gemms[0], cluster=ir.ClusterShape(*cluster))
    return dataclasses.replace(k, gemms=(g,), schedule=schedule)


# ---- the line ---------------------------------------------------------------------------------


def test_the_line_parses_into_the_ir_with_its_location():
    g = parse(_source("tile 128x256x64 cluster 1x2"), "c.kg").kernels[0].gemms[0]
    assert (g.cluster.m, g.cluster.n, g.cluster.size) == (1, 2, 2)
    assert (g.cluster.loc.line, g.cluster.loc.col) == (8, 21)
    assert parse(_source("tile 128x256x64"), "c.kg").kernels[0].gemms[0].cluster is None


def test_the_line_is_given_once():
    with pytest.raises(KgenError, match="cluster given twice"):
        parse(_source("cluster 2x1 cluster 1x2"), "c.kg")


@pytest.mark.parametrize("settings, target, message, col", [
    ("cluster 2x1", "sm_80", "cluster needs target sm_90a", 5),
    ("cluster 3x1", "sm_90a", "cluster 3x1 is not a cluster kgen runs", 5),
    ("cluster 2x2", "sm_90a", "cluster 2x2 is not a cluster kgen runs", 5),
])
def test_refusals_point_at_the_line(settings, target, message, col):
    module = parse(_source(settings, target), "c.kg")
    with pytest.raises(KgenError, match=message) as info:
        verify(module)
    assert (info.value.loc.line, info.value.loc.col) == (8, col)


@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
def test_split_k_on_a_cluster_walks_each_cluster_tiles_parts(cluster):
    """`split S` beside `cluster`: the walk's units are each cluster tile's S parts, so the
    cluster's CTAs take the same part of their own tiles and share one operand's k tiles; both
    launchers count S units per cluster tile."""
    from kgen.runtime.nvrtc import compile_cubin

    module = parse(_source(f"split 2 cluster {cluster[0]}x{cluster[1]}"), "c.kg")
    verify(module)
    built = build(module.kernels[0])
    schedule = built.plan.schedule
    assert (schedule.scheduler.split_k, schedule.scheduler.cluster.shape) == (2, cluster)
    source = built.source
    assert "const int cluster_units = cluster_tiles * kSplitK;" in source
    assert source.count("tile < cluster_units; tile += ") == 2  # the producer and the consumers
    assert source.count("tile_coords(tile / kSplitK, cluster_tiles_m, cluster_tiles_n, ") == 2
    assert "const int split = tile % kSplitK;" in source
    assert "k_kgen::kClusterN) * k_kgen::kSplitK;" in source
    # 4097 rows: 33 tile rows (17 cluster rows of 2); 4104 columns: 17 tile columns (9 of 2)
    tiles = 17 * 17 if cluster == (2, 1) else 33 * 9
    assert built.plan.cluster_grid({"M": 4097, "N": 4104, "K": 4096}) == (tiles * 2 * 2, 1, 1)
    result = compile_cubin(source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_split_k_on_a_batched_cluster_walks_each_batchs_units():
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / "batched_gemm_bias.kg").kernels[0]
    g = dataclasses.replace(kernel.gemms[0], cluster=ir.ClusterShape(2, 1), split=ir.SplitK(2))
    source = build(dataclasses.replace(kernel, gemms=(g,), target=ir.Arch.SM90A)).source
    assert "const int batch = tile / cluster_units;" in source
    assert "tile_coords(tile % cluster_units / kSplitK, cluster_tiles_m, " in source


def test_a_cluster_lowered_for_sm80_is_refused_at_the_line():
    kernel = parse(_source("cluster 1x2"), "c.kg").kernels[0]
    with pytest.raises(KgenError, match="lowered for sm_80") as info:
        build(kernel, "sm_80")
    assert (info.value.loc.line, info.value.loc.col) == (8, 5)


def test_a_chain_is_refused_at_the_line():
    text = (EXAMPLES / "b2b_gemm_rf_sm90a.kg").read_text()
    head, rest = text.split("gemm ", 1)
    first, after = rest.split("{", 1)
    text = f"{head}gemm {first}{{ cluster 2x1{after}"
    with pytest.raises(KgenError, match="cluster applies to a kernel of one gemm") as info:
        verify(parse(text, "c.kg"))
    assert "cluster 2x1" in text.splitlines()[info.value.loc.line - 1]


@pytest.mark.parametrize("tile, warps, reason", [
    ((64, 128, 64), (2, 2), "256-row tile"),  # no warp-specialized kernel: the sm_80 one would run
    ((128, 128, 32), (2, 4), "128-byte k tiles"),
])
def test_a_cluster_the_warp_specialized_kernel_cannot_run_is_refused(tile, warps, reason):
    k = gemm_kernel(tile=tile, warps=warps, stages=3, arch=ir.Arch.SM90A)
    g = dataclasses.replace(k.gemms[0], cluster=ir.ClusterShape(2, 1))
    with pytest.raises(KgenError, match="cluster 2x1 runs on the warp-specialized kernel only, "
                       f"which refuses this gemm: .*{reason}"):
        build(dataclasses.replace(k, gemms=(g,)))
    plain = build(k).plan.schedule  # without the line it plans (on some kernel)
    assert plain.scheduler.cluster.shape == (1, 1)


@pytest.mark.parametrize("cluster, layouts, mn", [
    ((2, 1), {"b_layout": ir.Layout.ROW}, "B"),  # B shared, MN-major
    ((1, 2), {"a_layout": ir.Layout.COL}, "A"),  # A shared, MN-major
    ((2, 1), {"a_layout": ir.Layout.COL}, "A"),  # B shared, K-major; A's boxes stay its own
    ((1, 2), {"b_layout": ir.Layout.ROW}, "B"),  # A shared, K-major; B's boxes stay its own
])
def test_a_cluster_shares_an_mn_major_operand_half_its_boxes_each(cluster, layouts, mn):
    built = build(_ir(cluster, **layouts))
    p = built.plan.schedule.gemms[0].pipeline
    shared_name = "B" if cluster == (2, 1) else "A"
    shared, own = (p.b, p.a) if shared_name == "B" else (p.a, p.b)
    assert shared.load is LoadPath.TMA_MULTICAST and own.load is LoadPath.TMA
    assert shared.mn_major == (shared_name == mn) and own.mn_major == (shared_name != mn)
    extent = "kTileN" if mn == "B" else "kTileM"
    # the narrow entry point's loads of the MN-major operand, or the CTA's own
    assert f"for (int j = 0; j < {extent} / 64; ++j)" in built.source
    mn_map = next(m for m in built.plan.schedule.tensor_maps if m.param == mn and not m.store)
    assert mn_map.box[0] == 64  # 64-column boxes, shared or not
    if shared_name == mn:  # this CTA's half of the 64-column boxes, into both CTAs
        assert (f"for (int j = rank * ({extent} / 128); j < (rank + 1) * ({extent} / 128); ++j)"
                " tma_load_box_multicast(") in built.source
        assert "half of them by each CTA of the cluster, multicast" in mn_map.why
    else:  # the K-major shared operand: half its rows
        assert "+ rank * (kTile" in built.source and "_multicast(" in built.source


@pytest.mark.parametrize("cluster, layouts, tile, kind, refused", [
    ((2, 1), {"b_layout": ir.Layout.ROW}, (128, 64, 64), "cooperative",
     "cluster 2x1 shares B, which is MN-major .*tile N must be a multiple of 128, not 64"),
    ((1, 2), {"a_layout": ir.Layout.COL}, (64, 128, 64), "pingpong",
     "cluster 1x2 shares A, which is MN-major .*tile M must be a multiple of 128, not 64"),
])
def test_a_shared_mn_major_tile_of_an_odd_number_of_boxes_is_refused(cluster, layouts, tile,
                                                                   kind, refused):
    with pytest.raises(KgenError, match=refused):
        build(_ir(cluster, kind=kind, tile=tile, **layouts))


def test_a_staged_c_loads_only_for_a_tile_in_range():
    """A cluster's CTA past M or N runs no epilogue: it must not load C into its staging either
    (nothing would wait on the load, and the next tile's wait would pass on the stale phase)."""
    def kernel(cluster):
        text = _source(f"tile 128x256x64 warps 2x4 stages 3 {cluster}").replace(
            "tensor D", "tensor C : bf16[M, N] row\n  tensor D").replace("D = acc", "D = acc + C")
        return build(parse(text, "c.kg").kernels[0])

    built = kernel("cluster 2x1")
    assert built.plan.schedule.gemms[0].staged.param == "C"
    assert "if (tid % kWarpgroupThreads == 0 && m0 < M && n0 < N) {" in built.source
    plain = kernel("")
    assert "m0 < M && n0 < N" not in plain.source


def test_cluster_1x1_is_any_kernel_and_changes_nothing():
    k = gemm_kernel(tile=(64, 128, 64), warps=(2, 2), stages=3, arch=ir.Arch.SM90A)
    g = dataclasses.replace(k.gemms[0], cluster=ir.ClusterShape(1, 1))
    same = dict(source_hash="0")  # the headers' hash is the IR's, and the IRs differ
    assert build(dataclasses.replace(k, gemms=(g,)), **same).source == build(k, **same).source
    ws = _ir((1, 1))
    plain = dataclasses.replace(ws, gemms=(dataclasses.replace(ws.gemms[0], cluster=None),))
    assert build(ws, **same).source == build(plain, **same).source


# ---- the plan ---------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["cooperative", "pingpong"])
@pytest.mark.parametrize("cluster, shared, boxes", [
    ((2, 1), "b", {"cooperative": [(64, 128), (64, 128)], "pingpong": [(64, 128), (64, 64)]}),
    ((1, 2), "a", {"cooperative": [(64, 64), (64, 256)], "pingpong": [(64, 64), (64, 128)]}),
])
def test_the_plan_multicasts_the_shared_operand_in_half_boxes(cluster, shared, boxes, kind):
    s = build(_ir(cluster, kind)).plan.schedule
    assert s.scheduler.kind is KernelKind(kind)
    assert s.scheduler.cluster.shape == cluster and s.scheduler.cluster.size == 2
    assert s.multicast == shared
    p = s.gemms[0].pipeline
    other = "a" if shared == "b" else "b"
    assert getattr(p, shared).load is LoadPath.TMA_MULTICAST
    assert getattr(p, other).load is LoadPath.TMA
    assert s.tma_loads
    assert [m.box for m in s.tensor_maps if not m.store] == boxes[kind]


def test_the_builder_keeps_1x1():
    s = build(parse(_source(""), "c.kg").kernels[0]).plan.schedule
    assert s.scheduler.cluster == Cluster() and s.multicast is None
    assert not any(c.line.endswith("cluster") for c in s.chosen)


def test_inspect_shows_the_cluster_and_the_multicast_operand():
    rows = {label: (value, why) for label, value, why in _built().plan.schedule.describe()}
    value, why = rows["cluster"]
    assert value == "2x1" and "share B" in why
    assert rows["g B"][0] == "TMA multicast" and "both CTAs released" in rows["g B"][1]
    assert rows["g A"][0] == "TMA ring, K-major"
    assert "multicast" in rows["tensor map B"][1]


def test_the_cluster_grid():
    plan = build(_ir((2, 1))).plan
    # 4097 rows: 33 tile rows, 17 cluster rows; 4104 columns: 17 tile columns
    assert plan.cluster_grid({"M": 4097, "N": 4104, "K": 64}) == (17 * 17 * 2, 1, 1)
    assert plan.cluster_grid({"M": 4097, "N": 4104, "K": 64}, 66) == (132, 1, 1)
    plan = build(_ir((1, 2))).plan
    assert plan.cluster_grid({"M": 1, "N": 257, "K": 64}) == (2, 1, 1)


# ---- the emitted kernel -----------------------------------------------------------------------


@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
def test_the_kernel_multicasts_and_releases_slots_across_the_cluster(cluster):
    source = build(_ir(cluster)).source
    shared = "B" if cluster == (2, 1) else "A"
    assert f"tma_load_box_multicast({shared.lower()}_ring + rank * (k{shared}StageBytes / 2)" in source
    assert "mbarrier_init(empty + 8 * s, (kPingpong ? 1 : 2) * kCtasM * kCtasN);" in source
    assert "release_slot<kNarrow>(empty" in source and "mapa.shared::cluster" in source
    # lane 0 of warp r of each consumer warpgroup releases the slot in CTA r
    assert ("const bool releaser = kNarrow ? tid % kWarpgroupThreads == 0 : lane == 0 && "
            "warp < kClusterM * kClusterN;") in source
    assert "if (kt > 0 && releaser) release_slot<kNarrow>(empty" in source
    assert "mbarrier_arrive_cluster(cluster_address(bar, threadIdx.x / 32 % 4));" in source
    # the cluster waits once, for the barriers' init; at the end, the producer waits for every
    # slot's last release (the peers' arrivals on this CTA's barriers) instead
    start = source.index("void kernel_body(")
    body = source[start:source.index("}  // namespace", start)]
    assert body.count("cluster_sync();") == 1
    # (the narrow entry point, launched without clusters, has no peers to wait for)
    tail = ("if constexpr (!kNarrow) {\n"
            "        for (int i = 0; i < kStages; ++i, ++it) {\n"
            "          const int s = it % kStages, round = it / kStages;\n"
            "          if (round > 0) mbarrier_wait(empty + 8 * s, (round - 1) & 1);\n"
            "        }\n      }\n")
    assert tail in body and body.index(tail) < body.index("setmaxnreg_inc")
    assert "fence.mbarrier_init.release.cluster" in source
    assert "if (tile_m < tiles_m && tile_n < tiles_n) {" in source
    assert "cudaLaunchAttributeClusterDimension" in source
    assert "cudaOccupancyMaxActiveClusters" in source and "cudaLaunchKernelEx" in source


def test_a_batched_kernel_multicasts_rank_3_boxes():
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / "batched_gemm_bias.kg").kernels[0]
    g = dataclasses.replace(kernel.gemms[0], cluster=ir.ClusterShape(2, 1))
    built = build(dataclasses.replace(kernel, gemms=(g,), target=ir.Arch.SM90A))
    assert "tma_load_box_3d_multicast(" in built.source
    assert "const int batch = tile / cluster_tiles;" in built.source


@pytest.mark.slow
@pytest.mark.parametrize("cluster", [(2, 1), (1, 2)])
@pytest.mark.parametrize("kind", ["cooperative", "pingpong"])
def test_nvrtc_compiles_without_spills(cluster, kind):
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    built = build(_ir(cluster, kind))
    ptx = compile_ptx(built.source, built.plan.name, "sm_90a")
    assert "multicast::cluster" in ptx and "mapa.shared::cluster" in ptx
    assert "barrier.cluster.arrive" in ptx
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc on PATH")
def test_plain_nvcc_builds_a_cluster_kernel_without_warnings(tmp_path):
    built = build(_ir((2, 1)))
    cu = tmp_path / "k.cu"
    cu.write_text(built.source)
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-Xcompiler", "-Wall,-Wextra", "-c",
                        str(cu), "-o", str(tmp_path / "k.o")], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "warning" not in (r.stdout + r.stderr).lower(), r.stdout + r.stderr


# ---- the tuner --------------------------------------------------------------------------------


def test_the_tuners_space_has_both_clusters_and_the_builders_list_none():
    from kgen.lower import builder
    from kgen.targets import target

    kernel = parse(_source(""), "c.kg").kernels[0]
    wide = builder.listed(kernel, target(ir.Arch.SM90A), sizes={"M": 4096, "N": 4096, "K": 4096},
                          wide=True)
    clusters = {c.gemms[0].cluster for c, _, _ in wide}
    assert {(1, 1), (2, 1), (1, 2)} <= clusters
    filled = [k for c, k, _ in wide if c.gemms[0].cluster == (1, 2)]
    assert filled and all(k.gemms[0].cluster == ir.ClusterShape(1, 2, k.gemms[0].loc)
                          for k in filled)
    short = builder.listed(kernel, target(ir.Arch.SM90A))
    assert {c.gemms[0].cluster for c, _, _ in short} == {(1, 1)}


def test_the_tune_cache_keeps_the_cluster():
    from kgen.targets import Config, GemmConfig
    from kgen.tune.codec import config_from_json, config_to_json

    config = Config((GemmConfig((128, 256, 64), (2, 4), 3, cluster=(1, 2)),), why="w")
    data = config_to_json(config)
    assert data["gemms"][0]["cluster"] == [1, 2]
    assert config_from_json(data) == config
    del data["gemms"][0]["cluster"]  # an older cache entry: no cluster
    assert config_from_json(data).gemms[0].cluster == (1, 1)
    data["gemms"][0]["cluster"] = [3, 1]
    with pytest.raises(ValueError, match="cluster must be one of"):
        config_from_json(data)


def test_tune_write_puts_the_cluster_on_the_first_line():
    from kgen.tune.write import setting_text

    assert setting_text("cluster", "2x1") == "cluster 2x1"


def test_a_shared_mn_major_tile_of_one_box_is_refused_at_the_cluster_line():
    text = _source("tile 128x64x64  cluster 2x1").replace("bf16[K, N] col", "bf16[K, N] row")
    with pytest.raises(KgenError, match="shares B, which is MN-major.*not 64") as info:
        build(parse(text, "c.kg").kernels[0])
    line = text.splitlines()[info.value.loc.line - 1]
    assert line[info.value.loc.col - 1:].startswith("cluster 2x1")
