"""A verified loop whose gemms form a DAG (more than the forward's score gemm and accumulating
gemm: the attention backward's five) to its plan (kgen/plan/loop_dag.py).

The gemms are taken in statement order (kgen/verify/loop_gemms.py classifies them): a score
gemm's MMAs, then its epilogue's values (one section of TILE values over [rows, block]); an
accumulating gemm's A handed on from registers (HandTile), then its MMAs; a loop-row gemm's A
staged in shared memory (StageTile), then its MMAs and its epilogue, a section of its own over
[block, N] that adds into `out accumulate` tensors (AddTile); the kernel's epilogue, a tail per
N of the accumulators (plan.loop_dag.DagTail: the backward's dK at D, dV at D_v where they
differ, grouped as the verifier checked them). The values reuse
kgen/lower/program.py's sections; the configuration is the rulebook's
(kgen/targets/loop_rules.py, the DAG section). Blocks a mask zeroes in full are skipped where
the bounds of kgen/lower/loop_bounds.py apply and zeroing the mask's value provably makes the
block add nothing (kgen/lower/loop_dag_zero.py). A block mask (`blocks by ...`, ir.BlockMask)
lists the blocks instead, at run time (`_listed`): per tile of rows the partial blocks, then the
full ones, where every mask `where(P, e, 0)` whose predicate reads only indices reads `e`. The
mma.sync skeleton's warp layout: kgen/lower/loop_dag_grid.py.
"""
from __future__ import annotations

from dataclasses import replace

from .. import ir
from ..errors import KgenError
from ..plan import epilogue as dag
from ..plan import loop_dag as ld
from ..plan import program as pp
from ..plan.program import Rank
from ..targets import Instruction, dag_mma_rules, dag_wgmma_rules, loop_rules, target
from . import loop_bounds, loop_dag_grid, loop_dag_storage, loop_dag_zero
from . import packed as packed_program
from ..verify.loop_gemms import after_loop_groups  # the kernel's epilogue by N (one home)
from .program import _block_params, _params, _roles, _Section, _store, smem_tile


class _DagSection(_Section):
    """A section whose `acc` is the current gemm's own result (several gemms have one)."""

    def value(self, node: ir.Expr) -> int:
        if isinstance(node, ir.Acc):
            assert self.acc is not None, "unverified IR: acc outside a gemm's epilogue"
            return self.add(ld.GemmResult(self.acc), Rank.TILE)
        return super().value(node)


def _kind(kernel: ir.Kernel, g: ir.Gemm) -> ld.GemmKind:
    if g.accumulate:
        return ld.GemmKind.ACCUMULATING
    if kernel.param(g.a.name) is None:
        return ld.GemmKind.LOOP_ROW
    return ld.GemmKind.SCORE


def _row_major(kernel: ir.Kernel, operand: ir.OperandRef) -> ir.Param:
    p = kernel.param(operand.name)
    if p.layout is not ir.Layout.ROW:
        raise KgenError(operand.loc, f"'{p.name}': the DAG loop's skeleton reads row-major "
                        "tensors (not yet column-major)")
    return p


