"""FP8 operands on the sm_80 family: sm_89's mma.sync m16n8k32 with e4m3 and e5m2 operands
(mixed too), f32 accumulators, on the sm_80 mainloop (cp.async stages, ldmatrix fragments).
sm_80 and sm_86 have no FP8 tensor cores: verify refuses FP8 there (kgen/verify/gemms.py).

    operands  K-major only (A row-major, B col-major). ldmatrix moves 8x8 matrices of 16-bit
              elements and its .trans swaps 16-bit halves, never bytes, so an M- or N-major
              8-bit tile has no fragment load. A K-major tile's m16n8k32 fragments are byte
              for byte an m16n8k16 16-bit tile's (4 consecutive k bytes per register where
              16-bit has 2 elements): the same ldmatrix.x4 addresses read them, a k32 step
              over the same 32 bytes of each row as a k16 step (kgen/lower/fragments.py).
    k tile    a multiple of 64 elements: two k32 steps, for the fragments' double buffer
              (kgen/targets/rules.py `tile_refusal`, with the operand bytes).
    configs   the sm_80 list's shapes (kgen/targets/common/configs.py: 128x256 on 2x4 warps
              first, its warp tiles 64x64) with k tiles of 64 or 128 bytes, each with the
              deepest stages that fit sm_89's 99 KiB: a warp holds the fragment and accumulator
              registers of the 16-bit tile of the same bytes; every one compiles for sm_89
              without spills. Not measured on an sm_89 GPU: an H200's build of the same source
              (bench/fp8.py --sm89) runs FP8 mma.sync at ~300 TFLOP/s with more registers (the
              64x64 warp tiles spill there), which says nothing of Ada's order. Split-K is not
              listed (not measured for FP8).
    scales    tensor-wise (scalars) and per row or column (vectors), in the epilogue; 1x128 and
              128x128 block scales are sm_90a's (applied as its FP8 accumulators are promoted
              each 128 of k) and refused here.
"""
from __future__ import annotations

from typing import Mapping

from .. import Config, GemmConfig, GemmShape
from ..common import configs as common

# (tile, warps, stages, deepest first), each within sm_89's 99 KiB: a stage is (M + N) x K bytes.
# 128x256 on 2x4 warps is the sm_80 list's first tile (kgen/targets/common/configs.py); at
# 64-byte k rows it keeps 4 stages (96 KiB), where 128-byte rows would leave it 2.
ONE_GEMM = (
    ((128, 256, 64), (2, 4), (4, 3)),
    ((128, 128, 128), (2, 2), (3,)),
    ((128, 128, 64), (2, 2), (4, 3)),
    ((64, 128, 128), (2, 2), (4, 3)),
    ((64, 64, 128), (2, 2), (4, 3)),
    ((64, 64, 64), (2, 2), (4, 3, 2)),
)
# the tuner's longer list
ONE_GEMM_WIDE = ONE_GEMM + (
    ((256, 128, 64), (4, 2), (4, 3)),
    ((128, 256, 128), (2, 4), (2,)),
    ((128, 128, 64), (2, 2), (6,)),
    ((64, 256, 64), (1, 4), (4, 3)),
    ((32, 128, 128), (1, 4), (4, 3)),
)
WHY = ("sm_89's mma.sync m16n8k32 on FP8 operands (cp.async, ldmatrix): the largest tile "
       "that plans, its deepest stages within 99 KiB")


def configs(shape: GemmShape, sizes: Mapping[str, int], wide: bool) -> list[Config]:
    """The configurations of one FP8 gemm on sm_89, best first (in order of the padding their
    tiles add to a known M and N)."""
    table = ONE_GEMM_WIDE if wide else ONE_GEMM
    out = [Config((GemmConfig(tile, warps, s),), why=WHY)
           for tile, warps, stages in table for s in stages]
    return common.fitting_first(out, shape, sizes)
