"""The same kernel written with PyTorch ops: what a user would run instead (the baseline).

`torch.matmul` in the inputs' dtype (cuBLAS), then the epilogue evaluated op by op on torch
tensors, unfused, mirroring the NumPy reference's traversal. Only used for timing comparisons.
A batched kernel runs batched: torch.matmul over [L, M, K] and [L, K, N] (a 2-D operand
broadcast to every batch), each epilogue op on [L, M, N], reductions per batch.
"""
from __future__ import annotations

from typing import Any, Mapping

from .. import ir
from ..reference import EpilogueEvaluator


def torch_dtype(dtype: ir.DType):
    import torch

    return {ir.DType.F16: torch.float16, ir.DType.BF16: torch.bfloat16,
            ir.DType.F32: torch.float32}[dtype]


class TorchEvaluator(EpilogueEvaluator):
    """Evaluates a kernel on torch tensors given by name (logical shapes, any strides)."""

    def __init__(self, kernel: ir.Kernel, tensors: Mapping[str, Any],
                 scalars: Mapping[str, float]):
        super().__init__(kernel)
        import torch

        self.torch = torch
        self.tensors = tensors
        self.scalars = dict(scalars)
        self._ops = self._op_table()

    def _tensor_like(self, value, like):
        if isinstance(value, self.torch.Tensor):
            return value
        reference = like if isinstance(like, self.torch.Tensor) else None
        device = reference.device if reference is not None else "cuda"
        dtype = reference.dtype if reference is not None else self.torch.float32
        return self.torch.tensor(value, device=device, dtype=dtype)

    def _pair(self, a, b):
        return self._tensor_like(a, b), self._tensor_like(b, a)

    def _op_table(self):
        torch = self.torch
        F = torch.nn.functional

        def minimum(a, b):
            return torch.minimum(*self._pair(a, b))

        def maximum(a, b):
            return torch.maximum(*self._pair(a, b))

        def where(c, a, b):
            c = self._tensor_like(c, a if isinstance(a, torch.Tensor) else b)
            a, b = self._pair(a, b)
            return torch.where(c != 0, a, b)

        def compare(fn):
            return lambda a, b: fn(*self._pair(a, b)).to(
                a.dtype if isinstance(a, torch.Tensor) else b.dtype)

        return {
            ir.Op.ADD: lambda a, b: a + b,
            ir.Op.SUB: lambda a, b: a - b,
            ir.Op.MUL: lambda a, b: a * b,
            ir.Op.DIV: lambda a, b: a / b,
            ir.Op.NEG: lambda a: -a,
            ir.Op.MIN: minimum,
            ir.Op.MAX: maximum,
            ir.Op.ABS: torch.abs,
            ir.Op.EXP: torch.exp,
            ir.Op.LOG: torch.log,
            ir.Op.SQRT: torch.sqrt,
            ir.Op.RSQRT: torch.rsqrt,
            ir.Op.TANH: torch.tanh,
            ir.Op.SIGMOID: torch.sigmoid,
            ir.Op.RELU: torch.relu,
            ir.Op.LEAKY_RELU: lambda x, s: F.leaky_relu(x, float(s)),
            ir.Op.CLAMP: lambda x, lo, hi: torch.clamp(x, float(lo), float(hi))
            if not isinstance(lo, torch.Tensor) and not isinstance(hi, torch.Tensor)
            else minimum(maximum(x, lo), hi),
            ir.Op.GELU: lambda x: F.gelu(x),
            ir.Op.GELU_TANH: lambda x: F.gelu(x, approximate="tanh"),
            ir.Op.SILU: F.silu,
            ir.Op.HARDSWISH: F.hardswish,
            ir.Op.LT: compare(torch.lt),
            ir.Op.LE: compare(torch.le),
            ir.Op.GT: compare(torch.gt),
            ir.Op.GE: compare(torch.ge),
            ir.Op.EQ: compare(torch.eq),
            ir.Op.NE: compare(torch.ne),
            ir.Op.WHERE: where,
        }

    def _shape_of(self, acc):
        return tuple(acc.shape)  # [M, N], or [L, M, N] in a batched kernel

    def operand(self, name):
        return self.tensors[name]

    def matmul(self, a, b, gemm):
        return self.torch.matmul(a, b)

    def to_operand(self, value, dtype):
        return value.to(torch_dtype(dtype))

    def const(self, value):
        return float(value)

    def scalar(self, name):
        if name in self.scalars:
            return float(self.scalars[name])
        return float(self.kernel.param(name).default)

    def tensor(self, name):
        return self.tensors[name]

    def vector(self, name, axis):
        vector = self.tensors[name]
        # [.., M, 1] or [.., 1, N]: a batched vector's batch meets the accumulator's
        return vector[..., :, None] if axis is ir.Axis.ROW else vector[..., None, :]

    def call(self, op, args):
        if not any(isinstance(a, self.torch.Tensor) for a in args):
            from ..reference import numpy_op

            return float(numpy_op(op, *args))
        return self._ops[op](*args)

    def cast(self, value, dtype):
        if not isinstance(value, self.torch.Tensor):
            return value
        return value.to(torch_dtype(dtype)).to(value.dtype)

    def reduce(self, op, axis, value, shape):
        torch = self.torch
        value = value.expand(shape) if isinstance(value, torch.Tensor) else \
            torch.full(shape, value, device="cuda")
        if op is ir.ReduceOp.ABSMAX:
            value = value.abs()
        dims = {ir.Axis.ROW: (-1,), ir.Axis.COL: (-2,), ir.Axis.ALL: (-2, -1)}[axis]
        if op is ir.ReduceOp.SUM:
            return value.sum(dim=dims)
        if op is ir.ReduceOp.MIN:
            return value.amin(dim=dims)
        return value.amax(dim=dims)

    def reload(self, stored):
        return stored

    def store(self, value, param, shape):
        if not isinstance(value, self.torch.Tensor):
            value = self.torch.full(shape, value, device="cuda")
        return value.to(torch_dtype(param.dtype))

