"""On a GPU: ping-pong chains whose last gemm keeps two column passes in flight
(Overlap.passes) against the reference, with an epilogue that reads bias1[col]
(each pass's columns), 2 and 3 passes, a last N that overhangs the tile (320 on 384), column blocks (448), a
first gemm whose last k tile is part full (K0 = 200), at sizes
where some warpgroups get no tile (M = 1, 77, 1000) and a few (4097)."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import assert_matches_reference, biased_chain_text

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("k0, n0, n1, dtype", [(256, 128, 256, "bf16"), (256, 128, 448, "f16"),
                                               (256, 128, 320, "f16"), (200, 128, 256, "bf16"),
                                               (256, 96, 256, "f16")])
def test_passes_in_flight_chain_matches_reference(k0, n0, n1, dtype):
    from kgen.api import build

    module = parse(biased_chain_text(dtype, k0, n0, n1), "chain.kg")
    verify(module)
    built = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    assert built.plan.schedule.gemms[-1].overlap.passes == 2
    assert_matches_reference(built, (1, 77, 1000, 4097))
