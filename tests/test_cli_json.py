"""The kgen command for scripts and CI: --json on every command (errors included), bad output
paths as bad input, cubins and PTX without a GPU, spills as warnings, --werror, the documented
environment. No GPU needed: NVRTC compiles on the CPU."""
from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import kgen.api
from kgen.cli import cli
from kgen.errors import ArgumentError, KgenError, KgenRuntimeError, SourceLoc
from kgen.runtime import nvrtc
from kgen.runtime.cache import KgenCacheWarning

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
GEMM = EXAMPLES / "gemm_bias_relu.kg"
HOPPER = EXAMPLES / "b2b_gemm_rf_pingpong_sm90a.kg"


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args], catch_exceptions=False)


def error_of(result) -> dict:
    document = json.loads(result.stdout)
    assert list(document) == ["error"]
    return document["error"]


def spilling(monkeypatch, spills=16, stack=24):
    """compile_cubin returns a result whose ptxas report shows spills and a stack frame."""
    real = nvrtc.compile_cubin

    def compile_cubin(source, name, arch, **kwargs):
        result = real(source, name, arch, **kwargs)
        import dataclasses

        return dataclasses.replace(result, spill_stores=spills, spill_loads=spills,
                                   stack_bytes=stack)

    monkeypatch.setattr(nvrtc, "compile_cubin", compile_cubin)


# -- compile --json, --cubin, --ptx -----------------------------------------------------------


