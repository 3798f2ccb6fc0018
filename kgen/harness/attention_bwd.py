"""`kgen run` of an attention backward program (a DAG loop, examples/attention_bwd.kg): inputs
that belong together, and torch SDPA's backward backends timed beside it.

A program is an attention backward by the form of its loop (docs/language.md, "The backward"):

    gemm st = K @ Q^T { pt = ... lse[col] ... }    a score gemm reading one f32 vector at col
    gemm dv += pt @ dO                             its value times dO
    gemm dpt = V @ dO^T { dst = ... D[col] ... }   a score gemm reading another f32 vector
    gemm dk += dst @ Q
    gemm dq = dst^T @ K { dQ += ... }              a loop-row gemm: dS K into dQ

over [B, H, S/T, D] tensors. Its inputs are then:
- Q, K, V, dO standard normal (as bench/attention_bwd.py's and the GPU tests'), the scalars
  their defaults (the softmax scale) unless `--scalar` gives them;
- lse: log of the column sums of the program's own P^T (the first epilogue's value, whatever
  mask or score terms it has) evaluated in float64 with lse = 0, after checking on the first
  (batch, head) that the value scales as exp(-lse) (so P's columns then sum to 1); +inf where a
  query sees no key (P = 0 there, as FlashAttention-2's);
- D = rowsum(dO * O), O = P V from that P (V the second score gemm's A, dO its B).
Where the value does not scale so (or reads what the derivation does not evaluate: random(),
row reductions) the vectors stay harness.inputs' random values, magnitudes in [0.25, 1], and a
note says so: with O(1) scores exp stays finite, but the gradients are no attention's.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Mapping

import numpy as np

from .. import ir
from ..plan import program as pp
from ..reference import host_dtype, numpy_op, round_to
from . import attention_bench

# The bound the lowering derives from `where(row <= col, ...)` in the backward's orientation
# (rows the keys, cols the queries): SDPA's is_causal (top-left)
CAUSAL = (pp.ColumnBound(False, False, 1, ()),)
# the forward's SDPA backends (attention_bench.BACKENDS), timed through their backward
BACKENDS = tuple((f"{label} bwd", backend) for label, backend in attention_bench.BACKENDS)


@dataclass(frozen=True, slots=True)
class BackwardForm:
    """The parameters of an attention backward program, by their roles."""

    q: str
    k: str
    v: str
    do: str
    lse: str
    d: str
    p: str  # the first score gemm's value the dV gemm multiplies (P^T)


def _children(node: ir.Expr) -> tuple:
    args = getattr(node, "args", None)
    if args is not None:
        return tuple(args)
    return (node.arg,) if hasattr(node, "arg") else ()


def _col_vectors(epilogue: ir.Epilogue) -> set[str]:
    found: set[str] = set()

    def visit(node) -> None:
        if isinstance(node, ir.VectorLoad) and node.axis is ir.Axis.COL:
            found.add(node.name)
        for child in _children(node):
            visit(child)

    for stmt in epilogue.stmts:
        visit(stmt.value)
    return found


def backward_form(kernel: ir.Kernel) -> BackwardForm | None:
    """The roles of an attention backward program's parameters, or None for another program."""
    loop = kernel.loop
    if loop is None or len(loop.gemms) != 5:
        return None
    st, dv, dpt, dk, dq = loop.gemms
    param = kernel.param

    def is_param(name: str) -> bool:
        p = param(name)
        return p is not None and p.role is ir.Role.IN and p.kind is ir.ParamKind.TENSOR

    score_like = (not st.accumulate and is_param(st.a.name) and st.b.transposed
                  and not dpt.accumulate and is_param(dpt.a.name) and dpt.b.transposed)
    if not (score_like and dv.accumulate and dk.accumulate and not dq.accumulate):
        return None
    q, k, v, do = st.b.name, st.a.name, dpt.a.name, dpt.b.name
    if not all(is_param(n) for n in (q, k, v, do)) or len({q, k, v, do}) != 4:
        return None
    if (dv.b.name, dk.b.name, dq.b.name) != (do, q, k) or any(
            g.b.transposed for g in (dv, dk, dq)) or param(dq.a.name) is not None:
        return None
    vectors = []
    for g in (st, dpt):
        found = [n for n in _col_vectors(g.epilogue) if param(n) is not None
                 and param(n).role is ir.Role.IN and param(n).dtype is ir.DType.F32]
        if len(found) != 1:
            return None
        vectors.append(found[0])
    if vectors[0] == vectors[1]:
        return None
    if any(param(n).batch is None or param(n).heads is None for n in (q, k, v, do)):
        return None
    return BackwardForm(q, k, v, do, vectors[0], vectors[1], dv.a.name)


