"""The plan's Schedule: how the kernel runs, as components that each decide one thing and say
why (docs/architecture.md, "The Schedule"): for the kernel, the tile scheduler (kind,
rasterization, split-K, stream-K, cluster), the warp roles and the entry points; per gemm, the
MMA atom, the pipeline, the output's store and staging, the staged epilogue input, where the
epilogue's vectors live, its walk (column passes, epilogue groups) and the overlap of wgmma
groups. Chosen once by kgen/lower/select.py among the target's legal schedules; re-exported by
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
    MMA_SYNC_FP8 = "mma.sync m16n8k32"  # the same for FP8 operands, k32 steps (sm_89)
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


class KSplit(enum.Enum):
    """How an output tile's k tiles are shared (TileScheduler.split_k, stream_k)."""

    WHOLE = "one unit of the walk per tile"
    SPLIT = "split-K: split_k units per tile, each a contiguous part"
    STREAM = "stream-K: the persistent CTAs share the k tiles equally"


class StagingMode(enum.Enum):
    """How a TMA store's output staging holds a consumer's tile (Staging)."""

    WHOLE_TILE = "the consumer's whole tile"  # every 64x64 box written, then all stored
    BOXES = "64x64 boxes, one at a time"  # each box stored as soon as it is written


class VectorHome(enum.Enum):
    """Where the epilogue reads its row and column vectors (bias[col], scale[row]) from."""

    GLOBAL = "from global memory"  # each read waits for its round trip
    STAGED = "staged in shared memory"  # per tile, by the consumers (EpilogueVectors)
    REGISTERS = "in registers, loaded before the mainloop"  # a chain's feeding gemm


Row = tuple[str, str, str]  # (label, value, why): one line of `kgen inspect`'s schedule table


# ---------------------------------------------------------------------------------------------
# The kernel's components


@dataclass(frozen=True, slots=True)
class Raster:
    """CTA rasterization: consecutive CTAs walk `group_m` tile rows before moving along N, so
    that the B tiles they stream stay in L2."""

    group_m: int
    along: str = "M"


@dataclass(frozen=True, slots=True)
class Cluster:
    """`cluster MxN` (the warp-specialized kernel): M x N CTAs of a thread-block cluster on
    adjacent output tiles, the operand they share multicast (Schedule.multicast)."""

    shape: tuple[int, int] = (1, 1)
    why: str = ""

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    def describe(self) -> list[Row]:
        if self.size == 1 and not self.why:
            return []
        return [("cluster", f"{self.shape[0]}x{self.shape[1]}", self.why)]


@dataclass(frozen=True, slots=True)
class TileScheduler:
    """How CTAs map to output tiles: the kernel kind, the rasterization, CTAs per SM, how a
    tile's k tiles are shared (split-K, stream-K) and the cluster; `why`: why this kind."""

    kind: KernelKind
    raster: Raster
    min_blocks_per_sm: int = 1
    # `split S` (one-gemm tiled and cooperative kernels): S CTAs (cooperative: S units of the
    # persistent walk) per output tile, each over a contiguous part of the k tiles; `split
    # stream` (the cooperative kernel): stream-K, a tile begun by one CTA and ended by others.
    # Both leave f32 parts in the workspace, added in order (bit-identical from run to run)
    # before the epilogue runs once (describe says who adds them)
    split_k: int = 1
    stream_k: bool = False
    cluster: Cluster = Cluster()
    why: str = ""

    @property
    def persistent(self) -> bool:
        return self.kind is not KernelKind.TILED

    @property
    def pingpong(self) -> bool:
        """Producer warps fill the ring while two consumer warpgroups take alternate tiles."""
        return self.kind is KernelKind.PINGPONG

    @property
    def k_split(self) -> KSplit:
        return (KSplit.STREAM if self.stream_k else KSplit.SPLIT if self.split_k > 1
                else KSplit.WHOLE)

    def describe(self) -> list[Row]:
        rows = [("kind", self.kind.value, self.why),
                ("raster", f"group_m {self.raster.group_m} along {self.raster.along}",
                 "consecutive CTAs share the B tiles they stream through L2"),
                ("min blocks per SM", str(self.min_blocks_per_sm), "__launch_bounds__")]
        rows += self.cluster.describe()
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
        return rows


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
class WarpRoles:
    """The CTA's warps by role, with their register budgets. The roles follow from the kernel
    kind (TileScheduler.why says why it has them); each row says what its warps do."""

    roles: tuple[WarpRole, ...]

    @property
    def threads(self) -> int:
        return sum(r.threads for r in self.roles)

    def role(self, name: str) -> WarpRole | None:
        return next((r for r in self.roles if r.name == name), None)

    def describe(self) -> list[Row]:
        rows = [("threads", str(self.threads), " + ".join(
            f"{r.name} {r.groups}x{r.warps} warps" if r.groups > 1 else f"{r.name} {r.warps} warps"
            for r in self.roles))]
        rows += [(f"{r.name} registers", str(r.registers), "setmaxnreg")
                 for r in self.roles if r.registers is not None]
        return rows


