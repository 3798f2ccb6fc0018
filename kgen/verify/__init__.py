"""Semantic checks on kgen IR, from the DSL or built in Python: the first problem, located.

`verify(module)` walks each kernel in source order and raises `KgenError(node.loc, message)` at
the first problem: unsafe or duplicate names, unknown targets, dtypes the MMA cannot take,
shapes that do not agree, stores to the wrong kind of parameter, outputs written zero or two
times, misplaced reductions. It assumes nothing that the parser checks, because Python code may
build the IR directly. Tile, warp and shared-memory feasibility belong to kgen/lower.

An accepted module may still hold something its author probably did not mean (today: an
epilogue local that no store uses). `verify` returns those as `KgenWarning`s, located, in source
order; they are collected, never raised, and the caller decides how to show them.

This module owns the order of the checks (the kernel, then its parameters, its gemms with their
epilogues, its storage, then its outputs). Each topic has its module: params.py, gemms.py
(operands and chains), epilogue.py (statements, expressions, reductions, unused locals),
storage.py, and the per-kernel state in state.py; a module's sequences, sequence.py. A tile program (a loop kernel, or a row kernel:
an epilogue and no gemm) is checked by loops.py, its epilogues' values by tile_epilogue.py.
Identifier safety and message phrasing are kgen/diagnostics.py's.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import (
    ARCH_NAMES,
    RESERVED_IDENTIFIERS,
    at_line,
    check_identifier,
    did_you_mean,
    first_located,
    loc_of,
    quote,
    shown,
)
from ..errors import NOWHERE, KgenError, KgenWarning, SourceLoc
from ..ir import Arch, DType, Role
from ..language import REDUCTIONS
from ..targets import TARGETS
from .epilogue import expression_extent
from .gemms import check_gemm
from .loops import check_tile_program
from .packed import refuse_packed
from .sequence import check_sequences
from .params import check_batched_kernel, check_param
from .state import KernelState
from .storage import check_storage

# The names other modules and tests import from kgen.verify; the helpers among them are
# kgen.diagnostics' and kgen.language's, still importable from here.
__all__ = [
    "verify",
    "verify_kernel",
    "KgenWarning",
    "expression_extent",
    "check_identifier",
    "RESERVED_IDENTIFIERS",
    "REDUCTIONS",
    "at_line",
    "did_you_mean",
    "quote",
]


def verify(module: ir.Module) -> list[KgenWarning]:
    """Check every kernel of a module; raise KgenError at the first problem. Returns the
    warnings of an accepted module, in source order (see KgenWarning)."""
    if not isinstance(module, ir.Module):
        raise KgenError(NOWHERE, f"verify() takes a kgen.ir.Module, got {type(module).__name__}")
    if not module.kernels:
        raise KgenError(NOWHERE, f"{module.file} holds no kernel")
    seen: dict[str, SourceLoc] = {}
    found: list[KgenWarning] = []
    for kernel in module.kernels:
        if not isinstance(kernel, ir.Kernel):
            raise KgenError(NOWHERE, f"a module holds kernels, got {type(kernel).__name__}")
        check_identifier(kernel.name, kernel.loc, "kernel")
        if kernel.name in seen:
            raise KgenError(
                kernel.loc,
                f"duplicate kernel name {quote(kernel.name)} "
                f"(first defined{at_line(seen[kernel.name])})",
            )
        found.extend(verify_kernel(kernel))
        seen[kernel.name] = kernel.loc
    check_sequences(module)  # the kernels the sequences launch are accepted
    return found


def verify_kernel(kernel: ir.Kernel) -> list[KgenWarning]:
    """Check one kernel; raise KgenError at the first problem, else return its warnings."""
    if not isinstance(kernel, ir.Kernel):
        raise KgenError(NOWHERE, f"verify_kernel() takes a kgen.ir.Kernel, got {shown(kernel)}")
    state = KernelState(kernel)
    try:
        _check_kernel(state)
    except RecursionError:
        raise KgenError(kernel.loc, "expression nested too deeply") from None
    return state.warnings


def _check_kernel(state: KernelState) -> None:
    k = state.kernel
    check_identifier(k.name, k.loc, "kernel")
    if not isinstance(k.target, Arch) or k.target not in TARGETS:
        raise KgenError(
            first_located(k.target_loc, k.loc),
            f"unknown target {quote(getattr(k.target, 'value', k.target))}; "
            f"expected {ARCH_NAMES}",
        )
    state.target = TARGETS[k.target]
    if k.compute_dtype not in (DType.F32, DType.F16, DType.BF16):
        name = getattr(k.compute_dtype, "dsl_name", None) or shown(k.compute_dtype)
        raise KgenError(k.loc, f"compute type {name} is not one of f32, f16, bf16")
    for attr in ("params", "gemms"):
        if not isinstance(getattr(k, attr), tuple):
            got = shown(getattr(k, attr))
            raise KgenError(k.loc, f"kernel {attr} must be a tuple, got {got}")
    for param in k.params:
        check_param(state, param)
    check_batched_kernel(state)
    if k.loop is None:
        refuse_packed(k)
    if k.loop is not None or k.epilogue is not None:
        if k.loop is None and k.gemms:
            raise KgenError(
                first_located(loc_of(k.epilogue), k.loc),
                "a kernel's own epilogue follows a loop, or is the whole body of a row kernel "
                f"(no gemm); kernel '{k.name}' has gemms: put these statements in the epilogue "
                f"of gemm '{getattr(k.gemms[-1], 'name', '?')}'",
            )
        check_tile_program(state)
        _check_outputs(state)
        return
    for gemm in k.gemms:
        if not isinstance(gemm, ir.Gemm):
            raise KgenError(k.loc, f"kernel gemms must be kgen.ir.Gemm, got {shown(gemm)}")
    for gemm in k.gemms:
        check_gemm(state, gemm)
    check_storage(state, k)
    # A kernel with only a storage declaration can be planned and inspected, not emitted.
    storage_only = not k.gemms and k.storage is not None
    if not k.gemms and not storage_only:
        raise KgenError(k.loc, f"kernel '{k.name}' has no gemm")
    _check_outputs(state, storage_only)


def _check_outputs(state: KernelState, storage_only: bool = False) -> None:
    k = state.kernel
    outputs = [p for p in k.params if p.role is Role.OUT]
    for param in outputs:
        if param.name not in state.written:
            raise KgenError(param.loc, f"output '{param.name}' is never written")
    if not outputs and not storage_only:
        raise KgenError(
            k.loc, f"kernel '{k.name}' has no output; mark a tensor 'out' and store to it"
        )