# ---------------------------------------------------------------------------------------------
# Inputs


class _Underivable(Exception):
    """The first epilogue reads something the derivation does not evaluate."""


def backward_inputs(kernel: ir.Kernel, form: BackwardForm, host: dict[str, np.ndarray],
                    scalars: Mapping[str, float], rng: np.random.Generator) -> list[str]:
    """Replace Q, K, V, dO in `host` by standard normals and lse, D by the values they imply
    (see the module's note); the notes to report."""
    for name in (form.q, form.k, form.v, form.do):
        p = kernel.param(name)
        host[name] = rng.standard_normal(host[name].shape, dtype=np.float32).astype(
            host_dtype(p.dtype))
    try:
        lse, d = _derived(kernel, form, host, scalars, rng)
    except _Underivable as err:
        return [f"attention backward: {form.lse} and {form.d} are random (magnitudes in "
                f"[0.25, 1]), not derived from the inputs: {err}"]
    host[form.lse] = lse.astype(host_dtype(kernel.param(form.lse).dtype))
    host[form.d] = d.astype(host_dtype(kernel.param(form.d).dtype))
    return [f"attention backward: {form.q}, {form.k}, {form.v}, {form.do} standard normal; "
            f"{form.lse} the log-sum-exp of the program's own scores (P's columns sum to 1; "
            f"+inf where a query sees no key) and {form.d} = rowsum({form.do} * O), O = P "
            f"{form.v}, in float64"]


def _derived(kernel, form, host, scalars, rng) -> tuple[np.ndarray, np.ndarray]:
    batches, heads, length = np.shape(host[form.q])[:3]
    lse = np.zeros((batches, heads, length))
    d = np.zeros((batches, heads, length))
    sizes = _sizes(kernel, host)
    for b in range(batches):
        for h in range(heads):
            view = _view(kernel, host, b, h, heads)
            tile = _ScoreTile(kernel, view, scalars, sizes, b, h)
            p0 = tile.value(form.p, {form.lse: np.zeros(length)})
            if b == 0 and h == 0:
                shift = rng.uniform(-1.0, 1.0, length)
                shifted = tile.value(form.p, {form.lse: shift})
                if not np.allclose(shifted, p0 * np.exp(-shift)[None, :], rtol=1e-9, atol=0):
                    raise _Underivable(f"the value {form.p} does not scale as "
                                       f"exp(-{form.lse}[col])")
            if not np.isfinite(p0).all() or (p0 < 0).any():
                raise _Underivable(f"{form.p} with {form.lse} = 0 is not finite and "
                                   "non-negative (the scale too large for exp?)")
            total = p0.sum(axis=0)
            with np.errstate(divide="ignore"):
                lse[b, h] = np.where(total > 0, np.log(total), math.inf)
            p = p0 / np.where(total > 0, total, 1.0)[None, :]  # [keys, queries]
            out = p.T @ view[form.v]
            d[b, h] = (view[form.do] * out).sum(axis=1)
    return lse, d


def _sizes(kernel: ir.Kernel, host: Mapping[str, np.ndarray]) -> dict[str, int]:
    sizes: dict[str, int] = {}
    for p in kernel.params:
        if p.name in host:
            for dim, extent in zip(p.full_shape, np.shape(host[p.name])):
                if isinstance(dim, str):
                    sizes[dim] = int(extent)
    return sizes


