"""Lowering: a verified ir.Kernel to a plan.KernelPlan, through an explicit list of passes
(PASSES), each run once, in order, each a function of the kernel, the target and the parts
the passes before it made, returning a part of its own; `assemble` then builds the plan from
the parts, once. No pass changes a part an earlier pass made (tests/lower/test_passes.py).

    request    the rules of back-to-back gemms (kgen/lower/chain.py) and the source's
               `schedule` / `keep ... resident` request checked on what the source alone
               shows: the kind asked for (None: the target's preference decides)
    mainloop   per gemm, once per mainloop the target's kinds run (kgen/lower/mainloops.py):
               tiles, warp grid, warp tiles, fragments, stages, operand shared-memory layouts
               and swizzles, a chained gemm's A from the gemm before it; its epilogue (the
               visitor tree as a DAG of typed nodes), planned for that warp grid
    schedule   the target's candidates (kgen/targets/<arch>/schedules.py), each taking its
               kind's mainloop plans and weighing its shared memory by a trial placement; the
               source's request or the first legal one, and what it asks of the storage pass
    storage    the selected schedule's buffers (kgen/lower/storage.py: phases, buffers and
               their lifetimes, the declared layout checked by unions, the packer), or the
               budget's located message
    abi        the params struct, argument alignments and size rules the schedule needs

After lowering, `slow_path_warning` says which written schedule lines put the plan on a slower path
than the target plans without them (kgen/lower/slow_path.py); the API warns with it.

A kernel without a gemm but with a storage declaration lowers to a plan with no gemm: its
storage can be planned and inspected, not emitted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .. import ir
from ..errors import KgenError, KgenWarning
from ..plan import (Alignment, DimRule, KernelKind, KernelPlan, Param, ParamField,
                    StoragePlan)
from ..targets import Candidate, Config, Target, target
from . import abi, builder, chain, mainloops, schedule, select, slow_path
from . import storage as storage_pass

GROUP_M = select.GROUP_M


def lower(kernel: ir.Kernel, arch: ir.Arch | None = None, *,
          persistent: bool | None = None, config: Config | None = None) -> KernelPlan:
    """`persistent`: None lets the target's preference decide, False forbids a persistent
    kernel (a `keep ... resident` or `schedule pingpong` request is then refused), True is
    the same as None. Schedule lines the source leaves out are filled by the builder
    (kgen/lower/builder.py); `config`, a tuned configuration, is the builder's first try."""
    arch = arch or kernel.target
    if kernel.is_program:  # a loop or row kernel: its own pass, imported only for one
        from . import program

        return program.run(kernel, arch)
    tgt = target(arch)
    if not kernel.gemms and kernel.storage is None:
        raise KgenError(kernel.loc, f"kernel '{kernel.name}' has no gemm")
    if kernel.gemms and (config is not None or not builder.complete(kernel)):
        return builder.build(kernel, tgt, lambda k, lines: _lower(k, arch, tgt, persistent, lines),
                             config=config, persistent=persistent)[1]
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


@dataclass(frozen=True, slots=True)
class Options:
    """What the caller adds to the source: `persistent` (lower()'s), and the schedule lines
    the builder filled, for the schedule's record (select.Filled; None: the source wrote
    them all)."""

    persistent: bool | None = None
    filled: select.Filled | None = None


@dataclass(frozen=True, slots=True)
class Abi:
    """The abi pass's part: the params struct, the parameters, and the alignment and size
    rules of the arguments."""

    fields: tuple[ParamField, ...]
    params: tuple[Param, ...]
    alignments: tuple[Alignment, ...]
    dim_rules: tuple[DimRule, ...]
    block_dims: tuple = ()  # plan.BlockDim: sizes counting a block scale's blocks


def _request(kernel: ir.Kernel, tgt: Target, options: Options, parts: dict) -> KernelKind | None:
    chain.check(kernel)
    select.check_request(kernel, tgt)
    return schedule.requested(kernel)


def _mainloop(kernel: ir.Kernel, tgt: Target, options: Options, parts: dict) -> mainloops.Mainloops:
    return mainloops.run(kernel, tgt, parts["request"])


def _schedule(kernel: ir.Kernel, tgt: Target, options: Options,
              parts: dict) -> select.Selected:
    return select.select(kernel, tgt, parts["mainloop"], persistent=options.persistent,
                         filled=options.filled)


def _storage(kernel: ir.Kernel, tgt: Target, options: Options, parts: dict) -> StoragePlan:
    storage = storage_pass.selected(kernel, tgt, parts["schedule"].placement)
    assert parts["schedule"].candidate.legal, "a candidate over budget fits on the second try"
    return storage


def _abi(kernel: ir.Kernel, tgt: Target, options: Options, parts: dict) -> Abi:
    rules = abi.of_schedule(kernel, parts["mainloop"].written, parts["schedule"].candidate)
    alignments, dim_rules = abi.requirements(kernel, **rules)
    return Abi(abi.fields(kernel), abi.params(kernel), alignments, dim_rules,
               abi.block_dims(kernel))


@dataclass(frozen=True, slots=True)
class Pass:
    name: str
    run: Callable[[ir.Kernel, Target, Options, dict], object]


# The passes, in order: each runs once per lowering and returns its own part
PASSES = (Pass("request", _request), Pass("mainloop", _mainloop),
          Pass("schedule", _schedule), Pass("storage", _storage), Pass("abi", _abi))


def _lower(kernel: ir.Kernel, arch: ir.Arch, tgt: Target, persistent: bool | None,
           filled: select.Filled | None = None) -> KernelPlan:
    options = Options(persistent, filled)
    parts: dict[str, object] = {}
    for p in PASSES:
        parts[p.name] = p.run(kernel, tgt, options, parts)
    return assemble(kernel, arch, parts)


def assemble(kernel: ir.Kernel, arch: ir.Arch, parts: dict) -> KernelPlan:
    """The plan, built once from the passes' parts."""
    chosen, interface = parts["schedule"].candidate, parts["abi"]
    return KernelPlan(
        name=kernel.name,
        arch=arch,
        fields=interface.fields,
        gemms=chosen.gemms,
        storage=parts["storage"],
        alignments=interface.alignments,
        dim_rules=interface.dim_rules,
        schedule=chosen.schedule,
        params=interface.params,
        compute_dtype=kernel.compute_dtype,
        deterministic_reductions=kernel.deterministic,
        loc=kernel.loc,
        block_dims=interface.block_dims,
    )


def candidates(kernel: ir.Kernel, arch: ir.Arch | None = None, *,
               persistent: bool | None = None) -> list[Candidate]:
    """Every schedule the target lists for a kernel, legal or refused with its reason, in the
    target's order of preference (lower() takes the selected one). Lines the source leaves out
    are filled as lower() fills them."""
    tgt = target(arch or kernel.target)
    if not builder.complete(kernel):
        kernel, _ = builder.build(kernel, tgt,
                                  lambda k, lines: _lower(k, tgt.arch, tgt, persistent, lines),
                                  persistent=persistent)
    chain.check(kernel)
    return select.listed(kernel, tgt, mainloops.run(kernel, tgt, schedule.requested(kernel)),
                         persistent=persistent)
