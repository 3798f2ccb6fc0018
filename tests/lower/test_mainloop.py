"""Tile, warp and stage checks of the mainloop pass, and the shared-memory budget."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import lower

from tests.kernels import gemm_kernel


@pytest.mark.parametrize(
    "kw,message",
    [
        (dict(tile=(100, 128, 64)), "tile M must be a power of two between 16 and 512, got 100"),
        (dict(tile=(128, 128, 8)), "tile K must be a power of two between 16 and 512, got 8"),
        (dict(tile=(1024, 128, 64)), "tile M must be a power of two between 16 and 512, got 1024"),
        (dict(tile=(128, 100, 64)), "tile N must be a multiple of 16 between 16 and 512, got 100"),
        (dict(tile=(128, 768, 64)), "tile N must be a multiple of 16 between 16 and 512, got 768"),
        (dict(tile=(32, 128, 64), warps=(4, 1)), "tile M 32 does not split over 4 warps in M"),
        (dict(tile=(128, 32, 64), warps=(1, 4)), "tile N 32 does not split over 4 warps in N"),
        (dict(warps=(8, 8)), "warps 8x8 make 2048 threads; a CTA has at most 1024"),
        (dict(warps=(0, 2)), "warps must be positive, got 0x2"),
        (dict(tile=(256, 256, 32), warps=(2, 2)), "warp tile 128x128 needs 512 f32 accumulator"),
        (dict(stages=1), "stages must be between 2 and 8, got 1"),
        (dict(stages=9), "stages must be between 2 and 8, got 9"),
        (dict(tile=(128, 256, 128), warps=(2, 4), stages=4), "shared memory over budget"),
    ],
)
def test_bad_tiles_are_rejected(kw, message):
    with pytest.raises(KgenError) as err:
        lower(gemm_kernel(**kw))
    assert message in err.value.message


def test_budget_message_names_buffers_and_limit():
    with pytest.raises(KgenError) as err:
        lower(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), stages=5))
    msg = err.value.message
    assert "245760 bytes needed, sm_80 allows 166912" in msg
    assert "b_smem 163840 B" in msg and "a_smem 81920 B" in msg


def test_budget_depends_on_target():
    """The same 192 KB ring is over budget on sm_80 and fits sm_90a's 227 KB, there with the
    epilogue tile's staging (two 64x64 boxes per consumer: the whole tile's does not fit) and
    the ring's 8 mbarriers, the arena rounded up to the staging's 1024-byte alignment."""
    with pytest.raises(KgenError):
        lower(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), stages=4))
    plan = lower(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), stages=4, arch=ir.Arch.SM90A))
    assert plan.schedule.gemms[0].staging.boxes == 2
    assert plan.smem_bytes == 196608 + 2 * 2 * 8192 + 1024


def test_plan_numbers():
    plan = lower(gemm_kernel(tile=(128, 256, 64), warps=(2, 4), stages=3))
    g = plan.gemms[0]
    assert plan.schedule.warps.threads == 256
    assert g.warp_tile == (64, 64) and g.frags == (4, 8)
    assert g.a.copies_per_thread == 4 and g.b.copies_per_thread == 8
    assert (g.a.smem.outer, g.a.smem.inner, str(g.a.smem.swizzle)) == (128, 64, "Swizzle<3,3,3>")
    assert not g.a.ldmatrix_trans and not g.b.ldmatrix_trans
    col = lower(gemm_kernel(a_layout=ir.Layout.COL, b_layout=ir.Layout.ROW)).gemms[0]
    assert col.a.ldmatrix_trans and col.b.ldmatrix_trans
    assert (col.a.smem.outer, col.a.smem.inner) == (64, 128)


def test_alignment_and_dim_rules():
    plan = lower(gemm_kernel())
    rules = {a.param: (a.ptr_bytes, a.ld_multiple) for a in plan.alignments}
    assert rules["A"] == (16, 8) and rules["B"] == (16, 8) and rules["D"] == (4, 2)
    assert [(r.dim, r.multiple) for r in plan.dim_rules] == [("N", 2)]


def test_param_named_like_a_dimension_is_rejected():
    extra = (ir.Param("K2", ir.ParamKind.SCALAR, ir.DType.F32),)
    lower(gemm_kernel(extra=extra))  # fine
    clash = (ir.Param("N", ir.ParamKind.SCALAR, ir.DType.F32),)
    with pytest.raises(KgenError, match="both for a parameter and a dimension"):
        lower(gemm_kernel(extra=clash))
