"""The Python API without a GPU: build, build_file, and load's message when no GPU is there."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

import kgen
from kgen import ir
from kgen.errors import (KgenError, KgenRuntimeError, KgenSlowPathWarning, KgenSourceWarning,
                         KgenTargetWarning)

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.kg"))


def pipeline():
    for module in ("kgen.parse", "kgen.verify", "kgen.lower", "kgen.emit"):
        pytest.importorskip(module)


def test_exports():
    for name in ("load", "build", "build_file", "compile_source", "CompiledKernel",
                 "DeviceBuffer", "evaluate", "KgenError", "ArgumentError", "KgenRuntimeError"):
        assert getattr(kgen, name) is not None
    assert kgen.__version__
    with pytest.raises(AttributeError):
        kgen.no_such_thing


def test_build_ir_kernel():
    pipeline()
    from tests.handmade import bias_relu_kernel

    built = kgen.build(bias_relu_kernel())
    assert built.plan.name == "bias_relu" and "bias_relu_params" in built.source
    assert kgen.build(bias_relu_kernel()).source == built.source
    assert kgen.build(bias_relu_kernel(), "sm_90a").plan.arch is ir.Arch.SM90A
    with pytest.raises(KgenError, match="unknown arch 'sm_70'"):
        kgen.build(bias_relu_kernel(), "sm_70")


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_build_file_matches_the_cli(example):
    pipeline()
    from click.testing import CliRunner

    from kgen.cli import cli

    built = kgen.build_file(example)  # the .cu on stdout (warnings go to stderr)
    assert CliRunner().invoke(cli, ["compile", str(example)]).stdout == built.source


def test_several_kernels_need_a_name(tmp_path):
    pipeline()
    from kgen.api import pick_kernel
    from tests.handmade import bias_relu_kernel, rowscale_gelu_kernel

    module = ir.Module((bias_relu_kernel(), rowscale_gelu_kernel()), "two.kg")
    with pytest.raises(KgenError, match="two.kg has 2 kernels .*--kernel NAME"):
        pick_kernel(module, None)
    assert pick_kernel(module, "rowscale_gelu").name == "rowscale_gelu"
    with pytest.raises(KgenError, match="no kernel named 'x'"):
        pick_kernel(module, "x")


@pytest.mark.slow
def test_compile_source_without_gpu(cache_dir):
    pipeline()
    from tests.handmade import bias_relu_kernel

    built = kgen.build(bias_relu_kernel())
    result = kgen.compile_source(built.source, built.plan.name, "sm_90a")
    assert result.cubin[:4] == b"\x7fELF" and result.spill_stores == 0


def test_load_without_gpu_says_so():
    pipeline()
    from kgen.runtime.device import gpu_available
    from tests.handmade import bias_relu_kernel

    if gpu_available():
        pytest.skip("a GPU is present")
    with pytest.raises(KgenRuntimeError, match="no CUDA GPU is available"):
        kgen.load(bias_relu_kernel())


def test_load_warns_about_spills_and_local_memory(monkeypatch):
    """kgen.load reports ptxas' spills and stack frame as a KgenResourceWarning (stand-ins for
    the GPU: the device's properties, NVRTC's result and the loaded kernel)."""
    pipeline()
    import kgen.runtime.device as device
    import kgen.runtime.launch as launch
    import kgen.runtime.nvrtc as nvrtc
    from tests.handmade import bias_relu_kernel

    info = device.DeviceInfo(0, "Fake GPU", (8, 0), 108, 40 << 20, 166912, 1410000)
    spilled = nvrtc.CompileResult(b"\x7fELF", "", 255, 8, 8, 16, False, 0.1, "sm_80",
                                  "bias_relu")
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda *args, **kwargs: spilled)
    monkeypatch.setattr(launch, "CompiledKernel", lambda plan, cubin, **kwargs: "loaded")
    with pytest.warns(nvrtc.KgenResourceWarning, match="8 B spill stores and 8 B spill loads "
                                                       "and a 16 B stack frame"):
        assert kgen.load(bias_relu_kernel()) == "loaded"


GEMM_FILE = Path(__file__).resolve().parent.parent / "examples" / "gemm_bias_relu.kg"


def test_the_slow_path_warning_is_a_python_warning(tmp_path):
    """kgen.build_file warns where written lines force the slower path; the warning is its own
    class (a KgenSourceWarning), so a filter can make it an error."""
    pipeline()
    path = tmp_path / "sm80.kg"
    path.write_text(GEMM_FILE.read_text().replace("tile 128x256x64  warps 2x4  stages 3",
                                                  "tile 128x128x32  warps 2x2  stages 4"))
    with pytest.warns(KgenSlowPathWarning, match="force the mma.sync kernel") as caught:
        kgen.build_file(path, "sm_90a")
    assert len(caught) == 1 and str(caught[0].message).startswith(f"{path}:16:5: warning: ")
    assert issubclass(KgenSlowPathWarning, KgenSourceWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("error", KgenSlowPathWarning)
        with pytest.raises(KgenSlowPathWarning):
            kgen.build_file(path, "sm_90a")
        kgen.build_file(path)  # its own target, sm_80: no faster path, no warning


def fake_load(monkeypatch, cc=(9, 0)):
    """A GPU of compute capability `cc`; load_built returns the arch it would compile for."""
    import kgen.api as api
    import kgen.runtime.device as device

    info = device.DeviceInfo(0, "NVIDIA H200", cc, 132, 60 << 20, 232448, 1980000)
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    monkeypatch.setattr(api, "load_built", lambda built, **options: built.plan.arch)


def test_load_warns_once_where_the_gpu_has_a_faster_target(monkeypatch):
    pipeline()
    fake_load(monkeypatch)
    with pytest.warns(KgenTargetWarning) as caught:
        assert kgen.load(GEMM_FILE, tuned=False) is ir.Arch.SM80
    (warning,) = caught
    assert issubclass(KgenTargetWarning, RuntimeWarning)
    assert str(warning.message).startswith(
        "gemm_bias_relu is planned for sm_80, the kernel's target, and runs as sm_80 code on "
        "NVIDIA H200 (compute capability 9.0), whose own target sm_90a has a faster path")
    assert 'arch="sm_90a" or arch="native" in Python' in str(warning.message)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kgen.load(GEMM_FILE, "sm_80", tuned=False) is ir.Arch.SM80  # asked for
        assert kgen.load(GEMM_FILE, "native", tuned=False) is ir.Arch.SM90A  # the GPU's own


def test_no_target_warning_on_the_files_own_gpu(monkeypatch):
    pipeline()
    fake_load(monkeypatch, cc=(8, 0))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert kgen.load(GEMM_FILE, tuned=False) is ir.Arch.SM80
        assert kgen.load(GEMM_FILE, "native", tuned=False) is ir.Arch.SM80


def test_arch_native_names_the_gpus_target(monkeypatch):
    import kgen.api as api
    import kgen.runtime.device as device

    monkeypatch.setattr(device, "gpu_available", lambda: False)
    with pytest.raises(KgenRuntimeError, match="no CUDA GPU is available"):
        api.arch_of("native")
    monkeypatch.setattr(device, "gpu_available", lambda: True)
    info = device.DeviceInfo(0, "Some GPU", (10, 0), 148, 0, 0, 0)
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    with pytest.raises(KgenRuntimeError, match="Some GPU is sm_100, which kgen does not target"):
        api.arch_of("native")


def test_help_lists_the_public_api():
    """help(kgen) shows every public name with its description, though they load lazily."""
    import pydoc

    text = pydoc.render_doc(kgen, renderer=pydoc.plaintext)
    for name in ("load", "build", "build_file", "torch_op", "CompiledKernel", "DeviceBuffer",
                 "evaluate", "ir", "errors"):
        assert f"\n        {name}" in text, name  # the docstring's table, one line each
    for name in ("load", "build", "build_file", "evaluate", "torch_op"):
        assert f"\n    {name}(" in text, name  # FUNCTIONS: signature and docstring
    for name in ("CompiledKernel", "DeviceBuffer", "KgenError"):
        assert f"\n    class {name}(" in text, name
    assert {"load", "build", "ir", "errors"} <= set(dir(kgen))


def test_import_stays_lazy():
    """`import kgen` and dir(kgen) import no other kgen module (no NVRTC, no CUDA)."""
    import subprocess
    import sys

    code = ("import sys, kgen; dir(kgen); "
            "print(sorted(m for m in sys.modules if m.startswith('kgen')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "['kgen']"
    assert kgen.ir.Kernel is ir.Kernel and kgen.errors.KgenError is KgenError


def _with_epilogue(kernel: ir.Kernel, *stmts) -> ir.Kernel:
    import dataclasses

    gemm = dataclasses.replace(kernel.gemms[0], epilogue=ir.Epilogue(tuple(stmts)))
    return dataclasses.replace(kernel, gemms=(gemm,))


def test_build_verifies_its_input():
    """An IR that names an unknown tensor is a KgenError from build as from load, not the
    lowering's AssertionError; what is not a kernel is refused by name."""
    pipeline()
    from tests.handmade import bias_relu_kernel

    bad = _with_epilogue(bias_relu_kernel(), ir.Store("D", ir.TensorLoad("Z")),
                         ir.Store("Pre", ir.Acc()))
    with pytest.raises(KgenError, match="'Z'"):
        kgen.build(bad)
    with pytest.raises(KgenError, match="'Z'"):
        kgen.load(bad)  # the same message, before any GPU is looked for
    with pytest.raises(KgenError, match=r"build\(\) takes a kgen.ir.Kernel .*got str"):
        kgen.build("examples/gemm.kg")


