"""The plan's epilogue: the visitor tree as a DAG of typed nodes and its effects (stores, feeds
of a chained gemm, reductions), built by kgen/lower/epilogue.py; each target renders the nodes
(kgen/targets/common/epilogue_cpp.py). Re-exported by kgen.plan."""
from __future__ import annotations

from dataclasses import dataclass

from ..enums import Axis, Dim, DType, Layout, Op, ReduceOp

# ---------------------------------------------------------------------------------------------
# The epilogue: a DAG of typed nodes, evaluated for two adjacent columns of one row (what one
# mma.m16n8k16 accumulator register pair holds). No target language here: each target renders
# the nodes (kgen/targets/common/epilogue_cpp.py for C++).


@dataclass(frozen=True, slots=True)
class Accumulator:
    """The gemm's f32 accumulator value."""


@dataclass(frozen=True, slots=True)
class Constant:
    value: float  # already rounded to the compute type (and finite as a float32)


@dataclass(frozen=True, slots=True)
class ScalarArg:
    param: str  # an f32 scalar kernel argument


@dataclass(frozen=True, slots=True)
class VectorLoad:
    """`param[row]` (axis ROW, the same for both columns) or `param[col]` (axis COL)."""

    param: str
    axis: Axis
    dtype: DType


@dataclass(frozen=True, slots=True)
class TensorLoad:
    """`param[row, col]` of a tensor shaped like the output."""

    param: str
    dtype: DType
    layout: Layout


@dataclass(frozen=True, slots=True)
class Apply:
    op: Op
    args: tuple[int, ...]  # node ids


@dataclass(frozen=True, slots=True)
class Cast:
    """A cast written in the epilogue: `arg` rounded to `dtype` (then computed on as f32)."""

    dtype: DType  # never F32: a cast to f32 is the value itself
    arg: int


@dataclass(frozen=True, slots=True)
class Round:
    """A narrower compute type: every loaded and computed value is rounded to it (the
    arithmetic itself runs in f32, which rounds each +,-,*,/ as f16/bf16 would)."""

    dtype: DType
    arg: int


NodeKind = Accumulator | Constant | ScalarArg | VectorLoad | TensorLoad | Apply | Cast | Round


@dataclass(frozen=True, slots=True)
class EpilogueNode:
    id: int  # its index in EpilogueDag.nodes; arguments always come earlier
    kind: NodeKind
    uniform: bool  # the same value for both columns of the pair (computed once per pair)

    @property
    def holds_value(self) -> bool:
        """Whether the node is a value loaded or computed per pair (the accumulator and
        constants are there already)."""
        return not isinstance(self.kind, (Accumulator, Constant))


@dataclass(frozen=True, slots=True)
class ReductionPlan:
    """A reduction stored to a vector or scalar output: combined inside the CTA through warp
    shuffles and a shared-memory scratch buffer, then across CTAs with float atomics on the
    output, which the init kernel first sets to the identity."""

    index: int  # red<index> in the generated code
    target: str
    op: ReduceOp
    axis: Axis  # ROW: one value per output row; COL: per column; ALL: one value
    length: Dim | None  # the output vector's length (None for a scalar)
    scratch: str  # shared-memory buffer name
    scratch_floats: int


@dataclass(frozen=True, slots=True)
class StoreEffect:
    """`node` converted to `dtype` and stored to the output tensor `param`."""

    param: str
    node: int
    dtype: DType
    layout: Layout


@dataclass(frozen=True, slots=True)
class FeedEffect:
    """`node` handed to the gemm this one feeds (a chain's intermediate)."""

    node: int


@dataclass(frozen=True, slots=True)
class ReduceEffect:
    """`node` handed to reductions[index], which the kernel combines across the CTA."""

    index: int
    node: int


Effect = StoreEffect | FeedEffect | ReduceEffect


@dataclass(frozen=True, slots=True)
class PackedStore:
    """The epilogue's only effect is one 16-bit store: a kernel can then gather four pairs per
    thread into one 16-byte store (wide stores, row-major only) or stage the tile for the copy
    engine (TMA stores; a column-major one staged transposed)."""

    param: str
    dtype: DType
    layout: Layout = Layout.ROW


@dataclass(frozen=True, slots=True)
class EpilogueDag:
    """The epilogue of one gemm, after sharing: a node used twice appears once."""

    nodes: tuple[EpilogueNode, ...]  # in topological order
    effects: tuple[Effect, ...]  # in the order the epilogue states them
    reductions: tuple[ReductionPlan, ...] = ()
    packed_store: PackedStore | None = None

    @property
    def staged_store(self) -> PackedStore | None:
        """The output a kernel may stage in shared memory for the copy engine's store: the
        packed store (one 16-bit tensor alone), or one row-major 8-bit (FP8) tensor whose only
        other effects are reductions of the whole output (`amax = reduce_absmax(d)`): each
        thread folds its elements into its partial as it writes the staging."""
        if self.packed_store is not None:
            return self.packed_store
        stores = [e for e in self.effects if isinstance(e, StoreEffect)]
        if (len(stores) != 1 or stores[0].dtype.nbytes != 1 or stores[0].layout is not Layout.ROW
                or any(isinstance(e, FeedEffect) for e in self.effects)
                or any(r.axis is not Axis.ALL for r in self.reductions)):
            return None
        return PackedStore(stores[0].param, stores[0].dtype, stores[0].layout)

    @property
    def value_count(self) -> int:
        """Distinct values loaded or computed per element (after sharing)."""
        return sum(n.holds_value for n in self.nodes)

    @property
    def column_vectors(self) -> dict[str, DType]:
        """The vectors it reads at a column (bias[col]), each once, in node order: their
        dtypes."""
        return {n.kind.param: n.kind.dtype for n in self.nodes
                if isinstance(n.kind, VectorLoad) and n.kind.axis is Axis.COL}
