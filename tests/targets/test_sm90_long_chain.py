"""sm_90a's ping-pong chain of more than two gemms (schedules.tile_values): the first gemm on
wgmma from the ring, every later one on wgmma with A from registers (the gemm before's
accumulators, after its epilogue, repacked once as A fragments), each consumer thread's values
at every chained gemm within its registers, NVRTC's build without a spill, and the located
refusals where a chain does not fit."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.api import build, build_file
from kgen.errors import KgenError, KgenSlowPathWarning
from kgen.parse import parse
from kgen.plan import KernelKind, LoadPath, Mma
from kgen.targets.sm90 import chain_values, schedules
from kgen.verify import verify

from tests.kernels import EXAMPLES

EXAMPLE = next(p for p in EXAMPLES if p.stem == "b2b3_gemm_rf_bf16_sm90a")


def long_chain_text(dtype: str, k0: int, widths: tuple[int, ...], *, stages: int = 6,
                    schedule: bool = True, resident: tuple[bool, ...] | None = None,
                    lines: bool = True) -> str:
    """A chain of len(widths) gemms, gemm i = g(i-1) @ Bi with N widths[i], every gemm but the
    last with relu(acc + bias_i[col]) feeding the next in registers, the last storing
    D = relu(acc); its tiles 64 rows by all of N on 4x1 warps, the first gemm's ring `stages`
    deep. `resident[i]`: `keep Bi resident` (all by default); `lines` False: no schedule line
    at all (the builder's choice)."""
    resident = resident or (True,) * len(widths)
    text = [f"kernel chain{len(widths)} {{", "  target sm_90a"]
    if schedule and lines:
        text.append("  schedule pingpong")
    text.append(f"  tensor A : {dtype}[M, {k0}] row")
    k = k0
    for i, n in enumerate(widths):
        text.append(f"  tensor B{i} : {dtype}[{k}, {n}] col")
        k = n
    text.append(f"  tensor D : {dtype}[M, {widths[-1]}] row out")
    text += [f"  vector bias{i} : f32[{n}]" for i, n in enumerate(widths[:-1])]
    last = len(widths) - 1
    for i, n in enumerate(widths):
        source = f"g{i - 1}" if i else "A"
        keep = [f"keep g{i - 1} in registers"] if i else []
        keep += [f"keep B{i} resident"] if resident[i] else []
        plan = [f"tile 64x{n}x64 warps 4x1 stages {stages if i == 0 else 2}"] if lines else []
        epilogue = f"g{i} = relu(acc + bias{i}[col])" if i < last else "D = relu(acc)"
        text += [f"  gemm g{i} = {source} @ B{i} accumulate f32 {{",
                 *(f"    {line}" for line in plan + (keep if lines else [])),
                 f"    epilogue {{ {epilogue} }}", "  }"]
    return "\n".join(text + ["}"]) + "\n"


def built(text: str):
    module = parse(text, "chain.kg")
    verify(module)
    return build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")


def line_of(text: str, words: str) -> int:
    """The line (from 1) of `text` that holds `words`."""
    return next(i for i, line in enumerate(text.split("\n"), 1) if words in line)


def refusal(text: str) -> KgenError:
    with pytest.raises(KgenError) as info:
        built(text)
    return info.value


def on_wgmma(plan) -> bool:
    """The first gemm on wgmma from shared memory, every later one with A from registers."""
    mmas = [g.atom.instruction for g in plan.schedule.gemms]
    return mmas == [Mma.WGMMA_SS] + [Mma.WGMMA_RS] * (len(mmas) - 1)


def test_the_example_runs_three_gemms_on_wgmma():
    result = build_file(EXAMPLE)
    plan, source = result.plan, result.source
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG and on_wgmma(plan)
    assert plan.schedule.warps.role("consumer").groups == 2  # 160 values a thread: 232 registers
    assert plan.schedule.gemms[0].pipeline.a.load is LoadPath.TMA
    assert all(g.pipeline.b.load is LoadPath.RESIDENT for g in plan.schedule.gemms)
    assert plan.schedule.tma_output is not None  # D2 staged for the copy engine
    # g1's output repacked once as g2's A fragments, which g2's wgmma reads from registers
    order = ["unsigned g1_a_frag[g1_cfg::kKSteps]", "// ---- g0 = A @ B0",
             "g1_a_frag[j / 2][i][(j % 2) * 2] = pack_operands(x0, x1);",
             "unsigned g2_a_frag[g2_cfg::kKSteps]", "// ---- g1 = g0 @ B1",
             "wgmma_step_rs(acc, g1_a_frag[3][0], smem_descriptor(b_smem + 96));",
             "g2_a_frag[j / 2][i][(j % 2) * 2] = pack_operands(x0, x1);", "// ---- g2 = g1 @ B2",
             "wgmma_step_rs(acc, g2_a_frag[7][0], smem_descriptor(b_smem + 1 * kBStageBytes + "
             "96));"]
    positions = [source.index(s) for s in order]
    assert positions == sorted(positions)
    assert not re.search(r"\bmma_step\(", source)  # no gemm on mma.sync
    g1 = source[source.index("// ---- g1 = g0 @ B1"):source.index("// ---- g2 = g1 @ B2")]
    assert "const int n0" not in g1 and "const int N" not in g1  # it stores nothing


def test_the_example_compiles_without_spills():
    pytest.importorskip("cuda.bindings")
    from kgen.runtime.nvrtc import compile_cubin

    result = build_file(EXAMPLE)
    compiled = compile_cubin(result.source, result.plan.name, "sm_90a")
    assert compiled.spill_stores == 0 and compiled.spill_loads == 0, compiled.log
    assert "warning" not in compiled.log.lower(), compiled.log
    assert "wgmma.mma_async instructions are serialized" not in compiled.log


@pytest.mark.parametrize("dtype, k0, widths, stages, resident, consumers, passes", [
    ("f16", 256, (64, 128, 128), 6, None, 2, 1),
    ("bf16", 256, (64, 64, 128), 6, None, 3, 1),  # 112 values a thread: three consumers
    ("bf16", 256, (128, 128, 256), 4, None, 2, 2),  # g2 in two column passes, each staged
    ("bf16", 256, (64, 192, 64), 6, None, 2, 1),
    ("bf16", 576, (64, 128, 128), 6, (False, True, True), 2, 1),  # B0 through the ring
    ("bf16", 256, (64, 128, 128, 128), 6, None, 2, 1),
    ("f16", 256, (128, 64, 128, 256), 4, None, 2, 2),
])
def test_longer_chains_compile_on_wgmma_without_spills(dtype, k0, widths, stages, resident,
                                                       consumers, passes):
    pytest.importorskip("cuda.bindings")
    from kgen.runtime.nvrtc import compile_cubin

    result = built(long_chain_text(dtype, k0, widths, stages=stages, resident=resident))
    plan = result.plan
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG and on_wgmma(plan)
    assert plan.schedule.chain_ring_b is (resident is not None and not resident[0])
    assert plan.schedule.warps.role("consumer").groups == consumers
    assert plan.schedule.gemms[-1].passes.count == passes
    compiled = compile_cubin(result.source, plan.name, "sm_90a")
    assert compiled.spill_stores == 0 and compiled.spill_loads == 0, compiled.log
    assert "wgmma.mma_async instructions are serialized" not in compiled.log


def test_the_values_at_each_chained_gemm():
    # g0's accumulators, their A fragments and g1's accumulators; then g1's, and g2's
    assert schedules.tile_values([64, 128, 128]) == [32 + 16 + 64, 64 + 32 + 64]
    assert schedules.tile_values([128, 128, 256], passes=2) == [160, 64 + 32 + 64]
    assert schedules.tile_values([128, 256]) == [chain_values.consumer_values(128, 256)]
    # a gemm whose A came from registers holds fewer (CHAINED_MAX_VALUES) than the second
    assert schedules.values_over([128, 256]) == []  # 224: two gemms, as before
    assert schedules.values_over([64, 256, 64]) == [2]  # 224 at g2: it spilled
    assert schedules.values_over([64, 128, 128, 128]) == []
    assert schedules.values_over([256, 256, 64]) == [1, 2]


def test_a_chained_gemm_over_its_registers_is_refused_at_its_tile():
    text = long_chain_text("bf16", 256, (256, 256, 64), stages=4)
    error = refusal(text)
    assert error.loc.line == line_of(text, "tile 64x256x64 warps 4x1 stages 2"), error.render()
    assert ("a consumer thread would hold 320 values at gemm 'g1' (over 224: they spill): g0's "
            "accumulators (128), their A fragments (64) and g1's accumulators (128)"
            in error.message)
    text = long_chain_text("bf16", 256, (64, 256, 64), stages=4)
    error = refusal(text)
    assert error.loc.line == line_of(text, "tile 64x64x64 warps 4x1 stages 2"), error.render()
    assert "would hold 224 accumulator values (over 192: they spill)" in error.message


def test_a_longer_chain_needs_every_later_gemm_in_registers_with_b_resident():
    text = long_chain_text("bf16", 256, (64, 128, 128))
    error = refusal(text.replace("keep g1 in registers", "keep g1 in smem"))
    assert error.loc.line == 3, error.render()  # the schedule line
    assert "each after the first keeping the one before in registers" in error.message
    error = refusal(text.replace("keep B2 resident", ""))
    assert error.loc.line == 3 and "its B resident" in error.message, error.render()


def test_keep_resident_without_the_schedule_line_points_at_the_ping_pong_chain():
    text = long_chain_text("bf16", 256, (64, 128, 128), schedule=False)
    error = refusal(text)
    assert error.loc.line == line_of(text, "keep B0 resident"), error.render()
    assert "keep B0 resident needs the persistent kernel" in error.message
    assert "a chain of 3 gemms keeps its B operands resident in the ping-pong chain" in (
        error.message)


def test_the_builder_plans_a_free_chain_of_three_on_wgmma():
    plan = built(long_chain_text("bf16", 256, (64, 128, 128), lines=False)).plan
    assert plan.schedule.scheduler.kind is KernelKind.PINGPONG and on_wgmma(plan)


def test_lines_that_force_mma_sync_on_a_chain_of_three_warn():
    text = long_chain_text("bf16", 256, (64, 128, 128), schedule=False,
                           resident=(False, False, False))
    with pytest.warns(KgenSlowPathWarning, match="the ping-pong wgmma chain"):
        plan = built(text).plan
    assert plan.schedule.scheduler.kind is KernelKind.TILED
    assert all(g.atom.instruction is Mma.MMA_SYNC for g in plan.schedule.gemms)
