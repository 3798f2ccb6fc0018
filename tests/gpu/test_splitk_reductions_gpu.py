"""On a GPU: split-K with epilogue reductions (issue 16) against the float64 reference.

One kernel (tests.kernels.split_reductions_text) stores G = A @ B and reduces acc over every
axis with a sum and a max (rowsum, rowmax, colsum, colmax, reduce_sum, reduce_max), so each run
checks row, column and whole-tile reductions at once. Shapes: a small M x N with a long K
(64x64x65536), a tile that ends past M with odd N (17x129x1000), and ragged tiles on both
axes (300x257x4104), each with split 2, 4 and 7, in the atomic and the deterministic mode, on
sm_80 and sm_90a code; then other tiles (rows of one warp or of half a warp in <kernel>_splitk),
a batched kernel, and the deterministic mode bit-identical over three runs. The harness draws
fresh random inputs (a seed per case) and poisons every output with NaN first, so an element
left unwritten fails. sm_80 code runs on any GPU from sm_80 on; the sm_90a cases need compute
capability 9.0."""
from __future__ import annotations

import json

import numpy as np
import pytest

from tests.kernels import split_reductions_kernel

pytestmark = pytest.mark.gpu

SHAPES = [(64, 64, 65536), (17, 129, 1000), (300, 257, 4104)]
SPLITS = [2, 4, 7]
MODES = [False, True]


def _ids(value):
    if isinstance(value, tuple):
        return "x".join(map(str, value))
    if isinstance(value, bool):
        return "deterministic" if value else "atomic"
    return str(value)


def _needs(arch: str):
    torch = pytest.importorskip("torch")
    if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    return torch


def _check(sizes: dict[str, int], seed: int, **options):
    """Build the kernel, run it once on random inputs (outputs poisoned) and compare every
    output, the reductions included, with the reference."""
    from kgen.api import build
    from kgen.harness.run import run

    _needs(options.get("arch", "sm_80"))
    built = build(split_reductions_kernel(**options))
    assert built.plan.split_kernel is not None and built.plan.reductions
    report = run(built.kernel, built.plan, built.source, sizes, check=True, seed=seed)
    assert report.checks
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return report


@pytest.mark.parametrize("deterministic", MODES, ids=_ids)
@pytest.mark.parametrize("split", SPLITS, ids=_ids)
@pytest.mark.parametrize("mnk", SHAPES, ids=_ids)
def test_sm80_split_reductions_match_reference(mnk, split, deterministic):
    seed = SHAPES.index(mnk) * 10 + split + (100 if deterministic else 0)
    _check(dict(zip("MNK", mnk)), seed, arch="sm_80", split=split, deterministic=deterministic)


# sm_90a runs the same tiled split kernel: each shape once, with another split per shape
@pytest.mark.parametrize("deterministic", MODES, ids=_ids)
@pytest.mark.parametrize("mnk, split", list(zip(SHAPES, [4, 7, 2])), ids=_ids)
def test_sm90a_split_reductions_match_reference(mnk, split, deterministic):
    seed = 200 + SHAPES.index(mnk) * 10 + split + (100 if deterministic else 0)
    _check(dict(zip("MNK", mnk)), seed, arch="sm_90a", split=split,
           deterministic=deterministic)


# tile rows of one warp (128x64: 32 column pairs) and of half a warp (128x32: 16 pairs, two
# rows per warp) in <kernel>_splitk; 64x128 above has two warps per row
@pytest.mark.parametrize("tile, warps, deterministic", [("128x64x32", "2x2", True),
                                                        ("128x32x32", "4x1", False)],
                         ids=["128x64-deterministic", "128x32-atomic"])
def test_other_tiles(tile, warps, deterministic):
    _check({"M": 300, "N": 257, "K": 4104}, 400 + deterministic, arch="sm_80", split=7,
           deterministic=deterministic, tile=tile, warps=warps)


@pytest.mark.parametrize("deterministic", MODES, ids=_ids)
def test_batched(deterministic):
    """Three batches of 150x129x1000, split 4: the blocks of batch b follow those of batch
    b - 1; rowmax, colsum and a scalar absmax leave an odd count of deterministic slots, so
    the second batch's partials sit right after a rounded-up region."""
    reductions = {"rmax": ("M", "rowmax"), "csum": ("N", "colsum"),
                  "gmax": (None, "reduce_absmax")}
    _check({"L": 3, "M": 150, "N": 129, "K": 1000}, 500 + deterministic, arch="sm_80",
           split=4, deterministic=deterministic, batched=True, reductions=reductions)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_deterministic_mode_is_bit_identical(arch):
    """Three runs of 300x257x4104, split 7, on fresh NaN outputs: every output equal to the
    bit, and the column sums close to float64's."""
    torch = _needs(arch)
    import kgen

    k = kgen.load(split_reductions_kernel(arch=arch, split=7, deterministic=True), arch)
    torch.manual_seed(11)
    M, N, K = 300, 257, 4104
    a = (torch.randn(M, K, device="cuda") / K**0.5).to(torch.bfloat16)
    b = torch.randn(N, K, device="cuda").to(torch.bfloat16).t()  # K x N, column-major
    names = ["G", "rsum", "rmax", "csum", "cmax", "asum", "amax"]
    shapes = {"G": (M, N), "rsum": (M,), "rmax": (M,), "csum": (N,), "cmax": (N,),
              "asum": (), "amax": ()}
    results = []
    for _ in range(3):
        outs = {n: torch.full(shapes[n], float("nan"), device="cuda",
                              dtype=torch.bfloat16 if n == "G" else torch.float32)
                for n in names}
        k(A=a, B=b, **outs)
        torch.cuda.synchronize()
        results.append({n: outs[n].float().cpu().numpy().copy() for n in names})
    for other in results[1:]:
        for n in names:
            assert np.array_equal(results[0][n].view(np.uint32), other[n].view(np.uint32)), n
    ref = a.double() @ b.double()
    assert np.allclose(results[0]["csum"], ref.sum(0).cpu().numpy(), rtol=1e-3, atol=1e-2)
    assert np.allclose(results[0]["rmax"], ref.max(1).values.cpu().numpy(), rtol=1e-4,
                       atol=1e-4)
    assert not np.isnan(results[0]["G"]).any()
