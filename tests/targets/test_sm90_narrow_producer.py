"""templates/sm90/narrow_producer.inc.j2 on the CPU: the narrow entry point's producer warpgroup
copies only the operand whose rows miss the copy engine's rules; the other still goes by TMA
(whole boxes, no multicast: the narrow entry point runs without clusters), and the full barrier
counts the copy engine's arrival beside the warpgroup's. Its K-major box loop keeps eight rows'
copies in flight, and NVRTC compiles every variant without spills."""
from __future__ import annotations

import re

import pytest

from kgen.api import build

from tests.gpu.test_narrow_mixed_gpu import SCHEDULES, _kernel


def _producer(source: str) -> str:
    start = source.index("void produce_narrow(")
    return source[start:source.index("\n}\n", start)]


def test_an_operand_that_meets_the_copy_engines_rules_still_goes_by_tma():
    source = build(_kernel("coop")).source
    producer = _producer(source)
    assert "const bool a_tma = a_granule == 16, b_tma = b_granule == 16;" in producer
    # thread 0 arrives with the bytes to expect, then loads the one operand the copy engine takes
    expect = producer.index("mbarrier_expect_tx(full + 8 * s, tma_bytes);")
    a_load = producer.index("tma_load_box(a_ring + s * kAStageBytes, &maps.A", expect)
    b_load = producer.index("tma_load_box(b_ring + s * kBStageBytes + j * kMnBoxBytes, &maps.B",
                            a_load)
    assert producer.index("if (!a_tma)") > b_load and "if (!b_tma)" in producer
    assert "_multicast" not in producer
    assert ("mbarrier_init(full + 8 * s, tma_loads ? 1 : kWarpgroupThreads + (one_tma ? 1 : 0));"
            in source)


@pytest.mark.parametrize("label, operand, halves", [("cluster_2x1_b_col", "B", 2),
                                                    ("cluster_1x2", "A", 2), ("coop", "A", 1)])
def test_a_clusters_shared_operand_loads_both_halves_without_multicast(label, operand, halves):
    producer = _producer(build(_kernel(label)).source)
    loads = re.findall(rf"tma_load_box\([ab]_ring[^;]*&maps\.{operand},", producer)
    assert len(loads) == halves, loads
    assert "_multicast" not in producer


def test_the_box_loop_keeps_eight_rows_in_flight():
    from kgen.runtime.nvrtc import compile_ptx

    built = build(_kernel("cluster_2x1_b_col"))  # both operands K-major
    assert "#pragma unroll 8" in built.source
    ptx = compile_ptx(built.source, built.plan.name, "sm_90a")
    narrow = ptx[ptx.index(f".entry {built.plan.narrow_kernel}"):]
    eight = re.findall(r"cp\.async\.ca\.shared\.global \[[^\]]+\], \[[^\]]+\], 8", narrow)
    # 2 copies per 16-byte chunk, 8 rows per pass, A's and B's boxes (1 row per pass: 4)
    assert len(eight) >= 32, len(eight)
    # a batched kernel's batch pointers leave the 40-register producer room for 4 (8 spills)
    assert "#pragma unroll 4" in build(_kernel("coop", batch="L, ")).source


@pytest.mark.parametrize("label", list(SCHEDULES))
def test_every_variant_compiles_without_spills(label):
    from kgen.runtime.nvrtc import compile_cubin, parse_ptxas_report

    built = build(_kernel(label))
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    for entry in (built.plan.name, built.plan.narrow_kernel):
        usage = parse_ptxas_report(result.log, entry)
        assert usage.get("registers"), (entry, result.log)
        assert usage.get("spill_stores", 0) == 0 and usage.get("stack_bytes", 0) == 0, result.log
