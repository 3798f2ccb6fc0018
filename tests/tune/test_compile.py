"""The parallel compile: NVRTC in spawned worker processes, no GPU, zero spills for the
candidates of an example; NVRTC's errors come back as results."""
from __future__ import annotations

import pytest

from kgen.enums import Arch
from kgen.tune.compile import Job, compile_all, compile_job
from kgen.tune.space import search_space

from .helpers import SIZES, example_text, kernel_of


@pytest.mark.slow
def test_candidates_compile_in_parallel_without_spills(cache_dir):
    space = search_space(kernel_of(example_text("gemm_bias_relu")), Arch.SM90A, SIZES, limit=3)
    jobs = [Job(c.index, c.source, c.plan.name, "sm_90a") for c in space.candidates]
    finished = []
    results = compile_all(jobs, workers=2, done=lambda r: finished.append(r.index))
    assert sorted(finished) == sorted(results) == sorted(j.index for j in jobs)
    for result in results.values():
        assert result.ok, result.error
        assert result.cubin[:4] == b"\x7fELF"
        assert result.registers and not result.local_memory
        assert not result.cached
    again = compile_all(jobs, workers=1)  # the shared cubin cache, inline this time
    assert all(r.cached and r.cubin == results[i].cubin for i, r in again.items())


def test_an_nvrtc_error_is_a_result_not_an_exception(cache_dir):
    result = compile_job(Job(7, 'extern "C" __global__ void k() { nope; }', "k", "sm_80"))
    assert result.index == 7 and not result.ok
    assert "could not compile k" in result.error and result.cubin == b""


def test_local_memory_reasons():
    from kgen.tune.compile import Compiled

    assert Compiled(0, spill_stores=8, spill_loads=4).local_memory == \
        "spills 8 B stores, 4 B loads"
    assert Compiled(0, stack_bytes=16).local_memory == "a 16 B stack frame"
    assert Compiled(0).local_memory == ""


def test_dead_workers_fall_back_to_this_process(monkeypatch, cache_dir):
    import concurrent.futures

    import pytest

    from kgen.tune import compile as tune_compile

    class Dying:
        def __init__(self, *args, **kwargs):
            pass

        def __enter__(self):
            raise concurrent.futures.process.BrokenProcessPool("a worker died")

        def __exit__(self, *exc):
            return False

    monkeypatch.setattr(tune_compile.concurrent.futures, "ProcessPoolExecutor", Dying)
    source = 'extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }'
    jobs = [Job(i, source.replace("1;", f"{i};"), "k", "sm_80") for i in range(2)]
    with pytest.warns(tune_compile.KgenTuneWarning, match="needs an `if __name__"):
        results = tune_compile.compile_all(jobs, workers=2)
    assert sorted(results) == [0, 1] and all(r.ok for r in results.values())


def test_default_workers_are_the_cores_this_process_may_use():
    import os

    from kgen.tune.compile import default_workers

    expected = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count()
    assert default_workers() == expected >= 1


@pytest.mark.slow
def test_a_candidate_compiles_its_fast_entry_point_alone(cache_dir):
    """Job.narrow_kernel: the narrow entry point stays out of the tuner's compile (a timed
    launch that needs it compiles it then); without it the module holds both."""
    candidate = search_space(kernel_of(example_text("gemm_bias_relu")), Arch.SM90A, SIZES,
                             limit=1).candidates[0]
    narrow = candidate.plan.narrow_kernel
    fast = compile_job(Job(0, candidate.source, candidate.plan.name, "sm_90a",
                           narrow_kernel=narrow))
    whole = compile_job(Job(1, candidate.source, candidate.plan.name, "sm_90a"))
    assert fast.ok and whole.ok
    assert f"'{narrow}'" not in fast.log and f"'{narrow}'" in whole.log
