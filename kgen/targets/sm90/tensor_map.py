"""The copy engine's tensor maps (sm_90a): the CUtensorMap element type of each output dtype
the copy engine stores. The schedule names the output and its kgen dtype (plan.TensorMap); the
emitter's C++ launcher and the runtime's encoder (kgen/runtime/tma.py) both spell it with this."""
from __future__ import annotations

from ...enums import DType

STAGING_BOX = 64  # the copy engine's box: 64 rows x 64 columns (128 bytes of 16-bit values)
TMA_DTYPE = {DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
             DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"}


def template_maps(maps, dim_expr) -> list[dict]:
    """The values templates/sm90/tensor_maps.inc.j2 prints for each of the schedule's maps
    (`dim_expr`: a dimension as the host launcher spells it)."""
    return [dict(param=m.param, rows=dim_expr(m.rows), cols=dim_expr(m.cols), box_cols=m.box[0],
                 box_rows=m.box[1], dtype=TMA_DTYPE[m.dtype], promotion=m.l2_promotion,
                 what=("stored" if m.store else "loaded") + f" in {m.box[1]}x{m.box[0]} boxes")
            for m in maps]


def names(maps) -> str:
    """'A, B and D': the mapped parameters, for comments."""
    params = [m.param for m in maps]
    return params[0] if len(params) == 1 else ", ".join(params[:-1]) + " and " + params[-1]
