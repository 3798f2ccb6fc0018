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
# The accumulating gemms run beside the next gemm (waited with it) up to this N; past it they
# are waited for at once. NVRTC 13, bf16/f16, no mask and causal: N 64 0 spills either way; N
# 128 28-48 B of spills overlapped, 0 waited at once.
DAG_WGMMA_OVERLAP_N = 64
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
# The longest-first order ranks the tiles of rows by the linear bounds (a low tile of rows
# visits the most blocks); where only an equality skips blocks (a document mask: the blocks a
# tile visits follow the ids) no rank holds, and the grid's order stays, as before the equality
# was a bound (not measured against the sections' order).
DAG_WGMMA_LPT_EQUALITY_WHY = (
    "the grid's order: the longest-first order ranks the tiles of rows by a linear mask's "
    "bounds; the blocks an equality (a document mask) leaves a tile follow the ids")


def dag_wgmma_overlap_why(n: int, ahead: bool, wait: bool, defer: bool,
                          split: bool = False, defer_all: bool = False) -> str:
    parts = [f"N {n}: " + (
        "with an accumulating gemm in flight beside the next gemm (its A and accumulator "
        "held the while) the consumers spill (NVRTC 13; DAG_WGMMA_OVERLAP_N)" if wait else
        "the registers allow an accumulating gemm in flight until the next wait "
        "(DAG_WGMMA_OVERLAP_N): its result is read only after the loop")]
    parts.append(DAG_WGMMA_SPLIT_ISSUE_AHEAD_WHY if ahead and split else
                 DAG_WGMMA_ISSUE_AHEAD_WHY if ahead else
                 "each score gemm issued at its statement (the split layout: measured no "
                 "faster issued together; DAG_WGMMA_SPLIT_ISSUE_AHEAD)" if split else
                 "each score gemm issued at its statement (DAG_WGMMA_AHEAD_N: at this N two "
                 "score tiles in flight spill)")
    if defer:
        parts.append(DAG_WGMMA_SPLIT_DEFER_WHY if defer_all else DAG_WGMMA_DEFER_WHY)
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
# Deterministic mode's launch order (DagWgmma.lpt_l2_bytes with plan.deterministic; plan
# option with_schedule(lpt=False): the grid's order). In the grid's order a (batch, head)
# pair's tiles of rows launch together and reach each block together, so tile j adds it after
# the j before it: a lag of j adds' latencies (the add, its completion, the semaphore) that the
# tile carries to its end, the SM idle the while (H200, D 128 S 4096: 1.25x the default's
# time; GQA, whose tiles are 8 heads' visits long, 1.04x). Launched in sections of pairs
# sized to L2 as the longest-first order is, within a section the first tile of every pair,
# then the second, a pair's consecutive tiles launch a section's width of CTAs apart: the tile
# waited for has started earlier and reached the block first, and the wait stays one on a CTA
# launched before (no deadlock). Measured on an H200 (2026-11-30, bench/attention_bwd.py
# --groups --s 4096, the main kernel, deterministic's time over the default's, sections / the
# grid's order in the same run): D 128 1.238 / 1.249 (GQA 16:2 1.226 / 1.242), D 64 1.352 /
# 1.458 (GQA 1.366 / 1.384). Under a causal mask (the tiles' lengths differ) the sections lost:
# D 128 1.593 / 1.238 in decreasing order, 1.349 in increasing order (GQA 1.710 / 1.810), D 64
# 1.367 / 1.374: there the grid's order stays.
DAG_WGMMA_ORDERED_SECTIONS = True
DAG_WGMMA_ORDERED_SECTIONS_WHY = (
    "deterministic adds: in the grid's order a pair's tiles of rows start together and tile j "
    "waits for the j before it at every block (measured 1.25x the default's time at D 128 S "
    "4096); launched a section's width of CTAs apart, in sections of pairs whose streamed "
    "tiles fit 32 MiB of L2, the tile waited for started first and reaches the block first "
    "(measured 1.238x against 1.249x at D 128, 1.352x against 1.458x at D 64)")
DAG_WGMMA_ORDERED_SKIPS_WHY = (
    "the grid's order: deterministic adds under a mask whose bounds skip blocks (launched in "
    "sections measured 1.59x the default's time at D 128 causal, against 1.24x in the grid's "
    "order)")
