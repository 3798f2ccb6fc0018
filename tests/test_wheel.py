"""kgen installed from its wheel, outside the checkout, finds its grammar and templates: the
wheel is built from this checkout, unpacked into a fresh folder, and `kgen compile` of an example
runs from another directory with only that folder on the path (the dependencies come from the
environment running the tests)."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """The wheel's contents in a folder of their own (what pip puts in site-packages)."""
    dist = tmp_path_factory.mktemp("dist")
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(ROOT)], capture_output=True, text=True)
    assert build.returncode == 0, build.stdout + build.stderr
    wheels = list(dist.glob("kgen-*.whl"))
    assert len(wheels) == 1, wheels
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheels[0]) as whl:
        whl.extractall(site)
    return site


def _kgen(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(site), KGEN_CACHE_DIR=str(cwd / "cache"))
    return subprocess.run([sys.executable, "-m", "kgen", *args], cwd=cwd, env=env,
                          capture_output=True, text=True)


def test_wheel_holds_grammar_and_templates(installed):
    assert (installed / "kgen" / "grammar" / "kgen.lark").is_file()
    for arch in ("common", "sm80", "sm90"):
        assert list((installed / "kgen" / "templates" / arch).glob("*.j2")), arch


def test_installed_wheel_compiles_an_example_elsewhere(installed, tmp_path):
    probe = subprocess.run(
        [sys.executable, "-c", "import kgen; print(kgen.__file__)"], cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=str(installed)), capture_output=True, text=True)
    assert Path(probe.stdout.strip()).is_relative_to(installed), probe.stdout + probe.stderr
    example = tmp_path / "examples" / "gemm_bias_relu.kg"
    example.parent.mkdir()
    example.write_text((ROOT / "examples" / "gemm_bias_relu.kg").read_text())
    # the golden snapshot's own command (its "Regenerate with" line)
    out = _kgen(installed, tmp_path, "compile", "examples/gemm_bias_relu.kg",
                "-o", "gemm_bias_relu.sm_80.cu")
    assert out.returncode == 0, out.stdout + out.stderr
    golden = ROOT / "tests" / "golden" / "gemm_bias_relu.sm_80.cu"
    assert (tmp_path / "gemm_bias_relu.sm_80.cu").read_text() == golden.read_text()


@pytest.mark.slow
def test_installed_wheel_compiles_with_nvrtc(installed, tmp_path):
    """NVRTC (no GPU needed) compiles the wheel's output: the CUDA headers are found too."""
    example = tmp_path / "gemm.kg"
    example.write_text((ROOT / "examples" / "gemm.kg").read_text())
    out = _kgen(installed, tmp_path, "inspect", example.name, "--resources", "--json")
    assert out.returncode == 0, out.stdout + out.stderr
    assert '"spill' in out.stdout or '"registers' in out.stdout, out.stdout[:2000]
