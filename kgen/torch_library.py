"""A compiled kernel as a PyTorch operator: `torch.library` custom op with a fake implementation.

    k = kgen.load("examples/gemm_bias_relu.kg")
    gemm_bias_relu = kgen.torch_op(k)              # torch.ops.kgen.gemm_bias_relu
    D = gemm_bias_relu(A, B, C, bias, alpha=1.5)   # the outputs are allocated and returned

Inputs are the kernel's input parameters in declaration order (tensors and vectors as torch
tensors, scalars as floats with their declared defaults); the outputs come back in declaration
order, a single output as a tensor. The fake implementation gives torch.compile the outputs'
shapes, dtypes and strides without running anything, so the op traces without a graph break.
The real one allocates the outputs through PyTorch's caching allocator and launches on the
current stream, with no synchronization, so it can be captured in a CUDA graph.

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


def torch_op(kernel, *, name: str | None = None, namespace: str = "kgen"):
    """Register `kernel` (a CompiledKernel) as `torch.ops.<namespace>.<name>` and return it.
    Registering the same name twice in one process returns the first registration."""
    import torch

    plan: KernelPlan = kernel.plan
    op_name = name or plan.name
    qualified = f"{namespace}::{op_name}"
    existing = getattr(getattr(torch.ops, namespace, None), op_name, None)
    if existing is not None:
        return existing
    inputs = inputs_of(plan)
    outputs = outputs_of(plan)
    dtypes = {p.name: getattr(torch, _TORCH_DTYPE[p.dtype]) for p in outputs}

    def complete(args) -> tuple:
        """The arguments with the declared defaults of scalars not passed."""
        missing = [float(p.default) for p in inputs[len(args):]]
        return tuple(args) + tuple(missing)

    def shapes_of(args) -> dict[str, tuple]:
        return {p.name: tuple(a.shape) for p, a in zip(inputs, args)
                if p.kind is not ParamKind.SCALAR}

    def allocate(args, device) -> dict[str, Any]:
        layout = output_shapes(plan, infer_sizes(plan, shapes_of(args)))
        return {n: torch.empty_strided(shape, strides, dtype=dtypes[n], device=device)
                for n, (shape, strides) in layout.items()}

    def result(outs: dict[str, Any]):
        values = [outs[p.name] for p in outputs]
        return values[0] if len(values) == 1 else tuple(values)

    def run(*args):
        args = complete(args)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        outs = allocate(args, device)
        named = {p.name: a for p, a in zip(inputs, args)}
        stream = torch.cuda.current_stream(device)
        kernel(stream=stream.cuda_stream, **named, **outs)
        return result(outs)

    def fake(*args):
        args = complete(args)
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        return result(allocate(args, device))

    op = torch.library.custom_op(qualified, run, mutates_args=(), device_types="cuda",
                                 schema=op_schema(plan))
    op.register_fake(fake)
    return getattr(getattr(torch.ops, namespace), op_name)
