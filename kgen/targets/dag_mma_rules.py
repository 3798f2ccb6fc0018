"""The rulebook of the sm_80 DAG loop's mma.sync skeleton's body (the attention backward,
templates/common/loop_bwd.cu.j2; kgen/targets/loop_rules.py's DAG section holds its
configuration, registers and refusals): how the skeleton lays its blocks out in loops and how far
it unrolls the score gemms' k16 steps, with why and what was measured; its launch bounds. Read
by kgen/targets/common/loop_dag.py and kgen/lower/loop_dag.py."""
from __future__ import annotations

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


def dag_compact_body(registers: int) -> tuple[bool, str]:
    """Whether the mma.sync skeleton runs its compact body at the estimate `registers` (the
    plan's), with why."""
    if registers <= DAG_COMPACT_REGISTERS:
        return False, ""
    return True, f"about {registers} registers a thread (kgen/targets/dag_mma_rules.py)"


def dag_min_ctas(registers: int, warps: int) -> tuple[int, str]:
    """The CTAs per SM of the launch bounds at the plan's estimate `registers` a thread."""
    if registers * warps * 32 * 2 <= 65536:
        return 2, f"about {registers} registers a thread: two CTAs fit an SM's registers"
    return 1, (f"about {registers} registers a thread: one CTA per SM, so ptxas takes the "
               "registers it needs rather than spill to fit two")