@dataclass(frozen=True, slots=True)
class EntryPoints:
    """`narrow`: a second entry point, `<kernel>_narrow`, for the arguments the alignment and
    size rules of the fast one refuse (any size, any leading dimension): element copies into the
    same shared-memory stages, element accesses in the epilogue. Each launcher picks it at
    launch."""

    narrow: bool = False
    why: str = ""

    def describe(self) -> list[Row]:
        return [("narrow variant", "element copies and accesses", self.why)] if self.narrow else []


# ---------------------------------------------------------------------------------------------
# A gemm's components


@dataclass(frozen=True, slots=True)
class MmaAtom:
    """The MMA instruction the gemm's mainloop issues; `why`: the rule that chose it (why
    wgmma, or which wgmma rule failed)."""

    instruction: Mma
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        return [(f"{gemm} mma", self.instruction.value, self.why)]


@dataclass(frozen=True, slots=True)
class OperandSchedule:
    """How one operand streams: its load path, L2 policy and (TMA) major-ness, and why."""

    load: LoadPath
    cache: CachePolicy = CachePolicy.NORMAL
    why: str = ""
    # TMA loads for wgmma: the operand's stage is MN-major (M or N contiguous: a column-major A,
    # a row-major B), boxes of 64 M (or N) elements by the k tile, which wgmma reads transposed
    # (imm-trans-a / imm-trans-b); False: K-major, 128-byte rows along K
    mn_major: bool = False

    def text(self) -> str:
        cache = "" if self.cache is CachePolicy.NORMAL else f", L2 {self.cache.value}"
        major = ("" if self.load is not LoadPath.TMA
                 else ", MN-major" if self.mn_major else ", K-major")
        return self.load.value + major + cache


@dataclass(frozen=True, slots=True)
class Pipeline:
    """Which operands stream and how (each with its why), and the pipeline depth of the
    streamed operand: its stages (the ring's slots for CP_ASYNC_RING and TMA); `paired` and
    its `why`: kgen/targets/sm90/chain_pairs.py."""

    a: OperandSchedule
    b: OperandSchedule
    stages: int
    paired: bool = False
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        pairs = [(f"{gemm} tile pairs", "B's k tiles shared", self.why)] if self.paired else []
        return [(f"{gemm} A", self.a.text(), self.a.why), (f"{gemm} B", self.b.text(), self.b.why),
                (f"{gemm} stages", str(self.stages), "")] + pairs


@dataclass(frozen=True, slots=True)
class Output:
    """How the gemm's epilogue output leaves (StorePath), and why."""

    path: StorePath
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        return [(f"{gemm} store", self.path.value, self.why)]


@dataclass(frozen=True, slots=True)
class StagedInput:
    """An epilogue input shaped like the output (C) that the copy engine loads into the
    output's staging at each tile's start, where the epilogue reads it and writes the output
    over it (the seed's ReuseSmemC); `param` None: the epilogue reads every input from global
    memory. `late`: the load issues halfway through the tile's mainloop, by when the previous
    tile's output has left the staging (the load first waits for that,
    cp.async.bulk.wait_group.read), not at the tile's start."""

    param: str | None = None
    late: bool = False
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        if not self.why:
            return []
        when = ", issued halfway through the tile's mainloop" if self.late else ""
        return [(f"{gemm} epilogue input", self.param or "from global memory", self.why + when)]


