"""Verify a kernel's phases and storage declaration: the IR's shape only.

Phases and storage built in Python must hold the right kinds of nodes (Phase, SmemBuffer,
BufferRef, StageBuffers, Union, Struct) with string names and tuple members. Their meaning
(which phases exist, lifetimes, alignment, whether a union fits) is checked by
kgen/lower/storage.py and kgen/lower/unions.py, where the layout is computed.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import DTYPE_NAMES, first_located, loc_of, quote, shown
from ..errors import KgenError
from ..ir import DType
from .state import KernelState, require_str

__all__ = ["check_storage"]


def check_storage(state: KernelState, k: ir.Kernel) -> None:
    if not isinstance(k.phases, tuple) or not all(
        isinstance(p, ir.Phase) and isinstance(p.name, str) for p in k.phases
    ):
        raise KgenError(k.loc, f"kernel phases must be a tuple of kgen.ir.Phase, got "
                               f"{shown(k.phases)}")
    if k.storage is None:
        return
    if not isinstance(k.storage, ir.StorageDecl):
        raise KgenError(k.loc, f"kernel storage must be a kgen.ir.StorageDecl, got "
                               f"{shown(k.storage)}")
    decl = k.storage
    if not isinstance(decl.persistent, tuple) or not isinstance(decl.packed, tuple):
        raise KgenError(
            first_located(decl.loc, k.loc), "storage persistent and packed members must be tuples"
        )
    for m in decl.packed:
        if not isinstance(m, ir.SmemBuffer):
            raise KgenError(first_located(loc_of(m), decl.loc, k.loc),
                            f"packed storage members must be kgen.ir.SmemBuffer, got "
                            f"{shown(m)}")
    if decl.root is not None and not isinstance(decl.root, (ir.Union, ir.Struct)):
        raise KgenError(
            first_located(decl.loc, k.loc),
            f"storage root must be a kgen.ir.Union or Struct, got {shown(decl.root)}",
        )
    stack = list(decl.persistent) + ([decl.root] if decl.root is not None else [])
    stack += list(decl.packed)
    while stack:
        m = stack.pop()
        loc = first_located(loc_of(m), decl.loc, k.loc)
        if isinstance(m, (ir.Union, ir.Struct)):
            if not isinstance(m.members, tuple):
                raise KgenError(loc, "union and struct members must be a tuple")
            stack.extend(m.members)
        elif isinstance(m, ir.SmemBuffer):
            require_str(m.name, loc, "a buffer name")
            if not isinstance(m.dtype, DType):
                raise KgenError(loc, f"unknown dtype {quote(m.dtype)}; expected {DTYPE_NAMES}")
            if not isinstance(m.shape, tuple) or not isinstance(m.live, tuple) or not all(
                isinstance(r, ir.LiveRange) and isinstance(r.first, str)
                and isinstance(r.last, str) for r in m.live
            ):
                raise KgenError(loc, f"buffer {quote(m.name)}: shape must be a tuple of ints "
                                     "and live a tuple of kgen.ir.LiveRange")
        elif isinstance(m, ir.BufferRef):
            require_str(m.name, loc, "a buffer name")
        elif isinstance(m, ir.StageBuffers):
            if not isinstance(m.kind, ir.StageKind):
                raise KgenError(loc, f"stage kind must be a kgen.ir.StageKind, got "
                                     f"{shown(m.kind)}")
            require_str(m.gemm, loc, "a gemm name")
        else:
            raise KgenError(loc, f"not a storage member: {shown(m)}")
