"""Timing GPU work with CUDA events: warm-up, the median of many runs, inputs rotated past L2.

Each timed run gets its own pair of events around it, recorded back to back without host
synchronization, so the GPU queue stays full and the events measure GPU time. Runs cycle
through `rotate` input sets whose total size exceeds the L2 cache, so a run does not find the
previous run's operands already in L2 (what a kernel inside a real model would see).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable

from .device import check

DEFAULT_WARMUP = 5
DEFAULT_ITERS = 30  # at least 20, for a stable median
MAX_ROTATE = 64


@dataclass(frozen=True, slots=True)
class Timing:
    median_ms: float
    min_ms: float
    mean_ms: float
    iters: int
    rotate: int
    samples_ms: tuple[float, ...]

    def as_dict(self) -> dict:
        return {"median_ms": self.median_ms, "min_ms": self.min_ms, "mean_ms": self.mean_ms,
                "iters": self.iters, "rotate": self.rotate}


def rotation_count(set_bytes: int, l2_bytes: int, *, max_sets: int = MAX_ROTATE) -> int:
    """How many input sets of `set_bytes` make more than twice the L2 size together."""
    if set_bytes <= 0:
        return 1
    return max(1, min(max_sets, (2 * l2_bytes) // set_bytes + 1))


def time_kernel(fn: Callable[[int], None], *, warmup: int = DEFAULT_WARMUP,
                iters: int = DEFAULT_ITERS, rotate: int = 1, stream: int = 0) -> Timing:
    """Time `fn(i)`, which enqueues work using input set `i % rotate` on `stream` (a raw
    CUstream handle; 0 is the legacy default stream). Returns per-run GPU times."""
    from cuda.bindings import driver

    if iters < 1:
        raise ValueError("iters must be at least 1")
    rotate = max(1, rotate)
    handle = driver.CUstream(stream)
    for i in range(warmup):
        fn(i % rotate)
    flags = driver.CUevent_flags.CU_EVENT_DEFAULT
    starts = [check(driver.cuEventCreate(flags), "cuEventCreate") for _ in range(iters)]
    ends = [check(driver.cuEventCreate(flags), "cuEventCreate") for _ in range(iters)]
    try:
        for i in range(iters):
            check(driver.cuEventRecord(starts[i], handle), "cuEventRecord")
            fn((warmup + i) % rotate)
            check(driver.cuEventRecord(ends[i], handle), "cuEventRecord")
        check(driver.cuEventSynchronize(ends[-1]), "waiting for the timed runs")
        samples = tuple(
            float(check(driver.cuEventElapsedTime(start, end), "cuEventElapsedTime"))
            for start, end in zip(starts, ends)
        )
    finally:
        for event in starts + ends:
            driver.cuEventDestroy(event)
    return Timing(
        median_ms=statistics.median(samples),
        min_ms=min(samples),
        mean_ms=statistics.fmean(samples),
        iters=iters,
        rotate=rotate,
        samples_ms=samples,
    )