DAG_WGMMA_FAST_BODY = True
DAG_WGMMA_FAST_BODY_WHY = (
    "the mma.sync skeleton's split: inside the mask and before the last block, no element of "
    "a block is past the loop's end or masked, so its hand-on and staging selects and the "
    "mask's predicates go; a block branches to one of the two bodies (measured 1.05x at D 128, "
    "1.07x causal, 1.05x at D 64)")
# GQA (a CTA per (key tile, KV head) walking the blocks of each query head of its group): the
# blocks inside the mask are the same in every query head's visits (the bounds depend on the
# rows and columns, not the head), so the fast body, the longest-first order (a tile's work is
# the group's heads times its blocks: the ranking by tile is MHA's) and the staged vectors (the
# producer's second warp takes each visit's head) are built with it. With deterministic adds at
# N above this (the plain layout; the add warp's semaphore waits beside the group walk) the fast
# body and the staged vectors stay off: with either the build spills (NVRTC 13.5, D 128 causal:
# 8 B stored, 32 B loaded with both; 0 B with neither, and at D 64 and 256 with both).
DAG_WGMMA_GQA_ORDERED_N = 64
DAG_WGMMA_GQA_ORDERED_WHY = (
    "GQA with deterministic adds at N {n}: with the fast body or the staged vectors the "
    "build spills (NVRTC 13.5: 4-8 B stored at D 128 causal; DAG_WGMMA_GQA_ORDERED_N)")


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
# A column-major one (the bias BiasT [keys, queries] declared `col`: the forward's attn_mask
# [B, H, S, T] seen transposed, kgen/attention_grad_mods.py `bias_layout`) is staged as its
# memory lies: the copy engine's boxes of [block][64 rows] (a query's 64 keys, 128 bytes, the
# 128-byte swizzle), the same bytes a slot; each consumer warp reads an 8x8 matrix's rows along
# the block (8 queries, 8 keys each) with ldmatrix .trans, which hands every thread the pair of
# its accumulator fragment (key, query and query + 1) as the row-major tile's ldmatrix does
# (templates/sm90/loop_staged_tile.inc.j2 `load_staged_trans`). Saves the transposed copy
# kgen.attention made per call (1.85 ms at D 128, S 4096, batch 4, 16 heads on an H200).
DAG_WGMMA_STAGE_BIAS_COL_WHY = (
    "; column-major, as its memory lies: boxes of [block][64 rows], each 8x8 matrix read by "
    "ldmatrix .trans into the accumulator's fragment (no transposed copy of the tensor)")

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

# The kernel's epilogue's tiles (dK and dV: a warpgroup's [64, N] in f32 accumulators) stored by
# the copy engine: after the loop every warpgroup is done with the Q and dO rings (one consumer
# barrier), so each warpgroup rounds its rows into a ring slot (slot c for warpgroup c: a slot
# of a 64-row block holds its 64 rows, each output in a ring of its columns) in the 128-byte
# swizzle and one thread stores the [64][64] boxes (rows past the tensor not written). Per
# element from registers (a bf16 pair a store, 64 stores a thread at D 128, each warp's store
# touching eight rows) the epilogue took 5.3-7.7 us a CTA on an H200 (D 128, S 4096, 16k
# tokens; %globaltimer read at the loop's end and after the stores, 3% of the CTAs sampled),
# two block visits' time (2.8-3.0 us a visit), while the tensor cores idle. Measured on an H200
# (2026-11-30, bench/attention_bwd.py --variants base regtail, bf16, 16k tokens, main kernel
# TFLOP/s, by the copy engine / from registers): D 128 S 1024 483.3 / 440.1, causal 360.1 /
# 321.7; S 4096 541.7 / 513.0, causal 520.5 / 480.4; D 64 S 1024 354.5 / 341.8, causal 262.6 /
# 245.4; S 4096 399.5 / 403.5 (noise), causal 374.6 / 366.7. The split layout (D 192, 256)
# keeps the registers' stores (its warpgroups hold column halves of the same 64 rows).
DAG_WGMMA_TAIL_TMA = True
DAG_WGMMA_TAIL_TMA_WHY = (
    "after the loop the rings are idle: each warpgroup rounds its rows of {names} into slot "
    "c of the ring of their columns (the 128-byte swizzle) and one thread stores the [64][64] "
    "boxes by the copy engine, instead of a 4-byte store per element pair from registers (5.3-"
    "7.7 us a CTA at D 128: dag_wgmma_rules.DAG_WGMMA_TAIL_TMA)")


