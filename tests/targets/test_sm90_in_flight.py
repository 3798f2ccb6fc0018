"""sm_90a's ping-pong chain with two wgmma groups in flight in the first gemm's mainloop
(Overlap.wgmma_groups): the rule (a ring of a tile's k tiles and two slots more),
inspect, the emitted mainloop (each slot handed back after the
next k tile's group is issued, the other consumer's turn given before the last wait), and
NVRTC with no spill."""
from __future__ import annotations

import dataclasses
import re

import pytest

from kgen import ir
from kgen.api import build
from kgen.parse import parse
from kgen.plan import Overlap
from kgen.targets.sm90 import chain as sm90_chain
from kgen.targets.sm90 import schedules
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, with_gemm_schedule


def chain(k0: int | str, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


def mainloop(source: str) -> str:
    """The emitted first-gemm mainloop of a ping-pong chain: from the turn wait to g0's
    epilogue."""
    start = source.index("int fill = local * k_tiles;")
    return source[start:source.index("// Epilogue of g0 into registers", start)]


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 128, 64, "f16"), (256, 128, 128, "bf16"),
                                               (256, 64, 64, "f16"), (256, 64, 256, "f16")])
def test_two_groups_where_the_ring_holds_a_tile_and_two_slots_more(k0, n0, n1, dtype):
    plan = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg").plan
    first = plan.schedule.gemms[0]
    assert plan.gemms[0].stages >= k0 // 64 + schedules.IN_FLIGHT_SPARE
    assert first.overlap.wgmma_groups == 2
    assert all(g.overlap.wgmma_groups == 1 for g in plan.schedule.gemms[1:])
    rows = {label: (value, why) for label, value, why in plan.schedule.describe()}
    value, why = rows["g0 wgmma groups in flight"]
    assert value == "2" and "one k tile later" in why


@pytest.mark.parametrize("k0, n0, n1", [(576, 128, 64), (576, 64, 256), (256, 128, 256),
                                        (1024, 128, 128), (768, 96, 128)])
def test_one_group_where_the_ring_is_shorter(k0, n0, n1):
    """K0 = 576 (9 k tiles on 6 slots) and N1 = 256 beside N0 = 128 (4 k tiles on 5 slots) ran
    slower with two groups on an H200."""
    result = build(chain(k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.gemms[0].stages < -(-k0 // 64) + schedules.IN_FLIGHT_SPARE
    assert result.plan.schedule.gemms[0].overlap.wgmma_groups == 1
    assert "g0 wgmma groups in flight" not in {r[0] for r in result.plan.schedule.describe()}
    loop = mainloop(result.source)
    assert "wgmma_wait<1>()" not in loop
    assert loop.index("wgmma_wait<0>();") < loop.index("mbarrier_arrive(empty_bar + 8 * slot);")


@pytest.mark.parametrize("stages, k0, groups", [(6, 256, 2), (5, 256, 1), (11, 576, 2),
                                                (10, 576, 1), (12, 576, 2)])
def test_the_rule(stages, k0, groups):
    plan = build(chain(k0, 64, 64), ir.Arch.SM90A, source_name="chain.kg").plan
    first = dataclasses.replace(plan.gemms[0], stages=stages)
    assert schedules.in_flight(first) == groups


def test_one_group_where_k0_is_known_only_at_run_time():
    """A runtime K0 may hold more k tiles than the ring: the rule takes one group."""
    result = build(chain("K", 128, 128), ir.Arch.SM90A, source_name="chain.kg")
    first = result.plan.gemms[0]
    assert result.plan.schedule.scheduler.kind.value == "pingpong" and first.k_dim == "K"
    assert schedules.in_flight(first) == 1
    assert result.plan.schedule.gemms[0].overlap.wgmma_groups == 1
    assert "wgmma_wait<1>()" not in mainloop(result.source)


def test_the_pingpong_example_keeps_two_groups():
    """examples/b2b_gemm_rf_pingpong_sm90a.kg: 12 slots, 9 k tiles (0.0343 against 0.0347 ms
    with one group on an H200)."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "examples" / "b2b_gemm_rf_pingpong_sm90a.kg"
    module = parse(path.read_text(), path.name)
    verify(module)
    plan = build(module.kernels[0], ir.Arch.SM90A, source_name=path.name).plan
    assert plan.schedule.gemms[0].overlap.wgmma_groups == 2


def test_two_groups_hand_each_slot_back_after_the_next_group_is_issued():
    source = build(chain(256, 128, 128), ir.Arch.SM90A, source_name="chain.kg").source
    loop = mainloop(source)
    body = loop[:loop.index("mbarrier_arrive(order_bar")]
    # in the loop: issue, then wait for all but the newest group, then free the older slot
    commit, wait = body.index("wgmma_commit();"), body.index("wgmma_wait<1>();")
    free = body.index("if (kt > 0) mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));")
    assert commit < wait < free
    assert "wgmma_wait<0>" not in body
    # after the loop: the turn once the last group is issued, then its wait and its slot
    tail = loop[loop.index("mbarrier_arrive(order_bar"):]
    assert tail.index("mbarrier_arrive(order_bar") < tail.index("wgmma_wait<0>();") < tail.index(
        "if (k_tiles > 0) mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));")
    assert len(re.findall(r"mbarrier_arrive\(empty_bar", loop)) == 2


def test_the_schedule_value_alone_switches_the_mainloop():
    """One home: the emitter reads Overlap.wgmma_groups, nothing else."""
    plan = build(chain(256, 128, 128), ir.Arch.SM90A, source_name="chain.kg").plan
    one = with_gemm_schedule(plan, 0, overlap=Overlap())
    source = sm90_chain.emit(one, source_name="chain.kg", source_hash="", command="test")
    assert "wgmma_wait<1>()" not in mainloop(source)


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 128, 128, "f16"), (256, 64, 256, "bf16")])
def test_two_groups_compile_without_spills(k0, n0, n1, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    result = build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")
    assert result.plan.schedule.gemms[0].overlap.wgmma_groups == 2
    resources = compile_cubin(result.source, result.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0
