"""On a GPU: any M, N, K on contiguous tensors, on both targets, against the float64 reference.

Sizes that miss the fast entry point's rules (odd N, K or leading dimensions not 16-byte
multiples, a base address off by one element) run the narrow entry point; the others keep the
fast one. Each case checks which one the launcher took. sm_80 code runs on any GPU from sm_80 on;
the sm_90a cases need compute capability 9.0."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from kgen import ir

from tests.kernels import P, T, gemm_kernel

pytestmark = pytest.mark.gpu

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
ARCHS = [ir.Arch.SM80, ir.Arch.SM90A]

# M x N x K: the shapes issue's, then edges of the tiles (64, 128, 256), odd and prime sizes,
# long K, and aligned ones (which must keep the fast entry point)
SHAPES = [
    (1, 1, 1), (1, 1, 16), (1, 4096, 4096), (4097, 129, 72), (1000, 1000, 100),
    (33, 4090, 4090), (7, 13, 9), (2, 8192, 3), (127, 8191, 33), (1, 2, 3), (3, 1, 5),
    (5, 3, 1), (16, 16, 16), (17, 17, 17), (64, 64, 65), (129, 257, 65), (255, 255, 255),
    (256, 1, 256), (1, 256, 256), (300, 7, 1000), (31, 1023, 2), (1024, 24, 999),
    (999, 1001, 7), (4096, 9, 4096), (8, 8191, 8), (65, 129, 193), (200, 300, 11),
    (513, 127, 129), (77, 4000, 31), (2048, 2048, 2047), (2047, 2049, 64), (96, 100, 104),
    (10, 10, 10000), (3, 4091, 5), (4099, 3, 5), (64, 64, 65536), (1, 8, 8), (17, 24, 24),
    (1000, 1000, 1000), (4097, 4104, 72), (128, 256, 64),
]
# a smaller sweep for the epilogues beyond the plain store
SOME = [(1, 1, 1), (4097, 129, 72), (1000, 1000, 100), (7, 13, 9), (2, 8192, 3),
        (127, 8191, 33), (33, 4090, 4090), (129, 257, 65), (1000, 1000, 1000)]


def _ids(shape):
    return "x".join(map(str, shape))


def _needs_hopper(arch):
    torch = pytest.importorskip("torch")
    if arch is ir.Arch.SM90A and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _example(name: str, arch: ir.Arch, **changes) -> ir.Kernel:
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / name).kernels[0]
    return dataclasses.replace(kernel, target=arch, **changes)


def _fast(plan, mnk) -> bool:
    """Whether contiguous tensors of these sizes meet the fast entry point's rules."""
    m, n, k = mnk
    wide_out = any(a.ld_multiple == 8 for a in plan.alignments
                   if plan.param(a.param).role is ir.Role.OUT)
    return k % 8 == 0 and n % 2 == 0 and not (wide_out and n % 8)


def _run(kernel, mnk):
    from kgen.api import build
    from kgen.harness.run import run

    built = build(kernel)
    assert built.plan.narrow_kernel is not None
    report = run(built.kernel, built.plan, built.source, dict(zip("MNK", mnk)), check=True)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return built


@pytest.mark.parametrize("mnk", SHAPES, ids=_ids)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_plain_gemm(arch, mnk):
    _needs_hopper(arch)
    _run(_example("gemm.kg", arch), mnk)


@pytest.mark.parametrize("mnk", SOME, ids=_ids)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("name", ["gemm_bias_relu.kg", "evt_multi_output.kg",
                                  "gemm_gelu_rowscale.kg", "evt_select.kg"])
def test_fused_epilogues(name, arch, mnk):
    _needs_hopper(arch)
    _run(_example(name, arch), mnk)


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
@pytest.mark.parametrize("mnk", [(1, 1, 1), (4097, 129, 72), (7, 13, 9), (1000, 1001, 100)],
                         ids=_ids)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("name", ["evt_colsum.kg", "evt_softmax_stats.kg"])
def test_reductions(name, arch, mnk, deterministic):
    """An odd N's last column reduces nothing past the output."""
    _needs_hopper(arch)
    _run(_example(name, arch, deterministic=deterministic), mnk)


@pytest.mark.parametrize("mnk", [(1, 1, 1), (4097, 129, 72), (7, 13, 9), (1000, 1000, 100)],
                         ids=_ids)
def test_pingpong(mnk):
    _needs_hopper(ir.Arch.SM90A)
    k = gemm_kernel(tile=(128, 128, 64), warps=(2, 4), stages=5, arch=ir.Arch.SM90A)
    _run(dataclasses.replace(k, schedule=ir.Schedule.PINGPONG), mnk)


