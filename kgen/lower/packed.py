"""Packed sequences in a loop kernel's plan (`packed S by cu_seqlens_q`, verified by
kgen/verify/packed.py): which parameters are addressed per sequence, the offsets vectors as
parameters of their own, and the params struct's members they add.

Per packed line the struct gains the offsets' pointer and the extent of every sequence
together (`rows_total` for the rows, `loop_total` for the loop's dimension): the sm_90a
skeleton's tensor maps span it. `rows` (`loop_len`) stays the longest sequence's: the grid's.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..errors import KgenError
from ..plan import program as pp

def run(kernel: ir.Kernel, rows_dim: ir.Dim, loop_dim: str,
        params: tuple[pp.ProgramParam, ...], fields: tuple[pp.ProgramField, ...]
        ) -> tuple[tuple[pp.ProgramParam, ...], tuple[pp.ProgramField, ...],
                   tuple[pp.PackedDim, ...]]:
    """The params and fields with the packed lines' additions, and the plan's PackedDims."""
    if not kernel.packed:
        return params, fields, ()
    dims: list[pp.PackedDim] = []
    along_of: dict[str, str] = {}
    for line in kernel.packed:
        along = "rows" if line.dim == rows_dim else "loop"
        assert along == "rows" or line.dim == loop_dim, "unverified IR: packed dim"
        dims.append(pp.PackedDim(line.dim, line.offsets, along))
        along_of[line.dim] = along
    out_params = []
    for p in params:
        first = p.shape[0] if p.shape else None
        if p.kind != "scalar" and first in along_of:
            p = dataclasses.replace(p, packed=along_of[first])
        out_params.append(p)
    extra: list[pp.ProgramField] = []
    for d in dims:
        out_params.append(pp.ProgramParam(
            name=d.offsets, kind="offsets", dtype=None, role=ir.Role.IN, shape=("B + 1",),
            layout=ir.Layout.ROW, batched=False, headed=False, kv=False))
        extra += [pp.ProgramField(d.offsets, "ptr", d.offsets),
                  pp.ProgramField(d.total, "i32")]
    names = [f.name for f in fields]
    for f in extra:
        if f.name in names:
            line = next(line for line in kernel.packed if line.offsets == f.name)
            raise KgenError(line.loc, f"the offsets name '{f.name}' collides with a member kgen "
                            "adds to the params struct; rename it")
        names.append(f.name)
    return tuple(out_params), tuple(fields) + tuple(extra), tuple(dims)
