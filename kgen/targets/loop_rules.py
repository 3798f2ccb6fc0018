"""The rulebook of loop kernels (tile programs with a loop): which (tile_m, block, warps, stages)
a target allows for given K0 (the loop-invariant operand's columns), N1 (the accumulator's
columns) and operand dtype, each refusal with its reason, and the configurations the builder
tries, best first. One home: the lowering (kgen/lower/program.py) asks `refusal` for a written
schedule and `default` for a missing one; nothing else decides it. Both targets have the
mma.sync skeleton (the rules just below); sm_90a runs its warp-specialized wgmma skeleton where
the section at the end (wgmma_refusal, wgmma_default) allows it.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..enums import DType, Op
from ..plan import epilogue as dag
from ..plan.program import Rank
from . import Instruction, Target
from .dag_wgmma_rules import (DAG_WGMMA_OVERLAP_N, DAG_WGMMA_STAGE_VECTORS,  # its schedule
                              DAG_WGMMA_VECTOR_REGISTERS, dag_wgmma_split, dag_wgmma_split_config,
                              dag_wgmma_split_refusal)

TILE_M = (64, 128)
BLOCKS = (32, 64, 128)
STAGES = (1, 2, 3)
# Each warp owns whole rows (its row reductions stay inside the warp): one m16 tile, or two
# that share every B fragment a warp loads (ldmatrix), halving the shared-memory reads per mma.
# Shared memory's bandwidth (128 B a clock per SM) bounds mma.sync at 16 rows a warp: each
# ldmatrix.x4 of B (512 B, 4 clocks) feeds two m16n8k16 (about 2 clocks of the tensor cores).
WARP_ROWS = (16, 32)
ROWS_PER_WARP = 16  # the wgmma skeleton's accounting (its warps: tile_m / 16) and the default

# Registers (ptxas keeps 255 a thread at most): at 16 rows a warp a thread holds block/2 f32 of
# the first gemm's accumulator and N1/2 of the carried one; the epilogue's tile values (about
# one more array of the scores' size live at a time), row state, addresses and fragments in
# flight about 48 more, each value per element past TILE_VALUES about 4 more. NVRTC 13
# (sm_80, the MLP loop), (N1, block): registers (64, 32) 127, (64, 64) 146, (64, 128) 233,
# (128, 32) 137, (128, 64) 178, (128, 128) 255, (256, 32) 254; (256, 64) 255 and 8 B of spills
# with two slots, 252-255 and 0 with one slot each (NVRTC 13.5, sm_80 and sm_90a, 64 and 128
# rows: attention plain, causal, shifted f16, 4-7 values; the MLP loop); softcap, ALiBi, causal
# (13 values, estimate 260) spilled 12 B at 64 rows (nvcc 13.0). Checked: test_loop_compile.py
REGISTER_BUDGET = 240
REGISTER_OVERHEAD = 48
# At 32 rows a warp (two m16 tiles, 128 threads at 128 rows) a thread holds N1 + block f32 of the
# two accumulators; the scores' chain holds about block/2 more in flight, the A fragments and
# addresses grow with K0 (K0/16), the rest (B fragments, the ring's copies' addresses: twice as
# many per thread at half the threads, row state) takes about 68, and each value the body holds
# per element past 8 about 4 more. NVRTC 13 (sm_80 and sm_90a, attention, bf16) measured, as
# (K0, N1, block): registers
#   (64, 64, 64) 225-253 (estimate 232); (128, 128, 32) 251-255 (252; plain, causal, ALiBi, a
#   shifted mask: up to 8 values per element); spills (estimate over 255): (128, 128, 32) with
#   softcap, ALiBi and causal (13 values) 4-16 B (272), (96, 96, 64) 4-20 B (266), (192, 128, 32)
#   4 B (256), (128, 128, 64) and (64, 64, 128) 68-128 B (284, 268).
# The budget is ptxas' 255 itself: a legal configuration just fits (else 16 rows a warp).
WIDE_REGISTER_BUDGET = 255
WIDE_REGISTER_OVERHEAD = 68
WIDE_TILE_VALUES = TILE_VALUES = 8  # values per element the overheads cover
WIDE_REGISTERS_PER_VALUE = REGISTERS_PER_VALUE = 4


@dataclass(frozen=True, slots=True)
class LoopConfig:
    tile_m: int
    block: int
    stages: int
    warp_rows: int = ROWS_PER_WARP  # rows per warp (mma.sync: one of WARP_ROWS)

    @property
    def warps(self) -> int:
        return self.tile_m // self.warp_rows


def smem_bytes(config: LoopConfig, k0: int, n1: int, dtype: DType) -> int:
    """The A tile once, and per ring slot a block of B ([block, K0]) and of C ([block, N1])."""
    return dtype.nbytes * (config.tile_m * k0 + config.stages * config.block * (k0 + n1))


def registers(config: LoopConfig, k0: int, n1: int, tile_values: int = 0) -> int:
    """The estimate of registers per thread (see REGISTER_OVERHEAD, WIDE_REGISTER_OVERHEAD);
    `tile_values`: the values the loop's body holds per element (the plan's TILE values)."""
    extra = max(0, tile_values - TILE_VALUES) * REGISTERS_PER_VALUE
    if config.warp_rows > ROWS_PER_WARP:
        return n1 + 3 * config.block // 2 + k0 // 16 + WIDE_REGISTER_OVERHEAD + extra
    return n1 // 2 + config.block + REGISTER_OVERHEAD + extra


def register_budget(config: LoopConfig) -> int:
    return WIDE_REGISTER_BUDGET if config.warp_rows > ROWS_PER_WARP else REGISTER_BUDGET


def refusal(config: LoopConfig, k0: int, n1: int, dtype: DType, tgt: Target,
            tile_values: int = 0) -> str | None:
    """Why `target` cannot run this configuration, or None (`tile_values`: see registers)."""
    if config.tile_m not in TILE_M:
        return f"tile {config.tile_m}x{config.block}: rows per CTA must be one of {TILE_M}"
    if config.block not in BLOCKS:
        return f"tile {config.tile_m}x{config.block}: the block must be one of {BLOCKS}"
    if config.stages not in STAGES:
        return f"stages {config.stages}: a loop's ring has 1 to 3 slots"
    if config.warp_rows not in WARP_ROWS or config.tile_m % config.warp_rows:
        return (f"{config.warp_rows} rows a warp: one of {WARP_ROWS}, dividing the tile's "
                f"{config.tile_m} rows")
    need = smem_bytes(config, k0, n1, dtype)
    if need > tgt.smem_limit:
        return (f"tile {config.tile_m}x{config.block} stages {config.stages} needs {need} B of "
                f"shared memory ({config.tile_m}x{k0} A tile + {config.stages} x ({config.block}"
                f"x{k0} + {config.block}x{n1}) streamed); {tgt.arch.value} allows "
                f"{tgt.smem_limit} B")
    regs = registers(config, k0, n1, tile_values)
    if regs > register_budget(config):
        return (f"block {config.block} with N1 {n1} at {config.warp_rows} rows a warp needs "
                f"about {regs} registers per thread (the budget is {register_budget(config)} "
                "of 255: it would spill)")
    return None


# Best first: 32 rows a warp (4 warps at 128 rows, as FlashAttention-2) where the registers
# allow it: each B fragment read from shared memory feeds two m16 tiles; 128 rows per CTA halves
# the streamed bytes per row against 64; a block of 64 keeps the scores' registers small; two
# slots overlap the next block's copy with this one's math. Where two slots of 64 do not fit
# beside 128 rows: one slot each (stages 1: B, C copied and waited apart, as FlashAttention-2)
# at 64 rows in 4 warps (its head dim 256 on Hopper: 96 KiB, two CTAs an SM). H200, S 1k/4k, x
# SDPA flash: head dim 256 64x64 one slot 0.91-1.00, 128x64 one slot 0.85-0.93, 128x32 two slots
# 0.75-0.81; 128 (kept at 128x32, 32 rows: 0.86-0.90) 64x64 one slot 0.80-0.89, two 0.83-0.92.
PREFERENCE = tuple(LoopConfig(m, b, s, r) for m, b, s, r in (
    (128, 64, 2, 32), (128, 32, 2, 32), (128, 64, 2, 16), (64, 64, 1, 16), (128, 64, 1, 16),
    (64, 64, 2, 16), (128, 32, 2, 16), (64, 32, 2, 16), (64, 32, 1, 16)))


# Every configuration the rules name, PREFERENCE first: a written line may ask for any of them.
ONE_SLOT = "; one slot each: B, C copied apart (C under the first gemm, the next B the second)"
EVERY = PREFERENCE + tuple(
    c for c in (LoopConfig(m, b, s, r) for r in WARP_ROWS[::-1] for m in TILE_M[::-1]
                for b in BLOCKS for s in STAGES)
    if c not in PREFERENCE)


def default(k0: int, n1: int, dtype: DType, tgt: Target,
            tile_m: int | None = None, block: int | None = None,
            stages: int | None = None, warps: int | None = None,
            tile_values: int = 0) -> tuple[LoopConfig, str]:
    """The first configuration (PREFERENCE, then the rest of EVERY) that keeps the written
    values and is legal, with why; raises ValueError (the lowering locates it) when none is."""
    for config in EVERY:
        if ((tile_m is not None and config.tile_m != tile_m)
                or (block is not None and config.block != block)
                or (stages is not None and config.stages != stages)
                or (warps is not None and config.warps != warps)):
            continue
        if refusal(config, k0, n1, dtype, tgt, tile_values) is None:
            return config, (f"the rulebook's first legal configuration for K0 {k0}, N1 {n1}, "
                            f"{dtype.dsl_name} on {tgt.arch.value}"
                            f"{ONE_SLOT * (config.stages == 1)} (kgen/targets/loop_rules.py)")
    written = LoopConfig(tile_m or 128, block or 64, stages or 2)
    if warps is not None and written.tile_m % warps == 0:
        written = LoopConfig(written.tile_m, written.block, written.stages,
                             written.tile_m // warps)
    raise ValueError(refusal(written, k0, n1, dtype, tgt, tile_values)
                     or "no legal loop configuration keeps the written lines")


# Up to this estimate (8 warps) two CTAs per SM (128 registers; NVRTC 13: head dim 64 116-128);
# above, one: aiming at two, head dim 96 spilled 28 B on sm_90a; at one, 150 registers, none.
TWO_CTAS_REGISTERS = 144


def min_ctas_per_sm(config: LoopConfig, n1: int) -> tuple[int, str]:
    """The CTAs per SM the kernel's launch bounds ask for, and why."""
    if config.warps <= 4:  # every one of 32 rows a warp
        return 2, (f"{config.warps} warps of {config.warp_rows} rows: two CTAs per SM (8 warps, "
                   "as FlashAttention-2 runs) still leave ptxas 255 registers a thread")
    regs = n1 // 2 + config.block + REGISTER_OVERHEAD  # registers() at 16 rows a warp
    if regs <= TWO_CTAS_REGISTERS:
        return 2, (f"about {regs} registers a thread (at most {TWO_CTAS_REGISTERS}): two CTAs "
                   "fit an SM's registers")
    return 1, (f"about {regs} registers a thread (over {TWO_CTAS_REGISTERS}): one CTA per SM, "
               "so ptxas takes the registers it needs rather than spill to fit two")


