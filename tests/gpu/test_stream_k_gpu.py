"""On an H100/H200: `split stream` (stream-K on the cooperative wgmma kernel) against the
float64 reference. The shapes put one tile's k tiles over many CTAs (64x64x65536: every CTA a
part of the one tile), parts that begin and end inside tiles, ragged and narrow sizes, K = 0,
a staged C, batches and an MN-major B."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir

from tests.gpu.test_any_shape_gpu import _example, _ids, _needs_hopper, _run, gelu_bit_identical

pytestmark = pytest.mark.gpu

SHAPES = [(64, 64, 65536), (1, 4096, 4096), (128, 4096, 4096), (1536, 1536, 6144),
          (1024, 1024, 1024), (17, 129, 1000), (7, 13, 9), (1, 1, 1), (300, 257, 63),
          (1000, 1000, 100), (4097, 129, 72), (2048, 2048, 2047), (96, 100, 10000)]


def _stream(name: str, tile=(128, 128, 64), stages=5, **changes) -> ir.Kernel:
    kernel = _example(name, ir.Arch.SM90A, **changes)
    g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(*tile), warps=ir.WarpGrid(2, 4),
                            stages=ir.StageCount(stages), split=ir.SplitK(1, stream=True))
    return dataclasses.replace(kernel, gemms=(g,), schedule=None)


def _check(built):
    from kgen.plan import KernelKind, Mma

    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert s.scheduler.stream_k and s.scheduler.split_k == 1


@pytest.mark.parametrize("mnk", SHAPES, ids=_ids)
@pytest.mark.parametrize("name", ["splitk_gelu.kg", "gemm_bias_relu.kg"])
def test_stream_k(name, mnk):
    """gelu(acc + bias) (pair stores or the TMA store) and relu(alpha acc + beta C + bias) (the
    staged C, loaded only by the share that runs the tile's epilogue)."""
    _needs_hopper(ir.Arch.SM90A)
    _check(_run(_stream(name), mnk))


@pytest.mark.parametrize("mnk", [(64, 64, 65536), (1536, 1536, 6144), (300, 600, 5000)],
                         ids=_ids)
def test_stream_k_on_wide_tiles(mnk):
    _needs_hopper(ir.Arch.SM90A)
    _check(_run(_stream("gemm_bias_relu.kg", tile=(128, 256, 64), stages=3), mnk))


@pytest.mark.parametrize("mnk", [(1000, 1000, 3000), (129, 4096, 2048), (7, 13, 9)], ids=_ids)
def test_stream_k_mn_major_b(mnk):
    _needs_hopper(ir.Arch.SM90A)
    _check(_run(_stream("gemm_b_row.kg"), mnk))


def test_stream_k_is_bit_identical_run_to_run():
    """The share that began a tile adds the later parts in order: the same bits every run, and
    the flags are left zero for the next launch (a stale flag would let a sum read a part
    before it is written). K = 0 still runs the epilogue once per tile."""
    import kgen

    _needs_hopper(ir.Arch.SM90A)
    gelu_bit_identical(kgen.load(_stream("splitk_gelu.kg"), "sm_90a"), M=200, seed=12, runs=5)


@pytest.mark.parametrize("batches,mnk", [(3, (100, 200, 3000)), (17, (64, 128, 64)),
                                         (1, (1, 1, 1)), (5, (257, 129, 1000))],
                         ids=lambda v: str(v) if isinstance(v, int) else _ids(v))
def test_stream_k_batched(batches, mnk):
    """The walk's steps run over every batch's tiles: a share may end in one batch and the
    next begin in another."""
    import torch

    import kgen

    _needs_hopper(ir.Arch.SM90A)
    kernel = _stream("batched_gemm_bias.kg")
    k = kgen.load(kernel, "sm_90a")
    torch.manual_seed(13)
    m, n, kk = mnk
    a = torch.randn(batches, m, kk, device="cuda").half()
    b = torch.randn(batches, n, kk, device="cuda").half().transpose(1, 2)
    bias = torch.randn(batches, n, device="cuda")
    got = k(A=a, B=b, bias=bias, alpha=0.5)
    want = 0.5 * (a.double() @ b.double()) + bias.double()[:, None, :]
    scale = want.abs().max().item() + 1.0
    assert (got.double() - want).abs().max().item() < 2e-3 * scale + 0.05


def test_the_cu_launcher_runs_stream_k(tmp_path):
    """The .cu's own launcher, built with nvcc: the grid bounded by the device's resident CTAs,
    the workspace sized by <kernel>_workspace_bytes and zeroed once by the caller. Two launches
    on one workspace both match the reference (the first leaves the flags zero for the second).
    4097x4104x200 on 128x128 tiles: 1089 tiles, 33 past whole waves, so 165 shared by steps
    and the rest data-parallel."""
    import shutil
    import subprocess

    from kgen.api import build

    from tests.gpu.test_cluster_gpu import _LAUNCH_MAIN
    from tests.kernels import gemm_kernel

    _needs_hopper(ir.Arch.SM90A)
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    kernel = gemm_kernel(tile=(128, 128, 64), warps=(2, 4), stages=5, arch=ir.Arch.SM90A,
                         name="k_stream_cu")
    g = dataclasses.replace(kernel.gemms[0], split=ir.SplitK(1, stream=True))
    built = build(dataclasses.replace(kernel, gemms=(g,)))
    assert built.plan.schedule.scheduler.stream_k
    (tmp_path / "k_stream_cu.cu").write_text(built.source)
    launch = "  cudaError_t err = NAME_launch(p, nullptr);\n"
    assert launch in _LAUNCH_MAIN
    main_text = _LAUNCH_MAIN.replace(launch, (
        "  void* ws = nullptr;\n"
        "  const size_t ws_bytes = NAME_workspace_bytes(p);\n"
        "  if (ws_bytes == 0 || cudaMalloc(&ws, ws_bytes) != cudaSuccess) { printf(\"no ws\\n\"); return 1; }\n"
        "  cudaMemset(ws, 0, ws_bytes);  // once: the flags start zero\n"
        "  p.workspace = static_cast<float*>(ws);\n"
        "  cudaError_t err = NAME_launch(p, nullptr);\n"
        "  if (err == cudaSuccess) err = cudaMemset(dd, 0xff, size_t(M) * N * 2);\n"
        "  if (err == cudaSuccess) err = NAME_launch(p, nullptr);  // the flags the first left\n"
    )).replace("NAME", "k_stream_cu")
    main = tmp_path / "main.cu"
    main.write_text(main_text)
    exe = tmp_path / "main"
    r = subprocess.run(["nvcc", "-std=c++17", "-arch=sm_90a", "-o", str(exe), str(main), "-lcuda"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and "ok" in out.stdout, out.stdout + out.stderr
