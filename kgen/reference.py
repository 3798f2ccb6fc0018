"""The meaning of a kernel: its IR evaluated with NumPy in float64.

Generated code must match this within the output dtype's tolerance (`tolerance`, `compare`).
Inputs are logical arrays in their dtype (tensors [rows, cols] whatever their layout, bf16 as
ml_dtypes.bfloat16). For each gemm, in order:
    acc = A @ B in float64 (A may be an earlier gemm's result, see `chained_value`);
    each epilogue statement in order: `Let` binds a local, `Store` evaluates element-wise over
    [M, N] and rounds once to the output's dtype. Scalars and constants are float32 values
    (the kernel takes them as float); everything else is float64.

The traversal (`EpilogueEvaluator`) is shared with the PyTorch baseline of `kgen run`, which
plugs in torch operations instead of NumPy's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from . import ir

SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
GELU_TANH_CUBIC = 0.044715


class EpilogueEvaluator:
    """Walks a kernel's gemms and epilogues; subclasses say how to compute on their arrays."""

    def __init__(self, kernel: ir.Kernel):
        self.kernel = kernel

    # -- hooks -------------------------------------------------------------------------------

    def operand(self, name: str) -> Any:  # a tensor parameter as a gemm operand
        raise NotImplementedError

    def matmul(self, a: Any, b: Any, gemm: ir.Gemm) -> Any:
        raise NotImplementedError

    def to_operand(self, value: Any, dtype: ir.DType) -> Any:  # a chained intermediate
        raise NotImplementedError

    def const(self, value: float) -> Any:
        raise NotImplementedError

    def scalar(self, name: str) -> Any:
        raise NotImplementedError

    def tensor(self, name: str) -> Any:  # [rows, N] input tensor
        raise NotImplementedError

    def vector(self, name: str, axis: ir.Axis) -> Any:  # broadcastable against [rows, N]
        raise NotImplementedError

    def call(self, op: ir.Op, args: list[Any]) -> Any:
        raise NotImplementedError

    def cast(self, value: Any, dtype: ir.DType) -> Any:
        raise NotImplementedError

    def reduce(self, op: ir.ReduceOp, axis: ir.Axis, value: Any, shape: tuple[int, int]) -> Any:
        raise NotImplementedError

    def store(self, value: Any, param: ir.Param, shape: tuple[int, int]) -> Any:
        raise NotImplementedError

    def reload(self, stored: Any) -> Any:  # a stored output read back in the compute type
        raise NotImplementedError

    # -- traversal ---------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        outputs: dict[str, Any] = {}
        results: dict[str, Any] = {}  # gemm name -> its chained value (compute type)
        for gemm in self.kernel.gemms:
            if gemm.a.name in results:
                b_param = self.kernel.param(gemm.b.name)
                a = self.to_operand(results[gemm.a.name], b_param.dtype)
            else:
                a = self.operand(gemm.a.name)
            acc = self.matmul(a, self.operand(gemm.b.name), gemm)
            shape = self._shape_of(acc)
            results[gemm.name] = self._epilogue(gemm, acc, shape, outputs)
        return outputs

    def _shape_of(self, acc: Any) -> tuple[int, ...]:
        """The shape the epilogue works on: (rows, cols) of the accumulator."""
        return (self._rows_of(acc), self._cols_of(acc))

    def _rows_of(self, acc: Any) -> int:
        return int(acc.shape[0])

    def _cols_of(self, acc: Any) -> int:
        return int(acc.shape[1])

    def _epilogue(self, gemm: ir.Gemm, acc: Any, shape: tuple[int, int],
                  outputs: dict[str, Any]) -> Any:
        env: dict[str, Any] = {}
        memo: dict[Any, Any] = {}
        first_store = None
        last_let = None
        fed = None
        for stmt in gemm.epilogue.stmts:
            if isinstance(stmt, ir.Store) and isinstance(stmt.value, ir.Reduce):
                reduced = stmt.value
                value = self.expr(reduced.arg, acc, env, memo, outputs)
                param = self.kernel.param(stmt.target)
                outputs[stmt.target] = self.store(
                    self.reduce(reduced.op, reduced.axis, value, shape), param, shape
                )
                continue
            value = self.expr(stmt.value, acc, env, memo, outputs)
            if isinstance(stmt, ir.Let):
                if stmt.name in env:
                    memo.clear()  # a rebinding makes cached uses of the old value stale
                env[stmt.name] = value
                last_let = value
            elif stmt.target == gemm.name and self.kernel.param(stmt.target) is None:
                fed = value  # `g0 = expr`: what the gemm g0 feeds multiplies (a chain)
            else:
                param = self.kernel.param(stmt.target)
                outputs[stmt.target] = self.store(value, param, shape)
                if first_store is None:
                    first_store = value
        if fed is not None:
            return fed
        return chained_value(gemm, env, first_store, last_let, acc)

    def expr(self, node: ir.Expr, acc: Any, env: dict[str, Any], memo: dict[Any, Any],
             outputs: Mapping[str, Any]) -> Any:
        if isinstance(node, ir.LocalRef):
            return env[node.name]
        key = node
        if key in memo:
            return memo[key]
        if isinstance(node, ir.Acc):
            value = acc
        elif isinstance(node, ir.Const):
            value = self.const(node.value)
        elif isinstance(node, ir.ScalarLoad):
            value = self.scalar(node.name)
        elif isinstance(node, ir.TensorLoad):
            # An output an earlier epilogue wrote reads back as stored (rounded).
            if node.name in outputs:
                value = self.reload(outputs[node.name])
            else:
                value = self.tensor(node.name)
        elif isinstance(node, ir.VectorLoad):
            value = self.vector(node.name, node.axis)
        elif isinstance(node, ir.Call):
            args = [self.expr(arg, acc, env, memo, outputs) for arg in node.args]
            value = self.call(node.op, args)
        elif isinstance(node, ir.Cast):
            value = self.cast(self.expr(node.arg, acc, env, memo, outputs), node.dtype)
        elif isinstance(node, ir.Reduce):
            raise ValueError("a reduction may only be the whole right side of a store")
        else:
            raise TypeError(f"not an epilogue expression: {node!r}")
        compute = self.kernel.compute_dtype
        if compute is not ir.DType.F32:
            value = self.cast(value, compute)  # every value lives in the compute type
        memo[key] = value
        return value


