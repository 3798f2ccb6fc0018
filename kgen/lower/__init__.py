"""Lowering: a verified ir.Kernel to a plan.KernelPlan, through an explicit list of passes.

    chain                 the rules of back-to-back gemms (kgen/lower/chain.py)
    mainloop  (per gemm)  tiles, warp tiles, operand shared-memory layouts and swizzles; a
                          chained gemm's A from the gemm before it (registers or smem)
    epilogue  (per gemm)  the visitor tree as straight-line C++ per accumulator pair
    abi                   the params struct, argument alignments and size rules
    select                the schedule: the target's legal candidates (kgen/targets/<arch>/
                          schedules.py), each with its storage plan (storage: phases, buffers
                          and their lifetimes, the declared layout checked by unions, the
                          packer, the budget); the source's request or the first legal one

After lowering, `slow_path_warning` says which written schedule lines put the plan on a slower path
than the target plans without them (kgen/lower/slow_path.py); the API warns with it.

A kernel without a gemm but with a storage declaration lowers to a plan with no gemm: its
storage can be planned and inspected, not emitted.
"""
from __future__ import annotations

from .. import ir
from ..errors import KgenError, KgenWarning
from ..plan import GemmPlan, KernelKind, KernelPlan
from ..targets import (Candidate, Config, Mainloop, Target, consumer_grid, producer_threads,
                       target)
from . import abi, builder, chain, epilogue, mainloop, program, schedule, select, slow_path

GROUP_M = select.GROUP_M


def lower(kernel: ir.Kernel, arch: ir.Arch | None = None, *,
          persistent: bool | None = None, config: Config | None = None) -> KernelPlan:
    """`persistent`: None lets the target's preference decide, False forbids a persistent
    kernel (a `keep ... resident` or `schedule pingpong` request is then refused), True is
    the same as None. Schedule lines the source leaves out are filled by the builder
    (kgen/lower/builder.py); `config`, a tuned configuration, is the builder's first try."""
    arch = arch or kernel.target
    if program.is_program(kernel):  # a loop or row kernel: kgen/lower/program.py
        return program.run(kernel, arch)
    tgt = target(arch)
    if not kernel.gemms and kernel.storage is None:
        raise KgenError(kernel.loc, f"kernel '{kernel.name}' has no gemm")
    if kernel.gemms and (config is not None or not builder.complete(kernel)):
        return builder.build(kernel, tgt, lambda k: _lower(k, arch, tgt, persistent),
                             config=config)[1]
    return _lower(kernel, arch, tgt, persistent)


def slow_path_warning(kernel: ir.Kernel, arch: ir.Arch | None = None,
                      plan: KernelPlan | None = None) -> KgenWarning | None:
    """The warning for the written schedule lines that put the kernel's plan on a slower path
    than the target plans without them (kgen/lower/slow_path.py), or None. `plan`: lower()'s
    plan of the kernel without a tuned configuration, where the caller has it."""
    arch = arch or kernel.target
    if not kernel.gemms:
        return None
    return slow_path.check(kernel, target(arch), plan or lower(kernel, arch),
                      lambda k: lower(k, arch))


def _lower(kernel: ir.Kernel, arch: ir.Arch, tgt: Target, persistent: bool | None) -> KernelPlan:
    chain.check(kernel)
    select.check_request(kernel, tgt)
    loops = mainloops(kernel, tgt)
    gemms = loops.written
    fields = abi.fields(kernel)
    operands = [op.param for g in gemms for op in (g.a, g.b)
                if op is not None and kernel.param(op.param) is not None]
    chosen = select.select(kernel, tgt, loops, persistent=persistent)
    sched = chosen.schedule
    rows16 = {s: "the copy engine loads it into the output's staging"
              for s in sched.staged_inputs}
    if sched.wide_stores:  # the output's 16-byte chunks need 16-byte rows (columns)
        packed = chosen.gemms[-1].epilogue.packed_store
        rows16[packed.param] = ("the epilogue writes it in 16-byte chunks of 8 "
                                + ("rows" if packed.layout is ir.Layout.COL else "columns"))
    alignments, dim_rules = abi.requirements(
        kernel, operands, sched.narrow,
        copy_engine={m.param for m in sched.tensor_maps if not m.store},
        column_vectors={v for g in gemms for v in g.epilogue.column_vectors}, rows16=rows16)
    return KernelPlan(
        name=kernel.name,
        arch=arch,
        fields=fields,
        gemms=chosen.gemms,
        storage=chosen.storage,
        alignments=alignments,
        dim_rules=dim_rules,
        schedule=sched,
        params=abi.params(kernel),
        compute_dtype=kernel.compute_dtype,
        deterministic_reductions=kernel.deterministic,
        loc=kernel.loc,
    )


def mainloops(kernel: ir.Kernel, tgt: Target) -> select.Mainloops:
    """The mainloop, chain and epilogue passes of every gemm, once per mainloop the target's
    kinds run (targets.Mainloop): the source's warp grid; each B the source keeps resident
    holding all of its k tiles; a one-gemm kernel's consumer grids (sm_90a)."""
    # with schedule pingpong the producer warps alone copy the first gemm's A
    a_threads = producer_threads(tgt, schedule.requested(kernel))
    written: list[GemmPlan] = []
    resident: list[GemmPlan] | None = []
    refusal: tuple[int, str] | None = None
    chained = len(kernel.gemms) > 1
    for i, g in enumerate(kernel.gemms):
        if kernel.param(g.a.name) is None:
            fields, why = chain.run(kernel, g, tgt)
        else:  # a chain names each gemm's buffers after it: g0_a_smem, g1_b_smem
            fields, why = mainloop.run(kernel, g, tgt, f"{g.name}_" if chained else "",
                                       a_threads if i == 0 else None)
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
    return select.Mainloops(plans, refusal)


def candidates(kernel: ir.Kernel, arch: ir.Arch | None = None, *,
               persistent: bool | None = None) -> list[Candidate]:
    """Every schedule the target lists for a kernel, legal or refused with its reason, in the
    target's order of preference (lower() takes the selected one). Lines the source leaves out
    are filled as lower() fills them."""
    tgt = target(arch or kernel.target)
    if not builder.complete(kernel):
        kernel, _ = builder.build(kernel, tgt, lambda k: _lower(k, tgt.arch, tgt, persistent))
    chain.check(kernel)
    return select.listed(kernel, tgt, mainloops(kernel, tgt), persistent=persistent)
