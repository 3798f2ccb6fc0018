"""Verify the gemm stages and their chains.

A gemm's settings are positive and in range; its operands are input tensors (or, for A, the
output of an earlier gemm, which then feeds only this one) with agreeing inner dimensions and
a dtype the target's MMA takes; its accumulate type is one the target supports; `keep` and
`resident` apply where they can. Its epilogue is checked by kgen/verify/epilogue.py against the
(M, N) shape it produces. Whether a tile fits, divides or can chain is kgen/lower's to decide.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import (
    at_line,
    did_you_mean,
    first_located,
    or_list,
    quote,
    setting_problem,
    shape_text,
    shown,
)
from ..errors import KgenError
from ..ir import DType, ParamKind, Role
from ..targets import Instruction
from ..targets import rules
from .epilogue import check_epilogue
from .scales import check_scales
from .state import KernelState, require_str

__all__ = ["check_gemm"]


def check_gemm(state: KernelState, g: ir.Gemm) -> None:
    loc = g.loc
    state.define(g.name, "gemm", loc)
    for attr, cls in (
        ("a", ir.OperandRef),
        ("b", ir.OperandRef),
        ("tile", ir.TileShape),
        ("warps", ir.WarpGrid),
        ("stages", ir.StageCount),
        ("epilogue", ir.Epilogue),
    ):
        optional = attr in ("tile", "warps", "stages")  # None: kgen fills the line
        if not isinstance(getattr(g, attr), cls) and not (optional and getattr(g, attr) is None):
            raise KgenError(
                loc, f"gemm '{g.name}': {attr} must be a kgen.ir.{cls.__name__}"
            )
    check_settings(state, g)
    check_split(state, g)
    check_cluster(state, g)

    a_loc = first_located(g.a.loc, loc)
    b_loc = first_located(g.b.loc, loc)
    for ref in (g.a, g.b):
        require_str(ref.name, first_located(ref.loc, loc), "an operand name")
        if ref.transposed is not False:
            raise KgenError(
                first_located(ref.loc, loc),
                f"a transposed operand ({ref.name}^T) is supported inside a loop only for now; "
                f"outside one, declare '{ref.name}' with the other layout (row or col)",
            )
    if g.accumulate is not False:
        raise KgenError(loc, f"gemm '{g.name}' accumulates (+=), which only a loop's "
                             f"accumulating gemms do; write 'gemm {g.name} = ...'")
    a_shape = state.gemm_shapes.get(g.a.name)
    if a_shape is not None:
        if g.a.name in state.consumer:
            first = state.consumer[g.a.name]
            raise KgenError(
                a_loc,
                f"gemm '{g.a.name}' already feeds gemm '{first.name}'{at_line(first.loc)}; "
                "a gemm can feed only one later gemm",
            )
        state.consumer[g.a.name] = g
    else:
        a_param = operand_param(state, g, g.a, "A", a_loc)
        a_shape = a_param.shape
    b_param = operand_param(state, g, g.b, "B", b_loc)

    # A chained stage hands its output to this gemm in this gemm's operand dtype.
    chained = g.a.name in state.gemm_shapes
    a_dtype = b_param.dtype if chained else a_param.dtype
    if a_dtype.fp8 or b_param.dtype.fp8:
        check_fp8(state, g, None if chained else a_param, b_param, a_loc, b_loc)
    elif a_dtype is not b_param.dtype:
        raise KgenError(
            b_loc,
            f"operand dtypes differ: A is {a_dtype.dsl_name} but B is "
            f"{b_param.dtype.dsl_name}",
        )
    arch = state.target.arch.value
    if not a_dtype.fp8 and a_dtype not in state.target.operand_dtypes:
        usable = or_list([d.dsl_name for d in DType if d in state.target.operand_dtypes])
        raise KgenError(
            b_loc if chained else a_loc,  # a chained A takes B's dtype
            f"dtype {a_dtype.dsl_name} is not supported as an MMA operand on {arch} "
            f"(use {usable})",
        )
    if not isinstance(g.acc_dtype, DType) or g.acc_dtype not in state.target.acc_dtypes:
        usable = or_list([d.dsl_name for d in DType if d in state.target.acc_dtypes])
        name = getattr(g.acc_dtype, "dsl_name", None) or shown(g.acc_dtype)
        raise KgenError(
            loc, f"accumulate type {name} is not supported on {arch} (use {usable})"
        )
    if a_shape[1] != b_param.shape[0]:
        raise KgenError(
            b_loc,
            f"inner dimensions differ: A is {shape_text(a_shape)} but B is "
            f"{shape_text(b_param.shape)}",
        )
    if not isinstance(g.resident, bool):
        raise KgenError(loc, f"resident must be True or False, got {shown(g.resident)}")
    if g.keep is not None:
        if not isinstance(g.keep, ir.Residency):
            raise KgenError(loc, f"keep must be a kgen.ir.Residency, got {shown(g.keep)}")
        if not chained:
            raise KgenError(
                loc, "keep applies only to a gemm whose A operand is an earlier gemm"
            )

    if g.scales:
        check_scales(state, g, None if chained else a_param, b_param)
    shape = (a_shape[0], b_param.shape[1])
    check_epilogue(state, g, shape)
    state.gemm_shapes[g.name] = shape


def check_fp8(state: KernelState, g: ir.Gemm, a: ir.Param | None, b: ir.Param, a_loc,
              b_loc) -> None:
    """FP8 operands (f8e4m3, f8e5m2, mixed too): both FP8, from tensor parameters, on a target
    with FP8 tensor cores (wgmma on sm_90a, mma.sync m16n8k32 on sm_89), accumulated in f32,
    both K-major: wgmma reads 8-bit operands K-major from shared memory only (its transpose bits
    are for 16-bit types) and ldmatrix cannot transpose 8-bit elements, so A is row-major and B
    col-major. Block scales are sm_90a's (kgen/targets/sm80/fp8.py says why)."""
    if a is None:
        raise KgenError(a_loc, f"gemm '{g.name}' has FP8 B '{b.name}' but its A is gemm "
                               f"'{g.a.name}': a chained gemm's operands are f16 or bf16")
    for which, p, loc, other in (("A", a, a_loc, b), ("B", b, b_loc, a)):
        if not p.dtype.fp8:
            raise KgenError(loc, f"operand dtypes differ: {which} is {p.dtype.dsl_name} but "
                                 f"'{other.name}' is {other.dtype.dsl_name}; an FP8 gemm takes "
                                 "two FP8 operands (f8e4m3 or f8e5m2, mixed too)")
    arch = state.target.arch.value
    wgmma = state.target.has(Instruction.WGMMA)
    if not state.target.fp8:
        raise KgenError(g.loc, rules.FP8_REFUSED.format(arch=arch))
    if g.acc_dtype is not DType.F32:
        name = getattr(g.acc_dtype, "dsl_name", None) or shown(g.acc_dtype)
        raise KgenError(g.loc, f"FP8 operands accumulate in f32, not {name}")
    reads = ("wgmma reads 8-bit operands K-major only" if wgmma else rules.FP8_LAYOUT)
    for which, p, loc, major in (("A", a, a_loc, ir.Layout.ROW), ("B", b, b_loc, ir.Layout.COL)):
        if p.layout is not major:
            raise KgenError(loc, f"FP8 operand {which} '{p.name}'{at_line(p.loc)} is "
                                 f"{p.layout.value}-major, so its k elements are not "
                                 f"contiguous; {reads}: store it transposed and declare it "
                                 f"{major.value}")
    if g.scales and not wgmma and isinstance(g.scales, tuple):
        first = g.scales[0]
        raise KgenError(first_located(getattr(first, "loc", None), g.loc),
                        rules.FP8_BLOCK_SCALES.format(arch=arch))


