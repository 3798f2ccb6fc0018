"""The rulebook's schedule of the sm_90a DAG loop's wgmma skeleton (the attention backward;
kgen/targets/loop_rules.py's DAG wgmma section holds its configuration and refusal): which of
the consumers' wgmma groups run ahead or behind, whether the producer stages the vectors read at
`col`, and the CTAs' launch order, each with why and what was measured. Read by
kgen/targets/sm90/loop_dag_schedule.py (the plan's DagWgmma) and loop_rules (registers, shared
memory)."""
from __future__ import annotations

# The schedule of the consumers' wgmma groups and the vectors' staging (kgen/plan/loop_dag.py,
# DagWgmma; plan options loop_dag_schedule.with_schedule). Measured on an H200 (2026-11-29,
# bench/attention_bwd.py --variants, bf16, 16k tokens, 16 heads, S 4096, TFLOP/s of the main
# kernel). First run (cuDNN's backward 558 / 492 / 454 / 373 at D 128, 128 causal, 64, 64
# causal): the rulebook of the session before / each option alone / together:
#   D 128:        359 / ahead 342, vectors 384, defer 371 / vectors+defer 397
#   D 128 causal: 262 / ahead 288, vectors 337, defer 270, lpt 274 / vectors+defer+lpt 375
#   D 64:         261 / ahead 263, vectors 284, defer 261 / all four 295 (ahead+vectors 297)
#   D 64 causal:  172 / ahead 184, vectors 246, defer 173, lpt 175 / all four 275
# Second run, with the fast body (cuDNN 575 / 492 / 456): every option off / without the fast
# body / the rulebook's choice (the fast body; ahead at D 64 only) / ahead at D 128 too:
#   D 128:        361 / 400 / 422 / 424
#   D 128 causal: 264 / 377 / 404 / 399
#   D 64:         263 / 298 / 312
# Every schedule matched the float64 reference (tests/gpu/test_attention_bwd_gpu.py, the
# rulebook's and test_sm90a_wgmma_schedules: each option off, all off, all on, ragged S and T,
# every mask, D 64 and 128: 363 passed); compute-sanitizer racecheck 0 hazards (D 64 and 128)
# and synccheck 0 errors (D 128) on the rulebook's build (bench/attention_bwd.py --once).
# What is left (timing-only ablations of the rulebook's build in the second run, wrong results
# on purpose): without dQ's bulk reduce-adds 552 at D 128 (1.31x), 401 at D 64 (1.30x);
# without the consumers' barrier 1.04x / 1.03x; without the exponentials 1.06x / 1.09x. dQ's
# adds (a bulk add per staged row: 64 per warpgroup per block) were the largest item; the
# tensor reduce-adds below replaced them.
#
# dQ's adds (loop_dag_schedule.ADD_MODES; plan option with_adds). Measured on an H200
# (2026-11-29, bench/attention_bwd.py --variants base base+tensor base+rows, bf16, 16k tokens,
# 16 heads, TFLOP/s of the main kernel; all three matched the rulebook's build within 2e-7):
# the add warp / a thread of each warpgroup / a bulk add per staged row (the rulebook before) /
# cuDNN's backward:
#   D 128 S 4096:          527 / 507 / 421 / 572     causal 489 / 459 / 400 / 488
#   D 128 S 16384:         517 / 499 / 435 / 540     causal 510 / 489 / 438 / 532
#   D 64 S 4096:           388 / 373 / 309 / 451     causal 362 / 344 / 289 / 370
#   D 64 S 16384:          403 / 389 / 321 / 449     causal 409 / 386 / 317 / 453
# The add warp 1.16-1.29x the rows' (geomean 1.23x), 1.03-1.07x the per-warpgroup issue;
# 0.93x cuDNN geomean over these eight (0.86x at worst, D 64 S 4096), the rows' 0.76x.
# tests/gpu/test_attention_bwd_gpu.py, _gqa_gpu.py (GQA, deterministic bits), _grad_gpu.py,
# the nvcc launcher's: 174 passed; compute-sanitizer racecheck 0 hazards (D 64 and 128; D 128
# GQA deterministic), memcheck no device error (bench/attention_bwd.py --once).
#
# The copy engine's tensor reduce-add of each consumer warpgroup's [block, N / 2] share, staged
# as boxes of [block][32] f32 in the 128-byte swizzle (a warp's fragment writes meet 2-way bank
# conflicts at most). Issued by a thread of each warpgroup (the plan option "tensor"): after a
# warpgroup barrier (named barrier 2 + warpgroup); it waits for the previous block's adds to
# have read the staging before the consumers' barrier of the loop-row gemm (a block later).
# Rows past the loop's end are clipped by the copy engine (the staging needs no zeros).
DAG_WGMMA_TENSOR_ADD = True
DAG_WGMMA_ADD_BOX_COLS = 32  # f32 columns of a box: 128 bytes, the swizzle's row
DAG_WGMMA_TENSOR_ADD_WHY = (
    "a warpgroup's share of the tile added at once by the copy engine (cp.reduce.async.bulk"
    ".tensor through the tensor's map; 1-2 operations a warpgroup and block instead of a bulk "
    "add per staged row, 64): measured on an H200 1.11-1.22x the rows' speed (D 64 and 128, "
    "S 4096 and 16384)")
