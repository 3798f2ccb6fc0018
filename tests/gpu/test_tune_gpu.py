"""`kgen tune` on a GPU: a small GEMM tuned within a budget, the winner checked and cached;
`kgen run` and `kgen.load` then use it; --write leaves a file that plans to the winner; the 60 s
bound on 50 candidates."""
from __future__ import annotations

import json
import time

import numpy as np
import pytest
from click.testing import CliRunner

from kgen.cli import cli

from ..tune.helpers import example_text

pytestmark = pytest.mark.gpu


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.fixture
def tune_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KGEN_CACHE", raising=False)


@pytest.fixture
def free_gemm(tmp_path):
    path = tmp_path / "gemm_free.kg"
    path.write_text(example_text("gemm_bias_relu"))
    return path


def test_tune_then_run_uses_the_winner(free_gemm, tune_cache):
    sizes = "M=1024,N=1024,K=512"
    result = invoke("tune", str(free_gemm), "--size", sizes, "--limit", "8", "--budget", "60",
                    "--iters", "10", "--json")
    assert result.exit_code == 0, result.output
    tuned = json.loads(result.stdout)
    winner = tuned["winner"]
    assert winner is not None and winner["time_ms"] > 0
    assert tuned["failed_checks"] == []
    assert tuned["cache"]["path"] and tuned["timing"]["timed"] >= 1
    assert tuned["device"] and tuned["speedup_vs_default"] > 0

    run = invoke("run", str(free_gemm), "--size", sizes, "--json")
    assert run.exit_code == 0, run.output
    report = json.loads(run.stdout)
    assert report["ok"] is True
    assert report["schedule"]["entry"]["label"] == winner["label"]
    assert report["schedule"]["tuned"] is True or winner["default"]
    assert report["notes"][0].startswith("schedule: tuned by kgen tune")
    untuned = json.loads(invoke("run", str(free_gemm), "--size", sizes, "--no-tuned",
                                "--json").stdout)
    assert untuned["schedule"]["entry"] is None and untuned["schedule"]["tuned"] is False


def test_load_runs_the_tuned_variant_of_its_bucket(free_gemm, tune_cache):
    torch = pytest.importorskip("torch")
    import kgen
    from kgen.tune.select import TunedKernel, tuned

    assert invoke("tune", str(free_gemm), "--size", "M=512,N=512,K=512", "--limit", "6",
                  "--iters", "5").exit_code == 0
    k = kgen.load(free_gemm)
    assert isinstance(k, TunedKernel)
    variant = k.variant({"M": 512, "N": 512, "K": 512})
    assert tuned(variant.plan) or variant is k.default
    a = torch.randn(512, 512, device="cuda", dtype=torch.float16) / 16
    b = torch.randn(512, 512, device="cuda", dtype=torch.float16).t().contiguous().t()
    c = torch.randn(512, 512, device="cuda", dtype=torch.float16)
    bias = torch.rand(512, device="cuda", dtype=torch.float32)
    d = k(A=a, B=b, C=c, bias=bias, alpha=1.5, beta=0.5)
    want = torch.relu(1.5 * (a.float() @ b.float()) + 0.5 * c.float() + bias)
    assert torch.allclose(d.float(), want, atol=3e-2, rtol=3e-2)
    assert k.variant({"M": 4096, "N": 512, "K": 512}) is k.default  # another bucket


def test_write_then_compile_is_the_tuned_kernel(free_gemm, tune_cache, tmp_path):
    before = free_gemm.read_text()
    result = invoke("tune", str(free_gemm), "--size", "M=1024,N=1024,K=1024", "--limit", "5",
                    "--iters", "5", "--write", "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["written"] == str(free_gemm)
    after = free_gemm.read_text()
    assert all(line in after.splitlines() for line in before.splitlines())
    for line, value in document["winner"]["lines"]:
        assert value in after
    assert invoke("compile", str(free_gemm), "-o", str(tmp_path / "out.cu")).exit_code == 0


def test_fifty_candidates_within_a_minute(free_gemm, tune_cache):
    started = time.perf_counter()
    result = invoke("tune", str(free_gemm), "--arch", "sm_90a", "--size",
                    "M=4096,N=4096,K=4096", "--limit", "50", "--json")
    seconds = time.perf_counter() - started
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert len(document["candidates"]) <= 50
    assert seconds <= 60, f"kgen tune took {seconds:.1f} s"
    assert np.isfinite(document["winner"]["time_ms"])
