"""The epilogue DAG (plan.EpilogueDag) as straight-line C++ for two adjacent columns.

The kernel calls the epilogue once per (row, col..col+1) pair of accumulator values. Every node
that holds a value gets one C++ name, numbered v1, v2, ... in node order: a uniform node (the
same for both columns) one `float` per pair, the others one per element (suffixes _0 and _1).
The accumulator is `acc_0`/`acc_1` and constants are literals. Loads come first, vectorized as
pairs; each store converts once to its output type. This module renders the expressions; the
statements that hold them are templates/common/epilogue_statements.inc.j2's.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from ...enums import Axis, DType, Layout, Op
from ...plan import (
    Accumulator, Apply, Cast, Constant, EpilogueDag, EpilogueNode, FeedEffect, ReduceEffect,
    Round, ScalarArg, StoreEffect, TensorLoad, VectorLoad,
)
from .render import macro_lines

TEMPLATE = "common/epilogue_statements.inc.j2"

ELEMS = (0, 1)

# C++ for each op, on value names; every argument is a name or a literal, so no precedence.
OP_CPP: dict[Op, str] = {
    Op.ADD: "{0} + {1}",
    Op.SUB: "{0} - {1}",
    Op.MUL: "{0} * {1}",
    Op.DIV: "{0} / {1}",
    Op.NEG: "-{0}",
    Op.MIN: "fminf({0}, {1})",
    Op.MAX: "fmaxf({0}, {1})",
    Op.ABS: "fabsf({0})",
    Op.EXP: "expf({0})",
    Op.LOG: "logf({0})",
    Op.SQRT: "sqrtf({0})",
    Op.RSQRT: "rsqrtf({0})",
    Op.TANH: "tanhf({0})",
    Op.SIGMOID: "1.0f / (1.0f + expf(-{0}))",
    Op.RELU: "fmaxf({0}, 0.0f)",
    Op.LEAKY_RELU: "{0} > 0.0f ? {0} : {1} * {0}",
    Op.CLAMP: "fminf(fmaxf({0}, {1}), {2})",
    Op.GELU: "0.5f * {0} * (1.0f + erff({0} * 0.70710678118654752f))",
    Op.GELU_TANH: (
        "0.5f * {0} * (1.0f + tanhf(0.79788456080286536f * ({0} + 0.044715f * {0} * {0} * {0})))"
    ),
    Op.SILU: "{0} / (1.0f + expf(-{0}))",
    Op.HARDSWISH: "{0} * fminf(fmaxf({0} + 3.0f, 0.0f), 6.0f) * (1.0f / 6.0f)",
    Op.LT: "{0} < {1} ? 1.0f : 0.0f",
    Op.LE: "{0} <= {1} ? 1.0f : 0.0f",
    Op.GT: "{0} > {1} ? 1.0f : 0.0f",
    Op.GE: "{0} >= {1} ? 1.0f : 0.0f",
    Op.EQ: "{0} == {1} ? 1.0f : 0.0f",
    Op.NE: "{0} != {1} ? 1.0f : 0.0f",
    Op.WHERE: "{0} != 0.0f ? {1} : {2}",
}

# Per dtype: (pair type, to-float of the low/high half, float pair -> pair, float -> element)
PAIR: dict[DType, tuple[str, str, str, str, str]] = {
    DType.F16: ("__half2", "__low2float({0})", "__high2float({0})",
                "__floats2half2_rn({0}, {1})", "__float2half_rn({0})"),
    DType.BF16: ("__nv_bfloat162", "__low2float({0})", "__high2float({0})",
                 "__floats2bfloat162_rn({0}, {1})", "__float2bfloat16_rn({0})"),
    DType.F32: ("float2", "{0}.x", "{0}.y", "make_float2({0}, {1})", "{0}"),
    # FP8 outputs (stores only): cuda_fp8.h's conversions round to nearest and saturate to the
    # format's finite range (__NV_SATFINITE)
    DType.F8E4M3: ("__nv_fp8x2_e4m3", "", "", "__nv_fp8x2_e4m3(make_float2({0}, {1}))",
                   "__nv_fp8_e4m3({0})"),
    DType.F8E5M2: ("__nv_fp8x2_e5m2", "", "", "__nv_fp8x2_e5m2(make_float2({0}, {1}))",
                   "__nv_fp8_e5m2({0})"),
}
TO_FLOAT: dict[DType, str] = {
    DType.F16: "__half2float({0})",
    DType.BF16: "__bfloat162float({0})",
    DType.F32: "{0}",
}


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


@dataclass(frozen=True, slots=True)
class Statement:
    """One statement of the epilogue function: `form` "decl" (const ctype target = value),
    "assign" (target = value; `guard`: only when the pair's second column is in N), or
    "store_pair" (store_pair<ctype>(target, value, both), ctype the narrow argument)."""

    form: str
    target: str
    value: str
    ctype: str = ""
    guard: bool = False


def _decl(ctype: str, name: str, value: str) -> Statement:
    return Statement("decl", name, value, ctype)


def lines(stmts: list[Statement]) -> tuple[str, ...]:
    return tuple(macro_lines(TEMPLATE, "statements", stmts=stmts))


@dataclass(frozen=True, slots=True)
class EpilogueLines:
    """The rendered epilogue function body, evaluated for two adjacent columns."""

    loads: tuple[str, ...]  # once per column pair
    compute: tuple[str, ...]  # per element, both elements of the pair
    stores: tuple[str, ...]
    # With dag.staged_store: (pair type, the pair's value packed as that type), so a kernel can
    # return it and store four pairs as 16 bytes (or stage it); packed_bytes: the pair's bytes
    packed: tuple[str, str] | None = None
    # the reductions' assignments alone (red<i>_0, red<i>_1), which the packed function makes
    # beside its return (an FP8 output staged with its amax)
    reduced: tuple[str, ...] = ()
    packed_bytes: int = 4


@dataclass
class _Renderer:
    # None: pair accesses as 4- or 8-byte loads and stores (a chain's rules make them aligned);
    # else the template argument of load_pair/store_pair ("kNarrow", "false"): a one-gemm
    # kernel's epilogue also runs in its narrow entry point, where the pair may be unaligned
    # and its second column (`both` false) past the output
    narrow: str | None = None
    # an input the caller passes in as the function's `unsigned staged_<param>` (its pair, read
    # from the output's staging in shared memory) instead of a global load
    staged: str | None = None
    # vectors the function reads from shared memory (Schedule: EpilogueVectors, STAGED):
    # `sv_<param>`, the tile's slice, from its first column `tile_col0` (a column vector) or the
    # consumer's first row `tile_row0` (a row vector)
    vectors: tuple[str, ...] = ()
    # column vectors the function takes as arguments `<pair> early_<param>`, the pair at `col`
    # (Schedule: EpilogueVectors, REGISTERS), instead of loading them
    early: tuple[str, ...] = ()
    # each op's C++: OP_CPP, or a target's own spellings of some (sm_90a's EpilogueMath)
    ops: dict[Op, str] = field(default_factory=lambda: OP_CPP)
    loads: list[Statement] = field(default_factory=list)
    compute: list[Statement] = field(default_factory=list)
    names: list[tuple[str, str]] = field(default_factory=list)  # per node id: element names
    count: int = 0

    def fresh(self) -> str:
        self.count += 1
        return f"v{self.count}"

    def node(self, node: EpilogueNode) -> tuple[str, str]:
        kind = node.kind
        if isinstance(kind, Accumulator):
            return "acc_0", "acc_1"
        if isinstance(kind, Constant):
            lit = float_literal(kind.value)
            lit = f"({lit})" if lit.startswith("-") else lit
            return lit, lit
        if isinstance(kind, ScalarArg):
            name = self.fresh()
            self.loads.append(_decl("float", name, f"p.{kind.param}"))
            return name, name
        if isinstance(kind, VectorLoad):
            name = self.fresh()
            staged = kind.param in self.vectors
            if kind.axis is Axis.ROW:
                at = f"sv_{kind.param}[row - tile_row0]" if staged else f"p.{kind.param}[row]"
                self.loads.append(_decl("float", name, TO_FLOAT[kind.dtype].format(at)))
                return name, name
            if kind.param in self.early:
                return self._pair_load(name, kind.dtype, None, f"early_{kind.param}")
            at = f"sv_{kind.param} + (col - tile_col0)" if staged else f"p.{kind.param} + col"
            return self._pair_load(name, kind.dtype, at)
        if isinstance(kind, TensorLoad):
            name, p = self.fresh(), kind.param
            if p == self.staged:
                pair = PAIR[kind.dtype][0]
                return self._pair_load(name, kind.dtype, None,
                                       f"*reinterpret_cast<const {pair}*>(&staged_{p})")
            if kind.layout is Layout.ROW:
                return self._pair_load(name, kind.dtype, f"p.{p} + row * p.ld_{p} + col")
            to_float = TO_FLOAT[kind.dtype]
            for j in ELEMS:
                elem = to_float.format(f"p.{p}[(col + {j}) * p.ld_{p} + row]")
                if j and self.narrow is not None:
                    elem = f"both ? {elem} : 0.0f"
                self.loads.append(_decl("float", f"{name}_{j}", elem))
            return f"{name}_0", f"{name}_1"
        if isinstance(kind, Apply):
            args = [self.names[a] for a in kind.args]
            return self._define(
                lambda j: self.ops[kind.op].format(*(names[j] for names in args)), node.uniform
            )
        if isinstance(kind, (Cast, Round)):
            names = self.names[kind.arg]
            to_elem, to_float = PAIR[kind.dtype][4], TO_FLOAT[kind.dtype]
            return self._define(lambda j: to_float.format(to_elem.format(names[j])), node.uniform)
        raise TypeError(f"no C++ for epilogue node {kind!r}")

    def _define(self, expr_of, uniform: bool) -> tuple[str, str]:
        name = self.fresh()
        if uniform:
            self.compute.append(_decl("float", name, expr_of(0)))
            return name, name
        for j in ELEMS:
            self.compute.append(_decl("float", f"{name}_{j}", expr_of(j)))
        return f"{name}_0", f"{name}_1"

    def _pair_load(self, name: str, dtype: DType, address: str | None,
                   value: str | None = None) -> tuple[str, str]:
        """The pair at `address` in global memory (or the pair `value` already loaded)."""
        pair, low, high, _, _ = PAIR[dtype]
        if value is None and self.narrow is None:
            value = f"*reinterpret_cast<const {pair}*>({address})"
        elif value is None:
            value = f"load_pair<{self.narrow}>({address}, both)"
        self.loads.append(_decl(pair, name, value))
        self.loads.append(_decl("float", f"{name}_0", low.format(name)))
        self.loads.append(_decl("float", f"{name}_1", high.format(name)))
        return f"{name}_0", f"{name}_1"

    def effect(self, effect) -> list[Statement]:
        v0, v1 = self.names[effect.node]
        if isinstance(effect, ReduceEffect):
            return [Statement("assign", f"red{effect.index}_{j}", v)
                    for j, v in zip(ELEMS, (v0, v1))]
        if isinstance(effect, FeedEffect):
            return [Statement("assign", f"inter_{j}", v) for j, v in zip(ELEMS, (v0, v1))]
        assert isinstance(effect, StoreEffect), effect
        pair, _, _, to_pair, to_elem = PAIR[effect.dtype]
        p = effect.param
        if effect.layout is Layout.ROW:
            address = f"p.{p} + row * p.ld_{p} + col"
            if self.narrow is not None:
                return [Statement("store_pair", address, to_pair.format(v0, v1), self.narrow)]
            return [Statement("assign", f"*reinterpret_cast<{pair}*>({address})",
                              to_pair.format(v0, v1))]
        # the second element only when it is in N (the narrow entry point's odd last column)
        return [Statement("assign", f"p.{p}[(col + {j}) * p.ld_{p} + row]", to_elem.format(v),
                          guard=bool(j) and self.narrow is not None)
                for j, v in zip(ELEMS, (v0, v1))]


def function_body(epi: EpilogueLines, packed: bool) -> list[str]:
    """The epilogue function's statements: loads, compute and the stores, or (`packed`) the
    lone output's pair returned as an unsigned for the caller to store."""
    if not packed:
        return list(epi.loads) + list(epi.compute) + list(epi.stores)
    pair, value = epi.packed
    return (list(epi.loads) + list(epi.compute) + list(epi.reduced)
            + macro_lines(TEMPLATE, "packed_return", pair=pair, value=value,
                          width=epi.packed_bytes))


def render(dag: EpilogueDag, narrow: str | None = None,
           staged: str | None = None, vectors: tuple[str, ...] = (),
           early: tuple[str, ...] = (), ops: dict[Op, str] = OP_CPP) -> EpilogueLines:
    """The C++ lines of `dag`: loads, then compute, then the effects in their order. `narrow`:
    see _Renderer (the function then takes `bool both`: the pair's second column is in N);
    `staged`: the input the function takes as `unsigned staged_<param>`; `vectors`: the
    vectors it reads from shared memory; `early`: the column vectors it takes as arguments
    (see _Renderer); `ops`: each op's C++ (OP_CPP, or a target's table built on it)."""
    r = _Renderer(narrow, staged, vectors, early, ops)
    for node in dag.nodes:
        assert node.id == len(r.names), "epilogue nodes out of order"
        r.names.append(r.node(node))
    stores = [line for effect in dag.effects for line in r.effect(effect)]
    packed, width = None, 4
    if dag.staged_store is not None:
        (store,) = [e for e in dag.effects if isinstance(e, StoreEffect)]
        pair, _, _, to_pair, _ = PAIR[store.dtype]
        packed, width = (pair, to_pair.format(*r.names[store.node])), 2 * store.dtype.nbytes
    reduced = [line for effect in dag.effects if isinstance(effect, ReduceEffect)
               for line in r.effect(effect)]
    return EpilogueLines(lines(r.loads), lines(r.compute), lines(stores), packed,
                         lines(reduced) if reduced else (), width)