def chained_value(gemm: ir.Gemm, env: Mapping[str, Any], first_store: Any, last_let: Any,
                  acc: Any) -> Any:
    """What a later gemm reads when it names `gemm` as its A operand, when the epilogue has no
    `g0 = expr` (which the verifier requires, and which wins): a local bound to the gemm's own
    name, else the epilogue's first stored value, else its last local, else acc."""
    if gemm.name in env:
        return env[gemm.name]
    for candidate in (first_store, last_let):
        if candidate is not None:
            return candidate
    return acc


# ---------------------------------------------------------------------------------------------
# NumPy, float64


def host_dtype(dtype: ir.DType) -> np.dtype:
    """The NumPy dtype of a kgen dtype's host arrays: bf16 and the FP8 types are ml_dtypes'
    (float8_e4m3fn: no infinity, max 448, as torch.float8_e4m3fn and CUDA's __nv_fp8_e4m3)."""
    if dtype in (ir.DType.BF16, ir.DType.F8E4M3, ir.DType.F8E5M2):
        import ml_dtypes

        return np.dtype({ir.DType.BF16: ml_dtypes.bfloat16,
                         ir.DType.F8E4M3: ml_dtypes.float8_e4m3fn,
                         ir.DType.F8E5M2: ml_dtypes.float8_e5m2}[dtype])
    return np.dtype({ir.DType.F16: np.float16, ir.DType.F32: np.float32}[dtype])


# The largest finite value of each FP8 format: a value stored to one saturates to it (CUDA's
# __NV_SATFINITE conversions; ml_dtypes' casts would give NaN for e4m3fn, inf for e5m2)
FP8_MAX = {ir.DType.F8E4M3: 448.0, ir.DType.F8E5M2: 57344.0}


def round_to(x: np.ndarray, dtype: ir.DType) -> np.ndarray:
    """Round float64 values to `dtype` and back to float64 (FP8: saturated, NaN kept)."""
    return as_dtype(x, dtype).astype(np.float64)


def as_dtype(x: np.ndarray, dtype: ir.DType) -> np.ndarray:
    """float64 values rounded to `dtype`'s host array (FP8: saturated to its finite range)."""
    x = np.asarray(x, dtype=np.float64)
    if dtype in FP8_MAX:
        x = np.clip(x, -FP8_MAX[dtype], FP8_MAX[dtype])
    return x.astype(host_dtype(dtype))


_erf_scalar = np.frompyfunc(math.erf, 1, 1)


