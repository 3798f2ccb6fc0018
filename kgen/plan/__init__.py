"""The lowered plan: every number concrete, ready for emission and launch.

The lowering passes (`kgen.lower`) build it from a verified `ir.Kernel`; the emitters render it
and the runtime launches from it. Nothing here refers to Jinja or to the GPU.
"""
from __future__ import annotations

import dataclasses
import enum
from dataclasses import dataclass

from ..enums import Arch, Axis, Dim, DType, Layout, ParamKind, Residency, Role
from ..errors import SourceLoc
# The epilogue DAG and the Schedule live in modules of their own; kgen.plan names them all.
from .epilogue import (  # noqa: F401
    Accumulator, Apply, Cast, Constant, Effect, EpilogueDag, EpilogueNode, FeedEffect,
    NodeKind, PackedStore, ReduceEffect, ReductionPlan, Round, ScalarArg, StoreEffect,
    TensorLoad, VectorLoad)
from .schedule import (  # noqa: F401
    AccPromotion, CachePolicy, Cluster, ColumnPasses, EntryPoints, EpilogueGroups, EpilogueMath,
    EpilogueVectors, GemmSchedule, KernelKind, KSplit, LineChoice, LoadPath, Mma, MmaAtom,
    OperandSchedule, Output, Overlap, PeriodSets, Pipeline, PromotionBound, Raster, ScaleLoads,
    Schedule, StagedInput, Staging, StagingMode, StorePath, TensorMap, TileScheduler, VectorHome,
    WarpRole, WarpRoles, staged_vector_buffer)


# ---------------------------------------------------------------------------------------------
# Shared-memory tiles


@dataclass(frozen=True, slots=True)
class Swizzle:
    """CUTLASS-style XOR swizzle on element offsets: bits [base+shift, base+shift+bits) are
    XORed into bits [base, base+bits). Swizzle(0, 0, 0) is the identity."""

    bits: int
    base: int
    shift: int

    def __call__(self, offset: int) -> int:
        mask = ((1 << self.bits) - 1) << self.base
        return offset ^ ((offset >> self.shift) & mask)

    def __str__(self) -> str:
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"


@dataclass(frozen=True, slots=True)
class SmemTile:
    """One pipeline stage of an operand tile in shared memory.

    The tile has `outer` rows of `inner` contiguous elements. It is stored as inner/atom_inner
    column blocks ("atoms"), each `outer x atom_inner` elements, row-major and swizzled, so that
    an atom row is at most 128 bytes. Element (r, c) lives at element offset
        (c // atom_inner) * outer * atom_inner + swizzle(r * atom_inner + c % atom_inner).
    """

    name: str  # C++ name, e.g. "a_smem"
    dtype: DType
    outer: int
    inner: int
    atom_inner: int
    swizzle: Swizzle
    stages: int

    @property
    def stage_elems(self) -> int:
        return self.outer * self.inner

    @property
    def bytes(self) -> int:
        return self.stage_elems * self.stages * self.dtype.nbytes

    def offset(self, r: int, c: int) -> int:
        atom, cc = divmod(c, self.atom_inner)
        return atom * self.outer * self.atom_inner + self.swizzle(r * self.atom_inner + cc)


# ---------------------------------------------------------------------------------------------
# Storage


@dataclass(frozen=True, slots=True)
class Buffer:
    """A shared-memory buffer placed at a byte offset, live over phases [first, last]; when
    `ranges` is given, only in those inclusive phase ranges (a buffer carried from the end of a
    loop iteration to the start of the next is live at both ends, not in between)."""

    name: str
    bytes: int
    align: int
    offset: int
    live: tuple[int, int]
    role: str  # human-readable, e.g. "A stages (mainloop of mma0)"
    swizzle: Swizzle | None = None
    dtype: DType | None = None  # element type of its typed accessor
    ranges: tuple[tuple[int, int], ...] = ()  # () means (live,)
    declared: bool = False  # placed by the kernel's storage declaration, not by the packer

    @property
    def live_ranges(self) -> tuple[tuple[int, int], ...]:
        return self.ranges or (self.live,)

    @property
    def end(self) -> int:
        return self.offset + self.bytes

    def live_in(self, phase: int) -> bool:
        return any(first <= phase <= last for first, last in self.live_ranges)

    def co_live(self, other: "Buffer") -> bool:
        """True when both are live in some phase."""
        return any(a0 <= b1 and b0 <= a1
                   for a0, a1 in self.live_ranges for b0, b1 in other.live_ranges)

    def shares_bytes(self, other: "Buffer") -> bool:
        return (self.bytes > 0 and other.bytes > 0
                and self.offset < other.end and other.offset < self.end)


