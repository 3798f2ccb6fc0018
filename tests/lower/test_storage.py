"""Placement by lifetime: no two live buffers overlap, alignment holds, reuse happens."""
from __future__ import annotations

import itertools
import random

from kgen.lower import lower, storage

from tests.kernels import gemm_kernel


def _overlap(a, b):
    return a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes


def _live_together(a, b):
    return a.live[0] <= b.live[1] and b.live[0] <= a.live[1]


def test_random_requests_never_overlap_while_live():
    rng = random.Random(7)
    for _ in range(200):
        reqs = []
        for i in range(rng.randint(1, 8)):
            first = rng.randint(0, 4)
            reqs.append(storage.Request(f"b{i}", rng.randint(1, 5000), rng.choice([8, 16, 128, 1024]),
                                        (first, first + rng.randint(0, 3)), "test"))
        placed = storage.place(reqs)
        for b in placed:
            assert b.offset % b.align == 0
        for a, b in itertools.combinations(placed, 2):
            assert not (_live_together(a, b) and _overlap(a, b)), (a, b)


def test_disjoint_lifetimes_share_bytes():
    reqs = [storage.Request("x", 4096, 128, (0, 0), "x"), storage.Request("y", 2048, 128, (1, 1), "y"),
            storage.Request("z", 100, 8, (0, 1), "z")]
    x, y, z = storage.place(reqs)
    assert x.offset == 0 and y.offset == 0  # reused
    assert z.offset == 4096


def test_gemm_plan_storage():
    plan = lower(gemm_kernel(tile=(128, 128, 64), warps=(2, 2), stages=3))
    a, b = plan.storage.buffers
    assert (a.name, a.offset, a.bytes) == ("a_smem", 0, 49152)
    assert (b.name, b.offset, b.bytes) == ("b_smem", 49152, 49152)
    assert plan.smem_bytes == 98304 and plan.storage.limit_bytes == 163 * 1024
