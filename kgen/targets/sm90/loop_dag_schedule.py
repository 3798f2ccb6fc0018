"""The sm_90a skeleton of a DAG loop as a plan value (plan.loop_dag.DagWgmma): warp roles,
registers, the tiles the copy engine fills (boxes of [rows][64], 128-byte swizzle), the staged
tile values' slots, the mbarriers, the tensor maps and the MMAs, each with why. The rulebook
(kgen/targets/loop_rules.py, dag_wgmma_refusal) has already allowed it; this only lays it out.
The emitter (kgen/targets/sm90/loop_dag.py) reads it."""
from __future__ import annotations

import dataclasses

from ...enums import DType, Layout
from ...plan import epilogue as dag
from ...plan import loop_dag as ld
from ...plan import program as pp
from .. import dag_wgmma_rules as schedule_rules
from .. import loop_rules
from . import loop_dag_tail
from ..loop_rules import BOX_COLS


def dag_wgmma(resident: tuple[pp.SmemTile, ...], streamed: tuple[pp.SmemTile, ...],
              staged: tuple[pp.SmemTile, ...], dtype: DType, kv: frozenset[str],
              shape: loop_rules.DagShape, adds: int,
              vectors: tuple[str, ...] = (), skips: bool = False, *, gqa: bool = False,
              ordered: bool = False, add_to: str | None = None,
              body: pp.Section | None = None, gemms: tuple[ld.DagGemm, ...] = (),
              params: tuple[pp.ProgramParam, ...] = (), smem_limit: int = 0,
              packed: bool = False, linear: bool | None = None,
              listed: bool = False,
              tail_stores: tuple[tuple[str, int], ...] = ()) -> ld.DagWgmma:
    """`resident`, `streamed`, `staged`: the mma.sync plan's tiles (their names and params);
    `kv`: the params whose heads are the KV heads; `adds`: the loop-row tiles' `+=` stores;
    `vectors`: the f32 vectors the body reads at `col`; `skips`: a mask's bounds skip blocks
    (the tiles of rows visit different counts); `gqa`: the loop walks a group of query heads
    (with deterministic adds at N 128 neither the staged vectors nor the fast body:
    dag_wgmma_rules.DAG_WGMMA_GQA_ORDERED_N); `ordered`: deterministic adds (tile j waits for
    tile j - 1, or for tile j + 1 where a mask skips blocks (dag_wgmma_rules.
    DAG_WGMMA_DESCENDING): launch order, not the longest first); `add_to`: the tensor the one
    `+=` store adds into (its tensor map, where the rulebook takes the tensor reduce-add);
    `body`, `gemms`, `params`: the loop's body, gemms and the kernel's params (a tensor the body
    reads at (row, col) staged, a score gemm's tile store of the staged value stored from it:
    dag_wgmma_rules), `smem_limit` the target's shared memory (how many slots the staged
    tensor's ring takes); `packed`: packed sequences (a tile's length is its sequence's,
    unknown before the offsets are read: the grid's order; dQ's adds by rows); `linear`: the
    skipped blocks follow linear bounds (the longest-first order ranks the tiles by them; an
    equality's follow the ids: dag_wgmma_rules.DAG_WGMMA_LPT_EQUALITY_WHY), `skips` if None;
    `listed`: a block mask's lists say which blocks a tile visits (the grid's order);
    `tail_stores`: the kernel's epilogue's tile outputs and their columns (stored by the copy
    engine from the rings where they fit: loop_dag_tail)."""
    linear = skips if linear is None else linear
    split = schedule_rules.dag_wgmma_split(shape, loop_rules.DAG_WGMMA_N)
    config = schedule_rules.dag_wgmma_split_config() if split else loop_rules.DAG_WGMMA_CONFIG
    consumers = (schedule_rules.DAG_WGMMA_SPLIT_CONSUMERS if split
                 else config.tile_m // loop_rules.WGMMA_ROWS)
    offset = 0
    tiles: list[list[pp.WgmmaTile]] = [[], [], []]
    for group, source, rows, slots in (
            (0, resident, config.tile_m, 1), (1, streamed, config.block, config.stages),
            (2, staged, config.tile_m, loop_rules.DAG_WGMMA_STAGED_SLOTS)):
        for t in source:
            tile = pp.WgmmaTile(t.name, t.param, rows, t.cols // BOX_COLS, slots, offset)
            tiles[group].append(tile)
            offset += tile.bytes
    handed, a_tiles = _handed(body, config, offset) if split else ((), ())
    offset += sum(t.bytes for t in handed)
    bulk = loop_rules.DAG_WGMMA_BULK_ADD and adds == 1
    tiles_bytes, _ = (schedule_rules.dag_wgmma_split_smem_bytes(shape) if split else
                      loop_rules.dag_wgmma_smem_bytes(shape, bulk))
    assert offset == tiles_bytes
    n_warp = max(shape.loop_row_n, default=0) // consumers
    boxed = (bulk and add_to is not None and not packed and not split
             and n_warp % schedule_rules.DAG_WGMMA_ADD_BOX_COLS == 0)
    if split and adds:
        mode, why = (_split_adds(tiles_bytes, vectors, config, shape, n_warp, smem_limit)
                     if boxed_split(adds, add_to, packed, n_warp) else
                     (ATOMIC, schedule_rules.DAG_WGMMA_SPLIT_PACKED_WHY if packed else
                      "one add into an `out accumulate` tensor (the staging holds one)"))
    elif boxed and schedule_rules.DAG_WGMMA_ADD_WARP:
        mode, why = WARP, schedule_rules.DAG_WGMMA_ADD_WARP_WHY
    elif boxed and schedule_rules.DAG_WGMMA_TENSOR_ADD and not ordered:
        mode, why = TENSOR, schedule_rules.DAG_WGMMA_TENSOR_ADD_WHY
    elif bulk:
        mode, why = ROWS, (schedule_rules.DAG_WGMMA_ROWS_PACKED_WHY if packed else
                           schedule_rules.DAG_WGMMA_ROWS_ORDERED_WHY if ordered
                           else loop_rules.DAG_WGMMA_BULK_ADD_WHY)
    else:
        mode, why = ATOMIC, ("one add into an `out accumulate` tensor (the staging holds one)"
                             if adds != 1 else loop_rules.DAG_WGMMA_BULK_ADD_WHY)
    # GQA's deterministic build at N 128 without the fast body and the staged vectors (spills)
    gqa_ordered = (gqa and ordered and not split
                   and shape.n_acc > schedule_rules.DAG_WGMMA_GQA_ORDERED_N)
    # GQA's split layout with the add warp: without the staged vectors (and, deterministic,
    # without the fast body) its consumers fit their registers (dag_wgmma_rules)
    gqa_adds = gqa and split and mode in (WARP, SLOTS)
    stage_vectors = (schedule_rules.DAG_WGMMA_STAGE_VECTORS and bool(vectors) and not gqa_ordered
                     and not gqa_adds)
    vector_bytes = (schedule_rules.vector_bytes(len(vectors), config.stages, config.block)
                    if stage_vectors else 0)
    maps = tuple(pp.LoopTensorMap(t.param, dtype, t.rows, t.boxes, t.param in kv)
                 for t in tiles[0] + tiles[1])
    words = 1 + 2 * config.stages * len(streamed)  # the mbarriers
    # the bias's slots fit beside the largest staging any add mode takes (with_adds's options)
    used = offset + vector_bytes + max(_add_stage_bytes(m, consumers, config.block, n_warp)
                                       for m in (ADD_MODES if add_to is not None else (mode,)))
    staging = _bias(body, gemms, params, dtype, config, offset, used, smem_limit, words, gqa,
                    split)
    vector_offset = offset
    if staging["bias"] is not None:  # its ring after the tiles: the vectors and adds follow
        bias = staging["bias"]
        vector_offset += bias.bytes
        maps += (pp.LoopTensorMap(bias.param, dtype, bias.rows, bias.boxes, False),)
    store = _staged_store(body, tiles[2], params, dtype, gqa, split)
    if store["store_param"] is not None:
        (tile,) = [t for t in tiles[2] if t.name == store["store_tile"]]
        maps += (pp.LoopTensorMap(store["store_param"], dtype, tile.rows, tile.boxes, False),)
    tail = loop_dag_tail.tail(tail_stores, tiles[1], params, dtype, kv, config, consumers,
                              split, packed)
    maps += tail.pop("maps")
    # (accumulators of different N: the widest's rules, the registers it holds)
    wait = shape.n_acc > loop_rules.DAG_WGMMA_OVERLAP_N
    stores_tile = body is not None and any(isinstance(s, pp.StoreTile)
                                           for s in body.statements)
    ahead = (schedule_rules.DAG_WGMMA_SPLIT_ISSUE_AHEAD and not stores_tile if split else
             schedule_rules.DAG_WGMMA_ISSUE_AHEAD
             and shape.n_acc <= schedule_rules.DAG_WGMMA_AHEAD_N)
    defer = schedule_rules.DAG_WGMMA_DEFER_ACCUMULATING
    defer_all = split and schedule_rules.DAG_WGMMA_SPLIT_DEFER_ALL
    names = lambda ts: " and ".join(t.param for t in ts)  # noqa: E731
    producer_registers, consumer_registers = (
        schedule_rules.DAG_WGMMA_VECTOR_REGISTERS if stage_vectors else
        (loop_rules.PRODUCER_REGISTERS, loop_rules.CONSUMER_REGISTERS))
    w = ld.DagWgmma(
        consumers=consumers, producer_registers=producer_registers,
        consumer_registers=consumer_registers, resident=tuple(tiles[0]),
        streamed=tuple(tiles[1]), staged=tuple(tiles[2]), barrier_offset=0, smem_bytes=0,
        maps=maps,
        roles=_roles(consumers, producer_registers, consumer_registers, split),
        mma=_split_mma(config, shape.n_acc, gemms) if split else pp.Choice(
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
        overlap=pp.Choice(_overlap_value(ahead, wait, defer, defer_all),
                          schedule_rules.dag_wgmma_overlap_why(shape.n_acc, ahead, wait, defer,
                                                               split, defer_all)),
        wait_accumulating=wait, issue_ahead=ahead, defer_accumulating=defer,
        defer_all=defer_all,
        **_lpt(not packed and (schedule_rules.DAG_WGMMA_ORDERED_SECTIONS and not skips
                               if ordered else linear and schedule_rules.DAG_WGMMA_LPT),
               _NOT_LPT_PACKED_WHY if packed else _NOT_LPT_LISTED_WHY if listed else
               schedule_rules.DAG_WGMMA_ORDERED_SKIPS_WHY if ordered else
               schedule_rules.DAG_WGMMA_LPT_EQUALITY_WHY if skips else None, ordered),
        **_fast(schedule_rules.DAG_WGMMA_FAST_BODY and not gqa_ordered
                and not (gqa_adds and ordered),
                schedule_rules.DAG_WGMMA_GQA_ORDERED_WHY.format(n=shape.n_acc)
                if gqa_ordered else schedule_rules.DAG_WGMMA_SPLIT_GQA_ADDS_WHY
                if gqa_adds and ordered else None),
        **_order(ordered, ordered and skips and schedule_rules.DAG_WGMMA_DESCENDING),
        vectors=vectors, vector_offset=vector_offset if stage_vectors else None,
        split=pp.Choice(
            f"{config.tile_m} rows a CTA, each consumer warpgroup N / {consumers} of the "
            f"accumulators and {config.block // consumers} of a score tile's columns",
            schedule_rules.DAG_WGMMA_SPLIT_WHY.format(half=config.block // consumers))
        if split else None, handed=handed, a_tiles=a_tiles, pieces=_pieces(gemms) if split else (),
        **staging, **store, **tail)
    return _place_adds(w, mode, why, config.block, n_warp, add_to)


def boxed_split(adds: int, add_to: str | None, packed: bool, n_warp: int) -> bool:
    """Whether the split layout's loop-row tile may be added by the copy engine's tensor
    reduce-adds: one add into one tensor, not packed sequences, whole [block][32] boxes."""
    return (adds == 1 and add_to is not None and not packed
            and n_warp % schedule_rules.DAG_WGMMA_ADD_BOX_COLS == 0)


def _split_adds(tiles: int, vectors: tuple[str, ...], config, shape: loop_rules.DagShape,
                n_warp: int, smem_limit: int) -> tuple[str, str]:
    """The split layout's adds and why (dag_wgmma_rules.split_adds) from its tiles' bytes."""
    vector_bytes = (schedule_rules.vector_bytes(len(vectors), config.stages, config.block)
                    if schedule_rules.DAG_WGMMA_STAGE_VECTORS and vectors else 0)
    room = _split_room(tiles + vector_bytes, config.stages, len(shape.streamed_cols),
                       config.block, n_warp, smem_limit)
    return schedule_rules.split_adds(*room, shape.streamed_cols, 2 * n_warp)


def _split_room(end: int, stages: int, streamed: int, block: int, n_warp: int,
                smem_limit: int) -> tuple[int, int, int]:
    """(the bytes before a staging of the add warp's own: the tiles and vectors ending at `end`,
    1024-byte aligned; the staging's bytes; the shared memory less the mbarriers of `streamed`
    rings of `stages` slots)."""
    barriers = -(-8 * (1 + 2 * stages * streamed) // 128) * 128
    stage = _add_stage_bytes(WARP, schedule_rules.DAG_WGMMA_SPLIT_CONSUMERS, block, n_warp,
                             aligned=False)
    return -(-end // 1024) * 1024, stage, smem_limit - barriers


def _bias(body, gemms, params, dtype: DType, config, offset: int, used: int, limit: int,
          words: int, gqa: bool, split: bool = False) -> dict:
    """The staged tensor read at (row, col) (kgen/targets/dag_wgmma_rules.py: the bias): its
    ring at `offset` (after the tiles) of the most slots that fit `limit` beside the `used`
    bytes and `words` mbarriers, the score gemm whose epilogue reads it, and why (or none). A
    column-major tensor's tile is staged as its memory lies (the tile's WgmmaTile rows the
    block's columns, its boxes 64 of the tile's rows each), read by ldmatrix .trans."""
    none = dict(bias=None, bias_gemm=None)
    reads = _tile_reads(body, gemms)
    if not reads:
        return dict(none, staging=pp.Choice("none", "the body reads no tensor at (row, col)"))
    (name, gemm), others = reads[0], reads[1:]
    p = next(q for q in params if q.name == name)
    tail = "".join(f"; {q} read per element from global memory" for q, _ in others)
    # a column-major tensor's boxes are its memory's: [block (the loop's columns)][64 rows]
    col = p.layout is Layout.COL
    across, along = (config.tile_m, config.block) if col else (config.block, config.tile_m)
    boxes = across // BOX_COLS
    slot = along * 128 * boxes
    fits = [n for n in schedule_rules.DAG_WGMMA_BIAS_SLOTS
            if used + n * slot + -(-8 * (words + 2 * n) // 128) * 128 <= limit]
    refused = (
        "the rulebook reads it per element (DAG_WGMMA_STAGE_BIAS)"
        if not schedule_rules.DAG_WGMMA_STAGE_BIAS else
        "GQA's visits walk the query heads (not built with them)" if gqa else
        schedule_rules.DAG_WGMMA_SPLIT_NOT_STAGED_WHY if split else
        f"{name} is {p.dtype.dsl_name}, the operands {dtype.dsl_name}: one copy-engine type"
        if p.dtype is not dtype else
        f"the {'tile of rows' if col else 'block'} of {across} is not a multiple of the copy "
        f"engine's {BOX_COLS}-column boxes" if across % BOX_COLS else
        f"a [{config.tile_m}, {config.block}] slot does not fit the shared memory ({limit} B)"
        if not fits else None)
    if refused is not None:
        return dict(none, staging=pp.Choice(f"{name} read per element from global memory",
                                            f"not staged: {refused}" + tail))
    tile = pp.WgmmaTile("t_smem", name, along, boxes, fits[0], offset)
    return dict(bias=tile, bias_gemm=gemm, staging=pp.Choice(
        f"{name}'s [{config.tile_m}, {config.block}] tile per block by the copy engine"
        + (f" (column-major: boxes of [{along}][{BOX_COLS}] rows, read by ldmatrix .trans)"
           if col else "") + f", a ring of {tile.slots} slot(s)",
        schedule_rules.DAG_WGMMA_STAGE_BIAS_WHY
        + (schedule_rules.DAG_WGMMA_STAGE_BIAS_COL_WHY if col else "")
        + ("" if tile.slots == schedule_rules.DAG_WGMMA_BIAS_SLOTS[0] else
           f" (one slot: {schedule_rules.DAG_WGMMA_BIAS_SLOTS[0]} do not fit {limit} B)")
        + tail))


def _tile_reads(body, gemms) -> list[tuple[str, int]]:
    """(the tensors the body reads at (row, col), the index of the score gemm whose epilogue
    reads each first), in order of first reading; a tensor read after another gemm's step too
    is left out (its share is taken once, after that gemm)."""
    if body is None:
        return []
    found: dict[str, int] = {}
    late: set[str] = set()
    gemm = None
    for stmt in body.statements:
        if isinstance(stmt, ld.DagStep):
            gemm = stmt.gemm
            continue
        if not isinstance(stmt, pp.Compute):
            continue
        for v in stmt.values:
            kind = body.values[v].kind
            args = (kind.args if isinstance(kind, dag.Apply) else
                    (kind.arg,) if isinstance(kind, dag.Cast) else ())
            for a in args:
                load = body.values[a].kind
                if not isinstance(load, dag.TensorLoad):
                    continue
                if gemm is None or gemm.kind is not ld.GemmKind.SCORE:
                    late.add(load.param)
                elif found.setdefault(load.param, gemm.index) != gemm.index:
                    late.add(load.param)
    return [(name, g) for name, g in found.items() if name not in late]


def staged_store(body, params, dtype: DType, gqa: bool, split: bool = False) -> frozenset[str]:
    """The tile output the skeleton stores from a staged slot (none or one): it also writes
    its zeros on the blocks a mask skips (the lowering's bounds then skip them)."""
    found = _staged_store(body, (), params, dtype, gqa, split)["store_param"]
    return frozenset((found,)) if found is not None else frozenset()


def _staged_store(body, staged, params, dtype: DType, gqa: bool, split: bool = False) -> dict:
    """A score gemm's tile store of the value a loop-row gemm stages (dag_wgmma_rules:
    DAG_WGMMA_STORE_STAGED), stored from the staged slot by the copy engine, or none."""
    none = dict(store_param=None, store_tile=None)
    if body is None:
        return dict(none)
    stages = {s.value: s.tile for s in body.statements if isinstance(s, ld.StageTile)}
    for s in body.statements:
        if not isinstance(s, pp.StoreTile):
            continue
        p = next(q for q in params if q.name == s.param)
        refused = (
            "the rulebook stores per element (DAG_WGMMA_STORE_STAGED)"
            if not schedule_rules.DAG_WGMMA_STORE_STAGED else
            "GQA's visits walk the query heads (not built with them)" if gqa else
            schedule_rules.DAG_WGMMA_SPLIT_NOT_STAGED_WHY if split else
            "no loop-row gemm stages the stored value" if s.value not in stages else
            f"{s.param} is {p.dtype.dsl_name}, the staged tile {dtype.dsl_name}"
            if s.dtype is not dtype or p.dtype is not dtype else None)
        if refused is not None:
            return dict(none, tile_store=pp.Choice(
                f"{s.param} stored per element from registers", refused))
        return dict(store_param=s.param, store_tile=stages[s.value], tile_store=pp.Choice(
            f"{s.param} from the staged tile's slot by the copy engine",
            schedule_rules.DAG_WGMMA_STORE_STAGED_WHY))
    return dict(none)


def _handed(body, config, offset: int
            ) -> tuple[tuple[pp.WgmmaTile, ...], tuple[tuple[int, str], ...]]:
    """The split layout's staged tiles of the values handed on to accumulating gemms that no
    loop-row gemm stages ([tile_m, block], two slots, from `offset` on), and each accumulating
    gemm's tile (its value's: a loop-row gemm's staged tile where one stages it)."""
    stages = {s.value: s.tile for s in body.statements if isinstance(s, ld.StageTile)}
    handed: list[pp.WgmmaTile] = []
    a_tiles: list[tuple[int, str]] = []
    for s in body.statements:
        if not (isinstance(s, ld.DagStep) and s.gemm.kind is ld.GemmKind.ACCUMULATING):
            continue
        value = s.gemm.a_value
        if value not in stages:
            tile = pp.WgmmaTile(f"h{len(handed)}_smem", f"v{value}", config.tile_m,
                                config.block // BOX_COLS, loop_rules.DAG_WGMMA_STAGED_SLOTS,
                                offset)
            offset += tile.bytes
            handed.append(tile)
            stages[value] = tile.name
        a_tiles.append((s.gemm.index, stages[value]))
    return tuple(handed), tuple(a_tiles)


def _pieces(gemms: tuple[ld.DagGemm, ...]) -> tuple[tuple[int, int], ...]:
    """The split layout's accumulating and loop-row gemms issued in wgmma pieces (their index,
    the pieces' N: dag_wgmma_rules.dag_wgmma_split_piece)."""
    return tuple((g.index, piece) for g in gemms if g.kind is not ld.GemmKind.SCORE
                 and (piece := schedule_rules.dag_wgmma_split_piece(g.n)) is not None)


def _split_mma(config, n: int, gemms: tuple[ld.DagGemm, ...] = ()) -> pp.Choice:
    half, cols = n // 2, config.block // 2
    value = (
        f"wgmma.m64n{cols}k16 (SS, K-major: score gemms, each warpgroup {cols} of the block) + "
        f"wgmma.m64n{half}k16 SS (A K-major from the staged value, B MN-major: accumulating "
        f"gemms, each warpgroup {half} of N) + wgmma SS (A and B MN-major: loop-row gemms)")
    why = ("sm_90a's warpgroup MMA with the kernel's rows as M, the split layout (kgen/targets/"
           "dag_wgmma_rules.py, DAG_WGMMA_SPLIT): both warpgroups multiply all "
           f"{config.tile_m} rows; a score gemm's columns, an accumulator's N and a loop-row "
           "gemm's N are halved between them; the values handed on are staged so that each "
           "warpgroup reads the whole tile as its A")
    pieced = dict(_pieces(gemms))
    for n_pieced in sorted({g.n for g in gemms if g.index in pieced}):
        mine = [g for g in gemms if g.index in pieced and g.n == n_pieced]
        piece, half = pieced[mine[0].index], n_pieced // 2
        value += (f"; {' and '.join(g.name for g in mine)}: each warpgroup's {half} columns as "
                  f"{half // piece} wgmma.m64n{piece}k16 pieces")
        why += "; " + schedule_rules.DAG_WGMMA_SPLIT_PIECES_WHY.format(
            n=n_pieced, half=half, pieces=half // piece, piece=piece)
    return pp.Choice(value, why)


# How a loop-row tile's `+=` store adds (DagWgmma.adds): the plan option with_adds's names
# (SLOTS: the add warp's, each warpgroup's share staged in the streamed slots: the split layout)
ATOMIC, ROWS, TENSOR, WARP, SLOTS = "atomics", "rows", "tensor", "warp", "slots"
ADD_MODES = (ATOMIC, ROWS, TENSOR, WARP, SLOTS)


def add_mode(w: ld.DagWgmma) -> str:
    """The plan's way of adding (ADD_MODES)."""
    if w.add_slots:
        return SLOTS
    if w.add_offset is None:
        return ATOMIC
    return (WARP if w.add_warp else TENSOR) if w.add_map is not None else ROWS


def _add_slots(w: ld.DagWgmma, n_warp: int) -> tuple[ld.AddBox, ...]:
    """Where each [block][32] f32 box of a warpgroup's share is staged (SLOTS): its own 16-bit
    boxes of the streamed slots (a warpgroup's half of each tile's columns), the tiles whose
    gemms after the loop-row gemm are fewest first (the last streamed tile: dO, read by no
    deferred gemm under the rulebook's schedule), one f32 box a 16-bit box (both block x 128
    bytes)."""
    boxes = n_warp // schedule_rules.DAG_WGMMA_ADD_BOX_COLS
    own = [ld.AddBox(t.name, b, t.boxes // w.consumers) for t in reversed(w.streamed)
           for b in range(t.boxes // w.consumers)]
    assert len(own) >= boxes and all(t.box_bytes == t.rows * 128 for t in w.streamed)
    return tuple(own[:boxes])


def _place_adds(w: ld.DagWgmma, mode: str, why: str, block: int, n_warp: int,
                add_to: str | None) -> ld.DagWgmma:
    """`w` with its adds done `mode` (ADD_MODES) and laid out after its tiles and the staged
    vectors: ROWS' staging of kBlock rows of n_warp f32 and a pad per consumer warpgroup;
    TENSOR's (and WARP's) boxes of [kBlock][32] f32 per warpgroup, 1024-byte aligned (the
    128-byte swizzle's pattern), with the map of `add_to`; then the mbarriers (rounded to 128
    bytes)."""
    end = max(t.offset + t.bytes for t in w.tiles)
    if w.vector_offset is not None:
        end = w.vector_offset + schedule_rules.vector_bytes(
            len(w.vectors), w.streamed[0].slots, block)
    stage, fields = 0, dict(add_offset=None, add_row_bytes=0, add_map=None, add_warp=False,
                            add_slots=())
    stage = _add_stage_bytes(mode, w.consumers, block, n_warp, aligned=False)
    if mode == ROWS:
        row_bytes = 4 * n_warp + loop_rules.DAG_WGMMA_ADD_PAD
        fields = dict(add_offset=end, add_row_bytes=row_bytes, add_map=None, add_warp=False,
                      add_slots=())
        value = (f"bulk reduce-add: [{block}, {n_warp}] f32 per consumer warpgroup staged in "
                 "shared memory, a row per add")
    elif mode in (TENSOR, WARP):
        assert add_to is not None and n_warp % schedule_rules.DAG_WGMMA_ADD_BOX_COLS == 0
        boxes = n_warp // schedule_rules.DAG_WGMMA_ADD_BOX_COLS
        fields = dict(add_offset=-(-end // 1024) * 1024, add_row_bytes=0,
                      add_map=pp.LoopTensorMap(add_to, DType.F32, block, boxes, False),
                      add_warp=mode == WARP, add_slots=())
        by = ("the producer warpgroup's add warp (warp 2), handed the shares through named "
              "barriers" if mode == WARP else "one thread of the warpgroup")
        value = (f"tensor reduce-add: [{block}, {n_warp}] f32 per consumer warpgroup staged in "
                 f"shared memory ({boxes} box(es) of [{block}][32], 128-byte swizzle), added by "
                 f"{by} through {add_to}'s tensor map (cp.reduce.async.bulk.tensor)")
    elif mode == SLOTS:
        assert add_to is not None and w.split is not None
        boxes = n_warp // schedule_rules.DAG_WGMMA_ADD_BOX_COLS
        fields = dict(add_offset=None, add_row_bytes=0,
                      add_map=pp.LoopTensorMap(add_to, DType.F32, block, boxes, False),
                      add_warp=True, add_slots=_add_slots(w, n_warp))
        value = (f"tensor reduce-add: [{block}, {n_warp}] f32 per consumer warpgroup staged in "
                 f"its own boxes of the block's streamed slots ({boxes} box(es) of [{block}][32],"
                 f" 128-byte swizzle: "
                 + ", ".join(f"{b.tile} box {b.box} + {b.stride} x consumer"
                             for b in fields["add_slots"])
                 + f"), added by the producer warpgroup's add warp through {add_to}'s tensor map "
                 "(cp.reduce.async.bulk.tensor), which then releases the slots")
    elif w.split is not None:  # (a thread's two adjacent columns at once)
        value = "f32 pair atomics (red.global.add.v2.f32) from registers"
    else:
        value = "f32 atomics (red.global.add.f32) from registers"
    barrier_offset = end if fields["add_offset"] is None else fields["add_offset"] + stage
    words = 1 + 2 * w.streamed[0].slots * len(w.streamed) + (
        2 * w.bias.slots if w.bias is not None else 0)  # the mbarriers (the bias's ring's too)
    barriers = -(-8 * words // 128) * 128
    if mode == SLOTS:  # (no staging of its own: the mbarriers right after the tiles)
        barrier_offset = end
    return dataclasses.replace(w, barrier_offset=barrier_offset,
                               smem_bytes=barrier_offset + barriers,
                               adds=pp.Choice(value, why), **fields)


def _add_stage_bytes(mode: str, consumers: int, block: int, n_warp: int, *,
                     aligned: bool = True) -> int:
    """The shared memory the adds' staging takes done `mode`: ROWS' rows and pads, TENSOR's and
    WARP's boxes (`aligned`: with the most the 1024-byte alignment can add before them)."""
    if mode == ROWS:
        return consumers * block * (4 * n_warp + loop_rules.DAG_WGMMA_ADD_PAD)
    if mode in (TENSOR, WARP):
        return consumers * block * n_warp * 4 + (1023 if aligned else 0)
    return 0


def with_adds(plan: ld.LoopDagPlan, mode: str) -> ld.LoopDagPlan:
    """The plan with its loop-row tile's adds done `mode` (ADD_MODES: f32 atomics from
    registers, the copy engine's bulk reduce-add per staged row, or its tensor reduce-add of
    each warpgroup's staged share issued by a thread of the warpgroup or by the producer's add
    warp): a plan option for the bench and the tests (the rulebook's choice and why:
    dag_wgmma_rules.DAG_WGMMA_ADD_WARP, DAG_WGMMA_TENSOR_ADD, loop_rules.DAG_WGMMA_BULK_ADD);
    everything else as the rulebook chose it. The tensor reduce-add by a thread of each
    warpgroup is not built with deterministic mode (the add warp's and the rows' are)."""
    w = plan.wgmma
    assert w is not None and mode in ADD_MODES, "the sm_90a wgmma skeleton's plan; a mode"
    if mode == add_mode(w):
        return plan
    if mode in (TENSOR, WARP, SLOTS) and plan.packed:
        raise ValueError("with_adds: the tensor reduce-add is not built with packed sequences ("
                         + schedule_rules.DAG_WGMMA_ROWS_PACKED_WHY + ")")
    if mode in (ROWS, TENSOR) and w.split is not None:
        raise ValueError(f"with_adds: the split layout adds by f32 atomics or the add warp "
                         f"(warp, slots), not {mode}")
    if mode == SLOTS and w.split is None:
        raise ValueError("with_adds: slots is the split layout's (a warpgroup's accumulating "
                         "gemms read only its own boxes of the streamed slots)")
    if mode in (WARP, SLOTS) and w.split is not None:
        n_warp, add_to = _the_add(plan)
        if not boxed_split(1 if add_to else 0, add_to, bool(plan.packed), n_warp):
            raise ValueError(f"with_adds: {mode} adds one tensor in whole [block][32] boxes, "
                             "not packed sequences")
        stages = w.streamed[0].slots
        end = max(t.offset + t.bytes for t in w.tiles) + (
            schedule_rules.vector_bytes(len(w.vectors), stages, plan.block)
            if w.vector_offset is not None else 0)
        before, stage, limit = _split_room(end, stages, len(w.streamed), plan.block, n_warp,
                                           _smem_limit(plan))
        if mode == WARP and before + stage > limit:
            raise ValueError(f"with_adds: warp's staging ({stage} B) does not fit beside the "
                             f"split layout's tiles ({before} B within {limit} B): slots")
        refused = schedule_rules.split_slot_refusal(tuple(64 * t.boxes for t in w.streamed),
                                                    2 * n_warp)
        if mode == SLOTS and refused is not None:
            raise ValueError(f"with_adds: slots: {refused}")
    if mode == TENSOR and plan.deterministic is not None:
        raise ValueError("with_adds: the tensor reduce-add is not built with deterministic "
                         "adds (" + schedule_rules.DAG_WGMMA_ROWS_ORDERED_WHY + ")")
    n_warp, add_to = _the_add(plan)
    assert add_to is not None or mode == ATOMIC, "one add"
    if plan.gqa and w.split is not None and mode in (WARP, SLOTS):
        plan = _gqa_split_adds(plan)
        w = plan.wgmma
    wgmma = _place_adds(w, mode, "the plan option with_adds (the bench's and the tests' "
                        "variant)", plan.block, n_warp, add_to)
    return dataclasses.replace(plan, wgmma=wgmma, smem_bytes=wgmma.smem_bytes)


def _gqa_split_adds(plan: ld.LoopDagPlan) -> ld.LoopDagPlan:
    """GQA's split layout with the add warp's adds (dag_wgmma_rules.DAG_WGMMA_SPLIT_GQA_ADDS_WHY):
    the vectors loaded by the consumers, and in deterministic mode one body for every block."""
    plan = with_schedule(plan, stage_vectors=False)
    if plan.deterministic is not None and plan.wgmma.fast_body:
        plan = dataclasses.replace(plan, wgmma=dataclasses.replace(
            plan.wgmma, **_fast(False, schedule_rules.DAG_WGMMA_SPLIT_GQA_ADDS_WHY)))
    return plan


def _smem_limit(plan: ld.LoopDagPlan) -> int:
    """The target's shared memory (kgen/targets: the plan's arch)."""
    from .. import TARGETS

    return TARGETS[plan.arch].smem_limit


def _the_add(plan: ld.LoopDagPlan) -> tuple[int, str | None]:
    """(the loop-row gemm's columns per warpgroup, the tensor its one `+=` adds into), or
    (0, None) where the loop has not exactly one."""
    adds = [(g, s) for g in plan.gemms if g.kind is ld.GemmKind.LOOP_ROW
            for s in g.epilogue.statements if isinstance(s, ld.AddTile)]
    return (adds[0][0].n_warp, adds[0][1].param) if len(adds) == 1 else (0, None)


def _roles(consumers: int, producer: int, consumer: int, split: bool = False) -> pp.Choice:
    return pp.Choice(
        f"1 producer warpgroup + {consumers} consumer warpgroups "
        + ("sharing the 64 rows (split)" if split else "of 64 rows"),
        "warp specialization: one thread of the producer issues every copy-engine load "
        f"(setmaxnreg {producer}) while the consumers (setmaxnreg {consumer}) multiply and "
        "run the statements")


def _lpt(on: bool, why: str | None = None, ordered: bool = False) -> dict:
    """The CTAs' launch order: in sections of (batch, head) pairs sized to L2 where `on`, for
    the longest tiles first or (`ordered`) deterministic mode's adds; else the grid's."""
    return dict(lpt_l2_bytes=schedule_rules.DAG_WGMMA_LPT_L2_BYTES if on else None,
                lpt_why=(schedule_rules.DAG_WGMMA_ORDERED_SECTIONS_WHY if on and ordered else
                         schedule_rules.DAG_WGMMA_LPT_WHY if on else
                         why or "the grid's order"))


def _fast(on: bool, why: str | None = None) -> dict:
    return dict(fast_body=on,
                fast_body_why=schedule_rules.DAG_WGMMA_FAST_BODY_WHY if on else
                why or "one body for every block")


def _order(ordered: bool, descending: bool, why: str | None = None) -> dict:
    """Deterministic mode's order of the tiles of rows adding a block (dag_wgmma_rules:
    DAG_WGMMA_DESCENDING): decreasing where `descending`, else increasing."""
    if not ordered:
        return dict(descending=False, order_why="no deterministic adds")
    return dict(descending=descending, order_why=why or (
        schedule_rules.DAG_WGMMA_DESCENDING_WHY if descending else
        schedule_rules.DAG_WGMMA_ASCENDING_WHY))


# why a block mask keeps the grid's order
_NOT_LPT_LISTED_WHY = ("the grid's order: the longest-first order ranks the tiles of rows by a "
                       "linear mask's bounds; a block mask's lists are read at run time")
# why packed sequences keep the grid's order
_NOT_LPT_PACKED_WHY = ("the grid's order: the longest-first order ranks tiles by the loop's "
                       "length, which packed sequences read per batch from the offsets")


def with_schedule(plan: ld.LoopDagPlan, *, issue_ahead: bool | None = None,
                  wait_accumulating: bool | None = None,
                  stage_vectors: bool | None = None,
                  defer_accumulating: bool | None = None,
                  lpt: bool | None = None, fast_body: bool | None = None,
                  adds: str | None = None,
                  descending: bool | None = None,
                  defer_all: bool | None = None,
                  tail_tma: bool | None = None) -> ld.LoopDagPlan:
    """The plan with its wgmma groups scheduled otherwise (None: as the rulebook chose):
    `issue_ahead` the later score gemms issued with the first, `wait_accumulating` each
    accumulating gemm waited for at once, `defer_accumulating` an accumulating gemm before a
    loop-row gemm issued after it, `lpt` the longest tiles of rows first, `fast_body` a second
    body without bounds checks for the blocks inside the mask, `stage_vectors` the
    vectors read at `col` staged by the producer (else loaded by the consumers), `adds` the
    loop-row tile's adds done so (with_adds), `descending` deterministic mode's tiles of rows
    adding a block in decreasing order (else increasing; deterministic plans only),
    `defer_all` (the split layout's; False elsewhere is ignored) every accumulating gemm issued
    after the loop-row gemm, `tail_tma` False the kernel's epilogue's tiles stored per element
    from registers (where the rulebook stores them by the copy engine: loop_dag_tail): plan
    options for the bench and the tests."""
    w = plan.wgmma
    assert w is not None, "the sm_90a wgmma skeleton's plan"
    if plan.packed and lpt:
        raise ValueError("with_schedule: the sections' order is not built with packed "
                         "sequences")
    if defer_all and w.split is None:
        raise ValueError("with_schedule: defer_all is the split layout's (its accumulating "
                         "gemms' A staged)")
    changes = {k: v for k, v in (("issue_ahead", issue_ahead),
                                 ("wait_accumulating", wait_accumulating),
                                 ("defer_accumulating", defer_accumulating),
                                 ("defer_all", defer_all if w.split is not None else None))
               if v is not None}
    why = "the plan option with_schedule (the bench's and the tests' variant)"
    if any(getattr(w, k) != v for k, v in changes.items()):
        w = dataclasses.replace(w, **changes)
        w = dataclasses.replace(w, overlap=pp.Choice(_overlap_value(
            w.issue_ahead, w.wait_accumulating, w.defer_accumulating, w.defer_all), why))
    if lpt is not None:  # (the longest first only where the tiles of rows differ)
        ordered = plan.deterministic is not None
        w = dataclasses.replace(w, **_lpt(lpt and (ordered or plan.bounds.skips), None, ordered))
    if fast_body is not None:
        w = dataclasses.replace(w, **_fast(fast_body))
    if descending is not None:
        if descending and (plan.deterministic is None or not plan.bounds.skips):
            raise ValueError("with_schedule: the decreasing order is deterministic mode's, "
                             "where a mask's bounds skip blocks")
        w = dataclasses.replace(w, **_order(plan.deterministic is not None, descending, why))
    if tail_tma is not None and tail_tma != bool(w.tail_stores):
        if tail_tma:
            raise ValueError(f"with_schedule: the rulebook stores the epilogue's tiles from "
                             f"registers here ({w.tail_store.why})")
        stored = {name for name, _ in w.tail_stores}
        w = dataclasses.replace(w, tail_stores=(), maps=tuple(
            m for m in w.maps if m.param not in stored), tail_store=pp.Choice(
            "per element from registers", why))
    if stage_vectors is not None and stage_vectors != (w.vector_offset is not None) \
            and w.vectors:
        # the vectors' slots sit after the tiles, before the adds' staging and the mbarriers
        at = max(t.offset + t.bytes for t in w.tiles)
        regs = (schedule_rules.DAG_WGMMA_VECTOR_REGISTERS if stage_vectors else
                (loop_rules.PRODUCER_REGISTERS, loop_rules.CONSUMER_REGISTERS))
        w = dataclasses.replace(
            w, vector_offset=at if stage_vectors else None, producer_registers=regs[0],
            consumer_registers=regs[1], roles=_roles(w.consumers, *regs, w.split is not None))
        w = _place_adds(w, add_mode(w), w.adds.why, plan.block, *_the_add(plan))
    plan = dataclasses.replace(plan, wgmma=w, smem_bytes=w.smem_bytes,
                               vectors=w.vectors if w.vector_offset is not None else ())
    return plan if adds is None else with_adds(plan, adds)


def _overlap_value(ahead: bool, wait: bool, defer: bool, defer_all: bool = False) -> str:
    first = ("the score gemms issued together (the later ones in flight during the first's "
             "epilogue)" if ahead else "each score gemm issued at its statement")
    acc = ("an accumulating gemm waited for at once" if wait else
           "an accumulating gemm in flight until a later wait")
    last = ("" if not defer else
            "; every accumulating gemm issued after the loop-row gemm (their A staged: one "
            "consumer barrier a block; in flight while the loop-row tile is added)" if defer_all
            else
            "; the accumulating gemm before the loop-row gemm issued after it (in flight "
            "while the loop-row tile is added)")
    return f"{first}; {acc}{last}"