# The split layout (FlashAttention-3's head dim 256 backward): where the plain layout's
# accumulators do not fit (128 keys a CTA, each consumer warpgroup carrying dK and dV [64 keys,
# D] in f32: 2 * 64 * D / 128 registers a thread, 256 at D 256), a CTA owns 64 keys and its two
# consumer warpgroups split dK and dV along D (each [64 keys, D / 2]: 2 * 64 * 128 / 128 = 128
# registers at D 256) and S^T, dP^T along the block's queries (each [64 keys, block / 2]: m64n32
# at a block of 64). P^T and dS^T are staged in shared memory (both warpgroups write their
# columns, a consumer barrier, then each reads the whole [64 keys, block] tile as the A operand
# of its dV and dK wgmmas, K-major, SS); dQ = dS K as the plain layout's loop-row gemm (each
# warpgroup D / 2 columns, A the staged dS^T MN-major). Shared memory at D 256: K, V 2 x 32
# KiB, Q, dO 2 x 2 x 32 KiB, P^T and dS^T 2 x 2 x 8 KiB = 224 KiB: dQ's f32 staging ([block,
# D / 2] per warpgroup, 64 KiB) does not fit beside it, so dQ is added by f32 atomics from
# registers (FlashAttention-2's way), or, a plan option, by the copy engine from the streamed
# slots (DAG_WGMMA_SPLIT_ADDS below). The bias's staged ring and the staged tile store are not
# built with the split (read and stored per element: a warpgroup's share is the block's
# columns, not the tile's rows those helpers take).
# Measured on an H200 (2026-11-29, bench/attention_bwd.py --d 256 --s 1024 4096 16384, bf16,
# 16k tokens, 16 heads, TFLOP/s of the main kernel with its dQ zeroing / cuDNN's backward /
# SDPA flash / memory-efficient): S 1024 270 / 305 / 204 / 59, causal 222 / 268 / 156 / 49;
# S 4096 298 / 383 / 244 / 45, causal 284 / 366 / 223 / 42; S 16384 293 / 354 / 261 / 48,
# causal 286 / 379 / 255 / 44: 0.81x cuDNN geomean (0.75-0.89), 4.6-6.8x memory-efficient.
# Schedules at S 4096 (--variants; each matched the rulebook's build within 1e-7): dP^T issued
# with S^T 301 / causal 287, and the accumulating gemms not waited at once 305 / 289, against
# the rulebook's 298 / 293: within the noise, so the rulebook keeps the plain layout's rules.
# Checked: tests/gpu/test_attention_bwd_d256_gpu.py (ragged S and T, every mask, bf16 and f16,
# GQA, deterministic bits, kgen.attention's mods: 79 passed); compute-sanitizer racecheck 0
# hazards (bench/attention_bwd.py --once --d 256); NVRTC 13.5 spills 0 B.
DAG_WGMMA_SPLIT = True
DAG_WGMMA_SPLIT_TILE = (64, 64, 2)  # keys per CTA, the block (queries), ring slots
DAG_WGMMA_SPLIT_CONSUMERS = 2
DAG_WGMMA_SPLIT_WHY = (
    "the plain layout's accumulators do not fit (two [64, N] f32 per warpgroup); FlashAttention"
    "-3's split: 64 keys a CTA, the two consumer warpgroups each hold dK and dV [64 keys, N / 2] "
    "(N / 2 registers a thread each) and compute S^T, dP^T on half the block's queries (m64n"
    "{half}); P^T and dS^T staged in shared memory, read whole by each warpgroup as the A "
    "operand of its dV, dK wgmmas (SS); dQ = dS K split along N as the loop-row gemm")
