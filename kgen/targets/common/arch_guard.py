"""Where an emitted kernel may run, said once for the .cu's three gates: the #error that stops
a device compilation for the wrong arch, the feature macro that guards sm_90a-only device code
(nvcc -arch=sm_90a also compiles a compute_90 PTX pass, where wgmma does not exist), and the
launcher's check of the current device's compute capability."""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Arch
from ...plan import KernelPlan, Mma

# Defined by nvcc and NVRTC only in a device pass for sm_90a (arch-specific features on).
SM90A_FEATURE = "__CUDA_ARCH_FEAT_SM90_ALL"


@dataclass(frozen=True, slots=True)
class ArchGuard:
    build_cond: str  # preprocessor condition under which a device pass must stop
    build_error: str  # the #error text
    feature: str  # the macro the kernel body needs ("" when the body builds for any pass)
    device_cond: str  # C++ condition on `major`, `minor` under which the device cannot run it
    device_reason: str  # what <name>_can_implement says then


def guard(plan: KernelPlan) -> ArchGuard:
    """The guard of a gemm or chain plan (wgmma code when its schedule says so; sm_89's FP8
    mma.sync where its gemm multiplies FP8 operands on that MMA)."""
    if any(g.atom.instruction is Mma.MMA_SYNC_FP8 for g in plan.schedule.gemms):
        return ArchGuard(
            build_cond="defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 890",
            build_error=f"{plan.name}.cu needs sm_89 or later (mma.sync on FP8 operands): "
                        "build it with nvcc -arch=sm_89 or newer",
            feature="",
            device_cond="major * 10 + minor < 89",
            device_reason=f"{plan.name} needs a device of compute capability 8.9 or later "
                          "(mma.sync on FP8 operands)",
        )
    return guard_for(plan.name, plan.arch, plan.schedule.wgmma)


def guard_for(name: str, arch: Arch, wgmma: bool) -> ArchGuard:
    """The build and device guards of kernel `name` planned for `arch`; `wgmma`: it holds
    sm_90a-only instructions (else sm_90a plans run code any later device could)."""
    if arch is Arch.SM90A and wgmma:
        return ArchGuard(
            build_cond="defined(__CUDA_ARCH__) && __CUDA_ARCH__ != 900",
            build_error=f"{name}.cu needs sm_90a (wgmma): build it with nvcc -arch=sm_90a",
            feature=SM90A_FEATURE,
            device_cond="major != 9 || minor != 0",
            device_reason=f"{name} is sm_90a code: it runs on compute capability 9.0 only",
        )
    if arch is Arch.SM90A:
        return ArchGuard(
            build_cond="defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900",
            build_error=f"{name}.cu was planned for sm_90a: build it with nvcc -arch=sm_90a",
            feature="",
            device_cond="major != 9 || minor != 0",
            device_reason=f"{name} was planned for sm_90a: it runs on compute capability 9.0 "
                          "only",
        )
    # the sm_80 family (sm_80, sm_86, sm_89): mma.sync and cp.async, any later device
    return ArchGuard(
        build_cond="defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 800",
        build_error=f"{name}.cu needs sm_80 or later (mma.sync, cp.async): build it with "
                    f"nvcc -arch=sm_80 or newer",
        feature="",
        device_cond="major < 8",
        device_reason=f"{name} needs a device of compute capability 8.0 or later",
    )
