"""The rulebooks' shared rules and order: whether a kernel's schedule lines (written or filled by the
builder, kgen/lower/builder.py) plan, asked BEFORE lowering. Each target's entry point is
kgen/targets/<arch>/rules.py `refusal(facts)`; it asks the rules in the order the lowering meets
them and returns the first refusal (None: the lines plan), which the lowering, meeting the same
rule, raises with the same words at the same place. One home per rule: the lowering's steps
call these functions (the request pass `request_refusal` through the target's rulebook, the
mainloop pass `tile_refusal` and `warps_refusal`, the schedule pass `chosen`), never a copy.

    chain      the rules of back-to-back gemms (kgen/lower/chain.py `refusal`)
    request    the source's `schedule` / `keep ... resident` request on what the source alone
               shows (the target's schedules.py `refuse_request`), and the lines only a target
               with the copy engine runs (`split stream`, `cluster`: `request_refusal`)
    mainloop   per gemm, the tile, warps and stages (`tile_refusal`), the mma.sync warp split
               and accumulators (`warps_refusal`), the operand tiles' layouts (the mainloop
               pass's planners, kgen/lower/mainloop.py and chain.py)
    schedule   the target's candidates (kgen/targets/<arch>/schedules.py), each weighing its
               shared memory by the storage planner's own placement: the one the lowering takes
               (`chosen`) is legal, or refused with its reason, or over the budget with the
               storage planner's message (kgen/lower/storage.py `budget_refusal`: the one
               shared-memory accounting)
    interface  the arguments' alignment rules of the chosen schedule (kgen/lower/abi.py)

The rules that need the IR or the mainloop's plans are the lowering's planners, asked through
`Facts` (targets need no IR); each answers with its refusal instead of raising it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..errors import SourceLoc
from ..plan import KernelKind
from . import MORE_WARPS, Candidate, Instruction, ScheduleDraft, Site, Target

# FP8 operands' rules on the sm_80 family, said where verify and each rulebook read them (the
# why: kgen/targets/sm80/fp8.py)
FP8_REFUSED = ("FP8 operands need FP8 tensor cores, target sm_89 (mma.sync m16n8k32) or sm_90a; "
               "{arch}'s mma.sync takes 16-bit operands only")
FP8_LAYOUT = ("sm_89's mma.sync reads 8-bit fragments through ldmatrix, which cannot transpose "
              "8-bit elements (its .trans swaps 16-bit halves)")
FP8_BLOCK_SCALES = ("block scales run on sm_90a only (applied as its FP8 accumulators are "
                    "promoted every 128 of k); on {arch} scale tensor-wise (scalars) or per row "
                    "and column (vectors) in the epilogue")

MAX_ACC_REGISTERS = 128  # f32 accumulators per thread; beyond this the kernel spills
MAX_TILE = 512
MAX_STAGES = 8


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a kernel's schedule lines do not plan, and where in the source that points: a
    `site` (kgen/lower/select.py `locate`), or the location an IR-level rule found itself."""

    message: str
    site: Site | None = None
    loc: SourceLoc | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    """What the rulebook weighs for one kernel with every schedule line written or filled:
    its target, the request draft (what the source alone shows, before the mainloop pass), and
    the lowering's planners, each asked at most once and in this order: the chain rules, the
    mainloop pass's rules (each gemm's tile, warps, stages and operand layouts), the target's
    candidates placed in shared memory, the storage planner's budget message for a candidate
    over it, and the interface rules of the chosen candidate."""

    target: Target
    draft: ScheduleDraft
    chain: Callable[[], Refusal | None]
    mainloops: Callable[[], Refusal | None]
    candidates: Callable[[], list[Candidate]]
    budget: Callable[[Candidate], Refusal]
    interface: Callable[[Candidate], Refusal | None]


def refusal(facts: Facts, request: Callable[[ScheduleDraft], Refusal | None]) -> Refusal | None:
    """The first rule that refuses the facts (None: they plan); `request`: the target's rules
    on what the source alone shows."""
    refused = facts.chain() or request(facts.draft) or facts.mainloops()
    if refused is not None:
        return refused
    candidate = chosen(facts.candidates(), facts.draft.requested)
    if not candidate.legal:
        if candidate.over_budget:
            return facts.budget(candidate)
        return Refusal(candidate.reason, candidate.site)
    return facts.interface(candidate)


def chosen(listed: list[Candidate], wanted: KernelKind | None) -> Candidate:
    """The candidate the lowering takes: the requested kind, else the first legal one in the
    target's order of preference, else the last (refused; over the budget, the storage
    planner's message then says why)."""
    if wanted is not None:
        return next(c for c in listed if c.kind is wanted)
    return next((c for c in listed if c.legal), listed[-1])