@dataclass(frozen=True, slots=True)
class StoragePlan:
    phases: tuple[str, ...]  # phase names, in kernel order
    buffers: tuple[Buffer, ...]
    total_bytes: int
    limit_bytes: int
    # The most bytes live in any one phase: no layout of these buffers can be smaller.
    peak_bytes: int = 0
    # With a storage declaration: its size, and what the packer alone would need for the same
    # buffers and lifetimes (never more than the declared layout).
    declared_bytes: int | None = None
    packed_bytes: int | None = None

    def live_text(self, buffer: Buffer) -> str:
        """`a..b, c`: the buffer's live phases by name."""
        def name(i: int) -> str:
            return self.phases[i] if 0 <= i < len(self.phases) else str(i)

        return ", ".join(name(a) if a == b else f"{name(a)}..{name(b)}"
                         for a, b in buffer.live_ranges)


# ---------------------------------------------------------------------------------------------
# The kernel's parameters, as the emitters and the runtime see them


@dataclass(frozen=True, slots=True)
class Param:
    """A tensor, vector or scalar argument: the IR's parameter without its source location, so
    that nothing past the lowering needs the IR."""

    name: str
    kind: ParamKind
    dtype: DType
    shape: tuple[Dim, ...] = ()
    layout: Layout = Layout.ROW
    role: Role = Role.IN
    default: float | None = None  # scalars only
    batch: Dim | None = None  # the batch dimension of a batched tensor or vector
    positive: bool = False  # a scalar whose every value is > 0 (ir.Param.positive)

    @property
    def is_output(self) -> bool:
        return self.role is Role.OUT

    @property
    def full_shape(self) -> tuple[Dim, ...]:
        """The argument's shape: the batch dimension first, when there is one."""
        return self.shape if self.batch is None else (self.batch, *self.shape)


# ---------------------------------------------------------------------------------------------
# The kernel's parameter block (the ABI shared by the emitted .cu and the runtime)


class FieldKind(enum.Enum):
    POINTER = "pointer"  # device pointer to a tensor or vector parameter
    SIZE = "size"  # a runtime extent such as M (int32)
    LEADING_DIM = "ld"  # elements between consecutive rows (row) or columns (col), int64
    SCALAR = "scalar"  # a scalar parameter, in the compute type
    WORKSPACE = "workspace"  # device scratch the caller provides (deterministic reductions)
    BATCH_STRIDE = "batch"  # elements between consecutive batches of a batched argument, int64


@dataclass(frozen=True, slots=True)
class ParamField:
    """One member of `<kernel>_params`, in declaration order. C layout rules apply."""

    name: str  # C++ member name
    kind: FieldKind
    ctype: str  # C++ type, e.g. "const __half*", "int", "long long", "float"
    param: str | None = None  # the ir.Param this field belongs to (None for sizes)
    dim: str | None = None  # for SIZE: the symbolic dimension name
    default: float | None = None  # for SCALAR: the value used when the caller gives none


# ---------------------------------------------------------------------------------------------
# Mainloop and epilogue


@dataclass(frozen=True, slots=True)
class OperandPlan:
    """How one gemm operand travels from global memory to MMA fragments."""

    param: str
    dtype: DType
    k_major: bool  # True when K is the contiguous dimension (A row, B col)
    smem: SmemTile
    copies_per_thread: int  # 16-byte cp.async per thread per stage
    ldmatrix_trans: bool
    # Offsets proved for every thread (element units, within a stage): copy i lands at
    # (copy_base ^ X) + Y and fragment (kk, f) is read at (frag_base ^ X) + Y.
    copy_steps: tuple[tuple[int, int], ...]
    copy_row_step: int  # tile rows between a thread's consecutive copies
    frag_steps: tuple[tuple[tuple[int, int], ...], ...]  # [kk][f]
    # None: every thread copies; else a stage has fewer 16-byte chunks than the CTA has
    # threads (a narrow B tile), and threads t < copy_threads copy one chunk each
    copy_threads: int | None = None


