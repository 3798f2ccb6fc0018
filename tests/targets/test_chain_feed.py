"""The epilogue that feeds a chain's next gemm (kgen/targets/common/chain_mainloop.feed_lines):
branch-free over the rows where it reads nothing at a row, each row's call skipped past M
otherwise."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.api import build
from kgen.parse import parse
from kgen.targets.common.chain_mainloop import feed_reads_rows
from kgen.verify import verify
from tests.kernels import B2B_CHAIN

SKIPPED = "if (m0 + r < M) g0_epilogue("
# the call's head: sm_90a's ping-pong chain passes its early column vectors after x1
BRANCH_FREE = "g0_epilogue(p, m0 + r, c, acc[i][j][0], acc[i][j][1], x0, x1"


def _chain(target: str, epilogue: str | None = None, extra: str = "") -> ir.Kernel:
    text = B2B_CHAIN.format(t="f16", k0=256, n0=64, n1=64).replace("target sm_90a",
                                                                    f"target {target}")
    if epilogue is not None:
        text = text.replace("g0 = relu(acc * scale0[col] + bias0[col])", epilogue)
    text = text.replace("  vector bias0 : f32[64]\n", "  vector bias0 : f32[64]\n" + extra)
    module = parse(text, "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_column_vectors_feed_every_row(target):
    built = build(_chain(target), ir.Arch(target), source_name="chain.kg")
    assert not feed_reads_rows(built.plan.gemms[0])
    assert BRANCH_FREE in built.source and SKIPPED not in built.source
    assert "if (m0 + r >= M) x0 = x1 = 0.0f;" in built.source  # rows past M still feed zeros


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_a_row_vector_skips_the_rows_past_m(target):
    kernel = _chain(target, "g0 = relu(acc * scale0[col] + rowbias[row])",
                    "  vector rowbias : f32[M]\n")
    built = build(kernel, ir.Arch(target), source_name="chain.kg")
    assert feed_reads_rows(built.plan.gemms[0])
    assert SKIPPED in built.source and BRANCH_FREE not in built.source.replace(
        "if (m0 + r < M) " + BRANCH_FREE, "")
