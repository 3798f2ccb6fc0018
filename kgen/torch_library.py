"""A compiled kernel as a PyTorch operator: `torch.library` custom op with a fake implementation.

    k = kgen.load("examples/gemm_bias_relu.kg")
    gemm_bias_relu = kgen.torch_op(k)              # torch.ops.kgen.gemm_bias_relu
    D = gemm_bias_relu(A, B, C, bias, alpha=1.5)   # the outputs are allocated and returned

Inputs are the kernel's input parameters in declaration order (tensors and vectors as torch
tensors, scalars as floats with their declared defaults); the outputs come back in declaration
order, a single output as a tensor. The fake implementation gives torch.compile the outputs'
shapes, dtypes and strides without running anything, so the op traces without a graph break.
The real one is the kernel's own call (kgen.runtime.calls): the outputs allocated by PyTorch's
caching allocator, the launch on the current stream, no synchronization, so it can be captured
in a CUDA graph. The op is defined with `torch.library.Library` and a CUDA implementation: the
dispatcher adds about a microsecond to the kernel's call, where `torch.library.custom_op`'s
Python wrapper adds about ten (H200, bench/call_path.py).

The schema and the output shapes are pure functions of the plan (`op_schema`, `output_shapes`),
testable without PyTorch or a GPU.
"""
from __future__ import annotations

from typing import Any

from .enums import DType, ParamKind
from .errors import KgenRuntimeError
from .plan import KernelPlan
from .runtime.outputs import infer_sizes, inputs_of, output_shapes, outputs_of

__all__ = ["infer_sizes", "op_schema", "output_shapes", "torch_op"]

_TORCH_DTYPE = {DType.F16: "float16", DType.BF16: "bfloat16", DType.F32: "float32"}


def op_schema(plan: KernelPlan) -> str:
    """The operator's schema, e.g. `(Tensor A, Tensor B, float alpha=1.5) -> Tensor`."""
    args = []
    for p in inputs_of(plan):
        if p.kind is ParamKind.SCALAR:
            default = "" if p.default is None else f"={float(p.default)!r}"
            args.append(f"float {p.name}{default}")
        else:
            args.append(f"Tensor {p.name}")
    outs = outputs_of(plan)
    if not outs:
        raise KgenRuntimeError(f"{plan.name} has no output: a torch op must return something")
    result = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    return f"({', '.join(args)}) -> {result}"


_LIBRARIES: dict[str, Any] = {}  # namespace -> its torch.library.Library, kept alive


def torch_op(kernel, *, name: str | None = None, namespace: str = "kgen"):
    """Register `kernel` (a loaded kernel: kgen.load's result) as
    `torch.ops.<namespace>.<name>` and return it. Registering the same name twice in one
    process returns the first registration."""
    import torch

    plan: KernelPlan = kernel.plan
    op_name = name or plan.name
    qualified = f"{namespace}::{op_name}"
    existing = getattr(getattr(torch.ops, namespace, None), op_name, None)
    if existing is not None:
        return existing
    inputs = inputs_of(plan)
    names = tuple(p.name for p in inputs)
    outputs = outputs_of(plan)
    dtypes = {p.name: getattr(torch, _TORCH_DTYPE[p.dtype]) for p in outputs}

    def run(*args):
        # the dispatcher passes every argument, the declared defaults filled in
        return kernel(**dict(zip(names, args)))

    def fake(*args):
        args = tuple(args) + tuple(float(p.default) for p in inputs[len(args):])
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        shapes = {p.name: tuple(a.shape) for p, a in zip(inputs, args)
                  if p.kind is not ParamKind.SCALAR}
        layout = output_shapes(plan, infer_sizes(plan, shapes))
        values = [torch.empty_strided(*layout[p.name], dtype=dtypes[p.name], device=device)
                  for p in outputs]
        return values[0] if len(values) == 1 else tuple(values)

    library = _LIBRARIES.get(namespace)
    if library is None:
        library = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    library.define(op_name + op_schema(plan))
    library.impl(op_name, run, "CUDA")
    torch.library.register_fake(qualified, fake, lib=library)
    return getattr(getattr(torch.ops, namespace), op_name)