def request_refusal(draft: ScheduleDraft,
                    refuse_request: Callable[[ScheduleDraft], Candidate | None]) -> Refusal | None:
    """The request refused on what the source alone shows (`refuse_request`: the target's
    schedules.py rule on the kind asked for), then, on a target without the copy engine, the
    lines only sm_90a's warp-specialized kernel runs: `split stream`, `cluster`; and FP8
    operands on a target without FP8 MMAs (sm_80, sm_86: verify refuses them on such a target;
    this is the same rule for a kernel lowered for another target than its own)."""
    refused = refuse_request(draft)
    if refused is not None:
        return Refusal(refused.reason, refused.site)
    if draft.target.tma:
        return None
    arch = draft.target.arch.value
    if draft.stream_k:
        return Refusal("split stream needs target sm_90a (stream-K runs on the cooperative "
                       f"wgmma kernel); this kernel is lowered for {arch}", Site("split", 0))
    if draft.cluster_written:  # verified for the kernel's target, lowered for this one
        return Refusal("cluster needs target sm_90a (thread-block clusters and the copy "
                       f"engine's multicast); this kernel is lowered for {arch}",
                       Site("cluster", 0))
    if (any(d.fp8 for d in draft.dtypes.values())  # verified for sm_89 or sm_90a, lowered
            and not draft.target.fp8):  # for a target without FP8 MMAs
        return Refusal(f"{FP8_REFUSED.format(arch=arch)}; this kernel is lowered for "
                       f"{arch}", Site("gemm", 0))
    return None


# ---------------------------------------------------------------------------------------------
# The mainloop's rules (kgen/lower/mainloop.py asks them)


def tile_refusal(tgt: Target, tile: tuple[int, int, int], warps: tuple[int, int], stages: int,
                 max_stages: int = MAX_STAGES, chained: bool = False,
                 elem_bytes: int = 2) -> Refusal | None:
    """The CTA tile, warp grid and stages any mainloop needs. `chained`: the gemm's A is an
    earlier gemm's output, whose fragments alternate by the chain's step
    (kgen.targets.common.chain_mainloop), so a k tile may be one k step. `elem_bytes`: the
    operands' (1: FP8, whose MMA's k step is 32 elements, the same 32 bytes as 16-bit's 16)."""
    (m, n, k), (wm, wn) = tile, warps
    mma_k = tgt.mma_shape[2] * 2 // elem_bytes
    for label, value in (("M", m), ("K", k)):
        if value < 16 or value > MAX_TILE or value & (value - 1):
            return Refusal(f"tile {label} must be a power of two between 16 and {MAX_TILE}, got "
                           f"{value}", Site("tile"))
    # N need not be a power of two: a tile N of 192 (three 64-column boxes) fills the waves of
    # shapes whose 256-column tiles leave the last wave part empty (6144x5120 on 132 SMs)
    # (wgmma takes any multiple of 8; the mma.sync mainloop refuses one of 16 in warps_refusal)
    step = 8 if tgt.has(Instruction.WGMMA) else 16
    if n < 16 or n > MAX_TILE or n % step:
        return Refusal(f"tile N must be a multiple of {step} between 16 and {MAX_TILE}, got {n}",
                       Site("tile"))
    if wm <= 0 or wn <= 0:
        return Refusal(f"warps must be positive, got {wm}x{wn}", Site("warps"))
    threads = wm * wn * 32
    if threads > tgt.max_threads:
        return Refusal(f"warps {wm}x{wn} make {threads} threads; a CTA has at most "
                       f"{tgt.max_threads}", Site("warps"))
    if k % (2 * mma_k) and not (chained and k == mma_k):
        # fragments of consecutive k steps alternate between two register buffers
        why = f" (two k{mma_k} steps of the FP8 MMA)" if elem_bytes == 1 else ""
        return Refusal(f"tile K must be a multiple of {2 * mma_k}{why}, got {k}", Site("tile"))
    if stages < 2 or stages > max_stages:
        return Refusal(f"stages must be between 2 and {max_stages}, got {stages}",
                       Site("stages"))
    return None


def warps_refusal(tgt: Target, tile: tuple[int, int, int], warps: tuple[int, int],
                  columns: int | None = None) -> str | None:
    """Why the sm_80 mainloop cannot split the tile over the warps (whole MMAs per warp, the
    warp tile's accumulators within the registers: of `columns` of the tile at a time where
    given), or None; it points at the tile line."""
    (m, n, _), (wm, wn) = tile, warps
    mma_m, mma_n, _ = tgt.mma_shape
    if n % 16:  # (256x152 fills 3 waves at 3000x5000 on the warp-specialized kernel)
        return f"tile N must be a multiple of 16 between 16 and {MAX_TILE}, got {n}"
    if m % (wm * mma_m):
        return (f"tile M {m} does not split over {wm} warps in M into multiples of the "
                f"{mma_m}-row MMA (needs a multiple of {wm * mma_m})")
    # Each warp loads B fragments for two n8 MMAs at once (ldmatrix.x4), so 16 columns.
    if n % (wn * 2 * mma_n):
        return (f"tile N {n} does not split over {wn} warps in N into multiples of 16 columns "
                f"(needs a multiple of {wn * 2 * mma_n})")
    acc_regs = (m // wm) * ((columns or n) // wn) // 32
    if acc_regs > MAX_ACC_REGISTERS:
        return (f"warp tile {m // wm}x{n // wn} needs {acc_regs} f32 accumulator "
                f"registers per thread (at most {MAX_ACC_REGISTERS}){MORE_WARPS}")
    return None


def rulebook(tgt: Target):
    """The target's rulebook module (kgen/targets/<arch>/rules.py): `refusal(facts)` and
    `request_refusal(draft)`. Imported here: each rulebook imports this module."""
    from .sm80 import rules as sm80
    from .sm90 import rules as sm90

    return {"sm80": sm80, "sm90": sm90}[tgt.schedules]
