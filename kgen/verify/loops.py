"""Verify tile programs: loop kernels and row kernels (the rules of docs/language.md, "Loops").

A loop kernel holds one loop of gemms, run in order each iteration (their kinds and operands
are kgen/verify/loop_gemms.py's): the forward's two, `s = A @ B` (A the kernel's rows by K0, B
K0 by the loop's dimension, transposed or not) with an epilogue that hands `s` on, then
`o += s @ C` (C the loop's dimension by N1), which accumulates across the iterations; a
backward's more (score gemms, accumulating gemms reading their epilogues' values, loop-row gemms
adding into `out accumulate` tensors). The operands share one f16 or bf16 dtype, the gemms take
no schedule lines (the loop does: tile, warps, stages), carries are f32 per row; accumulators
of different N (the backward's dK at D, dV at D_v) each have their own [rows, N] tile, and a
statement after the loop reads accumulators of one N (kgen/verify/loop_gemms.py
after_loop_groups). Its own epilogue, after the loop, stores the outputs. A
row kernel has no gemm: its epilogue is its body, over the [rows, cols] of its tensors. Both may have two batch dimensions (batch, heads);
an input whose heads differ from the kernel's is shared by query heads (GQA).

The values and statements of the epilogues are kgen/verify/tile_epilogue.py's.
"""
from __future__ import annotations

from .. import ir
from ..diagnostics import (
    at_line,
    first_located,
    loc_of,
    or_list,
    quote,
    setting_problem,
    shape_text,
    shown,
)
from ..errors import KgenError, KgenWarning
from ..ir import DType, ParamKind, Role
from .epilogue import local_refs
from .loop_gemms import (MAX_OPERAND_COLS, Kind, after_loop_groups, check_accumulating_gemm,
                         check_loop_row_gemm, check_score_gemm, kind_of)
from .blocks import check_blocks
from .packed import check_packed
from .state import KernelState, require_str
from .tile_epilogue import Rank, TileScope, Where, check_tile_epilogue

__all__ = ["is_tile_program", "check_tile_program", "MAX_OPERAND_COLS", "LOOP_TILE_M",
           "LOOP_TILE_N", "MAX_LOOP_STAGES"]

LOOP_TILE_M = (64, 128, 192)  # rows per CTA (192: sm_90a's three consumer warpgroups)
# the loop's block: 32, or a multiple of 16 from 64 to 256 (sm_90a's wgmma n and the copy
# engine's box rows allow any; FlashAttention-3 takes 80 at head dim 256, 176 at 128); each
# target's rulebook refuses what its skeleton lacks
LOOP_TILE_N = (32,) + tuple(range(64, 257, 16))
LOOP_TILE_N_TEXT = "32 or a multiple of 16 from 64 to 256"
MAX_LOOP_STAGES = 3
ROWS_PER_WARP = 16


def is_tile_program(kernel: ir.Kernel) -> bool:
    """A loop kernel, or a row kernel (an epilogue and no gemm)."""
    return kernel.loop is not None or (kernel.epilogue is not None and not kernel.gemms)


def check_tile_program(state: KernelState) -> None:
    k = state.kernel
    for present, what, at in ((k.storage is not None, "a storage declaration",
                               loc_of(k.storage, k.loc)),
                              (bool(k.phases), "a phases declaration", k.loc),
                              (k.schedule is not None, "a schedule line",
                               first_located(k.schedule_loc, k.loc)),
                              ):
        if present:
            raise KgenError(at, f"{what} applies to gemm kernels; kernel '{k.name}' is a "
                                   f"{'loop' if k.loop is not None else 'row'} kernel")
    if k.deterministic and not any(p.accumulate for p in k.params):
        raise KgenError(k.loc, f"'reductions deterministic' orders the adds of a gemm kernel's "
                               f"CTAs, or of a loop kernel's into an 'out accumulate' tensor; "
                               f"kernel '{k.name}' is a {'loop' if k.loop is not None else 'row'}"
                               " kernel with none")
    if k.compute_dtype is not DType.F32:
        raise KgenError(k.loc, f"loop and row kernels compute in f32; kernel '{k.name}' asks "
                               f"for compute {getattr(k.compute_dtype, 'dsl_name', '?')}")
    if k.epilogue is not None and not isinstance(k.epilogue, ir.Epilogue):
        raise KgenError(k.loc, f"kernel epilogue must be a kgen.ir.Epilogue, got "
                               f"{shown(k.epilogue)}")
    if k.loop is not None:
        _check_loop_kernel(state)
    else:
        _check_row_kernel(state)


