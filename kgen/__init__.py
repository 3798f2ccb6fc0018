"""kgen: fused GPU kernels from a short description, emitted as standalone CUDA C++.

A kernel is written in the .kg language (docs/language.md) or built in Python from `kgen.ir`
(docs/python.md). The public API:

    load(path_or_kernel, arch=None)  a callable kernel compiled for the present GPU (NVRTC)
    build(kernel, arch=None)         an ir.Kernel verified, planned and emitted: a Built
                                     (.kernel, .plan, .source the .cu text, .header the .h)
    build_file(path, arch=None)      the same for one kernel of a .kg file (`kgen compile`)
    load_sequence(path, arch=None)   a file's sequence of kernels, compiled and loaded: call it
                                     with its parameters (workspace allocated, launched in order)
    compile_source(source, name)     NVRTC-compile CUDA source to a cubin, through the cache
    torch_op(compiled)               a loaded kernel as a torch.library operator
    attention(q, k, v, ...)          SDPA's drop-in: flash attention as a tile program, its
                                     score_mod and mask_mod kgen expressions
    attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, ...)
                                     the same over packed sequences (flash_attn_varlen_func)
    CompiledKernel                   what load returns: call it with the arguments as keywords
    DeviceBuffer                     GPU memory kgen allocates (outputs not passed in)
    evaluate(kernel, inputs)         the NumPy reference: every output of an ir.Kernel
    ir                               the IR: frozen dataclasses (Kernel, Param, Gemm, ...)
    errors                           KgenError (a located user mistake), KgenRuntimeError
                                     (NVRTC, the driver, a launch), ArgumentError (a bad
                                     runtime argument)

The names are imported on first use, so `import kgen` is fast and needs no GPU.
"""
__version__ = "0.1.0"

# Public names, imported on first use so that `import kgen` stays fast and GPU-free.
# (module, attribute); attribute None: the module itself.
_EXPORTS = {
    "load": ("kgen.api", "load"),
    "build": ("kgen.api", "build"),
    "build_file": ("kgen.api", "build_file"),
    "load_sequence": ("kgen.sequence", "load_sequence"),
    "compile_source": ("kgen.api", "compile_source"),
    "torch_op": ("kgen.torch_library", "torch_op"),
    "attention": ("kgen.attention", None),  # the module's namespace, callable: (q, k, v)
    "attention_varlen": ("kgen.attention_varlen", None),  # a callable module
    "CompiledKernel": ("kgen.runtime.launch", "CompiledKernel"),
    "DeviceBuffer": ("kgen.runtime.buffers", "DeviceBuffer"),
    "evaluate": ("kgen.reference", "evaluate"),
    "ir": ("kgen.ir", None),
    "errors": ("kgen.errors", None),
    "KgenError": ("kgen.errors", "KgenError"),
    "KgenRuntimeError": ("kgen.errors", "KgenRuntimeError"),
    "ArgumentError": ("kgen.errors", "ArgumentError"),
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        module, attribute = _EXPORTS[name]
        value = importlib.import_module(module)
        if attribute is not None:
            value = getattr(value, attribute)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kgen' has no attribute {name!r}")


def __dir__() -> list[str]:
    # dir(kgen), and so help(kgen), lists the public names before their first use
    return sorted(set(globals()) | set(_EXPORTS))