def erf(x: np.ndarray) -> np.ndarray:
    """float64 erf through libm's (correctly rounded to ~1 ulp), element by element."""
    x = np.asarray(x, dtype=np.float64)
    return _erf_scalar(x).astype(np.float64) if x.ndim else np.float64(math.erf(float(x)))


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


_NUMPY_OPS = {
    ir.Op.ADD: lambda a, b: a + b,
    ir.Op.SUB: lambda a, b: a - b,
    ir.Op.MUL: lambda a, b: a * b,
    ir.Op.DIV: lambda a, b: a / b,
    ir.Op.NEG: lambda a: -a,
    ir.Op.MIN: np.minimum,
    ir.Op.MAX: np.maximum,
    ir.Op.ABS: np.abs,
    ir.Op.EXP: np.exp,
    ir.Op.LOG: np.log,
    ir.Op.SQRT: np.sqrt,
    ir.Op.RSQRT: lambda a: 1.0 / np.sqrt(a),
    ir.Op.TANH: np.tanh,
    ir.Op.SIGMOID: _sigmoid,
    ir.Op.RELU: lambda a: np.maximum(a, 0.0),
    ir.Op.LEAKY_RELU: lambda x, s: np.where(x > 0, x, s * x),
    ir.Op.CLAMP: lambda x, lo, hi: np.minimum(np.maximum(x, lo), hi),
    ir.Op.GELU: lambda x: 0.5 * x * (1.0 + erf(x / math.sqrt(2.0))),
    ir.Op.GELU_TANH: lambda x: 0.5 * x * (1.0 + np.tanh(SQRT_2_OVER_PI * (x + GELU_TANH_CUBIC
                                                                          * x * x * x))),
    ir.Op.SILU: lambda x: x * _sigmoid(x),
    ir.Op.HARDSWISH: lambda x: x * np.clip(x + 3.0, 0.0, 6.0) / 6.0,
    ir.Op.LT: lambda a, b: np.less(a, b).astype(np.float64),
    ir.Op.LE: lambda a, b: np.less_equal(a, b).astype(np.float64),
    ir.Op.GT: lambda a, b: np.greater(a, b).astype(np.float64),
    ir.Op.GE: lambda a, b: np.greater_equal(a, b).astype(np.float64),
    ir.Op.EQ: lambda a, b: np.equal(a, b).astype(np.float64),
    ir.Op.NE: lambda a, b: np.not_equal(a, b).astype(np.float64),
    ir.Op.WHERE: lambda c, a, b: np.where(np.not_equal(c, 0), a, b),
}
assert set(_NUMPY_OPS) == set(ir.Op), "every ir.Op needs a NumPy meaning"

# Each op from its identity, as the kernels start: a reduction over no elements (M or N = 0)
# is the identity (0 for sum and absmax, -inf for max, +inf for min).
_NUMPY_REDUCE = {
    ir.ReduceOp.SUM: np.sum,
    ir.ReduceOp.MAX: lambda x, axis: np.max(x, axis=axis, initial=-np.inf),
    ir.ReduceOp.MIN: lambda x, axis: np.min(x, axis=axis, initial=np.inf),
    ir.ReduceOp.ABSMAX: lambda x, axis: np.max(np.abs(x), axis=axis, initial=0.0),
}


def numpy_op(op: ir.Op, *args):
    """One element-wise op on float64 arrays (or floats), as the reference computes it."""
    with np.errstate(all="ignore"):
        return np.asarray(_NUMPY_OPS[op](*args), dtype=np.float64)


