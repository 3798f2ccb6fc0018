"""Every example's .cu builds with plain nvcc, as a project that checks it in would build it:
`nvcc -std=c++17 -arch=<its target> -Xcompiler -Wall,-Wextra -c`, with no warning (the list:
tests/golden/snapshots.py, each example for its own target and for sm_90a where it plans). A .cu
built for an arch it cannot run on stops at its #error. No GPU needed; skipped without nvcc."""
from __future__ import annotations

import functools
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from tests.golden.snapshots import snapshots

NVCC = shutil.which("nvcc")

pytestmark = pytest.mark.skipif(NVCC is None, reason="needs nvcc on PATH")


@functools.cache
def _sources() -> dict[str, str]:
    return {name: text for name, text in snapshots() if name.endswith(".cu")}


def _arch(name: str) -> str:
    """NAME.sm_80.cu -> sm_80."""
    return name.split(".")[-2]


def _nvcc(source: Path, arch: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [NVCC, "-std=c++17", f"-arch={arch}", "-Xcompiler", "-Wall,-Wextra", "-c", str(source),
         "-o", str(source.with_suffix(".o"))],
        capture_output=True, text=True)


@pytest.mark.slow
def test_every_example_builds_with_plain_nvcc_without_warnings(tmp_path):
    sources = _sources()
    assert any(_arch(n) == "sm_80" for n in sources) and any(
        _arch(n) == "sm_90a" for n in sources)
    for name, text in sources.items():
        (tmp_path / name).write_text(text)
    # two at a time: each nvcc runs one compiler process at a time
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = dict(zip(sources, pool.map(
            lambda name: _nvcc(tmp_path / name, _arch(name)), sources)))
    failures = [
        f"{name} (nvcc -arch={_arch(name)}): exit {r.returncode}\n{r.stdout}{r.stderr}"
        for name, r in results.items()
        if r.returncode != 0 or "warning" in (r.stdout + r.stderr).lower()
    ]
    assert not failures, "\n\n".join(failures)


@pytest.mark.parametrize("stem, message", [
    ("b2b_gemm_rf_sm90a.sm_90a", "b2b_gemm_rf_sm90a.cu needs sm_90a (wgmma)"),  # wgmma
    ("gemm.sm_90a", "gemm_bf16.cu needs sm_90a (wgmma)"),  # the warp-specialized gemm
    ("b2b_gemm_smem.sm_90a", "b2b_gemm_smem.cu was planned for sm_90a"),  # the sm_80 mainloop
])
def test_an_sm90a_file_built_for_sm80_stops_at_its_error(stem, message, tmp_path):
    source = tmp_path / f"{stem}.cu"
    source.write_text(_sources()[source.name])
    result = _nvcc(source, "sm_80")
    output = result.stdout + result.stderr
    assert result.returncode != 0
    assert "#error" in output and message in output and "-arch=sm_90a" in output, output
