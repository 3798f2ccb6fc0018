"""On a GPU: ping-pong chains whose feeding epilogue's column vectors are loaded before the
mainloop (EpilogueVectors, REGISTERS) against the reference: f32 and 16-bit vectors, a row
vector beside them (the feed then skips rows past M), two and three consumer warpgroups, N0 of
96, 128 and 160, at sizes where some warpgroups get no tile (M = 1, 77, 1000) and a few (4097)."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.plan import VectorHome
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import assert_matches_reference, chain_vectors_text

pytestmark = pytest.mark.gpu

ROW_EPILOGUE = "g0 = relu(acc * scale0[col] + rowb[row]) + bias0[col]"


@pytest.mark.parametrize("k0, n0, n1, dtype, vectors, epilogue", [
    (256, 128, 64, "f16", "f32", None),
    (256, 128, 256, "bf16", "bf16", None),
    (256, 160, 320, "f16", "f32", None),
    (256, 64, 128, "bf16", "f32", None),  # three consumer warpgroups
    (256, 96, 256, "f16", "f16", None),
    (256, 128, 128, "f16", "f32", ROW_EPILOGUE),
])
def test_early_vector_chain_matches_reference(k0, n0, n1, dtype, vectors, epilogue):
    from kgen.api import build

    module = parse(chain_vectors_text(dtype, k0, n0, n1, vectors, epilogue), "chain.kg")
    verify(module)
    built = build(module.kernels[0], ir.Arch.SM90A, source_name="chain.kg")
    assert built.plan.schedule.scheduler.kind.value == "pingpong"
    assert built.plan.schedule.gemms[0].vectors.held(VectorHome.REGISTERS)
    assert_matches_reference(built, (1, 77, 1000, 4097))