@pytest.mark.parametrize("mnk", [(1, 1, 1), (4097, 129, 72), (7, 13, 9), (999, 1001, 7)],
                         ids=_ids)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_column_major_input_and_output(arch, mnk):
    """A column-major C read and an f32 column-major E written, beside D: element accesses."""
    acc = ir.Acc()
    extra = (P("C", T, ir.DType.F16, ("M", "N"), ir.Layout.COL),
             P("E", T, ir.DType.F32, ("M", "N"), ir.Layout.COL, ir.Role.OUT))
    stmts = (ir.Store("D", ir.Call(ir.Op.ADD, (acc, ir.TensorLoad("C")))),
             ir.Store("E", ir.Call(ir.Op.MUL, (acc, ir.TensorLoad("C")))))
    _needs_hopper(arch)
    _run(gemm_kernel(stmts, tile=(128, 128, 64), warps=(2, 4), arch=arch, extra=extra), mnk)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_entry_point_choice_and_unaligned_views(arch):
    """Aligned contiguous tensors take the fast entry point; a view one element into a padded
    buffer (its base 2 bytes off, its rows 16 bytes apart) and an odd K take the narrow one,
    and both match torch."""
    _needs_hopper(arch)
    import torch

    import kgen

    k = kgen.load(_example("gemm.kg", arch), arch.value)
    torch.manual_seed(5)
    M, N, K = 1000, 1000, 1000

    def operands(k_extent, offset):
        a = torch.randn(M, k_extent + 8, device="cuda").to(torch.bfloat16)[:, offset:offset + k_extent]
        b = torch.randn(N, k_extent + 8, device="cuda").to(torch.bfloat16)[:, offset:offset + k_extent]
        return a, b.t()

    for k_extent, offset, narrow in ((K, 0, False), (K, 1, True), (K - 1, 0, True)):
        a, b = operands(k_extent, offset)
        d = torch.full((M, N), float("nan"), device="cuda", dtype=torch.bfloat16)
        bound = k.bind(A=a, B=b, D=d)
        assert bool(bound.narrow) is narrow, bound.narrow
        k(A=a, B=b, D=d)
        torch.cuda.synchronize()
        want = a.double() @ b.double()
        err = ((d.double() - want).abs() / (want.abs() + 1)).max().item()
        assert err < 0.02, (k_extent, offset, err)


@pytest.mark.parametrize("mnk", [(64, 64, 65536), (1, 4096, 4096), (17, 129, 1000), (7, 13, 9),
                                 (128, 1000, 4104), (300, 257, 63)], ids=_ids)
@pytest.mark.parametrize("split", [2, 4, 7])
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_split_k(arch, split, mnk):
    """`split S`: the parts of K summed in the workspace, the epilogue run once on the sum."""
    _needs_hopper(arch)
    kernel = _example("splitk_gelu.kg", arch)
    g = dataclasses.replace(kernel.gemms[0], split=ir.SplitK(split))
    built = _run(dataclasses.replace(kernel, gemms=(g,)), mnk)
    assert built.plan.schedule.scheduler.split_k == split


def _cooperative_split(split: int, **changes) -> ir.Kernel:
    """splitk_gelu on sm_90a with a 128-row tile: the cooperative kernel's split-K."""
    kernel = _example("splitk_gelu.kg", ir.Arch.SM90A, **changes)
    g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(128, 128, 64),
                            warps=ir.WarpGrid(2, 4), stages=ir.StageCount(5),
                            split=ir.SplitK(split))
    return dataclasses.replace(kernel, gemms=(g,))


@pytest.mark.parametrize("kernel", ["tiled", "cooperative"])
def test_split_k_is_bit_identical_run_to_run(kernel):
    """The tiled kernel's split-K (the example on sm_80) and the cooperative one's (sm_90a)."""
    import kgen

    if kernel == "tiled":
        k = kgen.load(_example("splitk_gelu.kg", ir.Arch.SM80), "sm_80")
    else:
        _needs_hopper(ir.Arch.SM90A)
        k = kgen.load(_cooperative_split(8), "sm_90a")
    gelu_bit_identical(k, M=96, seed=11, runs=3)


def gelu_bit_identical(k, *, M: int, seed: int, runs: int) -> None:
    """splitk_gelu's kernel `k` (D = gelu(acc + bias)) at M x 1000 x 30000: `runs` more runs
    give the first one's bits, which match float64; K = 0 runs the epilogue once on zeros."""
    import torch

    torch.manual_seed(seed)
    N, K = 1000, 30000
    a = torch.randn(M, K, device="cuda").half() / K ** 0.5
    b = torch.randn(N, K, device="cuda").half().t()
    bias = torch.randn(N, device="cuda")
    first = k(A=a, B=b, bias=bias).clone()
    for _ in range(runs):
        assert torch.equal(k(A=a, B=b, bias=bias), first)
    want = torch.nn.functional.gelu(a.double() @ b.double() + bias.double())
    assert ((first.double() - want).abs() / (want.abs() + 1e-2)).max().item() < 0.02
    # K = 0: every part is empty, and the epilogue still runs once on zeros
    empty = k(A=a[:, :0], B=b[:0, :], bias=bias)
    torch.testing.assert_close(empty.float(), torch.nn.functional.gelu(bias).expand(M, N),
                               atol=2e-3, rtol=2e-3)