def test_compile_json_describes_what_was_written(tmp_path):
    out = tmp_path / "k.cu"
    result = invoke("compile", GEMM, "-o", out, "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["kernel"] == "gemm_bias_relu" and summary["arch"] == "sm_80"
    assert summary["outputs"] == {"cu": str(out), "header": None, "cubin": None, "ptx": None}
    assert summary["smem_bytes"] > 0 and summary["threads"] > 0
    assert summary["nvrtc"] is None and summary["warnings"] == []
    assert summary["sizes"] is None and summary["schedule"] == {"lines": []}  # every line written
    assert "source" not in summary and out.read_text().startswith("//")


def test_compile_json_without_output_carries_the_source():
    result = invoke("compile", GEMM, "--json")
    summary = json.loads(result.stdout)
    assert result.exit_code == 0 and summary["source"] == kgen.api.build_file(GEMM).source


@pytest.mark.slow
def test_compile_cubin_and_ptx_without_a_gpu(tmp_path, cache_dir):
    cubin, ptx = tmp_path / "k.cubin", tmp_path / "k.ptx"
    result = invoke("compile", HOPPER, "--cubin", cubin, "--ptx", ptx, "--json")
    assert result.exit_code == 0, result.output
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    text = ptx.read_text()
    assert ".target sm_90a" in text and ".entry b2b_gemm_rf_pingpong_sm90a" in text
    summary = json.loads(result.stdout)
    assert summary["nvrtc"]["arch"] == "sm_90a" and summary["nvrtc"]["spill_stores"] == 0
    assert summary["outputs"]["cubin"] == str(cubin) and summary["outputs"]["ptx"] == str(ptx)
    # the .cu is not printed when a binary output is asked for
    plain = invoke("compile", GEMM, "--cubin", tmp_path / "g.cubin")
    assert plain.exit_code == 0 and plain.stdout == ""


def test_check_takes_no_binary_outputs(tmp_path):
    result = invoke("compile", GEMM, "-o", tmp_path / "k.cu", "--check", "--cubin",
                    tmp_path / "k.cubin")
    assert result.exit_code == 2 and "drop --cubin and --ptx" in result.output


def test_two_outputs_naming_one_file_are_bad_input(tmp_path):
    result = invoke("compile", GEMM, "--ptx", tmp_path / "x", "--cubin", tmp_path / "x")
    assert result.exit_code == 2 and "--ptx and --cubin name the same file" in result.output


def test_check_as_json(tmp_path):
    out = tmp_path / "k.cu"
    assert invoke("compile", GEMM, "-o", out).exit_code == 0
    fresh = invoke("compile", GEMM, "-o", out, "--check", "--json")
    assert fresh.exit_code == 0 and json.loads(fresh.stdout)["check"]["ok"] is True
    out.write_text("// edited\n")
    stale = invoke("compile", GEMM, "-o", out, "--check", "--json")
    check = json.loads(stale.stdout)["check"]
    assert stale.exit_code == 1 and check["ok"] is False and check["stale"] == [str(out)]


# -- bad paths --------------------------------------------------------------------------------


@pytest.mark.parametrize("option", ["-o", "--header", "--cubin", "--ptx"])
def test_output_into_a_missing_folder_is_bad_input(option, tmp_path):
    target = tmp_path / "missing" / "k.out"
    result = invoke("compile", GEMM, option, target)
    assert result.exit_code == 2
    assert result.output.strip() == (f"error: {option} {target}: the folder {target.parent} "
                                     "does not exist (kgen creates no folders)")
    assert "Traceback" not in result.output and not target.parent.exists()
    as_json = error_of(invoke("compile", GEMM, option, target, "--json"))
    assert as_json["file"] == str(target) and "does not exist" in as_json["message"]


def test_output_that_is_a_folder_is_bad_input(tmp_path):
    result = invoke("compile", GEMM, "-o", tmp_path)
    assert result.exit_code == 2
    assert result.output.strip() == f"error: -o {tmp_path}: is a directory"


# -- errors as JSON ---------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["compile", "inspect", "run"])
def test_located_error_as_json(command, tmp_path):
    path = tmp_path / "bad.kg"
    path.write_text("kernel k {\n  tensor A : f17[M, K] row\n}\n")
    result = invoke(command, path, "--json")
    assert result.exit_code == 2  # stdout: JSON; stderr: the located message with its caret
    assert result.stderr.startswith(f"{path}:2:14: error: unknown dtype 'f17'")
    error = error_of(result)
    assert (error["file"], error["line"], error["col"]) == (str(path), 2, 14)
    assert error["message"].startswith("unknown dtype 'f17'") and error["kind"] == "bad input"


@pytest.mark.parametrize("command", ["compile", "inspect", "run"])
def test_missing_file_as_json(command, tmp_path):
    error = error_of(invoke(command, tmp_path / "nope.kg", "--json"))
    assert error == {"file": str(tmp_path / "nope.kg"), "line": None, "col": None,
                     "message": f"{tmp_path / 'nope.kg'}: no such file", "kind": "bad input"}


def test_run_usage_and_argument_errors_as_json():
    bad_size = invoke("run", GEMM, "--json", "--size", "M=abc")
    assert bad_size.exit_code == 2 and error_of(bad_size)["message"].startswith("--size expects")
    unknown = invoke("run", GEMM, "--json", "--size", "Q=4")
    assert unknown.exit_code == 2 and error_of(unknown)["message"].startswith("unknown size 'Q'")
    option = invoke("run", GEMM, "--json", "--no-such-option")
    assert option.exit_code == 2 and "--no-such-option" in error_of(option)["message"]


def test_run_without_a_gpu_as_json():
    from kgen.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    result = invoke("run", GEMM, "--json", "--size", "M=256,N=256,K=64")
    assert result.exit_code == 1
    error = error_of(result)
    assert error["kind"] == "failed" and error["message"].startswith("no CUDA GPU is available")


@pytest.mark.parametrize("error, code, kind", [
    (KgenError(SourceLoc("k.kg", 3, 5, 3, 9), "no such tensor 'Q'"), 2, "bad input"),
    (ArgumentError("size M must be positive"), 2, "bad input"),
    (KgenRuntimeError("NVRTC said no"), 1, "failed"),
])
def test_each_error_kind_as_json(error, code, kind, tmp_path, monkeypatch):
    path = tmp_path / "k.kg"
    path.write_text("x")

    def build_file(*args, **kwargs):
        raise error

    monkeypatch.setattr(kgen.api, "build_file", build_file)
    result = invoke("compile", path, "--json")
    assert result.exit_code == code
    got = error_of(result)
    assert got["kind"] == kind and got["message"] == getattr(error, "message", str(error))
    if isinstance(error, KgenError):
        assert (got["file"], got["line"], got["col"]) == ("k.kg", 3, 5)


# -- warnings: spills, local memory, --werror -------------------------------------------------


def test_compile_result_names_spills_and_local_memory():
    clean = nvrtc.CompileResult(b"", "", 40, 0, 0, 0, False, 0.0, "sm_80", "k")
    assert clean.warnings == ()
    spilled = nvrtc.CompileResult(b"", "", 255, 8, 16, 24, False, 0.0, "sm_90a", "k")
    (message,) = spilled.warnings
    assert message.startswith("k for sm_90a: ptxas reports 8 B spill stores and 16 B spill "
                              "loads and a 24 B stack frame")
    with pytest.warns(nvrtc.KgenResourceWarning, match="spill stores"):
        nvrtc.warn_resources(spilled)


@pytest.mark.slow
def test_compile_cubin_warns_about_spills(tmp_path, cache_dir, monkeypatch):
    spilling(monkeypatch)
    cubin = tmp_path / "k.cubin"
    result = invoke("compile", GEMM, "--cubin", cubin, "--json")
    assert result.exit_code == 0
    assert "warning: gemm_bias_relu for sm_80: ptxas reports 16 B spill stores" in result.stderr
    assert json.loads(result.stdout)["warnings"][0].startswith("gemm_bias_relu for sm_80")
    assert cubin.exists()


@pytest.mark.slow
def test_werror_makes_spills_exit_2(tmp_path, cache_dir, monkeypatch):
    spilling(monkeypatch)
    cubin = tmp_path / "k.cubin"
    result = invoke("compile", GEMM, "--cubin", cubin, "--werror")
    assert result.exit_code == 2 and not cubin.exists()
    assert result.stderr.startswith("error: gemm_bias_relu for sm_80: ptxas reports")
    assert result.stderr.rstrip().endswith("(--werror)")
    inspect = invoke("inspect", GEMM, "--resources", "--werror", "--json")
    assert inspect.exit_code == 2 and error_of(inspect)["message"].endswith("(--werror)")
    shown = invoke("inspect", GEMM, "--resources", "--json")
    assert shown.exit_code == 0 and "warning: gemm_bias_relu" in shown.stderr
    assert json.loads(shown.stdout)["warnings"][0].startswith("gemm_bias_relu")


@pytest.mark.slow
def test_run_werror_stops_before_the_gpu(cache_dir, monkeypatch):
    import kgen.runtime.device as device
    import kgen.runtime.launch as launch

    spilling(monkeypatch)
    info = device.DeviceInfo(0, "Fake GPU", (8, 0), 108, 40 << 20, 166912, 1410000)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)

    def no_launch(*args, **kwargs):
        raise AssertionError("the kernel was loaded despite --werror")

    monkeypatch.setattr(launch, "CompiledKernel", no_launch)
    result = invoke("run", GEMM, "--werror", "--size", "M=256,N=256,K=64")
    assert result.exit_code == 2 and "(--werror)" in result.stderr