# FlashAttention-3's way: the tensor reduce-adds issued by a warp of the producer warpgroup
# (warp 2), the consumers arriving on a named barrier once their shares are staged (no wait)
# and syncing on another, with the add warp, where they already synced (the loop-row gemm's
# barrier): the staging is free again. In deterministic mode the add warp waits on the
# semaphores, the consumers not at all (one semaphore per block: the CTA's whole tile).
DAG_WGMMA_ADD_WARP = True
DAG_WGMMA_ADD_WARP_WHY = (
    "the consumers hand their staged shares to the producer warpgroup's add warp, which adds "
    "them by the copy engine's tensor reduce-adds (1-2 a warpgroup and block, not a bulk add "
    "per row) while they go on; its barrier replaces the loop-row gemm's (FlashAttention-3's "
    "dQ warp); in deterministic mode it alone waits on the semaphores; measured on an H200 "
    "1.16-1.29x the bulk adds per row (geomean 1.23x; D 64 and 128, S 4096 and 16384, causal "
    "and not), 1.03-1.07x the tensor adds issued by each warpgroup")
DAG_WGMMA_ROWS_ORDERED_WHY = (
    "deterministic mode's semaphores order each warp's rows (a bulk add per staged row); the "
    "tensor reduce-add per warpgroup is not built with them (the add warp's is)")
DAG_WGMMA_ROWS_PACKED_WHY = (
    "packed sequences add dQ a row at a time (a bulk add per staged row, each row inside its "
    "sequence); the tensor reduce-add's map of dQ is not built over packed sequences (its box "
    "would add the rows past a sequence's end into the next one's)")
DAG_WGMMA_ISSUE_AHEAD = True
# up to this N: at N 128 both score tiles in flight beside the two accumulators spill
# (NVRTC 13.5: 8-52 B) and measured no faster (424 against 422, causal 399 against 404)
DAG_WGMMA_AHEAD_N = 64
DAG_WGMMA_ISSUE_AHEAD_WHY = (
    "the later score gemm (dP^T = V dO^T) reads only shared tiles: issued with the first "
    "(FlashAttention-3's order), it runs while the first's epilogue (P) is computed")
DAG_WGMMA_DEFER_ACCUMULATING = True
DAG_WGMMA_DEFER_WHY = (
    "dK's wgmma issued after dQ's (FlashAttention-3's order): it runs while dQ's tile is "
    "staged and added")
DAG_WGMMA_STAGE_VECTORS = True
DAG_WGMMA_STAGE_VECTORS_WHY = (
    "the vectors read at col (lse, D) staged per block by the producer's second warp (cp.async "
    "beside the copy engine's Q), one block ahead: the consumers read them from shared memory "
    "in the epilogues instead of waiting on 2 x block / 4 scattered global loads per thread "
    "(measured 1.07x at D 128, 1.43x at D 64 causal)")
