"""Epilogue pass: lower a gemm's visitor tree to straight-line C++ for two adjacent columns.

The kernel calls the epilogue once per (row, col..col+1) pair of accumulator values, which is
what one mma.m16n8k16 accumulator register pair holds. The tree is first flattened (`Let`s
inlined), then every distinct subexpression gets one C++ value: structural equality of IR nodes
(locations excluded) is the sharing key, so a value used twice is computed once. Values that do
not depend on the column (constants, scalars, `v[row]`) are computed once per pair, the others
once per element (suffixes _0 and _1). Loads come first, vectorized as pairs; each store
converts once to its output type.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from .. import ir
from ..errors import KgenError
from ..plan import EpilogueCode, ReductionPlan

ELEMS = (0, 1)

# C++ for each op, on value names; every argument is a name or a literal, so no precedence.
OP_CPP: dict[ir.Op, str] = {
    ir.Op.ADD: "{0} + {1}",
    ir.Op.SUB: "{0} - {1}",
    ir.Op.MUL: "{0} * {1}",
    ir.Op.DIV: "{0} / {1}",
    ir.Op.NEG: "-{0}",
    ir.Op.MIN: "fminf({0}, {1})",
    ir.Op.MAX: "fmaxf({0}, {1})",
    ir.Op.ABS: "fabsf({0})",
    ir.Op.EXP: "expf({0})",
    ir.Op.LOG: "logf({0})",
    ir.Op.SQRT: "sqrtf({0})",
    ir.Op.RSQRT: "rsqrtf({0})",
    ir.Op.TANH: "tanhf({0})",
    ir.Op.SIGMOID: "1.0f / (1.0f + expf(-{0}))",
    ir.Op.RELU: "fmaxf({0}, 0.0f)",
    ir.Op.LEAKY_RELU: "{0} > 0.0f ? {0} : {1} * {0}",
    ir.Op.CLAMP: "fminf(fmaxf({0}, {1}), {2})",
    ir.Op.GELU: "0.5f * {0} * (1.0f + erff({0} * 0.70710678118654752f))",
    ir.Op.GELU_TANH: (
        "0.5f * {0} * (1.0f + tanhf(0.79788456080286536f * ({0} + 0.044715f * {0} * {0} * {0})))"
    ),
    ir.Op.SILU: "{0} / (1.0f + expf(-{0}))",
    ir.Op.HARDSWISH: "{0} * fminf(fmaxf({0} + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f)",
    ir.Op.LT: "{0} < {1} ? 1.0f : 0.0f",
    ir.Op.LE: "{0} <= {1} ? 1.0f : 0.0f",
    ir.Op.GT: "{0} > {1} ? 1.0f : 0.0f",
    ir.Op.GE: "{0} >= {1} ? 1.0f : 0.0f",
    ir.Op.EQ: "{0} == {1} ? 1.0f : 0.0f",
    ir.Op.NE: "{0} != {1} ? 1.0f : 0.0f",
    ir.Op.WHERE: "{0} != 0.0f ? {1} : {2}",
}

# Per dtype: (pair type, to-float of the low/high half, float pair -> pair, float -> element)
PAIR: dict[ir.DType, tuple[str, str, str, str, str]] = {
    ir.DType.F16: ("__half2", "__low2float({0})", "__high2float({0})",
                   "__floats2half2_rn({0}, {1})", "__float2half_rn({0})"),
    ir.DType.BF16: ("__nv_bfloat162", "__low2float({0})", "__high2float({0})",
                    "__floats2bfloat162_rn({0}, {1})", "__float2bfloat16_rn({0})"),
    ir.DType.F32: ("float2", "{0}.x", "{0}.y", "make_float2({0}, {1})", "{0}"),
}
TO_FLOAT: dict[ir.DType, str] = {
    ir.DType.F16: "__half2float({0})",
    ir.DType.BF16: "__bfloat162float({0})",
    ir.DType.F32: "{0}",
}


def _round_to(value: float, dtype: ir.DType) -> float:
    """`value` as the nearest `dtype` number (constants of a narrower compute type)."""
    if dtype is ir.DType.F16:
        if abs(value) >= 65520.0:  # rounds past the largest f16, 65504
            return math.copysign(math.inf, value)
        return struct.unpack("<e", struct.pack("<e", value))[0]
    if dtype is ir.DType.BF16:
        bits = struct.unpack("<I", struct.pack("<f", value))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return value


def _reads_back(text: str, single: float) -> bool:
    """Whether `text` rounds to the float32 `single`; a text past the float32 range does not
    (near the largest float32, a shorter text can round up past it)."""
    try:
        return struct.unpack("<f", struct.pack("<f", float(text)))[0] == single
    except OverflowError:
        return False


def float_literal(value: float) -> str:
    """The shortest decimal that rounds to the same float32, as a C++ float literal."""
    if not math.isfinite(value):
        raise ValueError(f"constant {value} is not finite")
    try:
        single = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        single = math.inf
    if not math.isfinite(single):
        raise ValueError(f"constant {value} is not finite as a float32")
    # the shortest %g text that reads back as the same float32 (what numpy prints)
    text = next(
        t for t in (f"{single:.{digits}g}" for digits in range(1, 10)) if _reads_back(t, single)
    )
    if "." not in text and "e" not in text:
        text += ".0"
    return text + "f"


@dataclass
class _Builder:
    kernel: ir.Kernel
    loads: list[str] = field(default_factory=list)
    compute: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)
    # node -> (C++ name per element, uniform?)
    values: dict[ir.Expr, tuple[tuple[str, str], bool]] = field(default_factory=dict)
    count: int = 0
    reductions: list[ReductionPlan] = field(default_factory=list)
    # row-major 16-bit stores: (param, pair type, the pair's packed value)
    row_pairs: list[tuple[str, str, str]] = field(default_factory=list)

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def param(self, name: str) -> ir.Param:
        p = self.kernel.param(name)
        assert p is not None, f"unverified IR: no parameter {name}"
        return p

    def value(self, node: ir.Expr) -> tuple[tuple[str, str], bool]:
        """C++ names of `node` for elements 0 and 1, and whether they are the same value."""
        if node in self.values:
            return self.values[node]
        result = self._lower(node)
        compute = self.kernel.compute_dtype
        if compute is not ir.DType.F32 and not isinstance(node, ir.Const):
            # A narrower compute type: every loaded and computed value is rounded to it (the
            # arithmetic itself runs in f32, which rounds each +,-,*,/ as f16/bf16 would).
            (names, uniform) = result
            to_elem, to_float = PAIR[compute][4], TO_FLOAT[compute]
            result = self._define(lambda j: to_float.format(to_elem.format(names[j])), uniform)
        self.values[node] = result
        return result

    def _lower(self, node: ir.Expr) -> tuple[tuple[str, str], bool]:
        if isinstance(node, ir.Acc):
            return ("acc_0", "acc_1"), False
        if isinstance(node, ir.Const):
            compute = self.kernel.compute_dtype
            try:
                lit = float_literal(_round_to(node.value, compute))
            except ValueError:
                raise KgenError(
                    node.loc, f"the constant {node.value:g} does not fit the compute type "
                    f"{compute.dsl_name}"
                ) from None
            lit = f"({lit})" if lit.startswith("-") else lit
            return (lit, lit), True
        if isinstance(node, ir.ScalarLoad):
            name = self.fresh()
            self.loads.append(f"const float {name} = p.{node.name};")
            return (name, name), True
        if isinstance(node, ir.VectorLoad):
            return self._vector(node)
        if isinstance(node, ir.TensorLoad):
            return self._tensor(node)
        if isinstance(node, ir.Call):
            args = [self.value(a) for a in node.args]
            uniform = all(u for _, u in args)
            return self._define(
                lambda j: OP_CPP[node.op].format(*(names[j] for names, _ in args)), uniform
            )
        if isinstance(node, ir.Cast):
            (names, uniform) = self.value(node.arg)
            if node.dtype is ir.DType.F32:
                return names, uniform
            to_elem = PAIR[node.dtype][4]
            to_float = TO_FLOAT[node.dtype]
            return self._define(lambda j: to_float.format(to_elem.format(names[j])), uniform)
        if isinstance(node, ir.Reduce):
            raise KgenError(node.loc, "reductions are not supported by this kgen version yet")
        raise KgenError(getattr(node, "loc"), f"cannot lower {type(node).__name__} here")

    def _define(self, expr_of, uniform: bool) -> tuple[tuple[str, str], bool]:
        name = self.fresh()
        if uniform:
            self.compute.append(f"const float {name} = {expr_of(0)};")
            return (name, name), True
        for j in ELEMS:
            self.compute.append(f"const float {name}_{j} = {expr_of(j)};")
        return (f"{name}_0", f"{name}_1"), False

    def _vector(self, node: ir.VectorLoad) -> tuple[tuple[str, str], bool]:
        p = self.param(node.name)
        name = self.fresh()
        if node.axis is ir.Axis.ROW:
            self.loads.append(
                f"const float {name} = {TO_FLOAT[p.dtype].format(f'p.{p.name}[row]')};"
            )
            return (name, name), True
        return self._pair_load(name, p.dtype, f"p.{p.name} + col")

    def _tensor(self, node: ir.TensorLoad) -> tuple[tuple[str, str], bool]:
        p = self.param(node.name)
        name = self.fresh()
        if p.layout is ir.Layout.ROW:
            return self._pair_load(name, p.dtype, f"p.{p.name} + row * p.ld_{p.name} + col")
        to_float = TO_FLOAT[p.dtype]
        for j in ELEMS:
            elem = f"p.{p.name}[(col + {j}) * p.ld_{p.name} + row]"
            self.loads.append(f"const float {name}_{j} = {to_float.format(elem)};")
        return (f"{name}_0", f"{name}_1"), False

    def _pair_load(self, name: str, dtype: ir.DType, address: str) -> tuple[tuple[str, str], bool]:
        pair, low, high, _, _ = PAIR[dtype]
        self.loads.append(f"const {pair} {name} = *reinterpret_cast<const {pair}*>({address});")
        self.loads.append(f"const float {name}_0 = {low.format(name)};")
        self.loads.append(f"const float {name}_1 = {high.format(name)};")
        return (f"{name}_0", f"{name}_1"), False

    def reduce(self, stmt: ir.Store, node: ir.Reduce, gemm: ir.Gemm) -> None:
        """Hand the reduced value of both elements to the caller, which combines them."""
        p = self.param(stmt.target)
        if p.dtype is not ir.DType.F32:
            raise KgenError(
                stmt.loc, f"reduction output '{p.name}' must be f32: CTAs combine their "
                f"partial results with f32 atomics (it is {p.dtype.dsl_name})"
            )
        (v0, v1), _ = self.value(node.arg)
        k = len(self.reductions)
        w, t = gemm.warps, gemm.tile
        floats = {ir.Axis.ROW: w.n * t.m, ir.Axis.COL: w.m * t.n, ir.Axis.ALL: w.m * w.n}
        self.reductions.append(
            ReductionPlan(
                index=k,
                target=p.name,
                op=node.op,
                axis=node.axis,
                length=p.shape[0] if p.shape else None,
                scratch=f"red{k}_smem",
                scratch_floats=floats[node.axis],
            )
        )
        self.stores.append(f"red{k}_0 = {v0};")
        self.stores.append(f"red{k}_1 = {v1};")

    def feed(self, expr: ir.Expr) -> None:
        """`g0 = expr` in g0's own epilogue: hand the pair to the gemm g0 feeds (a chain)."""
        (v0, v1), _ = self.value(expr)
        self.stores.append(f"inter_0 = {v0};")
        self.stores.append(f"inter_1 = {v1};")

    def store(self, stmt: ir.Store, expr: ir.Expr) -> None:
        p = self.param(stmt.target)
        (v0, v1), _ = self.value(expr)
        pair, _, _, to_pair, to_elem = PAIR[p.dtype]
        if p.layout is ir.Layout.ROW:
            address = f"p.{p.name} + row * p.ld_{p.name} + col"
            self.stores.append(
                f"*reinterpret_cast<{pair}*>({address}) = {to_pair.format(v0, v1)};"
            )
            if p.dtype.nbytes == 2:
                self.row_pairs.append((p.name, pair, to_pair.format(v0, v1)))
            return
        for j, v in zip(ELEMS, (v0, v1)):
            self.stores.append(
                f"p.{p.name}[(col + {j}) * p.ld_{p.name} + row] = {to_elem.format(v)};"
            )