# dQ's adds in the split layout (loop_dag_schedule.ADD_MODES; plan option with_adds, the bench's
# variants base+warp / base+slots). Nsight Compute on an H200 (D 256, S 4096, 16k tokens, 16
# heads) found the f32 atomics bound by L2's input: the crossbar into L2 82% busy with 268 M
# one-sector reduction requests, the tensor pipe 32% busy (red.global.add.v4.f32 did not change
# the request count). The copy engine's tensor reduce-add of a staged [block][32] f32 box sends
# whole 128-byte lines (four sectors a request). The add warp (DAG_WGMMA_ADD_WARP, the plain
# layout's) adds each warpgroup's staged [block, N / 2] share; where it is staged:
# - "warp": a staging of its own after the tiles (the plain layout's, 1024-byte aligned), where
#   it fits the shared memory: D 192 (176 KiB of tiles + 48 KiB), 192 / 128, 128 / 256;
# - "slots": in the streamed tiles' ring slots of the block (a storage union by phase), where
#   no room is left (D 256: K, V 2 x 32 KiB, Q, dO 2 x 2 x 32 KiB, P^T, dS^T 2 x 2 x 8 KiB = 224
#   of 227 KiB; FlashAttention-3's head dim 256 backward gives dO and dS a single slot each to
#   fit its dQaccum instead). After the loop-row gemm's barrier every score gemm of the block
#   has completed in both warpgroups, and a warpgroup's accumulating gemms read only its own
#   half of the columns of a streamed slot (boxes of 64 columns: its half is whole boxes where
#   D / 2 and D_v / 2 are multiples of 64). An f32 box of [block][32] is a bf16 box of
#   [block][64] (block x 128 bytes): each warpgroup stages its share's boxes in its own boxes of
#   the block's dO slot, then (once its deferred dK wgmma, which reads Q, has completed) of the
#   Q slot; the add warp arrives on both slots' empty mbarriers once its adds have read them (so
#   the producer refills them two blocks later, as before). No shared memory is added and both
#   rings keep two slots; the consumers' only new wait is their own dK before the Q half.
#   It needs each warpgroup's own boxes of the streamed slots to hold its share: D_v >= D
#   (dO's half at least Q's), so not 256 / 128, whose dQ stays atomics.
# Measured on an H200 (2026-11-30, bench/attention_bwd.py --variants, bf16, 16k tokens, main
# kernel TFLOP/s, atomics / copy engine, cuDNN's backward beside): D 256 slots S 1024 269.7 /
# 366.6 (315.0), causal 223.3 / 266.3 (268.3); S 4096 297.1 / 399.5 (380.5), causal 281.5 /
# 371.5 (353.0); S 16384 299.1 / 400.4 (354.3), causal 304.4 / 395.7 (378.0); D 192 warp S 4096
# 262.8 / 344.3 (333.1), causal 256.8 / 335.7 (316.8): 1.19-1.36x the atomics, 0.99-1.16x
# cuDNN. GPU tests (tests/gpu/test_attention_bwd_d256_gpu.py, the D_v pairs: 279 passed) and
# compute-sanitizer racecheck (D 256 slots: 0 hazards). So the copy engine: "warp" where its
# staging fits, else "slots" (256 / 128 keeps the atomics: its dO half is smaller than Q's).
DAG_WGMMA_SPLIT_ADDS = "copy engine"  # or "atomics"
DAG_WGMMA_SPLIT_ADDS_ATOMIC_WHY = (
    "the split layout keeps f32 atomics from registers (dag_wgmma_rules.DAG_WGMMA_SPLIT_ADDS; "
    "the copy engine's adds are the plan options warp / slots, not measured yet): {copy}")
DAG_WGMMA_SPLIT_ADDS_WARP_WHY = (
    "the split layout's warpgroup shares ([block, N / 2] f32) staged after the tiles ({stage} B "
    "beside {tiles} B within {limit} B) and added by the add warp's tensor reduce-adds (whole "
    "128-byte lines, not a one-sector request per f32 pair: the atomics were bound by L2's input)")
DAG_WGMMA_SPLIT_ADDS_SLOTS_WHY = (
    "the split layout's tiles leave no room for dQ's f32 staging ({stage} B beside {tiles} B "
    "within {limit} B): each warpgroup stages its share in its own boxes of the block's streamed "
    "slots ({tiles_used}), free once the block's score gemms and its own accumulating gemms have "
    "read them (a storage union by phase), and the add warp's tensor reduce-adds add them, then "
    "release the slots to the producer (whole 128-byte lines, not a one-sector request per f32 "
    "pair: the atomics were bound by L2's input)")