def check_settings(state: KernelState, g: ir.Gemm) -> None:
    checks = (
        (g.tile, (("m", "tile M"), ("n", "tile N"), ("k", "tile K"))),
        (g.warps, (("m", "warps M"), ("n", "warps N"))),
        (g.stages, (("count", "stages"),)),
    )
    for node, fields in checks:
        if node is None:
            continue
        for attr, what in fields:
            if problem := setting_problem(getattr(node, attr), what):
                raise KgenError(first_located(node.loc, g.loc), problem)


MAX_SPLIT = 64  # CTAs per output tile along K


def check_split(state: KernelState, g: ir.Gemm) -> None:
    """`split S`: a kernel of one gemm, at most MAX_SPLIT (epilogue reductions run in the
    kernel that sums the parts)."""
    if g.split is None:
        return
    if not isinstance(g.split, ir.SplitK):
        raise KgenError(g.loc, f"gemm '{g.name}': split must be a kgen.ir.SplitK or None")
    loc = first_located(g.split.loc, g.loc)
    if problem := setting_problem(g.split.count, "split"):
        raise KgenError(loc, problem)
    if g.split.count > MAX_SPLIT:
        raise KgenError(loc, f"split must be at most {MAX_SPLIT} CTAs per output tile, got "
                             f"{g.split.count}")
    if len(state.kernel.gemms) > 1:
        raise KgenError(loc, "split applies to a kernel of one gemm: a chain keeps each "
                             "intermediate on chip, whole in K")


