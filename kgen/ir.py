"""The kgen IR: a kernel description as frozen dataclasses.

The IR is public. The DSL front end (`kgen.parse`) is one way to build it; Python code may build
it directly and hand it to `kgen.verify`, `kgen.lower` and `kgen.emit`. Every node carries a
`loc` that takes no part in equality, so two structurally equal expressions compare equal
(the epilogue lowering relies on that to compute a shared subexpression once).
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass, field
import typing

from .errors import NOWHERE, SourceLoc
from .enums import (FUNCTIONS, Arch, Axis, Dim, DType, Layout, Op, ParamKind, ReduceOp,  # noqa: F401
                    Residency, Role)


def _loc() -> SourceLoc:
    return field(default=NOWHERE, compare=False, repr=False)


# ---------------------------------------------------------------------------------------------
# The user's schedule line (the element types, layouts, targets and ops are in kgen.enums)


class Schedule(enum.Enum):
    """How a kernel's warps share the work. Value: the DSL name."""

    # sm_90a, a resident register chain: producer warps stream the first gemm's A into a ring
    # guarded by mbarriers; two consumer warpgroups take turns, each with a tile of its own
    PINGPONG = "pingpong"
    # sm_90a, one gemm: a producer warpgroup fills a TMA ring; two consumer warpgroups share
    # each tile (the default there; the line only asks for it, or for its refusal's reason)
    COOPERATIVE = "cooperative"

    @classmethod
    def from_name(cls, name: str) -> "Schedule | None":
        return next((s for s in cls if s.value == name), None)


# ---------------------------------------------------------------------------------------------
# Kernel parameters


@dataclass(frozen=True, slots=True)
class Param:
    """A tensor, vector or scalar the kernel reads or writes.

    `shape` is one matrix ([rows, cols]) or vector ([length]). `batch`, when set, is the
    leading batch dimension of a batched tensor or vector (the DSL's `f16[L, M, K]`): one
    matrix or vector per batch, at any batch stride. Every batched parameter of a kernel has the
    same batch dimension; a parameter without one is shared by every batch."""

    name: str
    kind: ParamKind
    dtype: DType
    shape: tuple[Dim, ...] = ()
    layout: Layout = Layout.ROW
    role: Role = Role.IN
    default: float | None = None  # scalars only
    loc: SourceLoc = _loc()
    batch: Dim | None = None
    # A second batch dimension, after `batch` (loop and row kernels only: `Q : bf16[B, H, S, D]`
    # has batch B, heads H, shape (S, D)). Parameters whose heads differ share: with Q's heads H
    # and K's heads HKV, query head h reads KV head h / (H / HKV) (GQA; MQA when HKV is 1), and
    # H must be a multiple of HKV.
    heads: Dim | None = None
    # `tensor dQ : f32[B, H, S, 128] out accumulate` (role OUT, loop kernels only): the kernel
    # adds into the tensor (`dQ += expr` in a loop-row gemm's epilogue, see Gemm) instead of
    # writing it; the runtime (and the .cu's launcher) zeroes it before the kernel, so its
    # value after the kernel is the sum of every add (from every CTA, in any order unless the
    # kernel is deterministic).
    accumulate: bool = False
    # `scalar scale : f32 = 1 positive` (input f32 scalars only): the caller's value must be
    # > 0, which every launch checks (the runtime, and the .cu's launcher); the compiler may
    # rely on it (a mask's -inf times it stays -inf: kgen/lower/loop_bounds.py)
    positive: bool = False

    @property
    def full_shape(self) -> tuple[Dim, ...]:
        """The shape as written: the batch dimensions first, when there are any."""
        lead = tuple(d for d in (self.batch, self.heads) if d is not None)
        return (*lead, *self.shape)


# ---------------------------------------------------------------------------------------------
# Epilogue expressions (the visitor tree, as a DAG through shared nodes and `Let`)


