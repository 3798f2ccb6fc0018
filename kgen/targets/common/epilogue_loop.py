"""The epilogue loop over mma.sync accumulator pairs, shared by every target (sm_80's CTA, the
sm_90a consumers and both targets' chains): the reductions' per-thread partials, one call of the
epilogue function per pair, split-K's partial sums to the workspace, and an sm_80 CTA's
reductions through shared memory. The C++ is templates/common/epilogue_loop.inc.j2; this module
hands it the reductions as values."""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Axis, ReduceOp
from ...plan import GemmPlan, KernelPlan, ReductionPlan
from .render import macro_lines

TEMPLATE = "common/epilogue_loop.inc.j2"

# Each reduce op's struct in the reduce helpers (templates/sm80/reduce.cu.j2, sm90/reduce.inc.j2)
OP_STRUCT = {
    ReduceOp.SUM: "ReduceSum",
    ReduceOp.MAX: "ReduceMax",
    ReduceOp.MIN: "ReduceMin",
    ReduceOp.ABSMAX: "ReduceAbsMax",
}
_OVER = {Axis.ROW: "columns", Axis.COL: "rows", Axis.ALL: "the tile"}


@dataclass(frozen=True, slots=True)
class Reduction:
    """What the templates print of a reduction: red<index>, its op's struct, the axis it keeps
    ("row": one value per output row, "col", "all": one value), its output and scratch."""

    index: int
    op: str
    axis: str
    target: str
    scratch: str
    what: str  # a comment: what it reduces, into which output


def reduction(r: ReductionPlan) -> Reduction:
    return Reduction(index=r.index, op=OP_STRUCT[r.op], axis=r.axis.value, target=r.target,
                     scratch=r.scratch, what=f"{r.op.value} over {_OVER[r.axis]} into {r.target}")


def reductions(g: GemmPlan) -> list[Reduction]:
    return [reduction(r) for r in g.epilogue.reductions]


def epilogue_params(g: GemmPlan) -> str:
    """Extra parameters of the epilogue function: the reduced values of both elements."""
    return "".join(macro_lines(TEMPLATE, "epilogue_params", reds=reductions(g)))


def partial_lines(g: GemmPlan) -> list[str]:
    """Each reduction's per-thread partials, at the op's identity."""
    return macro_lines(TEMPLATE, "partials", reds=reductions(g))


def pair_loop(g: GemmPlan, layout: str, narrow: bool = False, params: str = "p",
              groups: int = 1) -> list[str]:
    """One epilogue call per accumulator pair acc[i][j] (kFragM x kFragN m16n8 tiles) whose row
    and column are in the output, combining the reductions' partials. `layout`: whose
    accumulators ("warp_tile": an sm_80 warp's; "warpgroup": a wgmma consumer's). `narrow`: the
    kernel body's kNarrow instantiation may see an odd N, so each call is told whether the
    pair's second column is in the output (always, in the fast instantiation). `params`: the
    arguments the epilogue reads (a persistent kernel's: its tile's batch of them). `groups` >
    1: each row of fragments in that many groups, a rolled loop (EpilogueGroups)."""
    return macro_lines(TEMPLATE, "pair_loop", layout=layout, gemm=g.name, narrow=narrow,
                       params=params, groups=groups, reds=reductions(g))


def split_partial_lines(layout: str = "warp_tile", params: str = "p") -> list[str]:
    """Split-K: the CTA's partial sums, as f32 pairs, to its part of the workspace (the epilogue
    runs in <kernel>_splitk once the parts are summed)."""
    return macro_lines(TEMPLATE, "split_partials", layout=layout, params=params)


def loop_lines(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """An mma.sync CTA's epilogue: one call per accumulator pair, then the reductions (with
    split-K, the partial sums to the workspace instead)."""
    if plan.schedule.scheduler.split_k > 1:
        return split_partial_lines()
    lines = partial_lines(g) + pair_loop(g, "warp_tile", plan.schedule.entry.narrow)
    if not g.epilogue.reductions:
        return lines
    return lines + macro_lines(TEMPLATE, "cta_reductions", reds=reductions(g),
                               deterministic=plan.deterministic)
