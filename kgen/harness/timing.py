"""Timing GPU work with CUDA events: warm-up, the median of many runs, inputs rotated past L2.

Each timed run gets its own pair of events around it, recorded back to back without host
synchronization. So that the events measure GPU time, not the host's time to enqueue the next
launch (Python launches of short kernels can take longer than the kernels), a one-thread kernel
first holds the stream for longer than the host needs to enqueue every timed run: when it ends,
the timed runs execute back to back from a full queue. Runs cycle
through `rotate` input sets whose total size exceeds the L2 cache, so a run does not find the
previous run's operands already in L2 (what a kernel inside a real model would see).
"""
from __future__ import annotations

import ctypes
import functools
import statistics
import time
from dataclasses import dataclass
from typing import Callable

from ..runtime.device import check

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


_HOLD_SOURCE = """\
// Spins for `cycles` SM clocks: holds a stream while the host enqueues the timed runs.
extern "C" __global__ void kgen_hold(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}
"""
MAX_HOLD_S = 0.5


@functools.lru_cache(maxsize=None)
def _hold_function(device_id: int):
    """The loaded hold kernel and the SM clock (Hz) of device `device_id`."""
    from cuda.bindings import driver
    from cuda.core import ObjectCode

    from ..runtime.device import device_info
    from ..runtime.nvrtc import compile_cubin

    result = compile_cubin(_HOLD_SOURCE, "kgen_hold", device_info(device_id).arch)
    code = ObjectCode.from_cubin(result.cubin, name="kgen_hold")
    kernel = code.get_kernel("kgen_hold")
    function = check(driver.cuKernelGetFunction(kernel.handle), "cuKernelGetFunction")
    device = check(driver.cuDeviceGet(device_id), "cuDeviceGet")
    khz = check(driver.cuDeviceGetAttribute(
        driver.CUdevice_attribute.CU_DEVICE_ATTRIBUTE_CLOCK_RATE, device), "clock rate")
    return code, kernel, function, int(khz) * 1000


def hold_stream(stream: int, seconds: float) -> None:
    """Enqueue a kernel that keeps `stream` busy for about `seconds` (at most MAX_HOLD_S)."""
    from cuda.bindings import driver

    from ..runtime.device import current_device_id

    _, _, function, hz = _hold_function(current_device_id())
    cycles = (ctypes.c_longlong * 1)(int(min(seconds, MAX_HOLD_S) * hz))
    args = (ctypes.c_void_p * 1)(ctypes.addressof(cycles))
    (err,) = driver.cuLaunchKernel(function, 1, 1, 1, 1, 1, 1, 0, driver.CUstream(stream),
                                   ctypes.addressof(args), 0)
    check((err,), "launching the hold kernel")


def time_kernel(fn: Callable[[int], None], *, warmup: int = DEFAULT_WARMUP,
                iters: int = DEFAULT_ITERS, rotate: int = 1, stream: int = 0,
                hold: bool = True) -> Timing:
    """Time `fn(i)`, which enqueues work using input set `i % rotate` on `stream` (a raw
    CUstream handle; 0 is the legacy default stream). Returns per-run GPU times. `hold`: hold
    the stream first (see the module's note), sized from the host's time per warm-up call."""
    from cuda.bindings import driver

    if iters < 1:
        raise ValueError("iters must be at least 1")
    rotate = max(1, rotate)
    handle = driver.CUstream(stream)
    start = time.perf_counter()
    for i in range(warmup):
        fn(i % rotate)
    per_call = (time.perf_counter() - start) / max(warmup, 1)
    if hold:
        check(driver.cuStreamSynchronize(handle), "synchronizing before the hold")
        hold_stream(stream, 3 * iters * per_call + 0.002)
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


def call_median_ms(fn: Callable[[], object], reps: int = 30, warmups: int = 3) -> float:
    """Median milliseconds of a Python call `fn()` between two torch CUDA events on the current
    stream (the call's host preparation inside, as a user sees it), after `warmups` calls."""
    import torch

    for _ in range(warmups):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