def _view(kernel, host, b: int, h: int, heads: int) -> dict[str, np.ndarray]:
    """Every input at (batch b, query head h): a GQA parameter's head h // (heads / its)."""
    view = {}
    for name, array in host.items():
        p = kernel.param(name)
        if p.batch is not None:
            array = array[b]
            if p.heads is not None:
                array = array[h // (heads // array.shape[0])]
        view[name] = np.asarray(array, dtype=np.float64)
    return view


class _ScoreTile:
    """The first score gemm's epilogue of one (batch, head) in float64: [keys, queries]."""

    def __init__(self, kernel, view, scalars, sizes, batch, head):
        self.kernel = kernel
        self.view = view
        self.scalars = scalars
        self.sizes = sizes
        self.batch, self.head = batch, head
        g = kernel.loop.gemms[0]
        self.gemm = g
        self.acc = view[g.a.name] @ view[g.b.name].T
        self.rows, self.cols = self.acc.shape

    def value(self, name: str, overrides: Mapping[str, np.ndarray]) -> np.ndarray:
        env: dict[str, Any] = {}
        with np.errstate(all="ignore"):
            for stmt in self.gemm.epilogue.stmts:
                value = self._eval(stmt.value, env, overrides)
                if isinstance(stmt, ir.Let) or (isinstance(stmt, ir.Store)
                                                and stmt.target == self.gemm.name):
                    env[stmt.name if isinstance(stmt, ir.Let) else stmt.target] = value
                else:
                    raise _Underivable(f"the first score gemm's epilogue writes "
                                       f"'{stmt.target}'")
        if name not in env:
            raise _Underivable(f"'{name}' is not the first score gemm's value")
        return np.broadcast_to(env[name], (self.rows, self.cols)).astype(np.float64)

    def _eval(self, node, env, overrides):
        if isinstance(node, ir.LocalRef):
            return env[node.name]
        if isinstance(node, ir.Acc):
            return self.acc
        if isinstance(node, ir.Const):
            return np.float64(np.float32(node.value))
        if isinstance(node, ir.ScalarLoad):
            if node.name in self.scalars:
                return np.float64(np.float32(self.scalars[node.name]))
            default = self.kernel.param(node.name).default
            if default is None:
                raise _Underivable(f"scalar '{node.name}' has no value")
            return np.float64(np.float32(default))
        if isinstance(node, ir.VectorLoad):
            vector = overrides.get(node.name, self.view.get(node.name))
            if vector is None:
                raise _Underivable(f"vector '{node.name}' has no value")
            if node.axis is ir.Axis.ROW:
                return vector[:, None]
            if node.axis is ir.Axis.COL:
                return vector[None, :]
            return vector[self.head if node.axis is ir.Axis.HEAD else self.batch]
        if isinstance(node, ir.TensorLoad):
            return self.view[node.name]
        if isinstance(node, ir.Position):
            if node.axis is ir.Axis.ROW:
                return np.arange(self.rows, dtype=np.float64)[:, None]
            if node.axis is ir.Axis.COL:
                return np.arange(self.cols, dtype=np.float64)[None, :]
            return np.float64(self.head if node.axis is ir.Axis.HEAD else self.batch)
        if isinstance(node, ir.Extent):
            return np.float64(node.dim if isinstance(node.dim, int) else self.sizes[node.dim])
        if isinstance(node, ir.Call):
            return numpy_op(node.op, *(self._eval(a, env, overrides) for a in node.args))
        if isinstance(node, ir.Cast):
            return round_to(self._eval(node.arg, env, overrides), node.dtype)
        raise _Underivable(f"the derivation does not evaluate {type(node).__name__}")


# ---------------------------------------------------------------------------------------------
# Baselines


def baseline_note(form: BackwardForm, causal: bool) -> str:
    return ("the SDPA baselines are torch.autograd.grad of a saved SDPA graph with the backend "
            f"forced (softmax(QK^T / sqrt(D)){', causal top-left' if causal else ''}; the "
            "program's other score and mask terms, if any, are not in them): their whole "
            "backward, the preprocess of D and dQ's conversion included; kgen's time is the "
            f"main kernel's call (dQ zeroed, then the kernel), with {form.d} an input")


def time_backward_baselines(form: BackwardForm, causal: bool, sets: list[Mapping[str, Any]],
                            time: Callable[[Callable[[int], None]], Any],
                            say: Callable[[str], None]) -> tuple[dict[str, Any], list[str]]:
    """Each SDPA backend's backward Timing on the argument `sets` in turn (each set's forward
    run once, untimed, under the backend), and the notes."""
    import torch
    import torch.nn.functional as F

    notes = [baseline_note(form, causal)]
    timings: dict[str, Any] = {}
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError as err:
        return timings, notes + [f"SDPA backends not selectable: {err}"]
    for name, backend in BACKENDS:
        say(f"benchmarking {name} on the same data")
        try:
            graphs = []
            with sdpa_kernel(getattr(SDPBackend, backend)):
                for args in sets:
                    q, k, v = (args[n].detach().requires_grad_() for n in
                               (form.q, form.k, form.v))
                    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    graphs.append((out, (q, k, v), args[form.do]))

                def run(i: int) -> None:
                    out, leaves, grad = graphs[i]
                    torch.autograd.grad(out, leaves, grad, retain_graph=True)

                timings[name] = time(run)
        except Exception as err:  # a backend this GPU or these shapes do not have
            notes.append(f"{name} baseline failed: {type(err).__name__}: {_first_line(err)}")
        finally:
            graphs = []
    return timings, notes


def _first_line(err: Exception) -> str:
    text = str(err).strip().splitlines()
    return text[0][:200] if text else ""
