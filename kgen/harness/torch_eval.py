"""The same kernel written with PyTorch ops: what a user would run instead (the baseline).

`torch.matmul` in the inputs' dtype (cuBLAS), then the epilogue evaluated op by op on torch
tensors, unfused, mirroring the NumPy reference's traversal. Only used for timing comparisons.
A tile program (a loop kernel or a row kernel) runs as the reference does with one block over
the loop's whole dimension: the unfused computation (for attention: the scores, their row max
and sum, P @ V), every (batch, head) at once, GQA by repeating the shared heads.
A batched kernel runs batched: torch.matmul over [L, M, K] and [L, K, N] (a 2-D operand
broadcast to every batch), each epilogue op on [L, M, N], reductions per batch.
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from .. import ir
from ..reference import EpilogueEvaluator


def torch_dtype(dtype: ir.DType):
    import torch

    return {ir.DType.F16: torch.float16, ir.DType.BF16: torch.bfloat16,
            ir.DType.F32: torch.float32, ir.DType.F8E4M3: torch.float8_e4m3fn,
            ir.DType.F8E5M2: torch.float8_e5m2}[dtype]


def scaled_mm_takes(a, b) -> bool:
    """Whether torch._scaled_mm takes FP8 operands a [M, K] and b [K, N]: a row-major, b
    column-major, K and N multiples of 16, not both e5m2."""
    import torch

    m, k = a.shape[-2:]
    n = b.shape[-1]
    return (a.dim() == 2 and b.dim() == 2 and k % 16 == 0 and n % 16 == 0
            and a.stride(-1) == 1 and b.stride(-2) == 1
            and not (a.dtype == b.dtype == torch.float8_e5m2))


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
        torch = self.torch
        fp8 = (torch.float8_e4m3fn, torch.float8_e5m2)
        if gemm.scales:  # block scales: the dequantized operands in f32, unfused
            return torch.matmul(self._dequantized(a, gemm, gemm.a.name),
                                self._dequantized(b, gemm, gemm.b.name))
        if a.dtype in fp8 and b.dtype in fp8:  # what a user runs: torch._scaled_mm
            if scaled_mm_takes(a, b):  # (the epilogue's scales multiply after it, unfused)
                one = torch.ones((), device=a.device, dtype=torch.float32)
                return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.float32)
            return torch.matmul(a.float(), b.float())  # sizes _scaled_mm refuses
        return torch.matmul(a, b)

    def _dequantized(self, operand, gemm, name):
        """An FP8 operand in f32 times its block scales (A [M, K], B [K, N])."""
        scale = next((s for s in gemm.scales if s.operand == name), None)
        value = operand.float()
        if scale is None:
            return value
        rows, k = scale.block
        factors = self.tensors[scale.param].float().repeat_interleave(k, dim=1)
        factors = factors.repeat_interleave(rows, dim=0)
        if name == gemm.a.name:
            return value * factors[:value.shape[0], :value.shape[1]]
        return value * factors[:value.shape[1], :value.shape[0]].t()

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


    # -- tile programs: the unfused PyTorch of a loop kernel or a row kernel ----------------------

    def run(self) -> dict[str, Any]:
        if self.kernel.loop is not None or (self.kernel.epilogue is not None
                                            and not self.kernel.gemms):
            return self._run_tiles()
        return super().run()

    def _run_tiles(self) -> dict[str, Any]:
        """A tile program as PyTorch would run it unfused: the loop as one block over its whole
        dimension (the reference's meaning with block = that dimension: the handed-on value
        rounded once to the operand dtype), every (batch, head) at once, GQA by repeating the
        shared heads. The same statements in the same order as kgen/reference_tiles.py."""
        from ..reference_tiles import rows_param

        torch = self.torch
        kernel = self.kernel
        lead = self._tile_input(rows_param(kernel).name)
        self._rows_count = int(lead.shape[-2])
        env: dict[str, Any] = {}
        outputs: dict[str, Any] = {}
        if kernel.loop is not None and len(kernel.loop.gemms) > 2:
            env = self._dag_loop(lead, outputs)
        elif kernel.loop is not None:
            first, second = kernel.loop.gemms
            b = self._tile_input(first.b.name)
            c = self._tile_input(second.b.name)
            b = b.transpose(-1, -2) if first.b.transposed else b
            c = c.transpose(-1, -2) if second.b.transposed else c
            self._tile_acc = torch.matmul(lead, b).float()
            self._tile_cols = self._loop_len = int(b.shape[-1])
            batch = tuple(self._tile_acc.shape[:-1])
            env = {carry.name: torch.full((*batch, 1), float(carry.init),
                                          device=lead.device) for carry in kernel.loop.carries}
            env[second.name] = torch.zeros((*batch, int(c.shape[-1])), device=lead.device)
            handed = self._tile_statements(first.epilogue, env, {}, own=first.name)
            handed = handed.expand(self._tile_acc.shape).to(c.dtype)
            env[second.name] = env[second.name] + torch.matmul(handed, c).float()
            self._tile_acc = None
            self._tile_cols = int(c.shape[-1])
            env = {name: value for name, value in env.items()
                   if name in {carry.name for carry in kernel.loop.carries}
                   or name == second.name}
        else:
            self._tile_cols = int(lead.shape[-1])
        if kernel.epilogue is not None:
            self._tile_statements(kernel.epilogue, env, outputs)
        return outputs

    def _dag_loop(self, lead, outputs: dict) -> dict[str, Any]:
        """A loop of several gemms in statement order over the whole loop at once: score gemms'
        values, accumulators `t @ B` of a value rounded to B's dtype, a loop-row gemm's
        `t^T @ Z` and its `+=` stores (into zero: the one block's sum). Returns the
        accumulators, set for the kernel's epilogue over [rows, N]."""
        torch = self.torch
        kernel = self.kernel
        rows = self._rows_count
        values: dict[str, Any] = {}
        carried: dict[str, Any] = {}
        for g in kernel.loop.gemms:
            b = self._tile_input(g.b.name)
            b = b.transpose(-1, -2) if g.b.transposed else b
            if not g.accumulate and kernel.param(g.a.name) is not None:  # a score gemm
                self._tile_acc = torch.matmul(self._tile_input(g.a.name), b).float()
                self._rows_count, self._tile_cols = rows, int(b.shape[-1])
                self._loop_len = self._tile_cols
                for stmt in g.epilogue.stmts:
                    name = stmt.name if isinstance(stmt, ir.Let) else stmt.target
                    values[name] = self._tile_value(stmt.value, values)
                continue
            shape = (*self._lead_shape(), rows, self._loop_len)
            tile = self._as_tensor(values[g.a.name]).expand(shape).to(b.dtype)
            if g.accumulate:
                product = torch.matmul(tile, b).float()
                carried[g.name] = carried[g.name] + product if g.name in carried else product
                continue
            self._tile_acc = torch.matmul(tile.transpose(-1, -2), b).float()  # [loop, N]
            self._rows_count, self._tile_cols = self._loop_len, int(b.shape[-1])
            local: dict[str, Any] = {}
            for stmt in g.epilogue.stmts:
                value = self._tile_value(stmt.value, local)
                if isinstance(stmt, ir.Let):
                    local[stmt.name] = value
                else:  # `+=` into an `out accumulate` tensor
                    outputs[stmt.target] = self._tile_store(value, kernel.param(stmt.target))
        self._tile_acc = None
        self._rows_count = rows
        self._tile_cols = int(next(iter(carried.values())).shape[-1])
        return carried

    def _tile_input(self, name: str):
        """An input with the kernel's heads: a GQA parameter's heads repeated."""
        from ..reference_tiles import rows_param

        tensor = self.tensors[name]
        param, heads = self.kernel.param(name), rows_param(self.kernel).heads
        if param.heads is None or heads is None:
            return tensor
        query_heads = int(self.tensors[rows_param(self.kernel).name].shape[1])
        own = int(tensor.shape[1])
        return tensor if own == query_heads else tensor.repeat_interleave(query_heads // own, 1)

    def _tile_statements(self, epilogue: ir.Epilogue, carried: dict, outputs: dict,
                         own: str | None = None):
        env = dict(carried)
        handed = None
        for stmt in epilogue.stmts:
            value = self._tile_value(stmt.value, env)
            if isinstance(stmt, ir.Let):
                env[stmt.name] = value
            elif isinstance(stmt, ir.Update):
                carried[stmt.name] = self._as_tensor(value).expand(
                    carried[stmt.name].shape).clone()
                env[stmt.name] = carried[stmt.name]
            elif stmt.target == own:
                handed = env[stmt.target] = self._as_tensor(value)
            else:
                param = self.kernel.param(stmt.target)
                outputs[stmt.target] = self._tile_store(value, param)
        return handed

    def _tile_store(self, value, param: ir.Param):
        shape = (*self._lead_shape(), self._rows_count)
        if param.kind is ir.ParamKind.TENSOR:
            shape = (*shape, self._tile_cols)
            return self._as_tensor(value).expand(shape).to(torch_dtype(param.dtype))
        value = self._as_tensor(value).expand((*shape, 1))[..., 0]
        return value.to(torch_dtype(param.dtype))

    def _as_tensor(self, value):
        """A value as a float32 tensor on the inputs' device (a constant as a 0-d one)."""
        if isinstance(value, self.torch.Tensor):
            return value
        device = self.tensors[next(iter(self.tensors))].device
        return self.torch.tensor(value, device=device, dtype=self.torch.float32)

    def _lead_shape(self) -> tuple:
        from ..reference_tiles import rows_param

        return tuple(self.tensors[rows_param(self.kernel).name].shape[:-2])

    def _tile_value(self, node, env):
        torch = self.torch
        if isinstance(node, ir.LocalRef):
            return env[node.name]
        if isinstance(node, ir.Acc):
            return self._tile_acc
        if isinstance(node, ir.Const):
            return self.const(float(np.float32(node.value)))
        if isinstance(node, ir.ScalarLoad):
            return float(np.float32(self.scalar(node.name)))
        if isinstance(node, ir.TensorLoad):
            return self._tile_input(node.name).float()
        if isinstance(node, ir.VectorLoad):
            vector = self._tile_input(node.name).float()
            return vector[..., :, None] if node.axis is ir.Axis.ROW else vector[..., None, :]
        if isinstance(node, ir.Position):
            count = self._rows_count if node.axis is ir.Axis.ROW else self._tile_cols
            device = self.tensors[next(iter(self.tensors))].device
            index = torch.arange(count, device=device, dtype=torch.float32)
            return index[:, None] if node.axis is ir.Axis.ROW else index[None, :]
        if isinstance(node, ir.Extent):  # the loop's length or the rows'
            loop = self.kernel.loop
            return float(self._loop_len if loop is not None and node.dim == loop.dim
                         else self._rows_count)
        if isinstance(node, ir.Call):
            return self.call(node.op, [self._tile_value(arg, env) for arg in node.args])
        if isinstance(node, ir.Cast):
            return self.cast(self._tile_value(node.arg, env), node.dtype)
        if isinstance(node, ir.Reduce):
            value = self._as_tensor(self._tile_value(node.arg, env))
            value = value.expand((*self._lead_shape(), self._rows_count, self._tile_cols))
            if node.op is ir.ReduceOp.ABSMAX:
                value = value.abs()
            if node.op is ir.ReduceOp.SUM:
                return value.sum(dim=-1, keepdim=True)
            if node.op is ir.ReduceOp.MIN:
                return value.amin(dim=-1, keepdim=True)
            return value.amax(dim=-1, keepdim=True)
        raise TypeError(f"not an epilogue expression: {node!r}")
