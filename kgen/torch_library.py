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
in a CUDA graph. The op is defined with `torch.library.Library` and a CUDA implementation
(`torch.library.custom_op`'s Python wrapper cost about 10 us more per call on an H200).

`torch_op` returns a `KernelOp`: called eagerly on plain tensors, it calls the kernel itself,
since the dispatcher's boxing of a Python-implemented op costs 3-10 us a call; under
torch.compile, a dispatch mode, fake or subclassed tensors, or with autograd recording, it calls
the registered op (`KernelOp.op`, also `torch.ops.<namespace>.<name>`), so tracing, modes and
autograd's errors see the op itself.

The schema and the output shapes are pure functions of the plan (`op_schema`, `output_shapes`),
testable without PyTorch or a GPU. A tile program (kgen/runtime/program.py's CompiledProgram)
registers the same way: its outputs are contiguous, their shapes from the inputs' sizes
(kgen.runtime.program.output_shapes). `sequence_op` registers a loaded sequence, and
`function_op` a Python function that launches kernels (kgen.attention_varlen's forward and
backward: sizes no tensor gives, outputs in FlashAttention's packed layout, the signature an
argument), each through the same definition (`_register`) and KernelOp.
"""
from __future__ import annotations

from typing import Any

from .enums import DType, ParamKind, Role
from .errors import KgenRuntimeError
from .plan import KernelPlan
from .runtime.outputs import infer_sizes, inputs_of, output_shapes, outputs_of

__all__ = ["KernelOp", "function_op", "infer_sizes", "op_schema", "output_shapes", "sequence_op",
           "torch_op"]

_TORCH_DTYPE = {DType.F16: "float16", DType.BF16: "bfloat16", DType.F32: "float32",
                DType.F8E4M3: "float8_e4m3fn", DType.F8E5M2: "float8_e5m2"}


def _is_program(plan) -> bool:
    from .api import is_program_plan

    return is_program_plan(plan)


def _inputs(plan) -> tuple:
    if _is_program(plan):  # a tile program's ProgramParams
        return tuple(p for p in plan.params if p.role is Role.IN)
    return inputs_of(plan)


def _outputs(plan) -> tuple:
    if _is_program(plan):
        return tuple(p for p in plan.params if p.role is Role.OUT)
    return outputs_of(plan)


def _is_scalar(p) -> bool:
    return p.kind == "scalar" if isinstance(p.kind, str) else p.kind is ParamKind.SCALAR


def op_schema(plan: KernelPlan) -> str:
    """The operator's schema, e.g. `(Tensor A, Tensor B, float alpha=1.5) -> Tensor` (a gemm
    kernel's or a tile program's plan)."""
    args = []
    for p in _inputs(plan):
        if _is_scalar(p) and getattr(p, "dtype", None) is DType.U64:
            args.append(f"int {p.name}")  # its 64 bits as torch's int64 (a random seed)
        elif _is_scalar(p):
            default = "" if p.default is None else f"={float(p.default)!r}"
            args.append(f"float {p.name}{default}")
        else:
            args.append(f"Tensor {p.name}")
    outs = _outputs(plan)
    if not outs:
        raise KgenRuntimeError(f"{plan.name} has no output: a torch op must return something")
    result = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    return f"({', '.join(args)}) -> {result}"


_LIBRARIES: dict[str, Any] = {}  # namespace -> its torch.library.Library, kept alive
_OPS: dict[str, "KernelOp"] = {}  # qualified name -> the KernelOp registered under it


class KernelOp:
    """A kernel as a torch op: `op(A, B, ..., alpha=...)` (see the module's note). `op.op` is
    the registered `torch.ops.<namespace>.<name>`."""

    def __init__(self, kernel, op, names: tuple[str, ...]):
        import torch

        self.kernel = kernel
        self.op = op
        self._names = names
        self._torch = torch
        self._tensor = torch.Tensor
        try:  # how many dispatch modes are active (FakeTensorMode, FlopCounterMode, ...)
            from torch.utils._python_dispatch import _len_torch_dispatch_stack as modes
        except ImportError:  # a torch without it: every call through the op
            modes = None
        self._modes = modes

    def _eager(self, values) -> bool:
        """Whether the kernel itself may run this call: no tracing, no dispatch mode, plain
        tensors, nothing for autograd to record."""
        torch = self._torch
        # is_compiling first: torch.compile reads it as True and traces no further
        if torch.compiler.is_compiling() or self._modes is None or self._modes():
            return False
        tensor = self._tensor
        grad = torch.is_grad_enabled()
        for value in values:
            if type(value) is tensor:
                if grad and value.requires_grad:
                    return False
            elif isinstance(value, tensor):  # a subclass (fake, functional, ...)
                return False
        return True

    def __call__(self, *args, **kwargs):
        names = self._names
        if len(args) <= len(names):
            if not kwargs:
                if self._eager(args):
                    return self.kernel(**dict(zip(names, args)))
            elif (all(k in names for k in kwargs) and self._eager(args)
                  and self._eager(kwargs.values())):
                named = dict(zip(names, args))
                if not kwargs.keys() & named.keys():  # given twice: the op's message
                    named.update(kwargs)
                    return self.kernel(**named)
        return self.op(*args, **kwargs)

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.op, name)  # default, overloads, ...

    def __repr__(self) -> str:
        return f"KernelOp({self.op!r}, {self.kernel!r})"


def torch_op(kernel, *, name: str | None = None, namespace: str = "kgen"):
    """Register `kernel` (a loaded kernel: kgen.load's result) as
    `torch.ops.<namespace>.<name>` and return its KernelOp. Registering the same name twice in
    one process returns the first registration."""
    import torch

    plan: KernelPlan = kernel.plan
    op_name = name or plan.name
    qualified = f"{namespace}::{op_name}"
    if qualified in _OPS:
        return _OPS[qualified]
    existing = getattr(getattr(torch.ops, namespace, None), op_name, None)
    if existing is not None:  # registered by other code: the op itself
        return existing
    inputs = _inputs(plan)
    names = tuple(p.name for p in inputs)
    outputs = _outputs(plan)
    dtypes = {p.name: getattr(torch, _TORCH_DTYPE[p.dtype]) for p in outputs}
    program = _is_program(plan)

    def run(*args):
        # the dispatcher passes every argument, the declared defaults filled in
        return kernel(**dict(zip(names, args)))

    def fake(*args):
        args = tuple(args) + tuple(float(p.default) for p in inputs[len(args):])
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        shapes = {p.name: tuple(a.shape) for p, a in zip(inputs, args) if not _is_scalar(p)}
        if program:  # contiguous, as CompiledProgram allocates them
            from .runtime.program import output_shapes as program_shapes

            found = program_shapes(plan, shapes)
            values = [torch.empty(found[p.name], dtype=dtypes[p.name], device=device)
                      for p in outputs]
        else:
            layout = output_shapes(plan, infer_sizes(plan, shapes))
            values = [torch.empty_strided(*layout[p.name], dtype=dtypes[p.name], device=device)
                      for p in outputs]
        return values[0] if len(values) == 1 else tuple(values)

    return _register(namespace, op_name, op_schema(plan), run, fake, kernel, names)


def sequence_schema(plan) -> str:
    """A sequence's operator schema (kgen/runtime/sequence.py's SequencePlan): its parameters
    that no kernel writes, in order, then its outputs."""
    args = []
    for b in plan.params:
        if b.written:
            continue
        if b.kind is ParamKind.SCALAR:
            default = "" if b.default is None else f"={float(b.default)!r}"
            args.append(f"float {b.name}{default}")
        else:
            args.append(f"Tensor {b.name}")
    outs = plan.outputs
    result = "Tensor" if len(outs) == 1 else "(" + ", ".join("Tensor" for _ in outs) + ")"
    return f"({', '.join(args)}) -> {result}"


def sequence_op(sequence, *, name: str | None = None, namespace: str = "kgen"):
    """Register a loaded sequence (kgen/runtime/sequence.py's CompiledSequence) as
    `torch.ops.<namespace>.<name>`, as torch_op registers a kernel: inputs the parameters no
    kernel writes, outputs allocated (contiguous) and returned; a KernelOp."""
    import torch

    from .runtime.sequence import output_shapes as sequence_shapes

    plan = sequence.plan
    op_name = name or plan.name
    qualified = f"{namespace}::{op_name}"
    if qualified in _OPS:
        return _OPS[qualified]
    inputs = tuple(b for b in plan.params if not b.written)
    names = tuple(b.name for b in inputs)
    dtypes = {b.name: getattr(torch, _TORCH_DTYPE[b.dtype]) for b in plan.outputs}

    def run(*args):
        return sequence(**dict(zip(names, args)))

    def fake(*args):
        args = tuple(args) + tuple(float(b.default) for b in inputs[len(args):])
        device = next((a.device for a in args if isinstance(a, torch.Tensor)), None)
        shapes = {b.name: tuple(a.shape) for b, a in zip(inputs, args)
                  if b.kind is not ParamKind.SCALAR}
        found = sequence_shapes(plan, shapes)
        values = [torch.empty(found[b.name], dtype=dtypes[b.name], device=device)
                  for b in plan.outputs]
        return values[0] if len(values) == 1 else tuple(values)

    return _register(namespace, op_name, sequence_schema(plan), run, fake, sequence, names)


def function_op(function, schema: str, fake, *, name: str, namespace: str = "kgen"):
    """Register a Python function that launches loaded kernels as
    `torch.ops.<namespace>.<name>`, as torch_op registers a kernel: `schema` its arguments and
    results in torch's schema language (`(Tensor Q, int S, str? mod, float[] values) -> (Tensor,
    Tensor)`), `function` the CUDA implementation, its parameters the schema's arguments in
    order, called by their names (it allocates and returns the outputs), `fake(*arguments)`
    the outputs' fake tensors; a KernelOp, whose eager calls go to `function` itself. For a
    call that binds what the kernels' own ops cannot (sizes no tensor gives, outputs in a
    layout of the caller's)."""
    import inspect

    qualified = f"{namespace}::{name}"
    if qualified in _OPS:
        return _OPS[qualified]
    names = tuple(inspect.signature(function).parameters)

    def run(*args):
        return function(**dict(zip(names, args)))

    return _register(namespace, name, schema, run, fake, function, names)


def _register(namespace: str, op_name: str, schema: str, run, fake, call, names):
    """Define `namespace::op_name` with `schema`: `run` its CUDA implementation, `fake` its
    fake one; the KernelOp calling `call` eagerly (kept in _OPS)."""
    import torch

    library = _LIBRARIES.get(namespace)
    if library is None:
        library = _LIBRARIES[namespace] = torch.library.Library(namespace, "FRAGMENT")
    library.define(op_name + schema)
    library.impl(op_name, run, "CUDA")
    torch.library.register_fake(f"{namespace}::{op_name}", fake, lib=library)
    _OPS[f"{namespace}::{op_name}"] = wrapped = KernelOp(
        call, getattr(getattr(torch.ops, namespace), op_name), names)
    return wrapped