DAG_WGMMA_SPLIT_PACKED_WHY = (
    "f32 atomics from registers: packed sequences (the tensor reduce-add's map of dQ is not "
    "built over them: its box would add the rows past a sequence's end into the next one's)")
DAG_WGMMA_SPLIT_ADDS_NEITHER_WHY = (
    "f32 atomics from registers: dQ's f32 staging ({stage} B) does not fit beside the split "
    "layout's tiles ({tiles} B within {limit} B), and a warpgroup's own boxes of the streamed "
    "slots do not hold its share ({reason})")

# GQA (a causal mask's bounds per visit) with the add warp's adds: the consumers' staging of a
# share beside dK's wgmma in flight spills at setmaxnreg 232 (NVRTC 13.5, D 256 causal: 16 B,
# deterministic 4 B; 128 / 256: 8 B); with the vectors loaded by the consumers (setmaxnreg 240:
# DAG_WGMMA_VECTOR_REGISTERS is the staged vectors') and, deterministic, one body for every
# block, 0 B.
DAG_WGMMA_SPLIT_GQA_ADDS_WHY = (
    "GQA's split layout with the add warp's adds: the vectors loaded by the consumers "
    "(setmaxnreg 240, not 232) and in deterministic mode one body for every block (NVRTC 13.5: "
    "the staging of a share beside dK's wgmma spilled 4-16 B)")


