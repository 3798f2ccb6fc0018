"""The rulebook of loop kernels (tile programs with a loop): which (tile_m, block, warps, stages)
a target allows for given K0 (the loop-invariant operand's columns), N1 (the accumulator's
columns) and operand dtype, each refusal with its reason, and the configurations the builder
tries, best first. One home: the lowering (kgen/lower/program.py) asks `refusal` for a written
schedule and `default` for a missing one; nothing else decides it. Both targets run the same
mma.sync skeleton for now (sm_90a's wgmma skeleton is the next issue's), so the rules are one.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..enums import DType
from . import Target

TILE_M = (64, 128)
BLOCKS = (32, 64, 128)
STAGES = (1, 2, 3)
ROWS_PER_WARP = 16  # each warp owns 16 whole rows: its row reductions stay inside the warp

# Registers: ptxas keeps 255 per thread at most. A thread holds block/2 f32 of the first gemm's
# accumulator and N1/2 of the carried one; the epilogue's tile values (about one more block/2
# array live at a time), row state, addresses and fragments in flight take about 48 more. The
# estimate must stay within REGISTER_BUDGET, below 255 for what the estimate leaves out. NVRTC
# 13 (sm_80, the MLP loop; attention needs fewer) measured, as (N1, block): registers
#   (64, 32) 127, (64, 64) 146, (64, 128) 233, (128, 32) 137, (128, 64) 178, (128, 128) 255,
#   (256, 32) 254, (256, 64) 255 and 8 B of spills.
# The budget takes every pair up to (64, 128) and (256, 32) and refuses (128, 128) (at the
# limit: one more value would spill) and (256, 64) (spills). tests/targets/test_loop_compile.py
# compiles the defaults and written configurations with 0 spills.
REGISTER_BUDGET = 208
REGISTER_OVERHEAD = 48


@dataclass(frozen=True, slots=True)
class LoopConfig:
    tile_m: int
    block: int
    stages: int

    @property
    def warps(self) -> int:
        return self.tile_m // ROWS_PER_WARP


def smem_bytes(config: LoopConfig, k0: int, n1: int, dtype: DType) -> int:
    """The A tile once, and per ring slot a block of B ([block, K0]) and of C ([block, N1])."""
    return dtype.nbytes * (config.tile_m * k0 + config.stages * config.block * (k0 + n1))


def registers(config: LoopConfig, n1: int) -> int:
    """The estimate of registers per thread (see REGISTER_OVERHEAD)."""
    return n1 // 2 + config.block + REGISTER_OVERHEAD


def refusal(config: LoopConfig, k0: int, n1: int, dtype: DType, tgt: Target) -> str | None:
    """Why `target` cannot run this configuration, or None."""
    if config.tile_m not in TILE_M:
        return f"tile {config.tile_m}x{config.block}: rows per CTA must be one of {TILE_M}"
    if config.block not in BLOCKS:
        return f"tile {config.tile_m}x{config.block}: the block must be one of {BLOCKS}"
    if config.stages not in STAGES:
        return f"stages {config.stages}: a loop's ring has 1 to 3 slots"
    need = smem_bytes(config, k0, n1, dtype)
    if need > tgt.smem_limit:
        return (f"tile {config.tile_m}x{config.block} stages {config.stages} needs {need} B of "
                f"shared memory ({config.tile_m}x{k0} A tile + {config.stages} x ({config.block}"
                f"x{k0} + {config.block}x{n1}) streamed); {tgt.arch.value} allows "
                f"{tgt.smem_limit} B")
    regs = registers(config, n1)
    if regs > REGISTER_BUDGET:
        return (f"block {config.block} with N1 {n1} needs about {regs} registers per thread "
                f"(the budget is {REGISTER_BUDGET} of 255: it would spill)")
    return None


# Best first: 128 rows per CTA (8 warps) halves the streamed bytes per row against 64; a block of
# 64 keeps the scores' registers small; two slots overlap the next block's copy with this
# one's math.
PREFERENCE = tuple(LoopConfig(m, b, s) for m, b, s in (
    (128, 64, 2), (128, 64, 1), (64, 64, 2), (64, 64, 1), (128, 32, 2), (64, 32, 2),
    (64, 32, 1)))


# Every configuration the rules name, PREFERENCE first: a written line may ask for any of them.
EVERY = PREFERENCE + tuple(
    c for c in (LoopConfig(m, b, s) for m in TILE_M[::-1] for b in BLOCKS for s in STAGES)
    if c not in PREFERENCE)


def default(k0: int, n1: int, dtype: DType, tgt: Target,
            tile_m: int | None = None, block: int | None = None,
            stages: int | None = None) -> tuple[LoopConfig, str]:
    """The first configuration (PREFERENCE, then the rest of EVERY) that keeps the written
    values and is legal, with why; raises ValueError (the lowering locates it) when none is."""
    for config in EVERY:
        if ((tile_m is not None and config.tile_m != tile_m)
                or (block is not None and config.block != block)
                or (stages is not None and config.stages != stages)):
            continue
        if refusal(config, k0, n1, dtype, tgt) is None:
            return config, ("the rulebook's first legal configuration for K0 "
                            f"{k0}, N1 {n1}, {dtype.dsl_name} on {tgt.arch.value} "
                            "(kgen/targets/loop_rules.py)")
    written = LoopConfig(tile_m or 128, block or 64, stages or 2)
    raise ValueError(refusal(written, k0, n1, dtype, tgt)
                     or "no legal loop configuration keeps the written lines")


# Below this estimate (kgen/targets/loop_rules.py: registers) a loop asks ptxas for two CTAs per
# SM (128 registers a thread at 256 threads); NVRTC 13 measured head dim 64 at 116-128 with no
# spill. Above it, one: left free, ptxas aimed at two CTAs for head dim 96 on sm_90a (128
# registers) and spilled 28 B; asked for one, it took 150 and spilled none.
TWO_CTAS_REGISTERS = 144


def min_ctas_per_sm(config: LoopConfig, n1: int) -> tuple[int, str]:
    """The CTAs per SM the kernel's launch bounds ask for, and why."""
    regs = registers(config, n1)
    if regs <= TWO_CTAS_REGISTERS:
        return 2, (f"about {regs} registers a thread (at most {TWO_CTAS_REGISTERS}): two CTAs "
                   "fit an SM's registers")
    return 1, (f"about {regs} registers a thread (over {TWO_CTAS_REGISTERS}): one CTA per SM, "
               "so ptxas takes the registers it needs rather than spill to fit two")
