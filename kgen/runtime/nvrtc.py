"""CUDA C++ to cubin with NVRTC (through cuda.core), cached on disk, with ptxas' resource report.

Needs no GPU when the arch is given. The CUDA headers the emitted code includes
(`cuda_fp16.h`, `cuda_bf16.h`, ...) come from the `nvidia-cuda-runtime` wheel.
"""
from __future__ import annotations

import functools
import io
import os
import re
import time
import warnings
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

from ..errors import KgenRuntimeError
from .cache import CompileCache, default_cache

_ARCH = re.compile(r"^sm_\d{2,3}[af]?$")


class KgenResourceWarning(UserWarning):
    """ptxas reports spills or a stack frame: the kernel runs, but through local memory."""


@dataclass(frozen=True, slots=True)
class CompileResult:
    cubin: bytes
    log: str  # NVRTC's log: warnings and the ptxas -v report
    registers: int | None  # per thread, from ptxas
    spill_stores: int  # bytes
    spill_loads: int  # bytes
    stack_bytes: int
    cached: bool
    seconds: float  # wall time of this call (a cache hit is a few milliseconds)
    arch: str = ""
    name: str = ""

    def resources(self) -> dict[str, Any]:
        return {
            "registers": self.registers,
            "spill_stores": self.spill_stores,
            "spill_loads": self.spill_loads,
            "stack_bytes": self.stack_bytes,
        }

    @property
    def warnings(self) -> tuple[str, ...]:
        """What ptxas' report shows that costs speed: spills and local memory (a stack frame).
        Emitted kernels are meant to have none; a chain with wide tiles can run out of
        registers."""
        found = []
        if self.spill_stores or self.spill_loads:
            found.append(f"{self.spill_stores} B spill stores and {self.spill_loads} B spill "
                         "loads")
        if self.stack_bytes:
            found.append(f"a {self.stack_bytes} B stack frame")
        if not found:
            return ()
        return (f"{self.name} for {self.arch}: ptxas reports {' and '.join(found)} "
                f"(local memory, slower; registers {self.registers})",)


def warn_resources(result: CompileResult, stacklevel: int = 3) -> None:
    """Warn (KgenResourceWarning) about each of the result's spill and local-memory findings."""
    for message in result.warnings:
        warnings.warn(message, KgenResourceWarning, stacklevel=stacklevel)


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """NVRTC's version as "major.minor"."""
    from cuda.bindings import nvrtc

    err, major, minor = nvrtc.nvrtcVersion()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KgenRuntimeError(f"cannot query the NVRTC version: {err}")
    return f"{major}.{minor}"


@functools.lru_cache(maxsize=1)
def cuda_include_dir() -> str:
    """The folder holding cuda_runtime.h, cuda_fp16.h and cuda_bf16.h."""
    candidates: list[str] = []
    try:
        import cuda.pathfinder as pathfinder

        found = pathfinder.find_nvidia_header_directory("cudart")
        if found:
            candidates.append(str(found))
    except Exception:  # older pathfinder, or no headers found by it
        pass
    for env in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(env):
            candidates.append(os.path.join(os.environ[env], "include"))
    candidates.append("/usr/local/cuda/include")
    for folder in candidates:
        if os.path.isfile(os.path.join(folder, "cuda_fp16.h")):
            return folder
    raise KgenRuntimeError(
        "cannot find the CUDA headers (cuda_fp16.h); install the nvidia-cuda-runtime wheel "
        "or set CUDA_HOME"
    )


def default_arch() -> str:
    """The present GPU's arch for NVRTC (compute capability 9.0 gives sm_90a)."""
    from .device import device_info, gpu_available

    if not gpu_available():
        raise KgenRuntimeError("no CUDA GPU is present to choose an arch; pass one, e.g. sm_90a")
    return device_info().arch


def _options(name: str, arch: str, extra: Mapping[str, Any]):
    from cuda.core import ProgramOptions

    fields: dict[str, Any] = dict(
        name=f"{name}.cu",
        arch=arch,
        std="c++17",
        include_path=[cuda_include_dir()],
        ptxas_options=["-v"],
    )
    if int(nvrtc_version().split(".")[0]) >= 13:
        # NVRTC 13 keeps its own in-process cache and, on a hit, returns the cubin without
        # ptxas' report (an empty log). kgen caches on disk already: always compile for real.
        fields["no_cache"] = True
    fields.update(extra)
    return ProgramOptions(**fields)


# Defined in an NVRTC compile, it leaves a one-gemm kernel's narrow entry point
# (`<kernel>_narrow`) out of the module (templates/sm80/gemm.cu.j2, templates/sm90/gemm.cu.j2).
# That entry point is most of the compile (on a 2-core CPU machine, gemm for sm_90a took 0.28 s
# without it and 0.99 s with it, evt_multi_output 0.78 s and 2.15 s), and most launches never
# need it: CompiledKernel compiles the whole module the first time one does.
FAST_ENTRY_ONLY = "KGEN_FAST_ENTRY_ONLY"


def fast_entry_options(narrow_kernel: str | None) -> dict[str, str]:
    """compile_cubin's extra options for a module of the fast entry point alone (none for a
    kernel without a narrow entry point)."""
    return {"define_macro": FAST_ENTRY_ONLY} if narrow_kernel else {}


def _option_key(name: str, arch: str, extra: Mapping[str, Any]) -> tuple[str, ...]:
    # The include folder's location does not change the output; the NVRTC version covers the
    # headers. Everything else that reaches ProgramOptions is part of the key.
    return (f"name={name}",) + tuple(f"{k}={extra[k]!r}" for k in sorted(extra))