class FrontEndWarning(UserWarning):
    """Stands in for the front end's located warnings (an unused local)."""


FrontEndWarning.__module__ = "kgen.diagnostics"


def test_werror_covers_the_front_ends_warnings(tmp_path, monkeypatch):
    real = kgen.api.build_file

    def build_file(*args, **kwargs):
        warnings.warn("k.kg:4:5: local t is never used", FrontEndWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(kgen.api, "build_file", build_file)
    shown = invoke("compile", GEMM, "-o", tmp_path / "k.cu")
    assert shown.exit_code == 0 and shown.stderr == "warning: k.kg:4:5: local t is never used\n"
    failed = invoke("compile", GEMM, "-o", tmp_path / "k2.cu", "--werror")
    assert failed.exit_code == 2 and not (tmp_path / "k2.cu").exists()


def test_cache_warnings_never_fail_werror(tmp_path, monkeypatch):
    real = kgen.api.build_file

    def build_file(*args, **kwargs):
        warnings.warn("the cache folder is read-only", KgenCacheWarning)
        return real(*args, **kwargs)

    monkeypatch.setattr(kgen.api, "build_file", build_file)
    result = invoke("compile", GEMM, "-o", tmp_path / "k.cu", "--werror")
    assert result.exit_code == 0 and "warning: the cache folder is read-only" in result.stderr


# -- the environment --------------------------------------------------------------------------


def test_help_documents_every_environment_variable():
    text = invoke("--help").output
    for variable in ("KGEN_CACHE=0", "KGEN_CACHE_DIR", "XDG_CACHE_HOME", "CUDA_HOME",
                     "CUDA_PATH", "CUDA_VISIBLE_DEVICES"):
        assert variable in text
    kgen_root = Path(kgen.api.__file__).parent
    read = set()
    import re

    for path in kgen_root.rglob("*.py"):
        read |= set(re.findall(r"environ(?:\.get)?[\[(]\"([A-Z_]+)\"", path.read_text()))
    assert read and all(variable in text for variable in read), read


UNUSED_LOCAL = """kernel unused_local {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out

  gemm mma0 = A @ B accumulate f32 {
    tile 128x128x64  warps 2x2  stages 3
    epilogue {
      u = 2.0 * acc
      D = acc
    }
  }
}
"""


def test_unused_local_is_a_located_warning(tmp_path):
    source = tmp_path / "unused.kg"
    source.write_text(UNUSED_LOCAL)
    result = invoke("compile", source, "-o", tmp_path / "out.cu")
    assert result.exit_code == 0
    assert f"{source}:10:7: warning: local 'u' is never used" in result.stderr
    assert "^~~" in result.stderr
    assert (tmp_path / "out.cu").exists()


def test_unused_local_under_werror_exits_2(tmp_path):
    source = tmp_path / "unused.kg"
    source.write_text(UNUSED_LOCAL)
    result = invoke("compile", source, "-o", tmp_path / "out.cu", "--werror")
    assert result.exit_code == 2
    assert f"{source}:10:7: error: (--werror) local 'u' is never used" in result.stderr
    assert not (tmp_path / "out.cu").exists()


# -- no silent slow path: a schedule line that forces a slower path than the target has --------

SM80_LINES = "tile 128x128x32  warps 2x2  stages 4"  # issue 49: written for sm_80


def sm80_lines(tmp_path) -> Path:
    path = tmp_path / "sm80.kg"
    path.write_text(GEMM.read_text().replace("tile 128x256x64  warps 2x4  stages 3", SM80_LINES))
    return path


def test_a_line_forcing_the_slow_path_warns_located(tmp_path):
    path = sm80_lines(tmp_path)
    result = invoke("compile", path, "--arch", "sm_90a", "-o", tmp_path / "k.cu")
    assert result.exit_code == 0 and (tmp_path / "k.cu").exists()
    head, line, caret = result.stderr.splitlines()
    assert head.startswith(f"{path}:16:5: warning: `tile 128x128x32` and `warps 2x2` force the "
                           "mma.sync kernel (the sm_80 path")
    assert "without them, kgen plans the warp-specialized wgmma kernel (cooperative)" in head
    assert line.strip() == SM80_LINES and caret.strip() == "^~~~~~~~~~~~~~~"
    # the file's own target has no faster path: no warning
    assert invoke("compile", path, "-o", tmp_path / "k80.cu").stderr == ""
    shown = invoke("inspect", path, "--arch", "sm_90a", "--json")
    assert shown.exit_code == 0 and shown.stderr.startswith(head)
    assert json.loads(shown.stdout)["warnings"] == [result.stderr.rstrip("\n")]


def test_werror_makes_the_slow_path_an_error(tmp_path):
    path = sm80_lines(tmp_path)
    for command in (("compile", path, "-o", tmp_path / "k.cu"), ("inspect", path)):
        result = invoke(*command, "--arch", "sm_90a", "--werror")
        assert result.exit_code == 2, result.output
        assert result.stderr.startswith(f"{path}:16:5: error: (--werror) `tile 128x128x32` and "
                                        "`warps 2x2` force the mma.sync kernel")
        assert "Traceback" not in result.output
    assert not (tmp_path / "k.cu").exists()


def fake_gpu(monkeypatch, cc):
    """A GPU of compute capability `cc` for kgen run, which must not get as far as a launch."""
    import kgen.runtime.device as device
    import kgen.runtime.launch as launch

    info = device.DeviceInfo(0, "Fake GPU", cc, 132, 50 << 20, 232448, 1980000)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)

    def no_launch(*args, **kwargs):
        raise AssertionError("the kernel was loaded despite --werror")

    monkeypatch.setattr(launch, "CompiledKernel", no_launch)


