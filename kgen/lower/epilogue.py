"""Epilogue pass: lower a gemm's visitor tree to a DAG of typed nodes (plan.EpilogueDag).

The kernel evaluates the epilogue once per (row, col..col+1) pair of accumulator values, which
is what one mma.m16n8k16 accumulator register pair holds. The tree is first flattened (`Let`s
inlined), then every distinct subexpression becomes one node: structural equality of IR nodes
(locations excluded) is the sharing key, so a value used twice is one node. A node that does not
depend on the column (constants, scalars, `v[row]`) is marked uniform. Each target renders the
nodes in its own language (kgen/targets/common/epilogue_cpp.py for C++).
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from .. import ir
from .. import plan
from ..errors import KgenError
from ..plan import EpilogueDag, EpilogueNode, ReductionPlan
from ..targets import WarpGrid


def _round_to(value: float, dtype: ir.DType) -> float:
    """`value` as the nearest `dtype` number, as a float32 (inf past the dtype's range)."""
    if dtype is ir.DType.F16:
        if abs(value) >= 65520.0:  # rounds past the largest f16, 65504
            return math.copysign(math.inf, value)
        return struct.unpack("<e", struct.pack("<e", value))[0]
    try:
        single = struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:  # rounds past the largest float32
        return math.copysign(math.inf, value)
    if dtype is ir.DType.BF16:
        bits = struct.unpack("<I", struct.pack("<f", single))[0]
        bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000  # round to nearest even
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    return single


@dataclass
class _Builder:
    kernel: ir.Kernel
    nodes: list[EpilogueNode] = field(default_factory=list)
    effects: list[plan.Effect] = field(default_factory=list)
    ids: dict[ir.Expr, int] = field(default_factory=dict)  # IR node -> its DAG node
    reductions: list[ReductionPlan] = field(default_factory=list)
    grid: WarpGrid | None = None  # the kind's own warp grid, where not the source's

    def param(self, name: str) -> ir.Param:
        p = self.kernel.param(name)
        assert p is not None, f"unverified IR: no parameter {name}"
        return p

    def add(self, kind: plan.NodeKind, uniform: bool) -> int:
        self.nodes.append(EpilogueNode(len(self.nodes), kind, uniform))
        return len(self.nodes) - 1

    def value(self, node: ir.Expr) -> int:
        """The DAG node of `node`, added with its arguments on first use."""
        if node in self.ids:
            return self.ids[node]
        result = self._lower(node)
        compute = self.kernel.compute_dtype
        if compute is not ir.DType.F32 and not isinstance(node, ir.Const):
            # A narrower compute type: every loaded and computed value is rounded to it.
            result = self.add(plan.Round(compute, result), self.nodes[result].uniform)
        self.ids[node] = result
        return result

    def _lower(self, node: ir.Expr) -> int:
        if isinstance(node, ir.Acc):
            return self.add(plan.Accumulator(), False)
        if isinstance(node, ir.Const):
            compute = self.kernel.compute_dtype
            value = _round_to(node.value, compute)
            if not math.isfinite(value):
                raise KgenError(
                    node.loc, f"the constant {node.value:g} does not fit the compute type "
                    f"{compute.dsl_name}"
                )
            return self.add(plan.Constant(value), True)
        if isinstance(node, ir.ScalarLoad):
            return self.add(plan.ScalarArg(node.name), True)
        if isinstance(node, ir.VectorLoad):
            p = self.param(node.name)
            return self.add(plan.VectorLoad(p.name, node.axis, p.dtype), node.axis is ir.Axis.ROW)
        if isinstance(node, ir.TensorLoad):
            p = self.param(node.name)
            return self.add(plan.TensorLoad(p.name, p.dtype, p.layout), False)
        if isinstance(node, ir.Call):
            args = tuple(self.value(a) for a in node.args)
            uniform = all(self.nodes[a].uniform for a in args)
            return self.add(plan.Apply(node.op, args), uniform)
        if isinstance(node, ir.Cast):
            arg = self.value(node.arg)
            if node.dtype is ir.DType.F32:  # computed on as f32 already: the value itself
                return arg
            return self.add(plan.Cast(node.dtype, arg), self.nodes[arg].uniform)
        if isinstance(node, ir.Reduce):
            raise KgenError(node.loc, "reductions are not supported by this kgen version yet")
        raise KgenError(getattr(node, "loc"), f"cannot lower {type(node).__name__} here")

    def reduce(self, stmt: ir.Store, node: ir.Reduce, gemm: ir.Gemm) -> None:
        """Hand the reduced value of both elements to the caller, which combines them."""
        p = self.param(stmt.target)
        if p.dtype is not ir.DType.F32:
            raise KgenError(
                stmt.loc, f"reduction output '{p.name}' must be f32: CTAs combine their "
                f"partial results with f32 atomics (it is {p.dtype.dsl_name})"
            )
        value = self.value(node.arg)
        k = len(self.reductions)
        t, grid = gemm.tile, self.grid
        wm, wn = grid.warps if grid is not None else (gemm.warps.m, gemm.warps.n)
        # warps that hold whole rows of the tile meet in no scratch for a row reduction
        rows = 0 if grid is not None and grid.whole_rows else wn * t.m
        floats = {ir.Axis.ROW: rows, ir.Axis.COL: wm * t.n, ir.Axis.ALL: wm * wn}
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
        self.effects.append(plan.ReduceEffect(k, value))

    def feed(self, expr: ir.Expr) -> None:
        """`g0 = expr` in g0's own epilogue: hand the pair to the gemm g0 feeds (a chain)."""
        self.effects.append(plan.FeedEffect(self.value(expr)))

    def store(self, stmt: ir.Store, expr: ir.Expr) -> None:
        p = self.param(stmt.target)
        self.effects.append(plan.StoreEffect(p.name, self.value(expr), p.dtype, p.layout))

    def packed_store(self) -> plan.PackedStore | None:
        """One 16-bit output and nothing else: a kernel may gather four pairs per thread into
        one 16-byte store (row-major), or stage the tile for the copy engine (either layout)."""
        if len(self.effects) != 1 or not isinstance(self.effects[0], plan.StoreEffect):
            return None
        (store,) = self.effects
        if store.dtype.nbytes != 2:
            return None
        return plan.PackedStore(store.param, store.dtype, store.layout)


def stores_one_16bit_tensor(kernel: ir.Kernel, epilogue: ir.Epilogue) -> bool:
    """The source's view of EpilogueBuilder.packed_store, for the builder before any plan: the
    epilogue stores one 16-bit tensor and nothing else (no second output, no reduction, no
    feed of a chain's next gemm, whose target is a gemm)."""
    stores = [s for s in epilogue.stmts if isinstance(s, ir.Store)]
    if len(stores) != 1 or epilogue.reductions:
        return False
    param = kernel.param(stores[0].target)
    return (param is not None and param.kind is ir.ParamKind.TENSOR
            and param.dtype.nbytes == 2)


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


def run(kernel: ir.Kernel, gemm: ir.Gemm, grid: WarpGrid | None = None) -> EpilogueDag:
    """`grid`: the warp grid of the kind the epilogue is planned for, where it is not the
    source's `warps` line (sm_90a's warp-specialized consumers): the reductions' scratch
    follows it."""
    builder = _Builder(kernel, grid=grid)
    for stmt, expr in inline_lets(gemm.epilogue):
        if isinstance(expr, ir.Reduce):
            builder.reduce(stmt, expr, gemm)
        elif stmt.target == gemm.name and kernel.param(stmt.target) is None:
            builder.feed(expr)
        else:
            builder.store(stmt, expr)
    return EpilogueDag(
        nodes=tuple(builder.nodes),
        effects=tuple(builder.effects),
        reductions=tuple(builder.reductions),
        packed_store=builder.packed_store(),
    )
