"""The search space: several distinct candidates for an example with its schedule lines
deleted, the lines a source writes kept, the builder's choice always in, --limit, --all-lines."""
from __future__ import annotations

import pytest

from kgen.enums import Arch
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.tune.space import emit_source, free_lines, search_space

from .helpers import SIZES, example_text, kernel_of


@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A])
def test_a_gemm_without_schedule_lines_has_many_distinct_candidates(arch):
    space = search_space(kernel_of(example_text("gemm")), arch, SIZES)
    sources = [c.source for c in space.candidates]
    assert len(sources) >= 10
    assert len(set(sources)) == len(sources)
    assert len({c.label for c in space.candidates}) == len(sources)
    assert [c.index for c in space.candidates] == sorted(c.index for c in space.candidates)
    defaults = [c for c in space.candidates if c.default]
    assert len(defaults) == 1
    assert defaults[0].source == emit_source(lower(space.kernel, arch))
    for c in space.candidates:  # each fills tile, warps and stages
        assert {line.split()[-1] for line, _ in c.line_values} >= {"tile", "warps", "stages"}
        assert c.plan.arch is arch


def test_sm90a_lists_its_warp_specialized_kernels():
    space = search_space(kernel_of(example_text("gemm")), Arch.SM90A, SIZES)
    kinds = {c.plan.schedule.scheduler.kind.value for c in space.candidates}
    assert {"cooperative", "pingpong", "tiled"} <= kinds
    # the cooperative kernel's 256-row tiles (two m64 halves per consumer) among them
    wide = [c for c in space.candidates if c.plan.gemms[0].tile == (256, 128, 64)
            and c.plan.schedule.scheduler.kind.value == "cooperative"]
    assert {c.plan.gemms[0].stages for c in wide} == {4, 3}


def test_the_lines_a_source_writes_are_kept():
    head = "  gemm mma0 = A @ B accumulate f32 {\n"
    text = example_text("gemm").replace(head, head + "    tile 128x128x32\n")
    space = search_space(kernel_of(text), Arch.SM80, SIZES)
    assert len(space.candidates) >= 2
    for c in space.candidates:
        assert tuple(c.plan.gemms[0].tile) == (128, 128, 32)
        assert c.label.startswith("128x128x32 ")  # the label shows the written line too
        assert "mma0 tile" not in dict(c.line_values)
    assert len({c.source for c in space.candidates}) == len(space.candidates)


def test_all_lines_frees_the_written_ones():
    kernel = kernel_of(example_text("gemm", stripped=False))
    written = search_space(kernel, Arch.SM80, SIZES)
    assert len(written.candidates) == 1 and written.candidates[0].default
    free = search_space(kernel, Arch.SM80, SIZES, all_lines=True)
    assert len(free.candidates) >= 10
    assert free.kernel == free_lines(kernel)
    assert free.kernel.gemms[0].tile is None


def test_the_limit_keeps_the_first_and_the_builders_choice():
    kernel = kernel_of(example_text("gemm"))
    whole = search_space(kernel, Arch.SM80, SIZES)
    cut = search_space(kernel, Arch.SM80, SIZES, limit=3)
    assert [c.label for c in cut.candidates] == [c.label for c in whole.candidates[:3]]
    assert sum(s.step == "limit" for s in cut.skipped) == len(whole.candidates) - 3
    one = search_space(kernel, Arch.SM80, SIZES, limit=1)
    assert [c.default for c in one.candidates] == [True]


def test_small_outputs_add_split_k_candidates():
    space = search_space(kernel_of(example_text("gemm")), Arch.SM80,
                         {"M": 256, "N": 256, "K": 8192})
    splits = [c for c in space.candidates if c.plan.schedule.scheduler.split_k > 1]
    assert splits
    assert all("split" in dict(c.line_values).get("mma0 split", "") for c in splits)


def test_configurations_that_do_not_plan_are_skipped_with_the_reason():
    # the cooperative kernel has no epilogue reductions on sm_90a: its configurations refused
    space = search_space(kernel_of(example_text("evt_colsum")), Arch.SM90A, SIZES)
    assert space.candidates
    planned = [s for s in space.skipped if s.step == "plan"]
    assert planned and all(s.reason for s in planned)
    assert len(space.candidates) + len(space.skipped) == space.listed


def test_a_kernel_that_cannot_plan_raises_the_lowering_error():
    text = example_text("gemm", stripped=False).replace("stages 3", "stages 30")
    with pytest.raises(KgenError):
        search_space(kernel_of(text), Arch.SM80, SIZES)


def test_the_sizes_own_configuration_is_a_candidate_where_no_listed_one_is_it():
    """sm_90a at decode sizes: the builder's sized choice (32-row tiles of the tiled kernel,
    split-K 4) is not among the listed configurations at M = 16, N = 14336; it is added as the
    default candidate (this raised AssertionError from kgen tune)."""
    sizes = {"M": 16, "N": 14336, "K": 4096}
    space = search_space(kernel_of(example_text("gemm")), Arch.SM90A, sizes, limit=5)
    (default,) = [c for c in space.candidates if c.default]
    assert default.plan.gemms[0].tile == (32, 128, 64)
    assert default.plan.schedule.scheduler.split_k == 4


@pytest.mark.parametrize("example", ["attention_fwd", "mlp_loop", "attention_bwd_dot"])
def test_a_tile_program_is_refused_with_its_place(example):
    from pathlib import Path

    from kgen.api import read_module

    path = Path(__file__).resolve().parents[2] / "examples" / f"{example}.kg"
    (kernel,) = read_module(path)[0].kernels
    with pytest.raises(KgenError, match="kgen tune does not tune tile programs yet") as info:
        search_space(kernel, None, {})
    assert info.value.loc == (kernel.loop.loc if kernel.loop is not None else kernel.loc)
