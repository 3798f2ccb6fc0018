"""sm_90a's chain list orders its ring depths by whether the output staging fits beside the ring
and the resident B tiles: the storage planner answers it (kgen/lower/builder.py staging_fits,
placing kgen/targets/sm90/schedules.py staging_placement), not an estimate of its own."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.lower import builder, lower
from kgen.parse import parse
from kgen.targets import target
from kgen.targets.sm90 import configs

from tests.kernels import b2b_chain_text


def chain(k0: int, n0: int, n1: int) -> ir.Kernel:
    return parse(b2b_chain_text("f16", k0, n0, n1), "t.kg").kernels[0]


def streamed_rings(listed) -> list[int]:
    return [c.gemms[0].stages for c in listed
            if c.schedule is not None and not c.gemms[0].resident]


def test_the_ring_depths_follow_the_answer_of_fits():
    shapes = builder.shapes(chain(576, 64, 128))
    short = list(configs.SHORT_RINGS)  # last, after the 128-row chain
    assert streamed_rings(configs.chain(shapes, lambda c: True)) == list(
        configs.RING_B_RINGS) + short
    assert streamed_rings(configs.chain(shapes, lambda c: False)) == list(
        configs.RING_B_PASS_RINGS) + short


def test_no_staging_no_short_rings():
    """A chain whose consumer threads' values leave no staging keeps the usual rings whatever
    the budget would say."""
    tiles = [(64, 112, 64), (64, 256, 16)]  # g1 on mma.sync (N0 = 112): no column passes
    assert not configs.has_staging(tiles)
    assert not configs.short_rings(tiles, None, lambda c: False)


@pytest.mark.parametrize("k0, n0, n1", [(576, 64, 128), (256, 128, 256), (256, 128, 192),
                                        (1024, 64, 256)])
def test_staging_fits_is_what_the_plan_of_that_ring_does(k0, n0, n1):
    """builder.staging_fits says the 6-slot streamed ring's staging fits exactly where that
    configuration's plan stores its output through the staging (the copy engine's store map)."""
    kernel = chain(k0, n0, n1)
    tgt = target(ir.Arch.SM90A)
    six = next(c for c in configs.chain(builder.shapes(kernel))
               if c.schedule is not None and not c.gemms[0].resident
               and c.gemms[0].stages == configs.RING_B_SLOTS)
    plan = lower(builder.fill(builder.free(kernel), six)[0], ir.Arch.SM90A)
    staged = any(m.store for m in plan.schedule.tensor_maps)
    assert builder.staging_fits(kernel, tgt, six) == staged


def test_a_short_ring_is_taken_where_six_slots_leave_no_room_for_the_staging():
    kernel = chain(256, 128, 192)  # 48 KB of B1, 48 KB of staging: not beside 6 slots
    tgt = target(ir.Arch.SM90A)
    listed = configs.chain(builder.shapes(kernel), lambda c: builder.staging_fits(kernel, tgt, c))
    assert streamed_rings(listed) == list(configs.RING_B_PASS_RINGS) + list(configs.SHORT_RINGS)
    plan = lower(builder.free(kernel), ir.Arch.SM90A)
    assert plan.gemms[0].stages == configs.RING_B_PASS_RINGS[0]
    assert any(m.store for m in plan.schedule.tensor_maps)
