"""A CompiledKernel's entry points: a function of a loaded module, the opt-in that lets it launch
with the plan's shared memory, and the narrow entry point compiled on demand where the module
was compiled with the fast one alone (nvrtc.FAST_ENTRY_ONLY)."""
from __future__ import annotations

from typing import Any, Mapping

from ..errors import KgenRuntimeError
from ..plan import KernelPlan

DEFAULT_SMEM_LIMIT = 48 * 1024  # dynamic shared memory a kernel gets without opting in


def function_of(module: Any, name: str | None):
    """The CUfunction (of the current context) of entry `name` of a cuda.core ObjectCode, or
    None for no name."""
    if name is None:
        return None
    from cuda.bindings import driver

    from .device import check

    kernel = module.get_kernel(name)
    return check(driver.cuKernelGetFunction(kernel.handle), f"cuKernelGetFunction({name})")


def allow_smem(function, smem_bytes: int) -> None:
    """Lets `function` launch with `smem_bytes` of dynamic shared memory: an opt-in where they
    and its static shared memory (a `__shared__` array of the kernel's own) pass 48 KB."""
    if function is None:
        return
    from cuda.bindings import driver

    from .device import check

    static = check(driver.cuFuncGetAttribute(
        driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, function),
        "cuFuncGetAttribute(SHARED_SIZE_BYTES)") if smem_bytes else 0
    if smem_bytes + static <= DEFAULT_SMEM_LIMIT:
        return

    check(
        driver.cuFuncSetAttribute(
            function,
            driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            smem_bytes,
        ),
        "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)",
    )


def compile_narrow(plan: KernelPlan, source: str | None, device_id: int,
                   extra_options: Mapping[str, Any]) -> tuple[Any, Any]:
    """The narrow entry point of `plan`, compiled from the whole `source` (both entry points) for
    the device and loaded: (the module, to keep alive; its function, ready to launch)."""
    from cuda.core import ObjectCode

    from .device import device_info
    from .nvrtc import compile_cubin, warn_resources

    name = plan.narrow_kernel
    if source is None:
        raise KgenRuntimeError(f"{plan.name}: these arguments need {name}, which its module "
                               "lacks, and no source was given to compile it from")
    result = compile_cubin(source, name, device_info(device_id).arch,
                           extra_options=extra_options)
    warn_resources(result, stacklevel=6)
    module = ObjectCode.from_cubin(result.cubin, name=name)
    function = function_of(module, name)
    allow_smem(function, plan.smem_bytes)
    return module, function
