"""Mainloop pass: check a gemm's CTA tile, warp grid and stages, and lay out its operand tiles.

`plan` returns the located refusal of any tile the sm_80 mainloop cannot run (the rules of
the tile, warps and stages are the rulebook's, kgen/targets/rules.py; the builder asks
them before lowering), which `run` raises; otherwise the numbers the emitter prints (warp tile,
fragment counts, shared-memory tiles, copies per thread).
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
import functools

from .. import ir
from ..errors import KgenError
from ..plan import OperandPlan, ScalePlan, SmemTile
from ..targets import RING_MAX_STAGES, Instruction, Target
from ..targets import rules
from ..targets.rules import Refusal
from . import fragments, swizzle

MAX_ACC_REGISTERS, MAX_TILE, MAX_STAGES = rules.MAX_ACC_REGISTERS, rules.MAX_TILE, rules.MAX_STAGES


def tile_refusal(gemm: ir.Gemm, tgt: Target, max_stages: int = MAX_STAGES,
                 chained: bool = False, elem_bytes: int = 2) -> Refusal | None:
    """The rulebook's tile, warps and stages rules (kgen/targets/rules.py
    `tile_refusal`) on the gemm's lines, located at the line each points at. `elem_bytes`:
    the operands' (1: FP8)."""
    t, w, s = gemm.tile, gemm.warps, gemm.stages
    refused = rules.tile_refusal(tgt, (t.m, t.n, t.k), (w.m, w.n), s.count, max_stages, chained,
                                 elem_bytes)
    if refused is None:
        return None
    return Refusal(refused.message, loc={"tile": t.loc, "warps": w.loc,
                                         "stages": s.loc}[refused.site.what])


def _warps_refusal(gemm: ir.Gemm, tgt: Target, columns: int | None = None) -> str | None:
    """The rulebook's mma.sync warp split (rules.warps_refusal) on the gemm's lines."""
    t, w = gemm.tile, gemm.warps
    return rules.warps_refusal(tgt, (t.m, t.n, t.k), (w.m, w.n), columns)


def raised(refused: Refusal) -> KgenError:
    """A located refusal of the mainloop's rules, as the error the pass raises."""
    return KgenError(refused.loc, refused.message)


PASS_COLUMNS = 128  # a chained tile wider than wgmma's 256 columns runs in passes of these


def chained_refusal(gemm: ir.Gemm, tgt: Target) -> str | Refusal:
    """A chained gemm's _warps_refusal, a Refusal unless only the ping-pong chain's column
    passes serve the tile: on a target with wgmma, a tile N over 256 that is a multiple of
    PASS_COLUMNS, whose accumulators fit one pass at a time. That refusal is returned as text,
    for ScheduleDraft.mma_sync_refusal (the other chain schedules refuse it)."""
    refusal = _warps_refusal(gemm, tgt)
    if refusal is None:
        return ""
    n = gemm.tile.n
    if (tgt.has(Instruction.WGMMA) and n > 256 and n % PASS_COLUMNS == 0
            and _warps_refusal(gemm, tgt, PASS_COLUMNS) is None):
        return refusal
    return Refusal(refusal, loc=gemm.tile.loc)


@functools.lru_cache(maxsize=256)
def _steps(which: str, tile: SmemTile, k_major: bool, threads: int, warp_tile: tuple[int, int],
           copy_threads: int, warps_n: int, tile_k: int):
    """Prove the per-thread offset tables of copies (by the `copy_threads` first threads) and
    fragment loads (by all `threads`; see plan.OperandPlan), of the gemm's `warps_n` and tile
    K; once per process (the builder plans one operand for many candidates: a hot spot)."""
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
    fmap = fragments.ldmatrix_map(which, k_major, tile.dtype.nbytes)
    if which == "a":
        frags, warp_of = warp_tile[0] // 16, lambda t: (t // 32) // warps_n * warp_tile[0]
    else:
        frags, warp_of = warp_tile[1] // 16, lambda t: (t // 32) % warps_n * warp_tile[1]
    k_steps = tile_k // fragments.k_step(tile.dtype.nbytes)
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
               inner: int, prefix: str) -> SmemTile | Refusal:
    tile = swizzle.make_tile(f"{prefix}{which}_smem", dtype, outer, inner, gemm.stages.count)
    if tile is None:
        extent = "K" if k_major else ("M" if which == "a" else "N")
        return Refusal(
            f"the {which.upper()} tile's contiguous extent ({extent} = {inner} elements, "
            f"{inner * dtype.nbytes} bytes) must be 32, 64 or a multiple of 128 bytes",
            loc=gemm.tile.loc)
    return tile


def operand(gemm: ir.Gemm, which: str, param: ir.Param, k_major: bool, outer: int, inner: int,
            threads: int, prefix: str = "") -> OperandPlan | Refusal:
    """_operand, any refusal located at the tile line."""
    plan = _operand(gemm, which, param, k_major, outer, inner, threads, prefix)
    if isinstance(plan, str):
        return Refusal(plan, loc=gemm.tile.loc)
    return plan


