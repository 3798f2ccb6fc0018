"""The copy engine's tensor maps (sm_90a): the CUtensorMap element type of each output dtype
the copy engine loads or stores. The schedule names the output and its kgen dtype (plan.TensorMap); the
emitter's C++ launcher and the runtime's encoder (kgen/runtime/tma.py) both spell it with this."""
from __future__ import annotations

from ...enums import DType

STAGING_BOX = 64  # the copy engine's box: 64 rows x 64 columns (128 bytes of 16-bit values)
TMA_DTYPE = {DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
             DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16",
             # f32: the DAG loop's tensor reduce-add into an `out accumulate` tensor (dQ)
             DType.F32: "CU_TENSOR_MAP_DATA_TYPE_FLOAT32",
             # the copy engine moves FP8 operands as bytes (it has no FP8 element type)
             DType.F8E4M3: "CU_TENSOR_MAP_DATA_TYPE_UINT8",
             DType.F8E5M2: "CU_TENSOR_MAP_DATA_TYPE_UINT8"}


def template_maps(maps, dim_expr, plan=None) -> list[dict]:
    """The values templates/sm90/tensor_maps.inc.j2 prints for each of the schedule's maps
    (`dim_expr`: a dimension as the host launcher spells it). A batched parameter's map has
    rank 3 (columns, rows, batches); a broadcast one (batch stride 0) is mapped with one batch,
    its batch pitch that of a whole matrix (never read: every batch reads batch 0)."""
    out = []
    for m in maps:
        param = plan.param(m.param) if plan is not None else None
        rows, cols = dim_expr(m.rows), dim_expr(m.cols)
        pitch = f"static_cast<cuuint64_t>(p.ld_{m.param}) * sizeof(p.{m.param}[0])"
        dims = [f"static_cast<cuuint64_t>({cols})", f"static_cast<cuuint64_t>({rows})"]
        strides = [pitch]
        box = [str(m.box[0]), str(m.box[1])]
        broadcast = False
        if param is not None and param.batch is not None:
            batch = f"p.batch_{m.param}"
            broadcast = True  # the template declares `broadcast`: batch stride 0
            dims.append(f"broadcast ? 1 : static_cast<cuuint64_t>({dim_expr(param.batch)})")
            pitch_elems = f"broadcast ? p.ld_{m.param} * {rows} : {batch}"
            strides.append(f"static_cast<cuuint64_t>({pitch_elems}) * sizeof(p.{m.param}[0])")
            box.append("1")
        out.append(dict(
            param=m.param, rows=rows, cols=cols, box_cols=m.box[0], box_rows=m.box[1],
            dtype=TMA_DTYPE[m.dtype], promotion=m.l2_promotion, rank=len(dims),
            dims=", ".join(dims), strides=", ".join(strides), box=", ".join(box),
            stride_count=len(strides), broadcast=broadcast, batch_stride=f"batch_{m.param}",
            unused=" || ".join([f"dims[{i}] == 0" for i in range(len(dims))]
                               + [f"strides[{i}] % 16 != 0" for i in range(len(strides))]),
            steps="steps" if len(dims) == 2 else "steps_3d",
            what=("stored" if m.store else "loaded") + f" in {m.box[1]}x{m.box[0]} boxes"
            + (" per batch" if broadcast else "")))
    return out


def steps_lines(template_maps: list[dict]) -> list[str]:
    """The element steps of the ranks template_maps' maps use (each map copies every element)."""
    from ..common.render import macro_lines  # here: kgen.runtime.tma reads TMA_DTYPE, not Jinja

    ranks = {m["rank"] for m in template_maps}
    return macro_lines("sm90/tensor_map_steps.inc.j2", "steps", two=2 in ranks, three=3 in ranks)


def names(maps) -> str:
    """'A, B and D': the mapped parameters, for comments."""
    params = [m.param for m in maps]
    return params[0] if len(params) == 1 else ", ".join(params[:-1]) + " and " + params[-1]
