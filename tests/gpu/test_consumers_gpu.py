"""On a GPU: ping-pong chains with three consumer warpgroups (schedules.consumer_count) against
the reference, at sizes where some warpgroups get no tile (M = 1, 77, 1000), where each gets a
few (4097) and at the benchmarks' M with a ragged tail (81920 + 13)."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, assert_matches_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 64, 128, "f16"), (256, 64, 256, "bf16"),
                                               (128, 64, 128, "f16"), (256, 32, 128, "bf16")])
def test_three_consumer_chain_matches_reference(k0, n0, n1, dtype):
    from kgen.api import build

    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    built = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    assert built.plan.schedule.warps.role("consumer").groups == 3
    assert_matches_reference(built, (1, 77, 1000, 4097, 81920 + 13))