@dataclass(frozen=True, slots=True)
class ChainPlan:
    """A chained gemm's A operand: the epilogue output of the gemm before it, kept on chip.

    REGISTERS: each warp turns its own f32 accumulators into its A fragments (the m16n8
    accumulator layout of n8 tiles 2kk and 2kk + 1 is the m16n8k16 A layout of k step kk), so
    every warp must own whole rows. SMEM: the source's epilogue writes the tile once (the A
    operand's `smem`, K-major, swizzled) and this gemm reads it back with ldmatrix."""

    source: str  # the gemm whose epilogue output is A
    residency: Residency
    dtype: DType  # the operand dtype the intermediate is rounded to, once
    k: int  # this gemm's whole K: the source's N
    k_steps: int  # k16 steps over it


@dataclass(frozen=True, slots=True)
class GemmPlan:
    name: str
    tile: tuple[int, int, int]
    warps: tuple[int, int]
    warp_tile: tuple[int, int]
    mma: tuple[int, int, int]
    frags: tuple[int, int]  # MMA tiles per warp along M and N
    stages: int
    a: OperandPlan | None  # None: a chained A kept in registers (see `chain`)
    b: OperandPlan
    m_dim: Dim
    n_dim: Dim
    k_dim: Dim
    epilogue: EpilogueDag
    chain: ChainPlan | None = None  # set when A is an earlier gemm's output
    # The source's names of A and B (a parameter, or an earlier gemm for a chained A), for the
    # emitted file's comments
    a_name: str = ""
    b_name: str = ""
    # Threads that copy A when not the gemm's own (schedule pingpong: the producer warps); 0
    producer_threads: int = 0
    # the FP8 operands' block scales (`scale A by SA 1x128`), applied at each k tile's promotion
    scales: tuple[ScalePlan, ...] = ()


@dataclass(frozen=True, slots=True)
class ScalePlan:
    """A block scale of an FP8 operand as the kernel reads it: `param` [M or ceil(N / 128),
    ceil(K / 128)] of f32 in `layout` (element (r, kb) at r * ld + kb row-major, kb * ld + r
    column-major), one scale per `block` (M or N rows, K) elements of `operand` ("A" or "B")."""

    operand: str
    param: str
    block: tuple[int, int]
    layout: Layout

    def describe(self) -> str:
        return f"{self.operand} by {self.param} {self.block[0]}x{self.block[1]} ({self.layout.value})"


@dataclass(frozen=True, slots=True)
class BlockDim:
    """A size that counts blocks of another: `dim` must be ceil(`of` / `block`) (a block
    scale's K blocks, or B's column blocks); the runtime and the launcher check it."""

    dim: Dim
    of: Dim
    block: int
    param: str  # the scale tensor whose shape holds it

    @property
    def reason(self) -> str:
        return f"{self.param} holds one scale per {self.block} of {self.of}"


@dataclass(frozen=True, slots=True)
class Alignment:
    """What a tensor or vector argument needs: its base pointer aligned to `ptr_bytes`, for
    2-D tensors its leading dimension a multiple of `ld_multiple` elements, and, batched, its
    batch stride a multiple of `batch_multiple` elements."""

    param: str
    ptr_bytes: int
    ld_multiple: int
    reason: str
    # a batched argument's batch stride, in elements (every batch's pointer as aligned); 1: none
    batch_multiple: int = 1


@dataclass(frozen=True, slots=True)
class DimRule:
    """A size must be a multiple of `multiple` (a fixed one only in a fast entry point's rules,
    which then never runs)."""

    dim: Dim
    multiple: int
    reason: str