CLUSTERS = ((1, 1), (2, 1), (1, 2))  # `cluster MxN`: the shapes the warp-specialized kernel runs


def check_cluster(state: KernelState, g: ir.Gemm) -> None:
    """`cluster MxN`: 1x1, 2x1 or 1x2, on sm_90a, in a kernel of one gemm. Whether the kernel
    it runs on is the warp-specialized one, and with which split, is the lowering's to say
    (kgen/targets/sm90/warp_specialized.py)."""
    if g.cluster is None:
        return
    if not isinstance(g.cluster, ir.ClusterShape):
        raise KgenError(g.loc, f"gemm '{g.name}': cluster must be a kgen.ir.ClusterShape or None")
    loc = first_located(g.cluster.loc, g.loc)
    shape = (g.cluster.m, g.cluster.n)
    if shape not in CLUSTERS:
        raise KgenError(loc, f"cluster {shown(g.cluster.m)}x{shown(g.cluster.n)} is not a "
                             "cluster kgen runs; write 1x1, 2x1 (two CTAs on adjacent tile rows "
                             "share B) or 1x2 (two CTAs on adjacent tile columns share A)")
    if not state.target.tma:
        raise KgenError(loc, "cluster needs target sm_90a (thread-block clusters and the copy "
                             f"engine's multicast); this kernel targets {state.target.arch.value}")
    if len(state.kernel.gemms) > 1:
        raise KgenError(loc, "cluster applies to a kernel of one gemm (the warp-specialized "
                             "kernel); a chain runs one CTA per tile group")


def operand_param(state: KernelState, g: ir.Gemm, ref: ir.OperandRef, which: str, loc) -> ir.Param:
    name = ref.name
    param = state.params.get(name)
    if param is None:
        later = next((h for h in state.kernel.gemms if h.name == name), None)
        if later is not None and which == "B":
            raise KgenError(
                loc,
                f"B operand '{name}' is a gemm; only the A operand can be an earlier gemm",
            )
        if later is not None:
            raise KgenError(
                loc,
                f"A operand '{name}' is not an earlier gemm; a gemm can only use "
                "the output of a gemm defined before it",
            )
        candidates = [*state.params, *state.gemm_shapes]
        raise KgenError(
            loc, f"unknown operand {quote(name)}{did_you_mean(str(name), candidates)}"
        )
    if param.kind is not ParamKind.TENSOR:
        raise KgenError(
            loc, f"{which} operand '{name}' must be a tensor, not a {param.kind.value}"
        )
    if param.role is not Role.IN:
        raise KgenError(
            loc, f"{which} operand '{name}' is an output tensor; operands must be inputs"
        )
    return param
