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
# kernel, cuDNN's backward in the same run 558 / 492 / 454 / 373 at D 128, 128 causal, 64, 64
# causal), rulebook of the session before / each option alone / the chosen set:
#   D 128:        359 / ahead 342, vectors 384, defer 371 / vectors+defer 397
#   D 128 causal: 262 / ahead 288, vectors 337, defer 270, lpt 274 / vectors+defer+lpt 375
#   D 64:         261 / ahead 263, vectors 284, defer 261 / all four 295 (ahead+vectors 297)
#   D 64 causal:  172 / ahead 184, vectors 246, defer 173, lpt 175 / all four 275
# Every schedule matched the float64 reference (tests/gpu/test_attention_bwd_gpu.py
# test_sm90a_wgmma_schedules, ragged S and T, every mask, D 64 and 128: 210 passed).
DAG_WGMMA_ISSUE_AHEAD = True
# up to this N: at N 128 both score tiles in flight beside the two accumulators spill
# (NVRTC 13.5: 8-52 B) and measured slower causal (368 against 375 without)
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
DAG_WGMMA_FAST_BODY = True
DAG_WGMMA_FAST_BODY_WHY = (
    "the mma.sync skeleton's split: inside the mask and before the last block, no element of "
    "a block is past the loop's end or masked, so its hand-on and staging selects and the "
    "mask's predicates go; a block branches to one of the two bodies")


def vector_bytes(vectors: int, stages: int, block: int) -> int:
    """The staged vectors' slots: `stages` of `block` f32 each."""
    return 4 * vectors * stages * block
