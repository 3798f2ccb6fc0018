"""On a GPU: ping-pong chains whose first gemm's B rows split 32-byte sectors (K0 = 8 mod 16),
which keep B0 resident (configs.split_rows), against the reference, with a last k tile part
full, at sizes where some warpgroups get no tile (M = 1, 77, 1000) and a few (4097)."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, assert_matches_reference

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("k0, n0, n1, dtype", [(1000, 64, 64, "f16"), (1000, 64, 256, "bf16"),
                                               (1000, 32, 128, "f16"), (200, 64, 64, "bf16")])
def test_split_row_chain_matches_reference(k0, n0, n1, dtype):
    from kgen.api import build

    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    built = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    assert built.plan.schedule.scheduler.kind.value == "pingpong"
    assert not built.plan.schedule.chain_ring_b
    assert_matches_reference(built, (1, 77, 1000, 4097))