def test_build_warns_once_as_a_file_does(tmp_path):
    """verify's warnings (an unused local) come from build, and once from build_file."""
    pipeline()
    import warnings

    from kgen.errors import KgenSourceWarning
    from tests.handmade import bias_relu_kernel

    unused = _with_epilogue(bias_relu_kernel(), ir.Let("t", ir.Acc()),
                            ir.Store("D", ir.Acc()), ir.Store("Pre", ir.Acc()))
    with pytest.warns(KgenSourceWarning, match="'t'"):
        kgen.build(unused)
    source = (Path(__file__).resolve().parent.parent / "examples" / "gemm.kg").read_text()
    path = tmp_path / "unused.kg"
    path.write_text(source.replace("epilogue {", "epilogue { t = acc;"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        kgen.build_file(path)
    assert [str(w.message).count("'t'") for w in caught] == [1]


def test_python_kernel_header_hash():
    """A kernel built from Python names the sha256 of its IR (without source locations) in
    both headers: the same IR gives byte-identical files, another IR another hash."""
    pipeline()
    import dataclasses
    import re

    from kgen.errors import SourceLoc
    from tests.handmade import bias_relu_kernel

    built = kgen.build(bias_relu_kernel())
    digest = re.search(r"from <python> \(sha256 ([0-9a-f]{16})\)", built.source).group(1)
    assert f"(sha256 {digest})" in built.header
    assert kgen.build(bias_relu_kernel()).source == built.source
    located = dataclasses.replace(bias_relu_kernel(), loc=SourceLoc("k.py", 3, 1, 9, 2))
    assert kgen.build(located).source == built.source
    other = kgen.build(bias_relu_kernel(name="bias_relu", stages=4))
    assert f"(sha256 {digest})" not in other.source
    explicit = kgen.build(bias_relu_kernel(), source_hash="0123")
    assert "(sha256 0123)" in explicit.source
    # the same in another process, whatever its string hashing
    import os
    import subprocess
    import sys

    code = ("import kgen; from tests.handmade import bias_relu_kernel; "
            "print(kgen.build(bias_relu_kernel()).source.splitlines()[0])")
    root = Path(__file__).resolve().parent.parent
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True, cwd=root, env=dict(os.environ, PYTHONHASHSEED="12345",
                                                          PYTHONPATH=str(root))).stdout
    assert other.strip() == built.source.splitlines()[0]