# ---------------------------------------------------------------------------------------------
# Row kernels


def _check_row_kernel(state: KernelState) -> None:
    k = state.kernel
    tensors = [p for p in k.params if p.kind is ParamKind.TENSOR]
    inputs = [p for p in tensors if p.role is Role.IN]
    if not tensors:
        raise KgenError(k.loc, f"row kernel '{k.name}' has no tensor: its epilogue runs over "
                               "the [rows, cols] of its tensors")
    first = (inputs or tensors)[0]
    _check_heads(state, first)
    rows, cols = first.shape
    shape = shape_text(first.shape)
    scope = TileScope(Where.ROWS, f"the {shape} tile", rows, cols, "the kernel's epilogue",
                      lead=first)
    check_tile_epilogue(state, k.epilogue, scope, first_located(k.epilogue.loc, k.loc))


# ---------------------------------------------------------------------------------------------
# Loop kernels


def _check_loop_kernel(state: KernelState) -> None:
    k, loop = state.kernel, state.kernel.loop
    if not isinstance(loop, ir.Loop):
        raise KgenError(k.loc, f"kernel loop must be a kgen.ir.Loop, got {shown(loop)}")
    loc = first_located(loop.loc, k.loc)
    if k.gemms:
        g = k.gemms[0]
        raise KgenError(loc_of(g, k.loc), f"gemm '{getattr(g, 'name', '?')}' is outside loop "
                                          f"'{loop.name}': a loop kernel's gemms are in its loop")
    state.define(require_str(loop.name, loc, "a loop name"), "loop", loc)
    dim = loop.dim
    if not isinstance(dim, str) or state.names.get(dim, ("",))[0] != "dimension":
        raise KgenError(loc, f"loop '{loop.name}' runs over {quote(dim)}, which is not a "
                             "dimension of any parameter")
    for attr in ("carries", "gemms"):
        if not isinstance(getattr(loop, attr), tuple):
            raise KgenError(loc, f"loop {attr} must be a tuple, got {shown(getattr(loop, attr))}")
    _check_schedule(loop, loc)
    carries: dict[str, ir.Carry] = {}
    for carry in loop.carries:
        _check_carry(state, carry, loc)
        carries[carry.name] = carry

    gemms = loop.gemms
    if len(gemms) < 2 or not all(isinstance(g, ir.Gemm) for g in gemms):
        raise KgenError(loc, f"loop '{loop.name}' must hold a score gemm "
                             f"'gemm s = A @ B {{ epilogue {{ s = ... }} }}' then gemms that use "
                             f"its values, e.g. 'gemm o += s @ C'; it holds {len(gemms)}")
    first = gemms[0]
    a, _ = check_score_gemm(state, loop, first, None)
    if a.dtype not in state.target.operand_dtypes:
        usable = or_list([d.dsl_name for d in DType if d in state.target.operand_dtypes])
        raise KgenError(first_located(first.a.loc, loc),
                        f"dtype {a.dtype.dsl_name} is not supported as an MMA operand on "
                        f"{state.target.arch.value} (use {usable})")
    queries = _query_heads_of(state, loop, a)
    if queries is None:
        _check_heads(state, a)
    else:
        _check_grouped_heads(state, loop, a, queries)
    visited = queries or a  # whose (batch, head) the loop's `head` is: a GQA visit's query head
    rows = a.shape[0]
    check_packed(state, rows, dim)
    check_blocks(state, loop, LOOP_TILE_M, LOOP_TILE_N, ROWS_PER_WARP)
    for g in gemms:
        require_str(g.name, first_located(g.loc, loc), "a gemm name")
    accumulators = {g.name: g for g in gemms if g.accumulate}
    kinds = {g.name: kind_of(state, g) for g in gemms[1:]}
    loop_rows = {g.name: g for g in gemms[1:] if kinds[g.name] is Kind.LOOP_ROW}
    values: dict[str, Rank] = {}  # tile values bound so far, readable by later gemms
    owners: dict[str, str] = {}  # each value's score gemm
    n_of: dict[str, tuple] = {}  # accumulator -> (N, where its B is)
    for g in gemms:
        kind = Kind.SCORE if g is first else kinds[g.name]
        if kind is Kind.SCORE:
            operands = ((a, state.params[g.b.name]) if g is first
                        else check_score_gemm(state, loop, g, a))
            scope = TileScope(Where.LOOP, f"{g.name}'s tile", rows, dim, f"gemm '{g.name}'",
                              carries=carries, accumulators=accumulators, gemm=g, loop=loop,
                              lead=visited, bound=dict(values), loop_rows=loop_rows,
                              used=_read_later(gemms, g))
            check_tile_epilogue(state, g.epilogue, scope, first_located(g.loc, loc))
            for name, rank in scope.bound.items():
                if name not in values:
                    values[name], owners[name] = rank, g.name
        elif kind is Kind.ACCUMULATING:
            operands = (check_accumulating_gemm(state, loop, g, values, loop_rows, first),)
            _tile_operand(g, values, loc)
            n_of[g.name] = (operands[0].shape[1], first_located(g.b.loc, loc))
        else:
            operands = (check_loop_row_gemm(state, loop, g, values, loop_rows, a),)
            _tile_operand(g, values, loc)
            z = operands[0]
            elsewhere = {n: f"'{n}' is a value of gemm '{owners[n]}''s [{rows}, {dim}] tile; "
                            f"gemm '{g.name}''s epilogue works on its [{dim}, {z.shape[1]}] "
                            "tile at the loop's rows" for n in values}
            scope = TileScope(Where.LOOP_ROWS, f"{g.name}'s {shape_text((dim, z.shape[1]))} tile",
                              dim, z.shape[1], f"gemm '{g.name}'", carries=carries,
                              accumulators=accumulators, gemm=g, loop=loop, lead=visited,
                              loop_rows=loop_rows, elsewhere=elsewhere)
            check_tile_epilogue(state, g.epilogue, scope, first_located(g.loc, loc))
        for operand in operands:
            if operand.dtype is not a.dtype:
                raise KgenError(first_located(g.b.loc, loc),
                                f"operand dtypes differ: {a.name} is {a.dtype.dsl_name} but "
                                f"{operand.name} is {operand.dtype.dsl_name}")
    if not accumulators and not loop_rows:
        raise KgenError(loc, f"loop '{loop.name}' must hold a gemm that uses its score gemms' "
                             f"values, e.g. 'gemm o += {first.name} @ C'")
    widths = {name: n for name, (n, _) in n_of.items()}
    if k.epilogue is not None:
        stmts = k.epilogue.stmts if isinstance(k.epilogue.stmts, tuple) else ()
        columns = {p.name: p.shape[1] for p in state.params.values()
                   if p.kind is ParamKind.TENSOR and len(p.shape) == 2}
        # accumulators of several N: each statement on the tile of one N (its group)
        groups = (after_loop_groups(stmts, widths, columns) if len(set(widths.values())) > 1
                  else ((next(iter(widths.values()), 0), None),))
        for n1, group in groups:
            names = [name for name in accumulators if group is None or widths[name] == n1]
            said = " and ".join(names) or "no accumulator"
            tile = f"{said}'s {shape_text((rows, n1))} tile" if len(names) == 1 else \
                f"the {shape_text((rows, n1))} tile of {said}"
            after = TileScope(Where.AFTER, tile, rows, n1, "the kernel's epilogue",
                              carries=carries, accumulators=accumulators, loop=loop, lead=a,
                              loop_rows=loop_rows,
                              elsewhere={n: f"'{n}' is a value of gemm '{owners[n]}' in the "
                                            "loop; after it, read the accumulators and carries"
                                         for n in values})
            epilogue = k.epilogue if group is None else ir.Epilogue(group, k.epilogue.loc)
            check_tile_epilogue(state, epilogue, after, first_located(k.epilogue.loc, k.loc))
    state.warnings.extend(_unused_carries(loop, k.epilogue))


