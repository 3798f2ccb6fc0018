"""A DAG loop's plan (kgen/plan/loop_dag.py) on sm_90a: the warp-specialized wgmma skeleton
(templates/sm90/loop_bwd.cu.j2, FlashAttention-3's backward structure) where the rulebook chose
it (plan.wgmma), else the mma.sync skeleton (kgen/targets/common/loop_dag.py).

The statements are the mma.sync skeleton's (common.loop_dag's CDag items): a wgmma
accumulator's fragments hold the same rows and columns per thread as mma.sync's n8 tiles side by
side, so the sections' values, the hand-on and the adds render alike; what differs is the MMAs,
the loads (the copy engine's, into mbarrier rings), the staged tile's layout (the 128-byte
swizzle wgmma reads) and the thread-to-row map."""
from __future__ import annotations

import dataclasses

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
    assert not (plan.deterministic and plan.bounds.equalities), \
        "deterministic mode's bounds of the tile before are one thread's: no equality's scan"
    if not w.fast_body and plan.bounds.fold:  # one body for every block: the predicates read
        plan = dataclasses.replace(plan, bounds=dataclasses.replace(
            plan.bounds, fold=(), why=plan.bounds.why.replace(
                "; inside the mask its predicate is known true", "")))
    vector_loads = _vector_loads(plan) if w.vector_offset is None else {}
    cached = frozenset(prm.name for loads in vector_loads.values() for prm in loads)
    # the staged bias's pairs at the thread's elements (the forward's load_staged)
    tiles = ({w.bias.param: "pair_elem(Element(), staged[j][e >> 1], e & 1)"}
             if w.bias is not None else None)
    body = _unstored(w, common_dag._statements(plan.body, plan, "loop_len", cached=cached,
                                               tiles=tiles))
    body_full = (_unstored(w, common_dag._statements(plan.body, plan, "loop_len", checked=False,
                                                     cached=cached, tiles=tiles))
                 if w.fast_body else [])
    tail = common_dag.tails(plan)
    waits = _waits(plan)
    return render(
        "sm90/loop_bwd.cu.j2", plan=plan, w=w, name=plan.name, ns=f"{plan.name}_cfg",
        header=program._header(plan, source_name, source_hash, command),
        arch_guard=guard_for(plan.name, plan.arch, wgmma=True), fields=program._fields(plan),
        params_guard=program._params_guard(plan), body=body, body_full=body_full, tail=tail,
        aligned=program._aligned(plan), loop_chunks=None, element=plan.dtype.cpp,
        bounds=program._bounds(plan), mma_ab=plan.dtype.dsl_name, block=w.score_n,
        listed=plan.bounds.listed,
        scaled_exp=common_dag.SCALED_EXP, uniform_warpgroup=uniform_warpgroup(plan),
        n1=tail[0].n, rs_ns=[t.n for t in tail[1:]], acc_n8=common_dag.acc_n8(plan, tail),
        split_ns=sorted({g.n_warp for g in plan.gemms if w.split is not None
                         and g.kind is ld.GemmKind.ACCUMULATING and w.piece(g.index) is None}),
        split_pieces=_pieced(plan, ld.GemmKind.ACCUMULATING),
        loop_row_pieces=_pieced(plan, ld.GemmKind.LOOP_ROW),
        hand_tiles={f"hand_v{plan.gemms[i].a_value}": t for i, t in w.a_tiles
                    if any(h.name == t for h in w.handed)},
        tensor_maps=w.tensor_maps, tma_dtype=TMA_DTYPE[plan.dtype], tma_dtypes=TMA_DTYPE,
        # the copy engine's store helpers (sm90/loop_wgmma.inc.j2) where a tile is stored so
        o_map=next((m for m in w.maps if m.param == w.store_param
                    or any(m.param == name for name, _ in w.tail_stores)), None),
        consumers=w.consumers, consumers_word=["one", "two", "three"][w.consumers - 1],
        pointers=[p for p in plan.params if (p.kind == "vector" and p.name not in plan.vectors) or (
            p.kind == "tensor" and p.name not in {m.param for m in w.tensor_maps})],
        zeroed=[plan.param(name) for name in plan.zeroed],
        body_stores=common_dag.body_stores(plan),
        zero_rows=common_dag.ZERO_ROWS, zero_threads=common_dag.ZERO_THREADS,
        philox=program.uses_random(plan), approx_tanh=program.approx_tanh(plan),
        accumulators=[plan.gemm(name) for name in plan.accumulators],
        loop_rows=[g for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW],
        loop_row_ns=sorted({g.n_warp for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW
                            and w.piece(g.index) is None}),
        vector_loads=vector_loads, streamed_row_bytes=sum(128 * t.boxes for t in w.streamed),
        order_field=ld.ORDER_FIELD, grid_heads="p.heads / p.group" if plan.gqa else "p.heads",
        order=(dict(field=ld.ORDER_FIELD, adders=plan.adders) if plan.deterministic
               else None), add_writes=_add_writes(plan, waits["issue_with"]),
        add_released=list(dict.fromkeys(b.tile for b in w.add_slots)), **waits)


