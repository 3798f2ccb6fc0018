"""A DAG loop's plan (kgen/plan/loop_dag.py) on sm_90a: the warp-specialized wgmma skeleton
(templates/sm90/loop_bwd.cu.j2, FlashAttention-3's backward structure) where the rulebook chose
it (plan.wgmma), else the mma.sync skeleton (kgen/targets/common/loop_dag.py).

The statements are the mma.sync skeleton's (common.loop_dag's CDag items): a wgmma
accumulator's fragments hold the same rows and columns per thread as mma.sync's n8 tiles side by
side, so the sections' values, the hand-on and the adds render alike; what differs is the MMAs,
the loads (the copy engine's, into mbarrier rings), the staged tile's layout (the 128-byte
swizzle wgmma reads) and the thread-to-row map."""
from __future__ import annotations

from ...enums import Axis
from ...plan import epilogue as dag
from ...plan import loop_dag as ld
from ...plan import program as pp
from ..common import loop as program
from ..common import loop_dag as common_dag
from ..common.arch_guard import guard_for
from ..common.render import render
from .tensor_map import TMA_DTYPE


def emit(plan: ld.LoopDagPlan, *, source_name: str, source_hash: str, command: str) -> str:
    if plan.wgmma is None:  # the rulebook kept mma.sync (plan.mma says why)
        return common_dag.emit(plan, source_name=source_name, source_hash=source_hash,
                               command=command)
    w = plan.wgmma
    vector_loads = _vector_loads(plan)
    cached = frozenset(prm.name for loads in vector_loads.values() for prm in loads)
    body = common_dag._statements(plan.body, plan, "loop_len", cached=cached)
    tail = common_dag._statements(plan.epilogue, plan, "kNAcc", in_loop=False)
    first_readers, wait_fences, final_fences = _waits(plan)
    return render(
        "sm90/loop_bwd.cu.j2", plan=plan, w=w, name=plan.name, ns=f"{plan.name}_cfg",
        header=program._header(plan, source_name, source_hash, command),
        arch_guard=guard_for(plan.name, plan.arch, wgmma=True), fields=program._fields(plan),
        params_guard=program._params_guard(plan), body=body, tail=tail,
        aligned=program._aligned(plan), loop_chunks=None, element=plan.dtype.cpp,
        bounds=program._bounds(plan), mma_ab=plan.dtype.dsl_name, block=plan.block,
        n1=plan.n_acc, o_map=None, tensor_maps=w.maps, tma_dtype=TMA_DTYPE[plan.dtype],
        consumers=w.consumers, consumers_word=["one", "two", "three"][w.consumers - 1],
        pointers=[p for p in plan.params if p.kind == "vector" or (
            p.kind == "tensor" and p.name not in {m.param for m in w.maps})],
        zeroed=[plan.param(name) for name in plan.zeroed],
        body_stores=common_dag.body_stores(plan),
        zero_rows=common_dag.ZERO_ROWS, zero_threads=common_dag.ZERO_THREADS,
        philox=program.uses_random(plan),
        accumulators=[plan.gemm(name) for name in plan.accumulators],
        loop_rows=[g for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW],
        loop_row_ns=sorted({g.n_warp for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW}),
        first_readers=first_readers, wait_fences=wait_fences, final_fences=final_fences,
        vector_loads=vector_loads, order_field=ld.ORDER_FIELD,
        grid_heads="p.heads / p.group" if plan.gqa else "p.heads",
        order=(dict(field=ld.ORDER_FIELD, adders=plan.adders) if plan.deterministic else None))


def _vector_loads(plan: ld.LoopDagPlan) -> dict[int, list]:
    """The vectors of the loop's dimension (lse[col], D[col]) the body reads, each loaded once
    per block into registers ([kBlockN8][2]: a thread's columns; its two rows share them) by the
    score gemm whose epilogue first reads it, while that gemm runs: {gemm index: params}.
    Read in place, each of the thread's elements loads its own copy (the two rows' loads do not
    merge), and the loads move up into the gemm holding twice the registers."""
    values = plan.body.values
    out: dict[int, list] = {}
    seen: set[str] = set()
    gemm = None
    for stmt in plan.body.statements:
        if isinstance(stmt, ld.DagStep):
            gemm = stmt.gemm
            continue
        if not isinstance(stmt, pp.Compute) or gemm is None or gemm.kind is not ld.GemmKind.SCORE:
            continue
        for v in stmt.values:
            kind = values[v].kind
            for arg in (kind.args if isinstance(kind, dag.Apply) else
                        (kind.arg,) if isinstance(kind, dag.Cast) else ()):
                load = values[arg].kind
                if (isinstance(load, dag.VectorLoad) and load.axis is Axis.COL
                        and load.param not in seen):
                    seen.add(load.param)
                    out.setdefault(gemm.index, []).append(plan.param(load.param))
    return out


def _waits(plan: ld.LoopDagPlan) -> tuple[dict, dict, list]:
    """What the skeleton waits for and where, from the body's order: the streamed tiles' full
    mbarriers before the first gemm reading them ({gemm index: tile names}); an accumulating
    gemm is not waited for by itself (its result is read after the loop), so the next score or
    loop-row gemm's wait covers it, after which its accumulator and the handed-on A are fenced
    ({gemm index: register arrays}); what is still in flight at the block's end (waited there)."""
    streamed = {t.name for t in plan.wgmma.streamed}
    seen: set[str] = set()
    first_readers: dict[int, list[str]] = {}
    wait_fences: dict[int, list[str]] = {}
    pending: list[str] = []
    for stmt in plan.body.statements:
        if not isinstance(stmt, ld.DagStep):
            continue
        g = stmt.gemm
        reads = [t for t in (g.a, g.b) if t in streamed and t not in seen]
        seen.update(reads)
        first_readers[g.index] = reads
        if g.kind is ld.GemmKind.ACCUMULATING and not plan.wgmma.wait_accumulating:
            pending += [f"acc_g{g.index}", f"hand_v{g.a_value}"]
        elif g.kind is ld.GemmKind.ACCUMULATING:
            wait_fences[g.index], pending = pending + [f"hand_v{g.a_value}"], []
        else:
            wait_fences[g.index], pending = pending, []
    return first_readers, wait_fences, pending
