"""sm_90a's ping-pong chain in column blocks (KernelPlan.column_blocks): where the last B does not
fit resident beside the ring as one tile (N1 over 512, or N0 = 128 with N1 of 448 and 512),
each CTA keeps one column block of it, blockIdx.x % tiles_n, and walks only that block's tiles:
tile_n fastest, on a persistent grid that is a multiple of tiles_n. The builder's blocks, the
plan's grid, the emitted walk, loads and launcher, and NVRTC with no spill."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.api import build
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.plan import StorePath
from kgen.targets.sm90 import configs

from tests.kernels import B2B_CHAIN, b2b_chain_text


def chain(k0: int, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    from kgen.verify import verify

    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("n, counts", [(64, (1,)), (256, (1,)), (448, (1, 2)), (512, (1, 2)),
                                       (640, (2, 3)), (1024, (2, 3)), (1100, (3, 4))])
def test_column_block_counts(n, counts):
    assert configs.column_block_counts(n) == counts


@pytest.mark.parametrize("k0, n0, n1, dtype, tile_n, blocks, passes", [
    (256, 64, 640, "f16", 384, 2, 3),     # one tile would be 640 columns: over MAX_PASSES x 128
    (256, 128, 448, "bf16", 256, 2, 2),   # 448 (on 512) fits the passes, but not B1 beside the ring
    (256, 128, 512, "f16", 256, 2, 2),
    (576, 64, 1024, "bf16", 512, 2, 4),
])
def test_the_builder_splits_a_wide_last_n_into_column_blocks(k0, n0, n1, dtype, tile_n, blocks,
                                                             passes):
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    plan, source = result.plan, result.source
    last = plan.schedule.gemms[-1]
    assert plan.schedule.scheduler.pingpong and plan.gemms[-1].tile[1] == tile_n
    assert plan.column_blocks == blocks
    assert last.passes.count == passes and last.output.path is StorePath.TMA
    # each CTA loads its block of B1, walks its block's tiles, and the launcher keeps whole blocks
    assert "(blockIdx.x % tiles_n) * g1_cfg::kTileN, " in source
    assert "  tile_m = tile / tiles_n;\n  tile_n = tile % tiles_n;" in source
    assert "per_block * tiles_n" in source
    resources = compile_cubin(source, plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


def test_a_chain_whose_last_tile_covers_n_keeps_the_grouped_walk():
    result = build(chain(256, 64, 384), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.column_blocks == 1
    assert "tile_n = tile % tiles_n;" not in result.source
    assert "p.B1, p.ld_B1,\n                            0, 384" in result.source


@pytest.mark.parametrize("ctas, grid", [(132, 132), (133, 132), (1, 2), (10**6, 2 * 1281)])
def test_the_persistent_grid_is_a_multiple_of_the_column_blocks(ctas, grid):
    plan = build(chain(256, 64, 640), ir.Arch.SM90A, source_name="chain.kg").plan
    assert plan.grid({"M": 81933}, ctas) == (grid, 1, 1)  # 1281 tile rows, 2 blocks each


def test_off_the_ping_pong_chain_a_resident_b_still_covers_n():
    """The persistent chain walks tiles across column blocks: its resident B must cover N, and
    a tile that does not is refused at its resident line."""
    text = b2b_chain_text("f16", 256, 64, 640, target="sm_80",
                          g0=("tile 64x64x64 warps 4x1 stages 4", "keep B0 resident"),
                          g1=("tile 64x128x64 warps 4x1 stages 3", "keep g0 in registers",
                              "keep B1 resident"))
    with pytest.raises(KgenError, match=r"keep B1 resident needs the CTA tile N of gemm 'g1' "
                                        r"\(128\) to cover all of its N \(640\)"):
        build(parse(text, "chain.kg").kernels[0], None, source_name="chain.kg")