# tanh in the loop's body (plan.tanh). Both skeletons run the body once per score, where the
# two gemms, exp and the reductions share the issue slots; tanhf is libdevice's full-precision
# sequence (about 20 instructions with a division and a branch on |x|), tanh.approx.f32 one
# instruction of the MUFU (sm_75 and later), as FlashAttention-3 computes its softcap. PTX gives
# its maximum relative error as 2^-10.99; so a softcap c * tanh(x / c) moves a score by at most
# c * 2^-10.99 (0.015 at c = 30) and the log-sum-exp by as much, O's rows by that relative
# amount at most. The kernel's epilogue runs once per tile of rows: it keeps tanhf.
def loop_tanh(uses_tanh: bool) -> tuple[str, str]:
    """How the loop's body computes tanh (plan.program.LoopPlan.tanh), and why."""
    if not uses_tanh:
        return "none", "the loop's body computes no tanh"
    return ("tanh.approx.f32", "the hardware's tanh, one MUFU instruction per element (as "
            "FlashAttention-3's softcap), where tanhf's full-precision sequence (with div.rn) "
            "made a softcap 3.10-3.43x the plain kernel's time (1.14-1.17x with both changed: "
            "bench/RESULTS.md); maximum relative error 2^-10.99 (PTX ISA), so c * tanh(x / c) "
            "moves a score by at most c * 2^-10.99; the kernel's epilogue keeps tanhf "
            "(kgen/targets/loop_rules.py)")


