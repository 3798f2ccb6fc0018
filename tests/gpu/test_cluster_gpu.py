"""On an H100/H200: the warp-specialized sm_90a GEMM on thread-block clusters (`cluster 2x1`:
B multicast, `cluster 1x2`: A multicast), cooperative and ping-pong, f16 and bf16, at ragged
sizes, against the reference with the outputs poisoned (kgen/harness/run.py).

Sizes put an odd number of tile rows (M 17, 4097: 1 and 33 tiles of 128) and tile columns (N
4104: 17 tiles of 256, 33 of 128) under a cluster, whose other CTA then walks a tile past M or
N; N or K that miss the copy engine's 16-byte rules (N 17, 4097) run the narrow entry point,
launched without clusters (its producer loads both halves of the shared operand itself). Also:
an epilogue with C and bias, reductions (cooperative, both modes), a batched GEMM (rank-3 boxes
multicast), a shared MN-major operand (each CTA multicasts half of its 64-column boxes), and
kgen's .cu launcher (cudaLaunchKernelEx) on the same kernels."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kgen import ir

from tests.kernels import P, T, V, S, gemm_kernel

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
SM90A = ir.Arch.SM90A
KINDS = {  # (schedule, tile, warps, stages): the defaults of each
    "cooperative": (None, (128, 256, 64), (2, 4), 3),
    "cooperative_256": (None, (256, 128, 64), (2, 4), 4),  # two m64 halves per consumer
    "pingpong": (ir.Schedule.PINGPONG, (128, 128, 64), (2, 4), 5),
    "pingpong64": (ir.Schedule.PINGPONG, (64, 256, 64), (2, 4), 4),  # 64-row tiles
}
CLUSTERS = {"2x1": (2, 1), "1x2": (1, 2)}
SIZES = [(1, 8, 8), (17, 24, 1000), (1000, 1000, 4104), (4097, 4104, 1000), (4097, 1000, 8),
         (1000, 4104, 8), (17, 17, 8), (4097, 4097, 1000), (1000, 17, 4104)]


@pytest.fixture(autouse=True)
def _hopper():
    torch = pytest.importorskip("torch")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _with_cluster(kernel: ir.Kernel, cluster: str) -> ir.Kernel:
    g = dataclasses.replace(kernel.gemms[0], cluster=ir.ClusterShape(*CLUSTERS[cluster]))
    return dataclasses.replace(kernel, gemms=(g, *kernel.gemms[1:]))


def _kernel(kind: str, cluster: str, stmts=None, *, dtype=ir.DType.F16, extra=(), name="k"):
    schedule, tile, warps, stages = KINDS[kind]
    k = gemm_kernel(stmts, dtype=dtype, tile=tile, warps=warps, stages=stages, arch=SM90A,
                    extra=extra, name=name)
    return _with_cluster(dataclasses.replace(k, schedule=schedule), cluster)


def _run(kernel, sizes, kind=None):
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.plan import KernelKind, LoadPath

    built = build(kernel)
    s = built.plan.schedule
    shared = {(2, 1): "b", (1, 2): "a"}[s.scheduler.cluster.shape]
    assert s.multicast == shared
    assert getattr(s.gemms[0].pipeline, shared).load is LoadPath.TMA_MULTICAST
    if kind is not None:
        assert s.scheduler.kind is KernelKind(kind.removesuffix("64").split("_")[0])
    report = run(built.kernel, built.plan, built.source, sizes, check=True)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return built


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cluster", list(CLUSTERS))
@pytest.mark.parametrize("dtype", [ir.DType.F16, ir.DType.BF16], ids=["f16", "bf16"])
def test_gemm_at_ragged_sizes(dtype, cluster, kind, mnk):
    _run(_kernel(kind, cluster, dtype=dtype), dict(zip("MNK", mnk)), kind)


@pytest.mark.parametrize("mnk", [(1000, 1000, 4104), (4097, 4104, 1000), (17, 264, 72)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cluster, layouts", [
    ("2x1", {"a_layout": ir.Layout.COL}),  # B shared, A MN-major (its own boxes)
    ("1x2", {"b_layout": ir.Layout.ROW}),  # A shared, B MN-major
], ids=["2x1-A-col", "1x2-B-row"])
def test_an_mn_major_operand_of_its_own(cluster, layouts, kind, mnk):
    schedule, tile, warps, stages = KINDS[kind]
    k = gemm_kernel(dtype=ir.DType.BF16, tile=tile, warps=warps, stages=stages, arch=SM90A,
                    **layouts)
    _run(_with_cluster(dataclasses.replace(k, schedule=schedule), cluster), dict(zip("MNK", mnk)),
         kind)


@pytest.mark.parametrize("mnk", [(1000, 1000, 4104), (4097, 4104, 1000), (2199, 4008, 1000),
                                 (17, 264, 72), (4097, 1000, 17)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cluster, layouts", [
    ("2x1", {"b_layout": ir.Layout.ROW}),  # B shared, MN-major: half its 64-column boxes each
    ("1x2", {"a_layout": ir.Layout.COL}),  # A shared, MN-major
    ("2x1", {"a_layout": ir.Layout.COL, "b_layout": ir.Layout.ROW}),
], ids=["2x1-B-row", "1x2-A-col", "2x1-both-mn"])
def test_a_shared_mn_major_operand(cluster, layouts, kind, mnk):
    schedule, tile, warps, stages = KINDS[kind]
    if cluster == "1x2" and tile[0] % 128:
        pytest.skip("a shared MN-major A needs tile M a multiple of 128 (refused at plan time)")
    k = gemm_kernel(dtype=ir.DType.F16, tile=tile, warps=warps, stages=stages, arch=SM90A,
                    **layouts)
    built = _run(_with_cluster(dataclasses.replace(k, schedule=schedule), cluster),
                 dict(zip("MNK", mnk)), kind)
    pipeline = built.plan.schedule.gemms[0].pipeline
    shared = pipeline.b if cluster == "2x1" else pipeline.a
    assert shared.mn_major


EXTRA = (P("C", T, ir.DType.F16, ("M", "N")), P("bias", V, ir.DType.F32, ("N",)),
         P("alpha", S, ir.DType.F32, default=0.75))


def _call(op, *args):
    return ir.Call(op, tuple(args))


@pytest.mark.parametrize("mnk", [(4097, 1000, 1000), (1000, 4104, 72), (17, 17, 24)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cluster", list(CLUSTERS))
def test_epilogue_with_c_and_bias(cluster, kind, mnk):
    """D = alpha * acc + C + bias[col]: the epilogue reads row- and column-indexed inputs."""
    value = _call(ir.Op.ADD, _call(ir.Op.ADD, _call(ir.Op.MUL, ir.ScalarLoad("alpha"), ir.Acc()),
                                   ir.TensorLoad("C")), ir.VectorLoad("bias", ir.Axis.COL))
    _run(_kernel(kind, cluster, (ir.Store("D", value),), extra=EXTRA, name="k_c_bias"),
         dict(zip("MNK", mnk)), kind)


def _example(name: str, cluster: str, **changes) -> ir.Kernel:
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / name).kernels[0]
    return _with_cluster(dataclasses.replace(kernel, target=SM90A, **changes), cluster)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mnk", [(17, 24, 8), (4097, 1030, 264), (1000, 4104, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name", ["evt_softmax_stats.kg", "evt_colsum.kg"])
@pytest.mark.parametrize("cluster", list(CLUSTERS))
def test_reductions(cluster, name, mnk, deterministic):
    """Reductions (cooperative): a tile past M or N adds nothing, in either mode."""
    _run(_example(name, cluster, deterministic=deterministic), dict(zip("MNK", mnk)),
         "cooperative")


def _split(kernel: ir.Kernel, split: int, tile=(128, 128, 64), stages=5) -> ir.Kernel:
    g = dataclasses.replace(kernel.gemms[0], split=ir.SplitK(split), tile=ir.TileShape(*tile),
                            warps=ir.WarpGrid(2, 4), stages=ir.StageCount(stages))
    return dataclasses.replace(kernel, gemms=(g,))


@pytest.mark.parametrize("mnk", [(256, 2048, 16384), (4097, 1000, 4104), (17, 264, 1000),
                                 (1000, 4104, 8), (1000, 1000, 4097)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("split", [2, 4])
@pytest.mark.parametrize("cluster", list(CLUSTERS))
def test_split_k_walks_each_cluster_tiles_parts(cluster, split, mnk):
    """`split S` on a cluster: the cluster's CTAs take the same part of their own tiles (a tile
    past M or N loads zeros for its peer and stores no partial); K 4097 runs the narrow entry
    point without clusters; then the parts' sum and the epilogue."""
    value = _call(ir.Op.ADD, _call(ir.Op.ADD, _call(ir.Op.MUL, ir.ScalarLoad("alpha"), ir.Acc()),
                                   ir.TensorLoad("C")), ir.VectorLoad("bias", ir.Axis.COL))
    kernel = _kernel("cooperative", cluster, (ir.Store("D", value),), extra=EXTRA,
                     name="k_split")
    _run(_split(kernel, split), dict(zip("MNK", mnk)), "cooperative")


