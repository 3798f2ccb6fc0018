"""The sm_90a skeleton of a loop kernel as a plan value (plan.program.WgmmaLoop): warp roles,
registers, the shared tiles the copy engine fills, the mbarriers, the tensor maps and the MMAs,
each with why. The rulebook (kgen/targets/loop_rules.py, wgmma_default) has already allowed the
configuration; this only lays it out. The emitter (kgen/targets/sm90/loop.py) reads it."""
from __future__ import annotations

import dataclasses

from ...enums import DType, Layout
from ...plan import program as pp
from .. import loop_rules
from ..loop_rules import BOX_COLS, LoopConfig


def wgmma_loop(config: LoopConfig, a, b, c, k0: int, n1: int, dtype: DType,
               query_heads, bounds: pp.LoopBounds, tile_reads: tuple = (),
               packed: bool = False, tgt=None, stores: tuple = (),
               ones: bool = False) -> pp.WgmmaLoop:
    """`a`, `b`, `c`: the ir.Params of Q (rows x K0), K ([loop, K0]) and V ([loop, N1]);
    `bounds`: the blocks each tile of rows visits (plan.bounds); `tile_reads`: the ir.Params
    the body reads at (row, col), in order (the first may be staged: `staging`); `packed`:
    the program has packed sequences; `tgt`: the target (its shared memory); `stores`: the
    epilogue's tile stores (pp.StoreTile), O's by the copy engine where o_store_refusal
    allows; `ones`: the body's rescale factor is where(c, 1, e) (pp.Rescale.ones)."""
    q = pp.WgmmaTile("q_smem", a.name, config.tile_m, k0 // BOX_COLS, 1, 0)
    k = pp.WgmmaTile("k_smem", b.name, config.block, k0 // BOX_COLS, config.stages, q.bytes)
    v = pp.WgmmaTile("v_smem", c.name, config.block, n1 // BOX_COLS, config.stages,
                     q.bytes + k.bytes)
    staged, staging = _staging(config, k0, n1, dtype, tile_reads, packed, tgt,
                               v.offset + v.bytes)
    barriers = v.offset + v.bytes + (staged.bytes if staged else 0)
    smem = (loop_rules.wgmma_staged_bytes(config, k0, n1) if staged
            else loop_rules.wgmma_smem_bytes(config, k0, n1))
    maps = tuple(pp.LoopTensorMap(t.param, dtype, t.rows, t.boxes,
                                  p.heads is not None and p.heads != query_heads)
                 for t, p in ((q, a), (k, b), (v, c)))
    if staged is not None:
        maps += (pp.LoopTensorMap(staged.param, dtype, staged.rows, staged.boxes, False),)
    consumers = config.tile_m // loop_rules.WGMMA_ROWS
    registers = loop_rules.consumer_registers(config.tile_m)
    pingpong = consumers >= 2
    scheduler = pp.Choice(*loop_rules.wgmma_scheduler())
    pipeline = pp.Choice(
        f"TMA: {a.name} once, {b.name} and {c.name} in rings of {config.stages} slot(s), "
        "full/empty mbarriers each",
        "the copy engine fills a slot while the consumers multiply the previous one; "
        f"{b.name}'s slot is released after S, {c.name}'s after the accumulating gemm; "
        "boxes past the loop's end (and past the rows) arrive as zeros")
    if o_store_refusal(scheduler.value == "persistent", packed, stores, dtype, n1,
                       q.boxes) is None:
        maps, pipeline = _o_store(maps, pipeline, stores[0].param, dtype, n1, True)
    return pp.WgmmaLoop(
        consumers=consumers, producer_registers=loop_rules.PRODUCER_REGISTERS,
        consumer_registers=registers, q_tile=q, k_tile=k, v_tile=v,
        barrier_offset=barriers, smem_bytes=smem, maps=maps,
        roles=pp.Choice(
            f"1 producer warpgroup + {consumers} consumer warpgroup(s) of 64 rows",
            "warp specialization: one thread of the producer issues every copy-engine load "
            f"(setmaxnreg {loop_rules.PRODUCER_REGISTERS}) while the consumers "
            f"(setmaxnreg {registers}) multiply and run the statements"),
        mma=pp.Choice(
            f"wgmma.m64n{config.block}k16 (SS, K-major) + wgmma.m64n{n1}k16 (RS, B MN-major)",
            f"sm_90a's warpgroup MMA: S = {a.name} {b.name}^T with both operands in shared "
            "memory, K-major; the handed-on value rounded to 16 bits in registers is the next "
            f"wgmma's A (the f32 accumulator fragment is its A fragment), {c.name} from its "
            "ring slot MN-major (the transpose bit)"),
        pipeline=pipeline,
        overlap=pp.Choice(
            "intra-warpgroup: block j's S, then block j-1's accumulating gemm, in flight "
            "together" + (f"; ping-pong between the {consumers} consumer warpgroups"
                          if pingpong else ""),
            "the tensor cores multiply block j-1's handed-on value while block j's statements "
            "run up to the first that reads the accumulator or the handed-on value (there the "
            "skeleton waits); the handed-on value stays in registers one block longer"
            + ("; the warpgroups take turns issuing their MMAs, in a cycle (named barriers), so "
               "one's statements run while another's MMAs do" if pingpong else
               "; one consumer warpgroup: no ping-pong")),
        issue_ahead=True, pingpong=pingpong, tile_order=tile_order(bounds),
        scheduler=scheduler, staged_tile=staged,
        rescale=pp.Choice(*rescale(ones)),
        staging=staging)


def rescale(ones: bool) -> tuple[str, str]:
    """How the sm_90a skeleton rescales the accumulator (WgmmaLoop.rescale): a factor that is
    where(c, 1, e) (kgen.attention's lazy maximum) is skipped where a warp's rows all read 1,
    one vote a block against the multiplies of the whole accumulator (64 a thread at D 128)."""
    if ones:
        return ("vote: skipped where a warp's factors are all 1",
                "the factor is where(c, 1, e): acc * 1 is acc, so a warp that reads 1 on every "
                "row (one __all_sync) skips the accumulator's multiplies")
    return ("multiply", "the factor is not 1 by construction (not where(c, 1, e))")


def _staging(config: LoopConfig, k0: int, n1: int, dtype: DType, reads: tuple, packed: bool,
             tgt, offset: int) -> tuple[pp.WgmmaTile | None, pp.Choice]:
    """The staged tile of the first tensor the body reads at (row, col) (at `offset` in the
    storage), or None, with why (kgen/targets/loop_rules.py: wgmma_staging_refusal)."""
    if not reads:
        return None, pp.Choice("none", "the body reads no tensor at (row, col)")
    p = reads[0]
    refused = (
        "packed sequences (a tile's rows may cross a sequence's end)" if packed else
        f"{p.name} is {p.dtype.dsl_name}, the operands {dtype.dsl_name}: one copy-engine type"
        if p.dtype is not dtype else
        f"{p.name} is column-major: the copy engine's boxes take rows of columns"
        if p.layout is not Layout.ROW else
        loop_rules.wgmma_staging_refusal(config, k0, n1, tgt))
    others = "".join(f"; {q.name} read per element from global memory" for q in reads[1:])
    if refused is not None:
        return None, pp.Choice(
            f"{p.name} read per element from global memory",
            f"not staged: {refused}" + others)
    tile = pp.WgmmaTile("t_smem", p.name, config.tile_m, config.block // BOX_COLS,
                        config.stages, offset)
    return tile, pp.Choice(
        f"{p.name}'s [{config.tile_m}, {config.block}] tile per block by the copy engine, a "
        f"ring of {config.stages} slot(s)",
        "read at (row, col) by the body: the producer loads each block's tile between K's and "
        "V's (zeros past the rows and the loop's end, as the body reads there), each consumer "
        "warp reads its share by ldmatrix before the statements and releases the slot, instead "
        "of 2-byte global loads per element (kgen/targets/loop_rules.py)" + others)


def with_scheduler(plan: pp.LoopPlan, persistent: bool) -> pp.LoopPlan:
    """The plan with the tile scheduler asked for (a plan option: the bench's and the tests'
    persistent variant), O's store as the rulebook picks it for that scheduler (a persistent
    CTA keeps O from registers); everything else as the rulebook chose it."""
    assert plan.wgmma is not None, "the sm_90a wgmma skeleton's plan"
    assert not (persistent and plan.packed), "packed sequences: a CTA per tile (tiled)"
    assert not (persistent and plan.bounds.equalities), \
        "an equality's scan takes every thread of the CTA per tile: a CTA per tile (tiled)"
    choice = pp.Choice(*loop_rules.wgmma_scheduler(persistent))
    w, stores = plan.wgmma, _stores(plan)
    tma = o_store_refusal(persistent, bool(plan.packed), stores, plan.dtype, plan.gemm1.n,
                          w.q_tile.boxes) is None
    out = stores[0].param if len(stores) == 1 else None
    maps, pipeline = _o_store(w.maps, w.pipeline, out, plan.dtype, plan.gemm1.n, tma)
    return dataclasses.replace(plan, wgmma=dataclasses.replace(
        w, scheduler=choice, maps=maps, pipeline=pipeline))


def o_store_refusal(persistent: bool, packed: bool, stores: tuple, dtype: DType, n1: int,
                    q_boxes: int) -> str | None:
    """Why O's tile leaves from registers, or None: staged in Q's buffer and stored by the copy
    engine (loop_rules.O_STORE_WHY), which needs one output tile of the operands' 16-bit type
    no wider than Q, and one CTA per tile (a persistent CTA's producer loads the next Q into
    that buffer)."""
    if persistent:
        return "a persistent CTA loads its next Q into the buffer O would be staged in"
    if packed:
        return "packed sequences: O's rows are stored per sequence"
    if len(stores) != 1 or stores[0].dtype != dtype:
        return f"the epilogue stores other than one {dtype.dsl_name} tile"
    if n1 // BOX_COLS > q_boxes:
        return f"O's {n1} columns are wider than Q's buffer"
    return None


def with_o_store(plan: pp.LoopPlan, tma: bool) -> pp.LoopPlan:
    """The plan with its output tile stored through the copy engine (`tma`: staged in the
    consumer warpgroup's rows of Q's buffer, free once every S has run, then stored by one
    thread as [64][64] boxes, the rulebook's where o_store_refusal allows) or from registers;
    a plan option for the bench and the tests. Asserts what staging in Q's buffer needs."""
    w = plan.wgmma
    assert w is not None and not w.persistent, "the tiled sm_90a wgmma skeleton's plan"
    assert not (tma and plan.packed), "packed sequences: O's rows stored per sequence"
    stores = _stores(plan)
    assert len(stores) == 1 and stores[0].dtype == plan.dtype, "one 16-bit output tile"
    assert plan.gemm1.n // BOX_COLS <= w.q_tile.boxes, "staged in Q's boxes"
    maps, pipeline = _o_store(w.maps, w.pipeline, stores[0].param, plan.dtype, plan.gemm1.n,
                              tma)
    return dataclasses.replace(plan, wgmma=dataclasses.replace(w, maps=maps, pipeline=pipeline))


def _stores(plan: pp.LoopPlan) -> tuple:
    return tuple(s for s in plan.epilogue.statements if isinstance(s, pp.StoreTile))


def _o_store(maps: tuple, pipeline: pp.Choice, out: str | None, dtype: DType, n1: int,
             tma: bool) -> tuple[tuple, pp.Choice]:
    """The tensor maps and the pipeline's choice with output `out`'s tile stored by the copy
    engine (`tma`) or from registers (no map of it, the pipeline without its words)."""
    if out is None:
        return maps, pipeline
    value = f"; {out} staged in Q's buffer, stored by the copy engine"
    why = "; " + loop_rules.O_STORE_WHY
    maps = tuple(m for m in maps if m.param != out)
    pipeline = pp.Choice(pipeline.value.removesuffix(value), pipeline.why.removesuffix(why))
    if tma:
        maps += (pp.LoopTensorMap(out, dtype, loop_rules.WGMMA_ROWS, n1 // BOX_COLS, False),)
        pipeline = pp.Choice(pipeline.value + value, pipeline.why + why)
    return maps, pipeline


def tile_order(bounds: pp.LoopBounds) -> pp.Choice:
    """The order of the grid's tiles of rows: longest first where a tile further down visits
    at least as many blocks as the one above it (an upper bound on col rising with the row, as
    in causal masks; no upper bound falling with it), else in order."""
    if bounds.listed is not None:
        return pp.Choice("in order", "a block mask's lists, read at run time, say how many "
                                     "blocks each tile visits")
    rising = any(b.upper and b.slope == 1 for b in bounds.bounds)
    falling = any(b.upper and b.slope == -1 for b in bounds.bounds)
    if rising and not falling:
        return pp.Choice(pp.LONGEST_FIRST, (
            "the mask's last column rises with the row, so the tiles further down visit more "
            "blocks: launched first (blockIdx.x counts from the last tile), the short tiles "
            "fill the last wave instead of a long one running alone"))
    return pp.Choice("in order", "every tile visits about as many blocks (no mask, or none "
                                 "whose last column rises with the row)" if not falling else
                     "the mask's last column falls with the row: the first tiles are the "
                     "longest already")
