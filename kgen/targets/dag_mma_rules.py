"""The rulebook of the sm_80 DAG loop's mma.sync skeleton's body (the attention backward,
templates/common/loop_bwd.cu.j2; kgen/targets/loop_rules.py's DAG section holds its
configuration, registers and refusals): how the skeleton lays its blocks out in loops and how far
it unrolls the score gemms' k16 steps, with why and what was measured; its launch bounds. Read
by kgen/targets/common/loop_dag.py and kgen/lower/loop_dag.py."""
from __future__ import annotations

from contextlib import contextmanager

# The compact body, where the plan's register estimate (loop_rules.dag_registers) is above
# DAG_COMPACT_REGISTERS: the skeleton walks its blocks in one loop whose branches are the fast
# body and the checked one (not three loops: the checked blocks before the fast ones, the fast
# ones, the checked ones after, the accumulators live across all three), and runs a score gemm's
# k16 steps (S^T = K Q^T, dP^T = V dO^T: [16, block] a warp) one at a time (`#pragma unroll 1`:
# not every step's B fragments loaded ahead). NVRTC 13.5, (N, tile): spills (sm_80 / sm_90a
# builds of the sm_80 plan; ptxas -v, and the SASS by nvdisasm for where the spills sit):
#   (128, 128x64) three loops, unrolled: 44-48 B without a mask, 336-400 B causal (spill loads
#     inside the fast loop); three loops, one step at a time: 0, causal 180-188 B; one loop,
#     unrolled: 8-16 B; one loop, one step at a time: 0 at 254-255 registers, both masks, both
#     builds, bf16 and f16 (tests/targets/test_loop_dag_compile.py); the forward's mods there:
#     softcap 0-16 B, the bias gradient causal 0-8 B, alibi, window, document, dropout, GQA,
#     deterministic 0 (at 128x32 in three loops softcap causal spilled 180-200 B)
#   (64, 128x64) three loops, unrolled: 0 (the dropout mask 4-12 B); one loop: 0-4 B, the
#     dropout mask 72-88 B; and there the score steps unrolled by two (one at a time not
#     measured) ran 8 % slower on the H200 (183.9 / 201.0 TFLOP/s at S 4096, 170.1 / 178.0
#     causal: four k16 steps at head dim 64, their loads not hidden)
# On the H200 (sm_90a build of the sm_80 plan, bf16, 16k tokens, 16 heads, TFLOP/s, one run,
# before the compact body: 128x64 in three loops with the score steps one at a time, against
# 128x32 as the rulebook had it; that 128x64 build also had the block's barriers moved, which at
# 128x32 measured 202.2 against 200.2, noise): S 4096 209.8 / 200.2, S 1024 195.7 / 185.8
# without a mask; causal 173.3 / 182.7 and 144.3 / 151.0 (that build spilled 188 B causal). The
# compact body's own figures: not measured yet (bench/attention_bwd.py's kgen_mma_sync column).
# So the compact body where the estimate says the registers are short (head dim 128 at 128x64:
# 320), the unrolled three loops at or below it (head dim 64 at 128x64: 256).
DAG_COMPACT_REGISTERS = 256


# The warp grid (below) runs the compact body from DAG_GRID_COMPACT_N (the accumulators' widest
# N) on, whatever the estimate: at 128x32, head dim 128 (estimate 240), its three loops spilled
# 4-20 B without a mask and 8-96 B causal (sm_80 / sm_90a builds; the accumulating gemms one
# k16 step at a time: 0 / 28-60 B), its compact body 0 at 214-226 registers.
DAG_GRID_COMPACT_N = 128


def dag_compact_body(registers: int, grid_n: int | None = None) -> tuple[bool, str]:
    """Whether the mma.sync skeleton runs its compact body at the estimate `registers` (the
    plan's), with why; `grid_n`: the accumulators' widest N in the warp grid (None: the warp
    rows)."""
    if (grid_n is not None and grid_n >= DAG_GRID_COMPACT_N
            and registers <= DAG_COMPACT_REGISTERS):
        return True, (f"the warp grid at N {grid_n} (kgen/targets/dag_mma_rules.py, "
                      "DAG_GRID_COMPACT_N)")
    if registers <= DAG_COMPACT_REGISTERS:
        return False, ""
    return True, f"about {registers} registers a thread (kgen/targets/dag_mma_rules.py)"