def split_slot_refusal(streamed_cols: tuple[int, ...], n: int) -> str | None:
    """Why a warpgroup's share of the loop-row tile ([block, n / 2] f32: n / 64 f32 boxes of
    [block][32], each the bytes of a 16-bit box of [block][64]) does not fit its own boxes of the
    streamed tiles' slots (each tile's half of its columns, whole 64-column boxes), or None."""
    half = DAG_WGMMA_SPLIT_CONSUMERS * 64
    if any(c % half for c in streamed_cols):
        return ("a warpgroup's half of a streamed tile is not whole 64-column boxes (columns "
                + ", ".join(map(str, streamed_cols)) + ")")
    own = sum(c // half for c in streamed_cols)
    if own < n // half * 2:
        return (f"its own boxes of the streamed slots ({own}) fewer than its share's f32 boxes "
                f"({n // half * 2})")
    return None


def split_adds(tiles: int, stage: int, limit: int, streamed_cols: tuple[int, ...], n: int,
               copy_engine: bool | None = None) -> tuple[str, str]:
    """The split layout's way of adding the loop-row tile (loop_dag_schedule.ADD_MODES: atomics,
    warp, slots) and why: `tiles` the bytes before the adds' staging (tiles, vectors, the
    alignment), `stage` the staging's, `limit` the target's shared memory less the mbarriers,
    `streamed_cols` the streamed tiles' columns, `n` the loop-row gemm's; `copy_engine` the
    copy engine's adds (None: the rulebook's, DAG_WGMMA_SPLIT_ADDS)."""
    if copy_engine is None:
        copy_engine = DAG_WGMMA_SPLIT_ADDS == "copy engine"
    refused = split_slot_refusal(streamed_cols, n)
    fits = tiles + stage <= limit
    words = dict(stage=stage, tiles=tiles, limit=limit, tiles_used="each warpgroup's half of "
                 "the columns of " + " and ".join(map(str, streamed_cols)) + "-column slots",
                 reason=refused)
    if fits:
        mode, why = "warp", DAG_WGMMA_SPLIT_ADDS_WARP_WHY.format(**words)
    elif refused is None:
        mode, why = "slots", DAG_WGMMA_SPLIT_ADDS_SLOTS_WHY.format(**words)
    else:
        return "atomics", DAG_WGMMA_SPLIT_ADDS_NEITHER_WHY.format(**words)
    if not copy_engine:
        return "atomics", DAG_WGMMA_SPLIT_ADDS_ATOMIC_WHY.format(copy=f"{mode}: {why}")
    return mode, why


DAG_WGMMA_SPLIT_NOT_STAGED_WHY = (
    "the split layout: a warpgroup's share of a score tile is half the block's columns over "
    "every row, not 64 of the rows (the staged helpers' share)")
DAG_WGMMA_SPLIT_REDUCE_WHY = (
    "a row reduction with the accumulators split (N > 128 on sm_90a: dag_wgmma_rules."
    "DAG_WGMMA_SPLIT): each consumer warpgroup holds half of a row's columns and the skeleton "
    "does not combine the halves (not built yet)")
# The split layout's schedule. Its score tiles are [64, block / 2] (16 registers each at a block
# of 64): dP^T's wgmma may be issued with S^T's (as at N 64), measured on an H200 (S 4096,
# bench/attention_bwd.py --variants, the adds of dK deferred alone) 301 against 298, causal 287
# against 293: noise, so the rulebook issues each at its statement (and a score tile stored per
# element, the bias gradient, beside both in flight spills: NVRTC 13.5 44 B). Every value
# handed on is staged, so every accumulating gemm (dV's too) may be issued after the loop-row
# gemm's barrier (the plan option defer_all: one consumer barrier a block instead of two, dV
# and dK in flight while dQ is added): compiled with 0 spills (every mask, GQA, deterministic,
# the mods), not run on a GPU yet (the session's device time ran out), so the rulebook keeps
# dK's deferral alone, as measured above.
DAG_WGMMA_SPLIT_ISSUE_AHEAD = False
DAG_WGMMA_SPLIT_DEFER_ALL = False
DAG_WGMMA_SPLIT_ISSUE_AHEAD_WHY = (
    "the split layout's score tiles are [64, block / 2]: both in flight cost 32 registers; "
    "dP^T's wgmma runs while S^T's epilogue (P) is computed")
DAG_WGMMA_SPLIT_DEFER_WHY = (
    "the split layout stages every value handed on: dV's and dK's wgmmas are issued after "
    "dQ's, behind the loop-row gemm's barrier (one consumer barrier a block, not one per "
    "accumulating gemm), and run while dQ's tile is added")
DAG_WGMMA_SPLIT_OVERHEAD = 32  # addresses, indices, predicates, the handed words beside them
# D 192 (and 192 with D_v 128, DeepSeek's shape): a warpgroup's half of N is 96 columns, whose
# second warpgroup's starts at column 96, inside a 64-column box of the 128-byte swizzle, and
# crosses into the next box: one MN-major wgmma operand runs its N in atoms of 64 columns from
# its start, so no one wgmma reads that half. The split layout issues such a half as
# wgmma.m64n32k16 pieces, each inside one half of a box (its start 0 or 64 bytes into the box's
# 128-byte rows, as the plain layout's D 64 loop-row gemm reads its second warpgroup's 32
# columns), piece p writing the accumulator's n8 groups 4p..4p+3: the tiles, the copy engine's
# boxes and maps, the swizzle and the epilogues' columns stay D 256's. The cost: a piece's A
# (the staged value, or the loop-row gemm's dS^T) is read again per piece, three times a k step.
# Chosen over the 64-byte swizzle (boxes of 32 columns for the tiles read MN-major: one m64n96
# wgmma a k step, A read once), which changes the copy engine's maps, the producer's boxes and
# every descriptor of those tiles. Measured on an H200 (bench/attention_bwd.py --options, S 4096,
# through kgen.attention's autograd): D 192 236 TFLOP/s, causal 221; 192 / 128 219 / 196; the
# mma.sync skeleton ran 138-161 (1.39-1.46x slower); cuDNN 280-390 (RESULTS section 23).
DAG_WGMMA_SPLIT_PIECE = 32
DAG_WGMMA_SPLIT_PIECES_WHY = (
    "a warpgroup's half of N {n} ({half} columns) is not whole 64-column boxes of the 128-byte "
    "swizzle (the second half starts inside one): issued as {pieces} wgmma.m64n{piece}k16 "
    "pieces a k step, each inside a half of a box (B read MN-major from 0 or 64 bytes into the "
    "box's rows), instead of one m64n{half} (dag_wgmma_rules.DAG_WGMMA_SPLIT_PIECE)")


def dag_wgmma_split_piece(n: int) -> int | None:
    """The wgmma N a warpgroup's half of `n` columns is issued in where the half is not whole
    64-column boxes (DAG_WGMMA_SPLIT_PIECE), else None (one wgmma of the half)."""
    half = n // DAG_WGMMA_SPLIT_CONSUMERS
    return None if half % 64 == 0 else DAG_WGMMA_SPLIT_PIECE


def dag_wgmma_split_config():
    """The split layout's configuration (a LoopConfig: keys per CTA, block, stages, 16 rows a
    warp as the plain layout's)."""
    from .loop_rules import LoopConfig

    return LoopConfig(*DAG_WGMMA_SPLIT_TILE, 16)


def dag_wgmma_split(shape, plain_n: tuple[int, ...]) -> bool:
    """Whether the rulebook lays the DAG loop out split (the accumulators' N past the plain
    layout's, `plain_n`)."""
    return DAG_WGMMA_SPLIT and shape.n_acc > max(plain_n)


def dag_wgmma_split_smem_bytes(shape) -> tuple[int, int]:
    """(the tiles' bytes, the whole with the staged vectors and the mbarriers): 16-bit tiles,
    the staged values (every loop-row gemm's A and every value handed on to an accumulating
    gemm only) in two slots of [keys, block]."""
    keys, block, stages = DAG_WGMMA_SPLIT_TILE
    staged = shape.staged + shape.handed
    tiles = 2 * (keys * sum(shape.resident_cols) + stages * block * sum(shape.streamed_cols)
                 + 2 * staged * keys * block)
    vectors = 4 * shape.vectors * stages * block if DAG_WGMMA_STAGE_VECTORS else 0
    barriers = 8 * (1 + 2 * stages * len(shape.streamed_cols))
    return tiles, tiles + vectors + -(-barriers // 128) * 128


def dag_wgmma_split_registers(shape) -> int:
    """A consumer thread's estimate: its halves of the accumulators, two score tiles of [64,
    block / 2] (the first's value read in the second's epilogue), the loop-row tile's [16 rows,
    N / 2] after them (its f32 atomics from registers)."""
    _, block, _ = DAG_WGMMA_SPLIT_TILE
    carried = sum(shape.widths) // 2 // DAG_WGMMA_SPLIT_CONSUMERS
    scores = shape.live_scores * block // 2 // DAG_WGMMA_SPLIT_CONSUMERS
    loop_row = max(shape.loop_row_n, default=0) // 2 // DAG_WGMMA_SPLIT_CONSUMERS
    return carried + max(scores, loop_row) + DAG_WGMMA_SPLIT_OVERHEAD


def dag_wgmma_split_refusal(shape, smem_limit: int) -> str | None:
    """Why the split layout does not run this loop within the target's `smem_limit`, or None
    (loop_rules.dag_wgmma_refusal checked the target, the written lines and the dtype)."""
    from .loop_rules import CONSUMER_REGISTERS

    registers = (DAG_WGMMA_VECTOR_REGISTERS[1] if DAG_WGMMA_STAGE_VECTORS and shape.vectors
                 else CONSUMER_REGISTERS)
    cols = shape.resident_cols + shape.streamed_cols + shape.loop_row_n
    if any(n != shape.n_acc for n in cols) and not shape.acc_ns:
        return (f"the split layout: every operand's columns N {shape.n_acc} (the accumulators' "
                "halves read their B at the same columns)")
    for n in sorted(set(shape.widths + shape.loop_row_n)):
        if n % (DAG_WGMMA_SPLIT_CONSUMERS * DAG_WGMMA_SPLIT_PIECE):
            return (f"N {n} split over {DAG_WGMMA_SPLIT_CONSUMERS} warpgroups: a half of "
                    f"{n / DAG_WGMMA_SPLIT_CONSUMERS:g} columns is neither whole 64-column boxes "
                    "of the 128-byte swizzle nor whole halves of them (MN-major wgmma pieces of "
                    f"{DAG_WGMMA_SPLIT_PIECE}: N a multiple of "
                    f"{DAG_WGMMA_SPLIT_CONSUMERS * DAG_WGMMA_SPLIT_PIECE})")
    if shape.staged > 1:
        return "one staged tile value (a loop-row gemm's A) at most"
    _, need = dag_wgmma_split_smem_bytes(shape)
    if need > smem_limit:
        return (f"the split layout needs {need} B of shared memory; the target allows "
                f"{smem_limit} B")
    regs = dag_wgmma_split_registers(shape)
    if regs > registers:
        return (f"the split layout needs about {regs} registers per consumer thread "
                f"(setmaxnreg gives {registers})")
    return None
