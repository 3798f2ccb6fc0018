"""Chain pass: back-to-back gemms, `gemm g1 = g0 @ B1 { keep registers|smem ... }`.

Checks the rules that let a CTA keep g0's output on chip (CUTLASS example 13's), each with a
located message naming the rule, and lays out the chained gemms' operands:

    tile M     every stage uses the same CTA tile M (a CTA owns the same rows throughout)
    N covered  a stage that feeds another computes its whole N in one CTA: its N is a fixed
               size and its CTA tile N equals it (the next stage's K is all there)
    warps      every stage runs on the same number of warps; `keep registers` also needs every
               warp to own whole rows (warps Nx1 in both stages, so equal warp tiles along M)
    K tile     the chained stage's tile K divides its K (the source's N)
    dtypes     one MMA operand dtype for the whole chain; no reductions in a chained kernel

`keep registers`: the source's f32 accumulators, after its epilogue, are rounded once to the
operand dtype and repacked in registers as A fragments. `keep smem`: the source's epilogue
writes a TILE_M x N tile (K-major for the next stage, swizzled like any operand tile) that the
next stage reads with ldmatrix; this lifts the warp rule. Without `keep`, registers when the
warp rule holds, else smem. The grid has one CTA per (tile M, tile N of the last stage): when
the last stage's tile N is smaller than its N, the CTAs along N each recompute the earlier
stages for their rows (correct, at the cost of that work).
"""
from __future__ import annotations

from .. import ir
from ..plan import ChainPlan, OperandPlan
from ..targets import Target
from ..targets.rules import Refusal
from . import fragments, mainloop, swizzle


def _first(*locs):
    return next((loc for loc in locs if loc is not None and loc.line), locs[-1])


def residency(source: ir.Gemm, gemm: ir.Gemm) -> ir.Residency:
    """The residency `gemm` asked for, or registers when the warp rule allows it."""
    if gemm.keep is not None:
        return gemm.keep
    whole_rows = source.warps.n == 1 and gemm.warps.n == 1 and source.warps.m == gemm.warps.m
    return ir.Residency.REGISTERS if whole_rows else ir.Residency.SMEM


def _n_of(kernel: ir.Kernel, gemm: ir.Gemm) -> ir.Dim:
    return kernel.param(gemm.b.name).shape[1]


def _operand_dtype(kernel: ir.Kernel, gemm: ir.Gemm) -> ir.DType:
    return kernel.param(gemm.b.name).dtype


def check(kernel: ir.Kernel) -> None:
    """Raise a located KgenError for the first chain rule a kernel breaks."""
    refused = refusal(kernel)
    if refused is not None:
        raise mainloop.raised(refused)


def refusal(kernel: ir.Kernel) -> Refusal | None:
    """The first chain rule a kernel breaks, located (None: it keeps them all)."""
    gemms = kernel.gemms
    if len(gemms) < 2:
        return None
    for g in gemms:
        for stmt in g.epilogue.reductions:
            return Refusal(
                "reductions in a kernel of chained gemms are not supported by this kgen "
                "version yet",
                loc=_first(stmt.value.loc, stmt.loc, g.loc))
    first = gemms[0]
    for g in gemms[1:]:
        source = kernel.gemm(g.a.name)
        if source is None:
            return Refusal(
                f"gemm '{g.name}' reads tensor '{g.a.name}': in a kernel of several gemms, "
                f"each gemm after the first takes the gemm before it as its A operand",
                loc=_first(g.a.loc, g.loc))
        if gemms.index(source) != gemms.index(g) - 1:
            return Refusal(
                f"gemm '{g.name}' must chain from the gemm just before it",
                loc=_first(g.a.loc, g.loc))
        if g.tile.m != first.tile.m:
            return Refusal(
                f"CTA tile M must be the same in every stage ({first.name} {first.tile.m}, "
                f"{g.name} {g.tile.m}): a CTA keeps the same rows through the chain",
                loc=_first(g.tile.loc, g.loc))
        n = _n_of(kernel, source)
        n_name = kernel.param(source.b.name).shape[1]
        if not isinstance(n, int):
            return Refusal(
                f"the N of {source.name} ({n_name}) must be a fixed size to keep its output on "
                f"chip for {g.name}: declare it as a number, e.g. {source.b.name} : "
                f"{kernel.param(source.b.name).dtype.dsl_name}[..., 64]",
                loc=_first(source.tile.loc, source.loc))
        if source.tile.n != n:
            return Refusal(
                f"CTA tile N of {source.name} ({source.tile.n}) must equal its N ({n}): a stage "
                f"that feeds {g.name} computes its whole output row in one CTA",
                loc=_first(source.tile.loc, source.loc))
        src_warps = source.warps.m * source.warps.n
        warps = g.warps.m * g.warps.n
        if src_warps != warps:
            return Refusal(
                f"every stage of a chain runs on the same warps: {source.name} has {src_warps} "
                f"({source.warps.m}x{source.warps.n}), {g.name} has {warps} "
                f"({g.warps.m}x{g.warps.n})",
                loc=_first(g.warps.loc, g.loc))
        if residency(source, g) is ir.Residency.REGISTERS:
            for stage in (source, g):
                if stage.warps.n != 1:
                    return Refusal(
                        f"keep registers needs every warp to own whole rows: warps of "
                        f"{stage.name} must be Nx1, got {stage.warps.m}x{stage.warps.n} "
                        f"(or keep {source.name} in smem)",
                        loc=_first(stage.warps.loc, stage.loc, g.loc))
        if n % g.tile.k:
            return Refusal(
                f"tile K of {g.name} ({g.tile.k}) must divide its K, the N of {source.name} "
                f"({n})",
                loc=_first(g.tile.loc, g.loc))
        src_dtype = _operand_dtype(kernel, source)
        if _operand_dtype(kernel, g) is not src_dtype:
            return Refusal(
                f"every stage of a chain must use one operand dtype ({source.name} "
                f"{src_dtype.dsl_name}, {g.name} {_operand_dtype(kernel, g).dsl_name})",
                loc=_first(g.b.loc, g.loc))
    return None