@dataclass(frozen=True, slots=True)
class Staging:
    """The output staging of a TMA store, per consumer (the seed's EpilogueTile and StagesD):
    `boxes` 0 holds the consumer's whole tile, every 64x64 box at once (a staged input needs
    that); n > 0 holds n boxes, and the epilogue runs box by box, an EpilogueTile of 64x64, each
    box written into buffer b % n once the copy engine has read the box stored from it before,
    and stored as soon as it is written. Smaller staging leaves room for a deeper ring."""

    boxes: int = 0
    why: str = ""

    @property
    def mode(self) -> StagingMode:
        return StagingMode.BOXES if self.boxes else StagingMode.WHOLE_TILE

    def describe(self, gemm: str) -> list[Row]:
        if not self.why:
            return []
        value = (f"64x64, {self.boxes} staging box{'es' * (self.boxes > 1)} per consumer"
                 if self.boxes else "the consumer's whole tile")
        return [(f"{gemm} epilogue tile", value, self.why)]


@dataclass(frozen=True, slots=True)
class ColumnPasses:
    """The last gemm of a ping-pong chain in `count` passes over its tile's columns: each pass
    multiplies the columns' share of B (resident) by the same A fragments, runs the epilogue
    and stages that share for the copy engine. Each consumer thread then holds one pass's
    accumulators, and the staging one pass's columns. 1: the whole tile at once."""

    count: int = 1
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        return [(f"{gemm} column passes", str(self.count), self.why)] if self.count > 1 else []


@dataclass(frozen=True, slots=True)
class Overlap:
    """What a consumer warpgroup keeps in flight while it works on something else.
    `wgmma_groups` (the first gemm of a ping-pong chain): 1, each k tile's group completes
    before the next is issued, and its slot goes back to the producer at once; 2, the next k
    tile's group is issued first, each slot going back one k tile later, and the other
    consumer's turn comes once the last group is issued. `passes` (the last gemm's column
    passes): 2 issues each pass's wgmma group, into the other of two sets of accumulators,
    before the pass before it runs its epilogue, so the tensor cores multiply one pass while
    the warpgroup stores the last; 1, each pass's group completes before its epilogue."""

    wgmma_groups: int = 1
    passes: int = 1
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        rows = []
        if self.passes > 1:
            rows.append((f"{gemm} column passes in flight", str(self.passes), self.why))
        if self.wgmma_groups > 1:
            rows.append((f"{gemm} wgmma groups in flight", str(self.wgmma_groups), self.why))
        return rows


@dataclass(frozen=True, slots=True)
class EpilogueGroups:
    """The fast entry point's epilogue walks each row of accumulator fragments in `count`
    groups of 64 columns (8 fragments, one staging box), in a rolled loop: each group's
    fragments are copied out of acc by constant indices, so the EVT's code is emitted once per
    group's width, not once per fragment of the tile. 1: one unrolled walk. For an EVT whose
    inlined code is long (erff, tanhf): NVRTC's time grows with the code it inlines."""

    count: int = 1
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        if not self.why:
            return []
        value = (f"{self.count} of 64 columns, rolled" if self.count > 1
                 else "one unrolled walk")
        return [(f"{gemm} epilogue groups", value, self.why)]


@dataclass(frozen=True, slots=True)
class EpilogueMath:
    """How the epilogue spells its transcendental functions. `intrinsics` False: as written
    (expf, IEEE division, erff); True: exp, sigmoid and silu on the hardware's ex2 and
    reciprocal (__expf, __fdividef: within 2 units in the last place of f32 plus __expf's 2^-21
    relative error per unit of |x|), and gelu's Phi(x) as 2^-q(|x|), q a fitted polynomial, one
    branch where erff has two (3.1e-6 relative error at most for |x| <= 6). kgen.reference's
    tolerances allow both."""

    intrinsics: bool = False
    why: str = ""

    def describe(self, gemm: str) -> list[Row]:
        if not self.why:
            return []
        value = "__expf, __fdividef" if self.intrinsics else "expf, IEEE division"
        return [(f"{gemm} epilogue math", value, self.why)]


