"""Swizzled tiles are bijections, and every cp.async store and ldmatrix read is conflict-free."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.lower import lower
from kgen.lower import fragments, swizzle
from kgen.plan import Swizzle

from tests.kernels import CONFIGS, GEMM_EXAMPLES, LAYOUTS, gemm_kernel


def _plans():
    for tile, warps, stages in CONFIGS:
        for a_layout, b_layout in LAYOUTS:
            k = gemm_kernel(tile=tile, warps=warps, stages=stages, a_layout=a_layout,
                            b_layout=b_layout, arch=ir.Arch.SM90A)
            yield f"{tile}-{warps}-{a_layout.value}{b_layout.value}", lower(k)


def _example_plans():
    parse = pytest.importorskip("kgen.parse")
    for path in GEMM_EXAMPLES:  # programs' tiles: tests/lower/test_program.py
        for kernel in parse.parse_file(path).kernels:
            yield path.name, lower(kernel)


PLANS = list(_plans())


def _operands(plan):
    g = plan.gemms[0]
    return [("a", g.a, g), ("b", g.b, g)]


@pytest.mark.parametrize("label,plan", PLANS, ids=[p[0] for p in PLANS])
def test_tiles_are_bijections(label, plan):
    for _, op, _ in _operands(plan):
        assert swizzle.is_bijection(op.smem), op.smem


def _copy_addresses(op, threads, warp, i):
    eb = op.dtype.nbytes
    per_chunk = swizzle.CHUNK_BYTES // eb
    return [
        op.smem.offset(*fragments.copy_coord(t + i * threads, op.smem.inner, per_chunk)) * eb
        for t in range(warp * 32, warp * 32 + 32)
    ]


def _ldmatrix_addresses(plan, which, op, warp, kk, f):
    g = plan.gemms[0]
    fmap = fragments.LDMATRIX[(which, op.k_major)]
    warps_n = g.warps[1]
    off = (warp // warps_n) * g.warp_tile[0] if which == "a" else (warp % warps_n) * g.warp_tile[1]
    return [op.smem.offset(*fmap.coord(lane, off, f, kk)) * op.dtype.nbytes for lane in range(32)]


def _check_conflict_free(plan):
    for which, op, g in _operands(plan):
        warps = plan.schedule.warps.threads // 32
        for warp in range(warps):
            for i in range(op.copies_per_thread):
                addrs = _copy_addresses(op, plan.schedule.warps.threads, warp, i)
                assert swizzle.max_bank_conflict(addrs, 16) == 1, (which, warp, i)
            for kk in range(g.tile[2] // 16):
                for f in range(len(op.frag_steps[0])):
                    addrs = _ldmatrix_addresses(plan, which, op, warp, kk, f)
                    assert swizzle.max_bank_conflict(addrs, 16) == 1, (which, warp, kk, f)


def _needs_ldmatrix(plan):
    """The sm_80 mainloop's tables apply: the warp-specialized sm_90a kernel (the TMA ring and
    wgmma, which reads shared memory through descriptors) uses neither its copies nor its
    ldmatrix offsets (tests/targets/test_sm90_mn_major.py covers it)."""
    if plan.schedule.wgmma:
        pytest.skip("wgmma reads shared memory through descriptors, not ldmatrix")


@pytest.mark.parametrize("label,plan", PLANS, ids=[p[0] for p in PLANS])
def test_copies_and_ldmatrix_are_conflict_free(label, plan):
    _needs_ldmatrix(plan)
    _check_conflict_free(plan)


def test_examples_are_bijective_and_conflict_free():
    plans = list(_example_plans())
    assert plans, "no examples found"
    for name, plan in plans:
        for _, op, _ in _operands(plan):
            assert swizzle.is_bijection(op.smem), name
        _check_conflict_free(plan)


@pytest.mark.parametrize("label,plan", PLANS, ids=[p[0] for p in PLANS])
def test_offset_tables_match_the_layout(label, plan):
    """The (base ^ X) + Y tables the kernel uses equal the layout function for every thread."""
    _needs_ldmatrix(plan)
    for which, op, g in _operands(plan):
        fmap = fragments.LDMATRIX[(which, op.k_major)]
        warps_n = g.warps[1]
        for t in range(plan.schedule.warps.threads):
            warp = t // 32
            off = (warp // warps_n) * g.warp_tile[0] if which == "a" else (warp % warps_n) * g.warp_tile[1]
            base = op.smem.offset(*fmap.coord(t % 32, off, 0, 0))
            for kk, row in enumerate(op.frag_steps):
                for f, (x, y) in enumerate(row):
                    assert (base ^ x) + y == op.smem.offset(*fmap.coord(t % 32, off, f, kk))


def test_bank_model_detects_conflicts():
    """Without the swizzle, 8 rows of 128 bytes read at one column hit the same banks."""
    plain = swizzle.make_tile("t", ir.DType.F16, 64, 64, 1)
    import dataclasses

    unswizzled = dataclasses.replace(plain, swizzle=Swizzle(0, 0, 0))
    addrs = [unswizzled.offset(lane % 8 + 8 * (lane // 8), 0) * 2 for lane in range(32)]
    assert swizzle.max_bank_conflict(addrs, 16) == 8
    swizzled = [plain.offset(lane % 8 + 8 * (lane // 8), 0) * 2 for lane in range(32)]
    assert swizzle.max_bank_conflict(swizzled, 16) == 1


@pytest.mark.parametrize("inner,expected", [(16, Swizzle(1, 3, 3)), (32, Swizzle(2, 3, 3)),
                                            (64, Swizzle(3, 3, 3)), (128, Swizzle(3, 3, 3))])
def test_swizzle_choice_by_row_width(inner, expected):
    tile = swizzle.make_tile("t", ir.DType.BF16, 32, inner, 2)
    assert tile.swizzle == expected
    assert tile.atom_inner == min(inner, 64)


def test_unswizzlable_width_is_rejected():
    assert swizzle.make_tile("t", ir.DType.F16, 32, 8, 2) is None  # 16-byte rows
    assert swizzle.make_tile("t", ir.DType.F16, 32, 96, 2) is None  # 192-byte rows
