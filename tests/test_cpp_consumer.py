"""examples/cpp_consumer: CMake runs kgen, nvcc builds the generated kernels as their own
translation units and a program that includes only their headers. Build only (no GPU needed);
running it is examples/cpp_consumer/run_on_gpu.sh's job."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PROJECT = ROOT / "examples" / "cpp_consumer"

pytestmark = pytest.mark.skipif(
    shutil.which("cmake") is None or shutil.which("nvcc") is None,
    reason="needs cmake and nvcc on PATH",
)


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True)
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output
    return proc


@pytest.mark.slow
def test_cpp_consumer_builds_without_warnings(tmp_path):
    build = tmp_path / "build"
    # One architecture keeps CI short; the default is 80;90a.
    configure = _run("cmake", "-S", str(PROJECT), "-B", str(build),
                     "-DCMAKE_CUDA_ARCHITECTURES=80", f"-DKGEN_PYTHON={sys.executable}")
    assert "kgen: " in configure.stdout
    compiled = _run("cmake", "--build", str(build), "-j", "2", "--verbose")
    log = configure.stdout + configure.stderr + compiled.stdout + compiled.stderr
    assert "warning" not in log.lower(), log
    assert "-Wall,-Wextra" in compiled.stdout  # the generated files were built with warnings on
    for stem in ("gemm", "gemm_bias_relu"):
        assert f"{stem}.cu" in compiled.stdout
        assert (build / f"{stem}.h").is_file()
    assert (build / "cpp_consumer").is_file()

    # What the build generated is what `kgen compile --check` expects (a consumer's CI check).
    for stem in ("gemm", "gemm_bias_relu"):
        _run(sys.executable, "-m", "kgen", "compile", str(ROOT / "examples" / f"{stem}.kg"),
             "-o", str(build / f"{stem}.cu"), "--header", str(build / f"{stem}.h"), "--check",
             cwd=ROOT)