# setmaxnreg (producer, consumers) where the producer's second warp stages the vectors: its
# copy loop beside thread 0's spills at 24 (NVRTC 13.5: 20 B), not at 40
DAG_WGMMA_VECTOR_REGISTERS = (40, 232)
DAG_WGMMA_LPT = True
DAG_WGMMA_LPT_L2_BYTES = 32 << 20
DAG_WGMMA_LPT_WHY = (
    "a causal mask's tiles of rows visit from the whole loop down to one block: launched in "
    "the grid's order the longest of the last (batch, head) pairs start last and run alone "
    "(FlashAttention-3's backward LPT order); in sections of pairs whose streamed tiles fit "
    "32 MiB of L2 (50 MiB on an H100/H200), so that a section's CTAs share them there "
    "(measured 1.06x at D 128 causal)")


def dag_wgmma_overlap_why(n: int, ahead: bool, wait: bool, defer: bool) -> str:
    parts = [f"N {n}: " + (
        "with an accumulating gemm in flight beside the next gemm (its A and accumulator "
        "held the while) the consumers spill (NVRTC 13; DAG_WGMMA_OVERLAP_N)" if wait else
        "the registers allow an accumulating gemm in flight until the next wait "
        "(DAG_WGMMA_OVERLAP_N): its result is read only after the loop")]
    parts.append(DAG_WGMMA_ISSUE_AHEAD_WHY if ahead else
                 "each score gemm issued at its statement (DAG_WGMMA_AHEAD_N: at this N two "
                 "score tiles in flight spill)")
    if defer:
        parts.append(DAG_WGMMA_DEFER_WHY)
    return "; ".join(parts) + "; one warpgroup's statements run while the other's gemms do"
# Deterministic mode's order (plan.deterministic; DagWgmma.descending; plan option
# with_schedule(descending=...)). The semaphores make each block's adds wait for the tile of
# rows next in the order. Under a mask whose bounds skip blocks (causal), a tile of rows starts
# at its diagonal block: tile t reaches block j at visit j - first(t), later than tile t + 1
# does. In increasing order each tile waits on every block for the one before, which arrives
# there later: the CTAs serialize along the diagonal (H200, D 128 S 4096: deterministic 1.25x
# the default's time, 2.20x causal; bench/attention_bwd.py --groups). In decreasing order (the
# diagonal's tile adds first, FlashAttention-3's deterministic causal backward) the tile waited
# for has reached the block earlier: the waits form a pipeline. Only the add warp waits, when it
# issues the block's adds (the consumers never do). The CTAs are launched in decreasing tile
# order (blockIdx.x 0 is the last tile) so that a tile waits only on a CTA launched before it
# (no deadlock when the grid exceeds the resident CTAs).
# Measured on an H200 (2026-11-29, bench/attention_bwd.py --groups --s 4096, bf16, D 128, 16
# heads, batch 4, the main kernel; deterministic's time over the default's, decreasing order /
# increasing (the option descending=False) in the same run): causal MHA 1.210x / 2.207x, causal
# GQA 16:2 1.138x / 1.314x (non-causal, one order: MHA 1.250x, GQA 1.043x). tests/gpu/
# test_attention_bwd_gqa_gpu.py and test_attention_varlen_bwd_gpu.py -k determin (bit-identical
# runs, float64 reference; every mask, MHA and GQA, warp / rows / atomics adds, packed): 27
# passed; compute-sanitizer racecheck 0 hazards (bench/attention_bwd.py --once --d 128 --gqa 2
# --deterministic, causal); NVRTC 13 spills 0 B (D 128 causal, MHA and GQA, either order).
DAG_WGMMA_DESCENDING = True
DAG_WGMMA_DESCENDING_WHY = (
    "a mask's bounds skip blocks: a tile of rows reaches a block after the tile after it does, "
    "so the tiles add each block in decreasing order (the diagonal's first, FlashAttention-3's "
    "deterministic causal order) and the semaphores' waits form a pipeline, not a chain along "
    "the diagonal; the CTAs launched in decreasing tile order (a waited-for tile launched "
    "first)")
DAG_WGMMA_ASCENDING_WHY = (
    "every tile of rows visits a block at the same visit (no bounds skip blocks): the tiles "
    "add each block in increasing order, the grid's order")
DAG_WGMMA_FAST_BODY = True
DAG_WGMMA_FAST_BODY_WHY = (
    "the mma.sync skeleton's split: inside the mask and before the last block, no element of "
    "a block is past the loop's end or masked, so its hand-on and staging selects and the "
    "mask's predicates go; a block branches to one of the two bodies (measured 1.05x at D 128, "
    "1.07x causal, 1.05x at D 64)")


