"""Mainloop pass: check a gemm's CTA tile, warp grid and stages, and lay out its operand tiles.

Raises a located KgenError for any tile the sm_80 mainloop cannot run; otherwise returns the
numbers the emitter prints (warp tile, fragment counts, shared-memory tiles, copies per thread).
On a target with wgmma and TMA, a one-gemm kernel's tile that only the sm_80 mainloop's warp
split, accumulators or copies refuse is planned without them: the warp-specialized kernels load
it by TMA and hold their own accumulators (256x160 on two consumers of 128 rows each), and the
pass returns the refusal beside the plan (ScheduleDraft.mma_sync_refusal) for the mma.sync
kernels, which then refuse it.

The pass plans each gemm once per mainloop the target's kinds run (targets.Mainloop): the
source's warp grid; the same with each resident B holding all of its k tiles (resident_b); and
on sm_90a a one-gemm kernel's warp-specialized consumers (targets.consumer_grid). A kind's
candidate takes its own plans and changes none of them.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..errors import KgenError
from ..plan import OperandPlan, SmemTile
from ..targets import MORE_WARPS, RING_MAX_STAGES, Instruction, Target
from . import fragments, swizzle

MAX_ACC_REGISTERS = 128  # f32 accumulators per thread; beyond this the kernel spills
MAX_TILE = 512
MAX_STAGES = 8


def _check_tile(gemm: ir.Gemm, tgt: Target, max_stages: int = MAX_STAGES,
                chained: bool = False) -> None:
    """`chained`: the gemm's A is an earlier gemm's output, whose fragments alternate by the
    chain's step (kgen.targets.common.chain_mainloop), so a k tile may be one k step."""
    t, w = gemm.tile, gemm.warps
    mma_m, mma_n, mma_k = tgt.mma_shape
    for label, value in (("M", t.m), ("K", t.k)):
        if value < 16 or value > MAX_TILE or value & (value - 1):
            raise KgenError(
                t.loc, f"tile {label} must be a power of two between 16 and {MAX_TILE}, got {value}"
            )
    # N need not be a power of two: a tile N of 192 (three 64-column boxes) fills the waves of
    # shapes whose 256-column tiles leave the last wave part empty (6144x5120 on 132 SMs)
    # (wgmma takes any multiple of 8; the mma.sync mainloop refuses one of 16 in _warps_refusal)
    step = 8 if tgt.has(Instruction.WGMMA) else 16
    if t.n < 16 or t.n > MAX_TILE or t.n % step:
        raise KgenError(t.loc, f"tile N must be a multiple of {step} between 16 and {MAX_TILE}, "
                        f"got {t.n}")
    if w.m <= 0 or w.n <= 0:
        raise KgenError(w.loc, f"warps must be positive, got {w.m}x{w.n}")
    threads = w.m * w.n * 32
    if threads > tgt.max_threads:
        raise KgenError(
            w.loc, f"warps {w.m}x{w.n} make {threads} threads; a CTA has at most {tgt.max_threads}"
        )
    if t.k % (2 * mma_k) and not (chained and t.k == mma_k):
        # fragments of consecutive k steps alternate between two register buffers
        raise KgenError(t.loc, f"tile K must be a multiple of {2 * mma_k}, got {t.k}")
    s = gemm.stages
    if s.count < 2 or s.count > max_stages:
        raise KgenError(s.loc, f"stages must be between 2 and {max_stages}, got {s.count}")