@dataclass(frozen=True, slots=True)
class Acc:
    """The accumulator of the enclosing gemm stage, in its accumulate type."""

    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Const:
    value: float
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class ScalarLoad:
    """A scalar kernel parameter, read once per thread."""

    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class TensorLoad:
    """Element (row, col) of an input tensor of the output's shape (the source C, or aux)."""

    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class VectorLoad:
    """A broadcast vector: `v[row]` or `v[col]`."""

    name: str
    axis: Axis
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Position:
    """`row` or `col` as a value: the element's global index along the rows (M) or the columns
    (N) of the tile being computed, in the compute type. In a loop's first gemm, `col` runs
    along the loop's dimension (the key position in attention)."""

    axis: Axis  # ROW or COL
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Extent:
    """A dimension's size as a value (`T - S` in `col <= row + T - S`): in a tile program's
    epilogues only, for the kernel's rows dimension and its loop's dimension (an integer, in the
    compute type)."""

    dim: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Random:
    """`random(seed, offset)`: a uniform value in [0, 1) per element of a tile program's tile,
    from Philox 4x32-10 (Salmon et al., SC 2011). Keyed by the u64 scalar `seed`, counted by the
    element's (col, row, batch * heads + head) and the u64 scalar `offset`, one call per group
    of eight elements {r, r + 8} x {c, c + 1, c + 8, c + 9} (bit 3 of r, bits 0 and 3 of c
    clear): the words (c0, c1, c2, c3) = (c, r, batch * heads + head, low 32 bits of offset),
    the key (low 32 bits of seed, high 32 bits of seed ^ high 32 bits of offset); the value at
    (row, col) is output word 2 * (bit 3 of row) + (bit 3 of col)'s low 16 bits (bit 0 of col
    clear) or high 16 bits (set) times 2^-16: a probability compared with it is quantized to
    2^-16. A thread of the mma fragments holds a group whole (rows i, i + 8; a column pair e in
    n8 groups j, j + 1), so a kernel computes each call once for eight elements; transposed
    (rows are the group's columns) a thread holds four of them and the lane of row ^ 1 the
    other four: one of the two lanes makes the call and hands the other its halves. The same
    seed and offset give the same value at the same element in any kernel (a backward
    regenerates a dropout mask).
    `random_t(seed, offset)` (transposed) is the value at the element (col, row): in a kernel
    whose rows are the other's columns (the attention backward's keys), the other's value."""

    seed: str
    offset: str
    loc: SourceLoc = _loc()
    transposed: bool = False


@dataclass(frozen=True, slots=True)
class LocalRef:
    """A value bound earlier in the same epilogue by `Let`."""

    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Call:
    """An element-wise operation; `args` has `op.arity` entries."""

    op: Op
    args: tuple["Expr", ...]
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Cast:
    """Round to `dtype` and back to the compute type (as a store would)."""

    dtype: DType
    arg: "Expr"
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Reduce:
    """A reduction of `arg` along `axis`. Outside loop and row kernels, only valid as the whole
    right side of a `Store` (to a vector). In a loop's epilogue or a row kernel's, a row
    reduction (axis ROW: rowsum, rowmax, ...) is also a value: one per row, usable in any
    expression (`m_new = max(m, rowmax(x))`)."""

    op: ReduceOp
    axis: Axis
    arg: "Expr"
    loc: SourceLoc = _loc()


Expr = typing.Union[Acc, Const, ScalarLoad, TensorLoad, VectorLoad, Position, LocalRef, Call, Cast,
                    Reduce, Extent, Random]


@dataclass(frozen=True, slots=True)
class Let:
    """`name = expr` where name is not a parameter: a local value, computed once."""

    name: str
    value: Expr
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Store:
    """`target = expr` where target is an output parameter. `accumulate` (`dQ += expr`): the
    value is added into an `out accumulate` tensor (Param.accumulate) rather than written; only
    in a loop-row gemm's epilogue, at the loop's rows (see Gemm)."""

    target: str
    value: Expr
    loc: SourceLoc = _loc()
    accumulate: bool = False


