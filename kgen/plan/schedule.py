"""The plan's Schedule: how the kernel runs (its kind, warp roles, rasterization, and per gemm
the MMA atom, each operand's load path and L2 policy, the pipeline depth, the store path),
chosen once by kgen/lower/select.py among the target's legal schedules. Re-exported by
kgen.plan."""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..enums import DType, Dim

# ---------------------------------------------------------------------------------------------
# The schedule: how the kernel runs, decided once by kgen/lower/select.py among the schedules
# its target lists as legal (kgen/targets/<arch>/schedules.py); the emitters only read it


class KernelKind(enum.Enum):
    """How CTAs map to output tiles."""

    TILED = "tiled"  # one CTA per tile
    PERSISTENT = "persistent"  # min(tiles, SMs x CTAs per SM) CTAs loop over the tiles
    PINGPONG = "pingpong"  # persistent: producer warps fill a ring, two consumer warpgroups
    # take alternate tiles
    COOPERATIVE = "cooperative"  # persistent: a producer warpgroup fills a ring by TMA, two
    # consumer warpgroups share each tile (64 rows each)


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
    TMA = "TMA ring"  # the copy engine fills a ring of stages, each slot guarded by a full and
    # an empty mbarrier (the kernel's tensor maps)
    TMA_MULTICAST = "TMA multicast"  # the same, shared across a cluster: each CTA loads a
    # part of the tile and the copy engine writes it into every CTA of the cluster


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
    # TMA loads for wgmma: the operand's stage is MN-major (M or N contiguous: a column-major A,
    # a row-major B), boxes of 64 M (or N) elements by the k tile, which wgmma reads transposed
    # (imm-trans-a / imm-trans-b); False: K-major, 128-byte rows along K
    mn_major: bool = False


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
    # An epilogue input shaped like the output (C) that the copy engine loads into the
    # output's staging at each tile's start, where the epilogue reads it and writes the output
    # over it (the seed's ReuseSmemC); None: the epilogue reads every input from global memory
    staged_input: str | None = None
    why_staged_input: str = ""
    # When the copy engine's load of the staged input issues: at the tile's start (False), or
    # halfway through its mainloop (True), by when the previous tile's output has left the
    # staging; the load first waits for that (cp.async.bulk.wait_group.read)
    staged_input_late: bool = False
    # The epilogue's row and column vectors (bias[col], scale[row]) that the consumers stage
    # in shared memory per tile, in buffer staged_vector_buffer(name, param): each thread
    # loads its elements of the tile's slice at the tile's start, holds them in registers
    # through the mainloop and writes them to its consumer's buffer before the epilogue, which
    # reads them there. (): the epilogue reads every vector from global memory, each read
    # waiting for its round trip
    staged_vectors: tuple[str, ...] = ()
    why_staged_vectors: str = ""
    # The output staging of a TMA store, per consumer (the seed's EpilogueTile and StagesD):
    # 0 holds the consumer's whole tile, every 64x64 box at once (a staged input needs that);
    # n > 0 holds n boxes, and the epilogue runs box by box, an EpilogueTile of 64x64, each box
    # written into buffer b % n once the copy engine has read the box stored from it before,
    # and stored as soon as it is written. Smaller staging leaves room for a deeper ring.
    stages_d: int = 0
    why_stages_d: str = ""
    # The fast entry point's epilogue walks each row of accumulator fragments in this many
    # groups of 64 columns (8 fragments, one staging box), in a rolled loop: each group's
    # fragments are copied out of acc by constant indices, so the EVT's code is emitted once
    # per group's width, not once per fragment of the tile. 1: one unrolled walk. For an EVT
    # whose inlined code is long (erff, tanhf): NVRTC's time grows with the code it inlines.
    epilogue_groups: int = 1
    why_epilogue_groups: str = ""
    # The last gemm of a ping-pong chain in this many passes over its tile's columns: each
    # pass multiplies the columns' share of B (resident) by the same A fragments, runs the
    # epilogue and stages that share for the copy engine. Each consumer thread then holds one
    # pass's accumulators, and the staging one pass's columns. 1: the whole tile at once.
    column_passes: int = 1
    why_column_passes: str = ""
    # Column passes in flight: 2 issues each pass's wgmma group, into the other of two sets of
    # accumulators, before the pass before it runs its epilogue, so the tensor cores multiply
    # one pass while the warpgroup stores the last; 1: each pass's group completes before its
    # epilogue, one set of accumulators
    passes_in_flight: int = 1
    why_passes_in_flight: str = ""
    # The first gemm of a ping-pong chain: wgmma groups in flight in its mainloop. 1: each k
    # tile's group completes before the next is issued, and its slot goes back to the producer
    # at once; 2: the next k tile's group is issued first, each slot going back one k tile
    # later, and the other consumer's turn comes once the last group is issued
    wgmma_in_flight: int = 1
    why_wgmma_in_flight: str = ""
    # A chain's gemm that feeds the next one, its tile covering all of its N in every tile: the
    # column vectors of its epilogue (bias[col]) that each consumer thread loads into registers
    # at the top of every tile, before the mainloop, and passes to the epilogue. The columns a
    # thread reads are the same in every tile, and the loads land while the mainloop runs.
    # (): the epilogue reads them from global memory after the last wgmma group has drained,
    # each read waiting for its round trip.
    early_vectors: tuple[str, ...] = ()
    why_early_vectors: str = ""


