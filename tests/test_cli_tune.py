"""`kgen tune` on the command line without a GPU: --help, --compile-only (the parallel compile,
table and JSON), the clean failure without a GPU, bad input (exit 2), --plot without
matplotlib (exit 1)."""
from __future__ import annotations

import importlib.util
import json

import pytest
from click.testing import CliRunner

from kgen.cli import cli

from .conftest import cuda_device_usable
from .tune.helpers import example_text


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def free_gemm(tmp_path):
    path = tmp_path / "gemm_free.kg"
    path.write_text(example_text("gemm"))
    return path


def test_help_lists_the_options():
    result = invoke("tune", "--help")
    assert result.exit_code == 0
    for option in ("--size", "--arch", "--budget", "--write", "--json", "--all-lines",
                   "--compile-only", "--limit", "--plot", "--workers"):
        assert option in result.output
    assert "tune" in invoke("--help").output


def test_compile_only_compiles_the_candidates_in_parallel(free_gemm, cache_dir):
    result = invoke("tune", str(free_gemm), "--size", "M=512,N=512,K=512", "--arch", "sm_90a",
                    "--compile-only", "--limit", "3", "--workers", "2", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["device"] is None and document["winner"] is None
    assert document["compile"]["workers"] == 2 and document["compile"]["compiled"] == 3
    assert document["compile_arch"] == "sm_90a"
    assert len(document["candidates"]) == 3
    assert sum(c["default"] for c in document["candidates"]) == 1
    assert all(c["registers"] for c in document["candidates"])
    assert document["sizes"] == {"M": 512, "K": 512, "N": 512}
    assert {s["step"] for s in document["skipped"]} == {"limit"}


def test_compile_only_prints_a_table(free_gemm, cache_dir):
    result = invoke("tune", str(free_gemm), "--arch", "sm_90a", "--compile-only", "--limit",
                    "2", "-v")
    assert result.exit_code == 0, result.output
    assert "builder's choice" in result.stdout
    assert "compile: 2 candidates in" in result.stdout
    assert "past --limit 2" in result.stdout


@pytest.mark.skipif(cuda_device_usable(), reason="a GPU is present")
def test_without_a_gpu_tune_fails_cleanly(free_gemm):
    result = invoke("tune", str(free_gemm), "--size", "M=256")
    assert result.exit_code == 1
    assert [line for line in result.output.splitlines() if line.strip()] == [
        "error: no CUDA GPU is available: kgen tune times the candidates on one "
        "(--compile-only enumerates and compiles them without)"]


@pytest.mark.parametrize("args, message", [
    (("--size", "Q=4"), "error: unknown size 'Q'; gemm_bf16's sizes are M, K, N"),
    (("--size", "M=-4"), "error: --size expects NAME=VALUE[,NAME=VALUE...], got 'M=-4'"),
    (("--budget", "0"), "error: --budget must be positive, got 0"),
    (("--limit", "0"), "error: --limit must be at least 1, got 0"),
    (("--write", "--compile-only"), "error: --write and --plot need the timing; drop "
                                    "--compile-only"),
    (("--write", "--arch", "sm_90a"), "targets sm_80, not sm_90a"),
])
def test_bad_input_exits_2_with_one_message(free_gemm, args, message):
    result = invoke("tune", str(free_gemm), *args)
    assert result.exit_code == 2
    assert message in result.output
    assert "Traceback" not in result.output


def test_a_file_that_does_not_parse_gets_a_located_message(tmp_path):
    path = tmp_path / "bad.kg"
    path.write_text("kernel k {\n  target sm_80\n  tensor A : f16[M, K] rowx\n}\n")
    result = invoke("tune", str(path), "--compile-only")
    assert result.exit_code == 2
    assert result.output.startswith(f"{path}:3:")


def test_plot_without_matplotlib_is_an_environment_error(free_gemm, monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else real(name, *a))
    result = invoke("tune", str(free_gemm), "--plot", str(tmp_path / "c.png"))
    assert result.exit_code == 1
    assert "--plot needs matplotlib: pip install 'kgen[plot]'" in result.output


def test_run_plot_needs_bench(free_gemm, tmp_path):
    result = invoke("run", str(free_gemm), "--plot", str(tmp_path / "r.png"))
    assert result.exit_code == 2
    assert "error: --plot draws the timing: add --bench" in result.output


def test_inspect_plans_with_the_tuned_schedule_of_a_named_gpu(free_gemm, tmp_path,
                                                              monkeypatch):
    from kgen.enums import Arch
    from kgen.targets import Config, GemmConfig
    from kgen.tune import cache

    from .tune.helpers import kernel_of

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KGEN_CACHE", raising=False)
    config = Config((GemmConfig((64, 64, 64), (2, 2), 4),), why="test")
    sizes = {"M": 2048, "N": 2048, "K": 2048}
    key = cache.tune_key(kernel_of(free_gemm.read_text()), Arch.SM80, "NVIDIA H200", sizes)
    assert cache.store(cache.TuneEntry(key, config, config.label, (), 0.1, None,
                                       tuple(sorted(sizes.items())), 3, "2026-11-30T00:00:00"))
    result = invoke("inspect", str(free_gemm), "--size", "M=2000,N=2048,K=2048", "--gpu",
                    "NVIDIA H200", "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)["kernels"][0]
    assert summary["tuning"].startswith("schedule: tuned by kgen tune on 2026-11-30 "
                                        "(64x64x64 w2x2 s4")
    text = invoke("inspect", str(free_gemm), "--size", "M=2000,N=2048,K=2048", "--gpu",
                  "NVIDIA H200").stdout
    assert "tuned: the fastest `kgen tune` timed" in text
    other = json.loads(invoke("inspect", str(free_gemm), "--size", "M=64", "--gpu",
                              "NVIDIA H200", "--json").stdout)["kernels"][0]
    assert other["tuning"].startswith("schedule: kgen's builder filled")
    plain = json.loads(invoke("inspect", str(free_gemm), "--json").stdout)["kernels"][0]
    assert "tuning" not in plain
    assert invoke("inspect", str(free_gemm), "--gpu", "X").exit_code == 2
