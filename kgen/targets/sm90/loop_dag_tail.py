"""The sm_90a DAG skeleton's epilogue tiles (the attention backward's dK and dV) as a plan value
(plan.loop_dag.DagWgmma.tail_stores): which outputs the copy engine stores, staged after the loop
in which ring, their tensor maps, or why they are stored per element from registers. The rule
and its measurements: kgen/targets/dag_wgmma_rules.py, DAG_WGMMA_TAIL_TMA. Read by
kgen/targets/sm90/loop_dag_schedule.py."""
from __future__ import annotations

from ...enums import DType
from ...plan import program as pp
from .. import dag_wgmma_rules as schedule_rules
from .. import loop_rules
from ..loop_rules import BOX_COLS


def tail(stored: tuple[tuple[str, int], ...], streamed: list[pp.WgmmaTile], params,
          dtype: DType, kv: frozenset[str], config, consumers: int, split: bool,
          packed: bool) -> dict:
    """The kernel's epilogue's tile outputs `stored` ((name, columns)) the copy engine stores,
    each staged after the loop in a ring of `streamed` of its columns (warpgroup c's rows in
    slot c), with their maps; or none, and why (dag_wgmma_rules.DAG_WGMMA_TAIL_TMA)."""
    def registers(why: str) -> dict:
        return dict(maps=(), tail_stores=(), tail_store=pp.Choice(
            "per element from registers", why))

    if not stored:
        return registers("the kernel's epilogue stores no tile")
    refused = (
        "the rulebook stores them from registers (DAG_WGMMA_TAIL_TMA)"
        if not schedule_rules.DAG_WGMMA_TAIL_TMA else
        "the split layout: a warpgroup holds half of every row's columns (not built)"
        if split else
        "packed sequences: a box past a sequence's end would write the next one's rows"
        if packed else
        f"a block of {config.block} rows is not a warpgroup's {loop_rules.WGMMA_ROWS}"
        if config.block != loop_rules.WGMMA_ROWS else
        f"{config.stages} ring slots hold fewer than {consumers} warpgroups' rows"
        if config.stages < consumers else None)
    if refused is not None:
        return registers(refused)
    free = list(streamed)
    pairs = []
    for name, cols in stored:  # each output in a ring of its columns, one ring each
        p = next(q for q in params if q.name == name)
        ring = next((t for t in free if t.boxes * BOX_COLS == cols), None)
        if p.dtype is not dtype:
            return registers(f"{name} is {p.dtype.dsl_name}, the rings {dtype.dsl_name}")
        if ring is None:
            return registers(f"no ring of {cols} columns is left to stage {name} in")
        free.remove(ring)
        pairs.append((name, ring.name))
    names = " and ".join(name for name, _ in stored)
    return dict(
        maps=tuple(pp.LoopTensorMap(name, dtype, loop_rules.WGMMA_ROWS, cols // BOX_COLS,
                                    name in kv) for name, cols in stored),
        tail_stores=tuple(pairs), tail_store=pp.Choice(
            "by the copy engine from the rings: " + ", ".join(
                f"{name} in {ring}" for name, ring in pairs),
            schedule_rules.DAG_WGMMA_TAIL_TMA_WHY.format(names=names)))
