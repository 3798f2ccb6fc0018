"""The helper kernels of a one-gemm kernel (every target): the reduction outputs' init (atomic
mode), the deterministic reductions' finalize, split-K's sum of the partials with the epilogue,
and the host lines that launch them. The C++ is templates/common/helper_kernels.inc.j2; this
module hands it a HelperKernels value and the reductions."""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Axis
from ...plan import GemmPlan, KernelPlan
from . import batch
from .epilogue_loop import reduction
from .operands import dim_expr
from .render import macro_lines

TEMPLATE = "common/helper_kernels.inc.j2"


@dataclass(frozen=True, slots=True)
class HelperKernels:
    """What the helper kernels' macros print: the kernels' names (None: not launched), their
    block size, the batch, and the sizes (as the launcher spells them, and as a batched helper's
    top does, from every batch's arguments `all_batches`)."""

    name: str  # the kernel's: <name>_params, namespace <name>_kgen
    gemm: str
    init: str | None
    finalize: str | None
    split: str | None
    threads: int
    round_up: int  # threads - 1: a block count rounds up
    batched: bool
    batches: str  # the batch count, in the launcher
    helper_batches: str  # the batch count, at a batched helper's top
    reductions: bool
    deterministic: bool
    m: str
    n: str
    helper_m: str
    helper_n: str
    output_lengths: tuple[str, ...]  # each reduction output's length
    lengths: tuple[str, ...]  # the same, once each
    helper_lengths: tuple[str, ...]  # the same, at a batched helper's top
    # the finalize kernel's sizes: M, N, tiles_m, tiles_n
    finalize_m: bool
    finalize_n: bool
    finalize_tiles_m: bool
    finalize_tiles_n: bool


def _length(dim, prefix: str = "p.") -> str:
    return "1" if dim is None else dim_expr(dim, prefix)


def helper_kernels(plan: KernelPlan, g: GemmPlan) -> HelperKernels:
    batched = batch.batched(plan)
    helper = f"{batch.ALL_BATCHES}." if batched else "p."
    lengths = tuple(_length(r.length) for r in plan.reductions)
    axes = {r.axis for r in plan.reductions}
    split = plan.split_kernel is not None
    tiles_m = bool(axes & {Axis.COL, Axis.ALL})
    tiles_n = bool(axes & {Axis.ROW, Axis.ALL}) or split
    return HelperKernels(
        name=plan.name, gemm=g.name, init=plan.init_kernel, finalize=plan.finalize_kernel,
        split=plan.split_kernel, threads=plan.INIT_THREADS, round_up=plan.INIT_THREADS - 1,
        batched=batched, batches=batch.batch_count(plan),
        helper_batches=batch.batch_count(plan, f"{batch.ALL_BATCHES}."),
        reductions=bool(plan.reductions), deterministic=plan.deterministic,
        m=dim_expr(g.m_dim), n=dim_expr(g.n_dim),
        helper_m=dim_expr(g.m_dim, helper), helper_n=dim_expr(g.n_dim, helper),
        output_lengths=lengths, lengths=tuple(dict.fromkeys(lengths)),
        helper_lengths=tuple(dict.fromkeys(_length(r.length, helper)
                                           for r in plan.reductions)),
        finalize_m=tiles_m or Axis.ROW in axes or split,
        finalize_n=tiles_n or Axis.COL in axes,
        finalize_tiles_m=tiles_m, finalize_tiles_n=tiles_n)


def template_values(plan: KernelPlan, g: GemmPlan) -> dict:
    """What the kernel templates hand templates/common/helper_kernels.inc.j2's macros: the
    helper kernels, every reduction, and those of the split-K epilogue."""
    return dict(helpers=helper_kernels(plan, g), reds=[reduction(r) for r in plan.reductions],
                split_reds=[reduction(r) for r in g.epilogue.reductions])
