"""What each compilation target offers: shared-memory budget, MMA shapes and dtypes, the
instructions it has, and (kgen/targets/<arch>/schedules.py) the schedules it can run a kernel
with, each refused one with its reason."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Generator, Mapping

from ..enums import Arch, Dim, DType, Residency
from ..plan import GemmPlan, KernelKind, Schedule, StoragePlan


class Instruction(enum.Enum):
    """The instructions a schedule may rely on."""

    MMA_SYNC = "mma.sync"  # warp-level MMA (sm_80)
    CP_ASYNC = "cp.async"  # asynchronous global-to-shared copies (sm_80)
    WGMMA = "wgmma"  # warpgroup MMA from shared-memory descriptors or registers (sm_90a)
    MBARRIER = "mbarrier"  # transaction barriers in shared memory, with try_wait (sm_90)
    TMA = "cp.async.bulk.tensor"  # the copy engine, through tensor maps (sm_90)
    SETMAXNREG = "setmaxnreg"  # per-warpgroup register budgets (sm_90a)


@dataclass(frozen=True, slots=True)
class Target:
    arch: Arch
    smem_limit: int  # bytes of dynamic shared memory one CTA may use
    max_threads: int
    registers_per_sm: int
    mma_shape: tuple[int, int, int]  # the warp-level MMA instruction, m x n x k
    operand_dtypes: frozenset[DType]  # A/B element types the MMA takes
    acc_dtypes: frozenset[DType]
    output_dtypes: frozenset[DType]
    emitter: str  # key of the emitter table in kgen.emit
    instructions: frozenset[Instruction] = frozenset()
    schedules: str = "sm80"  # the package whose schedules.py lists the legal schedules
    # the tensor cores take FP8 operands (e4m3, e5m2): sm_89's mma.sync m16n8k32, sm_90a's wgmma
    # (not an Instruction: an sm_80 plan, which has no FP8 operand, gains nothing from it)
    fp8: bool = False

    def has(self, instruction: Instruction) -> bool:
        return instruction in self.instructions

    @property
    def tma(self) -> bool:
        return Instruction.TMA in self.instructions


_SM80_INSTRUCTIONS = frozenset({Instruction.MMA_SYNC, Instruction.CP_ASYNC})
_SM80_FAMILY = dict(
    max_threads=1024,
    registers_per_sm=65536,
    mma_shape=(16, 8, 16),
    operand_dtypes=frozenset({DType.F16, DType.BF16}),
    acc_dtypes=frozenset({DType.F32}),
    output_dtypes=frozenset({DType.F16, DType.BF16, DType.F32}),
    emitter="sm80",
)

TARGETS: dict[Arch, Target] = {
    Arch.SM80: Target(Arch.SM80, smem_limit=163 * 1024, instructions=_SM80_INSTRUCTIONS,
                      **_SM80_FAMILY),
    Arch.SM86: Target(Arch.SM86, smem_limit=99 * 1024, instructions=_SM80_INSTRUCTIONS,
                      **_SM80_FAMILY),
    # sm_89: the sm_80 mainloop, and FP8 operands on its mma.sync (kgen/targets/sm80/fp8.py)
    Arch.SM89: Target(Arch.SM89, smem_limit=99 * 1024,
                      instructions=_SM80_INSTRUCTIONS, fp8=True, **_SM80_FAMILY),
    # sm_90a: the sm_80 mainloop everywhere, plus the Hopper schedules (wgmma, the ping-pong
    # ring on mbarriers, TMA stores) where a kernel meets their rules; the budget is Hopper's.
    Arch.SM90A: Target(Arch.SM90A, smem_limit=227 * 1024, schedules="sm90",
                       instructions=_SM80_INSTRUCTIONS | {
                           Instruction.WGMMA, Instruction.MBARRIER, Instruction.TMA,
                           Instruction.SETMAXNREG}, fp8=True,
                       **_SM80_FAMILY),
}


def target(arch: Arch) -> Target:
    return TARGETS[arch]


# ---------------------------------------------------------------------------------------------
# What a target weighs when it lists its legal schedules: plan-level data only, so that the
# targets need no IR. The lowering (kgen/lower/select.py) builds the draft and picks.


class Mainloop(enum.Enum):
    """The mainloops the mainloop pass plans a kernel's gemms for (kgen/lower/mainloop.py), each
    once, for the kinds that run it; a kind's candidate takes its own (ScheduleDraft.plans) and
    changes none of it."""

    WRITTEN = "written"  # the source's warp grid, every B streamed through its stages: the
    # mma.sync kernels' (TILED, PERSISTENT without `keep B resident`)
    RESIDENT = "resident"  # the same, where each B the source keeps resident holds all of its k
    # tiles (a resident PERSISTENT chain; the ping-pong chain, whose B0 may stream instead)
    COOPERATIVE = "cooperative"  # sm_90a's warp-specialized consumers on one gemm (consumer_grid)
    PINGPONG = "pingpong"


@dataclass(frozen=True, slots=True)
class GemmDraft:
    """A gemm as the mainloop pass planned it for the source's warp grid (`plan`: None before
    that pass, when only the request is checked), and what its source asked for."""

    name: str
    warps: tuple[int, int]
    resident: bool  # `keep B resident`
    keep: Residency | None  # the user's `keep registers|smem` (None: kgen chose)
    plan: GemmPlan | None = None


@dataclass(frozen=True, slots=True)
class Site:
    """Where a refusal points in the source: the kernel's `schedule` line, or gemm number
    `gemm`'s own line ("gemm") or one of its clauses ("tile", "warps", "stages", "resident",
    "split", "cluster"), or the shared-memory budget ("budget": where the storage pass's own
    refusal points, the first gemm's stages line)."""

    what: str
    gemm: int | None = None


@dataclass(frozen=True, slots=True)
class ScheduleDraft:
    target: Target
    requested: KernelKind | None  # `schedule pingpong`; `keep ... resident` asks PERSISTENT
    gemms: tuple[GemmDraft, ...]
    declared_storage: bool  # a storage or phases declaration: their lifetimes assume one tile
    allow_persistent: bool = True  # False: the caller forbids it (lower(persistent=False))
    group_m: int = 8
    dtypes: Mapping[str, DType] = field(default_factory=dict)  # each parameter's element type
    split_k: int = 1  # `split S` on the (one) gemm: S CTAs per output tile along K
    stream_k: bool = False  # `split stream` on the (one) gemm: stream-K
    cluster: tuple[int, int] = (1, 1)  # `cluster MxN` on the (one) gemm
    cluster_written: bool = False  # the source writes the line (1x1 included)
    batched: frozenset[str] = frozenset()  # the parameters with a batch dimension
    # The mainloop pass's plans of the gemms, per mainloop it planned (see Mainloop)
    mainloops: Mapping[Mainloop, tuple[GemmPlan, ...]] = field(default_factory=dict)
    # Why the mma.sync mainloop cannot split gemm i's tile over its warps, where only other
    # mainloops run it (a wgmma target's one gemm; a chained tile that only the ping-pong
    # chain's column passes serve): (i, reason), which the mma.sync kernels refuse it with
    mma_sync_refusal: tuple[int, str] | None = None

    @property
    def resident(self) -> bool:
        return any(g.resident for g in self.gemms)

    def plans(self, mainloop: Mainloop) -> list[GemmPlan]:
        """The gemms as the mainloop pass planned them for `mainloop`."""
        return list(self.mainloops[mainloop])


@dataclass(frozen=True, slots=True)
class Candidate:
    """One schedule a target lists for a draft: legal, or refused with its reason and where in
    the source that points; a legal one (and one refused only for its shared memory) carries
    its schedule, gemm plans and storage plan."""

    kind: KernelKind
    legal: bool
    reason: str
    site: Site | None = None
    schedule: Schedule | None = None
    gemms: tuple[GemmPlan, ...] = ()
    storage: StoragePlan | None = None

    @property
    def over_budget(self) -> bool:
        return self.storage is not None and self.storage.total_bytes > self.storage.limit_bytes


# ---------------------------------------------------------------------------------------------
# What the builder (kgen/lower/builder.py) weighs when it fills the schedule lines a source
# leaves out, and the configurations each target lists for it (kgen/targets/<arch>/configs.py)


@dataclass(frozen=True, slots=True)
class GemmShape:
    """One gemm as the builder sees it: its sizes (a number where the source fixes one), the
    operand dtype, whether A and B are K-major, whether A is the gemm before it, and whether
    its epilogue reduces."""

    name: str
    m: Dim
    n: Dim
    k: Dim
    dtype: DType
    k_major: tuple[bool, bool]
    chained: bool = False
    reductions: bool = False
    fused: bool = False  # the epilogue does more than store the accumulator (ops, inputs)
    # its output leaves as pairs from registers: it stores more or other than one 16-bit tensor
    pairs: bool = False
    row_out: bool = False  # the tensor it stores is row-major (a staging part box may serve it)


@dataclass(frozen=True, slots=True)
class GemmConfig:
    """The schedule lines of one gemm: `tile`, `warps`, `stages`, `keep registers|smem` (None
    on an unchained gemm), `keep B resident`, `split`."""

    tile: tuple[int, int, int]
    warps: tuple[int, int]
    stages: int
    keep: Residency | None = None
    resident: bool = False
    split: int = 1
    cluster: tuple[int, int] = (1, 1)  # `cluster MxN` (1x1: the line is left to the builder)
    stream: bool = False  # `split stream`: stream-K (split stays 1)


@dataclass(frozen=True, slots=True)
class Config:
    """One way to fill a kernel's schedule lines: per gemm its lines, and the kernel's
    `schedule` request (None: the target's preference among the legal kinds); `why` says what
    the target meant by it, for `kgen inspect`."""

    gemms: tuple[GemmConfig, ...]
    schedule: KernelKind | None = None
    why: str = ""

    @property
    def label(self) -> str:
        """A short name for tables: `pingpong: 64x64x64 w4x1 s12 resident | 64x128x64 ...`."""
        parts = []
        for g in self.gemms:
            text = f"{'x'.join(map(str, g.tile))} w{g.warps[0]}x{g.warps[1]} s{g.stages}"
            text += f" split {g.split}" if g.split > 1 else ""
            text += " split stream" if g.stream else ""
            text += f" cluster {g.cluster[0]}x{g.cluster[1]}" if g.cluster != (1, 1) else ""
            text += f" {g.keep.value}" if g.keep is not None else ""
            text += " resident" if g.resident else ""
            parts.append(text)
        head = f"{self.schedule.value}: " if self.schedule is not None else ""
        return head + " | ".join(parts)


def configs(tgt: Target, shapes: tuple[GemmShape, ...], *, sizes: Mapping[str, int] | None = None,
            wide: bool = False, fits=None) -> list[Config]:
    """The configurations the target lists for a kernel's gemms, best first. `sizes`: the
    runtime sizes a tuner times (they may add split-K configurations); `wide`: the tuner's
    longer list, not only the builder's few; `fits`: whether a ping-pong chain configuration's
    output staging fits its shared memory, by the storage planner (the builder asks it; sm_90a
    orders a chain's ring depths by it, kgen/targets/sm90/configs.py)."""
    from .common import configs as common_configs
    from .sm80 import fp8 as sm80_fp8
    from .sm90 import configs as sm90_configs

    if not tgt.has(Instruction.WGMMA):
        if len(shapes) == 1 and shapes[0].dtype.fp8:  # sm_89's mma.sync FP8
            return sm80_fp8.configs(shapes[0], sizes or {}, wide)
        return common_configs.configs(tgt, shapes, sizes=sizes or {}, wide=wide)
    return sm90_configs.configs(tgt, shapes, sizes=sizes or {}, wide=wide,
                                **({"fits": fits} if fits is not None else {}))


WHY_SIZED = "the runtime sizes:"  # how the why of a configuration `sized` chose starts


def sized(tgt: Target, shapes: tuple[GemmShape, ...], sizes: Mapping[str, int],
          batches: int = 1) -> Config | None:
    """The configuration the runtime sizes call for where the builder's size-blind default
    would leave SMs idle (one gemm on sm_90a), or None."""
    from .sm90 import configs as sm90_configs

    if len(shapes) != 1 or not tgt.has(Instruction.WGMMA):
        return None
    return sm90_configs.sized(shapes[0], sizes, batches)


def _schedules(tgt: Target):
    """The target's schedule list (imported here: each list imports this module's types)."""
    from .sm80 import schedules as sm80
    from .sm90 import schedules as sm90

    return {"sm80": sm80, "sm90": sm90}[tgt.schedules]


@dataclass(frozen=True, slots=True)
class Placement:
    """A trial placement a candidate asks for: the gemm plans whose buffers it places and the
    storage pass's options (kgen/lower/storage.py run's: persistent, resident, ring_barriers,
    staging=(bytes, align), vectors, ring_b, turn_barriers). A candidate is a generator that
    yields each Placement and is sent back its StoragePlan, never raising on the budget; the
    lowering (kgen/lower/select.py) places it."""

    gemms: tuple[GemmPlan, ...]
    options: Mapping[str, object] = field(default_factory=dict)


def place(gemms, **options) -> Placement:
    """The Placement of `gemms` with the storage pass's `options` (yield it)."""
    return Placement(tuple(gemms), options)


# A candidate: yields its trial placements, is sent their storage plans, returns its verdict
Placing = Generator[Placement, StoragePlan, Candidate]


def candidates(draft: ScheduleDraft) -> Generator[Placement, StoragePlan, list[Candidate]]:
    """The target's schedules for the draft, in its order of preference (a generator of
    trial placements, see Placement)."""
    return _schedules(draft.target).candidates(draft)


# The mma.sync mainloop's advice for a warp tile whose accumulators pass the registers
# (kgen/lower/mainloop.py); sm_90a words its own where a warp-specialized kernel takes tiles
MORE_WARPS = "; use more warps or a smaller tile"
RING_MAX_STAGES = 32  # the producer warps' ring (schedule pingpong): slots of one small tile each


def producer_threads(tgt: Target, kind: KernelKind | None) -> int | None:
    """Threads that alone copy the first gemm's A under `kind` (None: every thread)."""
    return _schedules(tgt).producer_threads(kind)


@dataclass(frozen=True, slots=True)
class WarpGrid:
    """How a kernel kind's math warps split a gemm's tile: the warp grid, each warp's tile, its
    MMA tiles along M and N, and whether each warp holds whole rows of the tile (the row
    reductions then need no scratch)."""

    warps: tuple[int, int]
    warp_tile: tuple[int, int]
    frags: tuple[int, int]
    whole_rows: bool = False


def consumer_grid(tgt: Target, kind: KernelKind, tile: tuple[int, int, int]) -> WarpGrid | None:
    """The warp grid of `kind`'s consumer warps on a one-gemm tile, where the target runs that
    kind with a grid of its own (sm_90a's warp-specialized kernels), else None."""
    return _schedules(tgt).consumer_grid(kind, tile)