@dataclass(frozen=True, slots=True)
class Update:
    """`name = expr` (or `name *= expr`, written as `name = name * expr`) where name is carried
    by the enclosing loop: a row carry (`carry m : f32[row]`) takes a new value per row; the
    accumulator of an accumulating gemm (`gemm o += ...`) may only be rescaled by a value per
    row (`o = o * r`). Statements run in order: later statements, and the next iteration, read
    the new value."""

    name: str
    value: Expr
    loc: SourceLoc = _loc()


Stmt = typing.Union[Let, Store, Update]


@dataclass(frozen=True, slots=True)
class Epilogue:
    stmts: tuple[Stmt, ...]
    loc: SourceLoc = _loc()

    @property
    def reductions(self) -> tuple[Store, ...]:
        """The stores of a reduction (`v = rowsum(...)`), in order."""
        return tuple(s for s in self.stmts
                     if isinstance(s, Store) and isinstance(s.value, Reduce))


# ---------------------------------------------------------------------------------------------
# Mainloop stages


@dataclass(frozen=True, slots=True)
class TileShape:
    """CTA tile M x N x K."""

    m: int
    n: int
    k: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WarpGrid:
    """Warps along M and N; each warp computes a (tile.m / m) x (tile.n / n) warp tile."""

    m: int
    n: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class StageCount:
    """Shared-memory pipeline depth of the mainloop."""

    count: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class SplitK:
    """`split S`: the gemm's k tiles split over S CTAs per output tile; their f32 partials meet
    in the workspace, and a second kernel sums them in order and runs the epilogue.
    `split stream` (stream = True, count 1): stream-K, the persistent CTAs sharing the k tiles
    of the tiles past whole waves (and one wave more) equally, the CTA that began a tile adding
    the others' parts; the other tiles run whole."""

    count: int
    loc: SourceLoc = _loc()
    stream: bool = False


@dataclass(frozen=True, slots=True)
class BlockScale:
    """`scale A by SA 1x128` (a gemm's line): the FP8 operand `operand` (the gemm's A or B
    tensor) is dequantized by the f32 tensor `param`, one scale per block of `block` elements
    (rows or columns of M or N, by K): A's [M, ceil(K / 128)] of 1x128 blocks, B's [ceil(N /
    128), ceil(K / 128)] of 128x128 (DeepGEMM's recipe). The kernel applies them as it promotes
    each 128-wide k block's sums into the f32 accumulators."""

    operand: str
    param: str
    block: tuple[int, int]  # (M or N, K) elements per scale
    loc: SourceLoc = _loc()
    param_loc: SourceLoc | None = None


@dataclass(frozen=True, slots=True)
class ClusterShape:
    """`cluster MxN` (sm_90a, the warp-specialized kernel): M x N CTAs of a thread-block
    cluster take adjacent output tiles (M along M, N along N) and share the operand those tiles
    have in common through the copy engine's multicast: 2x1 shares B, 1x2 shares A."""

    m: int
    n: int
    loc: SourceLoc = _loc()

    @property
    def size(self) -> int:
        return self.m * self.n


@dataclass(frozen=True, slots=True)
class OperandRef:
    """A gemm operand: a tensor parameter, or an earlier gemm stage (chaining). `transposed`
    (`K^T`): the tensor's transpose, a [cols, rows] operand read from the same memory.
    In a loop, an A operand may also name a *tile value*: a local (`Let`) bound in the epilogue
    of an earlier score gemm of the same loop, or such a gemm's own handed-on value (`s = ...`);
    `transposed` on a value (`ds^T`) is its [block, rows] transpose (a loop-row gemm's A)."""

    name: str
    loc: SourceLoc = _loc()
    transposed: bool = False