@dataclass(frozen=True, slots=True)
class EpilogueVectors:
    """Where the epilogue's row and column vectors (bias[col], scale[row]) named in `params`
    live (the others: global memory). STAGED: the consumers stage them in shared memory per
    tile, in buffer staged_vector_buffer(gemm, param): each thread loads its elements of the
    tile's slice at the tile's start, holds them in registers through the mainloop and writes
    them to its consumer's buffer before the epilogue, which reads them there. REGISTERS (a
    chain's gemm that feeds the next one, its tile covering all of its N in every tile): each
    consumer thread loads its columns into registers at the top of every tile, before the
    mainloop, and passes them to the epilogue; the columns a thread reads are the same in every
    tile, and the loads land while the mainloop runs. GLOBAL: every read waits for its round
    trip (after the last wgmma group has drained)."""

    home: VectorHome = VectorHome.GLOBAL
    params: tuple[str, ...] = ()
    why: str = ""

    def held(self, home: VectorHome) -> tuple[str, ...]:
        """The vectors that live in `home` (GLOBAL: none listed)."""
        return self.params if self.home is home else ()

    def describe(self, gemm: str) -> list[Row]:
        if not self.why:
            return []
        value = ("from global memory" if not self.params
                 else ", ".join(self.params) + " in registers, loaded before the mainloop"
                 if self.home is VectorHome.REGISTERS else ", ".join(self.params))
        return [(f"{gemm} epilogue vectors", value, self.why)]


class PeriodSets(enum.Enum):
    """Where a block-scaled gemm's wgmma sums go before their promotion (AccPromotion.sets)."""

    ONE = "one"  # the tile's width: each k tile's group waited (wgmma_wait<0>), then promoted
    HALVES = "halves"  # a set per half of the tile's columns: each k tile two groups, two k
    # tiles a pass, each promoted while the next multiplies, the pass's last after the drain


class ScaleLoads(enum.Enum):
    """Who brings a block-scaled gemm's scales of each k tile to the consumers."""

    CONSUMERS = "consumers' __ldg"  # each consumer thread its own, two k tiles ahead
    PRODUCER = "producer's copies"  # the producer warp's cp.async into the slot's scale buffer


class PromotionBound(enum.Enum):
    """A timing bound of the block-scaled mainloop, for bench/fp8.py only (wrong results; no
    rule and no DSL spelling reaches one: promotion.without_promotion)."""

    NONE = "none"  # the kernel
    UNPROMOTED = "no promotion"  # wgmma sums into the f32 accumulators, no scales, tiles waited
    UNLOADED = "no scale loads"  # promoted, no scale loads in the mainloop (k tiles 0, 1's reused)


@dataclass(frozen=True, slots=True)
class AccPromotion:
    """Two-level accumulation (FP8): wgmma accumulates each period of `k_tiles` k tiles into
    registers of its own, scale-d 0 at the period's first k step, and each consumer thread
    then adds them into the f32 accumulators the epilogue reads (DeepGEMM's promotion). FP8
    wgmma accumulates with about 14 mantissa bits; promoted, one period's sums carry that
    error, not the whole K's. 0: wgmma accumulates the whole K. `why`: the rule that chose it,
    or why the gemm is not promoted."""

    k_tiles: int = 0
    why: str = ""
    # block scales applied as each period (one k tile) is promoted: "A by SA 1x128 (col)"
    scales: tuple[str, ...] = ()
    why_scales: str = ""
    # With block scales (each k tile waited and promoted): `turns`, the two cooperative
    # consumers take turns issuing their k tiles' wgmma groups (named barriers), so that the
    # tensor cores run one's group while the other promotes; `early_release`, a k tile's ring
    # slot is released as soon as its group is waited, not with the next k tile's
    turns: bool = False
    early_release: bool = False
    why_overlap: str = ""
    sets: PeriodSets = PeriodSets.ONE  # where the sums wait for their promotion
    why_sets: str = ""
    scale_loads: ScaleLoads = ScaleLoads.CONSUMERS  # who loads them, with block scales
    why_scale_loads: str = ""
    bound: PromotionBound = PromotionBound.NONE  # bench/fp8.py's timing bound (wrong results)

    def describe(self, gemm: str) -> list[Row]:
        if not self.why:
            return []
        value = f"every {self.k_tiles} k tile{'s' * (self.k_tiles > 1)}" if self.k_tiles else "none"
        rows = [(f"{gemm} promotion", value, self.why)]
        if self.scales:
            rows.append((f"{gemm} block scales", ", ".join(self.scales), self.why_scales))
        if self.why_overlap:
            overlap = ", ".join(v for v, on in (("consumers take turns", self.turns),
                                                ("slot released at its wait",
                                                 self.early_release)) if on) or "none"
            rows.append((f"{gemm} promotion overlap", overlap, self.why_overlap))
        if self.why_sets:
            rows.append((f"{gemm} period sets", self.sets.value, self.why_sets))
        if self.why_scale_loads:
            rows.append((f"{gemm} scale loads", self.scale_loads.value, self.why_scale_loads))
        if self.bound is not PromotionBound.NONE:
            rows.append((f"{gemm} timing bound", f"{self.bound.value} (wrong results)",
                         "promotion.without_promotion, bench/fp8.py's bound"))
        return rows


