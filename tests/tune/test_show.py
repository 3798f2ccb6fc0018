"""What `kgen tune` prints: the table (fastest first, the winner and the builder's choice
marked), failed checks in the open, the summary; the progress bars."""
from __future__ import annotations

import io

from rich.console import Console

from kgen.enums import Arch
from kgen.tune import tuner
from kgen.tune.show import RichProgress, print_tune_report

from .helpers import SIZES, FakeBench, example_text, kernel_of


def shown(report, verbose=False) -> str:
    console = Console(record=True, width=200)
    print_tune_report(console, report, verbose)
    return console.export_text()


def test_the_table_and_summary(fake_compile, tune_cache):
    bench = FakeBench(times={"64x128x64 w2x2 s4": 1.0, "128x128x64 w2x2 s4": 0.9},
                      failing={"128x128x64 w2x2 s4"})
    report = tuner.tune(kernel_of(example_text("gemm")), Arch.SM80, SIZES, bench=bench,
                        limit=6)
    text = shown(report)
    lines = text.splitlines()
    first = next(i for i, line in enumerate(lines) if "128x128x64 w2x2 s4" in line)
    second = next(i for i, line in enumerate(lines) if "64x128x64 w2x2 s4" in line)
    assert first < second  # fastest first
    assert "check" in lines[first] and "winner" in lines[second]
    assert "(builder's choice)" in text and "x best" in text and "TFLOP/s" in text
    assert "CHECK FAILED 128x128x64 w2x2 s4: D: 12 bad, 0 unwritten (not taken)" in text
    assert "winner 64x128x64 w2x2 s4: 1.0000 ms" in text
    assert "the builder's choice; checked against the reference" in text
    assert "its lines: mma0 tile 64x128x64  mma0 warps 2x2  mma0 stages 4" in text
    assert "cached: " in text and "timing: 6 timed" in text
    assert "(-v lists them)" in text
    assert "past --limit 6" in shown(report, verbose=True)


def test_a_choice_kept_within_the_noise_says_so(fake_compile, tune_cache):
    k = kernel_of(example_text("gemm"))
    default = tuner.search_space(k, Arch.SM80, SIZES, limit=6).candidates[0].label
    bench = FakeBench(times={default: 2.0, "64x128x64 w2x2 s4": 1.99})
    text = shown(tuner.tune(k, Arch.SM80, SIZES, bench=bench, limit=6))
    assert (f"kept the builder's choice: 64x128x64 w2x2 s4 ran 0.5% faster, within the noise "
            "(1.0%)") in text
    assert f"winner {default}: 2.0000 ms" in text


def test_nothing_ran(fake_compile, tune_cache):
    labels = [c.label for c in tuner.search_space(kernel_of(example_text("gemm")), Arch.SM80,
                                                  SIZES, limit=2).candidates]
    report = tuner.tune(kernel_of(example_text("gemm")), Arch.SM80, SIZES,
                        bench=FakeBench(unrunnable=labels), limit=2)
    assert "no candidate ran on this GPU (-v says why): nothing is cached" in shown(report)


def test_progress_bars_count_the_steps():
    out = io.StringIO()
    with RichProgress(Console(file=out, width=120)) as progress:
        progress.phase("compile", 2)
        progress.step("compile", "a")
        progress.step("compile", "b")
    assert "compiling with NVRTC" in out.getvalue()
    assert "2/2" in out.getvalue()


def test_one_candidate_says_how_to_search_more(fake_compile, tune_cache):
    report = tuner.tune(kernel_of(example_text("gemm", stripped=False)), Arch.SM80, SIZES,
                        bench=FakeBench())
    assert len(report.rows) == 1
    assert "one candidate: the source writes the schedule lines" in shown(report)


def test_the_winners_lines_read_as_the_source_would():
    """A line that holds its whole setting (split, keep, resident) is not named twice."""
    from kgen.tune.show import _shown

    assert _shown("g split", "split stream") == "g split stream"
    assert _shown("g0 split", "split 4") == "g0 split 4"
    assert _shown("g0 keep", "keep A in registers") == "g0 keep A in registers"
    assert _shown("mma0 tile", "64x128x64") == "mma0 tile 64x128x64"
    assert _shown("schedule", "pingpong") == "schedule pingpong"
