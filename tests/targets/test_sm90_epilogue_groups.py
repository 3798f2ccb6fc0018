"""The warp-specialized epilogue's walk (EpilogueGroups, kgen/targets/sm90/
epilogue_groups.py) and the staging's one walk (a tile the copy engine cannot store is copied
out of the staging): the builder's choice and its reasons, the emitted loops, and NVRTC's
compile of grouped kernels (0 spills, 0 stack, less PTX). The GPU tests:
tests/gpu/test_epilogue_groups_gpu.py."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build_file
from kgen.emit import emit
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import EpilogueGroups, StorePath
from kgen.runtime.nvrtc import compile_cubin, compile_ptx, parse_ptxas_report
from kgen.targets.sm90.epilogue_groups import GROUP_FROM, epilogue_groups

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"


def _kernel(expr: str, lines: str = "", extra: str = "", outputs: str = "",
            head: str = "") -> ir.Kernel:
    text = f"""
kernel k {{
  target sm_90a
  {head}
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  vector bias : f32[N]
  {extra}
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {expr}{outputs} }}
  }}
}}
"""
    kernel = parse(text, "k.kg").kernels[0]
    used = {"A", "B", "D", "E", "csum"} | ({"bias"} if "bias" in expr else set())
    return dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))


def _example(name: str) -> ir.Kernel:
    from kgen.parse import parse_file

    return dataclasses.replace(parse_file(EXAMPLES / name).kernels[0], target=ir.Arch.SM90A)


def _gemm(kernel: ir.Kernel):
    return lower(kernel).schedule.gemms[0]


def test_two_outputs_of_gelu_as_pairs_walk_in_groups():
    g = _gemm(_example("evt_multi_output.kg"))
    assert g.output.path is StorePath.PAIRS
    assert g.groups.count == 4
    assert "about 35 instructions per element" in g.groups.why
    assert "4 groups" in g.groups.why


def test_gelu_through_the_staging_walks_in_groups():
    staged = _gemm(_example("gemm_gelu_rowscale.kg"))
    assert (staged.output.path, staged.groups.count) == (StorePath.TMA, 4)
    assert "the output leaves through the staging" in staged.groups.why


def test_cheap_evts_stay_unrolled():
    tanh = _gemm(_kernel("tanh(acc)"))  # 20 < 35: the groups cost 3-4% there
    assert (tanh.output.path, tanh.groups.count) == (StorePath.TMA, 1)
    assert f"under the {GROUP_FROM} from which the walk rolls" in tanh.groups.why
    stats = _gemm(_example("evt_softmax_stats.kg"))  # one exp per element: 12 < 35
    assert (stats.output.path, stats.groups.count) == (StorePath.PAIRS, 1)
    bare = _gemm(_example("gemm.kg"))
    assert (bare.groups.count, bare.groups.why) == (1, "")
    relu = _gemm(_example("gemm_bias_relu.kg"))
    assert (relu.groups.count, relu.groups.why) == (1, "")


def test_a_heavy_staged_evt_walks_the_epilogue_tiles_boxes():
    g = _gemm(_kernel("gelu(acc + bias[col])"))
    assert g.output.path is StorePath.TMA and g.staging.boxes == 2
    assert g.groups.count == 4  # one per box of the 256-column tile


def test_a_column_reduction_keeps_the_walk_unrolled():
    g = _gemm(_kernel("gelu(acc)", extra="tensor E : f16[M, N] row out\n  vector csum : f32[N] out",
                      outputs="\n      E = acc\n      csum = colsum(gelu(acc))"))
    assert g.groups.count == 1
    assert "column reduction" in g.groups.why


def test_no_groups_where_no_epilogue_runs_or_one_group_spans_the_tile():
    plan = lower(_example("evt_multi_output.kg"))
    g = plan.gemms[0]
    assert epilogue_groups(g, split_k=2, store=StorePath.PAIRS) == (1, "")
    narrow = dataclasses.replace(g, tile=(128, 64, 64))
    assert epilogue_groups(narrow, split_k=1, store=StorePath.PAIRS) == (1, "")
    odd = dataclasses.replace(g, tile=(128, 80, 64))
    assert epilogue_groups(odd, split_k=1, store=StorePath.PAIRS) == (1, "")


def _with_groups(plan, groups: int):
    return plan.with_gemm_schedule(groups=EpilogueGroups(groups))


def _emit(plan) -> str:
    return emit(plan, source_name="k.kg", source_hash="", command="test")


@pytest.mark.parametrize("name", ["evt_multi_output.kg", "gemm_gelu_rowscale.kg"])
def test_the_grouped_walk_holds_one_copy_of_the_evt_per_group(name):
    plan = lower(_example(name))
    unrolled, grouped = _emit(_with_groups(plan, 1)), _emit(_with_groups(plan, 4))
    assert "select_group" not in unrolled
    assert "__device__ __forceinline__ void select_group(" in grouped
    loops = re.findall(r"#pragma unroll 1  // 4 groups of fragments.*\n\s*for \(int grp = 0; "
                       r"grp < 4; \+\+grp\) \{", grouped)
    staging = plan.schedule.gemms[0].output.path is StorePath.TMA
    assert len(loops) == (2 if staging else 1)  # the staging's walk and the narrow one's pairs
    assert "float frag[kFragN / 4][4];" in grouped
    ptx_unrolled = compile_ptx(unrolled, plan.name, "sm_90a")
    ptx_grouped = compile_ptx(grouped, plan.name, "sm_90a")
    assert len(ptx_grouped) < 0.6 * len(ptx_unrolled)


def test_the_epilogue_tiles_groups_must_be_its_boxes():
    plan = lower(_kernel("gelu(acc + bias[col])"))
    assert plan.schedule.gemms[0].staging.boxes == 2
    with pytest.raises(ValueError, match="groups are its 4 boxes, not 8"):
        _emit(_with_groups(plan, 8))


def test_inspect_shows_the_walk():
    rows = {label: (value, why) for label, value, why in
            lower(_example("evt_multi_output.kg")).schedule.describe()}
    assert rows["mma0 epilogue groups"][0] == "4 of 64 columns, rolled"


TWO_OUTPUTS = dict(extra="tensor E : f16[M, N] row out", outputs="\n      E = acc")


@pytest.mark.parametrize("label, expr, lines, more, groups", [
    ("pairs", "gelu(acc + bias[col])", "tile 128x256x64 warps 2x4 stages 3", TWO_OUTPUTS, 4),
    ("epilogue tile", "gelu(acc + bias[col])", "", {}, 4),
    ("whole tile in 8", "gelu(acc + bias[col])", "tile 128x256x64 warps 2x4 stages 3", {}, 8),
    ("pingpong", "gelu(acc)", "tile 128x128x64 warps 2x4 stages 6",
     dict(head="schedule pingpong"), 2),
])
def test_nvrtc_compiles_grouped_walks_without_spills(label, expr, lines, more, groups):
    plan = lower(_kernel(expr, lines, **more))
    path = StorePath.PAIRS if label == "pairs" else StorePath.TMA
    assert plan.schedule.gemms[0].output.path is path
    assert plan.schedule.scheduler.pingpong == (label == "pingpong")
    plan = _with_groups(plan, groups)
    result = compile_cubin(_emit(plan), plan.name, "sm_90a")
    for entry in (plan.name, plan.narrow_kernel):
        report = parse_ptxas_report(result.log, entry)
        assert report["spill_stores"] == report["spill_loads"] == report["stack_bytes"] == 0, (
            label, entry, report)


@pytest.mark.parametrize("name", ["gemm.kg", "gemm_bias_relu.kg", "gemm_gelu_rowscale.kg",
                                  "evt_select.kg", "batched_gemm_bias.kg", "gemm_b_row.kg"])
def test_the_staging_holds_the_only_copy_of_the_evt(name):
    """A tile whose last columns end inside a 16-byte chunk is written into the staging like
    the others and copied out of it by the consumer's threads: the fast entry point calls the
    packed epilogue once, and no pair store of its own remains."""
    built = build_file(EXAMPLES / name, "sm_90a")
    g = built.plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA
    source = built.source
    assert source.count(f"{built.plan.gemms[0].name}_epilogue_packed(") == 2  # defined, called
    assert "copy_box_out(" in source
    assert "store_pair_col" not in source and "load_pair_col" not in source