@dataclass(frozen=True, slots=True)
class Gemm:
    """`gemm name = a @ b accumulate acc_dtype { tile ... warps ... stages ... epilogue {...} }`.
    Every schedule line is optional: None (and `resident` False, `split` and `cluster` None) leaves it to
    kgen's builder (kgen/lower/builder.py), which fills it for the target."""

    name: str
    a: OperandRef
    b: OperandRef
    acc_dtype: DType
    tile: TileShape | None
    warps: WarpGrid | None
    stages: StageCount | None
    epilogue: Epilogue
    keep: Residency | None = None
    # `keep B0 resident`: all of B is loaded into shared memory once per CTA and stays there
    # while a persistent CTA loops over its row tiles (where it was written, when it was)
    resident: bool = False
    resident_loc: SourceLoc | None = None
    loc: SourceLoc = _loc()
    split: SplitK | None = None  # `split S` (None: the whole K in one CTA)
    cluster: ClusterShape | None = None  # `cluster MxN` (None: the builder's choice, 1x1)
    # `gemm o += p @ V` (in a loop only): `o` is an accumulator carried across the loop's
    # iterations, zero before the first; each iteration adds a @ b to it. Its value after the
    # loop is read by the kernel's epilogue (`O = o / l`).
    #
    # The three kinds of gemm in a loop (kgen/verify/loop_gemms.py classifies them):
    # - a *score gemm* `st = K @ Q^T` (not accumulating, A a tensor): A loop-invariant (its rows
    #   are the kernel's rows), B the loop's block, transposed or not; its result and epilogue
    #   values are *tiles* [rows, block] (`row` the kernel's row, `col` the loop position);
    # - an *accumulating gemm* `dv += p @ dO`: A a tile value of an earlier score gemm's
    #   epilogue (rounded once to the B operand's dtype), B [loop dim, N]: an accumulator
    #   [rows, N] as above;
    # - a *loop-row gemm* `dq = ds^T @ K` (not accumulating, A a tile value transposed): B
    #   loop-invariant [rows, N]; its result [block, N] lies at the loop's rows (`row` the loop
    #   position, `col` 0..N) and its epilogue may only add it into `out accumulate` tensors
    #   (Store.accumulate, `dQ += scale * acc`); nothing else reads it.
    accumulate: bool = False
    # `scale A by SA 1x128`, `scale B by SB 128x128`: block scales of FP8 operands, in source order
    scales: tuple[BlockScale, ...] = ()


# ---------------------------------------------------------------------------------------------
# Loops: a CTA keeps a tile of rows and streams blocks of a dimension, carrying state


@dataclass(frozen=True, slots=True)
class Carry:
    """`carry m : f32[row] = -inf`: one value per row of the CTA's rows, `init` before the
    first iteration, carried from one iteration to the next (a running row max or sum)."""

    name: str
    dtype: DType
    init: float  # may be -inf or inf
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class BlockShape:
    """`tile 128x64` on a loop: rows per CTA (M) x the loop's block (the columns of its first
    gemm, the k of its accumulating gemm)."""

    m: int
    n: int
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class BlockMask:
    """`blocks 128x64 by kv_num_blocks, kv_indices, full full_kv_num_blocks, full_kv_indices`
    on a loop: the blocks each tile of rows visits, listed at run time (FlexAttention's
    BlockMask). Blocks are `m` rows (the loop's tile M) by `n` columns of the loop's dimension
    (its block); `blocks by ...` without sizes (m, n None) takes the loop's tile as it is. `counts` (int32 [B, H, row tiles]) and `indices` (int32 [B, H, row tiles,
    blocks]) list the partial blocks, where the body runs as written; `full_counts` and
    `full_indices` (optional) the full blocks, where every mask `where(P, e, -inf)` reads `e`.
    A block listed in neither is not visited (its elements count for nothing)."""

    m: int | None
    n: int | None
    counts: str
    indices: str
    full_counts: str | None = None
    full_indices: str | None = None
    loc: SourceLoc = _loc()

    @property
    def names(self) -> tuple[str, ...]:
        """The parameters the line adds, in order."""
        full = (self.full_counts, self.full_indices) if self.full_counts is not None else ()
        return (self.counts, self.indices, *full)


