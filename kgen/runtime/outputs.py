"""The outputs a caller did not pass: their sizes from the inputs' shapes, their shapes and
strides from the plan (row-major, or column-major for a `col` tensor; a scalar output is 0-d;
a batched output holds its batches one after the other).

Pure functions of the plan and the shapes, so `kgen.load` kernels and the torch operator
(`kgen.torch_op`) allocate alike, and both are testable without a GPU.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..enums import Layout, ParamKind
from ..errors import ArgumentError
from ..plan import KernelPlan, Param


def inputs_of(plan: KernelPlan) -> tuple[Param, ...]:
    return tuple(p for p in plan.params if not p.is_output)


def outputs_of(plan: KernelPlan) -> tuple[Param, ...]:
    return tuple(p for p in plan.params if p.is_output)


def infer_sizes(plan: KernelPlan, shapes: Mapping[str, tuple]) -> dict[str, Any]:
    """Runtime sizes (M, N, K, ...) from the logical shapes of the arrays given, by name. Any
    int-like extents work (torch.compile's symbolic ones too); the argument check compares
    them again before a launch."""
    sizes: dict[str, Any] = {}
    for p in plan.params:
        if p.kind is ParamKind.SCALAR and p.batch is None or p.name not in shapes:
            continue
        for dim, extent in zip(p.full_shape, shapes[p.name]):
            if isinstance(dim, str) and dim not in sizes:
                sizes[dim] = extent
    return sizes


def output_shapes(plan: KernelPlan, sizes: Mapping[str, Any], names=None
                  ) -> dict[str, tuple[tuple[Any, ...], tuple[Any, ...]]]:
    """name -> (shape, strides in elements) of each output (or of those in `names`)."""
    out = {}
    for p in outputs_of(plan):
        if names is not None and p.name not in names:
            continue
        shape = []
        for dim in p.full_shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif dim in sizes:
                shape.append(sizes[dim])
            else:
                raise ArgumentError(
                    f"cannot allocate output {p.name}: its size {dim} appears in no argument; "
                    f"pass {p.name}, or sizes={{{dim!r}: ...}}")
        matrix = shape[-len(p.shape):] if p.shape else []
        if len(matrix) == 2 and p.layout is Layout.COL:
            strides = (1, matrix[0])
        elif len(matrix) == 2:
            strides = (matrix[1], 1)
        else:
            strides = (1,) * len(matrix)
        if p.batch is not None:  # the batches one after the other
            size = 1
            for extent in matrix:
                size = size * extent
            strides = (size, *strides)
        out[p.name] = (tuple(shape), strides)
    return out
