"""Verify a gemm's block scales (`scale A by SA 1x128`, `scale B by SB 128x128`).

DeepGEMM's recipe: A (activations) takes one f32 scale per row per 128 of K, a tensor
[M, ceil(K / 128)]; B (weights) one per block of 128 columns by 128 of K, a tensor
[ceil(N / 128), ceil(K / 128)]. Each scale must name one of the gemm's FP8 operands, once; the
scale tensor is an f32 input of rank 2, not batched, either layout. Its block dimensions are
names (sizes the runtime checks against ceil(K / 128) and ceil(N / 128): kgen/lower/abi.py's
BlockDim) or numbers that equal them where K and N are numbers. Whether a schedule can apply
them (each k tile's sums promoted alone) is the target rulebook's.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import at_line, first_located, shape_text, shown
from ..errors import KgenError
from ..ir import DType, ParamKind, Role
from .state import KernelState

__all__ = ["check_scales", "BLOCKS", "SCALE_K"]

SCALE_K = 128  # the K elements one scale covers: a k tile of FP8 (128 bytes)
# the block each operand takes: (rows of M or columns of N, K)
BLOCKS = {"A": (1, SCALE_K), "B": (128, SCALE_K)}
WHAT = {"A": "one scale per row per 128 of K: [M, ceil(K / 128)]",
        "B": "one scale per 128 columns per 128 of K: [ceil(N / 128), ceil(K / 128)]"}


def check_scales(state: KernelState, g: ir.Gemm, a: ir.Param | None, b: ir.Param) -> None:
    """The gemm's scales against its operands `a` (None: a chained A) and `b`."""
    if not isinstance(g.scales, tuple):
        raise KgenError(g.loc, f"gemm '{g.name}': scales must be a tuple of kgen.ir.BlockScale")
    seen: dict[str, ir.BlockScale] = {}
    for s in g.scales:
        if not isinstance(s, ir.BlockScale):
            raise KgenError(g.loc, f"gemm '{g.name}': a scale must be a kgen.ir.BlockScale, "
                                   f"got {shown(s)}")
        loc = first_located(s.loc, g.loc)
        operands = {g.a.name: ("A", a), g.b.name: ("B", b)}
        if s.operand not in operands:
            raise KgenError(loc, f"scale {s.operand}: gemm '{g.name}' multiplies "
                                 f"'{g.a.name}' and '{g.b.name}'; a block scale names one of them")
        which, op = operands[s.operand]
        if which in seen:
            raise KgenError(loc, f"scale {s.operand} given twice in gemm '{g.name}' "
                                 f"(first{at_line(seen[which].loc)})")
        seen[which] = s
        if op is None or not op.dtype.fp8:
            dtype = "an earlier gemm's output" if op is None else op.dtype.dsl_name
            raise KgenError(loc, f"scale {s.operand}: block scales dequantize FP8 operands "
                                 f"(f8e4m3, f8e5m2); {which} '{s.operand}' is {dtype}")
        if op.batch is not None:
            raise KgenError(loc, f"scale {s.operand}: block scales of a batched operand are not "
                                 "built")
        if tuple(s.block) != BLOCKS[which]:
            want = "x".join(map(str, BLOCKS[which]))
            raise KgenError(loc, f"scale {s.operand} by {s.param} "
                                 f"{'x'.join(map(str, s.block))}: {which} takes {want} blocks "
                                 f"({WHAT[which]}), the granularity the kernel applies as it "
                                 "promotes each 128-wide k block")
        _check_tensor(state, g, s, which, a, b)


def _check_tensor(state: KernelState, g: ir.Gemm, s: ir.BlockScale, which: str,
                  a: ir.Param, b: ir.Param) -> None:
    loc = first_located(s.param_loc, s.loc, g.loc)
    p = state.params.get(s.param)
    if p is None:
        raise KgenError(loc, f"scale {s.operand} by {s.param}: no parameter '{s.param}'; declare "
                             f"it, e.g. 'tensor {s.param} : f32[...]' ({WHAT[which]})")
    if p.kind is not ParamKind.TENSOR or p.role is not Role.IN or p.batch is not None:
        raise KgenError(loc, f"scale {s.operand} by {s.param}: '{s.param}'{at_line(p.loc)} must be "
                             f"an input tensor (not batched) of {WHAT[which]}")
    if p.dtype is not DType.F32:
        raise KgenError(loc, f"scale {s.operand} by {s.param}: '{s.param}'{at_line(p.loc)} is "
                             f"{p.dtype.dsl_name}; block scales are f32")
    if s.param in (a.name, b.name):
        raise KgenError(loc, f"scale {s.operand} by {s.param}: '{s.param}' is an operand")
    m, k = a.shape
    n = b.shape[1]
    want = ((m, _blocks(k)) if which == "A" else (_blocks(n), _blocks(k)))
    shown_want = ("[M, ceil(K / 128)]" if which == "A" else "[ceil(N / 128), ceil(K / 128)]")
    if len(p.shape) != 2:
        raise KgenError(loc, f"scale {s.operand} by {s.param}: '{s.param}' is "
                             f"{shape_text(p.shape)}; it must be {shown_want}")
    for axis, (got, expected) in enumerate(zip(p.shape, want)):
        if _agrees(got, expected, (m, n, k)):
            continue
        if isinstance(expected, str):  # A's rows: the same dimension as A's
            need = f"{expected} (A's rows)"
        elif isinstance(expected, int):
            need = str(expected)
        else:
            need = f"ceil({expected[0]} / 128), a size of its own"
        raise KgenError(loc, f"scale {s.operand} by {s.param}: '{s.param}' is "
                             f"{shape_text(p.shape)}; it must be {shown_want} (dimension {axis}: "
                             f"{need}, not {got})")


def _blocks(dim):
    """ceil(dim / 128): a number where dim is one, else ("K",) for a name."""
    return -(-dim // SCALE_K) if isinstance(dim, int) else (dim,)


def _agrees(got, expected, dims) -> bool:
    """A declared dimension against what the scale needs: the same size (A's rows), the block
    count where the dimension it counts is a number, else a name of its own (not one of the
    gemm's M, N, K: the runtime checks it against the block count)."""
    if isinstance(expected, tuple):
        return isinstance(got, str) and got not in dims
    return got == expected
