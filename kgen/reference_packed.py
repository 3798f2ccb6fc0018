"""The meaning of a loop kernel over packed sequences (`packed S by cu_seqlens_q`): per
sequence b, the dense kernel (kgen/reference_tiles.py) on batch b's slice of each packed input,
its outputs put back in place.

Inputs as the runtime takes them: a packed parameter [B, H, S, D] as [H, total, D] (a vector
[B, H, S] as [H, total]), its batch fused into the packed dimension; each offsets vector (named
by its packed line) as B + 1 integers. Outputs come back packed the same way. Inside sequence
b the packed sizes, `row` and `col` are that sequence's own; a dense batched input is read at
batch b.
"""
from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

from . import ir
from .reference import host_dtype


def evaluate_packed(kernel: ir.Kernel, inputs: Mapping[str, np.ndarray],
                    scalars: Mapping[str, float], block: int | None) -> dict[str, np.ndarray]:
    from .reference_tiles import evaluate_tiles

    dims = {line.dim: line for line in kernel.packed}
    offsets = {line.dim: np.asarray(inputs[line.offsets]).astype(np.int64)
               for line in kernel.packed}
    counts = {len(o) - 1 for o in offsets.values()}
    if len(counts) != 1 or min(counts) < 0:
        raise ValueError("the offsets vectors must hold B + 1 entries each, one B")
    (count,) = counts
    dense = dataclasses.replace(kernel, packed=())
    packed_of = {p.name: p.shape[0] for p in kernel.params
                 if p.shape and p.shape[0] in dims and p.kind is not ir.ParamKind.SCALAR}
    outputs = [p for p in kernel.params if p.role is ir.Role.OUT]
    results: dict[str, np.ndarray] = {}
    for b in range(count):
        view = {}
        for name, array in inputs.items():
            if name in packed_of:
                o = offsets[packed_of[name]]
                heads = kernel.param(name).heads is not None
                part = np.asarray(array)[:, o[b]:o[b + 1]] if heads else \
                    np.asarray(array)[o[b]:o[b + 1]]
                view[name] = part[None]
            elif kernel.param(name) is not None and kernel.param(name).batch is not None:
                view[name] = np.asarray(array)[b:b + 1]
            elif kernel.param(name) is not None:
                view[name] = array
        one = evaluate_tiles(dense, view, scalars, None, 1, block)
        for p in outputs:
            part = one[p.name][0]
            if p.name not in packed_of:
                results.setdefault(p.name, []).append(part)
                continue
            o = offsets[packed_of[p.name]]
            if p.name not in results:
                total = int(o[-1])
                shape = list(part.shape)
                shape[1 if p.heads is not None else 0] = total
                results[p.name] = np.zeros(shape, host_dtype(p.dtype))
            if p.heads is not None:
                results[p.name][:, o[b]:o[b + 1]] = part
            else:
                results[p.name][o[b]:o[b + 1]] = part
    for p in outputs:
        value = results.get(p.name)
        if isinstance(value, list):
            results[p.name] = np.stack(value)
    return results