def run(kernel: ir.Kernel, arch: ir.Arch) -> ld.LoopDagPlan:
    loop = kernel.loop
    if loop.carries:
        raise KgenError(loop.carries[0].loc, f"loop '{loop.name}': a loop of more gemms than "
                        "the forward's carries no row state yet (its skeleton keeps "
                        "accumulators only)")
    kinds = [_kind(kernel, g) for g in loop.gemms]
    g0 = loop.gemms[0]
    lead = _row_major(kernel, g0.a)
    dtype = lead.dtype
    rows_dim = lead.shape[0]
    resident: list[str] = []  # loop-invariant params, in first use
    streamed: list[str] = []
    loop_row_n: list[int] = []
    acc_n: dict[str, int] = {}  # accumulator -> its N (the attention backward's dK D, dV D_v)
    for g, kind in zip(loop.gemms, kinds):
        if kind is ld.GemmKind.SCORE:
            a, b = _row_major(kernel, g.a), _row_major(kernel, g.b)
            if not g.b.transposed:
                raise KgenError(g.b.loc, f"gemm '{g.name}': the DAG loop's skeleton streams a "
                                f"score gemm's B as a [{loop.dim}, K0] row-major tensor, "
                                f"written transposed ('{b.name}^T')")
            resident += [a.name] if a.name not in resident else []
            streamed += [b.name] if b.name not in streamed else []
        elif kind is ld.GemmKind.ACCUMULATING:
            b = _row_major(kernel, g.b)
            if g.b.transposed:
                raise KgenError(g.b.loc, f"gemm '{g.name}': the DAG loop's skeleton streams an "
                                f"accumulating gemm's B as [{loop.dim}, N] row-major, not "
                                "transposed")
            streamed += [b.name] if b.name not in streamed else []
            acc_n[g.name] = int(b.shape[1])  # (verified: the kernel's epilogue reads one N at once)
        else:
            b = _row_major(kernel, g.b)
            resident += [b.name] if b.name not in resident else []
            loop_row_n.append(int(b.shape[1]))
    if not acc_n:
        raise KgenError(loop.loc, f"loop '{loop.name}': a DAG loop needs an accumulating gemm "
                        "(its kernel epilogue stores the accumulators)")
    for name in resident + streamed:
        if kernel.param(name).dtype is not dtype:
            raise KgenError(loop.loc, f"'{name}': the loop's operands share one dtype")
    vectors = _col_vectors(kernel, [g for g, k in zip(loop.gemms, kinds)
                                    if k is ld.GemmKind.SCORE])
    staged_count = sum(k is ld.GemmKind.LOOP_ROW for k in kinds)
    scores = [i for i, k in enumerate(kinds) if k is ld.GemmKind.SCORE]
    # the values handed on to accumulating gemms that no loop-row gemm stages (staged too
    # where the wgmma skeleton splits the accumulators: dag_wgmma_rules.DAG_WGMMA_SPLIT)
    handed = {g.a.name for g, k in zip(loop.gemms, kinds) if k is ld.GemmKind.ACCUMULATING} - {
        g.a.name for g, k in zip(loop.gemms, kinds) if k is ld.GemmKind.LOOP_ROW}
    shape = loop_rules.DagShape(
        resident_cols=tuple(int(kernel.param(n).shape[1]) for n in resident),
        streamed_cols=tuple(int(kernel.param(n).shape[1]) for n in streamed),
        staged=staged_count, accumulators=len(acc_n), n_acc=max(acc_n.values()),
        live_scores=min(len(scores), 2), loop_row_n=tuple(loop_row_n), vectors=len(vectors),
        handed=len(handed),
        acc_ns=tuple(acc_n.values()) if len(set(acc_n.values())) > 1 else (),
        listed=loop.blocks is not None)
    tgt = target(arch)
    # a block mask's blocks are the tile (verify: a written tile says the same sizes)
    tile_line = loop.tile or (loop.blocks if loop.blocks and loop.blocks.m is not None else None)
    written = (tile_line.m if tile_line else None, tile_line.n if tile_line else None,
               loop.stages.count if loop.stages else None,
               loop.warps.m if loop.warps else None)
    # sm_90a's wgmma skeleton where the rulebook allows it (its one configuration), else
    # mma.sync's first legal configuration
    wgmma_refused = loop_rules.dag_wgmma_refusal(shape, dtype, tgt, written)
    split = dag_wgmma_rules.dag_wgmma_split(shape, loop_rules.DAG_WGMMA_N)
    wgmma_split = split and wgmma_refused is None
    if wgmma_split:
        config = dag_wgmma_rules.dag_wgmma_split_config()
        why = ("the rulebook's split configuration of the DAG loop's wgmma skeleton "
               "(kgen/targets/dag_wgmma_rules.py, DAG_WGMMA_SPLIT_TILE)")
    elif wgmma_refused is None:
        config = loop_rules.DAG_WGMMA_CONFIG
        why = ("the rulebook's configuration of the DAG loop's wgmma skeleton "
               "(kgen/targets/loop_rules.py, DAG_WGMMA_CONFIG)")
    else:
        try:
            config, why = loop_rules.dag_default(shape, dtype, tgt, *written)
        except ValueError as err:
            wgmma_why = (f"; the wgmma skeleton: {wgmma_refused}"
                         if tgt.has(Instruction.WGMMA) else "")
            raise KgenError(loop.loc, f"loop '{loop.name}': {err}{wgmma_why}") from None
    if any(w is not None for w in written):
        why = "the source's lines, " + ("completed by " + why if None in written else "legal")

    # the mma.sync skeleton's warp layout: the warp grid (its handed values staged) or rows
    grid, layout_why = (None, "the wgmma skeleton's own") if wgmma_refused is None else (
        loop_dag_grid.choose(kernel, config, shape, dtype, tuple(acc_n.values()),
                             tuple(loop_row_n), tgt))

    # Shared memory: resident tiles, then the ring, then the staged values, end to end (the
    # wgmma skeleton lays out its own; the mma.sync skeleton's are placed by the storage
    # planner below, kgen/lower/loop_dag_storage.py)
    tiles: dict[str, pp.SmemTile] = {}
    offset = 0
    for name in resident:
        tile = smem_tile(f"{name.lower()}_res", name, config.tile_m,
                         int(kernel.param(name).shape[1]), 1, dtype, offset, False)
        tiles[name] = tile
        offset += tile.bytes
    ring: dict[str, pp.SmemTile] = {}
    for name in streamed:
        tile = smem_tile(f"{name.lower()}_ring", name, config.block,
                         int(kernel.param(name).shape[1]), config.stages, dtype, offset, True)
        ring[name] = tile
        offset += tile.bytes
    staged: list[pp.SmemTile] = []
    for g, kind in zip(loop.gemms, kinds):
        if kind is ld.GemmKind.LOOP_ROW:
            tile = smem_tile(f"t{len(staged)}_smem", g.a.name, config.tile_m, config.block, 1,
                             dtype, offset, False)
            staged.append(tile)
            offset += tile.bytes
    offset += 4 * len(vectors) * config.stages * config.block  # the staged vectors' slots
    assert offset == loop_rules.dag_smem_bytes(config, shape, dtype)

    # the columns a warpgroup computes: split, each its share of a score tile's block and of N
    halves = dag_wgmma_rules.DAG_WGMMA_SPLIT_CONSUMERS if wgmma_split else 1
    body = _DagSection(kernel)
    gemms: list[ld.DagGemm] = []
    handed: set[int] = set()
    stage_of: dict[str, pp.SmemTile] = {}  # loop-row gemm -> its staged tile
    a_tile: dict[int, str] = {}  # the warp grid: a value handed on -> the tile it is staged in
    handed_tiles: list[pp.SmemTile] = []  # the warp grid's: values no loop-row gemm stages
    for index, (g, kind) in enumerate(zip(loop.gemms, kinds)):
        if kind is ld.GemmKind.SCORE:
            a, b = kernel.param(g.a.name), kernel.param(g.b.name)
            n_warp, m_tiles = (loop_dag_grid.share(grid, kind, config, config.block)
                               if grid else (config.block // halves, 1))
            gemm = ld.DagGemm(index, g.name, kind, tiles[a.name].name, ld.ALoad.SMEM, None,
                              ring[b.name].name, pp.FragmentLoad.N_MAJOR, k=int(a.shape[1]),
                              n=config.block, n_warp=n_warp, m_tiles=m_tiles)
            gemms.append(gemm)
            body.statement(ld.DagStep(gemm))
            body.acc = g.name
            for stmt in g.epilogue.stmts:
                _score_statement(body, kernel, g, stmt)
            body.acc = None
        elif kind is ld.GemmKind.ACCUMULATING:
            value = _tile_value(body, g)
            if grid is None and value not in handed:
                body.statement(ld.HandTile(value, dtype))
                handed.add(value)
            # a value a later loop-row gemm reads is staged now (from the fragments just handed
            # on: its f32 tile need not live through this gemm's MMAs); the warp grid stages
            # every value handed on, a tile of its own where no loop-row gemm reads it
            for later, later_kind in zip(loop.gemms[index + 1:], kinds[index + 1:]):
                if (later_kind is ld.GemmKind.LOOP_ROW and body.env.get(later.a.name) == value
                        and later.name not in stage_of and (grid is None or value not in a_tile)):
                    stage_of[later.name] = staged[len(stage_of)]
                    body.statement(ld.StageTile(value, dtype, stage_of[later.name].name))
                    a_tile[value] = stage_of[later.name].name
            if grid is not None and value not in a_tile:
                handed_tiles.append(smem_tile(f"h{len(handed_tiles)}_smem", g.a.name,
                                              config.tile_m, config.block, 1, dtype, 0, False))
                body.statement(ld.StageTile(value, dtype, handed_tiles[-1].name))
                a_tile[value] = handed_tiles[-1].name
            b, n = kernel.param(g.b.name), acc_n[g.name]
            n_warp, m_tiles = (loop_dag_grid.share(grid, kind, config, n) if grid
                               else (n // halves, 1))
            gemm = ld.DagGemm(index, g.name, kind, a_tile[value] if grid else "",
                              ld.ALoad.SMEM if grid else ld.ALoad.REGISTERS, value,
                              ring[b.name].name, pp.FragmentLoad.K_MAJOR, k=config.block,
                              n=n, n_warp=n_warp, m_tiles=m_tiles)
            gemms.append(gemm)
            body.statement(ld.DagStep(gemm))
        else:
            value = _tile_value(body, g)
            if g.name not in stage_of:
                stage_of[g.name] = staged[len(stage_of)]
                body.statement(ld.StageTile(value, dtype, stage_of[g.name].name))
            tile = stage_of[g.name]
            b = kernel.param(g.b.name)
            n = int(b.shape[1])
            _, n_warp = loop_rules.dag_loop_row_split(config, n)
            if wgmma_split:
                n_warp = n // halves
            n_warp, m_tiles = (loop_dag_grid.share(grid, kind, config, n) if grid
                               else (n_warp, 1))
            gemm = ld.DagGemm(index, g.name, kind, tile.name, ld.ALoad.SMEM_TRANSPOSED, None,
                              tiles[b.name].name, pp.FragmentLoad.K_MAJOR, k=config.tile_m, n=n,
                              n_warp=n_warp, epilogue=_loop_row_epilogue(kernel, g, n),
                              m_tiles=m_tiles)
            gemms.append(gemm)
            body.statement(ld.DagStep(gemm))
    body_section = body.section()
    staged += handed_tiles  # placed by the storage planner below

    accumulators = tuple(g.name for g, k in zip(loop.gemms, kinds)
                         if k is ld.GemmKind.ACCUMULATING)
    # the kernel's epilogue, a tail per N of the accumulators (verified: each statement reads
    # accumulators of one N)
    tails: list[ld.DagTail] = []
    columns = {p.name: p.shape[1] for p in kernel.params if p.kind is ir.ParamKind.TENSOR}
    for n, stmts in after_loop_groups(kernel.epilogue.stmts if kernel.epilogue else (), acc_n,
                                      columns):
        tail = _Section(kernel)
        mine = tuple(name for name in accumulators if acc_n[name] == n)
        for name in mine:
            tail.env[name] = tail.add(pp.AccumulatorValue(name), Rank.TILE)
        for stmt in stmts:
            if isinstance(stmt, ir.Let):
                tail.env[stmt.name] = tail.value(stmt.value)
            elif isinstance(stmt, ir.Store) and not stmt.accumulate:
                _store(tail, kernel, stmt, rows_dim, n)
            else:
                raise KgenError(stmt.loc, "the kernel's epilogue runs after the loop: it "
                                "stores the accumulators")
        tails.append(ld.DagTail(n, mine, tail.section()))

    if wgmma_split and any(isinstance(v.kind, pp.RowReduction) for section in (
            body_section, *(t.section for t in tails), *(g.epilogue for g in gemms
                                                          if g.epilogue))
            for v in section.values):
        raise KgenError(loop.loc, f"loop '{loop.name}': "
                        + dag_wgmma_rules.DAG_WGMMA_SPLIT_REDUCE_WHY)
    storage_plan, fenced = None, ()
    if wgmma_refused is not None:  # the mma.sync skeleton: the storage planner's offsets
        storage_plan, fenced = loop_dag_storage.plan(
            tuple(tiles.values()), tuple(ring.values()), tuple(staged), vectors, tuple(gemms),
            body_section, config.stages, config.block, tgt)
        at = {b.name: b.offset for b in storage_plan.buffers}
        tiles = {k: replace(t, offset=at[t.name]) for k, t in tiles.items()}
        ring = {k: replace(t, offset=at[t.name]) for k, t in ring.items()}
        staged = [replace(t, offset=at[t.name]) for t in staged]
        offset = storage_plan.total_bytes
    # the query heads: the streamed operands' (a GQA backward's rows, K, have the KV heads)
    query_heads = kernel.param(g0.b.name).heads
    params, fields = _params(kernel, query_heads)
    # packed sequences (the varlen backward): a CTA's rows and its loop lie in one sequence
    params, fields, packed = packed_program.run(kernel, rows_dim, loop.dim, params, fields)
    gqa = any(p.kv for p in params)
    if loop.blocks is not None:
        _check_listed(kernel, loop, body_section)
        params, fields = _block_params(kernel, lead, params, fields)
    zeroed_stores: frozenset[str] = frozenset()
    if wgmma_refused is None:  # the skeleton writes zeros on the blocks it skips
        from ..targets.sm90.loop_dag_schedule import staged_store

        zeroed_stores = staged_store(body_section, params, dtype, gqa, wgmma_split)
    bounds = (_listed(body_section, loop.blocks, config.tile_m, config.block)
              if loop.blocks is not None else
              _bounds(body_section, gemms, zeroed_stores, _equalities_refused(kernel, gqa)))
    if gqa:
        for t in tails:
            _check_gqa(kernel, body_section, t.section)
    deterministic = _deterministic(kernel, loop, bounds, gemms)
    if deterministic is not None:
        fields += (pp.ProgramField(ld.ORDER_FIELD, "ptr"),)
    wgmma = None
    if wgmma_refused is None:
        from ..targets.sm90.loop_dag_schedule import dag_wgmma

        adds = [s.param for g in gemms if g.epilogue is not None
                for s in g.epilogue.statements if isinstance(s, ld.AddTile)]
        wgmma = dag_wgmma(tuple(tiles.values()), tuple(ring.values()), tuple(staged), dtype,
                          frozenset(p.name for p in params if p.kv), shape, len(adds), vectors,
                          bounds.skips, gqa=gqa, ordered=deterministic is not None,
                          add_to=adds[0] if len(adds) == 1 else None, body=body_section,
                          gemms=tuple(gemms), params=params, smem_limit=tgt.smem_limit,
                          packed=bool(packed), linear=bool(bounds.bounds),
                          listed=bounds.listed is not None,
                          tail_stores=tuple((s.param, t.n) for t in tails
                                            for s in t.section.statements
                                            if isinstance(s, pp.StoreTile)))
        mma = pp.Choice(wgmma.mma.value, "sm_90a's warp-specialized wgmma skeleton of a DAG "
                        "loop (FlashAttention-3's backward structure): the rulebook allows it "
                        "(kgen/targets/loop_rules.py, dag_wgmma_refusal)")
    else:
        mma = pp.Choice("mma.sync.m16n8k16", _mma_why(arch, wgmma_refused))
    batch, heads, kv = _roles(kernel, query_heads)
    zeroed = tuple(p.name for p in kernel.params if p.accumulate)
    regs = loop_rules.dag_registers(config, shape)
    return ld.LoopDagPlan(
        name=kernel.name, arch=arch, params=params, fields=fields, dtype=dtype,
        rows_dim=rows_dim, loop_dim=loop.dim, tile_m=config.tile_m, block=config.block,
        warps=config.warps, stages=config.stages, resident=tuple(tiles.values()),
        streamed=tuple(ring.values()), staged=tuple(staged), gemms=tuple(gemms),
        accumulators=accumulators, body=body_section, tails=tuple(tails),
        zeroed=zeroed, smem_bytes=wgmma.smem_bytes if wgmma else offset, mma=mma,
        config=pp.Choice(f"tile {config.tile_m}x{config.block} warps {config.warps} stages "
                         f"{config.stages}", why),
        registers=(pp.Choice(str(dag_wgmma_rules.dag_wgmma_split_registers(shape) if wgmma_split
                                 else loop_rules.dag_wgmma_registers(shape)),
                             "the rulebook's estimate per consumer thread (setmaxnreg "
                             f"{loop_rules.CONSUMER_REGISTERS}): {len(accumulators)} "
                             f"accumulator(s) of {shape.widths_text} held in registers"
                             + (", each warpgroup half of N" if wgmma_split else "")) if wgmma else
                   pp.Choice(str(regs), f"the rulebook's estimate per thread (at most "
                             f"{loop_rules.dag_register_budget(tgt)}): {len(accumulators)} "
                             f"accumulator(s) of {shape.widths_text} held in registers")),
        heads_param=heads, kv_param=kv, batch_param=batch, bounds=bounds,
        min_ctas=(pp.Choice("1", "the wgmma skeleton: 3 warpgroups and most of shared "
                            "memory, one CTA per SM") if wgmma else
                  pp.Choice(*map(str, dag_mma_rules.dag_min_ctas(regs, config.warps)))),
        vectors=(() if wgmma.vector_offset is None else vectors) if wgmma else vectors,
        vectors_why=(dag_wgmma_rules.DAG_WGMMA_STAGE_VECTORS_WHY
                     if wgmma and wgmma.vector_offset is not None and vectors else
                     _WGMMA_VECTORS_WHY if wgmma and vectors else _VECTORS_WHY if vectors
                     else "no f32 vector is read at col"),
        wgmma=wgmma, deterministic=deterministic, storage=storage_plan,
        fenced=fenced, packed=packed, grid=grid,
        layout=pp.Choice("warp grid" if grid else "warp rows", layout_why),
        **_spellings([body_section] + [g.epilogue for g in gemms if g.epilogue is not None],
                     wgmma))


def _spellings(sections: list[pp.Section], wgmma) -> dict[str, pp.Choice]:
    """The loop's tanh and its divisions by a row or uniform value, as the forward loop's rules
    spell them (kgen/targets/loop_rules.py loop_tanh, kgen/targets/dag_wgmma_rules.py dag_division)."""
    values = [(s, v) for s in sections for v in s.values]
    return dict(
        tanh=pp.Choice(*loop_rules.loop_tanh(any(
            isinstance(v.kind, dag.Apply) and v.kind.op is ir.Op.TANH for _, v in values))),
        division=pp.Choice(*dag_wgmma_rules.dag_division(any(
            loop_rules.shared_divisor(s, v) for s, v in values), wgmma is not None)))


def _check_gqa(kernel: ir.Kernel, body: pp.Section, tail: pp.Section) -> None:
    """GQA: the kernel's epilogue runs once per KV head, after the loop walked the group's
    query heads: it reads nothing of one query head (a query-headed parameter, `head`)."""
    at = kernel.epilogue.loc if kernel.epilogue is not None else kernel.loc
    for value in tail.values:
        kind = value.kind
        name = getattr(kind, "param", None)
        p = kernel.param(name) if isinstance(name, str) else None
        query_headed = (p is not None and p.heads is not None
                        and p.heads == kernel.param(kernel.loop.gemms[0].b.name).heads)
        head = (isinstance(kind, pp.PositionValue) and kind.axis is ir.Axis.HEAD) or (
            isinstance(kind, dag.VectorLoad) and kind.axis is ir.Axis.HEAD)
        if query_headed or head:
            what = f"'{p.name}', which has the query heads" if query_headed else "head"
            raise KgenError(at, f"the kernel's epilogue runs once per KV head (GQA: the loop "
                            f"walks every query head of the group), so it cannot read {what}")


def _deterministic(kernel: ir.Kernel, loop: ir.Loop, bounds: pp.LoopBounds,
                   gemms: list[ld.DagGemm]) -> pp.Choice | None:
    """`reductions deterministic`: the adds' order, or None. The CTA of tile j of the rows waits
    for the CTA of the tile next in the order (j - 1; on sm_90a where a mask skips blocks, j + 1:
    DagWgmma.descending) where that one visits the block (its bounds, computed as the loop's):
    the tiles visiting a block must then be one run of tiles, as they are when every bound on
    col moves the same way with the row."""
    if not kernel.deterministic:
        return None
    adds = [s for g in gemms if g.epilogue is not None for s in g.epilogue.statements
            if isinstance(s, ld.AddTile)]
    if len(adds) != 1:
        raise KgenError(kernel.loc, f"kernel '{kernel.name}': 'reductions deterministic' orders "
                        "one '+=' store of a loop-row tile (this loop has "
                        f"{len(adds)}); not yet more")
    slopes = {b.slope for b in bounds.bounds if b.slope != 0}
    if len(slopes) > 1:
        raise KgenError(loop.loc, f"loop '{loop.name}': 'reductions deterministic' orders the "
                        "tiles of rows visiting a block one after the other, which needs the "
                        "mask's bounds on col to move the same way with the row (here they do "
                        "not)")
    name = ld.ORDER_FIELD
    if kernel.param(name) is not None:
        raise KgenError(kernel.param(name).loc, f"the parameter name '{name}' collides with "
                        "the member deterministic mode adds to the params struct; rename it")
    skipped = ("; where the mask skips blocks, the tile before's bounds say whether it adds "
               "there" if bounds.bounds else "")
    return pp.Choice(
        f"semaphores: int32 per (batch, query head, block of {loop.dim}, adding warp)",
        f"'{adds[0].param}''s adds in the order of the tiles of rows (the skeleton's: "
        "increasing, or decreasing where the sm_90a rulebook says so): a warp adds its share of "
        "a block once the same warp of the tile before in that order released it, then "
        f"releases it to the tile after{skipped} (bit-identical run to run)")


_WGMMA_VECTORS_WHY = ("the wgmma skeleton loads each into registers while the score gemm whose "
                      "epilogue reads it runs (kgen/targets/sm90/loop_dag.py)")
_VECTORS_WHY = ("staged per block by cp.async with the streamed tiles: a thread reads block / 4 "
                "of each per score tile, which from global memory were loads in the epilogue's "
                "path (L1 hits at best), each behind a bounds check")


def _col_vectors(kernel: ir.Kernel, scores: list[ir.Gemm]) -> tuple[str, ...]:
    """The f32 vectors the score gemms' epilogues read at `col` (the loop's positions), in
    first use."""
    found: list[str] = []

    def visit(node) -> None:
        if (isinstance(node, ir.VectorLoad) and node.axis is ir.Axis.COL
                and kernel.param(node.name).dtype is ir.DType.F32 and node.name not in found):
            found.append(node.name)
        for child in getattr(node, "args", None) or (
                (node.arg,) if isinstance(node, (ir.Cast, ir.Reduce)) else ()):
            visit(child)

    for g in scores:
        for stmt in g.epilogue.stmts:
            visit(stmt.value)
    return tuple(found)


def _mma_why(arch: ir.Arch, wgmma_refused: str) -> str:
    if arch is ir.Arch.SM90A:
        return ("sm_90a runs the DAG loop's mma.sync skeleton (FlashAttention-2's structure): "
                f"the wgmma skeleton does not take this loop: {wgmma_refused}")
    return f"{arch.value} has mma.sync (m16n8k16, f32 accumulate)"


def _score_statement(body: _DagSection, kernel: ir.Kernel, g: ir.Gemm, stmt: ir.Stmt) -> None:
    if isinstance(stmt, ir.Let):
        body.env[stmt.name] = body.value(stmt.value)
        return
    if isinstance(stmt, ir.Store) and stmt.target == g.name and kernel.param(g.name) is None:
        body.env[g.name] = body.value(stmt.value)  # the gemm's own value, read by name
        return
    p = kernel.param(stmt.target) if isinstance(stmt, ir.Store) else None
    if p is not None and p.kind is ir.ParamKind.TENSOR and not stmt.accumulate:
        # `dBiasT = dst`: the tile stored at its (row, col), block by block (verified: a
        # row-major output [rows, loop dim])
        body.statement(pp.StoreTile(p.name, body.value(stmt.value), p.dtype))
        return
    raise KgenError(stmt.loc, f"gemm '{g.name}': a score gemm's epilogue in a loop of more "
                    "gemms than the forward's binds tile values and stores tile outputs only "
                    "(no carries)")


def _tile_value(body: _DagSection, g: ir.Gemm) -> int:
    assert g.a.name in body.env, f"unverified IR: {g.a.name} read before it is bound"
    value = body.env[g.a.name]
    if body.rank(value) is not Rank.TILE:
        raise KgenError(g.a.loc, f"gemm '{g.name}': its A, '{g.a.name}', must be a value per "
                        "element of the tile")
    return value


def _loop_row_epilogue(kernel: ir.Kernel, g: ir.Gemm, n: int) -> pp.Section:
    """The loop-row gemm's epilogue over its [block, N] tile: `row` the loop position."""
    section = _DagSection(kernel, acc=g.name)
    for stmt in g.epilogue.stmts:
        if isinstance(stmt, ir.Let):
            section.env[stmt.name] = section.value(stmt.value)
            continue
        assert isinstance(stmt, ir.Store) and stmt.accumulate, "unverified IR: a loop-row store"
        p = kernel.param(stmt.target)
        if p.dtype is not ir.DType.F32 or p.layout is not ir.Layout.ROW:
            raise KgenError(stmt.loc, f"'{p.name}': the skeleton adds into a row-major f32 "
                            "tensor (atomic adds of f32)")
        if int(p.shape[1]) != n:
            raise KgenError(stmt.loc, f"'{p.name}' must have {n} columns: gemm '{g.name}''s "
                            "tile")
        index = section.value(stmt.value)
        section.statement(ld.AddTile(p.name, index))
    return section.section()


# ---------------------------------------------------------------------------------------------
# The skipped blocks: a mask `where(P, e, 0)` whose zero makes a block add nothing


def _bounds(body: pp.Section, gemms: list[ld.DagGemm],
            zeroed_stores: frozenset[str] = frozenset(),
            no_equalities: str | None = None) -> pp.LoopBounds:
    """The blocks the loop skips; a tile output's store allows none unless the skeleton
    writes its zeros on the skipped blocks (`zeroed_stores`: outputs whose stored value is a
    staged one, so 0 there as loop_dag_zero.zero_on_masked proves). An equality of a row and a
    column vector (`kd[row] == qd[col]`, a document mask) is a bound as in the forward
    (pp.EqualBound, scanned per tile of rows by templates/common/loop_bounds.inc.j2), unless
    `no_equalities` says why not (_equalities_refused): then a predicate not linear."""
    values = body.values
    masks = [v for v in values if isinstance(v.kind, dag.Apply) and v.kind.op is ir.Op.WHERE
             and isinstance(values[v.kind.args[2]].kind, dag.Constant)
             and values[v.kind.args[2]].kind.value == 0.0 and v.rank is Rank.TILE]
    bounds: list[pp.ColumnBound | pp.EqualBound] = []
    fold: list[int] = []  # the predicates that read 1 in a block inside the mask
    refused: list[str] = []
    for mask in masks:
        found = loop_bounds._conjunction(values, mask.kind.args[0], equalities=True)
        text = loop_bounds._text(values, mask.id)
        equal = not isinstance(found, str) and any(isinstance(b, pp.EqualBound)
                                                   for b in found[0])
        if equal and no_equalities is not None:  # derived again: the equality not a bound
            refused.append(f"`{text}`'s equality: {no_equalities}")
            found = loop_bounds._conjunction(values, mask.kind.args[0])
            if isinstance(found, str):
                continue
        if isinstance(found, str):
            refused.append(f"`{text}`: {found}")
            continue
        problem = loop_dag_zero.zero_on_masked(body, gemms, mask.id)
        if problem is not None:
            refused.append(f"`{text}`: on a block it zeroes in full, {problem}")
            continue
        bounds += [b for b in found[0] if b not in bounds]
        fold += [i for i in found[1] if i not in fold]
    stores = [s.param for s in body.statements if isinstance(s, pp.StoreTile)
              and s.param not in zeroed_stores]
    zeroed = [s.param for s in body.statements if isinstance(s, pp.StoreTile)
              and s.param in zeroed_stores]
    if bounds and stores:  # a skipped block would leave its elements of the output unwritten
        refused.append(f"the loop stores '{stores[0]}' at every element of every block")
        bounds, fold = [], []
    if not bounds:
        return pp.LoopBounds((), (), "every block runs: " + ("; ".join(refused) or
                                                            "no value where(P, e, 0) masks "
                                                            "the tile"))
    linear, equal = loop_bounds.split(bounds)
    why = (f"blocks whose every element the mask zeroes are skipped "
           f"({loop_bounds.bound_parts(linear, equal)}): "
           "they add nothing; inside the mask its predicate is known true")
    if zeroed:
        why += (f"; '{zeroed[0]}' (the staged value, 0 there) written as zeros on the skipped "
                "blocks")
    if refused:
        why += "; not used: " + "; ".join(refused)
    return pp.LoopBounds(linear, tuple(fold), why, equal)


def _check_listed(kernel: ir.Kernel, loop: ir.Loop, body: pp.Section) -> None:
    """What a DAG loop does not take beside a block mask, each refused at the line."""
    at = loop.blocks.loc
    if kernel.deterministic:
        raise KgenError(at, "a block mask and 'reductions deterministic' together are not "
                        "supported: deterministic adds chain the tiles of rows visiting a block "
                        "one after the other, and the lists leave any tiles out; drop one")
    stores = [s.param for s in body.statements if isinstance(s, pp.StoreTile)]
    if stores:
        raise KgenError(at, f"a block mask in a DAG loop takes no tile store ('{stores[0]}'): "
                        "the blocks the lists leave out are not visited, so their elements "
                        "would be left unwritten")


def _listed(body: pp.Section, blocks: ir.BlockMask, tile_m: int, block: int) -> pp.LoopBounds:
    """The bounds of a DAG loop with a block mask: the blocks listed at run time, every mask
    of the body (`mask_values`) reading its kept value on a full block; no bound derived."""
    values = body.values
    masks = mask_values(body) if blocks.full_counts is not None else ()
    why = (f"the block mask lists the blocks each tile of rows visits ({tile_m}x{block}): "
           f"{blocks.counts} partial blocks per tile from {blocks.indices}, the body as written")
    if blocks.full_counts is not None:
        why += (f", then {blocks.full_counts} full blocks from {blocks.full_indices}, "
                + ("where " + ", ".join(f"`{loop_bounds._text(values, m)}`" for m in masks)
                   + " read" + ("s" if len(masks) == 1 else "") + " the value kept"
                   if masks else "alike (the body has no mask where(P, e, 0) of indices)"))
    why += "; a block listed in neither is not visited (it adds nothing)"
    return pp.LoopBounds((), (), why, listed=pp.BlockList(
        blocks.counts, blocks.indices, blocks.full_counts, blocks.full_indices, masks))


def mask_values(body: pp.Section) -> tuple[int, ...]:
    """A DAG loop's masks, as a block mask's full block skips them: the tile values
    `where(P, e, 0)` whose predicate P reads only indices (positions, sizes, scalars, vectors,
    constants; not acc, a tensor or a random value: a dropout's `where(kept, ..., 0)` is no
    mask). kgen/reference_tiles.py reads the same rule."""
    values = body.values

    def indices_only(index: int) -> bool:
        kind = values[index].kind
        if isinstance(kind, (dag.Constant, dag.ScalarArg, dag.VectorLoad, pp.PositionValue,
                             pp.ExtentValue)):
            return True
        if isinstance(kind, dag.Cast):
            return indices_only(kind.arg)
        return isinstance(kind, dag.Apply) and all(indices_only(a) for a in kind.args)

    return tuple(v.id for v in values
                 if v.rank is Rank.TILE and isinstance(v.kind, dag.Apply)
                 and v.kind.op is ir.Op.WHERE
                 and isinstance(values[v.kind.args[2]].kind, dag.Constant)
                 and values[v.kind.args[2]].kind.value == 0.0
                 and indices_only(v.kind.args[0]))


# why deterministic mode takes no equality as a bound
DETERMINISTIC_EQUALITY_WHY = (
    "deterministic adds chain the tiles of rows visiting a block, each waiting for the one "
    "before, which needs those tiles to be one run; the blocks an equality leaves follow the "
    "ids (unsorted or repeating documents: a block visited by tiles 0 and 2, not 1), so its "
    "blocks are all visited there")


# why GQA takes no equality as a bound
GQA_EQUALITY_WHY = (
    "GQA: a CTA's blocks are one range for every query head of its group, the ids of "
    "kgen.attention's backward have the query heads, and with the KV heads' ids the sm_90a "
    "build spilled (4 B, NVRTC 13.5): not yet")


def _equalities_refused(kernel: ir.Kernel, gqa: bool) -> str | None:
    """Why no equality (pp.EqualBound) is a bound of this loop, or None (they are):
    DETERMINISTIC_EQUALITY_WHY, GQA_EQUALITY_WHY."""
    if kernel.deterministic:
        return DETERMINISTIC_EQUALITY_WHY
    return GQA_EQUALITY_WHY if gqa else None