def _operand(
    gemm: ir.Gemm, which: str, param: ir.Param, k_major: bool, outer: int, inner: int, threads: int,
    prefix: str = "",
) -> OperandPlan | str | Refusal:
    """The operand's tile as the sm_80 mainloop copies and reads it, or why it cannot (its shared
    tile's own refusal a Refusal: no other mainloop takes that tile either)."""
    dtype = param.dtype
    tile = _smem_tile(gemm, which, dtype, k_major, outer, inner, prefix)
    if isinstance(tile, Refusal):
        return tile
    chunks = outer * inner * dtype.nbytes // swizzle.CHUNK_BYTES
    # a stage of fewer chunks than threads (a narrow B tile): the first `chunks` threads copy
    copy_threads = min(chunks, threads)
    if chunks % copy_threads or threads % copy_threads:
        return (f"one stage of the {which.upper()} tile is {chunks} 16-byte copies, which do not "
                f"divide over {threads} threads; use a larger tile or fewer warps")
    warp_tile = (gemm.tile.m // gemm.warps.m, gemm.tile.n // gemm.warps.n)
    steps = _steps(which, tile, k_major, threads, warp_tile, copy_threads, gemm.warps.n,
                   gemm.tile.k)
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
    """plan, its refusal raised."""
    planned = plan(kernel, gemm, tgt, prefix, a_threads)
    if isinstance(planned, Refusal):
        raise raised(planned)
    return planned


def plan(kernel: ir.Kernel, gemm: ir.Gemm, tgt: Target, prefix: str = "",
         a_threads: int | None = None) -> tuple[dict, str] | Refusal:
    """Returns the mainloop fields of plan.GemmPlan for `gemm`, and why the mma.sync mainloop
    cannot run its tile where only the warp-specialized kernels can ("": it can), or the
    rule that refuses it (located); its shared-memory tiles are named `<prefix>a_smem` and
    `<prefix>b_smem` (a chain prefixes them with the gemm's name). `a_threads`: the threads
    that copy A, when not the gemm's own (producer warps, whose ring may be deeper)."""
    a = kernel.param(gemm.a.name)
    b = kernel.param(gemm.b.name)
    if a is None or b is None:
        raise KgenError(gemm.loc, "chained gemms are not supported by this kgen version yet")
    refused = tile_refusal(gemm, tgt, RING_MAX_STAGES if a_threads else MAX_STAGES,
                           elem_bytes=a.dtype.nbytes)
    if refused is not None:
        return refused
    t, w = gemm.tile, gemm.warps
    threads = w.m * w.n * 32
    a_k_major = a.layout is ir.Layout.ROW
    b_k_major = b.layout is ir.Layout.COL
    a_shape = (t.m, t.k) if a_k_major else (t.k, t.m)
    b_shape = (t.n, t.k) if b_k_major else (t.k, t.n)
    refusal = _warps_refusal(gemm, tgt)
    if refusal is None:
        a_plan = _operand(gemm, "a", a, a_k_major, *a_shape, a_threads or threads, prefix)
        if isinstance(a_plan, Refusal):
            return a_plan
        b_plan = _operand(gemm, "b", b, b_k_major, *b_shape, threads, prefix)
        if isinstance(b_plan, Refusal):
            return b_plan
        refusal = next((p for p in (a_plan, b_plan) if isinstance(p, str)), None)
    if refusal is not None:  # every such refusal points at the tile line
        if not (len(kernel.gemms) == 1 and tgt.has(Instruction.WGMMA) and tgt.tma):
            return Refusal(refusal, loc=gemm.tile.loc)
        a_plan = _tma_operand(gemm, "a", a, a_k_major, *a_shape, prefix)
        if isinstance(a_plan, Refusal):
            return a_plan
        b_plan = _tma_operand(gemm, "b", b, b_k_major, *b_shape, prefix)
        if isinstance(b_plan, Refusal):
            return b_plan
    # logical shapes: A is [M, K] and B is [K, N] in either layout
    fields = gemm_fields(gemm, tgt, a_plan, b_plan, a.shape[0], b.shape[1], a.shape[1])
    fields["producer_threads"] = a_threads or 0
    fields["scales"] = scale_plans(kernel, gemm)
    return fields, refusal or ""


def scale_plans(kernel: ir.Kernel, gemm: ir.Gemm) -> tuple[ScalePlan, ...]:
    """The gemm's block scales as the kernel reads them (verify checked them), A's first."""
    which = {gemm.a.name: "A", gemm.b.name: "B"}
    scales = sorted(gemm.scales, key=lambda s: which[s.operand])
    return tuple(ScalePlan(which[s.operand], s.param, tuple(s.block),
                           kernel.param(s.param).layout) for s in scales)


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
                 inner: int, prefix: str) -> OperandPlan | Refusal:
    """An operand tile that only the copy engine loads and wgmma reads: its shared-memory tile,
    without the sm_80 mainloop's copies and fragment loads."""
    tile = _smem_tile(gemm, which, param.dtype, k_major, outer, inner, prefix)
    if isinstance(tile, Refusal):
        return tile
    return OperandPlan(param=param.name, dtype=param.dtype, k_major=k_major, smem=tile,
                       copies_per_thread=0, ldmatrix_trans=not k_major, copy_steps=(),
                       copy_row_step=0, frag_steps=())


def gemm_fields(gemm: ir.Gemm, tgt: Target, a_plan, b_plan, m_dim, n_dim, k_dim) -> dict:
    """The plan.GemmPlan fields every mainloop shares: tile, warps, fragments, operands, dims."""
    t, w = gemm.tile, gemm.warps
    mma = tgt.mma_shape
    if b_plan.dtype.fp8:  # m16n8k32: the k step of 32 bytes in 8-bit elements (B: a chained
        # gemm has no A plan; verify: FP8 operands come in pairs)
        mma = (mma[0], mma[1], fragments.k_step(b_plan.dtype.nbytes))
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