@dataclass(frozen=True, slots=True)
class KernelPlan:
    name: str  # the kernel's: its C++ entry point and every file's prefix
    arch: Arch
    fields: tuple[ParamField, ...]
    gemms: tuple[GemmPlan, ...]
    storage: StoragePlan
    alignments: tuple[Alignment, ...]
    dim_rules: tuple[DimRule, ...]
    # How the kernel runs: its kind, warp roles, and per gemm the MMA, the load path of each
    # operand and the store path of the output (written only by kgen/lower/select.py)
    schedule: Schedule
    # Every parameter, in declaration order; the compute type and reduction mode of the epilogue
    params: tuple[Param, ...] = ()
    compute_dtype: DType = DType.F32
    deterministic_reductions: bool = False
    # The kernel's declaration, for an error found past the lowering (e.g. nothing to emit)
    loc: SourceLoc | None = None
    # sizes that count blocks of another (block scales' shapes)
    block_dims: tuple[BlockDim, ...] = ()

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def with_gemm_schedule(self, **changes) -> KernelPlan:
        """This one-gemm plan with `changes` to its GemmSchedule's components (e.g.
        `vectors=EpilogueVectors()`): another Schedule value of the same plan, for a test or a
        measurement (emit it to run it)."""
        (g,) = self.schedule.gemms
        gemms = (dataclasses.replace(g, **changes),)
        return dataclasses.replace(self, schedule=dataclasses.replace(self.schedule, gemms=gemms))

    @property
    def smem_bytes(self) -> int:
        return self.storage.total_bytes

    @property
    def reductions(self) -> tuple[ReductionPlan, ...]:
        return tuple(r for g in self.gemms for r in g.epilogue.reductions)

    @property
    def deterministic(self) -> bool:
        return self.deterministic_reductions and bool(self.reductions)

    @property
    def init_kernel(self) -> str | None:
        """The kernel that sets reduction outputs to their identity before the main launch."""
        return f"{self.name}_init" if self.reductions and not self.deterministic else None

    @property
    def split_kernel(self) -> str | None:
        """The kernel that sums the split-K partials and runs the epilogue (TileScheduler.split_k)."""
        return f"{self.name}_splitk" if self.schedule.scheduler.split_k > 1 else None

    def split_floats(self, sizes: dict[str, int]) -> int:
        """Floats of split-K partials of one batch: split_k x M x the tiles' columns (rows
        tiles_n x tile N floats apart, so every column pair is 8-byte aligned)."""
        if self.split_kernel is None:
            return 0
        g = self.gemms[-1]
        tiles_n = -(-self.resolve(g.n_dim, sizes) // g.tile[1])
        m = self.resolve(self.gemms[0].m_dim, sizes)
        return self.schedule.scheduler.split_k * m * tiles_n * g.tile[1]

    def split_grid(self, sizes: dict[str, int]) -> tuple[int, int, int]:
        """One thread per output column pair of every batch; with epilogue reductions, one
        INIT_THREADS block per output tile of every batch (the tile's reductions meet in it)."""
        g = self.gemms[-1]
        if self.reductions:
            tiles_m = -(-self.resolve(g.m_dim, sizes) // g.tile[0])
            tiles_n = -(-self.resolve(g.n_dim, sizes) // g.tile[1])
            return (max(1, tiles_m * tiles_n * self.batches(sizes)), 1, 1)
        pairs = self.resolve(g.m_dim, sizes) * -(-self.resolve(g.n_dim, sizes) // 2)
        pairs *= self.batches(sizes)
        return (max(1, -(-pairs // self.INIT_THREADS)), 1, 1)

    @property
    def batch(self) -> Dim | None:
        """The batch dimension (a kernel's batched parameters share it), or None."""
        return next((p.batch for p in self.params if p.batch is not None), None)

    def batches(self, sizes: dict[str, int]) -> int:
        """The batch count L (1 for a kernel without a batch dimension)."""
        return 1 if self.batch is None else self.resolve(self.batch, sizes)

    @property
    def narrow_kernel(self) -> str | None:
        """The entry point for arguments the fast path's alignment and size rules refuse."""
        return f"{self.name}_narrow" if self.schedule.entry.narrow else None

    @property
    def finalize_kernel(self) -> str | None:
        """The kernel that combines the CTAs' partials in a fixed order after the main launch."""
        return f"{self.name}_finalize" if self.deterministic else None

    def partial_slots(self, r: ReductionPlan, sizes: dict[str, int]) -> int:
        """CTAs contributing partials to each element of reduction `r`."""
        g = self.gemms[-1]
        tiles_m = -(-self.resolve(self.gemms[0].m_dim, sizes) // g.tile[0])
        tiles_n = -(-self.resolve(g.n_dim, sizes) // g.tile[1])
        return {Axis.ROW: tiles_n, Axis.COL: tiles_m, Axis.ALL: tiles_m * tiles_n}[r.axis]

    def batch_workspace_floats(self, sizes: dict[str, int]) -> int:
        """Floats of workspace one batch uses: the split-K partials, then the deterministic
        mode's slots x length per reduction (with split-K rounded up to an even count, so the
        next batch's partials keep their 8-byte column pairs)."""
        if not self.deterministic:
            return self.split_floats(sizes)
        slots = sum(
            self.partial_slots(r, sizes) * (1 if r.length is None else self.resolve(r.length, sizes))
            for r in self.reductions
        )
        if self.split_kernel is not None:
            slots += slots % 2
        return self.split_floats(sizes) + slots

    STREAM_FLAGS = 8  # stream-K: a flag (int) per consumer warp of each CTA's slot

    def workspace_floats(self, sizes: dict[str, int], persistent_ctas: int | None = None) -> int:
        """Floats of workspace: every batch's, one after the other; stream-K's, a slot of a
        tile's f32 sums per CTA of the grid, then STREAM_FLAGS flags per CTA (they start zero,
        and the kernel leaves them zero)."""
        if self.schedule.scheduler.stream_k:
            g = self.gemms[-1]
            ctas = self.grid(sizes, persistent_ctas)[0]
            return ctas * (g.tile[0] * g.tile[1] + self.STREAM_FLAGS)
        return self.batches(sizes) * self.batch_workspace_floats(sizes)

    INIT_THREADS = 256

    def init_grid(self, sizes: dict[str, int]) -> tuple[int, int, int]:
        """One thread per element of the longest reduction output, in every batch."""
        longest = max(
            (1 if r.length is None else self.resolve(r.length, sizes) for r in self.reductions),
            default=1,
        )
        longest *= self.batches(sizes)
        return (max(1, -(-longest // self.INIT_THREADS)), 1, 1)

    def resolve(self, dim: Dim, sizes: dict[str, int]) -> int:
        return dim if isinstance(dim, int) else sizes[dim]

    @property
    def column_blocks(self) -> int:
        """A ping-pong chain whose last tile covers only part of its N (N1 = 640 on 384-column
        tiles): its tiles_n column blocks, each CTA keeping one block of the last B resident
        (blockIdx.x % tiles_n). The tiles are walked column block fastest and the persistent
        grid is a multiple of tiles_n, so every tile a CTA takes is in its block. 1 otherwise."""
        g = self.gemms[-1] if self.gemms else None
        if (g is None or len(self.gemms) < 2 or not self.schedule.scheduler.pingpong
                or not isinstance(g.n_dim, int)):
            return 1
        return -(-g.n_dim // g.tile[1])

    def grid(self, sizes: dict[str, int],
             persistent_ctas: int | None = None) -> tuple[int, int, int]:
        """One CTA per output tile, on a 1-D grid (the kernel rasterizes it in groups); a
        persistent kernel runs min(tiles, persistent_ctas) CTAs (the runtime fills it: SM count
        x resident CTAs per SM), each looping over tiles, or one CTA per tile when not given.
        With a batch dimension the tiles of batch b follow those of batch b - 1 on the same
        axis: L x the tiles of one batch."""
        g = self.gemms[-1]
        m = self.resolve(self.gemms[0].m_dim, sizes)
        n = self.resolve(g.n_dim, sizes)
        tiles_m = -(-m // g.tile[0])
        tiles_n = -(-n // g.tile[1])
        tiles = tiles_m * tiles_n * self.batches(sizes)
        scheduler = self.schedule.scheduler
        tiles *= scheduler.split_k  # split-K: a CTA (or a unit of the walk) per part
        if scheduler.stream_k:  # at most one CTA per k tile of the walk (one per tile, K = 0)
            tiles *= max(1, -(-self.resolve(self.gemms[0].k_dim, sizes) // g.tile[2]))
        if scheduler.persistent and persistent_ctas:
            blocks = self.column_blocks  # whole column blocks: a multiple of tiles_n
            tiles = min(tiles, max(persistent_ctas // blocks, 1) * blocks)
        return (tiles, 1, 1)

    def cluster_grid(self, sizes: dict[str, int],
                     clusters: int | None = None) -> tuple[int, int, int]:
        """The fast entry point's grid under `cluster MxN` (the narrow one takes `grid`): the
        CTAs of min(cluster tiles, `clusters`) clusters, where a cluster tile is M x N output
        tiles (of every batch; under split-K, each of its parts) and `clusters` the clusters
        resident at once (the runtime's occupancy query), or one cluster per cluster tile when
        not given."""
        cm, cn = self.schedule.scheduler.cluster.shape
        g = self.gemms[-1]
        tiles_m = -(-self.resolve(self.gemms[0].m_dim, sizes) // g.tile[0])
        tiles_n = -(-self.resolve(g.n_dim, sizes) // g.tile[1])
        count = (-(-tiles_m // cm) * -(-tiles_n // cn) * self.batches(sizes)
                 * self.schedule.scheduler.split_k)
        if clusters:
            count = min(count, clusters)
        return (count * cm * cn, 1, 1)


def is_program_plan(plan) -> bool:
    """A tile program's plan (LoopPlan, RowsPlan, LoopDagPlan: kgen/plan/program.py and
    loop_dag.py), not a KernelPlan; told apart without importing the tile programs' modules,
    which a gemm's compile never loads."""
    return not isinstance(plan, KernelPlan)
