"""The DAG loop's shared memory placed by kgen's storage planner (kgen/lower/loop_dag_storage.py):
the phases and lifetimes, the unions it finds (dS^T over dO with one ring slot), the barrier
before a staged tile written over bytes read earlier in the block, the offsets in the emitted
SharedStorage, `kgen inspect`; and examples/attention_bwd_storage.kg, the backward at the seed's
sm_80 configuration, within the seed's hand-written SharedStorage (its size computed here from
the seed's struct), compiled by NVRTC without spills."""
from __future__ import annotations

import dataclasses
import itertools
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from kgen import ir
from kgen.api import build_verified
from kgen.cli import cli
from kgen.lower import unions
from kgen.parse import parse, parse_file
from kgen.verify import verify

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "attention_bwd_storage.kg"
SEED = ROOT / "examples" / "attention_bwd_seed_storage.kg"
BACKWARD = ROOT / "examples" / "attention_bwd.kg"


# The seed's SharedStoragePrologue (seed 002, kernel_backward.h) for AttentionBackwardKernel<Sm80,
# half_t, aligned, dropout, preload, kBlockSizeI 64, kBlockSizeJ 64, kMaxK 64>, member by member
# as CUTLASS sizes them: an operand's stages are min(kStages, kMaxK / ThreadK) = 2 of a 64x32
# f16 tile; an AccumulatorSharedStorage (B2bGemm) is 64 x (64 + 8 padding columns) f16; an
# epilogue's SharedStorage (2 warps x 8 rows) x 2 fragments of 64 + 8 columns of f32; di is
# kBlockSizeI f32. Z (zij) has the accumulator's size with dropout and none without.
STAGES = 2 * 64 * 32 * 2  # 8192
ACCUMULATOR = 64 * 72 * 2  # 9216
EPILOGUE = 32 * 72 * 4  # 9216


def seed_bytes(dropout: bool) -> int:
    zij = ACCUMULATOR if dropout else 0
    persistent = 64 * 4 + STAGES  # di, mm_qk_k
    part1 = max(64 * 64 * 2, ACCUMULATOR) + zij + max(STAGES, EPILOGUE) + 2 * STAGES
    part2 = ACCUMULATOR + STAGES + STAGES + max(EPILOGUE, EPILOGUE)  # tmp, mm_gradK, mm_gradQ
    part3 = ACCUMULATOR + STAGES + EPILOGUE + EPILOGUE  # tmp, mm_gradK, gradQ, gradK epilogues
    part4 = STAGES + EPILOGUE + EPILOGUE  # mm_qk_q, the final gradK and gradV epilogues
    return persistent + max(part1, part2, part3, part4)  # every member 16-byte aligned


def declared_bytes(text: str) -> int:
    """The size of a storage declaration as kgen lays it out (C's rules, kgen/lower/unions.py)."""
    (k,) = parse(text, "seed.kg").kernels
    built = build_verified(k, ir.Arch.SM80)
    return built.plan.storage.declared_bytes


def test_the_seeds_shared_storage_sizes():
    """The seed's struct as examples/attention_bwd_seed_storage.kg declares it: 52,480 B with
    dropout's Z tile, 44,288 B without it (what the seed runs for a backward without dropout,
    as kgen's)."""
    assert seed_bytes(dropout=True) == 52480 and seed_bytes(dropout=False) == 44288
    text = SEED.read_text()
    assert declared_bytes(text) == seed_bytes(dropout=True)
    zij = "        zij : f16[64, 72] live(p_store..dv)\n"
    assert zij in text
    assert declared_bytes(text.replace(zij, "")) == seed_bytes(dropout=False)


def plan_of(text: str, arch: ir.Arch = ir.Arch.SM80):
    module = parse(text, "bwd.kg")
    assert verify(module) == []
    return build_verified(module.kernels[0], arch)


def _disjoint_when_co_live(storage) -> None:
    for b in storage.buffers:
        assert b.offset % b.align == 0 and b.end <= storage.total_bytes, b
    for x, y in itertools.combinations(storage.buffers, 2):
        assert not (x.shares_bytes(y) and x.co_live(y)), (x, y)


