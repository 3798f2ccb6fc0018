"""The tuner's steps with a stand-in for the GPU (the compile too, where NVRTC is not the
point): the builder's choice timed first, the budget, the final round, the winner's check and
the next one when it fails, candidates that spill or cannot run left out, the cache entry."""
from __future__ import annotations

import json

import pytest

from kgen.enums import Arch
from kgen.errors import KgenRuntimeError
from kgen.tune import cache, tuner
from kgen.tune.codec import config_from_json
from kgen.tune.compile import Compiled

from .helpers import SIZES, FakeBench, example_text, kernel_of


def kernel():
    return kernel_of(example_text("gemm"))


def test_the_fastest_checked_candidate_wins_and_is_cached(fake_compile, tune_cache):
    k = kernel()
    bench = FakeBench(times={"64x128x64 w2x2 s4": 1.0})
    report = tuner.tune(k, Arch.SM80, SIZES, bench=bench, limit=8)
    assert report.winner.candidate.label == "64x128x64 w2x2 s4"
    assert report.winner.candidate.default is False
    default = report.default_row.candidate.label
    # the builder's choice first: run for WARM_S of its own time (2 ms x 30 runs a timing),
    # its timings thrown away, then timed
    warm = -(-tuner.WARM_S // (2.0 * 30 / 1e3))
    assert bench.timed[:int(warm) + 1] == [default] * (int(warm) + 1)
    assert len(report.timed_rows) == len(report.rows) == 8
    assert bench.checked == ["64x128x64 w2x2 s4"]
    assert report.speedup == pytest.approx(report.default_row.ms / 1.0)
    # the final round re-timed the three fastest twice more each (the builder's choice among them)
    assert len(bench.timed) == warm + 8 + 3 * tuner.ROUNDS
    assert default in bench.timed[-3:]
    assert report.compile_arch == "sm_90a"
    assert {job.arch for job in fake_compile[1]} == {"sm_90a"}
    entry = cache.lookup(cache.tune_key(k, Arch.SM80, "Fake GPU 80GB", SIZES))
    assert entry is not None and report.cache_path
    assert entry.config == report.winner.candidate.config
    assert entry.lines == report.winner.candidate.line_values
    assert entry.candidates == 8 and entry.time_ms == 1.0
    document = json.loads(json.dumps(report.as_dict()))
    assert document["winner"]["label"] == "64x128x64 w2x2 s4"
    assert config_from_json(document["winner"]["config"]) == report.winner.candidate.config
    assert document["cache"]["key"]["gpu"] == "Fake GPU 80GB"
    assert document["timing"]["timed"] == 8


def test_the_builders_choice_is_timed_again_beside_the_fastest(fake_compile, tune_cache):
    # the builder's choice timed slow at first (the GPU's clocks still rising, say) is timed
    # again in the final rounds beside the three fastest, and wins where it is faster there
    class Warming(FakeBench):
        def time(self, loaded, iters):
            timing = super().time(loaded, iters)
            if not loaded.default:
                return timing
            ms = 5.0 if len(set(self.timed)) < 8 else 0.5  # slow until all 8 were timed once
            return timing.__class__(ms, ms, ms, iters, 1, (ms,) * iters)

    bench = Warming(times={"64x128x64 w2x2 s4": 1.0})
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=bench, limit=8)
    default = report.default_row
    assert default.timing.median_ms == 5.0  # slowest of the first pass
    assert len(default.final_samples) == tuner.ROUNDS * 30
    assert report.winner is default


@pytest.mark.parametrize("gain, wins", [(0.005, False), (0.02, True)])
def test_a_candidate_must_beat_the_builders_choice_by_more_than_the_noise(
        fake_compile, tune_cache, gain, wins):
    k = kernel()
    default = tuner.search_space(k, Arch.SM80, SIZES, limit=8).candidates[0].label
    bench = FakeBench(times={default: 2.0, "64x128x64 w2x2 s4": 2.0 * (1 - gain)})
    report = tuner.tune(k, Arch.SM80, SIZES, bench=bench, limit=8)
    assert report.winner.candidate.label == ("64x128x64 w2x2 s4" if wins else default)
    noise = report.as_dict()["within_noise"]
    if wins:
        assert report.within_noise is None and noise is None
    else:
        assert noise["label"] == "64x128x64 w2x2 s4"
        assert noise["gain"] == pytest.approx(gain) and noise["margin"] == tuner.MIN_GAIN


def test_the_builders_choice_keeps_its_place_within_its_own_spread(fake_compile, tune_cache):
    # the builder's choice's two final rounds lie 4% apart: a candidate 2% faster is noise
    class Spread(FakeBench):
        def time(self, loaded, iters):
            timing = super().time(loaded, iters)
            if not loaded.default or len(set(self.timed)) < 8:  # the final rounds only
                return timing
            ms = 2.0 if self.timed.count(loaded.label) % 2 else 2.08
            return timing.__class__(ms, ms, ms, iters, 1, (ms,) * iters)

    bench = Spread(times={"64x128x64 w2x2 s4": 1.99})
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=bench, limit=8)
    assert report.default_row.spread == pytest.approx(0.04)
    assert report.winner is report.default_row