def compile_cubin(
    source: str,
    name: str,
    arch: str | None,
    *,
    extra_options: Mapping[str, Any] | Iterable[tuple[str, Any]] = (),
    cache: CompileCache | None = None,
) -> CompileResult:
    """Compile `source` (whose kernel is `name`) for `arch` ("sm_80", "sm_90a"; None: the present
    GPU's). `extra_options` are more `cuda.core.ProgramOptions` fields, e.g.
    {"max_register_count": 128}."""
    started = time.perf_counter()
    arch = arch or default_arch()
    if not _ARCH.match(arch):
        raise KgenRuntimeError(f"not an NVRTC arch: {arch!r} (expected e.g. sm_80 or sm_90a)")
    extra = dict(extra_options)
    cache = cache if cache is not None else default_cache()
    version = nvrtc_version()
    key = cache.key(source=source, arch=arch, options=_option_key(name, arch, extra),
                    nvrtc_version=version)

    entry = cache.load(key)
    if entry is not None:
        return _result(entry.cubin, entry.meta.get("log", ""), True, started, arch, name)

    from cuda.core import Program

    logs = io.StringIO()
    try:
        program = Program(source, code_type="c++", options=_options(name, arch, extra))
        try:
            code = program.compile("cubin", logs=logs)
        finally:
            program.close()
    except Exception as err:  # cuda.core raises NVRTCError (a CUDAError) with the log inside
        saved = _save_failed(cache, name, source)
        raise KgenRuntimeError(
            f"NVRTC {version} could not compile {name} for {arch}:\n"
            f"{_clean(str(err)) or _clean(logs.getvalue())}\n"
            f"the source is saved at {saved}"
        ) from None
    cubin = bytes(code.code)
    log = _clean(logs.getvalue())
    result = _result(cubin, log, False, started, arch, name)
    cache.store(key, cubin, {"name": name, "arch": arch, "nvrtc": version, "log": log,
                             **result.resources()})
    return result


def _save_failed(cache: CompileCache, name: str, source: str) -> str:
    try:
        return str(cache.save_failed(name, source))
    except OSError as err:
        return f"(nowhere: {err})"


def _clean(log: str) -> str:
    return log.replace("\x00", "").strip()


def _result(cubin: bytes, log: str, cached: bool, started: float, arch: str,
            name: str) -> CompileResult:
    usage = parse_ptxas_report(log, name)
    return CompileResult(
        cubin=cubin,
        log=log,
        registers=usage.get("registers"),
        spill_stores=usage.get("spill_stores", 0),
        spill_loads=usage.get("spill_loads", 0),
        stack_bytes=usage.get("stack_bytes", 0),
        cached=cached,
        seconds=time.perf_counter() - started,
        arch=arch,
        name=name,
    )


_ENTRY = re.compile(r"Compiling entry function '([^']+)'")
_FRAME = re.compile(
    r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads"
)
_REGS = re.compile(r"Used (\d+) registers")


def parse_ptxas_report(log: str, name: str | None = None) -> dict[str, int]:
    """Registers, spills and stack of entry `name` (or the first entry) from `ptxas -v` text.

    The report reads, per entry function:
        ptxas info    : Compiling entry function 'k' for 'sm_80'
        ptxas info    : Function properties for k
        ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
        ptxas info    : Used 8 registers, used 0 barriers, 392 bytes cmem[0]
    """
    per_entry: dict[str, dict[str, int]] = {}
    current: str | None = None
    for line in log.splitlines():
        entry = _ENTRY.search(line)
        if entry:
            current = entry.group(1)
            per_entry.setdefault(current, {})
            continue
        if current is None:
            continue
        frame = _FRAME.search(line)
        if frame:
            stack, stores, loads = (int(g) for g in frame.groups())
            per_entry[current].update(stack_bytes=stack, spill_stores=stores, spill_loads=loads)
            continue
        regs = _REGS.search(line)
        if regs:
            per_entry[current]["registers"] = int(regs.group(1))
    if not per_entry:
        return {}
    if name is not None and name in per_entry:
        return per_entry[name]
    return next(iter(per_entry.values()))


def compile_ptx(source: str, name: str, arch: str) -> str:
    """The PTX of `source` for `arch` ("sm_80", "sm_90a"), with no GPU and no ptxas (NVRTC
    itself, for the virtual arch compute_XX: cuda.core asks the driver whether it could load
    the PTX, which fails without one). Not cached: PTX is a text for people and tools."""
    from cuda.bindings import nvrtc

    if not _ARCH.match(arch):
        raise KgenRuntimeError(f"not an NVRTC arch: {arch!r} (expected e.g. sm_80 or sm_90a)")
    virtual = "compute_" + arch.removeprefix("sm_")
    options = [f"-arch={virtual}".encode(), b"-std=c++17", f"-I{cuda_include_dir()}".encode()]
    err, program = nvrtc.nvrtcCreateProgram(source.encode(), f"{name}.cu".encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KgenRuntimeError(f"NVRTC could not create a program for {name}: {err}")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(program, len(options), options)
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            _, size = nvrtc.nvrtcGetProgramLogSize(program)
            log = b" " * size
            nvrtc.nvrtcGetProgramLog(program, log)
            saved = _save_failed(default_cache(), name, source)
            raise KgenRuntimeError(
                f"NVRTC {nvrtc_version()} could not compile {name} for {virtual}:\n"
                f"{_clean(log.decode(errors='replace'))}\nthe source is saved at {saved}")
        _, size = nvrtc.nvrtcGetPTXSize(program)
        ptx = b" " * size
        nvrtc.nvrtcGetPTX(program, ptx)
    finally:
        nvrtc.nvrtcDestroyProgram(program)
    return _clean(ptx.decode()) + "\n"
