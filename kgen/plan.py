"""The lowered plan: every number concrete, ready for emission and launch.

The lowering passes (`kgen.lower`) build it from a verified `ir.Kernel`; the emitters render it
and the runtime launches from it. Nothing here refers to Jinja or to the GPU.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from . import ir
from .enums import Axis, Dim, DType, Layout, Op, ParamKind, ReduceOp, Role
from .errors import SourceLoc


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
    dtype: ir.DType
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
    dtype: ir.DType | None = None  # element type of its typed accessor
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

    @property
    def is_output(self) -> bool:
        return self.role is Role.OUT


# ---------------------------------------------------------------------------------------------
# The kernel's parameter block (the ABI shared by the emitted .cu and the runtime)


class FieldKind(enum.Enum):
    POINTER = "pointer"  # device pointer to a tensor or vector parameter
    SIZE = "size"  # a runtime extent such as M (int32)
    LEADING_DIM = "ld"  # elements between consecutive rows (row) or columns (col), int64
    SCALAR = "scalar"  # a scalar parameter, in the compute type
    WORKSPACE = "workspace"  # device scratch the caller provides (deterministic reductions)


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
    dtype: ir.DType
    k_major: bool  # True when K is the contiguous dimension (A row, B col)
    smem: SmemTile
    copies_per_thread: int  # 16-byte cp.async per thread per stage
    ldmatrix_trans: bool
    # Offsets proved for every thread (element units, within a stage): copy i lands at
    # (copy_base ^ X) + Y and fragment (kk, f) is read at (frag_base ^ X) + Y.
    copy_steps: tuple[tuple[int, int], ...]
    copy_row_step: int  # tile rows between a thread's consecutive copies
    frag_steps: tuple[tuple[tuple[int, int], ...], ...]  # [kk][f]


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
    """The epilogue's only effect is one row-major 16-bit store: a kernel can then gather four
    pairs per thread into one 16-byte store (wide stores, TMA stores)."""

    param: str
    dtype: DType


@dataclass(frozen=True, slots=True)
class EpilogueDag:
    """The epilogue of one gemm, after sharing: a node used twice appears once."""

    nodes: tuple[EpilogueNode, ...]  # in topological order
    effects: tuple[Effect, ...]  # in the order the epilogue states them
    reductions: tuple[ReductionPlan, ...] = ()
    packed_store: PackedStore | None = None

    @property
    def value_count(self) -> int:
        """Distinct values loaded or computed per element (after sharing)."""
        return sum(n.holds_value for n in self.nodes)


@dataclass(frozen=True, slots=True)
class ChainPlan:
    """A chained gemm's A operand: the epilogue output of the gemm before it, kept on chip.

    REGISTERS: each warp turns its own f32 accumulators into its A fragments (the m16n8
    accumulator layout of n8 tiles 2kk and 2kk + 1 is the m16n8k16 A layout of k step kk), so
    every warp must own whole rows. SMEM: the source's epilogue writes the tile once (the A
    operand's `smem`, K-major, swizzled) and this gemm reads it back with ldmatrix."""

    source: str  # the gemm whose epilogue output is A
    residency: ir.Residency
    dtype: ir.DType  # the operand dtype the intermediate is rounded to, once
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
    m_dim: ir.Dim
    n_dim: ir.Dim
    k_dim: ir.Dim
    epilogue: EpilogueDag
    chain: ChainPlan | None = None  # set when A is an earlier gemm's output
    # The source's names of A and B (a parameter, or an earlier gemm for a chained A), for the
    # emitted file's comments
    a_name: str = ""
    b_name: str = ""
    # Threads that copy A when not the gemm's own (schedule pingpong: the producer warps); 0
    producer_threads: int = 0


@dataclass(frozen=True, slots=True)
class Alignment:
    """What a tensor or vector argument needs: its base pointer aligned to `ptr_bytes` and,
    for 2-D tensors, its leading dimension a multiple of `ld_multiple` elements."""

    param: str
    ptr_bytes: int
    ld_multiple: int
    reason: str


@dataclass(frozen=True, slots=True)
class DimRule:
    """A runtime size must be a multiple of `multiple`."""

    dim: str
    multiple: int
    reason: str


# ---------------------------------------------------------------------------------------------
# The schedule: how the kernel runs, decided once by kgen/lower/select.py among the schedules
# its target lists as legal (kgen/targets/<arch>/schedules.py); the emitters only read it


class KernelKind(enum.Enum):
    """How CTAs map to output tiles."""

    TILED = "tiled"  # one CTA per tile
    PERSISTENT = "persistent"  # min(tiles, SMs x CTAs per SM) CTAs loop over the tiles
    PINGPONG = "pingpong"  # persistent: producer warps fill a ring, two consumer warpgroups
    # take alternate tiles


class Mma(enum.Enum):
    """The MMA instruction a gemm's mainloop issues."""

    MMA_SYNC = "mma.sync m16n8k16"  # per warp, A and B fragments through ldmatrix
    WGMMA_SS = "wgmma, A and B from shared memory"  # per warpgroup, through descriptors
    WGMMA_RS = "wgmma, A from registers"  # A: the previous gemm's output, in registers