def _warps_refusal(gemm: ir.Gemm, tgt: Target, columns: int | None = None) -> str | None:
    """Why the sm_80 mainloop cannot split the tile over the warps (whole MMAs per warp, the
    warp tile's accumulators within the registers: of `columns` of the tile at a time where
    given), or None; it points at the tile line."""
    t, w = gemm.tile, gemm.warps
    mma_m, mma_n, _ = tgt.mma_shape
    if t.n % 16:  # (256x152 fills 3 waves at 3000x5000 on the warp-specialized kernel)
        return f"tile N must be a multiple of 16 between 16 and {MAX_TILE}, got {t.n}"
    if t.m % (w.m * mma_m):
        return (f"tile M {t.m} does not split over {w.m} warps in M into multiples of the "
                f"{mma_m}-row MMA (needs a multiple of {w.m * mma_m})")
    # Each warp loads B fragments for two n8 MMAs at once (ldmatrix.x4), so 16 columns.
    if t.n % (w.n * 2 * mma_n):
        return (f"tile N {t.n} does not split over {w.n} warps in N into multiples of 16 columns "
                f"(needs a multiple of {w.n * 2 * mma_n})")
    acc_regs = (t.m // w.m) * ((columns or t.n) // w.n) // 32
    if acc_regs > MAX_ACC_REGISTERS:
        return (f"warp tile {t.m // w.m}x{t.n // w.n} needs {acc_regs} f32 accumulator "
                f"registers per thread (at most {MAX_ACC_REGISTERS}){MORE_WARPS}")
    return None


def check_warps(gemm: ir.Gemm, tgt: Target) -> None:
    """_warps_refusal, raised."""
    refusal = _warps_refusal(gemm, tgt)
    if refusal is not None:
        raise KgenError(gemm.tile.loc, refusal)


PASS_COLUMNS = 128  # a chained tile wider than wgmma's 256 columns runs in passes of these


def chained_refusal(gemm: ir.Gemm, tgt: Target) -> str:
    """A chained gemm's _warps_refusal, raised unless only the ping-pong chain's column passes
    serve the tile: on a target with wgmma, a tile N over 256 that is a multiple of
    PASS_COLUMNS, whose accumulators fit one pass at a time. That refusal is returned, for
    ScheduleDraft.mma_sync_refusal (the other chain schedules refuse it)."""
    refusal = _warps_refusal(gemm, tgt)
    if refusal is None:
        return ""
    n = gemm.tile.n
    if (tgt.has(Instruction.WGMMA) and n > 256 and n % PASS_COLUMNS == 0
            and _warps_refusal(gemm, tgt, PASS_COLUMNS) is None):
        return refusal
    raise KgenError(gemm.tile.loc, refusal)


def _steps(gemm: ir.Gemm, which: str, tile, k_major: bool, threads: int, warp_tile: tuple[int, int],
           copy_threads: int):
    """Prove the per-thread offset tables of copies (by the `copy_threads` first threads) and
    fragment loads (by all `threads`; see plan.OperandPlan)."""
    warps_n = gemm.warps.n
    elems = swizzle.CHUNK_BYTES // tile.dtype.nbytes
    per_row = tile.inner // elems
    copies = tile.stage_elems // elems // copy_threads
    if copy_threads % per_row:
        return None
    row_step = copy_threads // per_row

    def copy_at(t: int, i: int) -> int:
        return tile.offset(*fragments.copy_coord(t + i * copy_threads, tile.inner, elems))

    copy_steps = fragments.split_offsets(
        lambda t: copy_at(t, 0), copy_at, range(copy_threads), list(range(copies))
    )
    fmap = fragments.LDMATRIX[(which, k_major)]
    if which == "a":
        frags, warp_of = warp_tile[0] // 16, lambda t: (t // 32) // warps_n * warp_tile[0]
    else:
        frags, warp_of = warp_tile[1] // 16, lambda t: (t // 32) % warps_n * warp_tile[1]
    k_steps = gemm.tile.k // 16
    steps = [(kk, f) for kk in range(k_steps) for f in range(frags)]

    def frag_at(t: int, step: tuple[int, int]) -> int:
        return tile.offset(*fmap.coord(t % 32, warp_of(t), step[1], step[0]))

    # Threads with the same lane and warp offset read the same rows: prove one of each.
    distinct = {(t % 32, warp_of(t)): t for t in range(threads)}
    flat = fragments.split_offsets(
        lambda t: frag_at(t, (0, 0)), frag_at, sorted(distinct.values()), steps
    )
    if copy_steps is None or flat is None:
        return None
    frag_steps = tuple(tuple(flat[kk * frags : (kk + 1) * frags]) for kk in range(k_steps))
    return tuple(copy_steps), row_step, frag_steps


def _smem_tile(gemm: ir.Gemm, which: str, dtype: ir.DType, k_major: bool, outer: int,
               inner: int, prefix: str) -> SmemTile:
    tile = swizzle.make_tile(f"{prefix}{which}_smem", dtype, outer, inner, gemm.stages.count)
    if tile is None:
        extent = "K" if k_major else ("M" if which == "a" else "N")
        raise KgenError(
            gemm.tile.loc,
            f"the {which.upper()} tile's contiguous extent ({extent} = {inner} elements, "
            f"{inner * dtype.nbytes} bytes) must be 32, 64 or a multiple of 128 bytes",
        )
    return tile


def operand(gemm: ir.Gemm, which: str, param: ir.Param, k_major: bool, outer: int, inner: int,
            threads: int, prefix: str = "") -> OperandPlan:
    """_operand, its refusal raised."""
    plan = _operand(gemm, which, param, k_major, outer, inner, threads, prefix)
    if isinstance(plan, str):
        raise KgenError(gemm.tile.loc, plan)
    return plan


def _operand(
    gemm: ir.Gemm, which: str, param: ir.Param, k_major: bool, outer: int, inner: int, threads: int,
    prefix: str = "",
) -> OperandPlan | str:
    """The operand's tile as the sm_80 mainloop copies and reads it, or why it cannot (its shared
    tile's own refusal is raised)."""
    dtype = param.dtype
    tile = _smem_tile(gemm, which, dtype, k_major, outer, inner, prefix)
    chunks = outer * inner * dtype.nbytes // swizzle.CHUNK_BYTES
    # a stage of fewer chunks than threads (a narrow B tile): the first `chunks` threads copy
    copy_threads = min(chunks, threads)
    if chunks % copy_threads or threads % copy_threads:
        return (f"one stage of the {which.upper()} tile is {chunks} 16-byte copies, which do not "
                f"divide over {threads} threads; use a larger tile or fewer warps")
    warp_tile = (gemm.tile.m // gemm.warps.m, gemm.tile.n // gemm.warps.n)
    steps = _steps(gemm, which, tile, k_major, threads, warp_tile, copy_threads)
    if steps is None:
        return (f"kgen cannot lay out the {which.upper()} tile ({outer}x{inner}) for "
                f"{threads} threads with per-thread constant offsets; try another tile or warp "
                "grid")
    copy_steps, copy_row_step, frag_steps = steps
    return OperandPlan(
        param=param.name,
        dtype=dtype,
        k_major=k_major,
        smem=tile,
        copies_per_thread=chunks // copy_threads,
        ldmatrix_trans=not k_major,
        copy_steps=copy_steps,
        copy_row_step=copy_row_step,
        frag_steps=frag_steps,
        copy_threads=copy_threads if copy_threads < threads else None,
    )


def run(kernel: ir.Kernel, gemm: ir.Gemm, tgt: Target, prefix: str = "",
        a_threads: int | None = None) -> tuple[dict, str]:
    """Returns the mainloop fields of plan.GemmPlan for `gemm`, and why the mma.sync mainloop
    cannot run its tile where only the warp-specialized kernels can ("": it can); its
    shared-memory tiles are named `<prefix>a_smem` and `<prefix>b_smem` (a chain prefixes them
    with the gemm's name). `a_threads`: the threads that copy A, when not the gemm's own
    (producer warps, whose ring may be deeper)."""
    _check_tile(gemm, tgt, RING_MAX_STAGES if a_threads else MAX_STAGES)
    a = kernel.param(gemm.a.name)
    b = kernel.param(gemm.b.name)
    if a is None or b is None:
        raise KgenError(gemm.loc, "chained gemms are not supported by this kgen version yet")
    t, w = gemm.tile, gemm.warps
    threads = w.m * w.n * 32
    a_k_major = a.layout is ir.Layout.ROW
    b_k_major = b.layout is ir.Layout.COL
    a_shape = (t.m, t.k) if a_k_major else (t.k, t.m)
    b_shape = (t.n, t.k) if b_k_major else (t.k, t.n)
    refusal = _warps_refusal(gemm, tgt)
    if refusal is None:
        a_plan = _operand(gemm, "a", a, a_k_major, *a_shape, a_threads or threads, prefix)
        b_plan = _operand(gemm, "b", b, b_k_major, *b_shape, threads, prefix)
        refusal = next((p for p in (a_plan, b_plan) if isinstance(p, str)), None)
    if refusal is not None:  # every such refusal points at the tile line
        if not (len(kernel.gemms) == 1 and tgt.has(Instruction.WGMMA) and tgt.tma):
            raise KgenError(gemm.tile.loc, refusal)
        a_plan = _tma_operand(gemm, "a", a, a_k_major, *a_shape, prefix)
        b_plan = _tma_operand(gemm, "b", b, b_k_major, *b_shape, prefix)
    # logical shapes: A is [M, K] and B is [K, N] in either layout
    fields = gemm_fields(gemm, tgt, a_plan, b_plan, a.shape[0], b.shape[1], a.shape[1])
    fields["producer_threads"] = a_threads or 0
    return fields, refusal or ""


def resident_b(fields: dict) -> dict | None:
    """A gemm's mainloop fields with its B's shared tile holding all of its k tiles (`keep B
    resident`: loaded once per CTA) instead of its stages; None where K is not fixed (the
    schedules refuse that resident B)."""
    b = fields["b"]
    if not isinstance(fields["k_dim"], int):
        return None
    k_tiles = -(-fields["k_dim"] // fields["tile"][2])
    return fields | dict(b=dataclasses.replace(b, smem=dataclasses.replace(b.smem,
                                                                         stages=k_tiles)))


def _tma_operand(gemm: ir.Gemm, which: str, param: ir.Param, k_major: bool, outer: int,
                 inner: int, prefix: str) -> OperandPlan:
    """An operand tile that only the copy engine loads and wgmma reads: its shared-memory tile,
    without the sm_80 mainloop's copies and fragment loads."""
    tile = _smem_tile(gemm, which, param.dtype, k_major, outer, inner, prefix)
    return OperandPlan(param=param.name, dtype=param.dtype, k_major=k_major, smem=tile,
                       copies_per_thread=0, ldmatrix_trans=not k_major, copy_steps=(),
                       copy_row_step=0, frag_steps=())


def gemm_fields(gemm: ir.Gemm, tgt: Target, a_plan, b_plan, m_dim, n_dim, k_dim) -> dict:
    """The plan.GemmPlan fields every mainloop shares: tile, warps, fragments, operands, dims."""
    t, w = gemm.tile, gemm.warps
    mma = tgt.mma_shape
    warp_tile = (t.m // w.m, t.n // w.n)
    return dict(
        name=gemm.name,
        tile=(t.m, t.n, t.k),
        warps=(w.m, w.n),
        warp_tile=warp_tile,
        mma=mma,
        frags=(warp_tile[0] // mma[0], warp_tile[1] // mma[1]),
        stages=gemm.stages.count,
        a=a_plan,
        b=b_plan,
        m_dim=m_dim,
        n_dim=n_dim,
        k_dim=k_dim,
        a_name=gemm.a.name,
        b_name=gemm.b.name,
    )
