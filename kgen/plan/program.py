"""The plan of a tile program: a loop kernel (a CTA keeps a tile of rows and streams blocks of a
dimension, carrying row state and an accumulator) or a row kernel (gemm-less, element-wise over
rows with row reductions as values). Built by kgen/lower/program.py; every number is concrete.
The emitter (kgen/targets/common/loop.py, rows.py) reads only this.

The body is a list of typed statements over values. A value has a rank: UNIFORM (one per
thread: constants, scalars), ROW (one per row the thread holds) or TILE (one per element of the
tile the statement list runs over: the first gemm's [rows, block] in the loop, [rows, N1] in the
kernel epilogue, [rows, cols] in a row kernel). Expression nodes reuse the epilogue DAG's kinds
(kgen/plan/epilogue.py) and add the ones only a program has (positions, carries, reductions).
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..enums import Arch, Axis, Dim, DType, Layout, ReduceOp, Role
from .epilogue import Accumulator, Apply, Cast, Constant, ScalarArg, TensorLoad, VectorLoad


class Rank(enum.Enum):
    UNIFORM = "uniform"
    ROW = "row"
    TILE = "tile"


# ---------------------------------------------------------------------------------------------
# Expression nodes a program adds to the epilogue DAG's


@dataclass(frozen=True, slots=True)
class PositionValue:
    """`row` (the global row within the (batch, head)) or `col` (the tile's global column)."""

    axis: Axis


@dataclass(frozen=True, slots=True)
class ExtentValue:
    """A dimension's size as a value: the loop's length (`loop`) or the kernel's rows."""

    dim: str
    loop: bool


@dataclass(frozen=True, slots=True)
class RandomValue:
    """`random(seed, offset)` (ir.Random): Philox 4x32-10, 16 bits per element (one call per
    eight), keyed by u64 scalars; `transposed`: counted at (col, row) (random_t)."""

    seed: str
    offset: str
    transposed: bool = False


@dataclass(frozen=True, slots=True)
class CarryValue:
    """A row carry's value at the start of the iteration (or after the loop)."""

    carry: str


@dataclass(frozen=True, slots=True)
class AccumulatorValue:
    """The carried accumulator of an accumulating gemm, after the loop (kernel epilogue)."""

    gemm: str


@dataclass(frozen=True, slots=True)
class RowReduction:
    """A row reduction of a TILE value over the columns that exist (those past the end are
    skipped): within a thread, then across the threads that share the row."""

    op: ReduceOp
    arg: int


NodeKind = (Accumulator | Constant | ScalarArg | VectorLoad | TensorLoad | Apply | Cast
            | PositionValue | CarryValue | AccumulatorValue | RowReduction | ExtentValue
            | RandomValue)


@dataclass(frozen=True, slots=True)
class Value:
    id: int  # index in the section's value list; arguments come earlier
    kind: NodeKind
    rank: Rank


# ---------------------------------------------------------------------------------------------
# Statements


@dataclass(frozen=True, slots=True)
class Compute:
    """Compute values (element-wise, in order); a RowReduction value reduces its argument."""

    values: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UpdateCarry:
    """A row carry takes a ROW value (later statements already read the value itself)."""

    carry: str
    value: int


@dataclass(frozen=True, slots=True)
class Rescale:
    """The accumulator of `gemm` times a ROW value, row by row. `ones`: the value is
    where(c, 1, e), 1 wherever c holds (the lazy maximum of kgen.attention's program: on every
    block that leaves a row's reference maximum where it was), so a skeleton may skip the
    multiplies where a warp's rows all read 1 (WgmmaLoop.vote)."""

    gemm: str
    value: int
    ones: bool = False


@dataclass(frozen=True, slots=True)
class HandOn:
    """The first gemm's stored TILE value, zero past the loop's end, rounded to `dtype` in
    registers: for mma.sync m16n8k16 the accumulator fragments of two adjacent n8 tiles are
    the A fragment of one k16 step of the next gemm."""

    value: int
    dtype: DType


@dataclass(frozen=True, slots=True)
class StoreTile:
    """A TILE value converted to `dtype`, stored to a [rows, cols] output (rows in bounds)."""

    param: str
    value: int
    dtype: DType


@dataclass(frozen=True, slots=True)
class StoreRow:
    """A ROW value stored to a vector output of length rows (rows in bounds), once per row."""

    param: str
    value: int
    dtype: DType


@dataclass(frozen=True, slots=True)
class GemmStep:
    """A loop gemm's MMAs on this block: A from its shared tile (ldmatrix) or, for the
    accumulating gemm, from the value handed on (registers); B from its tile's ring slot; a
    first gemm's accumulator starts at zero, an accumulating one adds to the carried one."""

    gemm: "LoopGemm"


Statement = Compute | UpdateCarry | Rescale | HandOn | StoreTile | StoreRow | GemmStep


@dataclass(frozen=True, slots=True)
class Section:
    """A statement list over one tile shape, with the values it computes."""

    values: tuple[Value, ...]
    statements: tuple[Statement, ...]


# ---------------------------------------------------------------------------------------------
# Parameters, shared memory and gemms


@dataclass(frozen=True, slots=True)
class ProgramParam:
    """A kernel parameter as the program addresses it: per (batch, head) a matrix (rows, cols
    in memory order: `layout`), a vector, or a scalar. `kv`: its heads are the KV heads (GQA:
    query head h reads h / group)."""

    name: str
    kind: str  # "tensor", "vector", "scalar"
    dtype: DType
    role: Role
    shape: tuple[Dim, ...]
    layout: Layout
    batched: bool
    headed: bool
    kv: bool
    default: float | None = None  # scalars: the declared value
    positive: bool = False  # scalars: every value is > 0 (ir.Param.positive)
    # its rows are packed sequences (`packed S by ...`): "rows" when they are the kernel's
    # rows, "loop" when the loop's; passed with the batch fused into them. A packed line's
    # offsets are themselves a parameter, of kind "offsets" (int32, B + 1 entries).
    packed: str | None = None


@dataclass(frozen=True, slots=True)
class ProgramField:
    """A member of the params struct: `ctype` one of "ptr", "i64", "i32", "f32"."""

    name: str
    ctype: str
    param: str | None = None  # the parameter it belongs to


@dataclass(frozen=True, slots=True)
class SmemTile:
    """A tile in shared memory, `slots` copies (a ring): rows x cols elements, row-major, each
    row's 16-byte chunks XOR-swizzled: chunk c of row r lands at c ^ ((r >> shift) & mask),
    which makes 8 rows read at one chunk (ldmatrix) and a warp's 16-byte writes (cp.async)
    conflict-free."""

    name: str  # its member of the shared storage struct (q_smem, b_smem, c_smem)
    param: str
    rows: int
    cols: int
    slots: int
    dtype: DType
    offset: int  # bytes from the start of the storage
    swizzle_mask: int
    swizzle_shift: int
    # the tile's rows run along the loop's dimension (zero-filled past its end) or along a
    # fixed one (its columns are then the loop's, 16-byte chunks zero-filled past the end)
    rows_along_loop: bool

    @property
    def chunks(self) -> int:  # 16-byte chunks per row
        return self.cols * self.dtype.nbytes // 16

    @property
    def slot_bytes(self) -> int:
        return self.rows * self.cols * self.dtype.nbytes

    @property
    def bytes(self) -> int:
        return self.slot_bytes * self.slots


class FragmentLoad(enum.Enum):
    """How an mma.sync B fragment comes from a shared tile. Value: the device helper."""

    N_MAJOR = "ldsm_b_nk"  # the tile is [n][k]: ldmatrix
    K_MAJOR = "ldsm_b_kn"  # the tile is [k][n]: ldmatrix.trans


@dataclass(frozen=True, slots=True)
class LoopGemm:
    """One gemm of the loop: [tile_m, k] x [k, n] per CTA, 16 rows per warp, mma.sync
    m16n8k16 (k16 steps x n8 tiles per warp)."""

    name: str
    a: str  # the A tile in shared memory, or the handed-on value of the first gemm
    b: str  # the B tile in shared memory
    b_load: FragmentLoad
    k: int
    n: int
    accumulate: bool

    @property
    def k_steps(self) -> int:
        return self.k // 16

    @property
    def n8_tiles(self) -> int:
        return self.n // 8


@dataclass(frozen=True, slots=True)
class Choice:
    """A configuration value and why it was chosen."""

    value: str
    why: str


# ---------------------------------------------------------------------------------------------
# The blocks a tile of rows visits (a mask's dead blocks skipped)


class Term(enum.Enum):
    """What a term of a bound's offset multiplies."""

    ONE = "one"  # a constant
    SCALAR = "scalar"  # a scalar parameter
    ROWS = "rows"  # the kernel's rows (its size)
    LOOP_LEN = "loop_len"  # the loop's length


@dataclass(frozen=True, slots=True)
class OffsetTerm:
    coef: float
    term: Term
    param: str | None = None  # Term.SCALAR: its name; ROWS, LOOP_LEN: the dimension's


@dataclass(frozen=True, slots=True)
class ColumnBound:
    """One comparison of a mask, solved for `col`: col <= slope * row + offset (`upper`) or
    col >= slope * row + offset; `strict`: < or >. The offset is a sum of terms, one value for
    the whole launch."""

    upper: bool
    strict: bool
    slope: int  # -1, 0 or 1
    offset: tuple[OffsetTerm, ...]


@dataclass(frozen=True, slots=True)
class EqualBound:
    """A mask's comparison `row_vector[row] == col_vector[col]` (packed documents' ids): per
    tile of rows the kernel scans the loop's `col_vector` once for the columns whose value lies
    within the tile's `row_vector` values (only they may be kept: the blocks past the first and
    the last are masked in full) and, where the tile holds one value and its columns are one
    run, the blocks inside that run (every element kept)."""

    row_vector: str
    col_vector: str


@dataclass(frozen=True, slots=True)
class BlockList:
    """A block mask (`blocks MxN by COUNTS, INDICES[, full ...]`, ir.BlockMask): per (batch,
    head, tile of rows) the blocks the tile visits, read by the kernel at run time: first the
    `counts[tile]` partial blocks `indices[tile][0..]`, where the body runs as written, then the
    `full_counts[tile]` full blocks `full_indices[tile][0..]`, where every mask in `masks` (a
    body value where(P, e, -inf)) reads its `e` (`interior` true). Counts are clamped to
    [0, blocks], each index to [0, blocks - 1] (never read out of bounds)."""

    counts: str
    indices: str
    full_counts: str | None
    full_indices: str | None
    masks: tuple[int, ...]

    @property
    def names(self) -> tuple[str, ...]:
        full = (self.full_counts, self.full_indices) if self.full_counts is not None else ()
        return (self.counts, self.indices, *full)


@dataclass(frozen=True, slots=True)
class LoopBounds:
    """Which blocks of the loop a tile of rows visits and which of them lie inside the mask.

    From the tile's row range, the kernel takes for each bound the first and last column any of
    its rows keeps (a block past them is masked in full for every row: skipped) and the columns
    every row keeps (a block inside them runs with the mask's predicates known true: `fold`, the
    body's predicate values, read as 1 there). No bounds: every block runs, as `why` says."""

    bounds: tuple[ColumnBound, ...]
    fold: tuple[int, ...]  # body values (predicates) true in a block inside every bound
    why: str
    equalities: tuple[EqualBound, ...] = ()  # scanned at run time, per tile of rows
    # a block mask: the blocks listed at run time (bounds and equalities then empty)
    listed: BlockList | None = None

    @property
    def skips(self) -> bool:
        return bool(self.bounds or self.equalities or self.listed)


@dataclass(frozen=True, slots=True)
class PackedDim:
    """`packed DIM by OFFSETS`: DIM holds the batch's sequences one after another; `along` is
    "rows" (the kernel's rows) or "loop" (the loop's dimension). Per batch the skeleton reads
    its start and extent from OFFSETS; the params struct's `rows` (or `loop_len`) is then the
    longest sequence's (the grid's), and `rows_total` (`loop_total`) all of them together."""

    dim: Dim
    offsets: str
    along: str

    @property
    def total(self) -> str:
        """The params struct's member holding every sequence's extent together."""
        return "rows_total" if self.along == "rows" else "loop_total"


# ---------------------------------------------------------------------------------------------
# The plans


@dataclass(frozen=True, slots=True)
class LoopPlan:
    """A loop kernel: the CTA's tile_m rows of one (batch, head), the loop over `loop_dim` in
    blocks of `block`, `stages` ring slots of the streamed operands."""

    name: str
    arch: Arch
    params: tuple[ProgramParam, ...]
    fields: tuple[ProgramField, ...]
    dtype: DType  # the operands'
    rows_dim: Dim  # the kernel's rows (S, M)
    loop_dim: Dim  # the loop's dimension (T, N0)
    tile_m: int
    block: int
    warps: int
    stages: int
    carries: tuple[tuple[str, float], ...]  # row carries and their initial values
    a_tile: SmemTile  # the loop-invariant operand, loaded once
    b_tile: SmemTile  # the first gemm's B, streamed
    c_tile: SmemTile  # the accumulating gemm's B, streamed
    gemm0: LoopGemm
    gemm1: LoopGemm
    body: Section  # once per block: the first gemm, its epilogue, the accumulating gemm
    epilogue: Section  # once, after the loop, over [rows, N1]
    smem_bytes: int
    mma: Choice  # the MMA instruction and why
    config: Choice  # tile, warps, stages and why
    heads_param: str | None  # a parameter with the query heads (grid.y), if any
    kv_param: str | None  # a parameter with the KV heads (GQA), if any
    batch_param: str | None
    # sm_90a: the warp-specialized wgmma skeleton's schedule (None: the mma.sync skeleton)
    wgmma: "WgmmaLoop | None" = None
    bounds: LoopBounds = LoopBounds((), (), "no mask")  # the blocks each tile of rows visits
    min_ctas: Choice = Choice("1", "the default")  # CTAs per SM the launch bounds ask for
    packed: tuple[PackedDim, ...] = ()  # packed sequences (FlashAttention's varlen layout)
    # how the body spells tanh (TANH_APPROX: the hardware's tanh.approx.f32), and why
    tanh: Choice = Choice("none", "the loop's body computes no tanh")
    # how the body and the epilogue after the loop divide a tile value by a row or uniform one
    # (RECIPROCAL: times its reciprocal, computed once), and why
    division: Choice = Choice("none", "the loop's body divides no tile value by a row or "
                                      "uniform value")

    @property
    def threads(self) -> int:
        return self.wgmma.threads if self.wgmma is not None else self.warps * 32

    def packed_along(self, along: str) -> PackedDim | None:
        """The packed line of the rows ("rows") or of the loop's dimension ("loop"), if any."""
        return next((d for d in self.packed if d.along == along), None)

    @property
    def kind(self) -> str:
        return "loop"

    def param(self, name: str) -> ProgramParam | None:
        return next((p for p in self.params if p.name == name), None)


@dataclass(frozen=True, slots=True)
class RowsPlan:
    """A row kernel: one warp per row, `rows_per_cta` rows per CTA, each lane reading 16-byte
    chunks of the row (chunk lane, lane + 32, ...)."""

    name: str
    arch: Arch
    params: tuple[ProgramParam, ...]
    fields: tuple[ProgramField, ...]
    rows_dim: Dim
    cols: int
    warps: int
    body: Section
    heads_param: str | None
    kv_param: str | None
    batch_param: str | None
    # f32 tensors [rows, cols] per (batch, head), `out accumulate` of the kernel `zeroes_for`
    # launched after this one in a sequence, each warp zeroing its row of them beside its own
    # work (kgen/sequence_zeroing.py decides it and adds them to params and fields): that
    # kernel's own zeroing launch is then left out. Empty: the row kernel zeroes nothing.
    zeroes: tuple[str, ...] = ()
    zeroes_for: str = ""

    @property
    def threads(self) -> int:
        return self.warps * 32

    @property
    def rows_per_cta(self) -> int:
        return self.warps

    @property
    def chunks(self) -> int:  # 8-element chunks per row
        return self.cols // 8

    @property
    def lane_chunks(self) -> int:  # chunks per lane (the last round partly past the row)
        return -(-self.chunks // 32)

    @property
    def smem_bytes(self) -> int:
        return 0

    @property
    def kind(self) -> str:
        return "rows"

    def param(self, name: str) -> ProgramParam | None:
        return next((p for p in self.params if p.name == name), None)


ProgramPlan = LoopPlan | RowsPlan


# ---------------------------------------------------------------------------------------------
# sm_90a: the warp-specialized wgmma skeleton of a loop kernel (templates/sm90/loop.cu.j2).
# Chosen by the rulebook (kgen/targets/loop_rules.py, wgmma_refusal); None on a LoopPlan: the
# mma.sync skeleton (templates/common/loop.cu.j2) runs.


@dataclass(frozen=True, slots=True)
class LoopTensorMap:
    """A copy-engine map of a 16-bit operand with dims (cols, rows, heads, batches), innermost
    first, in boxes of [box_rows][64 columns] (128 bytes, the 128-byte swizzle) of one (head,
    batch): elements past the rows (S, T) arrive as zeros. `kv`: its heads are the KV heads."""

    param: str
    dtype: DType
    box_rows: int
    boxes: int  # boxes per tile: its columns / 64
    kv: bool


@dataclass(frozen=True, slots=True)
class WgmmaTile:
    """A tile in shared memory as the copy engine writes it and wgmma reads it: `boxes` boxes
    of [rows][64] (128-byte rows, 128-byte swizzle, 1024-byte aligned), `slots` copies."""

    name: str  # its member of the shared storage struct (q_smem, k_smem, v_smem)
    param: str
    rows: int
    boxes: int
    slots: int
    offset: int  # bytes from the start of the storage

    @property
    def box_bytes(self) -> int:
        return self.rows * 128

    @property
    def slot_bytes(self) -> int:
        return self.box_bytes * self.boxes

    @property
    def bytes(self) -> int:
        return self.slot_bytes * self.slots


TANH_APPROX = "tanh.approx.f32"  # LoopPlan.tanh: the body's tanh by the hardware's instruction
RECIPROCAL = "a * (1 / b)"  # LoopPlan.division: by the divisor's reciprocal, computed once
PERSISTENT = "persistent"  # WgmmaLoop.scheduler: CTAs that walk the tiles
LONGEST_FIRST = "longest first"  # WgmmaLoop.tile_order: the grid's row tiles reversed


@dataclass(frozen=True, slots=True)
class WgmmaLoop:
    """The sm_90a skeleton's schedule: warp roles (one producer warpgroup whose one thread
    issues the copy engine's loads, `consumers` warpgroups of 64 rows each), registers per
    role (setmaxnreg), the MMAs (S = A B^T by wgmma from shared memory, both K-major; the
    accumulating gemm by wgmma with A from registers, B MN-major), the rings (K and V, each
    `stages` slots with full and empty mbarriers) and the overlap; each with why."""

    consumers: int
    producer_registers: int
    consumer_registers: int
    q_tile: WgmmaTile
    k_tile: WgmmaTile
    v_tile: WgmmaTile
    barrier_offset: int  # the mbarriers after the tiles (8 bytes each)
    smem_bytes: int
    maps: tuple[LoopTensorMap, ...]  # Q, K, V: the kernel's second parameter
    roles: Choice
    mma: Choice
    pipeline: Choice
    overlap: Choice
    # the accumulating gemm of block j - 1 is issued after block j's S and completes while
    # block j's statements run, up to the first that touches the accumulator or the handed-on
    # value (the skeleton waits there)
    issue_ahead: bool = False
    # two consumer warpgroups take turns at the tensor cores (named barriers): one issues its
    # MMAs while the other runs its statements (needs issue_ahead and two consumers)
    pingpong: bool = False
    # the grid's tiles of rows launched last first (LONGEST_FIRST) where the mask gives the
    # later tiles more blocks, and why
    tile_order: Choice = Choice("in order", "the default")
    # TILED: one CTA per (row tile, head, batch); PERSISTENT: min(tiles, resident CTAs) CTAs
    # each walk the tiles blockIdx.x, + gridDim.x, ... (row tile outermost, in tile_order),
    # the rings' count running across a CTA's tiles; and why
    scheduler: Choice = Choice("tiled", "one CTA per tile of rows")
    # a tensor the body reads at (row, col) (an additive bias), staged per block: its
    # [tile_m, block] tile loaded by the copy engine into a ring of its own (full, empty mbarriers),
    # the statements reading it from shared memory; None: read from global memory per element
    staged_tile: WgmmaTile | None = None
    staging: Choice = Choice("none", "the body reads no tensor at (row, col)")
    # a Rescale whose factor is where(c, 1, e) (Rescale.ones): skipped where every row of a
    # warp reads 1, one vote a block ("vote"), or always multiplied ("multiply"); and why
    rescale: Choice = Choice("multiply", "the factor is not 1 by construction")

    @property
    def vote(self) -> bool:
        return self.rescale.value.startswith("vote")

    @property
    def tiles(self) -> tuple[WgmmaTile, ...]:
        """The shared tiles in storage order: Q, K, V, then the staged tensor's, if any."""
        staged = (self.staged_tile,) if self.staged_tile is not None else ()
        return (self.q_tile, self.k_tile, self.v_tile) + staged

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def tensor_maps(self) -> tuple[LoopTensorMap, ...]:
        """The kernel's second parameter (as the DAG loop's DagWgmma.tensor_maps)."""
        return self.maps

    @property
    def rows_reversed(self) -> bool:
        return self.tile_order.value == LONGEST_FIRST

    @property
    def persistent(self) -> bool:
        return self.scheduler.value == PERSISTENT