@dataclass(frozen=True, slots=True)
class Loop:
    """`loop kv over T { carry ...; gemm s = Q @ K^T {...}; gemm o += s @ V }`: each CTA keeps
    a tile of rows and runs the body once per block of `dim`, in order. The first gemm's
    columns and the accumulating gemm's k run along `dim`; every `carry` and every accumulating
    gemm is carried across iterations. Each schedule line is optional (None: the builder's).
    `gemms` run in statement order each iteration; the first is a score gemm (its A gives the
    kernel's rows). The forward holds two (a score gemm, then an accumulating one); a backward
    holds more (see Gemm.accumulate for the kinds), a local of a score gemm's epilogue being
    readable by later gemms' epilogues and operands of the same iteration."""

    name: str
    dim: str  # the size name the loop runs over (T)
    carries: tuple[Carry, ...]
    gemms: tuple[Gemm, ...]
    tile: BlockShape | None = None
    warps: WarpGrid | None = None  # warps along M x 1
    stages: StageCount | None = None  # slots of the ring that streams the loop's operands
    loc: SourceLoc = _loc()
    # `blocks MxN by ...`: the blocks each tile of rows visits, listed at run time (None: every
    # block, less those a mask provably empties: kgen/lower/loop_bounds.py)
    blocks: BlockMask | None = None


@dataclass(frozen=True, slots=True)
class Packed:
    """`packed S by cu_seqlens_q`: the batch's sequences lie one after another along `dim`
    (FlashAttention's varlen layout). `offsets` is an int32 argument of B + 1 entries; sequence
    b is offsets[b] to offsets[b + 1] along `dim`, and inside it `dim` (and `row` or `col`) is
    that sequence's own."""

    dim: str
    offsets: str
    loc: SourceLoc = _loc()


# ---------------------------------------------------------------------------------------------
# Shared-memory storage: the optional `phases { ... }` and `storage { ... }` declarations
#
# A kernel runs through phases in order. The lowering names those of each gemm
# (`<gemm>.mainloop`, `<gemm>.epilogue`); the user may name more and say where the gemm phases
# fall among them. A storage declaration lays buffers out as C-like nested structs and unions:
# struct members follow each other, union members share their first byte. kgen accepts it only
# if buffers that share bytes are never live in the same phase.


@dataclass(frozen=True, slots=True)
class Phase:
    """One phase of the kernel, by name: a user phase (`dq`) or a gemm's (`g0.mainloop`)."""

    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class LiveRange:
    """Phases `first` through `last`, inclusive, in kernel order (`live(a..b)`, `live(a)`)."""

    first: str
    last: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class SmemBuffer:
    """A user buffer `name : dtype[d0, d1, ...]`, live in the union of `live` (every phase of
    the kernel when empty), aligned to `align` bytes (16 when None)."""

    name: str
    dtype: DType
    shape: tuple[int, ...]
    live: tuple[LiveRange, ...] = ()
    align: int | None = None
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class BufferRef:
    """A buffer named again, or a buffer the lowering makes (`a_smem`): the same bytes. Every
    mention of a buffer in a storage declaration must land at the same offset."""

    name: str
    loc: SourceLoc = _loc()


class StageKind(enum.Enum):
    PIPELINE = "pipeline"  # a gemm's operand stages (a_smem, b_smem)
    EPILOGUE = "epilogue"  # a gemm's epilogue buffers (staging, reduction scratch), if any


@dataclass(frozen=True, slots=True)
class StageBuffers:
    """`pipeline(g)` / `epilogue(g)`: the buffers of one stage of gemm `g`, as a struct;
    `label : pipeline(g)` names the member for the reader (as the seed's `mm_doivj`)."""

    kind: StageKind
    gemm: str
    label: str | None = None
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Struct:
    members: tuple["Member", ...]
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Union:
    members: tuple["Member", ...]
    loc: SourceLoc = _loc()


Member = typing.Union[SmemBuffer, BufferRef, StageBuffers, Struct, Union]


@dataclass(frozen=True, slots=True)
class StorageDecl:
    """`storage { persistent { ... } union { ... } x : f16[64] live(a) }`: the persistent
    members first, as a struct, then `root`, as declared; then the `packed` buffers (declared
    at the top of the block, outside any struct or union) and the buffers the lowering makes
    that the declaration does not mention, placed by the packer."""

    persistent: tuple[Member, ...] = ()
    root: Union | Struct | None = None
    packed: tuple[SmemBuffer, ...] = ()
    loc: SourceLoc = _loc()


