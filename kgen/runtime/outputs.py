"""The outputs a caller did not pass: their sizes from the inputs' shapes, their shapes and
strides from the plan (row-major, or column-major for a `col` tensor; a scalar output is 0-d).

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
        if p.kind is ParamKind.SCALAR or p.name not in shapes:
            continue
        for dim, extent in zip(p.shape, shapes[p.name]):
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
        for dim in p.shape:
            if isinstance(dim, int):
                shape.append(dim)
            elif dim in sizes:
                shape.append(sizes[dim])
            else:
                raise ArgumentError(
                    f"cannot allocate output {p.name}: its size {dim} appears in no argument; "
                    f"pass {p.name}, or sizes={{{dim!r}: ...}}")
        if len(shape) == 2 and p.layout is Layout.COL:
            strides = (1, shape[0])
        elif len(shape) == 2:
            strides = (shape[1], 1)
        else:
            strides = (1,) * len(shape)
        out[p.name] = (tuple(shape), strides)
    return out