# a / b in the loop's body where b is the same for a row's elements (a row or uniform value: a
# softcap's score / c): div.rn.f32 runs per element a MUFU reciprocal and a Newton fix-up with
# a branch (about 10 instructions); a times b's reciprocal computes 1 / b once per row (the
# compiler hoists it) and a multiply per element. Two roundings: within 1.5 ulp of a / b;
# infinities and zeros as a / b's (a / 0 is a * inf, a / inf is a * 0), except where 1 / b
# overflows (|b| < 2^-126). The kernel's epilogue divides once per tile of rows: it keeps a / b.
def shared_divisor(section, value) -> bool:
    """Whether `value` (of plan.program.Section `section`) is a TILE value a / b whose divisor
    b is a ROW or UNIFORM value."""
    kind = value.kind
    return (isinstance(kind, dag.Apply) and kind.op is Op.DIV and value.rank is Rank.TILE
            and section.values[kind.args[1]].rank in (Rank.ROW, Rank.UNIFORM))


def loop_division(shared: bool, where: str = "the loop's body") -> tuple[str, str]:
    """How `where` divides a tile value by a row or uniform one
    (plan.program.LoopPlan.division), and why."""
    if not shared:
        return "none", (f"{where} divides no tile value by a row or uniform value")
    return ("a * (1 / b)", "the divisor is the same for a row's elements: its reciprocal is "
            "computed once per row, a multiply per element instead of div.rn's MUFU reciprocal "
            "and fix-up; within 1.5 ulp of a / b (kgen/targets/loop_rules.py)")


# =============================================================================================
# sm_90a: the warp-specialized wgmma skeleton (templates/sm90/loop.cu.j2)
#
# A loop kernel runs it where every rule below holds; where one does not, the lowering keeps
# the mma.sync skeleton above and the plan's `mma` says which rule refused (never silently).
# One producer warpgroup (one thread issues the copy engine's loads of Q once and of K and V
# into rings of `stages` slots each) and tile_m / 64 consumer warpgroups of 64 rows each.
# =============================================================================================

WGMMA_ROWS = 64  # rows per consumer warpgroup: wgmma's M
WGMMA_TILE_M = (64, 128, 192)  # 192: three consumer warpgroups
# a multiple of 16 up to 256: wgmma's n, P's k16 steps, the copy engine's box rows
WGMMA_BLOCKS = tuple(range(64, 257, 16))
BOX_COLS = 64  # the copy engine's box: 64 16-bit columns (128 bytes, the 128-byte swizzle)
PRODUCER_REGISTERS = 24  # one thread issues every copy
CONSUMER_REGISTERS_BY_COUNT = {1: 240, 2: 240, 3: 160}  # with 24 x 128: <= 65536 registers
CONSUMER_REGISTERS = CONSUMER_REGISTERS_BY_COUNT[2]
# A consumer thread holds block/2 f32 of S, N1/2 of O, block/4 words of P, and WGMMA_OVERHEAD
# more (row state, values in flight, addresses), within setmaxnreg less a margin per count.
# NVRTC 13.0 and 13.5, attention: at 240 no spill up to 224 (D 128 128x160), 64 B at 232
# (128x176); at 160 none up to 160 (D 64 192x112, D 128 192x80), 36-112 B at 164-172.
WGMMA_OVERHEAD = 36
WGMMA_REGISTER_MARGIN = {1: 16, 2: 16, 3: 0}