def _add_writes(plan: ld.LoopDagPlan, issue_with: dict) -> list[dict]:
    """The order a consumer warpgroup stages its share's f32 boxes in the streamed slots
    (plan.wgmma.add_slots): first those in tiles no gemm issued after the loop-row gemm reads,
    then, after a wgmma_wait<0> (`wait` on the first of them), those in tiles one does (the
    deferred dK's Q: the warpgroup's own wgmmas read its boxes there)."""
    w = plan.wgmma
    loop_rows = [g for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW]
    if not w.add_slots or not loop_rows:
        return []
    busy = {g.b for g in issue_with.get(loop_rows[0].index, [])}
    order = sorted(range(len(w.add_slots)), key=lambda k: w.add_slots[k].tile in busy)
    first_busy = next((k for k in order if w.add_slots[k].tile in busy), None)
    return [dict(k=k, box=w.add_slots[k], tile=w.tile_of(w.add_slots[k].tile),
                 wait=k == first_busy) for k in order]


def _pieced(plan: ld.LoopDagPlan, kind: ld.GemmKind) -> list[tuple[int, int]]:
    """(the pieces' N, the warpgroup's N) of the gemms of `kind` issued in wgmma pieces (the
    split layout's halves of 96 columns: plan.wgmma.pieces): a helper each."""
    return sorted({(plan.wgmma.piece(g.index), g.n_warp) for g in plan.gemms
                   if g.kind is kind and plan.wgmma.piece(g.index) is not None})


def uniform_warpgroup(plan: ld.LoopDagPlan) -> bool:
    """Whether the skeleton broadcasts the warpgroup index from lane 0 (the compiler then holds
    the consumers' wgmma descriptors in uniform registers: a k step's descriptor_at one uniform
    add). NVRTC 13.5, D 128 causal: without it the MHA build spills 4 B (those descriptors' adds
    in vector registers, with carry), with it the GQA build 12 B (its walk's block bounds reloaded
    each visit); as chosen here no build spills (D 64/128/256, each mask, GQA, deterministic)."""
    return not plan.gqa


def _unstored(w: ld.DagWgmma, body: list) -> list:
    """The body without the tile store the copy engine makes from the staged slot
    (w.store_param: the loop-row gemm's step stores it)."""
    return [s for s in body if not (s.kind == "store_score" and s.name == w.store_param)]


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


