"""bench/train_step.py (issue 52's training step) on the CPU: `--help` without a GPU, its
arguments, the model and training loop at a tiny size (the same attention twice gives the same
curve; another attention of the same meaning a close one, a wrong one a far one), and the table,
curve and verdict from made-up results. The timed runs need a GPU."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from bench import train_step as bench  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TINY = bench.Config(layers=1, d_model=32, heads=2, mlp=2, seq=16, batch=2, vocab=64, warmup=2)


def test_help_runs_without_a_gpu():
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="")
    done = subprocess.run([sys.executable, "bench/train_step.py", "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "--steps" in done.stdout and "--quick" in done.stdout and "--json" in done.stdout


def test_the_arguments():
    assert bench.parse([]).steps == 300 and bench.parse([]).runs == list(bench.RUNS)
    assert bench.parse(["--quick"]).steps == 8
    assert bench.parse(["--compile", "--runs", "kgen"]).runs == ["kgen", *bench.COMPILED]
    with pytest.raises(SystemExit):
        bench.parse(["--steps", "1"])
    with pytest.raises(SystemExit):
        bench.parse(["--runs", "sdpa_fast"])


def test_main_says_it_needs_a_gpu(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert bench.main(["--quick"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def _float64_attention(q, k, v):
    s = (q.double() @ k.double().transpose(-1, -2)) / q.shape[-1] ** 0.5
    s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool).triu(1), float("-inf"))
    return (s.softmax(-1) @ v.double()).to(q.dtype)


def _not_causal(q, k, v):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v)


def test_the_same_weights_and_data_give_the_same_curve_and_another_attention_a_close_one():
    device = torch.device("cpu")
    state, data = bench.initial_state(TINY, device), bench.batches(TINY, 6, device)
    assert torch.equal(data[:, :, :8], data[:, :, 8:])  # a random half, repeated
    first, times = bench.train(TINY, bench.sdpa, state, data)
    again, _ = bench.train(TINY, bench.sdpa, state, data)
    close, _ = bench.train(TINY, _float64_attention, state, data)
    wrong, _ = bench.train(TINY, _not_causal, state, data)
    assert len(first) == 6 and times == []  # no CUDA events on the CPU
    assert first == again
    assert 0 < bench.compare(close, first)[0] < 2e-3
    assert bench.compare(wrong, first)[0] > 10 * bench.compare(close, first)[0]


def test_the_attention_share_of_the_flops():
    attention, total = bench.flops(TINY)
    # causal attention forward 2 * B * H * S^2 * D, 3.5x with its backward; matmuls 6 * tokens
    # * weights (4 d^2 + 2 * mlp * d^2 per layer, d * vocab for the head)
    assert attention == 3.5 * 2 * 2 * 2 * 16 ** 2 * 16
    assert total - attention == 6 * 32 * (8 * 32 * 32 + 32 * 64)


def _results(noise=0.01, kgen=0.02):
    ref = [5.0, 4.0, 3.0, 2.0]
    return {"sdpa_flash": {"losses": ref, "times": [9.0, 2.0, 2.0, 4.0]},
            "sdpa_math": {"losses": [x + noise for x in ref], "times": [9.0, 6.0, 6.0, 6.0]},
            "kgen": {"losses": ref[:3] + [ref[3] - kgen], "times": [9.0, 1.0, 1.0, 3.0]},
            "sdpa_cudnn": {"error": "RuntimeError: no kernel"}}


def test_the_summary_times_after_the_warm_up_and_compares_with_flash():
    rows = bench.summarize(_results(), warm_up=1)
    assert rows["sdpa_flash"] == {"ms": 2.0, "loss_first": 5.0, "loss_last": 2.0}
    assert rows["kgen"]["ms"] == 1.0
    assert rows["kgen"]["max_diff"] == pytest.approx(0.02)
    assert rows["sdpa_math"]["end_diff"] == pytest.approx(0.01)
    assert rows["sdpa_cudnn"] == {"error": "RuntimeError: no kernel"}


def test_the_verdict_is_within_a_small_multiple_of_the_noise_band():
    ratio, line = bench.verdict(bench.summarize(_results(0.01, 0.02), 1))
    assert ratio == pytest.approx(2.0) and line.endswith("(limit 3x): within")
    ratio, line = bench.verdict(bench.summarize(_results(0.01, 0.05), 1))
    assert ratio == pytest.approx(5.0) and line.endswith("OUTSIDE")
    ratio, line = bench.verdict(bench.summarize({"kgen": _results()["kgen"]}, 1))
    assert ratio is None and line.startswith("# no verdict")


def test_the_table_and_the_curve():
    results = _results()
    lines = bench.table(bench.summarize(results, 1))
    assert lines[0].split() == ["run", "ms/step", "x", "sdpa_flash", "loss[0]", "loss[end]",
                                "max|diff|", "|diff|", "end"]
    assert lines[1].split() == ["sdpa_flash", "2.00", "1.000", "5.0000", "2.0000", "-", "-"]
    assert lines[3].split() == ["kgen", "1.00", "0.500", "5.0000", "1.9800", "0.0200", "0.0200"]
    assert lines[4] == f"{'sdpa_cudnn':20s} failed: RuntimeError: no kernel"
    curve = bench.curve(results, points=3)
    assert curve[0].split() == ["step", "sdpa_flash", "sdpa_math", "kgen"]
    assert [line.split()[0] for line in curve[1:]] == ["0", "2", "3"]  # first and last steps
    assert curve[-1].split() == ["3", "2.0000", "2.0100", "1.9800"]