def staged_vector_buffer(gemm: str, param: str) -> str:
    """The shared-memory buffer of a staged epilogue vector (GemmSchedule.staged_vectors)."""
    return f"{gemm}_vec_{param}"


@dataclass(frozen=True, slots=True)
class TensorMap:
    """A matrix the copy engine reads or writes. The kernel's second parameter holds one
    CUtensorMap per map of the schedule, in order, each encoded by the launcher from the
    parameter's address and leading dimension: `rows` x `cols` (contiguous) elements, copied in
    boxes of `box` = (cols, rows) with the 128-byte swizzle. Elements past the matrix are
    zeros on loads and clipped on stores."""

    param: str
    dtype: DType
    rows: Dim
    cols: Dim
    box: tuple[int, int]
    store: bool = False
    why: str = ""
    # How much an L2 miss of this map's loads pulls in from memory: CUtensorMapL2promotion's
    # suffix. The map's builder sets it (kgen/targets/sm90); stores promote nothing.
    load_promotion: str = "L2_256B"

    @property
    def l2_promotion(self) -> str:
        return "NONE" if self.store else self.load_promotion


@dataclass(frozen=True, slots=True)
class LineChoice:
    """A schedule line the source left out and kgen filled (kgen/lower/builder.py): `line` as
    `<gemm> tile` or `schedule`, its value as DSL text, and why."""

    line: str
    value: str
    why: str = ""