def _waits(plan: ld.LoopDagPlan) -> dict:
    """What the skeleton issues, waits for and fences, and where, from the body's order (the
    emitter's one schedule of the wgmma groups; the template only renders it):
    `issue_with` {score gemm index: the later score gemms issued right after it} where
    plan.wgmma.issue_ahead (a score gemm reads only shared tiles, so it may start before the
    epilogues between: FlashAttention-3 issues dP^T's wgmma with S^T's) and `early` their
    indices; `first_readers` {gemm index: streamed tiles whose full mbarrier is waited before
    it is issued}; `depth` {gemm index: k of the wgmma_wait<k> where its result (or, for an
    accumulating gemm waited at once, its A registers) is needed: the groups committed after
    it stay in flight}; `wait_fences` {gemm index: register arrays fenced after that wait (the
    groups it completes: accumulators and handed-on A)}; `final_fences` what is still in
    flight at the block's end (waited there). An accumulating gemm is not waited for by itself
    unless plan.wgmma.wait_accumulating (its result is read after the loop)."""
    w = plan.wgmma
    streamed = {t.name for t in w.streamed}
    steps = [s.gemm for s in plan.body.statements if isinstance(s, ld.DagStep)]
    scores = [g for g in steps if g.kind is ld.GemmKind.SCORE]
    issue_with = ({scores[0].index: scores[1:]} if w.issue_ahead and len(scores) > 1 else {})
    early = {g.index for later in issue_with.values() for g in later}
    deferred: set[int] = set()
    if w.defer_accumulating and w.defer_all:  # every accumulating gemm before a
        # loop-row gemm after it (split: their A staged, the loop-row gemm's barrier orders it)
        waiting: list[ld.DagGemm] = []
        for g in steps:
            if g.kind is ld.GemmKind.ACCUMULATING:
                waiting.append(g)
            elif g.kind is ld.GemmKind.LOOP_ROW and waiting:
                issue_with[g.index] = waiting
                deferred.update(a.index for a in waiting)
                waiting = []
    elif w.defer_accumulating:  # an accumulating gemm right before a loop-row gemm: after it
        for g, after in zip(steps, steps[1:]):
            if g.kind is ld.GemmKind.ACCUMULATING and after.kind is ld.GemmKind.LOOP_ROW:
                issue_with[after.index] = [g]
                deferred.add(g.index)
    by_index = {g.index: g for g in steps}
    seen: set[str] = set()
    first_readers: dict[int, list[str]] = {}
    committed: list[int] = []  # wgmma groups in commit order (gemm indices)
    fenced = 0  # committed[:fenced] are complete and fenced

    def regs(g: ld.DagGemm) -> list[str]:
        if g.kind is ld.GemmKind.ACCUMULATING:  # (split: its A read from shared memory)
            return [f"acc_g{g.index}"] + ([] if w.split else [f"hand_v{g.a_value}"])
        return [f"acc_g{g.index}"] if g.kind is ld.GemmKind.SCORE else []

    def issue(g: ld.DagGemm) -> None:
        reads = [t for t in (g.a, g.b) if t in streamed and t not in seen]
        seen.update(reads)
        first_readers[g.index] = reads
        committed.append(g.index)

    def wait(g: ld.DagGemm) -> tuple[int | None, list[str]]:
        nonlocal fenced
        done = committed.index(g.index) + 1
        if done <= fenced:  # completed (and fenced) by an earlier wait
            return None, []
        out = [r for i in committed[fenced:done] for r in regs(by_index[i])]
        fenced = max(fenced, done)
        return len(committed) - done, out

    depth: dict[int, int] = {}
    wait_fences: dict[int, list[str]] = {}
    for g in steps:
        if g.index in deferred:
            continue
        if g.index not in early:
            issue(g)
            for later in issue_with.get(g.index, []):
                issue(later)
        if g.kind is ld.GemmKind.ACCUMULATING and not w.wait_accumulating:
            continue
        depth[g.index], fences = wait(g)
        # (the gemm's own result: the template fences it)
        wait_fences[g.index] = [r for r in fences if r != f"acc_g{g.index}"]
    final = [r for i in committed[fenced:] for r in regs(by_index[i])]
    return dict(first_readers=first_readers, issue_with=issue_with, early=early,
                deferred=deferred, depth=depth,
                wait_fences=wait_fences, final_fences=final)
