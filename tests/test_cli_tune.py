"""`kgen tune` on the command line without a GPU: --help, --compile-only (the parallel compile,
table and JSON), the clean failure without a GPU, bad input (exit 2), --plot without
matplotlib (exit 1)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

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


@pytest.mark.slow
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
    # past the limit; and sm_80's 256x128x64 w4x2, which on sm_90a plans the cooperative
    # kernel its 256x128x64 w2x4 does: the same source, skipped as a duplicate
    steps = {s["step"] for s in document["skipped"]}
    assert "limit" in steps and steps <= {"limit", "duplicate"}


@pytest.mark.slow
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


def test_run_takes_the_tuned_schedule_and_says_so(free_gemm, tmp_path, monkeypatch):
    """`kgen run` with stand-ins for the GPU (device, NVRTC, launch, the run itself): the plan
    it runs has the cached configuration, its first note and --json say so; --plot draws."""
    pytest.importorskip("matplotlib")
    import kgen.cli as cli_module
    import kgen.harness.run as harness_run
    import kgen.runtime.device as device
    import kgen.runtime.launch as launch
    from kgen.enums import Arch
    from kgen.harness.timing import Timing
    from kgen.targets import Config, GemmConfig
    from kgen.tune import cache

    from .tune.helpers import kernel_of

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KGEN_CACHE", raising=False)
    gpu = "NVIDIA H200"
    info = device.DeviceInfo(0, gpu, (9, 0), 132, 60 << 20, 232448, 1980000)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    monkeypatch.setattr(cli_module, "_compile_for_device",
                        lambda built: (type("R", (), {"cubin": b""})(), 0))
    monkeypatch.setattr(launch, "CompiledKernel", lambda plan, cubin, **kwargs: plan)
    planned = []

    def fake_run(kernel, plan, source, sizes, **kwargs):
        planned.append(plan)
        report = harness_run.RunReport(
            kernel=plan.name, plan_arch=plan.arch.value, compile_arch="sm_90a", device=gpu,
            sizes=dict(sizes), scalars={}, seed=0, backend="kgen", compile={},
            flops=2 * 2048 ** 3, bytes=3 * 2048 * 2048 * 2, peak_flops=989e12,
            peak_bandwidth=4.8e12)
        report.timing = Timing(0.05, 0.05, 0.05, 3, 1, (0.05,) * 3)
        return report

    monkeypatch.setattr(harness_run, "run", fake_run)
    config = Config((GemmConfig((64, 128, 64), (2, 2), 3),), why="test")
    sizes = {"M": 2048, "N": 2048, "K": 2048}
    key = cache.tune_key(kernel_of(free_gemm.read_text()), Arch.SM80, gpu, sizes)
    assert cache.store(cache.TuneEntry(key, config, config.label, (), 0.05, None,
                                       tuple(sorted(sizes.items())), 9, "2026-11-30T00:00:00"))
    plot = tmp_path / "roofline.png"
    result = invoke("run", str(free_gemm), "--size", "M=2048,N=2048,K=2048", "--bench",
                    "--plot", str(plot), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert planned[-1].gemms[0].tile == (64, 128, 64)
    assert document["schedule"]["tuned"] is True
    assert document["schedule"]["entry"]["label"] == "64x128x64 w2x2 s3"
    assert ["mma0 tile", "64x128x64"] in document["schedule"]["lines"]
    assert document["notes"][0].startswith("schedule: tuned by kgen tune on 2026-11-30")
    assert plot.read_bytes().startswith(b"\x89PNG") and document["plot"] == str(plot)
    text = invoke("run", str(free_gemm), "--size", "M=2048,N=2048,K=2048", "--no-tuned").stdout
    assert "note: schedule: kgen's builder filled mma0 tile 128x256x64" in text
    assert planned[-1].gemms[0].tile == (128, 256, 64)


@pytest.fixture
def fake_gpu(monkeypatch, tmp_path):
    """`kgen tune` with its GPU part stood in: a GPU is 'there', the bench is tests/tune's
    FakeBench, NVRTC compiles each candidate to a stand-in cubin."""
    import kgen.runtime.device as device
    import kgen.tune.measure as measure
    from kgen.tune import tuner
    from kgen.tune.compile import Compiled

    from .tune.helpers import FakeBench

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KGEN_CACHE", raising=False)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    benches = []

    class Bench(FakeBench):
        def __init__(self, kernel, dims, seed=0, scalars=None):
            super().__init__(times={"64x128x64 w2x2 s4": 1.0})
            self.dims = dict(dims)
            benches.append(self)

    def compile_all(jobs, *, workers=None, done=None):
        return {job.index: Compiled(job.index, cubin=f"cubin {job.index}".encode(),
                                    registers=96) for job in jobs}

    monkeypatch.setattr(measure, "GpuBench", Bench)
    monkeypatch.setattr(tuner, "compile_all", compile_all)
    return benches


def test_tune_writes_plots_and_caches(free_gemm, fake_gpu, tmp_path):
    pytest.importorskip("matplotlib")
    before = free_gemm.read_text()
    plot = tmp_path / "candidates.png"
    result = invoke("tune", str(free_gemm), "--size", "M=4096,N=4096,K=4096", "--limit", "6",
                    "--write", "--plot", str(plot), "--json")
    assert result.exit_code == 0, result.output
    document = json.loads(result.stdout)
    assert document["winner"]["label"] == "64x128x64 w2x2 s4"
    assert document["device"] == "Fake GPU 80GB" and document["cache"]["path"]
    assert document["written"] == str(free_gemm)
    after = free_gemm.read_text()
    assert "    tile 64x128x64  warps 2x2  stages 4\n" in after
    assert after.replace("    tile 64x128x64  warps 2x2  stages 4\n", "") == before
    assert plot.read_bytes().startswith(b"\x89PNG")
    # the written file plans to the winner and has nothing left to tune
    again = invoke("tune", str(free_gemm), "--size", "M=4096,N=4096,K=4096")
    assert again.exit_code == 0
    assert "one candidate" in again.stdout and "winner 128x256x64" not in again.stdout


def test_tune_all_lines_rewrites_the_written_lines(tmp_path, fake_gpu):
    path = tmp_path / "gemm.kg"
    path.write_text(example_text("gemm", stripped=False))
    result = invoke("tune", str(path), "--all-lines", "--limit", "6", "--write")
    assert result.exit_code == 0, result.output
    assert "tile 64x128x64  warps 2x2  stages 4" in path.read_text()
    assert "tile 128x256x64" not in path.read_text()
    assert "wrote the winning lines into" in result.stdout


def test_tune_with_no_passing_candidate_exits_1(free_gemm, fake_gpu, monkeypatch):
    import kgen.tune.measure as measure

    class Failing(measure.GpuBench):
        def check(self, candidate, loaded):
            return False, "D: 3 bad"

    monkeypatch.setattr(measure, "GpuBench", Failing)
    before = free_gemm.read_text()
    result = invoke("tune", str(free_gemm), "--limit", "2", "--write")
    assert result.exit_code == 1
    assert "CHECK FAILED" in result.stdout and "no candidate passed the check" in result.stdout
    assert free_gemm.read_text() == before


@pytest.mark.parametrize("example, where", [("attention_fwd.kg", "loop kv over T"),
                                            ("mlp_loop.kg", "loop j over N0"),
                                            ("attention_bwd_dot.kg", "kernel attention_bwd_dot")])
@pytest.mark.parametrize("mode", [["--compile-only"], []])
def test_tune_refuses_a_tile_program_located(example, where, mode):
    """Not tuned yet: exit 2 at the loop (or the row kernel), no traceback, before the GPU
    check (the refusal holds on any machine)."""
    path = Path(__file__).resolve().parent.parent / "examples" / example
    result = invoke("tune", str(path), *mode)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "kgen tune does not tune tile programs yet" in result.output
    assert "kgen inspect shows" in result.output and where in result.output
    assert f"{example}:" in result.output.splitlines()[0]