@pytest.mark.parametrize("mnk", [(64, 64, 65536), (1, 4096, 4096), (17, 129, 1000), (7, 13, 9),
                                 (128, 1000, 4104), (300, 257, 63), (1000, 1000, 100),
                                 (4097, 129, 72), (256, 512, 8192)], ids=_ids)
@pytest.mark.parametrize("split", [2, 4, 7, 16])
def test_split_k_on_the_cooperative_kernel(split, mnk):
    """`split S` on the warp-specialized kernel: units of the persistent walk, each a part of a
    tile's k tiles by TMA (or the narrow producer) and wgmma; parts with no k tile (K shorter
    than S k tiles) write zeros."""
    from kgen.plan import KernelKind, Mma

    _needs_hopper(ir.Arch.SM90A)
    built = _run(_cooperative_split(split), mnk)
    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert s.scheduler.split_k == split


@pytest.mark.parametrize("mnk", [(1, 1, 1), (4097, 129, 72), (7, 13, 9), (1000, 1000, 1000),
                                 (6144, 5120, 320)], ids=_ids)
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_a_192_column_tile(arch, mnk):
    """Tile N 192 (not a power of two): three 64-column staging boxes on sm_90a, a 64x48 warp
    tile on the sm_80 mainloop."""
    _needs_hopper(arch)
    kernel = gemm_kernel(tile=(128, 192, 64), warps=(2, 4), stages=4 if arch is ir.Arch.SM90A
                         else 3, arch=arch)
    built = _run(kernel, mnk)
    assert built.plan.gemms[0].tile == (128, 192, 64)


def test_kgen_load_runs_what_the_sizes_call_for():
    """A kernel that leaves its schedule lines to kgen, loaded for sm_90a without a tune entry:
    each call's sizes pick the variant (builder.sized), checked against float64."""
    import torch

    import kgen

    _needs_hopper(ir.Arch.SM90A)
    kernel = gemm_kernel(arch=ir.Arch.SM90A)
    g = dataclasses.replace(kernel.gemms[0], tile=None, warps=None, stages=None)
    k = kgen.load(dataclasses.replace(kernel, gemms=(g,)), "sm_90a")
    torch.manual_seed(13)
    for (m, n, kk), tile, split, cluster in [
            ((128, 4096, 4096), (64, 64, 64), 1, (1, 1)),
            ((128, 4096, 8192), (128, 128, 64), 4, (1, 1)),
            ((256, 2048, 16384), (128, 128, 64), 4, (1, 1)),
            ((1, 4096, 4096), (32, 128, 64), 4, (1, 1)),
            ((1000, 1000, 1000), (64, 128, 64), 1, (1, 1)),
            ((64, 4096, 8192), (64, 64, 64), 1, (1, 1)),
            ((330, 2000, 4000), (64, 128, 64), 1, (1, 1)),
            ((6144, 5120, 3072), (256, 192, 64), 1, (1, 1)),
            ((3000, 4600, 2000), (128, 256, 64), 1, (2, 1)),  # B's rows split 128-byte lines
            ((3000, 5000, 2000), (256, 152, 64), 1, (1, 1)),  # 396 tiles: 3 waves, no cluster
            ((1536, 1536, 6144), (128, 144, 64), 1, (1, 1)),  # 132 tiles: one wave
            ((2800, 976, 5184), (128, 176, 64), 1, (1, 1)),
            ((4096, 4096, 4096), (128, 256, 64), 1, (1, 1))]:
        a = torch.randn(m, kk, device="cuda").half()
        b = torch.randn(n, kk, device="cuda").half().t()
        d = k(A=a, B=b)
        torch.cuda.synchronize()
        want = a.double() @ b.double()
        err = ((d.double() - want).abs() / (want.abs() + kk ** 0.5)).max().item()
        assert err < 1e-2, ((m, n, kk), err)
        plan = k.variant({"M": m, "N": n, "K": kk}).plan
        scheduler = plan.schedule.scheduler
        assert (plan.gemms[0].tile, scheduler.split_k, scheduler.cluster.shape) == \
            (tile, split, cluster), (m, n, kk)
