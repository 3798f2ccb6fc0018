"""The Python API: from a .kg file or an IR kernel to a callable GPU kernel.

    k = kgen.load("examples/gemm_bias_relu.kg")
    k(A=a, B=b, C=c, D=d, bias=v, alpha=1.5)

`build` stops before the GPU (plan and CUDA source); `load` compiles for the present GPU and
loads. The emitted source of a file is the same text `kgen compile FILE` writes, so the compile
cache is shared with the command line.
"""
from __future__ import annotations

import hashlib
import os
import shlex
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from . import ir
from .errors import (NOWHERE, KgenError, KgenRuntimeError, KgenSlowPathWarning,
                     KgenSourceWarning, KgenTargetWarning, SourceLoc)
from .plan import is_program_plan  # noqa: F401 (kgen.api's name for it too)


@dataclass(frozen=True, slots=True)
class Built:
    """A kernel taken as far as the CUDA source."""

    kernel: ir.Kernel
    plan: Any  # plan.KernelPlan
    source: str  # the emitted .cu
    header: str = ""  # the emitted .h: params struct and host API declarations


def read_module(path: str | os.PathLike) -> tuple[ir.Module, str]:
    """Parse and verify a .kg file; returns the module and the file's text."""
    from .parse import parse_file
    from .verify import verify

    module = parse_file(str(path))  # first: a file that is not UTF-8 gets a located message
    text = Path(path).read_text(encoding="utf-8")
    for warning in verify(module):  # accepted, but probably not meant (an unused local)
        warnings.warn(warning.render(text), KgenSourceWarning, stacklevel=2)
    return module, text


def pick_kernel(module: ir.Module, name: str | None) -> ir.Kernel:
    if name is not None:
        for kernel in module.kernels:
            if kernel.name == name:
                return kernel
        names = ", ".join(k.name for k in module.kernels)
        raise KgenError(NOWHERE, f"no kernel named {name!r} in {module.file} (it has {names})")
    if len(module.kernels) != 1:
        names = ", ".join(k.name for k in module.kernels)
        loc = module.kernels[1].loc if len(module.kernels) > 1 else NOWHERE
        raise KgenError(
            loc, f"{module.file} has {len(module.kernels)} kernels ({names}); pick one with "
            "--kernel NAME (kernel=NAME in Python)"
        )
    return module.kernels[0]


NATIVE = "native"  # arch="native", --arch native: the present GPU's own target


def arch_of(arch: str | ir.Arch | None) -> ir.Arch | None:
    """The target an `arch` argument names: an Arch, its name, "native" (the current GPU's
    target), or None (the kernel's own)."""
    if arch is None or isinstance(arch, ir.Arch):
        return arch
    if arch == NATIVE:
        return native_arch()
    found = ir.Arch.from_name(arch)
    if found is None:
        known = ", ".join(a.value for a in ir.Arch)
        raise KgenError(NOWHERE, f"unknown arch {arch!r}; kgen targets {known} (or "
                        f"{NATIVE}: the present GPU's)")
    return found


def native_arch(device: int | None = None) -> ir.Arch:
    """The target of the GPU `device` (default the current one): `arch="native"`."""
    from .runtime.device import device_info, gpu_available

    if not gpu_available():
        raise KgenRuntimeError(f"arch {NATIVE!r} is the present GPU's target, and no CUDA GPU "
                               "is available; name a target (e.g. sm_90a)")
    info = device_info(device)
    found = ir.Arch.from_name(info.arch)
    if found is None:
        known = ", ".join(a.value for a in ir.Arch)
        raise KgenRuntimeError(f"arch {NATIVE!r}: {info.name} is {info.arch}, which kgen does "
                               f"not target (it targets {known}); name one that runs there")
    return found


def warn_newer_gpu(plan, info) -> None:
    """Warn (KgenTargetWarning) where a kernel planned for its own target runs on a GPU
    whose own target has a faster path (kgen.runtime.device.newer_target), saying how to plan
    for it. `info`: the GPU's DeviceInfo. kgen.load and kgen run call it once per kernel."""
    from .runtime.device import newer_target
    from .targets import target

    own = newer_target(plan.arch.value, info.compute_capability)
    if own is None:
        return
    major, minor = info.compute_capability
    gained = [i.value for i in target(ir.Arch(own)).instructions
              - target(plan.arch).instructions]
    warnings.warn(
        f"{plan.name} is planned for {plan.arch.value}, the kernel's target, and runs as "
        f"{plan.arch.value} code on {info.name} (compute capability {major}.{minor}), whose own "
        f"target {own} has a faster path ({', '.join(sorted(gained))}); plan for it with "
        f"--arch {own} or --arch {NATIVE} on the command line, arch=\"{own}\" or "
        f"arch=\"{NATIVE}\" in Python", KgenTargetWarning, stacklevel=3)


