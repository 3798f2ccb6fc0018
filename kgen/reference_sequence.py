"""The NumPy reference of a sequence: its kernels evaluated in launch order (kgen.reference's
`evaluate`, each on the buffers the earlier ones wrote), the workspace kept between them.

An `out accumulate` buffer holds the sum of the one kernel that adds into it (each kernel's
launch zeroes its own; verify refuses a second kernel adding into it), as any output holds
what its kernel wrote."""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import ir
from .verify.sequence import resolve

__all__ = ["evaluate_sequence"]


def evaluate_sequence(module: ir.Module, sequence: ir.Sequence,
                      inputs: Mapping[str, np.ndarray], scalars: Mapping[str, float] | None = None,
                      *, block: int | None = None, workspace: bool = False
                      ) -> dict[str, np.ndarray]:
    """The outputs of `sequence` (its parameters some kernel writes) from host `inputs` (its
    other parameters, logical arrays as kgen.evaluate takes them); with `workspace`, the
    workspace buffers too. `block`: the loops' block (each kernel's tile.n when None)."""
    from .reference import evaluate

    info = resolve(module, sequence)
    values: dict[str, Any] = dict(inputs)
    known = dict(scalars or {})
    for buffer in info.params:
        if buffer.kind is ir.ParamKind.SCALAR and buffer.name not in known:
            known[buffer.name] = buffer.param.default
    for kernel in info.kernels:
        taken = {p.name: values[p.name] for p in kernel.params
                 if p.kind is not ir.ParamKind.SCALAR and p.role is ir.Role.IN}
        own = {p.name: known[p.name] for p in kernel.params
               if p.kind is ir.ParamKind.SCALAR and known.get(p.name) is not None}
        block_of = block
        if block_of is None and kernel.loop is not None and kernel.loop.tile is not None:
            block_of = kernel.loop.tile.n
        outputs = evaluate(kernel, taken, own, block=block_of)
        for p in kernel.params:
            if p.role is ir.Role.OUT:
                values[p.name] = outputs[p.name]
    names = [b.name for b in info.outputs] + ([b.name for b in info.workspace] if workspace
                                              else [])
    return {name: values[name] for name in names}