def test_the_example_at_the_seeds_configuration_fits_in_the_seeds_storage():
    built = plan_of(EXAMPLE.read_text())
    plan, storage = built.plan, built.plan.storage
    assert (plan.tile_m, plan.block, plan.warps, plan.stages) == (64, 64, 4, 1)
    assert plan.dtype is ir.DType.F16 and plan.n_acc == 64 and plan.wgmma is None
    assert storage.phases == ("prologue", "loads", "st", "dv", "dpt", "dk", "dq", "epilogue")
    at = {b.name: b for b in storage.buffers}
    live = {name: storage.live_text(b) for name, b in at.items()}
    assert live == {"k_res": "prologue..dq", "v_res": "prologue..dq", "q_ring": "loads..dk",
                    "do_ring": "loads..dpt", "t0_smem": "dk..dq", "vec_lse": "loads..dpt",
                    "vec_D": "loads..dpt"}
    _disjoint_when_co_live(storage)
    # dS^T takes dO's bytes (dO's last gemm, dpt, comes before dS^T is staged), behind a barrier
    assert at["t0_smem"].offset == at["do_ring"].offset and plan.fenced == ("t0_smem",)
    # the planner reaches the most bytes live in one phase: no layout is smaller
    assert plan.smem_bytes == storage.total_bytes == storage.peak_bytes == 33280
    assert plan.smem_bytes <= seed_bytes(dropout=False) < seed_bytes(dropout=True)
    assert {t.name: t.offset for t in plan.tiles} == {
        name: at[name].offset for name in ("k_res", "v_res", "q_ring", "do_ring", "t0_smem")}


def test_the_emitted_storage_is_the_planners():
    built = plan_of(EXAMPLE.read_text())
    source = built.source
    assert "constexpr int kSmemBytes = 33280;" in source
    for b in built.plan.storage.buffers:
        assert (f"static_assert(sizeof(SharedStorage::{b.name}) == {b.bytes}, \"{b.name}: "
                f"{b.bytes} B at byte {b.offset} (after its padding), as planned\");" in source)
        # its struct in the union: the planned offset's padding, then the buffer (NVRTC 13.0
        # has no __builtin_offsetof to assert it with)
        pad = rf"unsigned char offset_pad\d+\[{b.offset}\];\s+(Element|float) {b.name}\["
        assert b.offset == 0 or re.search(pad, source), b.name
    # the barrier before dS^T's writes, in the fast body and in the checked one
    fence = ("__syncthreads();  // t0_smem shares bytes with a tile read earlier in this block: "
             "every warp is done with it")
    assert source.count(fence) == 2
    stage = source.index(fence)
    assert stage < source.index("// staged in t0_smem", stage) < source.index("// dk +=", stage)


def test_two_ring_slots_keep_every_loop_buffer_apart_and_no_barrier():
    """With two slots a ring slot refills while the other is read, across the iterations: the
    ring lives through the loop and nothing shares bytes (the layout the skeleton had before
    the planner: the same offsets)."""
    built = plan_of(BACKWARD.read_text())
    plan, storage = built.plan, built.plan.storage
    assert plan.stages == 2 and plan.fenced == ()
    assert [(b.name, b.offset) for b in storage.buffers] == [
        ("k_res", 0), ("v_res", 32768), ("q_ring", 65536), ("do_ring", 81920),
        ("t0_smem", 98304), ("vec_lse", 106496), ("vec_D", 106752)]
    assert plan.smem_bytes == 107008
    assert not any(x.shares_bytes(y) for x, y in itertools.combinations(storage.buffers, 2))
    assert "shares bytes with a tile read earlier" not in built.source


@pytest.mark.parametrize("mask", [False, True])
def test_one_slot_at_head_dim_128_unions_dst_with_do(mask):
    text = BACKWARD.read_text().replace("    tile 128x32\n", "    tile 128x32  stages 1\n")
    if not mask:
        text = text.replace("where(row <= col, exp(scale * acc - lse[col]), 0)",
                            "exp(scale * acc - lse[col])")
    built = plan_of(text)
    storage = built.plan.storage
    at = {b.name: b for b in storage.buffers}
    _disjoint_when_co_live(storage)
    assert at["t0_smem"].offset == at["do_ring"].offset and built.plan.fenced == ("t0_smem",)
    assert built.plan.smem_bytes == 32768 * 2 + 8192 * 2 + 2 * 4 * 32 == storage.peak_bytes