def dag_min_ctas(registers: int, warps: int) -> tuple[int, str]:
    """The CTAs per SM of the launch bounds at the plan's estimate `registers` a thread."""
    if registers * warps * 32 * 2 <= 65536:
        return 2, f"about {registers} registers a thread: two CTAs fit an SM's registers"
    return 1, (f"about {registers} registers a thread: one CTA per SM, so ptxas takes the "
               "registers it needs rather than spill to fit two")


# The warp layout (plan.loop_dag.DagGrid). The warp rows (each warp 16 of the keys of every
# score tile and accumulator; the values handed on to dV += P^T dO and dK += dS^T Q stay in
# registers as the A operand) read shared memory more per MMA than FlashAttention-2's sm_80
# layout (flash_bwd_kernel.h, kernel_traits.h at head dim 128: kBlockM 64 x kBlockN 128, 8
# warps, AtomLayoutMSdP 2, AtomLayoutNdKV 4, AtomLayoutMdQ 2): a warp computing an [m, n] share
# per k16 step loads m/16 A and n/16 B ldmatrix.x4 for m/16 * n/8 MMAs. Per block of 64 queries
# x 128 keys at head dim 128 (8 warps, x4 loads / MMAs):
#   the warp rows: S^T, dP^T [16, 64] a warp: 2 x 320 / 512; dV, dK [16, 128], A in
#     registers: 2 x 256 / 512; dQ [16, 64]: 320 / 512; 1472 loads for 2560 MMAs (0.58)
#   the grid: S^T, dP^T over 4 x 2 warps ([32, 32]): 2 x 256; P^T and dS^T staged (P^T's 16
#     KiB more; each staged value written once, 16 32-bit stores a thread); dV, dK over 4 x 2
#     ([32, 64], A by ldmatrix from the staged tile): 2 x 192; dQ over 2 x 4 ([32, 32]): 256;
#     1152 loads (0.45), -22 %
# The score tiles' grid (each warp reads half of the block's Q / dO, not all of it) and the
# accumulating gemms' (two m16 tiles a warp share each B load) remove 128 loads each, dQ's 64.
# The score tiles' grid needs P^T, dS^T in shared memory (a warp's [32 keys, 32 queries] share
# is not the A operand of its [32 keys, N] share of dV), which in turn lets dV, dK take the
# 4 x 2 grid. At head dim 64: 768 -> 704 loads for 1280 MMAs (-8 %, the score tiles' alone:
# dV's, dK's [32, 32] and dQ's [32, 16] shares load as many as the rows'). Registers: the handed fragments (2 x block / 4 words) are gone, the A fragments of
# two m16 tiles live per k16 step; in the compact body the accumulating gemms' k16 steps run
# one at a time too (fully unrolled, softcap at head dim 128 spilled 188-208 B, document masks
# 24 B, dropout 12-24 B; one at a time 0 there, softcap 52 B). Plain, both masks, head dims 64
# and 128, sm_80 and sm_90a builds: 0 spills (226-255 registers).
# On the H200: not measured yet (bench/attention_bwd.py --mma-layouts: kgen_mma_sync and
# kgen_mma_grid side by side). DAG_WARP_GRID is the rulebook's default: the warp rows until
# measured; set it True where the grid is faster.
DAG_WARP_GRID = False
DAG_GRID_SCORE = (4, 2)  # warps along the tile's rows (keys), along the block (queries)
DAG_GRID_ACC = (4, 2)  # along the rows, along N
DAG_GRID_LOOP_ROW = (2, 4)  # along the block, along N
DAG_GRID_REDUCE_WHY = ("a row of the score tiles or of the accumulators lies across two warps "
                       "there: a row's reduction or store needs shared memory (not yet)")
# The bodies where the grid spilled and the warp rows did not (NVRTC 13.5, the sm_80 plan
# built for sm_80 / sm_90a, bytes of spill stores / loads; tests/targets/test_loop_dag_grid.py):
# softcap's tanh at head dim 64 causal 0 / 4-8 (rows 0), at 128 causal 52-84 (rows 8-16), not
# causal 8-32 (rows 0-32); the bias gradient's tile store at 128 without a mask 0 / 56-64 (rows
# 0), causal 0 / 4-12 (rows 0 / 8-16), at 64: 0; a block mask's walk at 128 16-48 / 36-96
# (rows 0), at 64: 0. ALiBi, a window, document masks, a bias, dropout, GQA, deterministic,
# packed sequences: 0 at 64 and 128, as the warp rows.
DAG_GRID_SPILLS_WHY = ("the warp grid spilled there and the warp rows did not (NVRTC 13.5: "
                       "kgen/targets/dag_mma_rules.py)")
