"""Tensor maps for the copy engine (sm_90a), encoded with the driver's cuTensorMapEncodeTiled.

A plan whose schedule has a `tma_output` stores its output with cp.async.bulk.tensor: the
kernel's second parameter is the output's CUtensorMap (128 opaque bytes), which the launcher
encodes from the output's address, its rows and its leading dimension. The generated .cu's own
launcher does the same in C++ (<name>_tensor_maps).
"""
from __future__ import annotations

import ctypes

from ..enums import DType
from ..targets.sm90 import tensor_map as schedule  # STAGING_BOX, TMA_DTYPE
from ..plan import KernelPlan

MAP_BYTES = 128  # sizeof(CUtensorMap)


def encode_2d(dtype: DType, address: int, rows: int, cols: int, ld: int) -> bytes:
    """The CUtensorMap of a row-major matrix of 16-bit values (`rows` x `cols`, rows `ld`
    elements apart) in boxes of 64 x 64 with the 128-byte swizzle: the layout of a ping-pong
    kernel's output staging. Rows and columns past the matrix are clipped on stores."""
    from cuda.bindings import driver as cu

    from .device import check

    box = schedule.STAGING_BOX
    u32, u64 = cu.cuuint32_t, cu.cuuint64_t
    tensor_map = check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, schedule.TMA_DTYPE[dtype]), u32(2), address,
        [u64(cols), u64(rows)], [u64(ld * dtype.nbytes)], [u32(box), u32(box)], [u32(1), u32(1)],
        cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        cu.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tensor_map.getPtr(), MAP_BYTES)


def output_args(plan: KernelPlan, values: dict, sizes: dict) -> tuple:
    """What a TMA-store plan's output map is encoded from, for one launch's arguments
    (`values`: params-struct members, `sizes`: the symbolic dimensions): the arguments of
    encode_2d."""
    last = plan.gemms[-1]
    out = last.epilogue.packed_store.param
    rows = sizes[last.m_dim] if isinstance(last.m_dim, str) else last.m_dim
    return (plan.param(out).dtype, int(values[out]), rows, last.n_dim,
            int(values[f"ld_{out}"]))


def output_map(plan: KernelPlan, values: dict, sizes: dict) -> bytes:
    """The tensor map of a TMA-store plan's output for one launch's arguments."""
    return encode_2d(*output_args(plan, values, sizes))
