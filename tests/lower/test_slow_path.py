"""No silent slow path (kgen/lower/slow_path.py): the written schedule lines that make sm_90a plan
a slower path than it plans without them, named, located, with both paths."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen import ir
from kgen.lower import builder, lower, slow_path_warning as slow_path
from kgen.lower.slow_path import check, rank
from kgen.parse import parse
from kgen.plan import KernelKind
from kgen.targets import target
from kgen.verify import verify

from tests.kernels import GEMM_TEXT as GEMM

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def gemm(lines: str, arch: str = "sm_90a") -> ir.Kernel:
    module = parse(GEMM.replace("TARGET", arch).replace("LINES", lines), "t.kg")
    verify(module)
    return module.kernels[0]


def example(name: str) -> ir.Kernel:
    module = parse((EXAMPLES / name).read_text(), name)
    verify(module)
    return module.kernels[0]


def test_sm80_lines_on_sm90a_name_both_lines_and_both_paths():
    """Issue 49's first case: a file written for sm_80 planned for sm_90a."""
    kernel = gemm("tile 128x128x32  warps 2x2  stages 4")
    assert lower(kernel, ir.Arch.SM90A).schedule.scheduler.kind is KernelKind.TILED
    warning = slow_path(kernel, ir.Arch.SM90A)
    assert warning is not None
    assert warning.loc == kernel.gemms[0].tile.loc  # the first line to blame, with its caret
    assert warning.message.startswith(
        "`tile 128x128x32` and `warps 2x2` force the mma.sync kernel (the sm_80 path")
    assert "`stages 4`" not in warning.message  # stages 4 plans the wgmma kernel too
    assert "without them, kgen plans the warp-specialized wgmma kernel (cooperative)" in (
        warning.message)
    rendered = warning.render(GEMM.replace("TARGET", "sm_90a").replace(
        "LINES", "tile 128x128x32  warps 2x2  stages 4"))
    assert rendered.startswith("t.kg:7:5: warning: ") and rendered.endswith("^~~~~~~~~~~~~~~")


def test_the_advised_warps_of_a_wide_tile_warn():
    """Issue 49's second case: `warps 4x4` beside a 256x256 tile plans the mma.sync kernel."""
    kernel = gemm("tile 256x256x64  warps 4x4")
    warning = slow_path(kernel, ir.Arch.SM90A)
    assert warning is not None and warning.message.startswith(
        "`tile 256x256x64` and `warps 4x4` force the mma.sync kernel")


def test_one_line_is_named_alone():
    kernel = gemm("tile 128x256x64  warps 4x2  stages 3  split 4")
    assert slow_path(kernel, ir.Arch.SM90A) is None  # 8 warps, split-K: the cooperative kernel
    kernel = gemm("tile 128x128x64  warps 2x2  stages 3")
    warning = slow_path(kernel, ir.Arch.SM90A)
    assert warning.message.startswith("`warps 2x2` forces the mma.sync kernel")
    assert "without it, kgen plans" in warning.message
    assert warning.loc == kernel.gemms[0].warps.loc


def test_split_k_with_reductions_is_named():
    """`split 4` with epilogue reductions runs on the tiled kernel: a line to blame too."""
    warning = slow_path(example("splitk_reductions.kg"), ir.Arch.SM90A)
    assert warning.message.startswith("`tile 64x128x64`, `warps 2x2` and `split 4` force the "
                                      "mma.sync kernel")


def test_a_chain_names_each_gemms_lines_and_the_ping_pong_chain():
    """The resident wgmma chain of b2b_gemm_rf_sm90a.kg (every thread copies A by cp.async) where
    the ping-pong chain plans without the lines: slower by the bench's figures."""
    kernel = example("b2b_gemm_rf_sm90a.kg")
    warning = slow_path(kernel, ir.Arch.SM90A)
    assert warning.message.startswith(
        "`tile 128x64x64` of g0, `warps 8x1` of g0, `tile 128x128x64` of g1 at line 25 and "
        "`warps 8x1` of g1 at line 25 force the resident wgmma chain")
    assert "kgen plans the ping-pong wgmma chain" in warning.message
    # a chain through shared memory names the `keep` line by its gemm (it has no location)
    warning = slow_path(example("b2b_gemm_smem.kg"), ir.Arch.SM90A)
    assert "`keep g0 in smem` of g1 and" in warning.message


@pytest.mark.parametrize("name, arch", [
    ("gemm.kg", ir.Arch.SM90A),  # written lines on the fastest path
    ("b2b_gemm_rf_pingpong_sm90a.kg", ir.Arch.SM90A),
    ("splitk_reductions.kg", ir.Arch.SM80),  # no faster path on sm_80
    ("attention_bwd_seed_storage.kg", ir.Arch.SM90A),  # slow for its storage block, not a line
])
def test_no_warning_without_a_faster_path_a_line_takes_away(name, arch):
    assert slow_path(example(name), arch) is None


def test_no_warning_for_a_kernel_that_writes_no_line():
    kernel = builder.free(example("splitk_reductions.kg"))
    assert slow_path(kernel, ir.Arch.SM90A) is None


def test_the_fastest_path_is_not_planned_again():
    kernel = example("gemm.kg")
    plan = lower(kernel, ir.Arch.SM90A)

    def lower_one(_):
        raise AssertionError("planned again")

    assert check(kernel, target(ir.Arch.SM90A), plan, lower_one) is None


def test_paths_rank_as_the_target_lists_them():
    tiled = lower(gemm("tile 128x128x32  warps 2x2  stages 4"), ir.Arch.SM90A).schedule
    cooperative = lower(gemm(""), ir.Arch.SM90A).schedule
    resident = lower(example("b2b_gemm_rf_sm90a.kg")).schedule
    pingpong = lower(example("b2b_gemm_rf_pingpong_sm90a.kg")).schedule
    assert rank(tiled) < rank(cooperative)
    assert rank(resident) < rank(pingpong)
