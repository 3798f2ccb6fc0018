"""A DAG loop's plan (kgen/plan/loop_dag.py) to C++: templates/common/loop_bwd.cu.j2, the
mma.sync skeleton of FlashAttention-2's backward structure, on both sm_80 and sm_90a.

The sections' values become C++ expressions as a forward loop's do (kgen/targets/common/loop.py:
its references, runs and fast exp); what only this skeleton has is referenced here: each gemm's
result and accumulator by its place (`acc_g<index>`), a loop-row tile's vectors at its rows (the
loop's positions). The statements the template renders are CDag items, one kind each.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Axis
from ...plan import epilogue as dag
from ...plan import loop_dag as ld
from ...plan import program as pp
from .. import dag_mma_rules
from . import loop as program
from .epilogue_cpp import TO_FLOAT
from .render import render


@dataclass(frozen=True, slots=True)
class CDag:
    """One statement of the skeleton: a compute run or reduction (program.CStatement's
    kinds), "mma" (a gemm's MMAs; a loop-row gemm's epilogue in `epilogue`), "hand" (a value
    rounded to A fragments), "stage" (a value written to a shared tile), "add" (atomic adds
    into an `out accumulate` tensor), "store_score" (a score gemm's tile stored at its (row,
    col): `dBiasT = dst`), "store_tile", "store_row"."""

    kind: str
    values: tuple = ()
    draws: tuple = ()  # program.CStatement.draws
    value: str = ""  # the element reference read
    name: str = ""  # hand: the fragments' array; stage: the tile; add, stores: the parameter
    gemm: ld.DagGemm | None = None
    epilogue: tuple = ()

    @property
    def target(self) -> str:  # the stores' parameter (common/program_statements.inc.j2)
        return self.name


def _references(section: pp.Section, plan: ld.LoopDagPlan, col_end: str,
                loop_rows: bool = False, checked: bool = True, in_loop: bool = True,
                cached: frozenset[str] = frozenset(),
                tiles: dict[str, str] | None = None) -> list[str]:
    """How the statements read each value. `loop_rows`: a loop-row gemm's epilogue (`row` the
    loop's position); `checked`: the last block, where positions past the loop's end exist in
    the tile (before it, every position exists: vectors of the loop are read unguarded);
    `in_loop`: not the kernel's epilogue (whose `col` is the accumulators' column); `cached`:
    the vectors of the loop's dimension the skeleton holds per block in registers,
    `vec_<param>[j][e & 1]` (the sm_90a wgmma skeleton's: one load per column); `tiles`: the
    tensors read at (row, col) from a skeleton's staged tile (program._reference)."""
    index = {g.name: g.index for g in plan.gemms}
    refs = []
    for value in section.values:
        kind = value.kind
        if isinstance(kind, (ld.GemmResult, pp.AccumulatorValue)):
            refs.append(f"acc_g{index[kind.gemm]}[j][e]")
        elif (in_loop and not loop_rows and isinstance(kind, dag.VectorLoad)
              and kind.axis is Axis.COL and kind.param in cached):
            refs.append(f"vec_{kind.param}[j][e & 1]")
        elif (in_loop and not loop_rows and isinstance(kind, dag.VectorLoad)
              and kind.axis is Axis.COL and kind.param in plan.vectors):  # staged with the block, zero past the end
            refs.append(f"s_{kind.param}[col - kv0]")
        elif in_loop and isinstance(kind, dag.VectorLoad) and (
                (loop_rows and kind.axis is Axis.ROW) or (not loop_rows and kind.axis is Axis.COL)):
            position = "row" if loop_rows else "col"  # a vector of the loop's length
            load = TO_FLOAT[kind.dtype].format(f"g_{kind.param}[{position}]")
            refs.append(f"({position} < loop_len ? {load} : 0.0f)" if checked else load)
        else:
            refs.append(program._reference(value, col_end, "", program.LOOP_SIZES, False,
                                           tiles if in_loop and not loop_rows else None))
    return refs


# The DAG loop's statements take exp(a - b) in one piece (exp_diff), not the scaled forms
# exp(c * a - b) and exp(c * (a - b)) (program.FAST_EXP_DIFFERENCE_SCALED: the forward loops'
# only; so spelled, the backward's P spilled at 255 registers); the skeletons define the helpers
# of the forms taken (templates/common/loop_exp.inc.j2's `scaled_exp`)
SCALED_EXP = False


def _statements(section: pp.Section, plan: ld.LoopDagPlan, col_end: str,
                loop_rows: bool = False, checked: bool = True,
                in_loop: bool = True, cached: frozenset[str] = frozenset(),
                tiles: dict[str, str] | None = None) -> list[CDag]:
    refs = _references(section, plan, col_end, loop_rows, checked, in_loop, cached, tiles)
    # the mask's predicates read 1 in a block inside it (`interior`): the body's only
    fold = plan.bounds.fold if section is plan.body else ()
    # a block mask's full block: the masks read their kept value (`interior`)
    unmask = program.unmasked(plan) if section is plan.body else ()
    own_readers = {s.value for s in section.statements
                   if isinstance(s, (ld.HandTile, ld.StageTile, ld.AddTile))}
    fused = program._fused_differences(section, fold, scaled=SCALED_EXP) - own_readers
    out: list[CDag] = []
    handed: set[int] = set()
    drawn: set[int] = set()  # the random values drawn (program.draws)
    for stmt in section.statements:
        if isinstance(stmt, pp.Compute):
            ids = tuple(v for v in stmt.values if v not in fused)
            out += [CDag(s.kind, values=s.values, draws=s.draws) for s in program._runs(
                section, ids, refs, fold,
                program.body_ops(plan, program.FAST_EXP_OPS) if in_loop else
                program.FAST_EXP_OPS, fused, program.FAST_EXP_OF_DIFFERENCE,
                in_loop and program.reciprocal_division(plan), unmask, drawn)]
            continue
        if not isinstance(stmt, ld.DagStep):  # a statement reading a value
            out += [CDag(s.kind, values=s.values)
                    for s in program.drawing(program.draws(section, stmt.value, fused, drawn))]
        if isinstance(stmt, ld.DagStep):
            g = stmt.gemm
            epilogue = (tuple(_statements(g.epilogue, plan, f"kN_g{g.index}", True, checked))
                        if g.epilogue is not None else ())
            out.append(CDag("mma", gemm=g, epilogue=epilogue))
        elif isinstance(stmt, ld.HandTile):
            handed.add(stmt.value)
            out.append(CDag("hand", value=refs[stmt.value], name=f"hand_v{stmt.value}"))
        elif isinstance(stmt, ld.StageTile) and stmt.value in handed:
            # from the fragments handed on (rounded, zero past the loop's end) where it was
            out.append(CDag("stage_hand", value=f"hand_v{stmt.value}", name=stmt.tile))
        elif isinstance(stmt, ld.StageTile):
            out.append(CDag("stage", value=refs[stmt.value], name=stmt.tile))
        elif isinstance(stmt, ld.AddTile):
            out.append(CDag("add", value=refs[stmt.value], name=stmt.param))
        elif isinstance(stmt, pp.StoreTile) and in_loop:  # a score gemm's tile output
            out.append(CDag("store_score", value=refs[stmt.value], name=stmt.param))
        elif isinstance(stmt, pp.StoreTile):
            out.append(CDag("store_tile", value=refs[stmt.value], name=stmt.param))
        else:
            assert isinstance(stmt, pp.StoreRow), stmt
            out.append(CDag("store_row", value=refs[stmt.value], name=stmt.param))
    return out


@dataclass(frozen=True, slots=True)
class CTail:
    """The kernel's epilogue on the accumulators of one N (plan.tails): its statements and the
    C++ constants of its columns (kNAcc, kNAccN8 where every accumulator has one N, else per
    N: kNAcc<N>, kNAcc<N>N8)."""

    n: int
    n_name: str
    n8_name: str
    accumulators: tuple[str, ...]
    statements: tuple


def tails(plan: ld.LoopDagPlan) -> list[CTail]:
    """The plan's tails as the skeletons render them (both: the sm_90a one too)."""
    out = []
    for t in plan.tails:
        n_name = "kNAcc" if len(plan.tails) == 1 else f"kNAcc{t.n}"
        out.append(CTail(t.n, n_name, f"{n_name}N8", t.accumulators, tuple(
            _statements(t.section, plan, n_name, in_loop=False))))
    return out


def acc_n8(plan: ld.LoopDagPlan, rendered: list[CTail]) -> dict[str, str]:
    """Each accumulator's constant of n8 column groups (its tail's)."""
    return {name: t.n8_name for t in rendered for name in t.accumulators}


def body_stores(plan: ld.LoopDagPlan) -> list[str]:
    """The outputs a score gemm's epilogue stores (their pointers are set before the loop)."""
    return [s.param for s in plan.body.statements if isinstance(s, pp.StoreTile)]


# The zeroing kernel of the `out accumulate` tensors: rows of the loop's dimension per CTA
ZERO_ROWS = 64
ZERO_THREADS = 256


def zero_grid(loop_len: int, heads: int, batches: int) -> tuple[int, int, int]:
    """The grid of `<name>_zero` (templates/common/loop_bwd.cu.j2): the runtime's and the
    launcher's, the same numbers."""
    return (-(-loop_len // ZERO_ROWS), heads, batches)


def emit(plan: ld.LoopDagPlan, *, source_name: str, source_hash: str, command: str) -> str:
    # the header's lines and the params struct are a forward loop's (one home)
    body = _statements(plan.body, plan, "loop_len")  # the last block's
    body_full = _statements(plan.body, plan, "loop_len", checked=False)  # the blocks before
    tail = tails(plan)
    return render(
        "common/loop_bwd.cu.j2", plan=plan, name=plan.name, ns=f"{plan.name}_cfg",
        header=program._header(plan, source_name, source_hash, command),
        arch_guard=program._arch_guard(plan), fields=program._fields(plan),
        params_guard=program._params_guard(plan), body=body, body_full=body_full, tail=tail,
        aligned=program._aligned(plan), loop_chunks=None, element=plan.dtype.cpp,
        bounds=program._bounds(plan), mma_ab=plan.dtype.dsl_name, scaled_exp=SCALED_EXP,
        listed=plan.bounds.listed,
        pointers=[p for p in plan.params if p.kind in ("tensor", "vector")],
        body_stores=body_stores(plan),
        zeroed=[plan.param(name) for name in plan.zeroed], zero_rows=ZERO_ROWS,
        zero_threads=ZERO_THREADS, philox=program.uses_random(plan),
        approx_tanh=program.approx_tanh(plan),
        accumulators=[plan.gemm(name) for name in plan.accumulators],
        acc_n8=acc_n8(plan, tail),
        vectors=[plan.param(name) for name in plan.vectors], order_field=ld.ORDER_FIELD,
        grid_heads="p.heads / p.group" if plan.gqa else "p.heads",
        order=(dict(field=ld.ORDER_FIELD, adders=plan.adders) if plan.deterministic
               else None),
        storage=plan.storage, storage_buffers=_storage_buffers(plan),
        compact=dag_mma_rules.dag_compact_body(int(plan.registers.value), max(
            t.n for t in plan.tails) if plan.grid else None),
        grid=grid_shapes(plan))


def grid_shapes(plan: ld.LoopDagPlan) -> dict | None:
    """The warp grid's (plan.grid) C++ of an element's place, as the template's statement
    shapes hold it (None: the warp rows, the template's own shapes): `coords` the kernel's
    (name, value) of a warp's shares, `starts` per gemm its share's first column (`acc_n0`;
    a loop-row gemm's `lr_m0`, `lr_col0`), `body` a score tile's
    ([kTileM, kBlock], kScoreFrags fragments a warp; `stage_r`, `stage_c` a fragment row pair's
    place in a staged tile), `tails` per N an accumulator's, `loop_row` per loop-row gemm its
    tile's, `transposed` the staged tiles a loop-row gemm reads. Fragment j of a warp's share is
    its m16 tile j / (n8 tiles a warp), n8 tile j % (n8 tiles a warp)."""
    grid = plan.grid
    if grid is None:
        return None
    # the kernel's own: a warp's share of a score tile (its rows from s_row0, its columns of the
    # block from s_col0) and of the accumulators (rows from acc_row0); this thread's first rows
    coords = [("s_row0", "(warp / kScoreWN) * (16 * kScoreMT)"),
              ("s_col0", "(warp % kScoreWN) * (8 * kScoreNT)"),
              ("s_row_base", "row0 + s_row0 + lane / 4"),
              ("acc_row0", "(warp / kAccWN) * (16 * kAccMT)"),
              ("acc_row_base", "row0 + acc_row0 + lane / 4")]
    body = {"jn": "kScoreFrags", "en": 4, "rows": 2, "i_of_e": "e >> 1",
            "row": "s_row_base + 16 * (j / kScoreNT) + 8 * i",
            "col": "kv0 + s_col0 + quad_col + (j % kScoreNT) * 8 + (e & 1)",
            "col_end": "loop_len", "valid": "col < loop_len", "shuffles": [], "checked": True,
            "stage_r": "s_row0 + 16 * (j / kScoreNT) + lane / 4 + 8 * h",
            "stage_c": "s_col0 + (j % kScoreNT) * 8 + quad_col"}
    tails = {}
    for t in plan.tails:
        n8, col0 = t.n // 8 // grid.acc[1], f"(warp % kAccWN) * {t.n // grid.acc[1]}"
        tails[t.n] = {"row": f"acc_row_base + 16 * (j / {n8}) + 8 * i",
                      "col": f"{col0} + quad_col + (j % {n8}) * 8 + (e & 1)", "shuffles": [],
                      "store_tile": f"store_warp_rows<kAccMT, {n8}>",
                      "store_args": f", acc_row_base, rows, {col0} + quad_col"}
    loop_row, starts = {}, {}  # starts: a gemm's first column (a loop-row gemm's first row too)
    for g in plan.gemms:
        if g.kind is ld.GemmKind.ACCUMULATING:
            starts[g.name] = {"acc_n0": f"(warp % kAccWN) * {g.n_warp}"}
        if g.kind is ld.GemmKind.LOOP_ROW:
            starts[g.name] = {"lr_m0": f"(warp % kLoopRowWM) * {16 * g.m_tiles}",
                              "lr_col0": f"(warp / kLoopRowWM) * {g.n_warp}"}
            loop_row[g.name] = {
                "jn": g.m_tiles * g.n8_tiles, "en": 4, "rows": 2, "i_of_e": "e >> 1",
                "row": f"lr_row0 + 16 * (j / {g.n8_tiles}) + 8 * i",
                "col": f"lr_col0 + quad_col + (j % {g.n8_tiles}) * 8 + (e & 1)",
                "col_end": f"kN_g{g.index}", "valid": "true", "shuffles": []}
    return {"coords": coords, "body": body, "tails": tails, "loop_row": loop_row,
            "starts": starts,
            "transposed": [g.a for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW]}


@dataclass(frozen=True, slots=True)
class CBuffer:
    """A member of the emitted SharedStorage at `offset`: a tile's `slots` (`tile`), else a
    vector staged per block ([stages][block] floats)."""

    name: str
    tile: bool
    slots: int
    offset: int
    bytes: int
    live: str  # the phases it is live in, by name


def _storage_buffers(plan: ld.LoopDagPlan) -> list[CBuffer]:
    """The planned buffers as the template declares them (tiles by name, the staged vectors
    as `vec_<param>`: [stages][block] floats), by offset."""
    tiles = {t.name: t for t in plan.tiles}
    out = []
    for b in plan.storage.buffers:
        t = tiles.get(b.name)
        if t is not None:
            out.append(CBuffer(b.name, True, t.slots, b.offset, b.bytes,
                               plan.storage.live_text(b)))
        else:
            out.append(CBuffer(b.name, False, plan.stages, b.offset, b.bytes,
                               plan.storage.live_text(b)))
    return sorted(out, key=lambda c: (c.offset, c.name))
