"""Fixtures of the tune tests: NVRTC stood in (where the compile is not the point), and a
private tune cache in a temporary folder."""
from __future__ import annotations

import pytest

from kgen.tune import tuner
from kgen.tune.compile import Compiled


@pytest.fixture
def fake_compile(monkeypatch):
    """NVRTC stood in: every job compiles to `cubin <index>`, with `spill` spilling."""
    spill: set[int] = set()
    jobs_seen = []

    def compile_all(jobs, *, workers=None, done=None):
        jobs_seen.extend(jobs)
        out = {}
        for job in jobs:
            out[job.index] = Compiled(job.index, cubin=f"cubin {job.index}".encode(),
                                      registers=128, seconds=0.5,
                                      spill_stores=64 if job.index in spill else 0)
            if done:
                done(out[job.index])
        return out

    monkeypatch.setattr(tuner, "compile_all", compile_all)
    return spill, jobs_seen


@pytest.fixture
def tune_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KGEN_CACHE", raising=False)
