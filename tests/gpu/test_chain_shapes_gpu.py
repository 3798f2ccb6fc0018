"""On a GPU: chains of shapes that did not plan before (issue 17), with no schedule lines, on
both targets' code, against the reference: a source N of 16 mod 32 (the chained gemm's k
tiles are one k16 step), outputs narrower than 16 columns (B1 stages copied by the first
threads), and ragged M. One streamed-B1 chain with single-step k tiles is written out, since
the builder keeps such a B1 resident."""
from __future__ import annotations

import json

import pytest

from kgen import ir
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, b2b_chain_text, biased_chain_text

pytestmark = pytest.mark.gpu


def check(kernel: ir.Kernel, arch: ir.Arch, m: int):
    from kgen.api import build
    from kgen.harness.run import run

    built = build(kernel, arch, source_name="chain.kg")
    report = run(built.kernel, built.plan, built.source, {"M": m}, check=True)
    assert report.checks, "no output was checked"
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    return built.plan


def chain(k0, n0, n1, dtype):
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("k0, n0, n1, dtype", [
    (576, 48, 128, "f16"),
    (576, 80, 8, "bf16"),
    (32, 48, 8, "f16"),
    (1000, 48, 64, "bf16"),  # K0 not a multiple of the 64-wide k tile
    (576, 16, 8, "f16"),
    (256, 112, 40, "bf16"),
    (576, 144, 100, "f16"),
])
def test_chain_shape_matches_reference(k0, n0, n1, dtype, arch):
    for m in (1, 77, 1000, 4097):
        check(chain(k0, n0, n1, dtype), arch, m)


@pytest.mark.parametrize("n0", [48, 80])
def test_streamed_b1_with_single_step_k_tiles_matches_reference(n0):
    text = b2b_chain_text("f16", 576, n0, 128, target="sm_80",
                          g0=(f"tile 64x{n0}x64 warps 4x1 stages 3",),
                          g1=("tile 64x128x16 warps 4x1 stages 2", "keep g0 in registers"))
    module = parse(text, "chain.kg")
    verify(module)
    for m in (1, 1000, 4097):
        plan = check(module.kernels[0], ir.Arch.SM80, m)
        assert plan.gemms[1].tile[2] == 16


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 192, "f16"), (576, 128, 192, "bf16")])
def test_chain_with_a_192_column_last_tile_matches_reference(k0, n0, n1, dtype):
    """N1 = 192 keeps its tile N (the copy engine's three boxes) instead of a 256-column tile."""
    for m in (1, 1000, 4097):
        plan = check(chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.gemms[-1].tile[1] == 192 and plan.schedule.tma_output is not None


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 384, "f16"), (256, 128, 384, "bf16"),
                                               (576, 64, 512, "f16"), (256, 64, 512, "bf16")])
def test_chain_wider_than_256_in_column_passes_matches_reference(k0, n0, n1, dtype):
    """N1 of 384 and 512 on the ping-pong chain: passes of 128 columns, each staged and stored."""
    for m in (1, 1000, 4097):
        plan = check(chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.schedule.scheduler.pingpong
        assert plan.schedule.gemms[-1].passes.count == n1 // 128


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 96, 256, "f16"), (256, 96, 384, "bf16"),
                                               (256, 32, 384, "f16"), (384, 32, 512, "bf16"),
                                               (512, 96, 128, "f16"), (256, 160, 128, "bf16"),
                                               (256, 32, 64, "f16")])
def test_chain_whose_n0_is_a_multiple_of_32_runs_g1_on_wgmma_and_matches_reference(
        k0, n0, n1, dtype):
    """N0 a multiple of 32 and not of 64: g1's resident B1 in k tiles of 32 (the 64-byte
    swizzle), read by wgmma with A from registers, in column passes where N1 is wide."""
    from kgen.plan import Mma

    for m in (1, 1000, 4097):
        plan = check(chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.schedule.scheduler.pingpong and plan.gemms[1].tile[2] == 32
        assert plan.schedule.gemms[1].atom.instruction is Mma.WGMMA_RS


def biased_chain(k0, n0, n1, dtype):
    """B2B_CHAIN whose last epilogue reads a column vector, bias1[col]."""
    module = parse(biased_chain_text(dtype, k0, n0, n1), "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 96, "f16"), (256, 128, 160, "bf16"),
                                               (256, 64, 224, "bf16"), (576, 32, 96, "f16"),
                                               (256, 64, 320, "f16"), (256, 128, 320, "bf16"),
                                               (576, 64, 448, "bf16")])