def vector_bytes(vectors: int, stages: int, block: int) -> int:
    """The staged vectors' slots: `stages` of `block` f32 each."""
    return 4 * vectors * stages * block


def dag_division(shared: bool, wgmma: bool) -> tuple[str, str]:
    """A DAG loop's (the backward's) division by a row or uniform value: by the reciprocal on
    the wgmma skeleton; the mma.sync skeleton keeps a / b beside tanh.approx (a softcap's
    backward at D 128 spilled 32 B with both, none with either alone; NVRTC 13)."""
    if shared and not wgmma:
        return "none", ("a / b: on the mma.sync skeleton the reciprocal beside tanh.approx "
                        "spilled a softcap's backward (32 B at D 128), either alone did not")
    from .loop_rules import loop_division  # (loop_rules imports this module's schedule)

    return loop_division(shared)


# A tensor the body reads at (row, col) (the additive bias BiasT [keys, queries] of the
# attention backward): read per element from global memory in the score gemm's epilogue, the
# bias backward measured 1.60x the plain backward's time (H200, D 128, S 4096, bench/
# attention_bwd.py --mods). Staged as the forward stages its bias (kgen/targets/sm90/
# loop_schedule.py `_staging`, loop_rules.py "A tensor the body reads at (row, col)"): the
# producer's copy engine loads its [tile_m, block] tile per block into a ring of its own after
# the streamed operands, and each consumer warp takes its share by ldmatrix right after the
# score gemm it feeds (the forward's load_staged) and releases the slot. Slots: the most of
# DAG_WGMMA_BIAS_SLOTS that fit the shared memory (D 128: one, the tiles, vectors and dQ's add
# staging take 197 KiB; a slot is 16 KiB); one slot still overlaps, the consumers release it
# early in the block.
# Measured on an H200 (2026-11-29, bf16, D 128, S 4096, batch 4, 16 heads; the backward
# sequence against the plain one of the same run, 3.459 ms / causal 1.928 ms): the bias 1.03x
# (1.60x read per element), with its gradient (DAG_WGMMA_STORE_STAGED below) 1.05x (2.58x),
# causal 1.23x (4.39x: every block ran, each element stored from registers). Checked: tests/gpu/
# test_attention_grad_mods_gpu.py (the bias and dropout cases at D 64, the bias gradient at
# D 128: 59 passed), compute-sanitizer racecheck 0 hazards on the causal bias gradient
# (bench/attention_bwd.py --mods --once --only "bias grad causal"); NVRTC 13.5 spills 0 B (the
# per-element build 12 B, with the gradient 64 B).
DAG_WGMMA_STAGE_BIAS = True
DAG_WGMMA_BIAS_SLOTS = (2, 1)
DAG_WGMMA_STAGE_BIAS_WHY = (
    "read at (row, col) by the body: the producer's copy engine loads each block's tile after "
    "the streamed operands (zeros past the rows and the loop's end, as the body reads there), "
    "each consumer warp takes its share by ldmatrix after the score gemm it feeds and "
    "releases the slot, instead of a 2-byte global load per element (the forward's staging)")

# A score gemm's tile store (`dBiasT = dst`, the bias gradient) of the value a loop-row gemm
# also stages (dS^T, rounded to the operands' type in the 128-byte swizzle): stored from that
# staged slot by the copy engine (one thread a CTA, cp.async.bulk.tensor stores of the [tile_m,
# 64] boxes after the consumers' barrier that orders the slot's writes) instead of a 2-byte
# store per element from registers (the bias gradient measured 2.58x the plain backward's time
# with those, 1.60x of it the bias's read). The slot is rewritten two blocks later, after the
# storing thread waited for the copy engine's reads before the next block's barrier.
DAG_WGMMA_STORE_STAGED = True
DAG_WGMMA_STORE_STAGED_WHY = (
    "the stored value is the staged one: the copy engine writes the slot's boxes (one thread a "
    "CTA, after the consumers' barrier) instead of a 2-byte store per element; rows and columns "
    "past the tensor are not written")