class LoadPath(enum.Enum):
    """How an operand reaches the MMA."""

    CP_ASYNC = "cp.async stages"  # every thread copies `stages` k tiles per tile, drained per tile
    CP_ASYNC_PREFETCH = "cp.async stages, next tile's prefetched"  # persistent, during the last
    CP_ASYNC_RING = "cp.async ring across tiles"  # never drained between tiles; with a producer
    # warp role, the producers alone fill it, each slot guarded by a full and an empty mbarrier
    RESIDENT = "resident"  # the whole operand, loaded once per CTA
    CHAINED_REGISTERS = "previous gemm, registers"  # the source's accumulators, repacked
    CHAINED_SMEM = "previous gemm, shared memory"  # written by the source's epilogue
    TMA = "TMA"  # room for the copy engine's loads; no target plans them yet
    TMA_MULTICAST = "TMA multicast"  # the same, shared across a cluster


class CachePolicy(enum.Enum):
    """The L2 hint on an operand's copies."""

    NORMAL = "normal"
    EVICT_FIRST = "evict first"  # read once: let L2 drop it before data that is reused


class StorePath(enum.Enum):
    """How a gemm's epilogue output leaves."""

    PAIRS = "pair stores"  # each thread stores its column pairs
    WIDE = "16-byte stores"  # a quad's four pairs transposed by shuffles, one 16-byte chunk each
    TMA = "TMA, staged in smem"  # a staging buffer per warpgroup, cp.async.bulk.tensor stores
    FEED = "feeds the next gemm"  # a chain's intermediate, kept on chip


@dataclass(frozen=True, slots=True)
class WarpRole:
    """`groups` groups of `warps` warps that run the same code; `registers` is the per-thread
    register budget set with setmaxnreg (None: the compiler's, for the whole CTA)."""

    name: str
    warps: int
    groups: int = 1
    registers: int | None = None

    @property
    def threads(self) -> int:
        return self.warps * self.groups * 32


@dataclass(frozen=True, slots=True)
class Raster:
    """CTA rasterization: consecutive CTAs walk `group_m` tile rows before moving along N, so
    that the B tiles they stream stay in L2."""

    group_m: int
    along: str = "M"


@dataclass(frozen=True, slots=True)
class OperandSchedule:
    load: LoadPath
    cache: CachePolicy = CachePolicy.NORMAL
    why: str = ""


@dataclass(frozen=True, slots=True)
class GemmSchedule:
    name: str
    mma: Mma
    a: OperandSchedule
    b: OperandSchedule
    stages: int  # pipeline depth of the streamed operand (the ring's slots for CP_ASYNC_RING)
    store: StorePath
    why_mma: str = ""  # the rule that chose the MMA (why wgmma, or which wgmma rule failed)
    why_store: str = ""


@dataclass(frozen=True, slots=True)
class TmaOutput:
    """The output the copy engine stores: the kernel's second parameter is its tensor map."""

    param: str
    dtype: DType


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: KernelKind
    warp_roles: tuple[WarpRole, ...]
    raster: Raster
    min_blocks_per_sm: int
    gemms: tuple[GemmSchedule, ...]
    tma_output: TmaOutput | None = None
    why_kind: str = ""
    # the schedules the target also listed, each with why it was not taken: (kind, reason)
    rejected: tuple[tuple[KernelKind, str], ...] = ()

    @property
    def threads(self) -> int:
        return sum(r.threads for r in self.warp_roles)

    def role(self, name: str) -> WarpRole | None:
        return next((r for r in self.warp_roles if r.name == name), None)

    def gemm(self, name: str) -> GemmSchedule:
        return next(g for g in self.gemms if g.name == name)

    @property
    def persistent(self) -> bool:
        return self.kind is not KernelKind.TILED

    @property
    def resident(self) -> bool:
        return any(g.b.load is LoadPath.RESIDENT for g in self.gemms)

    @property
    def wide_stores(self) -> bool:
        """The output leaves in 16-byte chunks, from registers (WIDE) or through the copy
        engine (TMA, which needs what WIDE needs): either way its rows are 16-byte aligned."""
        return bool(self.gemms) and self.gemms[-1].store in (StorePath.WIDE, StorePath.TMA)

    @property
    def wgmma(self) -> bool:
        return bool(self.gemms) and self.gemms[0].mma is Mma.WGMMA_SS

    @property
    def wgmma_chain(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gemms if g.mma is Mma.WGMMA_RS)

    # Which helpers the .cu carries: only those the kernel calls
    @property
    def quad_stores(self) -> bool:
        """The quad transpose of 16-byte stores from registers."""
        return bool(self.gemms) and self.gemms[-1].store is StorePath.WIDE

    @property
    def mma_sync(self) -> bool:
        """mma_step: some gemm still multiplies with mma.sync."""
        return any(g.mma is Mma.MMA_SYNC for g in self.gemms)

    def describe(self) -> list[tuple[str, str, str]]:
        """(label, value, why) rows for `kgen inspect`."""
        rows = [("kind", self.kind.value, self.why_kind)]
        for kind, reason in self.rejected:
            rows.append((f"not {kind.value}", "refused", reason))
        rows.append(("threads", str(self.threads), " + ".join(
            f"{r.name} {r.groups}x{r.warps} warps" if r.groups > 1 else f"{r.name} {r.warps} warps"
            for r in self.warp_roles)))
        for r in self.warp_roles:
            if r.registers is not None:
                rows.append((f"{r.name} registers", str(r.registers), "setmaxnreg"))
        rows.append(("raster", f"group_m {self.raster.group_m} along {self.raster.along}",
                     "consecutive CTAs share the B tiles they stream through L2"))
        rows.append(("min blocks per SM", str(self.min_blocks_per_sm), "__launch_bounds__"))
        for g in self.gemms:
            rows.append((f"{g.name} mma", g.mma.value, g.why_mma))
            for which, op in (("A", g.a), ("B", g.b)):
                cache = "" if op.cache is CachePolicy.NORMAL else f", L2 {op.cache.value}"
                rows.append((f"{g.name} {which}", op.load.value + cache, op.why))
            rows.append((f"{g.name} stages", str(g.stages), ""))
            rows.append((f"{g.name} store", g.store.value, g.why_store))
        if self.tma_output is not None:
            out = self.tma_output
            rows.append(("tensor map", f"{out.param} ({out.dtype.dsl_name})",
                         "the kernel's second parameter, encoded by the launcher"))
        return rows