def staged_vector_buffer(gemm: str, param: str) -> str:
    """The shared-memory buffer of a staged epilogue vector (EpilogueVectors, STAGED)."""
    return f"{gemm}_vec_{param}"


@dataclass(frozen=True, slots=True)
class GemmSchedule:
    """One gemm's components, in the order `kgen inspect` prints them."""

    name: str
    atom: MmaAtom
    pipeline: Pipeline
    output: Output
    staged: StagedInput = StagedInput()
    staging: Staging = Staging()
    passes: ColumnPasses = ColumnPasses()
    overlap: Overlap = Overlap()
    groups: EpilogueGroups = EpilogueGroups()
    math: EpilogueMath = EpilogueMath()
    vectors: EpilogueVectors = EpilogueVectors()
    promotion: AccPromotion = AccPromotion()

    def components(self) -> tuple:
        return (self.atom, self.pipeline, self.output, self.staged, self.staging, self.passes,
                self.overlap, self.groups, self.math, self.vectors, self.promotion)

    def describe(self) -> list[Row]:
        return [row for c in self.components() for row in c.describe(self.name)]


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

    def describe(self) -> list[Row]:
        what = "store" if self.store else "load"
        return [(f"tensor map {self.param}",
                 f"{what}, {self.dtype.dsl_name} {self.rows}x{self.cols}, box "
                 f"{self.box[1]}x{self.box[0]}, 128-byte swizzle",
                 self.why or "encoded by the launcher, passed in the kernel's second parameter")]


@dataclass(frozen=True, slots=True)
class LineChoice:
    """A schedule line the source left out and kgen filled (kgen/lower/builder.py): `line` as
    `<gemm> tile` or `schedule`, its value as DSL text, and why."""

    line: str
    value: str
    why: str = ""


WHY_CONSUMER_ORDER = ("each consumer warpgroup starts its mainloop once the other has issued its "
                      "last (two mbarriers): no slot is awaited before its previous fill has "
                      "landed, whatever the ring's depth")