def file_hash(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


def safe_file_name(path: str | os.PathLike) -> str:
    """The file's base name as the generated comments show it: printable ASCII and no
    backslash (a backslash that ends a // comment line continues the comment onto the next)."""
    return _printable(os.path.basename(str(path)))


def _printable(text: str) -> str:
    return "".join(c if " " <= c <= "~" and c != "\\" else "?" for c in text)


def shown_path(path: str | os.PathLike) -> str:
    """A path as the recorded command shows it: as the user wrote it when relative, else its
    base name (an absolute path would tie the output to one machine); printable ASCII, no
    backslash, quoted for a shell where it needs to be."""
    text = os.fspath(path)
    if os.path.isabs(text):
        text = os.path.basename(text)
    return shlex.quote(_printable(text))


def compile_command(file_name: str, arch: ir.Arch | None, kernel: str | None,
                    output: str | os.PathLike | None = None,
                    sizes: Mapping[str, int] | None = None) -> str:
    """The command recorded in the emitted header, as the user ran it: the source path and the
    -o path as written (relative; see shown_path). Deterministic: no absolute paths, no dates."""
    parts = ["kgen", "compile", file_name]
    if kernel:
        parts += ["--kernel", kernel]
    if arch is not None:
        parts += ["--arch", arch.value]
    if sizes:
        parts += ["--size", ",".join(f"{name}={value}" for name, value in sizes.items())]
    if output is not None:
        parts += ["-o", shown_path(output)]
    return " ".join(parts)


def build(kernel: ir.Kernel, arch: str | ir.Arch | None = None, *, source_name: str = "<python>",
          source_hash: str | None = None, command: str = "kgen.build",
          header_name: str | None = None, config: Any = None) -> Built:
    """Verify, lower and emit a kernel built in Python: its plan, its CUDA source and its
    header. A mistake in the IR is a KgenError, located where the IR has locations; what
    verify warns about (an unused local) is a KgenSourceWarning. The arguments are
    build_verified's."""
    from .verify import verify

    if not isinstance(kernel, ir.Kernel):
        raise KgenError(NOWHERE, f"build() takes a kgen.ir.Kernel (build_file takes a .kg "
                                 f"file), got {type(kernel).__name__}")
    for warning in verify(ir.Module((kernel,))):
        warnings.warn(warning.render(), KgenSourceWarning, stacklevel=2)
    return build_verified(kernel, arch, source_name=source_name, source_hash=source_hash,
                          command=command, header_name=header_name, config=config)


def build_verified(kernel: ir.Kernel, arch: str | ir.Arch | None = None, *,
                   source_name: str = "<python>", source_hash: str | None = None,
                   command: str = "kgen.build", header_name: str | None = None,
                   config: Any = None) -> Built:
    """Lower and emit a kernel that verify has accepted (`build` and `read_module` verify):
    its plan, its CUDA source and its header (whose "Regenerate with" line adds `--header
    header_name`, default <kernel>.h). `source_hash`, the sha256 the headers show, defaults to
    that of the IR without its source locations (ir.canonical_text), so the same IR gives the
    same .cu. `config`: a kgen.targets.Config (a tuned one) that fills the schedule lines the
    kernel leaves out, tried before the builder's own."""
    from .emit import emit, emit_header

    if source_hash is None:
        source_hash = file_hash(ir.canonical_text(kernel).encode())
    plan = plan_kernel(kernel, arch_of(arch), config=config)
    source = emit(plan, source_name=source_name, source_hash=source_hash, command=command)
    header = emit_header(plan, source_name=source_name, source_hash=source_hash, command=command,
                         header_name=header_name)
    return Built(kernel, plan, source, header)


def plan_kernel(kernel: ir.Kernel, arch: str | ir.Arch | None = None, *, config: Any = None,
                source: str | None = None):
    """Lower a verified kernel to its plan (kgen.lower.lower), warning (KgenSlowPathWarning)
    where written schedule lines make the target plan a slower path than it plans without them
    (kgen/lower/slow_path.py): `source`, the file's text for the warning's source line (default:
    read from the kernel's file, where it has one)."""
    from .lower import lower, slow_path_warning

    arch = arch_of(arch)
    plan = lower(kernel, arch, config=config)
    # the warning is about the written lines and the builder's default plan, not a tuned one
    warning = slow_path_warning(kernel, arch, plan if config is None else None)
    if warning is not None:
        text = source if source is not None else _file_text(warning.loc)
        warnings.warn(warning.render(text), KgenSlowPathWarning, stacklevel=3)
    return plan


def _file_text(loc: SourceLoc) -> str | None:
    """The text of the file a location points into, or None (IR built in Python)."""
    if loc.line <= 0:
        return None
    try:
        return Path(loc.file).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None


def build_file(path: str | os.PathLike, arch: str | ir.Arch | None = None, *,
               kernel: str | None = None, output: str | os.PathLike | None = None,
               header: str | os.PathLike | None = None, config: Any = None,
               sizes: Mapping[str, int] | None = None) -> Built:
    """Parse, verify, lower and emit one kernel of a .kg file, exactly as `kgen compile PATH
    [-o OUTPUT] [--header HEADER] [--size ...]` (the paths as written go into the recorded
    command). `sizes`: every runtime size, planned for as `kgen run --size` plans without a
    tune entry (`sized_config`); the .cu still takes any size."""
    module, text = read_module(path)
    chosen = pick_kernel(module, kernel)
    target = arch_of(arch)
    if sizes is not None and config is None:
        config = sized_config(chosen, target, sizes)
    return build_verified(chosen, target, source_name=safe_file_name(path),
                          source_hash=file_hash(text.encode()),
                          command=compile_command(shown_path(path), target, kernel, output, sizes),
                          header_name=None if header is None else shown_path(header),
                          config=config)


def sized_config(kernel: ir.Kernel, arch: str | ir.Arch | None, sizes: Mapping[str, int], *,
                 every: bool = True):
    """The configuration these runtime sizes call for (kgen/lower/builder.py's `sized`; None
    where the builder's size-blind default serves them). `every`: each runtime size must be
    given (the choice depends on each one), else the missing ones take the harness's defaults
    (`kgen run` and `kgen inspect --size`)."""
    from .errors import ArgumentError
    from .harness.inputs import resolve_sizes, symbolic_dims
    from .lower import builder
    from .targets import target

    dims = resolve_sizes(kernel, sizes)  # first: an unknown name or a bad value
    missing = [dim for dim in symbolic_dims(kernel) if dim not in sizes]
    if every and missing:
        raise ArgumentError(f"no size given for {', '.join(missing)}: the schedule the sizes "
                            f"call for depends on every runtime size of {kernel.name}")
    return builder.sized(kernel, target(arch_of(arch) or kernel.target), dims)


def compile_source(source: str, name: str, arch: str | None = None, **options):
    """NVRTC-compile CUDA source (kernel `name`) to a cubin, through the cache."""
    from .runtime.nvrtc import compile_cubin

    return compile_cubin(source, name, arch, **options)


def load_built(built: Built, *, device: int | None = None,
               extra_options: Mapping[str, Any] | None = None):
    """Compile a built kernel for the present GPU and load it: its fast entry point now, a
    narrow one on the first launch that needs it (nvrtc.FAST_ENTRY_ONLY). Spills or local
    memory in ptxas' report are a KgenResourceWarning."""
    from .runtime.device import device_info
    from .runtime.launch import CompiledKernel
    from .runtime.nvrtc import compile_cubin, fast_entry_options, warn_resources

    info = device_info(device)
    extra = dict(extra_options or {})
    if is_program_plan(built.plan):  # a tile program: kgen/runtime/program.py
        from .runtime.program import CompiledProgram

        result = compile_cubin(built.source, built.plan.name, info.arch, extra_options=extra)
        warn_resources(result, stacklevel=3)
        return CompiledProgram(built.plan, result.cubin, source=built.source, compiled=result,
                               device_id=info.device_id)
    result = compile_cubin(built.source, built.plan.name, info.arch,
                           extra_options={**extra, **fast_entry_options(built.plan.narrow_kernel)})
    warn_resources(result, stacklevel=3)  # spills and local memory: kgen.runtime.nvrtc
    return CompiledKernel(built.plan, result.cubin, source=built.source, compiled=result,
                          device_id=info.device_id, narrow_compiled=False, extra_options=extra)


def load(path_or_kernel: str | os.PathLike | ir.Kernel, arch: str | ir.Arch | None = None, *,
         kernel: str | None = None, device: int | None = None,
         extra_options: Mapping[str, Any] | None = None, tuned: bool = True):
    """A callable kernel from a .kg file (one kernel, or the one named `kernel`) or from an
    `ir.Kernel`. `arch` overrides the kernel's `target` for planning; the code is compiled for
    the present GPU (`device`, default the current one). With `tuned` (the default), a kernel
    that `kgen tune` has tuned on this GPU runs, per call, the tuned schedule of the call's size
    bucket (kgen/tune/select.py: a TunedKernel); otherwise the CompiledKernel itself.
    `arch="native"` plans for the GPU `device`'s own target. Without `arch`, a kernel whose
    target is older than the GPU's own, where that has a faster path (an sm_80 file on an
    H100), warns once (KgenTargetWarning) and runs as its target's code."""
    if isinstance(arch, str) and arch == NATIVE:
        arch = native_arch(device)
    if isinstance(path_or_kernel, ir.Kernel):
        built = build(path_or_kernel, arch)  # verifies the IR

        def rebuild(config) -> Built:
            return build_verified(path_or_kernel, arch, config=config)
    else:
        built = build_file(path_or_kernel, arch, kernel=kernel)

        def rebuild(config) -> Built:
            return build_file(path_or_kernel, arch, kernel=kernel, config=config)
    compiled = load_built(built, device=device, extra_options=extra_options)
    from .runtime.device import device_info

    if arch is None:  # the file's own target: is the GPU's faster?
        warn_newer_gpu(built.plan, device_info(device))
    if not tuned or is_program_plan(built.plan):  # tile programs are not tuned yet
        return compiled
    from .tune.select import follow_cache

    def make(config):
        return load_built(rebuild(config), device=device, extra_options=extra_options)

    return follow_cache(built.kernel, built.plan.arch, device_info(device).name, compiled, make)