class NumpyEvaluator(EpilogueEvaluator):
    def __init__(self, kernel: ir.Kernel, inputs: Mapping[str, np.ndarray],
                 scalars: Mapping[str, float], rows: np.ndarray | None = None):
        super().__init__(kernel)
        self.inputs = inputs
        self.scalars = scalars
        self.rows = rows
        self.first_a = kernel.gemms[0].a.name if kernel.gemms else None

    def _input(self, name: str) -> np.ndarray:
        if name not in self.inputs:
            raise KeyError(f"the reference needs input {name!r}")
        return np.asarray(self.inputs[name])

    def _row_slice(self, array: np.ndarray) -> np.ndarray:
        return array if self.rows is None else array[self.rows]

    def operand(self, name: str) -> np.ndarray:
        array = self._input(name).astype(np.float64)
        # Only the first gemm's A has output rows as its rows; B operands are [K, N].
        return self._row_slice(array) if name == self.first_a else array

    def matmul(self, a, b, gemm):
        return dequantized(a, gemm, "A", self) @ dequantized(b, gemm, "B", self)

    def to_operand(self, value, dtype):
        return round_to(value, dtype)

    def const(self, value):
        return np.float64(np.float32(value))

    def scalar(self, name):
        if name in self.scalars:
            value = self.scalars[name]
        else:
            param = self.kernel.param(name)
            if param is None or param.default is None:
                raise KeyError(f"the reference needs scalar {name!r}")
            value = param.default
        return np.float64(np.float32(value))

    def tensor(self, name):
        return self._row_slice(self._input(name).astype(np.float64))

    def vector(self, name, axis):
        vector = self._input(name).astype(np.float64)
        if axis is ir.Axis.ROW:
            return self._row_slice(vector)[:, None]
        return vector[None, :]

    def call(self, op, args):
        return numpy_op(op, *args)

    def cast(self, value, dtype):
        return round_to(value, dtype)

    def reduce(self, op, axis, value, shape):
        value = np.broadcast_to(value, shape)
        if axis is ir.Axis.ALL:
            if self.rows is not None:
                raise ValueError("a reduction over all rows needs every row (rows=None)")
            return _NUMPY_REDUCE[op](value, axis=None)
        if axis is ir.Axis.COL and self.rows is not None:
            raise ValueError("a reduction over rows (to a [N] vector) needs every row (rows=None)")
        # ROW: one value per output row, reducing along the columns; COL: the other way.
        return _NUMPY_REDUCE[op](value, axis=1 if axis is ir.Axis.ROW else 0)

    def reload(self, stored):
        return np.asarray(stored).astype(np.float64)

    def store(self, value, param, shape):
        if param.kind is ir.ParamKind.TENSOR:
            value = np.broadcast_to(value, shape)
        with np.errstate(all="ignore"):
            stored = as_dtype(value, param.dtype)
        if param.kind is ir.ParamKind.VECTOR and stored.ndim == 0:
            stored = stored.reshape(1)
        return np.array(stored)


def dequantized(operand: np.ndarray, gemm: ir.Gemm, which: str,
                evaluator: NumpyEvaluator) -> np.ndarray:
    """A gemm operand (float64: A [rows, K], B [K, N]) times its block scales, if any: A's
    [M, ceil(K / 128)] one per row per 128 of K, B's [ceil(N / 128), ceil(K / 128)] one per
    128 columns per 128 of K (`scale A by SA 1x128`, `scale B by SB 128x128`)."""
    name = gemm.a.name if which == "A" else gemm.b.name
    scale = next((s for s in gemm.scales if s.operand == name), None)
    if scale is None:
        return operand
    factors = evaluator._input(scale.param).astype(np.float64)
    rows, k = scale.block
    if which == "A":
        if name == evaluator.first_a:
            factors = evaluator._row_slice(factors)
        expanded = np.repeat(factors, k, axis=1)[:, :operand.shape[1]]
        return operand * np.repeat(expanded, rows, axis=0)[:operand.shape[0]]
    expanded = np.repeat(np.repeat(factors, rows, axis=0), k, axis=1)  # [N, K]
    return operand * expanded[:operand.shape[1], :operand.shape[0]].T


def evaluate(kernel: ir.Kernel, inputs: Mapping[str, np.ndarray],
             scalars: Mapping[str, float] | None = None, *,
             rows: np.ndarray | None = None, batches: int | None = None,
             block: int | None = None) -> dict[str, np.ndarray]:
    """Every output of `kernel`, in its dtype, from logical host `inputs`.

    `rows` (indices into M) restricts the evaluation to those output rows: tensor outputs come
    back as [len(rows), N] and row-vector reductions as [len(rows)]. Reductions over rows or
    over everything need rows=None. Scalars missing from `scalars` take their declared default.

    A batched kernel (parameters with a batch dimension) is, per batch b, the unbatched kernel
    on batch b of each batched input ([L, ...] arrays; a broadcast one may be a NumPy view with
    batch stride 0) and on the whole of each unbatched input (shared by every batch); each
    output comes back as [L, ...]. `batches` gives L when no batched input tells it.

    A tile program (a loop kernel or a row kernel) is kgen/reference_tiles.py's: its loop runs
    in blocks of `block` columns (the kernel's tile.n; 64 when None), and with two batch
    dimensions each output comes back as [B, H, ...]; over packed sequences, as
    kgen/reference_packed.py says.
    """
    if kernel.loop is not None and kernel.packed:
        from .reference_packed import evaluate_packed  # packed sequences, one at a time

        return evaluate_packed(kernel, inputs, scalars or {}, block)
    if kernel.loop is not None or (kernel.epilogue is not None and not kernel.gemms):
        from .reference_tiles import evaluate_tiles

        return evaluate_tiles(kernel, inputs, scalars or {}, rows, batches, block)
    batched = [p for p in kernel.params if p.batch is not None]
    if not batched:
        evaluator = NumpyEvaluator(kernel, inputs, scalars or {}, rows)
        with np.errstate(all="ignore"):
            return evaluator.run()
    count = batch_count(kernel, inputs, batches)
    names = {p.name for p in batched}
    per_batch = []
    for b in range(count):
        view = {name: (np.asarray(array)[b] if name in names else array)
                for name, array in inputs.items()}
        evaluator = NumpyEvaluator(kernel, view, scalars or {}, rows)
        with np.errstate(all="ignore"):
            per_batch.append(evaluator.run())
    outputs = [p for p in kernel.params if p.role is ir.Role.OUT]
    if count == 0:
        return {p.name: np.zeros((0,), host_dtype(p.dtype)) for p in outputs}
    return {p.name: np.stack([one[p.name] for one in per_batch]) for p in outputs}