@dataclass(frozen=True, slots=True)
class Schedule:
    """How the kernel runs: its components, then how it was chosen (`rejected`, `chosen`,
    `untaken`: records for `kgen inspect`, which decide nothing)."""

    scheduler: TileScheduler
    warps: WarpRoles
    gemms: tuple[GemmSchedule, ...]
    entry: EntryPoints = EntryPoints()
    # the matrices the copy engine reads or writes, in the order of the kernel's maps
    tensor_maps: tuple[TensorMap, ...] = ()
    # the schedules the target also listed, each with why it was not taken: (kind, reason)
    rejected: tuple[tuple[KernelKind, str], ...] = ()
    # the schedule lines the source left out, as kgen filled them, and the configurations the
    # builder tried before the one it took, each with its refusal: (label, reason)
    chosen: tuple[LineChoice, ...] = ()
    untaken: tuple[tuple[str, str], ...] = ()

    @property
    def multicast(self) -> str | None:
        """The first gemm's operand the cluster's CTAs share ("a" or "b"), or None."""
        if not self.gemms:
            return None
        p = self.gemms[0].pipeline
        return next((which for which, op in (("a", p.a), ("b", p.b))
                     if op.load is LoadPath.TMA_MULTICAST), None)

    def gemm(self, name: str) -> GemmSchedule:
        return next(g for g in self.gemms if g.name == name)

    @property
    def tma_output(self) -> TensorMap | None:
        """The output the copy engine stores (its tensor map is among tensor_maps)."""
        return next((m for m in self.tensor_maps if m.store), None)

    @property
    def tma_loads(self) -> bool:
        """The copy engine fills the first gemm's ring (A and B by tensor maps)."""
        return bool(self.gemms) and self.gemms[0].pipeline.a.load in (LoadPath.TMA,
                                                                       LoadPath.TMA_MULTICAST)

    @property
    def consumer_order(self) -> bool:
        """schedule pingpong on a chain: the consumer warpgroups take turns at the first gemm's
        mainloop, each waiting until the other has issued its last (two mbarriers, after the
        ring's), so none waits on a slot whose previous fill may not have landed (a phase parity
        tells only two rounds apart), for any ring depth; at K0 = 256 a ring of k tiles + 1
        slots crashed on an H200 without turns. Paired tiles (Pipeline.paired) take none."""
        return self.scheduler.pingpong and len(self.gemms) > 1 and not self.gemms[0].pipeline.paired

    @property
    def chain_ring_b(self) -> bool:
        """A ping-pong chain whose first gemm's B streams through the ring beside A (the
        producer's copy engine loads both), the later gemms' B resident."""
        return (self.scheduler.pingpong and len(self.gemms) > 1
                and self.gemms[0].pipeline.b.load is LoadPath.TMA)

    @property
    def staged_inputs(self) -> tuple[str, ...]:
        """The epilogue inputs the copy engine loads into the output's staging."""
        return tuple(g.staged.param for g in self.gemms if g.staged.param is not None)

    @property
    def resident(self) -> bool:
        return any(g.pipeline.b.load is LoadPath.RESIDENT for g in self.gemms)

    @property
    def wide_stores(self) -> bool:
        """The output leaves in 16-byte chunks, from registers (WIDE) or through the copy
        engine (TMA, which needs what WIDE needs): either way its rows are 16-byte aligned."""
        return bool(self.gemms) and self.gemms[-1].output.path in (StorePath.WIDE, StorePath.TMA)

    @property
    def wgmma(self) -> bool:
        return bool(self.gemms) and self.gemms[0].atom.instruction is Mma.WGMMA_SS

    @property
    def wgmma_chain(self) -> tuple[str, ...]:
        return tuple(g.name for g in self.gemms if g.atom.instruction is Mma.WGMMA_RS)

    # Which helpers the .cu carries: only those the kernel calls
    @property
    def quad_stores(self) -> bool:
        """The quad transpose of 16-byte stores from registers."""
        return bool(self.gemms) and self.gemms[-1].output.path is StorePath.WIDE

    @property
    def mma_sync(self) -> bool:
        """mma_step: some gemm still multiplies with mma.sync."""
        return any(g.atom.instruction in (Mma.MMA_SYNC, Mma.MMA_SYNC_FP8) for g in self.gemms)

    def describe(self) -> list[Row]:
        """(label, value, why) rows for `kgen inspect`: how the schedule was chosen, then each
        component's rows, the kernel's before the gemms'."""
        rows = [(f"line {c.line}", c.value, f"chosen by kgen: {c.why}") for c in self.chosen]
        rows += [("not chosen", label, reason) for label, reason in self.untaken]
        rows += [(f"not {kind.value}", "refused", reason) for kind, reason in self.rejected]
        rows += self.scheduler.describe() + self.warps.describe() + self.entry.describe()
        for g in self.gemms:
            rows += g.describe()
        if self.consumer_order:
            rows.append(("consumer order", "turns at the first gemm's mainloop",
                         WHY_CONSUMER_ORDER))
        for m in self.tensor_maps:
            rows += m.describe()
        return rows