def test_a_winner_that_fails_its_check_gives_way(fake_compile, tune_cache):
    bench = FakeBench(times={"64x128x64 w2x2 s4": 1.0, "64x64x64 w2x2 s4": 1.1},
                      failing={"64x128x64 w2x2 s4"})
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=bench, limit=12)
    assert report.winner.candidate.label == "64x64x64 w2x2 s4"
    assert report.failed_checks == [("64x128x64 w2x2 s4", "D: 12 bad, 0 unwritten")]
    assert bench.checked == ["64x128x64 w2x2 s4", "64x64x64 w2x2 s4"]
    assert report.as_dict()["failed_checks"][0]["label"] == "64x128x64 w2x2 s4"


def test_no_candidate_passing_means_no_winner_and_no_entry(fake_compile, tune_cache):
    labels = [c.label for c in tuner.search_space(kernel(), Arch.SM80, SIZES, limit=3)
              .candidates]
    bench = FakeBench(failing=labels)
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=bench, limit=3)
    assert report.winner is None and report.cache_path is None and report.key is None
    assert len(report.failed_checks) == 3


def test_the_budget_stops_timing_but_the_builders_choice_is_timed(fake_compile, tune_cache):
    bench = FakeBench()
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=bench, limit=10, budget=1e-9)
    assert [r.candidate.default for r in report.timed_rows] == [True]
    assert report.untimed == 9
    assert sum(s.step == "budget" for s in report.skipped) == 9
    assert report.winner.candidate.default


def test_spills_and_candidates_that_cannot_run_are_left_out(fake_compile, tune_cache):
    spill, _ = fake_compile
    space = tuner.search_space(kernel(), Arch.SM80, SIZES, limit=5)
    spill.add(space.candidates[1].index)
    bench = FakeBench(times={space.candidates[1].label: 0.1, space.candidates[2].label: 0.2},
                      unrunnable={space.candidates[2].label})
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=bench, limit=5)
    steps = {s.label: (s.step, s.reason) for s in report.skipped}
    assert steps[space.candidates[1].label][0] == "resources"
    assert "spills 64 B stores" in steps[space.candidates[1].label][1]
    assert steps[space.candidates[2].label][0] == "run"
    assert report.winner.candidate.label not in (space.candidates[1].label,
                                                 space.candidates[2].label)
    assert len(report.timed_rows) == 3


def test_compile_only_times_nothing_and_stores_nothing(fake_compile, tune_cache):
    report = tuner.tune(kernel(), Arch.SM90A, SIZES, bench=None, limit=4)
    assert report.device is None and report.winner is None and report.key is None
    assert report.compile_arch == "sm_90a"
    assert len(report.compiled_rows) == 4
    assert report.as_dict()["winner"] is None


def test_no_store_leaves_the_cache_alone(fake_compile, tune_cache):
    k = kernel()
    report = tuner.tune(k, Arch.SM80, SIZES, bench=FakeBench(), limit=2, store=False)
    assert report.winner is not None and report.cache_path is None
    assert cache.lookup(cache.tune_key(k, Arch.SM80, "Fake GPU 80GB", SIZES)) is None


def test_a_compile_error_is_a_skipped_candidate(monkeypatch, tune_cache):
    def compile_all(jobs, *, workers=None, done=None):
        return {job.index: Compiled(job.index, error="NVRTC could not compile")
                if i == 0 else Compiled(job.index, cubin=f"cubin {job.index}".encode())
                for i, job in enumerate(jobs)}

    monkeypatch.setattr(tuner, "compile_all", compile_all)
    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=FakeBench(), limit=3)
    assert [s.step for s in report.skipped if s.step == "compile"] == ["compile"]
    assert len(report.timed_rows) == 2


def test_progress_sees_every_step(fake_compile, tune_cache):
    seen = []

    class Recorder:
        def phase(self, name, total):
            seen.append((name, total))

        def step(self, name, text=""):
            seen.append(name)

    tuner.tune(kernel(), Arch.SM80, SIZES, bench=FakeBench(), limit=4, progress=Recorder())
    assert seen == [("compile", 4)] + ["compile"] * 4 + [("time", 4)] + ["time"] * 4


def test_a_runtime_error_while_loading_skips_the_candidate(fake_compile, tune_cache):
    class Broken(FakeBench):
        def load(self, candidate, compiled):
            if candidate.index == 1:
                raise KgenRuntimeError("launching failed: out of resources")
            return super().load(candidate, compiled)

    report = tuner.tune(kernel(), Arch.SM80, SIZES, bench=Broken(), limit=3)
    assert any(s.step == "run" and "out of resources" in s.reason for s in report.skipped)
    assert len(report.timed_rows) == 2
