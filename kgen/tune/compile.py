"""Compile `kgen tune`'s candidates with NVRTC in parallel processes (NVRTC needs no GPU; one
process per CPU core), through the shared content-keyed cubin cache.

Workers are spawned, not forked: the parent may hold a CUDA context, which a forked child must
not touch. Each worker compiles one source and returns its cubin and ptxas' report.
"""
from __future__ import annotations

import concurrent.futures
import multiprocessing
import os
import time
import warnings
from dataclasses import dataclass
from typing import Callable, Sequence

from ..errors import KgenRuntimeError


@dataclass(frozen=True, slots=True)
class Job:
    index: int
    source: str
    name: str  # the kernel's name in the source
    arch: str  # NVRTC's arch: sm_80, sm_90a
    # the kernel's narrow entry point, left out of the compile (nvrtc.fast_entry_options): it
    # compiles when a timed launch needs it (CompiledKernel)
    narrow_kernel: str | None = None


@dataclass(frozen=True, slots=True)
class Compiled:
    """One job's result: the cubin and ptxas' report, or NVRTC's error."""

    index: int
    cubin: bytes = b""
    registers: int | None = None
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    seconds: float = 0.0
    cached: bool = False
    log: str = ""
    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error

    @property
    def local_memory(self) -> str:
        """Why ptxas' report rules the candidate out (spills or a stack frame), or ""."""
        found = []
        if self.spill_stores or self.spill_loads:
            found.append(f"spills {self.spill_stores} B stores, {self.spill_loads} B loads")
        if self.stack_bytes:
            found.append(f"a {self.stack_bytes} B stack frame")
        return " and ".join(found)


def compile_job(job: Job) -> Compiled:
    """Compile one job (in a worker process, or inline)."""
    from ..runtime.nvrtc import compile_cubin, fast_entry_options

    started = time.perf_counter()
    try:
        result = compile_cubin(job.source, job.name, job.arch,
                               extra_options=fast_entry_options(job.narrow_kernel))
    except KgenRuntimeError as err:
        return Compiled(job.index, seconds=time.perf_counter() - started, error=str(err))
    return Compiled(job.index, cubin=result.cubin, registers=result.registers,
                    spill_stores=result.spill_stores, spill_loads=result.spill_loads,
                    stack_bytes=result.stack_bytes, seconds=result.seconds,
                    cached=result.cached, log=result.log)


def default_workers() -> int:
    """The CPU cores this process may run on (its affinity mask where the OS has one: a
    container's share, not the host's count)."""
    if hasattr(os, "sched_getaffinity"):
        return max(len(os.sched_getaffinity(0)), 1)
    return os.cpu_count() or 1


def compile_all(jobs: Sequence[Job], *, workers: int | None = None,
                done: Callable[[Compiled], None] | None = None) -> dict[int, Compiled]:
    """Every job's result by index; `done` is called as each finishes. `workers` processes
    (default one per CPU core); 1 compiles in this process."""
    workers = min(workers or default_workers(), max(len(jobs), 1))
    results: dict[int, Compiled] = {}
    if workers <= 1:
        for job in jobs:
            results[job.index] = compile_job(job)
            if done:
                done(results[job.index])
        return results
    context = multiprocessing.get_context("spawn")
    try:
        with concurrent.futures.ProcessPoolExecutor(max_workers=workers,
                                                    mp_context=context) as pool:
            futures = [pool.submit(compile_job, job) for job in jobs]
            for future in concurrent.futures.as_completed(futures):
                result = future.result()
                results[result.index] = result
                if done:
                    done(result)
    except concurrent.futures.process.BrokenProcessPool:
        # A spawned worker re-imports the main script; one without an
        # `if __name__ == "__main__":` guard kills it. Compile the rest here.
        warnings.warn("the compile workers died (a script that calls kgen's tuner needs an "
                      "`if __name__ == '__main__':` guard); compiling in this process",
                      KgenTuneWarning, stacklevel=2)
        for job in jobs:
            if job.index not in results:
                results[job.index] = compile_job(job)
                if done:
                    done(results[job.index])
    return results


class KgenTuneWarning(UserWarning):
    """The tuner fell back to a slower path."""
