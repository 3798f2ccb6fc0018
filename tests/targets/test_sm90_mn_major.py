"""MN-major operands (a column-major A, a row-major B) on the sm_90a warp-specialized gemm, on
the CPU: each of the four layout combinations plans the cooperative and the ping-pong kernel,
its maps and loads follow the operand's major-ness (boxes of 64 M or N columns by the k tile),
wgmma reads an MN-major operand transposed through its own descriptor, the narrow producer
writes the same stage layout, and NVRTC compiles each with no spill."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build, build_file
from kgen.errors import KgenError
from kgen.plan import KernelKind, LoadPath, Mma

from tests.kernels import gemm_kernel

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
ROW, COL = ir.Layout.ROW, ir.Layout.COL
LAYOUTS = {"a_row_b_col": (ROW, COL), "a_col_b_col": (COL, COL), "a_row_b_row": (ROW, ROW),
           "a_col_b_row": (COL, ROW)}
KINDS = {"cooperative": (None, (128, 256, 64), 3),
         "pingpong": (ir.Schedule.PINGPONG, (128, 128, 64), 5)}


def _kernel(layouts, kind, dtype=ir.DType.F16):
    schedule, tile, stages = KINDS[kind]
    a, b = LAYOUTS[layouts]
    k = gemm_kernel(dtype=dtype, a_layout=a, b_layout=b, tile=tile, warps=(2, 4), stages=stages,
                    arch=ir.Arch.SM90A)
    return dataclasses.replace(k, schedule=schedule)


@pytest.mark.parametrize("dtype", [ir.DType.F16, ir.DType.BF16], ids=["f16", "bf16"])
@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("layouts", list(LAYOUTS))
def test_every_layout_plans_the_warp_specialized_kernel(layouts, kind, dtype):
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    built = build(_kernel(layouts, kind, dtype))
    s = built.plan.schedule
    a_mn, b_mn = (LAYOUTS[layouts][0] is COL, LAYOUTS[layouts][1] is ROW)
    assert s.scheduler.kind is KernelKind(kind)
    g = s.gemms[0]
    p = g.pipeline
    assert g.atom.instruction is Mma.WGMMA_SS and p.a.load is p.b.load is LoadPath.TMA
    assert (p.a.mn_major, p.b.mn_major) == (a_mn, b_mn)
    for op, mn in ((p.a, a_mn), (p.b, b_mn)):
        assert op.why.startswith("MN-major" if mn else "K-major"), op.why
    tile_n = built.plan.gemms[0].tile[1]
    maps = {m.param: m for m in s.tensor_maps if not m.store}
    # K-major: rows along M (N), one box of the tile's rows x 64; MN-major: rows along K, 64 x 64
    assert (maps["A"].rows, maps["A"].cols, maps["A"].box) == (
        ("K", "M", (64, 64)) if a_mn else ("M", "K", (64, 128)))
    assert (maps["B"].rows, maps["B"].cols, maps["B"].box) == (
        ("K", "N", (64, 64)) if b_mn else ("N", "K", (64, tile_n)))
    source = built.source
    assert f"accumulate, 1, 1, {int(a_mn)}, {int(b_mn)};" in source
    assert ("smem_descriptor_mn(" in source) is (a_mn or b_mn)
    assert ("copy_boxes_narrow_mn<kTileM>" in source) is a_mn
    assert ("copy_boxes_narrow_mn<kTileN>" in source) is b_mn
    if b_mn:
        assert "for (int j = 0; j < kTileN / 64; ++j) tma_load_box(b_ring" in source
    ptx = compile_ptx(source, built.plan.name, "sm_90a")
    for instruction in ("wgmma.mma_async", "cp.async.bulk.tensor", "mbarrier", "setmaxnreg"):
        assert instruction in ptx, instruction
    result = compile_cubin(source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_the_k_major_kernel_is_unchanged_by_the_mn_major_helpers():
    source = build(_kernel("a_row_b_col", "cooperative")).source
    for text in ("kMnBoxBytes", "smem_descriptor_mn", "copy_boxes_narrow_mn", "j * kMnBoxBytes"):
        assert text not in source, text
    assert "accumulate, 1, 1, 0, 0;" in source


@pytest.mark.parametrize("layouts", list(LAYOUTS))
def test_the_builder_gives_every_layout_the_warp_specialized_kernel(layouts):
    """No schedule lines: sm_90a's configurations put the cooperative kernel first for every
    layout, MN-major operands included."""
    a, b = LAYOUTS[layouts]
    k = gemm_kernel(a_layout=a, b_layout=b, arch=ir.Arch.SM90A)
    gemms = tuple(dataclasses.replace(g, tile=None, warps=None, stages=None) for g in k.gemms)
    plan = build(dataclasses.replace(k, gemms=gemms)).plan
    assert plan.schedule.scheduler.kind is KernelKind.COOPERATIVE
    assert plan.schedule.gemms[0].atom.instruction is Mma.WGMMA_SS


def test_the_tuner_searches_both_warp_specialized_kinds_for_mn_major_operands():
    from kgen.tune.space import search_space

    k = gemm_kernel(a_layout=COL, b_layout=ROW, arch=ir.Arch.SM90A)
    space = search_space(k, ir.Arch.SM90A, dict(M=4096, N=4096, K=4096), all_lines=True)
    kinds = {c.plan.schedule.scheduler.kind for c in space.candidates}
    assert {KernelKind.COOPERATIVE, KernelKind.PINGPONG} <= kinds
    for c in space.candidates:
        if c.plan.schedule.scheduler.kind in (KernelKind.COOPERATIVE, KernelKind.PINGPONG):
            g = c.plan.schedule.gemms[0]
            assert g.pipeline.a.mn_major and g.pipeline.b.mn_major


def test_an_mn_major_b_needs_whole_64_column_boxes():
    k = gemm_kernel(b_layout=ROW, tile=(128, 32, 64), warps=(4, 2), arch=ir.Arch.SM90A)
    s = build(k).plan.schedule
    assert s.scheduler.kind is KernelKind.TILED
    why = dict(s.rejected)[KernelKind.COOPERATIVE]
    assert "B is MN-major" in why and "multiple of 64, not 32" in why
    with pytest.raises(KgenError, match="multiple of 64, not 32"):
        build(dataclasses.replace(k, schedule=ir.Schedule.COOPERATIVE))


def test_batched_mn_major_operands_load_rank_3_boxes():
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    k = _kernel("a_col_b_row", "cooperative")
    params = tuple(dataclasses.replace(p, batch="L") if p.kind is ir.ParamKind.TENSOR else p
                   for p in k.params)
    built = build(dataclasses.replace(k, params=params))
    source = built.source
    assert built.plan.schedule.scheduler.kind is KernelKind.COOPERATIVE
    assert ("for (int j = 0; j < kTileM / 64; ++j) tma_load_box_3d(a_ring + s * kAStageBytes + "
            "j * kMnBoxBytes, &maps.A, full + 8 * s, tile_m * kTileM + 64 * j, kt * kTileK, "
            "map_batch(p.batch_A, batch));") in source
    assert "const cuuint32_t box[3] = {64, 64, 1};" in source
    assert "copy_boxes_narrow_mn<kTileN>(b_ring + s * kBStageBytes, pb.B" in source
    ptx = compile_ptx(source, built.plan.name, "sm_90a")
    assert "cp.async.bulk.tensor.3d" in ptx and "wgmma.mma_async" in ptx
    result = compile_cubin(source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_inspect_names_each_operands_major_ness():
    from kgen.report import plan_summary

    plan = build_file(EXAMPLES / "gemm_b_row.kg", "sm_90a").plan
    rows = {r["setting"]: r for r in plan_summary(plan)["schedule"]}
    assert rows["mma0 A"]["value"] == "TMA ring, K-major"
    assert rows["mma0 B"]["value"] == "TMA ring, MN-major"
    assert "imm-trans-b" in rows["mma0 B"]["why"]
    assert "4 boxes of 64 N x 64 k" in rows["tensor map B"]["why"]


def test_the_layout_combinations_are_all_distinct_kernels():
    sources = {build(_kernel(lay, "cooperative")).source for lay in LAYOUTS}
    assert len(sources) == len(LAYOUTS)