def batch_count(kernel: ir.Kernel, inputs: Mapping[str, np.ndarray],
                batches: int | None = None) -> int:
    """L: `batches`, else the batch dimension when fixed, else the first dimension of the first
    batched input; the batched inputs must agree with it."""
    batched = [p for p in kernel.params if p.batch is not None]
    count = batches
    if count is None and batched and isinstance(batched[0].batch, int):
        count = batched[0].batch
    for p in batched:
        if p.name not in inputs:
            continue
        extent = int(np.shape(inputs[p.name])[0])
        if count is None:
            count = extent
        elif extent != count:
            raise ValueError(f"{p.name} has {extent} batches, not {count}")
    if count is None:
        raise ValueError("no batched input tells the batch count; pass batches=")
    return count


def needs_all_rows(kernel: ir.Kernel) -> bool:
    """True when some output depends on every row (a reduction along M or to a scalar)."""
    for gemm in kernel.gemms:
        for stmt in gemm.epilogue.stmts:
            if isinstance(stmt, ir.Store) and isinstance(stmt.value, ir.Reduce):
                if stmt.value.axis is not ir.Axis.ROW:
                    return True
    return False


# ---------------------------------------------------------------------------------------------
# Comparison


_TOLERANCES = {
    # (atol, rtol). Kernel and reference round the nearly equal f32/f64 results once to the
    # output type, so they may land one unit in the last place apart (2**-10 relative for
    # f16, 2**-7 for bf16), twice that across a binade; f32 allows fast-math intrinsics
    # (tanh.approx, __expf) in the epilogue.
    ir.DType.F32: (1e-3, 1e-3),
    ir.DType.F16: (2e-3, 4e-3),
    ir.DType.BF16: (1.6e-2, 1.6e-2),
    # FP8 outputs: 3 (e4m3) and 2 (e5m2) mantissa bits, one step 2**-3 (2**-2) relative
    ir.DType.F8E4M3: (2.0 ** -9, 0.25),
    ir.DType.F8E5M2: (2.0 ** -16, 0.5),
}


def tolerance(dtype: ir.DType) -> tuple[float, float]:
    """(atol, rtol) for outputs of `dtype`: ok when |out - ref| <= atol + rtol * |ref|."""
    return _TOLERANCES[dtype]


def checking_dtype(kernel: ir.Kernel, output: str) -> ir.DType:
    """The dtype whose tolerance applies to `output`: its own, or the coarsest `cast<>` in the
    epilogue (conservatively, any of them). A value rounded to bf16 inside the epilogue can land
    one bf16 step away from the float64 reference's rounding, whatever the output's dtype."""
    param = kernel.param(output)
    assert param is not None
    coarsest = param.dtype

    def visit(node) -> None:
        nonlocal coarsest
        if isinstance(node, ir.Cast) and _TOLERANCES[node.dtype][1] > _TOLERANCES[coarsest][1]:
            coarsest = node.dtype
        for child in getattr(node, "args", ()) or ((node.arg,) if hasattr(node, "arg") else ()):
            visit(child)

    for gemm in kernel.gemms:
        for stmt in gemm.epilogue.stmts:
            visit(stmt.value)
    if kernel.loop is not None:
        for gemm in kernel.loop.gemms:
            for stmt in gemm.epilogue.stmts:
                visit(stmt.value)
        # The value a loop hands to its accumulating gemm is rounded to the operand dtype (as
        # a cast would be), and the kernel's rounding of it may land one step away.
        if _reads_accumulator(kernel, output):
            operand = kernel.param(kernel.loop.gemms[-1].b.name)
            if operand is not None and _TOLERANCES[operand.dtype][1] > _TOLERANCES[coarsest][1]:
                coarsest = operand.dtype
    if kernel.epilogue is not None:
        for stmt in kernel.epilogue.stmts:
            visit(stmt.value)
    return coarsest


