"""The sm_90a skeleton of a DAG loop as a plan value (plan.loop_dag.DagWgmma): warp roles,
registers, the tiles the copy engine fills (boxes of [rows][64], 128-byte swizzle), the staged
tile values' slots, the mbarriers, the tensor maps and the MMAs, each with why. The rulebook
(kgen/targets/loop_rules.py, dag_wgmma_refusal) has already allowed it; this only lays it out.
The emitter (kgen/targets/sm90/loop_dag.py) reads it."""
from __future__ import annotations

import dataclasses

from ...enums import DType
from ...plan import loop_dag as ld
from ...plan import program as pp
from .. import dag_wgmma_rules as schedule_rules
from .. import loop_rules
from ..loop_rules import BOX_COLS


def dag_wgmma(resident: tuple[pp.SmemTile, ...], streamed: tuple[pp.SmemTile, ...],
              staged: tuple[pp.SmemTile, ...], dtype: DType, kv: frozenset[str],
              shape: loop_rules.DagShape, adds: int,
              vectors: tuple[str, ...] = (), skips: bool = False, *, gqa: bool = False,
              ordered: bool = False, packed: bool = False) -> ld.DagWgmma:
    """`resident`, `streamed`, `staged`: the mma.sync plan's tiles (their names and params);
    `kv`: the params whose heads are the KV heads; `adds`: the loop-row tiles' `+=` stores;
    `vectors`: the f32 vectors the body reads at `col`; `skips`: a mask's bounds skip blocks
    (the tiles of rows visit different counts); `gqa`: the loop walks a group of query heads
    (the vectors staged by the producer, the longest-first order and the fast body are not
    built with it); `ordered`: deterministic adds (tile j waits for tile j - 1 by index: the
    grid's order, not the longest first); `packed`: packed sequences (a tile's length is its
    sequence's, unknown before the offsets are read: the grid's order)."""
    config = loop_rules.DAG_WGMMA_CONFIG
    offset = 0
    tiles: list[list[pp.WgmmaTile]] = [[], [], []]
    for group, source, rows, slots in (
            (0, resident, config.tile_m, 1), (1, streamed, config.block, config.stages),
            (2, staged, config.tile_m, loop_rules.DAG_WGMMA_STAGED_SLOTS)):
        for t in source:
            tile = pp.WgmmaTile(t.name, t.param, rows, t.cols // BOX_COLS, slots, offset)
            tiles[group].append(tile)
            offset += tile.bytes
    bulk = loop_rules.DAG_WGMMA_BULK_ADD and adds == 1
    tiles_bytes, smem = loop_rules.dag_wgmma_smem_bytes(shape, bulk)
    assert offset == tiles_bytes
    row_bytes = loop_rules.dag_wgmma_add_row_bytes(shape)
    stage_bytes = config.tile_m // loop_rules.WGMMA_ROWS * config.block * row_bytes
    if bulk:
        add = dict(add_offset=offset, add_row_bytes=row_bytes, adds=pp.Choice(
            _bulk_value(config.block, (row_bytes - loop_rules.DAG_WGMMA_ADD_PAD) // 4),
            loop_rules.DAG_WGMMA_BULK_ADD_WHY))
    else:
        why = ("one add into an `out accumulate` tensor (the staging holds one)" if adds != 1
               else loop_rules.DAG_WGMMA_BULK_ADD_WHY)
        add = dict(adds=pp.Choice(ATOMICS, why))
    stage_vectors = schedule_rules.DAG_WGMMA_STAGE_VECTORS and bool(vectors) and not gqa
    vector_bytes = (schedule_rules.vector_bytes(len(vectors), config.stages, config.block)
                    if stage_vectors else 0)
    if bulk:
        add["add_offset"] += vector_bytes
    barriers = offset + vector_bytes + (stage_bytes if bulk else 0)
    maps = tuple(pp.LoopTensorMap(t.param, dtype, t.rows, t.boxes, t.param in kv)
                 for t in tiles[0] + tiles[1])
    consumers = config.tile_m // loop_rules.WGMMA_ROWS
    wait = shape.n_acc > loop_rules.DAG_WGMMA_OVERLAP_N
    ahead = (schedule_rules.DAG_WGMMA_ISSUE_AHEAD
             and shape.n_acc <= schedule_rules.DAG_WGMMA_AHEAD_N)
    defer = schedule_rules.DAG_WGMMA_DEFER_ACCUMULATING
    names = lambda ts: " and ".join(t.param for t in ts)  # noqa: E731
    producer_registers, consumer_registers = (
        schedule_rules.DAG_WGMMA_VECTOR_REGISTERS if stage_vectors else
        (loop_rules.PRODUCER_REGISTERS, loop_rules.CONSUMER_REGISTERS))
    return ld.DagWgmma(
        consumers=consumers, producer_registers=producer_registers,
        consumer_registers=consumer_registers, resident=tuple(tiles[0]),
        streamed=tuple(tiles[1]), staged=tuple(tiles[2]), barrier_offset=barriers,
        smem_bytes=smem, maps=maps,
        roles=_roles(consumers, producer_registers, consumer_registers),
        mma=pp.Choice(
            f"wgmma.m64n{config.block}k16 (SS, K-major: score gemms) + wgmma RS (B MN-major: "
            "accumulating gemms) + wgmma SS (A and B MN-major: loop-row gemms)",
            "sm_90a's warpgroup MMA with the kernel's rows as M (the score tiles computed "
            "transposed, FlashAttention-3's backward): a score gemm reads its loop-invariant "
            "tile and the ring slot K-major; an accumulating gemm's A is the handed-on value "
            "rounded in registers (the f32 accumulator fragment is its A fragment), B the ring "
            "slot MN-major; a loop-row gemm reads the staged value transposed (A MN-major) and "
            "its loop-invariant tile MN-major, each warpgroup 1/"
            f"{consumers} of the columns"),
        pipeline=pp.Choice(
            f"TMA: {names(tiles[0])} once; {names(tiles[1])} in rings of {config.stages} "
            "slots, full/empty mbarriers each; staged values in "
            f"{loop_rules.DAG_WGMMA_STAGED_SLOTS} slots",
            "the copy engine fills the next block's slots while the consumers multiply this "
            "one; a slot is released after the block's last gemm; boxes past the loop's end "
            "(and past the rows) arrive as zeros; a staged slot is rewritten two blocks later, "
            "after every warpgroup passed the block between (one consumer barrier a block)"),
        overlap=pp.Choice(_overlap_value(ahead, wait, defer),
                          schedule_rules.dag_wgmma_overlap_why(shape.n_acc, ahead, wait, defer)),
        wait_accumulating=wait, issue_ahead=ahead, defer_accumulating=defer,
        **_lpt(skips and schedule_rules.DAG_WGMMA_LPT and not gqa and not ordered
               and not packed, _NOT_LPT_WHY if gqa or ordered else
               _NOT_LPT_PACKED_WHY if packed else None),
        **_fast(schedule_rules.DAG_WGMMA_FAST_BODY and not gqa, _NOT_FAST_WHY if gqa else None),
        vectors=vectors, vector_offset=offset if stage_vectors else None, **add)


def with_bulk_add(plan: ld.LoopDagPlan, bulk: bool) -> ld.LoopDagPlan:
    """The plan with its loop-row tile's adds by the copy engine's bulk reduce-add (`bulk`:
    the staging laid out after the tiles, the mbarriers after it) or by f32 atomics from
    registers: a plan option for the bench and the tests (loop_rules.DAG_WGMMA_BULK_ADD says
    which the rulebook picks, and why); everything else as the rulebook chose it."""
    w = plan.wgmma
    assert w is not None, "the sm_90a wgmma skeleton's plan"
    if bulk == (w.add_offset is not None):
        return plan
    barriers = plan.smem_bytes - w.barrier_offset  # the mbarriers' rounded bytes
    if not bulk:
        wgmma = dataclasses.replace(
            w, add_offset=None, add_row_bytes=0, barrier_offset=w.add_offset,
            smem_bytes=w.add_offset + barriers, adds=pp.Choice(
                ATOMICS, "the plan option with_bulk_add (the bench's and the tests' variant)"))
        return dataclasses.replace(plan, wgmma=wgmma, smem_bytes=wgmma.smem_bytes)
    (g,) = [g for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW]
    assert sum(isinstance(s, ld.AddTile) for s in g.epilogue.statements) == 1, "one add"
    row_bytes = 4 * g.n_warp + loop_rules.DAG_WGMMA_ADD_PAD
    stage = w.consumers * plan.block * row_bytes
    wgmma = dataclasses.replace(
        w, add_offset=w.barrier_offset, add_row_bytes=row_bytes,
        barrier_offset=w.barrier_offset + stage, smem_bytes=w.barrier_offset + stage + barriers,
        adds=pp.Choice(_bulk_value(plan.block, g.n_warp),
                       "the plan option with_bulk_add (the bench's and the tests' variant)"))
    return dataclasses.replace(plan, wgmma=wgmma, smem_bytes=wgmma.smem_bytes)


ATOMICS = "f32 atomics (red.global.add.f32) from registers"


def _bulk_value(block: int, cols: int) -> str:
    return (f"bulk reduce-add: [{block}, {cols}] f32 per consumer warpgroup staged in shared "
            "memory, a row per add")


def _roles(consumers: int, producer: int, consumer: int) -> pp.Choice:
    return pp.Choice(
        f"1 producer warpgroup + {consumers} consumer warpgroups of 64 rows",
        "warp specialization: one thread of the producer issues every copy-engine load "
        f"(setmaxnreg {producer}) while the consumers (setmaxnreg {consumer}) multiply and "
        "run the statements")


def _lpt(on: bool, why: str | None = None) -> dict:
    return dict(lpt_l2_bytes=schedule_rules.DAG_WGMMA_LPT_L2_BYTES if on else None,
                lpt_why=schedule_rules.DAG_WGMMA_LPT_WHY if on else why or "the grid's order")


def _fast(on: bool, why: str | None = None) -> dict:
    return dict(fast_body=on,
                fast_body_why=schedule_rules.DAG_WGMMA_FAST_BODY_WHY if on else
                why or "one body for every block")


# why GQA and deterministic mode keep the session-5 schedule's pieces (not built together yet)
_NOT_LPT_WHY = ("the grid's order: the longest-first order is not built with GQA (its tiles "
                "walk KV heads) nor with deterministic adds (a tile waits for the one before "
                "by index)")
_NOT_LPT_PACKED_WHY = ("the grid's order: the longest-first order ranks tiles by the loop's "
                       "length, which packed sequences read per batch from the offsets")
_NOT_FAST_WHY = "one body for every block: the fast body is not built with GQA's visits yet"


def with_schedule(plan: ld.LoopDagPlan, *, issue_ahead: bool | None = None,
                  wait_accumulating: bool | None = None,
                  stage_vectors: bool | None = None,
                  defer_accumulating: bool | None = None,
                  lpt: bool | None = None, fast_body: bool | None = None) -> ld.LoopDagPlan:
    """The plan with its wgmma groups scheduled otherwise (None: as the rulebook chose):
    `issue_ahead` the later score gemms issued with the first, `wait_accumulating` each
    accumulating gemm waited for at once, `defer_accumulating` an accumulating gemm before a
    loop-row gemm issued after it, `lpt` the longest tiles of rows first, `fast_body` a second
    body without bounds checks for the blocks inside the mask, `stage_vectors` the
    vectors read at `col` staged by the producer (else loaded by the consumers): plan options
    for the bench and the tests."""
    w = plan.wgmma
    assert w is not None, "the sm_90a wgmma skeleton's plan"
    if plan.gqa and (lpt or fast_body or stage_vectors) or (plan.deterministic
                                                            or plan.packed) and lpt:
        raise ValueError("with_schedule: the longest-first order, the fast body and the staged "
                         "vectors are not built with GQA, nor the longest first with "
                         "deterministic adds or packed sequences")
    changes = {k: v for k, v in (("issue_ahead", issue_ahead),
                                 ("wait_accumulating", wait_accumulating),
                                 ("defer_accumulating", defer_accumulating)) if v is not None}
    why = "the plan option with_schedule (the bench's and the tests' variant)"
    if any(getattr(w, k) != v for k, v in changes.items()):
        w = dataclasses.replace(w, **changes)
        w = dataclasses.replace(w, overlap=pp.Choice(_overlap_value(
            w.issue_ahead, w.wait_accumulating, w.defer_accumulating), why))
    if lpt is not None:  # (the longest first only where the tiles of rows differ)
        w = dataclasses.replace(w, **_lpt(lpt and plan.bounds.skips))
    if fast_body is not None:
        w = dataclasses.replace(w, **_fast(fast_body))
    if stage_vectors is not None and stage_vectors != (w.vector_offset is not None) \
            and w.vectors:
        # the vectors' slots sit after the tiles, before the adds' staging and the mbarriers
        at = w.staged[-1].offset + w.staged[-1].bytes if w.staged else w.barrier_offset
        shift = schedule_rules.vector_bytes(len(w.vectors), plan.stages, plan.block) * (
            1 if stage_vectors else -1)
        regs = (schedule_rules.DAG_WGMMA_VECTOR_REGISTERS if stage_vectors else
                (loop_rules.PRODUCER_REGISTERS, loop_rules.CONSUMER_REGISTERS))
        w = dataclasses.replace(
            w, vector_offset=at if stage_vectors else None, producer_registers=regs[0],
            consumer_registers=regs[1], roles=_roles(w.consumers, *regs),
            add_offset=None if w.add_offset is None else w.add_offset + shift,
            barrier_offset=w.barrier_offset + shift, smem_bytes=w.smem_bytes + shift)
    return dataclasses.replace(plan, wgmma=w, smem_bytes=w.smem_bytes,
                               vectors=w.vectors if w.vector_offset is not None else ())


def _overlap_value(ahead: bool, wait: bool, defer: bool) -> str:
    first = ("the score gemms issued together (the later ones in flight during the first's "
             "epilogue)" if ahead else "each score gemm issued at its statement")
    acc = ("an accumulating gemm waited for at once" if wait else
           "an accumulating gemm in flight until a later wait")
    last = ("; the accumulating gemm before the loop-row gemm issued after it (in flight "
            "while the loop-row tile is added)" if defer else "")
    return f"{first}; {acc}{last}"
