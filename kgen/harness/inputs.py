"""Sizes, shapes and random inputs of a kernel run, from the kernel's IR.

Inputs are random normals scaled so every sum over K stays O(1) (A operands by 1/sqrt(K)),
never zeros; scalars get random values in [0.5, 1.5] unless given, so a `beta = 0` default does
not hide a wrong C path.
"""
from __future__ import annotations

import math
from typing import Mapping

import numpy as np

from .. import ir
from ..errors import ArgumentError
from ..lower.abi import block_dims
from ..reference import host_dtype
from ..runtime.launch import MAX_SIZE

DEFAULT_SIZE = 1024  # for a symbolic size the caller does not give
DEFAULT_BATCHES = 4  # for a symbolic batch dimension the caller does not give


def symbolic_dims(kernel: ir.Kernel) -> list[str]:
    dims: list[str] = []
    for param in kernel.params:
        for dim in param.full_shape:
            if isinstance(dim, str) and dim not in dims:
                dims.append(dim)
    return dims


def resolve_sizes(kernel: ir.Kernel, sizes: Mapping[str, int] | None) -> dict[str, int]:
    """Every symbolic size: the given ones, DEFAULT_SIZE (DEFAULT_BATCHES for a batch or
    heads dimension) for the others."""
    sizes = dict(sizes or {})
    dims = symbolic_dims(kernel)
    for name, value in sizes.items():
        if name not in dims:
            known = ", ".join(dims) if dims else "none"
            raise ArgumentError(f"unknown size {name!r}; {kernel.name}'s sizes are {known}")
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ArgumentError(f"size {name} must be a non-negative integer, got {value!r}")
        if value > MAX_SIZE:
            raise ArgumentError(
                f"{name} = {value} is above 2**30-1, the largest size kgen takes (the kernel's "
                "index math is 32-bit)"
            )
    batch = {d for p in kernel.params for d in (p.batch, p.heads) if d is not None}
    counted = {r.dim: r for r in block_dims(kernel)}  # a block scale's blocks: from K or N
    resolved = {dim: sizes.get(dim, DEFAULT_BATCHES if dim in batch else DEFAULT_SIZE)
                for dim in dims if dim not in counted}
    for dim, rule in counted.items():
        of = rule.of if isinstance(rule.of, int) else resolved[rule.of]
        resolved[dim] = sizes.get(dim, -(-of // rule.block))
    return {dim: resolved[dim] for dim in dims}


def block_scale_params(kernel: ir.Kernel) -> set[str]:
    """The tensors of the gemms' block scales."""
    return {s.param for g in gemms_of(kernel) for s in g.scales}


def shape_of(param: ir.Param, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The argument's shape (the batch dimension first, when it has one)."""
    if param.kind is ir.ParamKind.SCALAR and param.batch is None:
        return (1,)
    return tuple(d if isinstance(d, int) else sizes[d] for d in param.full_shape)


def matrix_shape_of(param: ir.Param, sizes: Mapping[str, int]) -> tuple[int, ...]:
    """The shape of one batch's matrix or vector (the whole argument when not batched)."""
    return tuple(d if isinstance(d, int) else sizes[d] for d in param.shape)


def batches_of(kernel: ir.Kernel, sizes: Mapping[str, int]) -> int:
    """L, the batch count (1 for a kernel without a batch dimension)."""
    batch = next((p.batch for p in kernel.params if p.batch is not None), None)
    if batch is None:
        return 1
    return batch if isinstance(batch, int) else sizes[batch]


def gemms_of(kernel: ir.Kernel) -> tuple[ir.Gemm, ...]:
    """The kernel's gemms, a loop's included (a row kernel has none)."""
    return kernel.gemms + (kernel.loop.gemms if kernel.loop is not None else ())


def _gemm_k(kernel: ir.Kernel, gemm: ir.Gemm, sizes: Mapping[str, int]) -> int:
    b = kernel.param(gemm.b.name)
    dim = b.shape[1] if gemm.b.transposed else b.shape[0]  # B^T: B's columns are the K
    return dim if isinstance(dim, int) else sizes[dim]


def input_scales(kernel: ir.Kernel, sizes: Mapping[str, int]) -> dict[str, float]:
    """Standard deviations that keep each gemm's accumulator O(1): the tensor on the A side
    (or B of a chained gemm, whose A is already O(1)) gets 1/sqrt(K)."""
    scales: dict[str, float] = {}
    gemms = gemms_of(kernel)
    gemm_names = {g.name for g in gemms}
    for gemm in gemms:
        k = max(_gemm_k(kernel, gemm, sizes), 1)
        if gemm.a.name in gemm_names:
            scales[gemm.b.name] = 1.0 / math.sqrt(k)
        else:
            scales.setdefault(gemm.a.name, 1.0 / math.sqrt(k))
            scales.setdefault(gemm.b.name, 1.0)
    return scales


def make_inputs(kernel: ir.Kernel, sizes: Mapping[str, int],
                rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Random logical host arrays for every input tensor and vector, in their dtypes."""
    scales = input_scales(kernel, sizes)
    block_scales = block_scale_params(kernel)
    inputs: dict[str, np.ndarray] = {}
    for param in kernel.params:
        if param.role is not ir.Role.IN or param.kind is ir.ParamKind.SCALAR:
            continue
        shape = shape_of(param, sizes)
        if param.kind is ir.ParamKind.VECTOR or param.name in block_scales:
            # Magnitudes in [0.25, 1] with random signs: biases and scales, never zero.
            values = rng.uniform(0.25, 1.0, shape) * rng.choice([-1.0, 1.0], shape)
        else:
            values = rng.standard_normal(shape, dtype=np.float32) * scales.get(param.name, 1.0)
        inputs[param.name] = np.asarray(values, dtype=np.float32).astype(host_dtype(param.dtype))
    return inputs


def scalar_names(kernel: ir.Kernel) -> list[str]:
    return [p.name for p in kernel.params
            if p.kind is ir.ParamKind.SCALAR and p.role is ir.Role.IN]


def check_scalar_names(kernel: ir.Kernel, given: Mapping[str, float] | None) -> None:
    names = scalar_names(kernel)
    for name in given or {}:
        if name not in names:
            raise ArgumentError(f"unknown scalar {name!r}; {kernel.name}'s scalars are "
                                + (", ".join(names) or "none"))


def pick_scalars(kernel: ir.Kernel, given: Mapping[str, float] | None,
                 rng: np.random.Generator) -> dict[str, float]:
    """The given scalars, and random values in [0.5, 1.5] for the others."""
    given = dict(given or {})
    check_scalar_names(kernel, given)
    scalars: dict[str, float] = {}
    for name in scalar_names(kernel):
        scalars[name] = float(given[name]) if name in given else round(rng.uniform(0.5, 1.5), 3)
    return scalars