def _tile_operand(g: ir.Gemm, values: dict, loc) -> None:
    """A value as A is a tile (a row value would have to be broadcast: not for now)."""
    if values[g.a.name] is not Rank.TILE:
        raise KgenError(first_located(g.a.loc, loc), f"the A operand of gemm '{g.name}' is a "
                                                     f"tile value; '{g.a.name}' is one value "
                                                     "per row")


def _read_later(gemms: tuple, g: ir.Gemm) -> set[str]:
    """The names that the gemms after `g` read: their A operands and their epilogues' locals
    (a value of `g`'s epilogue used there is not dead)."""
    later = gemms[gemms.index(g) + 1:]
    names = {name for h in later if isinstance(name := getattr(h.a, "name", None), str)}
    for h in later:  # not checked yet: read defensively
        stmts = getattr(h.epilogue, "stmts", ())
        for stmt in stmts if isinstance(stmts, tuple) else ():
            names |= local_refs(getattr(stmt, "value", None))
    return names


def _check_schedule(loop: ir.Loop, loc) -> None:
    tile, warps, stages = loop.tile, loop.warps, loop.stages
    for node, cls in ((tile, ir.BlockShape), (warps, ir.WarpGrid), (stages, ir.StageCount)):
        if node is not None and not isinstance(node, cls):
            raise KgenError(loc, f"loop '{loop.name}': {shown(node)} is not a "
                                 f"kgen.ir.{cls.__name__}")
    if tile is not None:
        at = first_located(tile.loc, loc)
        for value, what in ((tile.m, "tile M"), (tile.n, "tile N")):
            if problem := setting_problem(value, what):
                raise KgenError(at, problem)
        if tile.m not in LOOP_TILE_M:
            raise KgenError(at, f"a loop's tile M (rows per CTA) must be "
                                f"{or_list([str(m) for m in LOOP_TILE_M])}, got {tile.m}")
        if tile.n not in LOOP_TILE_N:
            raise KgenError(at, f"a loop's tile N (its block of {loop.dim}) must be "
                                f"{LOOP_TILE_N_TEXT}, got {tile.n}")
    if warps is not None:
        at = first_located(warps.loc, loc)
        for value, what in ((warps.m, "warps"), (warps.n, "warps N")):
            if problem := setting_problem(value, what):
                raise KgenError(at, problem)
        if warps.n != 1:
            raise KgenError(at, f"a loop's warps run along its rows only: write warps "
                                f"{warps.m} (or {warps.m}x1), not {warps.m}x{warps.n}")
        counts = [m // ROWS_PER_WARP for m in LOOP_TILE_M]
        if warps.m not in counts:
            raise KgenError(at, f"a loop's warps must be {or_list([str(c) for c in counts])} "
                                f"({ROWS_PER_WARP} rows each), got {warps.m}")
        if tile is not None and tile.m != ROWS_PER_WARP * warps.m:
            raise KgenError(at, f"warps {warps.m} cover {ROWS_PER_WARP * warps.m} rows "
                                f"({ROWS_PER_WARP} each) but the loop's tile has {tile.m}")
    if stages is not None:
        at = first_located(stages.loc, loc)
        if problem := setting_problem(stages.count, "stages"):
            raise KgenError(at, problem)
        if stages.count > MAX_LOOP_STAGES:
            raise KgenError(at, f"a loop's stages must be 1 to {MAX_LOOP_STAGES}, got "
                                f"{stages.count}")


def _check_carry(state: KernelState, carry: object, loc) -> None:
    if not isinstance(carry, ir.Carry):
        raise KgenError(loc, f"loop carries must be kgen.ir.Carry, got {shown(carry)}")
    at = first_located(carry.loc, loc)
    state.define(require_str(carry.name, at, "a carry name"), "carry", at)
    if carry.dtype is not DType.F32:
        name = getattr(carry.dtype, "dsl_name", None) or shown(carry.dtype)
        raise KgenError(at, f"carry '{carry.name}' is {name}; carries are f32")
    init = carry.init
    if isinstance(init, bool) or not isinstance(init, (int, float)) or init != init or (
            abs(init) != float("inf") and abs(init) > 3.4028234663852886e38):
        raise KgenError(at, f"carry '{carry.name}' starts at {shown(init)}; it must start at "
                            "an f32 number, inf or -inf")


# ---------------------------------------------------------------------------------------------
# Two batch dimensions


def _check_heads(state: KernelState, rows_of: ir.Param) -> None:
    """Batch and heads in a tile program. `rows_of` holds the rows the kernel computes (a
    loop's first A, a row kernel's first tensor); its (batch, heads) are the kernel's grid. An
    input with other heads is shared by query heads (GQA: the kernel's heads must be a multiple
    of its heads); an output has the kernel's heads."""
    k = state.kernel
    heads = rows_of.heads
    for p in k.params:
        if p.batch is None:
            continue  # shared by every batch and head
        at = loc_of(p, k.loc)
        if heads is None and p.heads is not None:
            raise KgenError(at, f"{p.kind.value} '{p.name}' has a heads dimension but "
                                f"'{rows_of.name}', whose rows the kernel computes, has none")
        if heads is not None and p.heads is None:
            if p.role is Role.OUT:
                hint = f"declare it {p.dtype.dsl_name}{shape_text((p.batch, heads, *p.shape))}"
            else:
                shape = shape_text((p.batch, 1, *p.shape))
                hint = f"give it one ({p.dtype.dsl_name}{shape} shares it across heads)"
            raise KgenError(at, f"{p.kind.value} '{p.name}' has a batch dimension but no heads "
                                f"dimension, and '{rows_of.name}' has heads {heads}; {hint}")
        if p.heads is None or p.heads == heads:
            continue
        if p.role is Role.OUT:
            raise KgenError(at, f"output '{p.name}' has heads {p.heads} but the kernel runs over "
                                f"the heads {heads} of '{rows_of.name}'{at_line(rows_of.loc)}")
        if isinstance(heads, int) and isinstance(p.heads, int) and heads % p.heads:
            raise KgenError(at, f"'{rows_of.name}' has {heads} heads, not a multiple of the "
                                f"{p.heads} heads of '{p.name}' (each of its heads serves "
                                "heads / its heads query heads)")


def _query_heads_of(state: KernelState, loop: ir.Loop, keys: ir.Param) -> ir.Param | None:
    """A backward's GQA (FlashAttention's orientation: the kernel's rows are the keys): the
    first score gemm's B (Q), whose heads are not those of the kernel's rows (K), in a loop
    that adds a loop-row tile into an `out accumulate` tensor (per query head). None otherwise:
    the kernel's heads are its rows'."""
    b = state.params.get(loop.gemms[0].b.name)
    if b is None or b.heads is None or keys.heads is None or b.heads == keys.heads:
        return None
    loop_row = any(g.a.transposed and g.a.name not in state.params for g in loop.gemms[1:])
    return b if loop_row else None


def _check_grouped_heads(state: KernelState, loop: ir.Loop, keys: ir.Param,
                         queries: ir.Param) -> None:
    """GQA in a backward loop: a CTA owns a KV head of `keys` (the kernel's rows) and walks
    the loop's blocks of every query head of its group (`queries`' heads, a multiple). The
    streamed operands and the `out accumulate` tensors (added per query head) have the query
    heads; the outputs the kernel's epilogue stores (the accumulators: summed over the group)
    have the KV heads; an input has either."""
    k = state.kernel
    hq, hkv = queries.heads, keys.heads
    if isinstance(hq, int) and isinstance(hkv, int) and hq % hkv:
        raise KgenError(loc_of(queries, k.loc), f"'{queries.name}' has {hq} heads, not a "
                        f"multiple of the {hkv} heads of '{keys.name}' (each KV head serves "
                        "heads / KV heads query heads)")
    tile_stores = {stmt.target for g in loop.gemms  # a score gemm's: one per visit
                   for stmt in (g.epilogue.stmts if g.epilogue is not None else ())
                   if isinstance(stmt, ir.Store)}
    for p in k.params:
        if p.batch is None:
            continue  # shared by every batch and head
        at = loc_of(p, k.loc)
        if p.heads is None:
            raise KgenError(at, f"{p.kind.value} '{p.name}' has a batch dimension but no heads "
                                f"dimension; give it the query heads {hq} of '{queries.name}' "
                                f"or the KV heads {hkv} of '{keys.name}'")
        want = None
        if p.role is Role.OUT and p.accumulate:
            want = (hq, f"'{p.name}' is added into at the loop's rows, per query head: declare "
                        f"it with the heads {hq} of '{queries.name}'")
        elif p.role is Role.OUT and p.name in tile_stores:
            want = (hq, f"'{p.name}' is stored by a score gemm in the loop, a tile per visit "
                        f"of a query head: declare it with the heads {hq} of '{queries.name}'")
        elif p.role is Role.OUT:
            want = (hkv, f"'{p.name}' is stored by the kernel's epilogue, once per KV head (the "
                         f"accumulators sum the group's query heads): declare it with the heads "
                         f"{hkv} of '{keys.name}'")
        elif p.heads not in (hq, hkv):
            want = (None, f"{p.kind.value} '{p.name}' has heads {p.heads}: in a loop whose "
                          f"rows are '{keys.name}''s (KV heads {hkv}) walking the query heads "
                          f"{hq} of '{queries.name}', an input has one of the two")
        if want is not None and p.heads != want[0]:
            raise KgenError(at, want[1])
    for g in loop.gemms:
        b = state.params.get(g.b.name)
        streamed = b is not None and (state.params.get(g.a.name) is not None
                                      or not g.a.transposed)
        if streamed and b.heads != hq:
            raise KgenError(first_located(g.b.loc, g.loc, loop.loc),
                            f"'{b.name}' is streamed along loop '{loop.name}', which walks the "
                            f"query heads {hq} of '{queries.name}': declare it with them")


# ---------------------------------------------------------------------------------------------
# Warnings


def _unused_carries(loop: ir.Loop, after: ir.Epilogue | None) -> list[KgenWarning]:
    """A warning at each carry whose value reaches no store, no gemm operand and no other live
    carry: its updates are dead code (a running max that nothing reads)."""
    carried = {c.name for c in loop.carries} | {g.name for g in loop.gemms if g.accumulate}
    live: set[str] = set()
    updates: dict[str, set[str]] = {}  # carry -> what its updates read
    reads: dict[str, set[str]] = {}  # local -> the carried values it reads (across the loop)
    for epilogue, operand in [*((g.epilogue, g.a.name) for g in loop.gemms), (after, None)]:
        if operand in reads:  # a tile value as a gemm's A
            live |= reads[operand]
        if epilogue is None:
            continue
        if epilogue is after:
            reads = {}  # the loop's values are not visible after it
        for stmt in epilogue.stmts:
            deps = _carried_reads(stmt.value, reads, carried)
            if isinstance(stmt, ir.Let):
                reads[stmt.name] = deps
            elif isinstance(stmt, ir.Update) and stmt.name in carried:
                if any(stmt.name == g.name for g in loop.gemms):
                    live |= deps  # a rescale of the accumulator
                updates.setdefault(stmt.name, set()).update(deps)
            else:
                live |= deps
                if isinstance(stmt, ir.Store):
                    reads[stmt.target] = deps  # `s`, read back by later statements
    changed = True
    while changed:
        grown = live | {d for name in live for d in updates.get(name, ())}
        changed, live = grown != live, grown
    return [KgenWarning(loc_of(c, loop.loc), f"carry '{c.name}' is never read (no output "
                                             "depends on it); its updates are not computed")
            for c in loop.carries if c.name not in live]


def _carried_reads(expr: object, reads: dict[str, set[str]], carried: set[str]) -> set[str]:
    found: set[str] = set()
    for name in local_refs(expr):
        if name in reads:
            found |= reads[name]
        elif name in carried:
            found.add(name)
    return found