def _reads_accumulator(kernel: ir.Kernel, output: str) -> bool:
    """Whether the kernel epilogue's store to `output` reads a loop's accumulator, directly or
    through locals."""
    if kernel.epilogue is None:
        return False
    accumulators = {g.name for g in kernel.loop.gemms if g.accumulate}
    reading: set[str] = set()  # locals that read one

    def reads(node) -> bool:
        if isinstance(node, ir.LocalRef):
            return node.name in accumulators or node.name in reading
        children = getattr(node, "args", None) or ((node.arg,) if hasattr(node, "arg") else ())
        return any(reads(child) for child in children)

    for stmt in kernel.epilogue.stmts:
        if isinstance(stmt, ir.Let) and reads(stmt.value):
            reading.add(stmt.name)
        elif isinstance(stmt, ir.Store) and stmt.target == output:
            return reads(stmt.value)
    return False


@dataclass(frozen=True, slots=True)
class CompareResult:
    max_abs: float  # largest |out - ref| over elements both finite
    max_rel: float  # largest |out - ref| / |ref| over those elements with |ref| > atol
    ok: bool
    unwritten: int  # NaN in out where ref is not NaN: the kernel never wrote there
    bad: int = 0  # elements outside the tolerance (unwritten ones included)
    worst: tuple[int, ...] | None = None  # index of the worst element
    atol: float = 0.0
    rtol: float = 0.0

    def summary(self) -> str:
        text = f"max abs {self.max_abs:.3g}, max rel {self.max_rel:.3g}"
        if self.unwritten:
            text += f", {self.unwritten} unwritten"
        if self.bad:
            text += f", {self.bad} outside atol={self.atol:g} rtol={self.rtol:g}"
            if self.worst is not None:
                text += f" (worst at {list(self.worst)})"
        return text


def compare(out: np.ndarray, ref: np.ndarray, dtype: ir.DType, *,
            atol: float | None = None, rtol: float | None = None) -> CompareResult:
    """Compare a kernel output with the reference (both in any float dtype, same shape)."""
    default_atol, default_rtol = tolerance(dtype)
    atol = default_atol if atol is None else atol
    rtol = default_rtol if rtol is None else rtol
    out64 = np.asarray(out).astype(np.float64)
    ref64 = np.asarray(ref).astype(np.float64)
    if out64.shape != ref64.shape:
        raise ValueError(f"output shape {out64.shape} differs from the reference {ref64.shape}")
    out_nan = np.isnan(out64)
    ref_nan = np.isnan(ref64)
    unwritten = int(np.count_nonzero(out_nan & ~ref_nan))
    with np.errstate(all="ignore"):
        diff = np.abs(out64 - ref64)
        # Equal infinities and NaN-for-NaN match; other non-finite pairs do not.
        same = (out64 == ref64) | (out_nan & ref_nan)
        finite = np.isfinite(out64) & np.isfinite(ref64)
        close = same | (finite & (diff <= atol + rtol * np.abs(ref64)))
        max_abs = float(diff[finite].max()) if finite.any() else 0.0
        rel_mask = finite & (np.abs(ref64) > atol)  # relative error of tiny values means little
        max_rel = float((diff[rel_mask] / np.abs(ref64[rel_mask])).max()) if rel_mask.any() else 0.0
    bad_mask = ~close
    bad = int(np.count_nonzero(bad_mask))
    worst = None
    if bad:
        excess = np.where(bad_mask, np.nan_to_num(diff, nan=np.inf, posinf=np.inf), -1.0)
        worst = tuple(int(i) for i in np.unravel_index(int(np.argmax(excess)), excess.shape))
    return CompareResult(max_abs=max_abs, max_rel=max_rel, ok=bad == 0, unwritten=unwritten,
                         bad=bad, worst=worst, atol=atol, rtol=rtol)