def test_chain_whose_tiles_overhang_n_stores_by_tma_and_matches_reference(k0, n0, n1, dtype):
    """N1 not a multiple of 64 (or over 256 and not of 128): whole 64-column boxes (passes of
    128), the tensor map clipping the columns past N, the epilogue skipping them (bias1 has only
    N1 elements)."""
    for m in (1, 1000, 4097):
        plan = check(biased_chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.schedule.tma_output is not None and plan.gemms[-1].tile[1] % 64 == 0
        assert plan.gemms[-1].tile[1] > n1


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 640, "f16"), (256, 128, 448, "bf16"),
                                               (576, 64, 1024, "bf16"), (256, 128, 520, "f16")])
def test_chain_in_column_blocks_matches_reference(k0, n0, n1, dtype):
    """The last B too wide to stay resident as one tile: each CTA keeps one column block of it
    and walks that block's tiles (KernelPlan.column_blocks), the epilogue reading bias1[col] at
    the block's columns; M = 1 launches one CTA per block."""
    for m in (1, 1000, 4097):
        plan = check(biased_chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.schedule.scheduler.pingpong and plan.column_blocks > 1


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 256, 256, "f16"), (384, 224, 192, "bf16"),
                                               (256, 192, 128, "f16"), (576, 160, 160, "bf16"),
                                               (576, 224, 64, "f16"), (1000, 256, 128, "bf16"),
                                               (256, 160, 320, "bf16")])
def test_a_wide_first_tile_in_narrow_passes_matches_reference(k0, n0, n1, dtype):
    """N0 of 160 to 256 (issue 53): g1 in passes of 64 columns, each staged and stored by the
    copy engine, B0 through a short ring where no deeper one fits (or, N1 = 320, one block on a
    short ring instead of two column blocks); ragged M."""
    for m in (1, 77, 1000, 4097):
        plan = check(chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.schedule.scheduler.pingpong and plan.schedule.tma_output is not None


@pytest.mark.parametrize("k0, n0, n1, dtype", [(192, 224, 448, "bf16"), (256, 224, 200, "f16")])
def test_a_wide_first_tile_in_column_blocks_or_overhanging_n_matches_reference(k0, n0, n1,
                                                                              dtype):
    """Narrow passes in two column blocks (N1 = 448, ring of 2), and over a last tile that
    overhangs N (N1 = 200: the last pass's columns past N skipped; bias1 has N1 elements)."""
    for m in (1, 1000, 4097):
        plan = check(biased_chain(k0, n0, n1, dtype), ir.Arch.SM90A, m)
        assert plan.schedule.scheduler.pingpong and plan.schedule.gemms[-1].passes.count > 1


@pytest.mark.parametrize("k0, n0, n1, dtype", [
    (1000, 96, 192, "bf16"), (1000, 128, 320, "f16"), (1000, 160, 64, "bf16"),
    (256, 96, 192, "f16"), (192, 224, 448, "bf16"), (576, 160, 384, "f16")])
def test_paired_tiles_match_reference(k0, n0, n1, dtype):
    """Tiles paired (Pipeline.paired, the plan option with_paired: the consumer warpgroups
    share B0's k tiles) on kgen's choice: B0's rows splitting sectors (K0 = 1000), whole-sector
    rows, a ring of 2 and column blocks; ragged M, with CTAs whose last pair has one tile
    (M = 1: one tile; 20000: 313 tiles over the persistent CTAs)."""
    from kgen.api import build
    from kgen.emit import emit
    from kgen.harness.run import run
    from kgen.targets.sm90.chain_pairs import with_paired

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    plan = with_paired(result.plan, True)
    source = emit(plan, source_name="chain.kg", source_hash="test", command="test")
    for m in (1, 77, 1000, 4097, 20000):
        report = run(result.kernel, plan, source, {"M": m}, check=True)
        assert report.checks and report.ok, json.dumps(report.as_dict()["checks"], indent=1)
