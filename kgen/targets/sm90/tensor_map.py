"""The copy engine's tensor maps (sm_90a): the CUtensorMap element type of each output dtype
the copy engine stores. The schedule names the output and its kgen dtype (plan.TensorMap); the
emitter's C++ launcher and the runtime's encoder (kgen/runtime/tma.py) both spell it with this."""
from __future__ import annotations

from ...enums import DType

STAGING_BOX = 64  # the copy engine's box: 64 rows x 64 columns (128 bytes of 16-bit values)
TMA_DTYPE = {DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
             DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"}