def inline_lets(epilogue: ir.Epilogue) -> list[tuple[ir.Store, ir.Expr]]:
    """The stores of `epilogue`, each with its value as one tree (no LocalRef left)."""
    env: dict[str, ir.Expr] = {}

    def subst(node: ir.Expr) -> ir.Expr:
        if isinstance(node, ir.LocalRef):
            return env[node.name]
        if isinstance(node, ir.Call):
            return ir.Call(node.op, tuple(subst(a) for a in node.args), node.loc)
        if isinstance(node, ir.Cast):
            return ir.Cast(node.dtype, subst(node.arg), node.loc)
        if isinstance(node, ir.Reduce):
            return ir.Reduce(node.op, node.axis, subst(node.arg), node.loc)
        return node

    stores = []
    for stmt in epilogue.stmts:
        if isinstance(stmt, ir.Let):
            env[stmt.name] = subst(stmt.value)
        else:
            stores.append((stmt, subst(stmt.value)))
    return stores


def run(kernel: ir.Kernel, gemm: ir.Gemm) -> EpilogueCode:
    builder = _Builder(kernel)
    for stmt, expr in inline_lets(gemm.epilogue):
        if isinstance(expr, ir.Reduce):
            builder.reduce(stmt, expr, gemm)
        elif stmt.target == gemm.name and kernel.param(stmt.target) is None:
            builder.feed(expr)
        else:
            builder.store(stmt, expr)
    # One row-major 16-bit output and nothing else: a kernel may gather four pairs per thread
    # into one 16-byte store (see EpilogueCode.packed_store).
    only = len(builder.row_pairs) == 1 and len(builder.stores) == 1
    return EpilogueCode(
        loads=tuple(builder.loads),
        compute=tuple(builder.compute),
        stores=tuple(builder.stores),
        value_count=builder.count,
        reductions=tuple(builder.reductions),
        packed_store=builder.row_pairs[0] if only else None,
    )
