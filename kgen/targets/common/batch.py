"""Batches in the emitted code (every target): where batch b of the arguments lives.

A batched kernel's grid covers L x the tiles of one batch on one axis (tile t of the walk is
tile t % tiles of batch t / tiles); each CTA or tile then works on `at_batch(p, b)`: the
arguments with every batched pointer advanced by b x its batch stride, and the workspace by one
batch's floats. That device function is the one home of the batch offsets: the mainloop, the
epilogue, the reductions and the helper kernels read the shifted arguments as they read an
unbatched kernel's. The C++ is templates/common/batch.inc.j2; this module hands it values.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...plan import FieldKind, KernelPlan
from .operands import dim_expr
from .render import macro_lines

TEMPLATE = "common/batch.inc.j2"
ALL_BATCHES = "all_batches"  # a batched helper kernel's parameter (`p` is its thread's batch)


@dataclass(frozen=True, slots=True)
class Batch:
    """What the batch macros print: the kernel's name, its batch count (as the launcher spells
    it), the last gemm's M and N, and each batched pointer with its batch stride's field."""

    name: str
    batched: bool
    count: str
    m: str
    n: str
    split_k: bool
    strides: tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Workspace:
    """The workspace one batch uses: kind "split" (split-K partials), "deterministic" (the
    deterministic reductions' slots, one per reduction axis in `axes`), "both", or "none"."""

    kind: str
    m: str
    n: str
    axes: tuple[str, ...]


def batched(plan: KernelPlan) -> bool:
    return plan.batch is not None


def batch_count(plan: KernelPlan, prefix: str = "p.") -> str:
    """The batch count L as C++ (`p.L` or a fixed number); "1" without a batch dimension."""
    return "1" if plan.batch is None else dim_expr(plan.batch, prefix)


def _batch(plan: KernelPlan) -> Batch:
    g = plan.gemms[-1]
    return Batch(name=plan.name, batched=batched(plan), count=batch_count(plan),
                 m=dim_expr(g.m_dim), n=dim_expr(g.n_dim),
                 split_k=plan.schedule.scheduler.split_k > 1,
                 strides=tuple((f.param, f.name) for f in plan.fields
                               if f.kind is FieldKind.BATCH_STRIDE))


def workspace(plan: KernelPlan) -> Workspace:
    g = plan.gemms[-1]
    split = plan.split_kernel is not None
    kind = ("both" if split else "deterministic") if plan.deterministic else (
        "split" if split else "none")
    return Workspace(kind=kind, m=dim_expr(g.m_dim), n=dim_expr(g.n_dim),
                     axes=tuple(r.axis.value for r in plan.reductions))


def workspace_lines(plan: KernelPlan, ctype: str, ns: str) -> tuple[list[str], str]:
    """Statements and an expression of C++ type `ctype`: the floats of workspace one batch
    uses (split-K partials, the deterministic reductions' slots, or both), or ([], "") for
    none; the kernel's constants in namespace `ns` ("": in scope)."""
    w, prefix = workspace(plan), f"{ns}::" if ns else ""
    return (macro_lines(TEMPLATE, "workspace_setup", w=w, ctype=ctype, prefix=prefix),
            "".join(macro_lines(TEMPLATE, "workspace_floats", w=w, ctype=ctype, prefix=prefix)))


def at_batch_lines(plan: KernelPlan) -> list[str]:
    """The device function `at_batch(p, batch)` (in the kernel's namespace), or none."""
    if not batched(plan):
        return []
    return macro_lines(TEMPLATE, "at_batch", b=_batch(plan), w=workspace(plan))


def host_lines(plan: KernelPlan) -> list[str]:
    """The host launcher's batch count (after tiles_m and tiles_n): nothing to run for none."""
    if not batched(plan):
        return []
    return macro_lines(TEMPLATE, "host_batches", b=_batch(plan))


def grid_count(plan: KernelPlan, tiles: str) -> str:
    """The host launcher's CTA count for `tiles` CTAs of one batch (params_reason has checked
    that every batch's together fit an int)."""
    return f"{tiles} * batches" if batched(plan) else tiles


def body_call(plan: KernelPlan, narrow: bool, ns: str) -> list[str]:
    """A tiled kernel's entry point (in namespace `ns`, the kernel's): its body on the CTA's
    batch, the CTA's index in it."""
    assert ns == f"{plan.name}_kgen", ns
    return macro_lines(TEMPLATE, "body_call", b=_batch(plan), narrow="true" if narrow else "false")


# ---- chained gemms: the kernel's parameter is every batch's arguments; `p`, at the kernel's top
# a reference to them (sizes, and the shared operands a resident chain loads once), is in each
# tile's scope that tile's batch (a declaration in the tile loop's block hides the outer one).


def chain_values(plan: KernelPlan) -> dict:
    """What the chain templates print about batches (nothing for a kernel without them)."""
    on = batched(plan)
    return dict(
        batched=on,
        kernel_param=ALL_BATCHES if on else "p",
        # a tiled chain's kernel is one tile: its `p` is that tile's batch, from the top
        kernel_head=macro_lines(TEMPLATE, "chain_head", b=_batch(plan))
        if on and plan.schedule.scheduler.persistent else [],
        times_batches=f" * {batch_count(plan)}" if on else "",
        at_batch=at_batch_lines(plan),
        host_batches=host_lines(plan),
        host_tiles=grid_count(plan, "tiles_m * tiles_n"),
    )


def size_prefix(plan: KernelPlan) -> str:
    """How a chain kernel's top reads its sizes: from `p`, or, in a batched tiled chain (whose
    `p` is declared with the tile's batch), from ALL_BATCHES."""
    return f"{ALL_BATCHES}." if batched(plan) and not plan.schedule.scheduler.persistent else "p."


def tile_batch(plan: KernelPlan, tile: str) -> list[str]:
    """In a chain's tile scope: the batch of linear tile `tile` and its arguments, as `p`."""
    if not batched(plan):
        return []
    return macro_lines(TEMPLATE, "tile_batch", b=_batch(plan), tile=tile)


def tile_params(plan: KernelPlan, tile: str) -> str:
    """The arguments of linear tile `tile` (any tile of the walk, or one past it), as C++."""
    if not batched(plan):
        return "p"
    return "".join(macro_lines(TEMPLATE, "tile_params", tile=tile))


def next_tile_lines(plan: KernelPlan) -> list[str]:
    """A persistent chain's tile top (batched): the next tile's coordinates and arguments, for
    the prefetch of its first stages at the end of this tile (computed here, away from the last
    gemm's live registers: a division there made ptxas spill)."""
    if not batched(plan):
        return []
    return macro_lines(TEMPLATE, "next_tile", b=_batch(plan))


def next_operand(plan: KernelPlan, param: str) -> tuple[list[str], str]:
    """A resident chain's ring refills past this tile load the next tile's rows of `param`:
    lines (in the tile scope) naming that batch's pointer, and the pointer a refill reads."""
    if not batched(plan) or plan.param(param).batch is None:
        return [], f"p.{param}"
    return (macro_lines(TEMPLATE, "next_operand", param=param),
            "".join(macro_lines(TEMPLATE, "refill_operand", param=param)))
