"""kgen: fused GPU kernels from a short description, emitted as standalone CUDA C++."""
__version__ = "0.1.0"

# Public names, imported on first use so that `import kgen` stays fast and GPU-free.
_EXPORTS = {
    "load": ("kgen.api", "load"),
    "build": ("kgen.api", "build"),
    "build_file": ("kgen.api", "build_file"),
    "compile_source": ("kgen.api", "compile_source"),
    "torch_op": ("kgen.torch_library", "torch_op"),
    "CompiledKernel": ("kgen.runtime.launch", "CompiledKernel"),
    "DeviceBuffer": ("kgen.runtime.buffers", "DeviceBuffer"),
    "evaluate": ("kgen.reference", "evaluate"),
    "KgenError": ("kgen.errors", "KgenError"),
    "KgenRuntimeError": ("kgen.errors", "KgenRuntimeError"),
    "ArgumentError": ("kgen.errors", "ArgumentError"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        module, attribute = _EXPORTS[name]
        value = getattr(importlib.import_module(module), attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kgen' has no attribute {name!r}")