def test_run_warns_of_the_slow_path_and_of_a_newer_gpu(tmp_path, cache_dir, monkeypatch):
    fake_gpu(monkeypatch, (9, 0))
    path = sm80_lines(tmp_path)
    slow = invoke("run", path, "--arch", "sm_90a", "--werror", "--size", "M=256,N=256,K=64")
    assert slow.exit_code == 2
    assert slow.stderr.startswith(f"{path}:16:5: error: (--werror) `tile 128x128x32`")
    # the file's own target, sm_80, on a 9.0 GPU: how to plan for the GPU's own
    newer = invoke("run", GEMM, "--werror", "--size", "M=256,N=256,K=64")
    assert newer.exit_code == 2
    assert newer.stderr.startswith("error: gemm_bias_relu is planned for sm_80, the "
                                   "kernel's target, and runs as sm_80 code on Fake GPU (compute "
                                   "capability 9.0), whose own target sm_90a has a faster path")
    assert ("--arch sm_90a or --arch native on the command line, arch=\"sm_90a\" or "
            "arch=\"native\" in Python") in newer.stderr


def test_run_arch_native_needs_a_gpu(monkeypatch):
    import kgen.runtime.device as device

    monkeypatch.setattr(device, "gpu_available", lambda: False)
    result = invoke("run", GEMM, "--arch", "native")
    assert result.exit_code == 1
    assert result.stderr.startswith("error: arch 'native' is the present GPU's target, and no "
                                    "CUDA GPU is available")
    # compile and inspect plan without a GPU: they name targets only
    assert invoke("compile", GEMM, "--arch", "native").exit_code == 2
