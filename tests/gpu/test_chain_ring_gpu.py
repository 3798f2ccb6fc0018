"""On a GPU: sm_90a's ping-pong chain with a ring shorter than the first gemm's k tiles (the
consumers take turns, Schedule.consumer_order) and with B0 streamed through the ring beside A
(Schedule.chain_ring_b), against the reference at ragged M and at M = 81920, where each CTA's
warpgroups take turns over many tiles; both dtypes, rings of 2 to 8 slots, resident and
streamed B0, and a K0 that is not a multiple of the 64-wide k tile."""
from __future__ import annotations

import json

import pytest

from kgen import ir
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import B2B_CHAIN

pytestmark = pytest.mark.gpu


def chain(k0: int, n0: int, n1: int, dtype: str, ring: int, resident: bool) -> ir.Kernel:
    text = B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1)
    text = text.replace("  target sm_90a\n", "  target sm_90a\n  schedule pingpong\n")
    text = text.replace("gemm g0 = A @ B0 accumulate f32 {",
                        f"gemm g0 = A @ B0 accumulate f32 {{\n    tile 64x{n0}x64 warps 4x1 "
                        f"stages {ring}" + ("\n    keep B0 resident" if resident else ""))
    text = text.replace("gemm g1 = g0 @ B1 accumulate f32 {",
                        f"gemm g1 = g0 @ B1 accumulate f32 {{\n    tile 64x{n1}x64 warps 4x1 "
                        "stages 2\n    keep B1 resident")
    module = parse(text, "chain.kg")
    verify(module)
    return module.kernels[0]


def check(kernel, m):
    from kgen.api import build
    from kgen.harness.run import run

    built = build(kernel, ir.Arch.SM90A, source_name="chain.kg")
    report = run(built.kernel, built.plan, built.source, {"M": m}, check=True)
    assert report.checks, "no output was checked"
    assert report.ok, json.dumps(report.as_dict()["checks"], indent=1)
    assert report.compile.get("spill_stores", 0) == 0
    return built.plan


@pytest.mark.parametrize("m", [1, 17, 1000, 4097, 81920])
@pytest.mark.parametrize("k0, n0, n1, dtype, ring, resident", [
    (576, 128, 128, "f16", 6, False),
    (576, 128, 256, "bf16", 4, False),
    (1000, 128, 64, "f16", 8, False),  # 16 k tiles, the last one partial
    (256, 64, 128, "bf16", 2, False),
    (576, 64, 64, "f16", 4, True),
    (576, 128, 64, "bf16", 8, True),
])
def test_short_ring_chain_matches_reference(k0, n0, n1, dtype, ring, resident, m):
    plan = check(chain(k0, n0, n1, dtype, ring, resident), m)
    # the warpgroups take turns, or (K0 = 1000: B0's 2000-byte rows split sectors) pairs of
    # tiles (kgen/targets/sm90/chain_pairs.py), which take none
    paired = plan.schedule.gemms[0].pipeline.paired
    assert paired is (k0 == 1000) and plan.schedule.consumer_order is not paired
    assert plan.schedule.chain_ring_b is not resident


@pytest.mark.parametrize("k0, n0, n1", [(576, 128, 128), (576, 128, 256), (1024, 128, 128),
                                        (2048, 64, 64)])
def test_chain_without_schedule_lines_matches_reference(k0, n0, n1):
    module = parse(B2B_CHAIN.format(t="f16", k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    for m in (1, 1000, 81920):
        check(module.kernels[0], m)