@dataclass(frozen=True, slots=True)
class KernelPlan:
    kernel: ir.Kernel
    arch: ir.Arch
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
    # The kernel's declaration, for an error found past the lowering (e.g. nothing to emit);
    # kgen.lower fills it
    loc: SourceLoc | None = None

    # -- compat, removed once emitters read plan.schedule: the old flags, read-only ----------

    @property
    def threads(self) -> int:
        return self.schedule.threads

    @property
    def group_m(self) -> int:
        return self.schedule.raster.group_m

    @property
    def min_blocks_per_sm(self) -> int:
        return self.schedule.min_blocks_per_sm

    @property
    def persistent(self) -> bool:
        return self.schedule.persistent

    @property
    def resident(self) -> bool:
        return self.schedule.resident

    @property
    def wide_stores(self) -> bool:
        return self.schedule.wide_stores

    @property
    def wgmma(self) -> bool:
        return self.schedule.wgmma

    @property
    def wgmma_chain(self) -> tuple[str, ...]:
        return self.schedule.wgmma_chain

    @property
    def pingpong(self) -> bool:
        return self.schedule.kind is KernelKind.PINGPONG

    @property
    def tma_store(self) -> bool:
        return self.schedule.tma_output is not None

    # -- end of compat -------------------------------------------------------------------------

    @property
    def name(self) -> str:
        return self.kernel.name

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

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
    def finalize_kernel(self) -> str | None:
        """The kernel that combines the CTAs' partials in a fixed order after the main launch."""
        return f"{self.name}_finalize" if self.deterministic else None

    def partial_slots(self, r: ReductionPlan, sizes: dict[str, int]) -> int:
        """CTAs contributing partials to each element of reduction `r`."""
        g = self.gemms[-1]
        tiles_m = -(-self.resolve(self.gemms[0].m_dim, sizes) // g.tile[0])
        tiles_n = -(-self.resolve(g.n_dim, sizes) // g.tile[1])
        return {ir.Axis.ROW: tiles_n, ir.Axis.COL: tiles_m, ir.Axis.ALL: tiles_m * tiles_n}[r.axis]

    def workspace_floats(self, sizes: dict[str, int]) -> int:
        """Floats of workspace the deterministic mode needs: slots x length per reduction."""
        if not self.deterministic:
            return 0
        return sum(
            self.partial_slots(r, sizes) * (1 if r.length is None else self.resolve(r.length, sizes))
            for r in self.reductions
        )

    INIT_THREADS = 256

    def init_grid(self, sizes: dict[str, int]) -> tuple[int, int, int]:
        longest = max(
            (1 if r.length is None else self.resolve(r.length, sizes) for r in self.reductions),
            default=1,
        )
        return (max(1, -(-longest // self.INIT_THREADS)), 1, 1)

    def resolve(self, dim: ir.Dim, sizes: dict[str, int]) -> int:
        return dim if isinstance(dim, int) else sizes[dim]

    def grid(self, sizes: dict[str, int],
             persistent_ctas: int | None = None) -> tuple[int, int, int]:
        """One CTA per output tile, on a 1-D grid (the kernel rasterizes it in groups); a
        persistent kernel runs min(tiles, persistent_ctas) CTAs (the runtime fills it: SM count
        x resident CTAs per SM), each looping over tiles, or one CTA per tile when not given."""
        g = self.gemms[-1]
        m = self.resolve(self.gemms[0].m_dim, sizes)
        n = self.resolve(g.n_dim, sizes)
        tiles_m = -(-m // g.tile[0])
        tiles_n = -(-n // g.tile[1])
        tiles = tiles_m * tiles_n
        if self.persistent and persistent_ctas:
            tiles = min(tiles, persistent_ctas)
        return (tiles, 1, 1)
