"""Where a sequence zeroes the `out accumulate` buffers of the kernel that adds into them.

A DAG loop kernel (the attention backward's main kernel) adds into its `out accumulate`
tensors (dQacc), so they start at zero: alone, the kernel's own launch runs `<name>_zero` first
(kgen/runtime/program.py, and the kernel's `<name>_launch` in its .cu). In a sequence whose
kernel just before it is a row kernel over the same rows (D = rowsum(dO * O), launched first in
the backward), that row kernel zeroes them instead: each of its warps zeroes its row of every
such buffer beside its own row, and the adding kernel is launched without its zeroing
(`<name>_launch_zeroed` in the .cu; CompiledProgram.zeroed_by_caller at run time): one launch
fewer, as FlashAttention-3's preprocessing kernel computes D and zeroes dQ's accumulator in one.

`plan_zeroing(info, plans)` decides it, one `Zeroing` per adding kernel with its why (`kgen
inspect` shows it); `with_zeroing` gives the row kernel's plan the buffers it zeroes (its
params and params-struct members, as the adding kernel has them). The row kernel runs before
the adding kernel on the same stream, so every zero is written before any add, whatever the
adding kernel's mode (atomics, rows, tensor reduce-adds, GQA). Not folded, each said in the why:
deterministic mode (its semaphores are the adding kernel's own workspace, zeroed by its
`_zero`), no row kernel just before it, a buffer not laid out as the row kernel's rows (other
sizes, heads or batch, packed, not f32 [rows, cols] with cols a multiple of 4), a buffer the
row kernel takes itself, a member name the row kernel has already.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from .plan.loop_dag import LoopDagPlan
from .plan.program import RowsPlan
from .enums import DType
from .verify.sequence import SequenceInfo

__all__ = ["Zeroing", "plan_zeroing", "with_zeroing"]


@dataclass(frozen=True, slots=True)
class Zeroing:
    """The `out accumulate` buffers of kernel `adder` and who zeroes them: the row kernel `by`
    launched just before it (each of its rows), or, `by` None, the adder's own `_zero`
    launch; `why` says which and why."""

    adder: str
    buffers: tuple[str, ...]
    by: str | None
    why: str

    @property
    def folded(self) -> bool:
        return self.by is not None


def plan_zeroing(info: SequenceInfo, plans) -> tuple[Zeroing, ...]:
    """One Zeroing per launched kernel that zeroes `out accumulate` buffers (a DAG loop's
    `zeroed`), in launch order; `plans` are the kernels' plans, in launch order."""
    out = []
    for index, plan in enumerate(plans):
        if not isinstance(plan, LoopDagPlan) or not plan.zeroed:
            continue
        names = ", ".join(plan.zeroed)
        before = plans[index - 1] if index > 0 else None
        problem = _problem(info, index, plan, before)
        if problem is None:
            out.append(Zeroing(plan.name, plan.zeroed, before.name,
                               f"{before.name}, the row kernel launched just before "
                               f"{plan.name}, zeroes its rows of {names} beside its own; "
                               f"{plan.name} is launched without its own zeroing kernel "
                               "(one launch fewer)"))
        else:
            out.append(Zeroing(plan.name, plan.zeroed, None,
                               f"{plan.name}'s own launch zeroes {names} first "
                               f"({plan.name}_zero): {problem}"))
    return tuple(out)


def _problem(info: SequenceInfo, index: int, plan: LoopDagPlan, before) -> str | None:
    """Why the row kernel `before` cannot zero `plan`'s buffers, or None when it can."""
    if not isinstance(before, RowsPlan):
        return "no row kernel is launched just before it"
    if plan.deterministic is not None:
        return ("deterministic mode's semaphores are the kernel's own workspace, which its "
                "zeroing kernel zeroes with them")
    if before.zeroes:
        return f"{before.name} zeroes another kernel's buffers"
    row_kernel = info.kernels[index - 1]
    taken = {p.name for p in row_kernel.params}
    members = {f.name for f in before.fields}
    for name in plan.zeroed:
        p = plan.param(name)
        param = info.buffer(name).param
        if name in taken:
            return f"{before.name} takes {name} itself"
        if (p.kind != "tensor" or p.dtype is not DType.F32 or p.packed or p.kv
                or not isinstance(p.shape[-1], int) or p.shape[-1] % 4):
            return (f"{name} is not an f32 tensor [rows, cols] per (batch, head) with cols a "
                    "multiple of 4 (the row kernel's 16-byte stores)")
        if _rows_of(param) != _row_kernel_rows(row_kernel, before):
            return f"{name}'s rows, heads and batch are not {before.name}'s"
        clash = next((f.name for f in plan.fields if f.param == name and f.name in members),
                     None)
        if clash is not None:
            return f"{before.name}'s params struct has a member {clash} already"
    return None


def _rows_of(param) -> tuple:
    """(batch, heads, rows) of a parameter as written: its size names or numbers."""
    return (param.batch, param.heads, param.shape[0])


def _row_kernel_rows(kernel, plan: RowsPlan) -> tuple:
    """(batch, query heads, rows) the row kernel's grid covers, as written."""
    by_name = {p.name: p for p in kernel.params}
    batch = by_name[plan.batch_param].batch if plan.batch_param else None
    heads = by_name[plan.heads_param].heads if plan.heads_param else None
    return (batch, heads, plan.rows_dim)


def with_zeroing(plan: RowsPlan, adder: LoopDagPlan, zeroing: Zeroing) -> RowsPlan:
    """The row kernel's plan zeroing `zeroing.buffers` of `adder` (plan_zeroing decided it):
    their params (as the adder has them) after its own, their members before the sizes."""
    assert zeroing.by == plan.name and zeroing.adder == adder.name, (zeroing, plan.name)
    params = plan.params + tuple(adder.param(name) for name in zeroing.buffers)
    added = tuple(f for f in adder.fields if f.param in zeroing.buffers)
    first_size = next(i for i, f in enumerate(plan.fields) if f.param is None)
    fields = plan.fields[:first_size] + added + plan.fields[first_size:]
    return dataclasses.replace(plan, params=params, fields=fields, zeroes=zeroing.buffers,
                               zeroes_for=adder.name)
