"""The DSL's fixed vocabulary and limits, shared by the parser, the verifier and diagnostics.

Reduction names (`rowsum`, `colmax`, `reduce_absmax`, ...) and the numeric bounds every setting,
dimension and expression must respect. The functions (`relu`, `exp`, ...) are `kgen.enums`'
FUNCTIONS; the keywords the grammar spells are listed with the reserved names in
kgen/diagnostics.py.
"""
from __future__ import annotations

from .enums import Axis, ReduceOp

MAX_SETTING = 65536  # tile sizes, warp counts, stages
MAX_DIM = 2**30 - 1  # fixed tensor dimensions: the kernel's 32-bit index math needs headroom
MAX_EXPR_DEPTH = 100  # operations nested in one epilogue expression, locals substituted
MAX_EXPR_NODES = 4096  # operations in one epilogue expression, locals substituted
MAX_ALIGN = 1024  # a buffer's `align(N)`; kgen/lower/storage.py checks the rest
F32_MAX = 3.4028234663852886e38

# Reductions by their DSL name: row* give one value per output row, col* one per column,
# reduce_* one for the whole output.
REDUCTIONS: dict[str, tuple[ReduceOp, Axis]] = {
    **{f"row{op.value}": (op, Axis.ROW) for op in ReduceOp},
    **{f"col{op.value}": (op, Axis.COL) for op in ReduceOp},
    **{f"reduce_{op.value}": (op, Axis.ALL) for op in ReduceOp},
}


def reduction_name(op: ReduceOp, axis: Axis) -> str:
    return next(name for name, key in REDUCTIONS.items() if key == (op, axis))
