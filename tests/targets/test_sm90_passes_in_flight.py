"""sm_90a's ping-pong chain with two column passes in flight (Overlap.passes):
the rule (2 or 3 passes on two consumer warpgroups, at most four k tiles in the first gemm, a
thread's A fragments and two passes' accumulators within PASSES_IN_FLIGHT_MAX_VALUES), inspect, the emitted pass loop, one home for
the choice, and NVRTC with no spill and no serialized wgmma."""
from __future__ import annotations

import dataclasses

import pytest

from kgen import ir
from kgen.api import build
from kgen.parse import parse
from kgen.plan import Overlap
from kgen.targets.sm90 import chain as sm90_chain
from kgen.targets.sm90 import schedules
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, with_gemm_schedule


def chain(k0: int, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


def last_stage(source: str) -> str:
    start = source.index("// ---- g1 = g0 @ B1")
    return source[start:source.index("// Host launcher", start)]


@pytest.mark.parametrize("k0, n0, n1, passes", [(256, 128, 256, 2), (256, 128, 320, 3),
                                                (256, 128, 448, 2), (256, 96, 256, 2),
                                                (192, 128, 320, 3)])
def test_two_passes_in_flight(k0, n0, n1, passes):
    result = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    last = result.plan.schedule.gemms[-1]
    assert (last.passes.count, last.overlap.passes) == (passes, 2)
    assert result.plan.schedule.warps.role("consumer").groups == 2
    assert all(g.overlap.passes == 1 for g in result.plan.schedule.gemms[:-1])
    stage = last_stage(result.source)
    head = stage.index(f"float pass_acc[2][kFragM][g1_cfg::kFragN / {passes}][4];")
    loop = stage.index(f"for (int pass = 0; pass < {passes}; ++pass) {{")
    assert head < loop and "#pragma unroll 1" not in stage[head:loop]
    issue = stage.index(f"for (int q = pass == 0 ? 0 : pass + 1; q <= pass + 1 && q < {passes}; "
                        "++q) {")
    wait = stage.index(f"if (pass + 1 < {passes})\n", issue)
    assert issue < stage.index("wgmma_commit();", issue) < wait
    assert stage.index("wgmma_wait<1>();", wait) < stage.index("wgmma_wait<0>();", wait) \
        < stage.index("float (&acc)[kFragM][kFragN][4] = pass_acc[pass % 2];", wait) \
        < stage.index("tma_store_box(&maps.D1", wait)
    rows = {label: (value, why) for label, value, why in result.plan.schedule.describe()}
    value, why = rows["g1 column passes in flight"]
    assert value == "2" and "second set of accumulators" in why


@pytest.mark.parametrize("k0, n0, n1, why", [
    (256, 64, 256, "three consumer warpgroups"),
    (576, 64, 448, "four passes"),
    (256, 128, 128, "no passes"),
    (576, 128, 256, "nine k tiles in the first gemm"),
    (1000, 64, 320, "sixteen k tiles in the first gemm"),
])
def test_one_pass_at_a_time(k0, n0, n1, why):
    result = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.gemms[-1].overlap.passes == 1, why
    assert "pass_acc" not in result.source
    assert "g1 column passes in flight" not in {r[0] for r in result.plan.schedule.describe()}


def test_the_rule():
    plan = build(chain(256, 128, 256), ir.Arch.SM90A, source_name="chain.kg").plan
    first, last = plan.gemms
    assert schedules.passes_in_flight([first, last], 2, 2).passes == 2
    assert schedules.passes_in_flight([first, last], 1, 2) == Overlap()
    assert schedules.passes_in_flight([first, last], 2, 3) == Overlap()
    assert schedules.passes_in_flight([first, last], 4, 2) == Overlap()  # four passes spilled
    long_k = dataclasses.replace(first, k_dim=576)  # nine k tiles: the ring bounds it
    assert schedules.passes_in_flight([long_k, last], 2, 2) == Overlap()
    wide = dataclasses.replace(last, tile=(64, 512, 64))  # 32 + 256 values a thread
    assert schedules.passes_in_flight([first, wide], 2, 2) == Overlap()


def test_the_schedule_value_alone_switches_the_passes():
    """One home: the emitter reads Overlap.passes, nothing else."""
    plan = build(chain(256, 128, 256), ir.Arch.SM90A, source_name="chain.kg").plan
    one = with_gemm_schedule(plan, -1, overlap=Overlap())
    source = sm90_chain.emit(one, source_name="chain.kg", source_hash="", command="test")
    assert "pass_acc" not in source and "#pragma unroll 1" in last_stage(source)


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 128, 256, "bf16"), (256, 128, 320, "f16"),
                                               (192, 128, 320, "f16")])
def test_passes_in_flight_compile_without_spills(k0, n0, n1, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.gemms[-1].overlap.passes == 2
    compiled = compile_cubin(result.source, result.plan.name, "sm_90a")
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0
    assert "serialized" not in compiled.log