DAG_GRID_HEAVY_N = 128  # a tile store or a block mask refuses the grid from this N on
# A value the grid stages for an accumulating gemm only (P^T) keeps its bytes to the block's
# end: else the storage planner gives dS^T the same bytes (their phases apart) and dS^T's
# writes wait on a barrier for every warp's P^T reads (dV's MMAs), a fifth barrier a block.
# At head dim 128 on sm_80: 164,864 B of 166,912 (148,480 shared). The grid's shared-memory
# refusal counts every staged value's own bytes, so this never refuses more.
DAG_GRID_OWN_BYTES = True


def dag_warp_grid(tile_m: int, block: int, warps: int, acc_ns: tuple[int, ...],
                  loop_row_ns: tuple[int, ...], smem_bytes: int, smem_limit: int,
                  unsupported: str | None,
                  wanted: bool | None = None) -> tuple[tuple | None, str]:
    """The warp grid ((score, acc, loop_row) pairs: plan.loop_dag.DagGrid's) or None (the warp
    rows), with why. `smem_bytes`: the skeleton's shared memory with the handed values staged
    (each its own tile, before the storage planner shares bytes); `unsupported`: what of the loop
    the grid does not take (a row reduction or store: DAG_GRID_REDUCE_WHY; a body it spilled
    on: DAG_GRID_SPILLS_WHY), if any; `wanted`: DAG_WARP_GRID unless given (a plan option)."""
    wanted = DAG_WARP_GRID if wanted is None else wanted
    if not wanted:
        return None, ("each warp 16 of the rows (DAG_WARP_GRID off: the warp grid is not yet "
                      "measured faster; kgen/targets/dag_mma_rules.py)")
    refused = None
    (sm, sn), (am, an), (lm, ln) = DAG_GRID_SCORE, DAG_GRID_ACC, DAG_GRID_LOOP_ROW
    if not sm * sn == am * an == lm * ln == warps or tile_m != 16 * warps:
        refused = f"{warps} warps of 16 rows: the grids are of {sm * sn}"
    elif tile_m % (16 * sm) or block % (16 * sn):
        refused = (f"tile {tile_m}x{block}: the score tiles' {sm} x {sn} grid needs m16 / n16 "
                   "shares")
    elif any(n % (16 * an) for n in acc_ns):
        refused = f"the accumulators' N {acc_ns}: the {am} x {an} grid needs 16-column shares"
    elif block % (16 * lm) or any(n % (16 * ln) for n in loop_row_ns):
        refused = (f"a loop-row tile [{block}, N {loop_row_ns}]: the {lm} x {ln} grid needs m16 "
                   "tiles and 16-column shares")
    elif unsupported is not None:
        refused = unsupported
    elif smem_bytes > smem_limit:
        refused = (f"{smem_bytes} B of shared memory with the handed values staged; "
                   f"{smem_limit} B allowed")
    if refused is not None:
        return None, "each warp 16 of the rows: the warp grid refused: " + refused
    return (DAG_GRID_SCORE, DAG_GRID_ACC, DAG_GRID_LOOP_ROW), (
        f"FlashAttention-2's sm_80 warp layout: score tiles over {sm} x {sn} warps, the "
        f"accumulators over {am} x {an}, a loop-row tile over {lm} x {ln}, the values handed on "
        "staged in shared memory: fewer ldmatrix per MMA (kgen/targets/dag_mma_rules.py)")


@contextmanager
def warp_grid(on: bool):
    """A plan option for the bench and the tests: the DAG loops planned inside take the warp
    grid where dag_warp_grid allows it (`on`), else the warp rows, whatever DAG_WARP_GRID
    says."""
    global DAG_WARP_GRID
    before = DAG_WARP_GRID
    DAG_WARP_GRID = on
    try:
        yield
    finally:
        DAG_WARP_GRID = before