@pytest.mark.parametrize("mnk", [(1000, 1000, 4104), (17, 4104, 1000)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("batches", [1, 3])
def test_split_k_on_a_batched_cluster(batches, mnk):
    m, n, k = mnk
    kernel = _split(_example("batched_gemm_bias.kg", "2x1"), 2)
    _run(kernel, {"L": batches, "M": m, "N": n, "K": k}, "cooperative")


@pytest.mark.parametrize("mnk", [(1000, 1000, 1000), (4097, 4104, 72), (17, 4104, 8)],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("batches", [1, 3])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cluster", list(CLUSTERS))
def test_batched(cluster, kind, batches, mnk):
    """The batched walk over cluster tiles, rank-3 boxes multicast."""
    m, n, k = mnk
    schedule = KINDS[kind][0]
    kernel = _example("batched_gemm_bias.kg", cluster, schedule=schedule)
    if kind != "cooperative":  # the example's own lines
        _, tile, warps, stages = KINDS[kind]
        g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile),
                                warps=ir.WarpGrid(*warps), stages=ir.StageCount(stages))
        kernel = dataclasses.replace(kernel, gemms=(g,))
    _run(kernel, {"L": batches, "M": m, "N": n, "K": k}, kind)


@pytest.mark.parametrize("mnk", [(1000, 4104, 1000), (257, 520, 72)],
                         ids=lambda s: "x".join(map(str, s)))
def test_batched_with_a_row_major_b_shared(mnk):
    """Rank-3 boxes of an MN-major B, half of each k tile's by each CTA, multicast."""
    m, n, k = mnk
    kernel = _example("batched_gemm_bias.kg", "2x1")
    b = next(p for p in kernel.params if p.name == "B")
    kernel = dataclasses.replace(kernel, params=tuple(
        dataclasses.replace(p, layout=ir.Layout.ROW) if p is b else p for p in kernel.params))
    built = _run(kernel, {"L": 3, "M": m, "N": n, "K": k}, "cooperative")
    assert built.plan.schedule.gemms[0].pipeline.b.mn_major


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("cluster", list(CLUSTERS))
def test_the_python_runtime_launches_clusters(cluster, kind):
    """kgen.load: the fast entry point's grid is whole clusters, at most one per cluster tile
    and no more than fit at once; the narrow one's is plain."""
    import torch

    import kgen

    k = kgen.load(_kernel(kind, cluster, name=f"k_grid_{cluster}_{kind}"), "sm_90a")
    assert k.persistent_clusters and k.persistent_clusters >= 1
    cm, cn = CLUSTERS[cluster]
    tile_m, tile_n = KINDS[kind][1][:2]
    for m, n in [(4097, 4104), (17, 24), (129, 8)]:
        a = torch.randn(m, 64, device="cuda", dtype=torch.float16)
        b = torch.randn(n, 64, device="cuda", dtype=torch.float16).t()
        d = torch.empty(m, n, device="cuda", dtype=torch.float16)
        bound = k.bind(A=a, B=b, D=d)
        assert not bound.narrow
        clusters = -(-(-(-m // tile_m)) // cm) * -(-(-(-n // tile_n)) // cn)
        assert bound.grid == (min(clusters, k.persistent_clusters) * cm * cn, 1, 1)
        k(A=a, B=b, D=d)
        torch.cuda.synchronize()
        ref = (a.float() @ b.float())
        assert torch.allclose(d.float(), ref, atol=0.1, rtol=0.02)


def test_the_cu_launcher_runs_clusters(tmp_path):
    """The .cu's own launcher (cudaLaunchKernelEx with the cluster attribute, the grid bounded
    by cudaOccupancyMaxActiveClusters), built with nvcc, on a ragged size, both clusters."""
    import shutil
    import subprocess

    from kgen.api import build

    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    for cluster in CLUSTERS:
        built = build(_kernel("cooperative", cluster, name=f"k_cu_{cluster.replace('x', '_')}"))
        name = built.plan.name
        (tmp_path / f"{name}.cu").write_text(built.source)
        main = tmp_path / f"main_{name}.cu"
        main.write_text(_LAUNCH_MAIN.replace("NAME", name))
        exe = tmp_path / f"main_{name}"
        r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-o", str(exe), str(main),
                            "-lcuda"],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr


_LAUNCH_MAIN = r"""
#include <cstdio>
#include <cmath>
#include <vector>
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include "NAME.cu"
int main() {
  const int M = 4097, N = 4104, K = 200;
  std::vector<__half> a(size_t(M) * K), b(size_t(N) * K);
  for (size_t i = 0; i < a.size(); ++i) a[i] = __float2half(float(int(i * 7 % 13) - 6) / 8);
  for (size_t i = 0; i < b.size(); ++i) b[i] = __float2half(float(int(i * 5 % 11) - 5) / 8);
  __half *da, *db, *dd;
  cudaMalloc(&da, a.size() * 2); cudaMalloc(&db, b.size() * 2); cudaMalloc(&dd, size_t(M) * N * 2);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dd, 0xff, size_t(M) * N * 2);  // NaN
  NAME_params p{};
  p.A = da; p.B = db; p.D = dd; p.M = M; p.N = N; p.K = K; p.ld_A = K; p.ld_B = K; p.ld_D = N;
  cudaError_t err = NAME_launch(p, nullptr);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) { printf("error %s\n", cudaGetErrorString(err)); return 1; }
  std::vector<__half> d(size_t(M) * N);
  cudaMemcpy(d.data(), dd, d.size() * 2, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int r = 0; r < M; r += (r < 8 || r > M - 140 ? 1 : 61))
    for (int c = 0; c < N; ++c) {
      float want = 0;
      for (int k = 0; k < K; ++k) want += __half2float(a[size_t(r) * K + k]) * __half2float(b[size_t(c) * K + k]);
      const float got = __half2float(d[size_t(r) * N + c]);
      if (!(fabsf(got - want) <= 0.05f + 0.01f * fabsf(want))) ++bad;
    }
  printf(bad ? "bad %d\n" : "ok\n", bad);
  return bad != 0;
}
"""