def test_the_sm90a_wgmma_skeleton_keeps_its_own_layout():
    text = BACKWARD.read_text().replace("    tile 128x32\n", "").replace("sm_80", "sm_90a")
    plan = plan_of(text, ir.Arch.SM90A).plan
    assert plan.wgmma is not None and plan.storage is None and plan.fenced == ()


def test_a_planned_layout_never_exceeds_the_tiles_end_to_end():
    """The rulebook's budget counts the buffers end to end (loop_rules.dag_smem_bytes): the
    planner's layout is never larger, for every legal configuration of both examples, and
    smaller exactly where the ring has one slot."""
    from kgen.errors import KgenError
    from kgen.targets import loop_rules

    planned = []
    for path in (EXAMPLE, BACKWARD):
        for tile, stages in itertools.product(("64x64", "64x32", "128x32"), (1, 2)):
            text = re.sub(r"    tile [^\n]*\n", f"    tile {tile}  stages {stages}\n",
                          path.read_text())
            try:
                plan = plan_of(text).plan
            except KgenError as err:  # a configuration the rulebook refuses (registers)
                assert "registers" in str(err), err
                continue
            config = loop_rules.LoopConfig(plan.tile_m, plan.block, plan.stages, 16)
            shape = loop_rules.DagShape((64, 64) if path is EXAMPLE else (128, 128),
                                        (plan.n_acc, plan.n_acc), 1, 2, plan.n_acc, 2,
                                        (plan.n_acc,), 2)
            end_to_end = loop_rules.dag_smem_bytes(config, shape, plan.dtype)
            assert end_to_end == sum(t.bytes for t in plan.tiles) + 8 * plan.stages * plan.block
            assert plan.smem_bytes <= end_to_end, (path.name, tile, stages)
            assert (plan.smem_bytes < end_to_end) == (stages == 1), (path.name, tile, stages)
            planned.append((path.name, tile, stages))
    assert len(planned) >= 8, planned


def test_the_example_compiles_with_nvrtc_without_spills():
    from kgen.runtime.nvrtc import compile_cubin

    built = plan_of(EXAMPLE.read_text())
    for arch in ("sm_80", "sm_90"):  # the GPU builds the sm_80 plan for its own arch
        resources = compile_cubin(built.source, built.plan.name, arch).resources()
        assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
            (arch, resources)
        assert resources.get("stack_bytes", 0) == 0, (arch, resources)


def test_inspect_shows_the_phases_the_buffers_and_the_unions():
    runner = CliRunner()
    result = runner.invoke(cli, ["inspect", str(EXAMPLE), "--json"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    (k,) = json.loads(result.stdout)["kernels"]
    assert k["phases"] == ["prologue", "loads", "st", "dv", "dpt", "dk", "dq", "epilogue"]
    assert k["smem_bytes"] == k["smem_peak"] == 33280
    by_name = {b["name"]: b for b in k["buffers"]}
    assert by_name["t0_smem"]["live_phases"] == ["dk", "dq"]
    assert by_name["do_ring"]["live_ranges"] == [[1, 4]]
    assert k["unions"] == [{"buffers": ["do_ring", "t0_smem"], "bytes": [24576, 32768],
                            "live": ["loads..dpt", "dk..dq"]}]
    assert k["fenced"] == ["t0_smem"]
    table = runner.invoke(cli, ["inspect", str(EXAMPLE)], catch_exceptions=False)
    out = table.output
    assert "storage over phases" in out and "33,280 B" in out
    assert "union: do_ring (loads..dpt) and t0_smem (dk..dq) share bytes 24,576..32,768" in out
    seed = runner.invoke(cli, ["inspect", str(SEED)], catch_exceptions=False)
    assert "storage declaration 52,480 B" in seed.output


def test_the_seed_declaration_is_a_union_checked_layout():
    """The renamed seed example still parses to the seed's struct (kgen/lower/unions.py)."""
    (k,) = parse_file(SEED).kernels
    assert k.name == "attention_bwd_seed_storage" and k.storage is not None
    assert dataclasses.is_dataclass(k.storage) and unions.MAX_BYTES > 52480