def consumer_registers(tile_m: int) -> int:
    return CONSUMER_REGISTERS_BY_COUNT[tile_m // WGMMA_ROWS]


def wgmma_smem_bytes(config: LoopConfig, k0: int, n1: int) -> int:
    """Q once, and per ring slot a block of K ([block, K0]) and of V ([block, N1]), 16-bit, in
    1024-byte aligned boxes; then the mbarriers (Q's, and full and empty per slot of each
    ring), 8 bytes each, rounded up to 128."""
    tiles = 2 * (config.tile_m * k0 + config.stages * config.block * (k0 + n1))
    barriers = 8 * (1 + 4 * config.stages)
    return tiles + -(-barriers // 128) * 128


def wgmma_registers(config: LoopConfig, n1: int) -> int:
    return config.block // 2 + n1 // 2 + config.block // 4 + WGMMA_OVERHEAD


def wgmma_refusal(config: LoopConfig, k0: int, n1: int, dtype: DType, tgt: Target,
                  b_along: bool, c_along: bool) -> str | None:
    """Why the wgmma skeleton cannot run this loop on `tgt` in `config`, or None."""
    return (wgmma_program_refusal(k0, n1, tgt, b_along, c_along)
            or _wgmma_config_refusal(config, k0, n1, tgt))


def wgmma_program_refusal(k0: int, n1: int, tgt: Target, b_along: bool,
                          c_along: bool) -> str | None:
    """Why the wgmma skeleton cannot run this loop in any configuration, or None."""
    if not tgt.has(Instruction.WGMMA) or not tgt.tma:
        return f"{tgt.arch.value} has no wgmma and copy engine"
    if not b_along:
        return ("the first gemm's B is read across the loop's dimension (columns along it); "
                "wgmma's skeleton takes it K-major: a [loop, K0] row-major tensor, B^T")
    if not c_along:
        return ("the accumulating gemm's B has its columns along the loop's dimension; "
                "wgmma's skeleton takes it as [loop, N1] row-major (MN-major)")
    if k0 % BOX_COLS or n1 % BOX_COLS:
        return (f"K0 {k0} and N1 {n1} must be multiples of {BOX_COLS} (the copy engine's "
                "128-byte boxes)")
    return None


def _wgmma_config_refusal(config: LoopConfig, k0: int, n1: int, tgt: Target) -> str | None:
    if config.tile_m not in WGMMA_TILE_M:
        return (f"tile {config.tile_m}x{config.block}: rows per CTA must be one of "
                f"{WGMMA_TILE_M} (64 per consumer warpgroup)")
    if config.block not in WGMMA_BLOCKS:
        return (f"tile {config.tile_m}x{config.block}: the block must be a multiple of 16 from "
                f"{WGMMA_BLOCKS[0]} to {WGMMA_BLOCKS[-1]}")
    if config.stages not in STAGES:
        return f"stages {config.stages}: a loop's ring has 1 to 3 slots"
    need = wgmma_smem_bytes(config, k0, n1)
    if need > tgt.smem_limit:
        return (f"tile {config.tile_m}x{config.block} stages {config.stages} needs {need} B of "
                f"shared memory; {tgt.arch.value} allows {tgt.smem_limit} B")
    regs = wgmma_registers(config, n1)
    limit = consumer_registers(config.tile_m)
    budget = limit - WGMMA_REGISTER_MARGIN[config.tile_m // WGMMA_ROWS]
    if regs > budget:
        return (f"block {config.block} with N1 {n1} needs about {regs} registers per consumer "
                f"thread (the budget is {budget} of {limit} with "
                f"{config.tile_m // WGMMA_ROWS} consumer warpgroups)")
    return None


# A tensor the body reads at (row, col) (an additive bias [S, T]): read per element from global
# memory inside the softmax, a [128, 128] block costs each consumer thread 64 dependent 2-byte
# loads and their addresses (section 15 of bench/RESULTS.md: 2.6-2.7x the plain kernel's time,
# and 16 B of spills causal). Staged, the producer's copy engine loads its [tile_m, block] tile
# per block into a ring of its own (full and empty mbarriers per slot, loaded between K and V:
# on V's mbarriers, measured 1.25x the plain kernel's time without a mask, the softmax waited for
# V's slot), and the statements read it from shared memory (ldmatrix, in the accumulator's
# fragment layout; the slot is released as soon as a warp holds its share). The tile takes
# stages x tile_m x block x 2 bytes (64 KiB at 128x128, 2 slots: 224 KiB in all at head dim
# 128, within sm_90a's 227).
def wgmma_staged_bytes(config: LoopConfig, k0: int, n1: int) -> int:
    """wgmma_smem_bytes with a staged tile: its slots, and its ring's full and empty mbarriers
    beside K's and V's (2 + 6 stages words with the persistent scheduler's Q empty), rounded
    up to 128."""
    tiles = 2 * (config.tile_m * k0 + config.stages * config.block * (k0 + n1)
                 + config.stages * config.tile_m * config.block)
    return tiles + -(-8 * (2 + 6 * config.stages) // 128) * 128


def wgmma_staging_refusal(config: LoopConfig, k0: int, n1: int, tgt: Target) -> str | None:
    """Why the wgmma skeleton cannot stage a 16-bit [rows, loop] tensor's tile per block in
    `config`, or None."""
    if config.block % BOX_COLS:
        return (f"the block of {config.block} columns is not a multiple of the copy engine's "
                f"{BOX_COLS}-column boxes")
    need = wgmma_staged_bytes(config, k0, n1)
    if need > tgt.smem_limit:
        return (f"its {config.stages} x [{config.tile_m}, {config.block}] slots would need "
                f"{need} B of shared memory; {tgt.arch.value} allows {tgt.smem_limit} B")
    return None


# Best first: two consumer warpgroups (128 rows) share each K and V block; a block of 128
# halves the barrier round trips per column against 64 where the registers allow it; two slots
# let the copy engine fill the next block while this one is multiplied. Measured on an H200
# (bf16, 16k tokens, 16 heads, non-causal; TFLOP/s at S 1024 / 4096): D 64 128x128x2 253 / 336,
# 192x64x3 234 / 318, 128x64x2 214 / 279, 128x128x1 200 / 267; D 128 128x128x2 382 / 531,
# 192x64x3 345 / 475, 128x64x2 318 / 440; three slots as two. D 256 (O is 128 registers), S 1k
# / 4k / 16k: 128x80x2 450 / 617 / 613, 128x64x2 438 / 605 / 596. FlashAttention-3's tiles
# (hopper/tile_size.h: 192 x 128-192 at D 64, 128 x 176 at D 128) and their neighbours that fit
# (192x112, 128x144-192) against 128x128x2, one run (bench/attention.py --variants; figures in
# the commit): 1-3 % faster at S 16384 only, up to 15 % slower at S 1024 and 6 % at 4096, and
# the plan does not know the lengths: 128x128 stays first at D 64 and 128.
WGMMA_PREFERENCE = tuple(LoopConfig(m, b, s) for m, b, s in (
    (128, 128, 2), (128, 80, 2), (128, 64, 2), (128, 64, 3), (128, 128, 1), (128, 64, 1),
    (64, 128, 2), (64, 64, 2), (64, 64, 3), (64, 128, 1), (64, 64, 1)))
WGMMA_EVERY = WGMMA_PREFERENCE + tuple(
    c for c in (LoopConfig(m, b, s) for m in WGMMA_TILE_M[::-1] for b in WGMMA_BLOCKS
                for s in STAGES) if c not in WGMMA_PREFERENCE)


def wgmma_default(k0: int, n1: int, dtype: DType, tgt: Target, b_along: bool, c_along: bool,
                  tile_m: int | None = None, block: int | None = None,
                  stages: int | None = None) -> tuple[LoopConfig | None, str]:
    """The first wgmma configuration that keeps the written values and is legal, with why; or
    (None, why not) where none is: the lowering then keeps the mma.sync skeleton."""
    refused = wgmma_program_refusal(k0, n1, tgt, b_along, c_along)
    if refused is not None:
        return None, refused
    first_refusal = None
    for config in WGMMA_EVERY:
        if ((tile_m is not None and config.tile_m != tile_m)
                or (block is not None and config.block != block)
                or (stages is not None and config.stages != stages)):
            continue
        why = wgmma_refusal(config, k0, n1, dtype, tgt, b_along, c_along)
        if why is None:
            return config, ("the rulebook's first legal wgmma configuration for K0 "
                            f"{k0}, N1 {n1}, {dtype.dsl_name} on {tgt.arch.value} "
                            "(kgen/targets/loop_rules.py)")
        first_refusal = first_refusal or ("no configuration keeps the written lines and is "
                                          f"legal; the first tried: {why}")
    if first_refusal is None:
        written = LoopConfig(tile_m or 128, block or 64, stages or 2)
        first_refusal = wgmma_refusal(written, k0, n1, dtype, tgt, b_along, c_along) or \
            "no wgmma configuration keeps the written lines"
    return None, first_refusal


# The tile scheduler (plan.wgmma.scheduler). Tiled: one CTA per (row tile, head, batch), each
# loading its Q and starting its K/V ring alone; the hardware hands a freed SM the next tile.
# Persistent: min(tiles, SMs x CTAs per SM) CTAs walk the tiles statically (CTA c: tiles c,
# c + CTAs, ...; the (head, batch) pairs in groups whose K and V the CTAs in flight share in
# L2, the row tile outermost in a group, longest first under a causal mask), the producer
# loading the next tile's Q (behind Q's empty mbarrier: Q has one buffer) and K/V while the
# consumers finish this tile; the mbarriers fit the rounding wgmma_smem_bytes already leaves
# (8 x (2 + 4 stages) <= 128 for stages <= 3). Measured on an H200 (bf16, 16k tokens, 16 heads,
# bench/attention.py --sm90a and --long; the figures in bench/RESULTS.md section 15):
# the persistent walk pays nowhere beyond noise (+2 % at S 1024 without a mask) and loses up to
# 27 % under a causal mask: a static walk cannot even out tiles of unequal length as the
# hardware's dispatch of freed SMs does (a dynamic tile counter would: it needs a zeroed word
# per launch, which a tile program has no workspace for yet). So tiled everywhere, by this rule;
# persistent stays a plan option (with_scheduler: the bench's and the tests' variant).
WGMMA_PERSISTENT = False


def wgmma_scheduler(persistent: bool = WGMMA_PERSISTENT) -> tuple[str, str]:
    """The scheduler's value and why (plan.program.WgmmaLoop.scheduler)."""
    if persistent:
        return ("persistent", "min(tiles, SMs x CTAs per SM) CTAs each walk the tiles blockIdx.x, "
                "+ gridDim.x, ... (the (head, batch) pairs in groups whose K and V stay in L2, "
                "the row tile outermost in a group): a CTA's next Q and K/V blocks load while "
                "its consumers finish this tile; the K/V rings' count runs across a CTA's tiles")
    return ("tiled", "one CTA per tile of rows: measured at D 64, 128 and 256, S 1024 to 16384, "
                     "causal or not, the persistent walk was never faster beyond noise and up "
                     "to 27 % slower under a causal mask (kgen/targets/loop_rules.py)")


# O's store: staged in Q's buffer and stored by the copy engine, or from registers by every
# thread (loop_schedule.with_o_store, a plan option). H200, bf16, 16k tokens, 16 heads, the raw
# maximum (session 9), TFLOP/s from registers / by the copy engine, one run:
#   D 64  S 1024 280 / 294, causal 188 / 196; S 4096 389 / 392, causal 328 / 336;
#         S 16384 430 / 435, causal 406 / 433
#   D 128 S 1024 480 / 519, causal 295 / 352; S 4096 650 / 621, causal 547 / 538;
#         S 16384 638 / 646, causal 630 / 635; GQA 8:1 S 4096 576 / 660, causal 548 / 560
#   D 256 S 1024 566 / 600, causal 362 / 399; S 4096 704 / 695, causal 581 / 583;
#         S 16384 687 / 719, causal 681 / 699
# The copy engine wins 18 of 20 (up to 19 %, most at S 1024) and loses at D 128 S 4096 (4 %,
# 2 % causal; 5 % in two earlier runs): it stores O wherever O can be staged (o_store_refusal).
O_STORE_WHY = ("O's tile leaves as [64][64] boxes written by one thread per consumer warpgroup "
               "instead of 4-byte stores by every thread: measured faster at 18 of 20 points "
               "of the grid, most at S 1024 (kgen/targets/loop_rules.py, \"O's store\")")


# =============================================================================================
# A loop over a DAG of gemms (the attention backward, FlashAttention-2's structure) on the
# mma.sync skeleton (templates/common/loop_bwd.cu.j2; plan: kgen/plan/loop_dag.py). Both
# targets run it: sm_90a has no wgmma skeleton for it yet.
#
# A CTA owns tile_m of the kernel's rows (keys), 16 a warp, and walks the loop (queries) in
# blocks. Shared memory: every loop-invariant tile [tile_m, cols] once, every streamed tile
# [block, cols] in `stages` ring slots, every staged tile value [tile_m, block] once.
# Registers (per thread, 16 rows a warp): each accumulator [16, N] is N/2 f32; the score tiles
# live together (the first score's value is read in the second's epilogue) are block/2 each;
# a handed-on A is block/4 words; a loop-row gemm's [16, n_warp] tile n_warp/2, live after the
# score tiles are dead (staged); addresses, fragments and indices about DAG_REGISTER_OVERHEAD.
# =============================================================================================

DAG_TILE_M = (64, 128)
DAG_BLOCKS = (32, 64, 128)
DAG_ROWS_PER_WARP = 16
# NVRTC 13 (the attention backward, bf16 and f16, causal and not), as (N, tile): registers
# (sm_80 / sm_90a), the estimate below: (64, 128x64) 239-250 / 247-255 and 8 B of spills under
# a causal mask, 256; (64, 128x32) 209-217 / 216-222, 176; (128, 128x32) 253-254 / 255, 240;
# (128, 128x64) and (128, 64x64) 255 and 4-28 B of spills on sm_80, 320. The score tiles count
# twice (their f32 values, the exp's operands and the mask's predicates live beside them).
# ptxas takes what one CTA per SM leaves it, so the estimate orders configurations rather than
# counts registers: each target's budget takes the pairs that compiled without spills there.
# With the fast body (no bounds checks, the mask folded) and lse, D staged in shared memory,
# compiled for sm_80 and for sm_90 (the GPU compiles the sm_80 plan for its own arch), bf16:
# (64, 128x64) 254-255 and 0 spills; (128, 128x32) 254-255 and 0; (128, 128x64), FlashAttention-
# 2's sm_80 configuration at head dim 128 (64 queries x 128 keys, 8 warps), 44-56 B of spills
# without a mask and 336-400 B causal in the skeleton's three loops, 254-255 and 0 (both masks,
# sm_80 and sm_90a builds, NVRTC 13.5) in its compact body (kgen/targets/dag_mma_rules.py). So
# sm_80's budget takes it (320), and sm_90a's (the loops wgmma does not take: a written tile,
# D 192 once; at 248 they were refused, yet compile for sm_90a at 255 and 0 spills, NVRTC 13.5).
DAG_REGISTER_OVERHEAD = 32
DAG_LISTED_REGISTERS = 8  # a block mask's walk (sm_80 D 128: 128x64 spilled, 128x32 not)
DAG_REGISTER_BUDGET = {"sm_80": 320, "sm_90a": 320}


def dag_register_budget(tgt: Target) -> int:
    return DAG_REGISTER_BUDGET[tgt.arch.value]


@dataclass(frozen=True, slots=True)
class DagShape:
    """What the rules read of a DAG loop: the loop-invariant and streamed tiles' columns, the
    staged tile values, the accumulators, the score tiles live at once, the loop-row gemms' N."""

    resident_cols: tuple[int, ...]
    streamed_cols: tuple[int, ...]
    staged: int
    accumulators: int
    n_acc: int
    live_scores: int
    loop_row_n: tuple[int, ...]
    vectors: int = 0  # f32 vectors staged per block ([stages][block] each)
    handed: int = 0  # tile values handed to accumulating gemms only (staged where split)
    acc_ns: tuple[int, ...] = ()  # each accumulator's N where they differ (n_acc the widest)
    listed: bool = False  # a block mask's walk (DAG_LISTED_REGISTERS)

    @property
    def widths(self) -> tuple[int, ...]:
        """Each accumulator's N (the attention backward's dV at D_v, dK at D)."""
        return self.acc_ns or (self.n_acc,) * self.accumulators

    @property
    def widths_text(self) -> str:
        return "N " + " and ".join(map(str, self.acc_ns or (self.n_acc,)))


def dag_smem_bytes(config: LoopConfig, shape: DagShape, dtype: DType) -> int:
    return (dtype.nbytes * (config.tile_m * sum(shape.resident_cols)
                            + config.stages * config.block * sum(shape.streamed_cols)
                            + shape.staged * config.tile_m * config.block)
            + 4 * shape.vectors * config.stages * config.block)


def dag_loop_row_split(config: LoopConfig, n: int) -> tuple[int, int] | None:
    """A loop-row gemm's [block, n] tile over the CTA's warps: (m16 tiles of the block, columns
    per warp), each warp one m16 tile and an equal share of n in 16-column steps; None when
    the warps cannot share it so."""
    m_tiles = config.block // 16
    warps = config.warps
    if warps % m_tiles or n % (16 * (warps // m_tiles)):
        return None
    return m_tiles, n // (warps // m_tiles)


def dag_registers(config: LoopConfig, shape: DagShape) -> int:
    carried = sum(shape.widths) // 2
    scores = 2 * (shape.live_scores * config.block // 2 + config.block // 4)
    loop_row = max((dag_loop_row_split(config, n) or (0, n))[1] // 2
                   for n in shape.loop_row_n) if shape.loop_row_n else 0
    return (carried + max(scores, loop_row) + DAG_REGISTER_OVERHEAD
            + (DAG_LISTED_REGISTERS if shape.listed else 0))


def dag_refusal(config: LoopConfig, shape: DagShape, dtype: DType, tgt: Target) -> str | None:
    """Why `tgt` cannot run the DAG loop in `config`, or None."""
    if config.tile_m not in DAG_TILE_M:
        return f"tile {config.tile_m}x{config.block}: rows per CTA must be one of {DAG_TILE_M}"
    if config.block not in DAG_BLOCKS:
        return f"tile {config.tile_m}x{config.block}: the block must be one of {DAG_BLOCKS}"
    if config.stages not in (1, 2):
        return f"stages {config.stages}: the DAG loop's ring has 1 or 2 slots"
    if config.warp_rows != DAG_ROWS_PER_WARP:
        return f"{config.warp_rows} rows a warp: the DAG loop runs {DAG_ROWS_PER_WARP}"
    for n in shape.loop_row_n:
        if dag_loop_row_split(config, n) is None:
            return (f"tile {config.tile_m}x{config.block}: the {config.warps} warps cannot share "
                    f"a loop-row gemm's [{config.block}, {n}] tile (one m16 tile of the block "
                    "each, N in equal 16-column shares)")
    need = dag_smem_bytes(config, shape, dtype)
    if need > tgt.smem_limit:
        return (f"tile {config.tile_m}x{config.block} stages {config.stages} needs {need} B of "
                f"shared memory; {tgt.arch.value} allows {tgt.smem_limit} B")
    regs = dag_registers(config, shape)
    if regs > dag_register_budget(tgt):
        return (f"tile {config.tile_m}x{config.block} with {shape.accumulators} accumulators of "
                f"{shape.widths_text} needs about {regs} registers per thread (at most "
                f"{dag_register_budget(tgt)} on {tgt.arch.value}: the accumulators stay in "
                "registers)")
    return None


# Best first: 128 keys (8 warps) share every streamed block, halving the streamed bytes per key
# against 64; a block of 64 queries keeps the two live score tiles at 32 registers each (as
# FlashAttention-2's sm_80 backward for head dim 128); two slots overlap the next block's copy
# with this one's five gemms; a block of 32 where the registers need it.
DAG_PREFERENCE = tuple(LoopConfig(m, b, s, DAG_ROWS_PER_WARP) for m, b, s in (
    (128, 64, 2), (128, 64, 1), (128, 32, 2), (64, 64, 2), (64, 32, 2), (128, 32, 1),
    (64, 64, 1), (64, 32, 1), (128, 128, 2), (128, 128, 1)))


def dag_default(shape: DagShape, dtype: DType, tgt: Target, tile_m: int | None = None,
                block: int | None = None, stages: int | None = None,
                warps: int | None = None) -> tuple[LoopConfig, str]:
    """The first legal configuration keeping the written values, with why; ValueError (the
    lowering locates it) when none is, saying why the smallest one tried cannot run (the
    limit every larger one meets too)."""
    refused = []
    for config in DAG_PREFERENCE:
        if ((tile_m is not None and config.tile_m != tile_m)
                or (block is not None and config.block != block)
                or (stages is not None and config.stages != stages)
                or (warps is not None and config.warps != warps)):
            continue
        why = dag_refusal(config, shape, dtype, tgt)
        if why is None:
            return config, ("the rulebook's first legal configuration of a DAG loop for "
                            f"{shape.widths_text}, {dtype.dsl_name} on {tgt.arch.value} "
                            "(kgen/targets/loop_rules.py)")
        refused.append((dag_smem_bytes(config, shape, dtype), why))
    if refused:
        raise ValueError(min(refused)[1])
    written = LoopConfig(tile_m or 128, block or 64, stages or 2, DAG_ROWS_PER_WARP)
    raise ValueError(dag_refusal(written, shape, dtype, tgt)
                     or "no legal configuration of a DAG loop keeps the written lines")


# =============================================================================================
# The DAG loop on sm_90a's wgmma skeleton (FlashAttention-3's backward structure;
# templates/sm90/loop_bwd.cu.j2, laid out by kgen/targets/sm90/loop_dag_schedule.py).
#
# One configuration: 128 rows (keys) per CTA, two consumer warpgroups of 64 (wgmma's M is the
# rows: S^T = K Q^T and dP^T = V dO^T computed transposed, as FA3's SdP_swapAB), a block of 64
# (queries; FA3's at head dim 128), two ring slots of each streamed tile and two of each staged
# tile value (dS^T), setmaxnreg 24 / 240. Registers per consumer thread at N 128: the two
# accumulators 2 x 64, two score tiles 2 x 32, the handed-on value 16, a loop-row tile's share
# (N / 2 columns of 16 rows) after the score tiles die; shared memory at D 128: K, V 2 x 32 KiB,
# Q, dO 2 x 2 x 16 KiB, dS^T 2 x 16 KiB = 160 KiB.
# =============================================================================================

DAG_WGMMA_CONFIG = LoopConfig(128, 64, 2, 16)
DAG_WGMMA_STAGED_SLOTS = 2  # a block writes one slot, the previous block's is read (a barrier)
DAG_WGMMA_N = (64, 128)  # the accumulators' and the loop-row gemms' N (head dims)
DAG_WGMMA_OVERHEAD = 24  # addresses, indices, the masks' predicates beside the values above
# Whether the rulebook picks the wgmma skeleton where it is legal (else mma.sync, with why).
# Verified on an H200 (tests/gpu/test_attention_bwd_gpu.py -k sm90a: 63 passed, ragged S/T
# 1..4097, masks, D 64/128, bf16/f16; compute-sanitizer racecheck 0 hazards, memcheck no device
# error) and measured faster than mma.sync everywhere (bf16, 16k tokens, 16 heads, S 4096,
# TFLOP/s of the main kernel, wgmma / mma.sync / SDPA flash / cuDNN; bench/attention_bwd.py):
#   D 128 274 / 182 / 287 / 573, causal 210 / 155 / 253 / 489
#   D 64  227 / 170 / 264 / 453, causal 152 / 146 / 223 / 371
DAG_WGMMA_DEFAULT = True
def dag_wgmma_smem_bytes(shape: DagShape, bulk_add: bool = False) -> tuple[int, int]:
    """(the tiles' bytes, the whole with the adds' staging and the mbarriers rounded up to
    128): 16-bit tiles in 1024-byte aligned boxes; with `bulk_add`, the loop-row tile's f32
    staging (dag_wgmma_add_row_bytes a row, kBlock rows per consumer warpgroup); mbarriers: the
    loop-invariant tiles' one, then a full and an empty one per ring slot of each streamed
    tile."""
    c = DAG_WGMMA_CONFIG
    tiles = 2 * (c.tile_m * sum(shape.resident_cols)
                 + c.stages * c.block * sum(shape.streamed_cols)
                 + DAG_WGMMA_STAGED_SLOTS * shape.staged * c.tile_m * c.block)
    stage = (c.tile_m // WGMMA_ROWS * c.block * dag_wgmma_add_row_bytes(shape)
             if bulk_add else 0)
    barriers = 8 * (1 + 2 * c.stages * len(shape.streamed_cols))
    vectors = 4 * shape.vectors * c.stages * c.block if DAG_WGMMA_STAGE_VECTORS else 0
    return tiles, tiles + vectors + stage + -(-barriers // 128) * 128


# dQ's adds (a loop-row gemm's `+=` into an f32 `out accumulate` tensor): by the copy engine's
# bulk reduce-add (cp.reduce.async.bulk .add.f32, FlashAttention-3's way: the warpgroup's
# [block, N / 2] tile staged in shared memory, one bulk add per row) or by f32 atomics from
# registers (red.global.add.f32, 2 x 16 per thread per block, their addresses scattered over
# 8 rows). A staged row is N / 2 f32 and 32 bytes more: the fragments' writes (8 rows at once)
# then meet 2-way bank conflicts, not 8-way; rows stay 16-byte aligned as the copy engine needs.
# Measured on an H200 (2026-11-29, bench/attention_bwd.py, bf16, S 4096, 16 heads, TFLOP/s of
# the main kernel, atomics / bulk adds): D 128 277 / 361, causal 212 / 263; D 64 227 / 263,
# causal 153 / 172. tests/gpu/test_attention_bwd_gpu.py passed both ways (ragged S and T, every
# mask, D 64/128, bf16/f16) and compute-sanitizer racecheck and memcheck were clean on the bulk
# build, so the rulebook took the bulk adds over the atomics (both plan options now,
# loop_dag_schedule.with_adds; kgen/targets/dag_wgmma_rules.py's tensor reduce-adds replaced them).
DAG_WGMMA_BULK_ADD = True
DAG_WGMMA_BULK_ADD_WHY = (
    "f32 atomics (red.global.add.f32 from registers; the plan option)" if not DAG_WGMMA_BULK_ADD
    else "the copy engine adds each staged row (cp.reduce.async.bulk .add.f32): a bulk add per "
    "row instead of a scattered f32 atomic per element; measured on an H200 at S 4096 1.30x the "
    "atomics' speed at D 128 (1.24x causal), 1.16x at D 64 (1.12x causal)")
DAG_WGMMA_ADD_PAD = 32


def dag_wgmma_add_row_bytes(shape: DagShape) -> int:
    return 4 * max(shape.loop_row_n, default=0) // (DAG_WGMMA_CONFIG.tile_m // WGMMA_ROWS) \
        + DAG_WGMMA_ADD_PAD


def dag_wgmma_registers(shape: DagShape) -> int:
    c = DAG_WGMMA_CONFIG
    carried = sum(shape.widths) // 2
    scores = shape.live_scores * c.block // 2 + c.block // 4
    loop_row = max(shape.loop_row_n, default=0) // 2 // 2  # N / consumers columns, 16 rows
    return carried + max(scores, loop_row) + DAG_WGMMA_OVERHEAD


def dag_wgmma_refusal(shape: DagShape, dtype: DType, tgt: Target,
                      written: tuple[int | None, ...]) -> str | None:
    """Why the DAG loop's wgmma skeleton does not run this loop on `tgt`, or None. `written`:
    the source's tile M, block, stages and warps lines (None where absent)."""
    if not tgt.has(Instruction.WGMMA) or not tgt.tma:
        return f"{tgt.arch.value} has no wgmma and copy engine"
    if not DAG_WGMMA_DEFAULT:
        return "the wgmma backward is not verified on a GPU yet"
    c = dag_wgmma_split_config() if dag_wgmma_split(shape, DAG_WGMMA_N) else DAG_WGMMA_CONFIG
    if any(w is not None and w != v for w, v in zip(written, (c.tile_m, c.block, c.stages,
                                                              c.warps))):
        return (f"the source's lines ask for another configuration than the wgmma skeleton's "
                f"(tile {c.tile_m}x{c.block} stages {c.stages})")
    if dtype.nbytes != 2:
        return f"{dtype.dsl_name}: the wgmma skeleton multiplies 16-bit operands"
    if c != DAG_WGMMA_CONFIG:  # D 192, 256: dag_wgmma_rules.DAG_WGMMA_SPLIT
        return dag_wgmma_split_refusal(shape, tgt.smem_limit)
    cols = shape.resident_cols + shape.streamed_cols + shape.loop_row_n + shape.widths
    if any(n not in DAG_WGMMA_N for n in cols):
        return (f"every operand's columns must be one of {DAG_WGMMA_N} (whole 64-column boxes "
                "of the copy engine; a loop-row tile's half per warpgroup)")
    if shape.staged > 1:
        return "one staged tile value (a loop-row gemm's A) at most"
    _, need = dag_wgmma_smem_bytes(shape, DAG_WGMMA_BULK_ADD)
    if need > tgt.smem_limit:
        return f"it needs {need} B of shared memory; {tgt.arch.value} allows {tgt.smem_limit} B"
    regs = dag_wgmma_registers(shape)
    have = (DAG_WGMMA_VECTOR_REGISTERS[1] if DAG_WGMMA_STAGE_VECTORS and shape.vectors
            else CONSUMER_REGISTERS)
    if regs > have:
        return f"about {regs} registers per consumer thread (setmaxnreg gives {have})"
    return None