# ---------------------------------------------------------------------------------------------
# Kernels


@dataclass(frozen=True, slots=True)
class Kernel:
    name: str
    target: Arch
    params: tuple[Param, ...]
    gemms: tuple[Gemm, ...]
    compute_dtype: DType = DType.F32
    loc: SourceLoc = _loc()
    target_loc: SourceLoc = _loc()
    phases: tuple[Phase, ...] = ()  # the kernel's phase order, when the user gives one
    storage: StorageDecl | None = None
    # Reductions across CTAs: False merges partials with atomics (one launch); True writes
    # them to a workspace and a second kernel combines them in a fixed order (bit-identical).
    deterministic: bool = False
    # `schedule pingpong` (None: every warp runs every stage of every tile)
    schedule: Schedule | None = None
    schedule_loc: SourceLoc = _loc()
    # A loop kernel: `gemms` is empty and the loop holds them (None: a gemm or chain kernel)
    loop: Loop | None = None
    # The kernel's own epilogue: after the loop in a loop kernel (its accumulators and carries
    # as values), or the whole body of a row kernel (no gemm, no loop: element-wise over the
    # [rows, cols] of its same-shape input tensors, row reductions as values and stores)
    epilogue: Epilogue | None = None
    # `packed` lines: dimensions whose sequences are packed by offsets (loop kernels)
    packed: tuple[Packed, ...] = ()

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def gemm(self, name: str) -> Gemm | None:
        return next((g for g in self.gemms if g.name == name), None)

    @property
    def is_program(self) -> bool:
        """A tile program: a loop kernel, or a row kernel (no gemm, an epilogue); lowered by
        kgen/lower/program.py, not as gemms."""
        return self.loop is not None or (not self.gemms and self.epilogue is not None)


# ---------------------------------------------------------------------------------------------
# Sequences: kernels of one module launched in order, passing buffers


@dataclass(frozen=True, slots=True)
class Launch:
    """`launch attention_bwd_dot`: one kernel of the module, run once at this point."""

    kernel: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class WorkspaceBuffer:
    """A name of `workspace D, dQacc`: a buffer the launched kernels pass between them. Its
    kind, dtype and shape are those of the parameter the kernels declare under the name."""

    name: str
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Sequence:
    """`sequence attention_backward { workspace D, dQacc  launch a  launch b }`: the kernels
    `launches` run in order on one stream. A name that two kernels both declare is one buffer
    (kind, dtype, shape and layout agree). The `workspace` buffers are allocated by whoever
    launches the sequence (the runtime, the .cu's launcher), contiguous; every other parameter
    of the kernels is a parameter of the sequence. One kernel at most adds into an
    `out accumulate` buffer, whose launch zeroes it first (kgen/verify/sequence.py checks the
    rest)."""

    name: str
    launches: tuple[Launch, ...]
    workspace: tuple[WorkspaceBuffer, ...] = ()
    loc: SourceLoc = _loc()


@dataclass(frozen=True, slots=True)
class Module:
    """What one source file holds: one or more kernels, and the sequences that launch them."""

    kernels: tuple[Kernel, ...]
    file: str = "<python>"
    sequences: tuple[Sequence, ...] = ()

    def kernel(self, name: str) -> Kernel | None:
        return next((k for k in self.kernels if k.name == name), None)


def canonical_text(kernel: Kernel) -> str:
    """The kernel as text without source locations: the same for kernels that differ only in
    where they were written (the `loc` fields take no part in repr; `resident_loc` is cleared),
    different for any other change. Hashed for the header of a kernel built from Python
    (kgen.api.build) and for the tune cache's key (kgen.tune.cache.kernel_hash)."""
    gemms = tuple(dataclasses.replace(g, resident_loc=None) for g in kernel.gemms)
    return repr(dataclasses.replace(kernel, gemms=gemms))
