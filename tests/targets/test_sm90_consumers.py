"""sm_90a's ping-pong chain with three consumer warpgroups (schedules.consumer_count): the rule
(a consumer thread's values fit 152 registers, the last gemm's pass at least 128 columns wide,
the first gemm at most 4 k tiles), the roles and shared memory it takes, the emitted turns,
and NVRTC with no spill."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.api import build
from kgen.parse import parse
from kgen.targets.sm90 import schedules
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, b2b_chain_text


def chain(k0: int | str, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


def planned(k0, n0, n1, dtype="f16"):
    return build(chain(k0, n0, n1, dtype), ir.Arch.SM90A, source_name="chain.kg")


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 128, "f16"), (256, 64, 256, "bf16"),
                                               (128, 64, 128, "f16"), (256, 32, 128, "bf16")])
def test_three_consumers_where_the_rule_holds(k0, n0, n1, dtype):
    result = planned(k0, n0, n1, dtype)
    schedule = result.plan.schedule
    consumer, producer = schedule.warps.role("consumer"), schedule.warps.role("producer")
    assert consumer.groups == 3 and schedule.warps.threads == 512
    # the register file shared out: 40 for the producer warpgroup, the rest in steps of 8
    assert producer.registers == schedules.PRODUCER_REGISTERS and consumer.registers == 152
    assert 128 * producer.registers + 3 * 128 * consumer.registers <= 65536
    assert "3 consumer warpgroups take the tiles in turn" in schedule.scheduler.why
    buffers = {b.name: b for b in result.plan.storage.buffers}
    stages = result.plan.gemms[0].stages
    assert buffers["g0_ring_barriers"].bytes == 8 * (2 * stages + 3)  # a turn barrier each
    passes = schedule.gemms[-1].passes.count
    assert buffers["g1_d_staging"].bytes == 3 * 64 * (n1 // passes) * 2
    source = result.source
    assert "__launch_bounds__(512, 1)" in source
    assert "tile += 3 * gridDim.x, local += 3) {" in source
    assert "mbarrier_wait(order_bar + 8 * warpgroup, ((local - 1) / 3) & 1);" in source
    assert "mbarrier_arrive(order_bar + 8 * ((warpgroup + 1) % 3));" in source
    assert "for (int w = 0; w < 3; ++w) mbarrier_init(order_bar + 8 * w" in source
    assert '"n"(3 * kWarpgroupThreads)' in source  # the consumers' named barrier
    assert "if (tid >= 3 * kWarpgroupThreads) {" in source
    assert "setmaxnreg_inc<kConsumerRegisters>();" in source


@pytest.mark.parametrize("k0, n0, n1, why", [
    (256, 64, 64, "the last gemm's pass is narrower than 128 columns"),
    (256, 96, 64, "narrower pass (N0 = 96 ran 8-9% slower with three)"),
    (256, 128, 64, "128 values: spills at 152 registers"),
    (256, 128, 256, "N0 = 128: 160 values a pass"),
    (320, 64, 128, "5 k tiles"),
    (576, 64, 256, "9 k tiles"),
    ("K", 64, 128, "a runtime K"),
])
def test_two_consumers_elsewhere(k0, n0, n1, why):
    schedule = planned(k0, n0, n1).plan.schedule
    assert schedule.warps.role("consumer").groups == 2, why
    assert schedule.warps.threads == 384 and schedule.warps.role("consumer").registers == 232


def test_the_consumers_fall_back_to_two_where_three_stagings_do_not_fit():
    """A third staging takes 16 KB more at N1 = 128: beside a resident B0 and an 18-slot ring
    there is no room for it, and the chain keeps two consumers rather than giving up the copy
    engine's stores."""
    text = b2b_chain_text("f16", 256, 64, 128, schedule="pingpong",
                          g0=("tile 64x64x64 warps 4x1 stages 18", "keep B0 resident"),
                          g1=("tile 64x128x64 warps 4x1 stages 3", "keep g0 in registers",
                              "keep B1 resident"))
    module = parse(text, "chain.kg")
    verify(module)
    result = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    plan = result.plan
    assert plan.schedule.tma_output is not None and plan.schedule.warps.role("consumer").groups == 2
    last = plan.gemms[-1]
    third = schedules.staging_bytes(last, 1, 3) - schedules.staging_bytes(last, 1, 2)
    assert plan.smem_bytes + third > plan.storage.limit_bytes
    assert schedules.consumer_count(plan.gemms, 1) == 3  # the rule alone would take 3


def test_the_register_split():
    producer, consumer = schedules.roles()
    assert (producer.registers, consumer.registers, consumer.groups) == (40, 232, 2)
    producer, consumer = schedules.roles(3)
    assert (producer.registers, consumer.registers, consumer.groups) == (40, 152, 3)


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 128, "f16"), (256, 64, 256, "bf16"),
                                               (256, 32, 128, "f16")])
def test_three_consumers_compile_without_spills(k0, n0, n1, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    result = planned(k0, n0, n1, dtype)
    assert result.plan.schedule.warps.role("consumer").groups == 3
    resources = compile_cubin(result.source, result.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
    assert resources.get("stack_bytes", 0) == 0


@pytest.mark.parametrize("k0, n0, n1, stages", [(256, 64, 192, 6), (576, 128, 192, 5),
                                                (256, 128, 256, 5), (256, 128, 128, 6)])
def test_the_last_tile_keeps_a_multiple_of_the_box(k0, n0, n1, stages):
    """N1 = 192 runs on 64x192 tiles staged for the copy engine (a 256-column tile put a quarter
    of g1's columns past N and stored from registers, 1.5-2.2x slower on an H200); beside
    N0 = 128 its staging fits only a 5-slot ring (configs.short_rings)."""
    plan = planned(k0, n0, n1).plan
    assert plan.gemms[-1].tile[1] == (192 if n1 == 192 else n1)
    assert plan.schedule.tma_output is not None
    assert plan.gemms[0].stages == stages
