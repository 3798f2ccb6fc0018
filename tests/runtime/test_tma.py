"""kgen/runtime/tma.py: which numbers a TMA plan's tensor maps are encoded from. The
encoding itself needs the driver: the GPU tests run the ping-pong examples through it."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build_file
from kgen.runtime import tma

EXAMPLES = Path(__file__).parent.parent.parent / "examples"


@pytest.mark.parametrize("example, dtype", [("b2b_gemm_rf_pingpong_sm90a", ir.DType.F16),
                                            ("b2b_gemm_rf_pingpong_bf16_sm90a", ir.DType.BF16)])
def test_the_output_map_takes_the_outputs_address_rows_and_leading_dimension(
        monkeypatch, example, dtype):
    plan = build_file(EXAMPLES / f"{example}.kg", "sm_90a").plan
    out = plan.schedule.tma_output
    assert (out.param, out.dtype, out.store) == ("D1", dtype, True)
    assert [m.param for m in plan.schedule.tensor_maps] == ["A", "D1"]
    calls = []
    monkeypatch.setattr(tma, "encode_2d", lambda *args: calls.append(args) or b"m" * 128)
    values = {"A": 0x1000, "D1": 0x7f0000200000, "M": 81921, "ld_A": 584, "ld_D1": 136}
    keys = tma.maps_args(plan, values, {"M": 81921})
    assert tma.encode(keys) == b"m" * 256
    # A is f16/bf16[M, 576] row, loaded by the producer in 64x64 boxes, its L2 misses pulling
    # 128-byte lines (schedules.RING_PROMOTION); D1 is f16/bf16[M, 128] row: 81921 rows of 128
    # columns, rows 136 elements apart, in 64x64 boxes, without L2 promotion (a store)
    assert calls == [(dtype, 0x1000, 81921, 576, 584, (64, 64), "L2_128B"),
                     (dtype, 0x7f0000200000, 81921, 128, 136, (64, 64), "NONE")]
    # the runtime keys its cache of encoded maps on the same numbers
    assert keys == tuple(calls)


def test_only_a_tma_store_plan_has_a_map():
    plan = build_file(EXAMPLES / "b2b_gemm_rf_sm90a.kg", "sm_90a").plan
    assert plan.schedule.tma_output is None and not plan.schedule.scheduler.pingpong