def intermediate_tile(kernel: ir.Kernel, source: ir.Gemm, gemm: ir.Gemm):
    """The shared-memory tile of the source's output: TILE_M rows of N contiguous elements."""
    n = _n_of(kernel, source)
    dtype = _operand_dtype(kernel, gemm)
    tile = swizzle.make_tile(f"{source.name}_smem", dtype, gemm.tile.m, n, 1)
    if tile is None:
        return Refusal(
            f"keep {source.name} in smem: its rows ({n} elements, {n * dtype.nbytes} bytes) "
            "must be 32, 64 or a multiple of 128 bytes wide to be swizzled",
            loc=_first(gemm.loc))
    return tile


def _a_from_smem(gemm: ir.Gemm, tile, threads: int) -> OperandPlan | Refusal:
    """The intermediate as an A operand: every k16 step of the whole K, read by ldmatrix."""
    warp_tile_m = gemm.tile.m // gemm.warps.m
    fmap = fragments.LDMATRIX[("a", True)]
    frags = warp_tile_m // 16
    steps = [(kk, f) for kk in range(tile.inner // 16) for f in range(frags)]

    def warp_of(t: int) -> int:
        return (t // 32) // gemm.warps.n * warp_tile_m

    def frag_at(t: int, step: tuple[int, int]) -> int:
        return tile.offset(*fmap.coord(t % 32, warp_of(t), step[1], step[0]))

    flat = fragments.split_offsets(lambda t: frag_at(t, (0, 0)), frag_at, range(threads), steps)
    if flat is None:
        return Refusal(f"kgen cannot lay out the A fragments of {gemm.name} with per-thread "
                       "constant offsets; try another warp grid", loc=gemm.tile.loc)
    k_steps = tile.inner // 16
    frag_steps = tuple(tuple(flat[kk * frags:(kk + 1) * frags]) for kk in range(k_steps))
    return OperandPlan(
        param=gemm.a.name, dtype=tile.dtype, k_major=True, smem=tile, copies_per_thread=0,
        ldmatrix_trans=False, copy_steps=(), copy_row_step=0, frag_steps=frag_steps,
    )


def run(kernel: ir.Kernel, gemm: ir.Gemm, tgt: Target) -> tuple[dict, str]:
    """plan, its refusal raised."""
    planned = plan(kernel, gemm, tgt)
    if isinstance(planned, Refusal):
        raise mainloop.raised(planned)
    return planned


def plan(kernel: ir.Kernel, gemm: ir.Gemm, tgt: Target) -> tuple[dict, str] | Refusal:
    """The mainloop fields of plan.GemmPlan for a chained `gemm` (its A is an earlier gemm),
    and why the mma.sync mainloop cannot run its tile where only the ping-pong chain's column
    passes serve it ("": it can; mainloop.chained_refusal), or the rule that refuses it
    (located)."""
    source = kernel.gemm(gemm.a.name)
    refused = mainloop.tile_refusal(gemm, tgt, chained=True)
    if refused is not None:
        return refused
    mma_sync_refusal = mainloop.chained_refusal(gemm, tgt)
    if isinstance(mma_sync_refusal, Refusal):
        return mma_sync_refusal
    t, w = gemm.tile, gemm.warps
    threads = w.m * w.n * 32
    b = kernel.param(gemm.b.name)
    b_k_major = b.layout is ir.Layout.COL
    b_plan = mainloop.operand(
        gemm, "b", b, b_k_major, *((t.n, t.k) if b_k_major else (t.k, t.n)), threads,
        f"{gemm.name}_",
    )
    if isinstance(b_plan, Refusal):
        return b_plan
    keep = residency(source, gemm)
    k = _n_of(kernel, source)
    a_plan = None
    if keep is ir.Residency.SMEM:
        tile = intermediate_tile(kernel, source, gemm)
        if isinstance(tile, Refusal):
            return tile
        a_plan = _a_from_smem(gemm, tile, threads)
        if isinstance(a_plan, Refusal):
            return a_plan
    first_a = kernel.param(kernel.gemms[0].a.name)
    fields = mainloop.gemm_fields(gemm, tgt, a_plan, b_plan, first_a.shape[0], b.shape[1],
                                  b.shape[0])
    fields["chain"] = ChainPlan(source=source.name, residency=keep, dtype=b.dtype, k=k,
                                k_steps=k // 16)
    return fields, mma_sync_refusal