@dataclass(frozen=True, slots=True)
class Schedule:
    kind: KernelKind
    warp_roles: tuple[WarpRole, ...]
    raster: Raster
    min_blocks_per_sm: int
    gemms: tuple[GemmSchedule, ...]
    tensor_maps: tuple[TensorMap, ...] = ()
    why_kind: str = ""
    # A second entry point, `<kernel>_narrow`, for the arguments the alignment and size rules
    # of the fast one refuse (any size, any leading dimension): element copies into the same
    # shared-memory stages, element accesses in the epilogue. Each launcher picks it at launch.
    narrow: bool = False
    # `split S` (one-gemm tiled and cooperative kernels): S CTAs (cooperative: S units of the
    # persistent walk) per output tile, each over a contiguous part of the k tiles, writing f32
    # partials to the workspace; a second kernel sums them in order (bit-identical from run to
    # run) and runs the epilogue once
    split_k: int = 1
    # `split stream` (the cooperative kernel): stream-K. The persistent CTAs share the k tiles of
    # the tiles past whole waves (and one wave more) equally, the others running whole, so such
    # a tile may be begun by one CTA and ended by others; each
    # later part leaves its f32 sums in the CTA's workspace slot and sets a flag, and the CTA
    # that began the tile waits for the flags, adds the parts in order (bit-identical from run
    # to run) and runs the epilogue once
    stream_k: bool = False
    # the schedules the target also listed, each with why it was not taken: (kind, reason)
    rejected: tuple[tuple[KernelKind, str], ...] = ()
    # the schedule lines the source left out, as kgen filled them, and the configurations the
    # builder tried before the one it took, each with its refusal: (label, reason)
    chosen: tuple[LineChoice, ...] = ()
    untaken: tuple[tuple[str, str], ...] = ()
    # `cluster MxN` (the warp-specialized kernel): M x N CTAs of a thread-block cluster on
    # adjacent output tiles, the operand they share multicast (Schedule.multicast)
    cluster: tuple[int, int] = (1, 1)
    why_cluster: str = ""

    @property
    def cluster_size(self) -> int:
        return self.cluster[0] * self.cluster[1]

    @property
    def multicast(self) -> str | None:
        """The first gemm's operand the cluster's CTAs share ("a" or "b"), or None."""
        if not self.gemms:
            return None
        g = self.gemms[0]
        return next((which for which, op in (("a", g.a), ("b", g.b))
                     if op.load is LoadPath.TMA_MULTICAST), None)

    @property
    def threads(self) -> int:
        return sum(r.threads for r in self.warp_roles)

    def role(self, name: str) -> WarpRole | None:
        return next((r for r in self.warp_roles if r.name == name), None)

    def gemm(self, name: str) -> GemmSchedule:
        return next(g for g in self.gemms if g.name == name)

    @property
    def tma_output(self) -> TensorMap | None:
        """The output the copy engine stores (its tensor map is among tensor_maps)."""
        return next((m for m in self.tensor_maps if m.store), None)

    @property
    def tma_loads(self) -> bool:
        """The copy engine fills the first gemm's ring (A and B by tensor maps)."""
        return bool(self.gemms) and self.gemms[0].a.load in (LoadPath.TMA,
                                                              LoadPath.TMA_MULTICAST)

    @property
    def consumer_order(self) -> bool:
        """schedule pingpong on a chain: the consumer warpgroups take turns at the first gemm's
        mainloop, each waiting until the other has issued its last (two mbarriers, after the
        ring's). A consumer then never waits on a slot whose previous fill may not have landed
        (an mbarrier's phase parity tells only two rounds apart), for any ring depth. Without
        turns (the chain before) the ring's safety rested on timing: at K0 = 256 a ring of
        k tiles + 1 slots crashed on an H200 (bench/RESULTS.md)."""
        return self.pingpong and len(self.gemms) > 1

    @property
    def chain_ring_b(self) -> bool:
        """A ping-pong chain whose first gemm's B streams through the ring beside A (the
        producer's copy engine loads both), the later gemms' B resident."""
        return (self.pingpong and len(self.gemms) > 1
                and self.gemms[0].b.load is LoadPath.TMA)

    @property
    def staged_inputs(self) -> tuple[str, ...]:
        """The epilogue inputs the copy engine loads into the output's staging."""
        return tuple(g.staged_input for g in self.gemms if g.staged_input is not None)

    @property
    def persistent(self) -> bool:
        return self.kind is not KernelKind.TILED

    @property
    def pingpong(self) -> bool:
        """Producer warps fill the ring while two consumer warpgroups take alternate tiles."""
        return self.kind is KernelKind.PINGPONG

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
        rows = [(f"line {c.line}", c.value, f"chosen by kgen: {c.why}") for c in self.chosen]
        for label, reason in self.untaken:
            rows.append(("not chosen", label, reason))
        rows.append(("kind", self.kind.value, self.why_kind))
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
        if self.cluster_size > 1 or self.why_cluster:
            rows.append(("cluster", f"{self.cluster[0]}x{self.cluster[1]}", self.why_cluster))
        for g in self.gemms:
            rows.append((f"{g.name} mma", g.mma.value, g.why_mma))
            for which, op in (("A", g.a), ("B", g.b)):
                cache = "" if op.cache is CachePolicy.NORMAL else f", L2 {op.cache.value}"
                major = ("" if op.load is not LoadPath.TMA
                         else ", MN-major" if op.mn_major else ", K-major")
                rows.append((f"{g.name} {which}", op.load.value + major + cache, op.why))
            rows.append((f"{g.name} stages", str(g.stages), ""))
            rows.append((f"{g.name} store", g.store.value, g.why_store))
            if g.why_staged_input:
                when = (", issued halfway through the tile's mainloop" if g.staged_input_late
                        else "")
                rows.append((f"{g.name} epilogue input", g.staged_input or "from global memory",
                             g.why_staged_input + when))
            if g.why_stages_d:
                rows.append((f"{g.name} epilogue tile",
                             f"64x64, {g.stages_d} staging box{'es' * (g.stages_d > 1)} per "
                             "consumer" if g.stages_d
                             else "the consumer's whole tile", g.why_stages_d))
            if g.column_passes > 1:
                rows.append((f"{g.name} column passes", str(g.column_passes),
                             g.why_column_passes))
            if g.why_passes_in_flight:
                rows.append((f"{g.name} column passes in flight", str(g.passes_in_flight),
                             g.why_passes_in_flight))
            if g.why_wgmma_in_flight:
                rows.append((f"{g.name} wgmma groups in flight", str(g.wgmma_in_flight),
                             g.why_wgmma_in_flight))
            if g.why_early_vectors:
                rows.append((f"{g.name} epilogue vectors",
                             ", ".join(g.early_vectors) + " in registers, loaded before the "
                             "mainloop" if g.early_vectors else "from global memory",
                             g.why_early_vectors))
            if g.why_epilogue_groups:
                rows.append((f"{g.name} epilogue groups",
                             f"{g.epilogue_groups} of 64 columns, rolled" if g.epilogue_groups > 1
                             else "one unrolled walk", g.why_epilogue_groups))
            if g.why_staged_vectors:
                rows.append((f"{g.name} epilogue vectors",
                             ", ".join(g.staged_vectors) or "from global memory",
                             g.why_staged_vectors))
        if self.consumer_order:
            rows.append(("consumer order", "turns at the first gemm's mainloop",
                         "each consumer warpgroup starts its mainloop once the other has issued "
                         "its last (two mbarriers): no slot is awaited before its previous fill "
                         "has landed, whatever the ring's depth"))
        if self.split_k > 1:
            who = ("units of the persistent walk per output tile" if self.persistent
                   else "CTAs per output tile")
            rows.append(("split-K", f"{self.split_k} {who}",
                         "each sums a contiguous part of the k tiles into the workspace (f32); "
                         "<kernel>_splitk adds the parts in order and runs the epilogue"))
        if self.stream_k:
            rows.append(("stream-K", "every persistent CTA an equal share of the k tiles of "
                         "the tiles past whole waves (and one wave more); the others whole",
                         "a tile's later parts leave f32 sums in their CTA's workspace slot; "
                         "the CTA that began the tile adds them in order and runs the epilogue"))
        if self.narrow:
            rows.append(("narrow variant", "element copies and accesses",
                         "arguments that miss the fast path's alignment rules (odd sizes, "
                         "leading dimensions not 16-byte multiples) run the second entry "
                         "point <kernel>_narrow, chosen at launch"))
        for m in self.tensor_maps:
            what = "store" if m.store else "load"
            rows.append((f"tensor map {m.param}",
                         f"{what}, {m.dtype.dsl_name} {m.rows}x{m.cols}, box "
                         f"{m.box[1]}x{m.box[0]}, 128-byte swizzle",
                         m.why or "encoded by the launcher, passed in the kernel's second "
                         "parameter"))
        return rows
