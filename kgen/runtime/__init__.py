"""kgen's runtime: NVRTC compilation with an on-disk cache, tensors from any GPU library,
checked launches, tensor maps. It reads the plan only (never the IR); the run, check and timing
harness is kgen.harness. Importing it needs no GPU; touching the GPU does."""
from .buffers import DeviceBuffer
from .cache import CompileCache, KgenCacheWarning
from .device import DeviceInfo, device_info, gpu_available
from .launch import BoundArguments, CompiledKernel, bind_arguments, params_struct
from .nvrtc import CompileResult, compile_cubin, nvrtc_version, parse_ptxas_report
from .tensors import DeviceArray, as_device_array

__all__ = [
    "BoundArguments",
    "CompileCache",
    "CompileResult",
    "CompiledKernel",
    "DeviceArray",
    "DeviceBuffer",
    "DeviceInfo",
    "KgenCacheWarning",
    "as_device_array",
    "bind_arguments",
    "compile_cubin",
    "device_info",
    "gpu_available",
    "nvrtc_version",
    "params_struct",
    "parse_ptxas_report",
]
