"""The mainloop pass of a kernel's gemms: each gemm's mainloop (kgen/lower/mainloop.py, or
kgen/lower/chain.py for a chained A) and epilogue (kgen/lower/epilogue.py), planned once per
mainloop the target's kinds run (targets.Mainloop). A kind's candidate then takes its own
plans (ScheduleDraft.plans) and changes none of them.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from .. import ir
from ..plan import GemmPlan, KernelKind
from ..targets import Mainloop, Target, consumer_grid, producer_threads
from ..targets.rules import Refusal
from . import chain, epilogue, mainloop


@dataclass(frozen=True, slots=True)
class Mainloops:
    """The mainloop pass's output: the gemms planned once per mainloop the target's kinds run,
    and why the mma.sync mainloop refuses gemm i's tile where only other mainloops serve it."""

    plans: Mapping[Mainloop, tuple[GemmPlan, ...]]
    mma_sync_refusal: tuple[int, str] | None = None

    @property
    def written(self) -> list[GemmPlan]:
        """The gemms as the source's warp grid runs them."""
        return list(self.plans[Mainloop.WRITTEN])


def run(kernel: ir.Kernel, tgt: Target, requested: KernelKind | None) -> Mainloops:
    """plan, its refusal raised."""
    planned = plan(kernel, tgt, requested)
    if isinstance(planned, Refusal):
        raise mainloop.raised(planned)
    return planned


def plan(kernel: ir.Kernel, tgt: Target, requested: KernelKind | None) -> Mainloops | Refusal:
    """The mainloop, chain and epilogue passes of every gemm, once per mainloop the target's
    kinds run (targets.Mainloop): the source's warp grid; each B the source keeps resident
    holding all of its k tiles; a one-gemm kernel's consumer grids (sm_90a). `requested`: the
    kind the source asks for (with schedule pingpong the producer warps alone copy the first
    gemm's A); or the first rule of theirs the kernel's lines break (located)."""
    a_threads = producer_threads(tgt, requested)
    written: list[GemmPlan] = []
    resident: list[GemmPlan] | None = []
    refusal: tuple[int, str] | None = None
    chained = len(kernel.gemms) > 1
    for i, g in enumerate(kernel.gemms):
        if kernel.param(g.a.name) is None:
            planned = chain.plan(kernel, g, tgt)
        else:  # a chain names each gemm's buffers after it: g0_a_smem, g1_b_smem
            planned = mainloop.plan(kernel, g, tgt, f"{g.name}_" if chained else "",
                                    a_threads if i == 0 else None)
        if isinstance(planned, Refusal):
            return planned
        fields, why = planned
        if why and refusal is None:
            refusal = (i, why)
        dag = epilogue.run(kernel, g)
        written.append(GemmPlan(**fields, epilogue=dag))
        kept = mainloop.resident_b(fields) if g.resident else fields
        resident = None if resident is None or kept is None else [
            *resident, GemmPlan(**kept, epilogue=dag)]
    plans = {Mainloop.WRITTEN: tuple(written)}
    if resident is not None and any(g.resident for g in kernel.gemms):
        plans[Mainloop.RESIDENT] = tuple(resident)
    if len(kernel.gemms) == 1:
        g = kernel.gemms[0]
        for kind, loop in ((KernelKind.COOPERATIVE, Mainloop.COOPERATIVE),
                           (KernelKind.PINGPONG, Mainloop.PINGPONG)):
            grid = consumer_grid(tgt, kind, written[0].tile)
            if grid is not None:
                own = fields | dict(warps=grid.warps, warp_tile=grid.warp_tile, frags=grid.frags)
                plans[loop] = (GemmPlan(**own, epilogue=epilogue.run(kernel, g, grid)),)
    return Mainloops(plans, refusal)
