"""The GPU as the runtime sees it: is one there, which arch, its properties, driver errors.

Everything GPU-facing in kgen goes through here or through cuda.core, so that a machine without
a GPU can import all of kgen and compile with NVRTC. Contexts are the device's primary context,
the one PyTorch and CuPy use, so pointers from them are valid in kgen launches.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from ..errors import KgenRuntimeError


def _driver():
    from cuda.bindings import driver

    return driver


def check(result, what: str):
    """Unpack a cuda.bindings result tuple, raising KgenRuntimeError on a driver error."""
    driver = _driver()
    err = result[0]
    if err != driver.CUresult.CUDA_SUCCESS:
        raise KgenRuntimeError(f"{what} failed: {error_text(err)}")
    rest = result[1:]
    if not rest:
        return None
    return rest[0] if len(rest) == 1 else rest


def error_text(err) -> str:
    driver = _driver()
    name_err, name = driver.cuGetErrorName(err)
    desc_err, desc = driver.cuGetErrorString(err)
    name = name.decode() if name_err == driver.CUresult.CUDA_SUCCESS and name else str(err)
    desc = desc.decode() if desc_err == driver.CUresult.CUDA_SUCCESS and desc else ""
    return f"{name} ({desc})" if desc else name


@functools.lru_cache(maxsize=1)
def device_count() -> int:
    """How many CUDA devices the driver sees; 0 without a driver or a GPU."""
    try:
        driver = _driver()
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return 0
        err, count = driver.cuDeviceGetCount()
        return int(count) if err == driver.CUresult.CUDA_SUCCESS else 0
    except Exception:  # no libcuda.so, or bindings that cannot load it
        return 0


def gpu_available() -> bool:
    return device_count() > 0


def require_gpu(what: str = "this") -> None:
    if not gpu_available():
        raise KgenRuntimeError(f"no CUDA GPU is available: {what} needs one")


def current_device_id() -> int:
    """The device of the current context, or 0 when no context is current."""
    require_gpu("running a kernel")
    driver = _driver()
    err, ctx = driver.cuCtxGetCurrent()
    if err != driver.CUresult.CUDA_SUCCESS or not int(ctx):
        return 0
    return int(check(driver.cuCtxGetDevice(), "cuCtxGetDevice"))


def activate(device_id: int) -> None:
    """Make the device's primary context current on this thread (a no-op when it already is)."""
    require_gpu("running a kernel")
    driver = _driver()
    err, ctx = driver.cuCtxGetCurrent()
    if err == driver.CUresult.CUDA_SUCCESS and int(ctx):
        err, dev = driver.cuCtxGetDevice()
        if err == driver.CUresult.CUDA_SUCCESS and int(dev) == device_id:
            return
    from cuda.core import Device

    if device_id >= device_count():
        raise KgenRuntimeError(f"there is no CUDA device {device_id} ({device_count()} present)")
    Device(device_id).set_current()


@dataclass(frozen=True, slots=True)
class DeviceInfo:
    device_id: int
    name: str
    compute_capability: tuple[int, int]
    sm_count: int
    l2_bytes: int
    smem_optin_bytes: int  # the most dynamic shared memory one block may opt into
    clock_khz: int

    @property
    def arch(self) -> str:
        return arch_for(self.compute_capability)


def arch_for(cc: tuple[int, int]) -> str:
    """The NVRTC arch of a compute capability: 9.0 -> sm_90a (wgmma, setmaxnreg need the `a`)."""
    major, minor = cc
    return f"sm_{major}{minor}a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"


def device_info(device_id: int | None = None) -> DeviceInfo:
    """The properties of device `device_id`, or of the current context's device: asked anew
    each call (a caller may switch devices), the properties themselves cached per device."""
    if device_id is None:
        device_id = current_device_id()
    return _device_info(device_id)


@functools.lru_cache(maxsize=None)
def _device_info(device_id: int) -> DeviceInfo:
    require_gpu("querying the device")
    driver = _driver()
    dev = check(driver.cuDeviceGet(device_id), "cuDeviceGet")
    attr = driver.CUdevice_attribute

    def get(a) -> int:
        return int(check(driver.cuDeviceGetAttribute(a, dev), f"cuDeviceGetAttribute({a})"))

    raw_name = check(driver.cuDeviceGetName(256, dev), "cuDeviceGetName")
    name = raw_name.split(b"\0", 1)[0].decode(errors="replace")
    return DeviceInfo(
        device_id=device_id,
        name=name,
        compute_capability=(
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR),
            get(attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR),
        ),
        sm_count=get(attr.CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT),
        l2_bytes=get(attr.CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE),
        smem_optin_bytes=get(attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN),
        clock_khz=get(attr.CU_DEVICE_ATTRIBUTE_CLOCK_RATE),
    )


def capability(arch: str) -> tuple[int, int]:
    """The compute capability an arch name is for: sm_90a -> (9, 0)."""
    digits = arch.removeprefix("sm_").rstrip("a")
    return int(digits[:-1]), int(digits[-1])


def newer_target(plan_arch: str, cc: tuple[int, int]) -> str | None:
    """The device's own kgen target where a kernel planned for `plan_arch` runs on a newer
    device (compute capability `cc`) whose target has instructions `plan_arch`'s lacks (an
    sm_80 plan on 9.0: sm_90a, with wgmma and TMA, the faster path); else None. Pure: no GPU
    is asked."""
    from ..enums import Arch
    from ..targets import target

    own, planned = Arch.from_name(arch_for(cc)), Arch.from_name(plan_arch)
    if own is None or planned is None or cc <= capability(plan_arch):
        return None
    return own.value if target(own).instructions > target(planned).instructions else None


def can_run(plan_arch: str, cc: tuple[int, int]) -> str | None:
    """None when code planned for `plan_arch` can run on a device of compute capability `cc`
    (compiled for the device's own arch), else the reason it cannot."""
    want = capability(plan_arch)
    if plan_arch.endswith("a"):
        # Arch-specific features (wgmma, setmaxnreg) exist on that exact arch only.
        if cc != want:
            return f"the kernel is planned for {plan_arch}, which only runs on {want[0]}.{want[1]}"
        return None
    if cc < want:
        return f"the kernel is planned for {plan_arch} and needs compute capability {want[0]}." \
               f"{want[1]} or newer"
    return None


def driver_version() -> tuple[int, int]:
    """The CUDA version the installed driver supports, e.g. (13, 0)."""
    version = check(_driver().cuDriverGetVersion(), "cuDriverGetVersion")
    return int(version) // 1000, int(version) % 1000 // 10


def driver_refusal(driver: tuple[int, int], nvrtc: tuple[int, int]) -> str | None:
    """None when a driver supporting CUDA `driver` loads cubins from NVRTC `nvrtc`, else why
    not: a cubin needs a driver of at least NVRTC's major version (CUDA's minor-version
    compatibility covers the minors)."""
    if driver[0] >= nvrtc[0]:
        return None
    return (f"the NVIDIA driver supports CUDA {driver[0]}.{driver[1]}, but NVRTC "
            f"{nvrtc[0]}.{nvrtc[1]} compiles the kernels: install a driver for CUDA {nvrtc[0]} "
            f"(R580 or later for CUDA 13), or an older nvidia-cuda-nvrtc (pip install "
            f"'nvidia-cuda-nvrtc<{nvrtc[0]}')")
