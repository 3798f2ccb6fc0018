"""Tensor maps for the copy engine (sm_90a), encoded with the driver's cuTensorMapEncodeTiled.

A plan whose schedule lists tensor maps (plan.TensorMap: the operands its TMA ring loads, the
output it stores from staging) takes them as the kernel's second parameter: one CUtensorMap
(128 opaque bytes) per map, in the schedule's order, encoded from each parameter's address,
its extents and its leading dimension. The generated .cu's own launcher does the same in C++
(<name>_tensor_maps).
"""
from __future__ import annotations

import ctypes

from ..enums import DType
from ..plan import KernelPlan, TensorMap
from ..targets.sm90 import tensor_map as spelled  # TMA_DTYPE

MAP_BYTES = 128  # sizeof(CUtensorMap)


def encode_tiled(dtype: DType, address: int, dims: list[int], pitches: list[int],
                 box: list[int], promotion: str) -> bytes:
    """cuTensorMapEncodeTiled of `dtype` values: `dims` innermost first, `pitches` in bytes
    (one fewer), in boxes of `box` with the 128-byte swizzle."""
    from cuda.bindings import driver as cu

    from .device import check

    u32, u64 = cu.cuuint32_t, cu.cuuint64_t
    tensor_map = check(cu.cuTensorMapEncodeTiled(
        getattr(cu.CUtensorMapDataType, spelled.TMA_DTYPE[dtype]), u32(len(dims)), address,
        [u64(d) for d in dims], [u64(s) for s in pitches], [u32(b) for b in box],
        [u32(1)] * len(dims), cu.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        cu.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        getattr(cu.CUtensorMapL2promotion, f"CU_TENSOR_MAP_L2_PROMOTION_{promotion}"),
        cu.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE), "cuTensorMapEncodeTiled")
    return ctypes.string_at(tensor_map.getPtr(), MAP_BYTES)


def encode_2d(dtype: DType, address: int, rows: int, cols: int, ld: int,
              box: tuple[int, int], promotion: str) -> bytes:
    """The CUtensorMap of a matrix of 16-bit values (`rows` x `cols`, rows `ld` elements apart,
    columns contiguous) in boxes of `box` = (cols, rows) with the 128-byte swizzle. Elements
    past the matrix read as zeros and are clipped on stores."""
    return encode_tiled(dtype, address, [cols, rows], [ld * dtype.nbytes], list(box), promotion)


def encode_3d(dtype: DType, address: int, rows: int, cols: int, ld: int,
              box: tuple[int, int], promotion: str, batches: int, batch_stride: int) -> bytes:
    """The rank-3 CUtensorMap of a batched argument: encode_2d's matrix, `batches` of them
    `batch_stride` elements apart, in boxes of one batch. A broadcast one (batch stride 0) is
    mapped with one batch (the kernel reads batch 0 of it for every batch), its batch pitch
    that of a whole matrix."""
    if batch_stride == 0:
        batches, batch_stride = 1, ld * max(rows, 1)
    return encode_tiled(dtype, address, [cols, rows, batches],
                   [ld * dtype.nbytes, batch_stride * dtype.nbytes], [*box, 1], promotion)


def _extent(dim, sizes: dict) -> int:
    return dim if isinstance(dim, int) else int(sizes[dim])


def map_args(m: TensorMap, values: dict, sizes: dict, batch=None) -> tuple:
    """The arguments of encode_2d for map `m`, for one launch's arguments (`values`:
    params-struct members, `sizes`: the symbolic dimensions); of encode_3d when `batch` (the
    mapped parameter's batch dimension) is given."""
    key = (m.dtype, int(values[m.param]), _extent(m.rows, sizes), _extent(m.cols, sizes),
           int(values[f"ld_{m.param}"]), m.box, m.l2_promotion)
    if batch is None:
        return key
    return (*key, _extent(batch, sizes), int(values[f"batch_{m.param}"]))


def maps_args(plan: KernelPlan, values: dict, sizes: dict) -> tuple:
    """Every map's encode arguments, in the kernel parameter's order (a cache key)."""
    return tuple(map_args(m, values, sizes, plan.param(m.param).batch)
                 for m in plan.schedule.tensor_maps)


def usable(key: tuple) -> bool:
    """Whether the copy engine can take the matrix of encode_2d (or encode_3d) arguments `key`:
    not empty (the driver refuses a zero extent) and its address, row pitch and batch pitch
    16-byte multiples."""
    dtype, address, rows, cols, ld = key[:5]
    batches, batch_stride = key[7:] if len(key) > 7 else (1, 0)
    return (rows > 0 and cols > 0 and batches > 0 and address % 16 == 0
            and ld * dtype.nbytes % 16 == 0 and batch_stride * dtype.nbytes % 16 == 0)


def encode(keys: tuple) -> bytes:
    """The kernel's tensor-map parameter for maps_args' result. A map the copy engine cannot
    take stays zeros and is never read: an empty matrix (K = 0), or, in the narrow entry point,
    one whose rows miss the 16-byte rules (the kernel then copies it without the copy engine,
    by the same test of its address, leading dimension and batch stride)."""
    return b"".join((encode_3d(*key) if len(key) > 7 else encode_2d(*key)) if usable(key)
                    else bytes(MAP_BYTES) for key in keys)
