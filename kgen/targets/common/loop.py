"""Tile programs to C++: the loop kernel's skeleton (templates/common/loop.cu.j2) and the row
kernel's (templates/common/rows.cu.j2), filled from a plan.program.LoopPlan or RowsPlan.

A section's values become C++ expressions the way the epilogue's do (OP_CPP, the dtype tables
and literals of kgen/targets/common/epilogue_cpp.py), extended here with what only a program
has: positions, carries, the carried accumulator, row reductions and infinities. The template
declares every value and writes every statement; Python hands it runs of values of one rank, in
order, each with its expression over the names of earlier values. Element references follow the
skeletons' one convention: a TILE value is `v<id>[j][e]` (fragment j, element e of the thread's
share of the tile), a ROW value `v<id>[i]` (the thread's row i), a UNIFORM value `v<id>`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from ... import __version__
from ...enums import Axis, Layout, Op, ReduceOp
from ...plan import epilogue as dag
from ...plan import program as pp
from ...plan.program import Rank
from ..loop_rules import shared_divisor
from .arch_guard import guard_for
from .epilogue_cpp import OP_CPP, PAIR, TO_FLOAT, float_literal
from .host_api import header_file_lines
from .render import render

# the device helpers that reduce: (combine an element into the running value, merge two
# running values across threads), and the identity
REDUCE: dict[ReduceOp, tuple[str, str, float]] = {
    ReduceOp.SUM: ("red_add", "red_add", 0.0),
    ReduceOp.MAX: ("red_max", "red_max", -math.inf),
    ReduceOp.MIN: ("red_min", "red_min", math.inf),
    ReduceOp.ABSMAX: ("red_absmax", "red_max", 0.0),
}


def literal(value: float) -> str:
    """A float32 literal; infinities through the skeleton's kInf."""
    if math.isinf(value):
        return "kInf" if value > 0 else "(-kInf)"
    text = float_literal(value)
    return f"({text})" if text.startswith("-") else text


@dataclass(frozen=True, slots=True)
class CValue:
    """One value of a run: `const float name = expr` (or `name[...] = expr` for arrays)."""

    name: str
    expr: str
    folded: bool = False  # a mask's predicate: 1 in a block inside the mask (`interior`)
    # a mask where(P, e, -inf) on a block mask's full block (`interior`): this, e's reference
    unmasked: str = ""


@dataclass(frozen=True, slots=True)
class CReduce:
    """A row reduction: `name[i]` starts at `identity`, takes `combine(name[i], arg)` for each
    element of the row that exists, then `merge`s across the threads of the row."""

    name: str
    arg: str
    identity: str
    combine: str
    merge: str


@dataclass(frozen=True, slots=True)
class CRandom:
    """random(seed, offset) drawn into a loop skeleton's tile `name[j][e]` (common/
    program_statements.inc.j2 s_random): one Philox call per group of eight elements (ir.Random)
    at the group's first element in the fragments' order (i, j and e even: rows row_base + 8 i
    with row_base's bit 3 clear, columns quad_col + (e & 1) in n8 groups j from a multiple of
    16, so i & 1, j & 1 and e & 1 are bits 3 of row and col and bit 0 of col); `transposed`
    (random_t, at (col, row)): a thread holds four elements of a group, all in the half of
    each word its row's bit 0 picks, and the lane holding row ^ 1 (lane ^ 4) the other four:
    each lane of the pair makes the call of the columns of its row's parity and hands the
    other lane its halves (a shuffle: every lane draws, the draw is no branch at run time)."""

    name: str
    seed: str
    offset: str
    transposed: bool


@dataclass(frozen=True, slots=True)
class CStatement:
    """What the skeleton renders through its macro `kind`: compute runs, carry updates, the
    rescale of the accumulator, the hand-on, tile and row stores."""

    kind: str  # "uniform", "row", "tile", "reduce", "random", "update", "rescale",
    #            "hand_on", "store_tile", "store_row", "mma"
    values: tuple = ()  # CValue, CReduce or CRandom, for the compute kinds
    draws: tuple = ()  # "tile": the CRandom values drawn in its loop, before its values
    target: str = ""  # the carry, accumulator or parameter
    value: str = ""  # the element reference read (update, rescale, hand_on, stores): the
    # skeleton's overloads (pack2, store_pair, store_one) convert by the element type
    gemm: pp.LoopGemm | None = None  # "mma": the gemm whose MMAs run
    skip_ones: bool = False  # "rescale": a warp whose factors are all 1 skips it (a vote)


def _reference(value: pp.Value, col_end: str, acc: str, sizes: tuple[str, str],
               staged: bool = False, tiles: dict[str, str] | None = None) -> str:
    """How statements read `value`: an atom (constant, scalar, position, carry, accumulator
    element, guarded vector or tensor load, loaded input) as itself, a computed value by its
    name. `col_end`: the bound of `col` in this section (columns past it do not exist); `acc`:
    the array of the first gemm's accumulator; `sizes`: the rows and the loop's length (the loop
    skeletons' locals, per sequence when packed; the row kernel's p.rows); `staged`: tensors
    were loaded into registers (`in_X`, the row kernel), else they are read at (row, col) where
    both exist, or by `tiles[param]` (a skeleton's read of its staged tile in shared memory)."""
    kind = value.kind
    if isinstance(kind, dag.Constant):
        return literal(kind.value)
    if isinstance(kind, dag.ScalarArg):
        return f"p.{kind.param}"
    if isinstance(kind, dag.Accumulator):
        return f"{acc}[j][e]"
    if isinstance(kind, pp.PositionValue):  # the skeletons' ints row, col, batch, head
        return f"static_cast<float>({kind.axis.value})"
    if isinstance(kind, pp.ExtentValue):
        return f"static_cast<float>({sizes[1] if kind.loop else sizes[0]})"
    if isinstance(kind, pp.RandomValue) and sizes != LOOP_SIZES:  # common/philox.inc.j2
        # the row kernel: a call per element (random_t: at (col, row)); a loop skeleton draws
        # its tile's values once per group (CRandom) and reads them as any tile value's
        where = "col, row" if kind.transposed else "row, col"
        return f"philox_uniform(p.{kind.seed}, p.{kind.offset}, batch, head, p.heads, {where})"
    if isinstance(kind, pp.CarryValue):
        return f"carry_{kind.carry}[i]"
    if isinstance(kind, pp.AccumulatorValue):
        return "acc1[j][e]"
    if isinstance(kind, dag.VectorLoad) and kind.axis in (Axis.BATCH, Axis.HEAD):
        return TO_FLOAT[kind.dtype].format(f"p.{kind.param}[{kind.axis.value}]")
    if isinstance(kind, dag.VectorLoad):
        load = TO_FLOAT[kind.dtype].format(f"g_{kind.param}[{kind.axis.value}]")
        bound = sizes[0] if kind.axis is Axis.ROW else col_end
        return f"({kind.axis.value} < {bound} ? {load} : 0.0f)"
    if isinstance(kind, dag.TensorLoad) and staged:
        return f"in_{kind.param}[j][e]"
    if isinstance(kind, dag.TensorLoad) and kind.param in (tiles or {}):
        return tiles[kind.param]
    if isinstance(kind, dag.TensorLoad):  # element (row, col) in the declared layout
        at = "row * {0}_ld + col" if kind.layout is Layout.ROW else "col * {0}_ld + row"
        load = TO_FLOAT[kind.dtype].format(f"g_{kind.param}[{at.format('p.' + kind.param)}]")
        return f"(row < {sizes[0]} && col < {col_end} ? {load} : 0.0f)"
    suffix = {Rank.UNIFORM: "", Rank.ROW: "[i]", Rank.TILE: "[j][e]"}[value.rank]
    return f"v{value.id}{suffix}"


def _expression(value: pp.Value, refs: list[str], ops=OP_CPP, section: pp.Section | None = None,
                fused: frozenset[int] = frozenset(), exp_of_difference: str = "",
                reciprocal: bool = False) -> str:
    kind = value.kind
    if isinstance(kind, dag.Apply):
        if kind.op is Op.EXP and kind.args[0] in fused:  # exp(a - b) and its scaled forms
            return _fused_exp(section, kind.args[0], refs, fused, exp_of_difference)
        if reciprocal and shared_divisor(section, value):  # plan.division
            return RECIPROCAL_DIVISION.format(*(refs[a] for a in kind.args))
        return ops[kind.op].format(*(refs[a] for a in kind.args))
    assert isinstance(kind, dag.Cast), kind
    arg = refs[kind.arg]
    return TO_FLOAT[kind.dtype].format(PAIR[kind.dtype][4].format(arg))


# a / b as a times b's reciprocal, computed once (plan.division: b is a row or uniform value,
# the same for a row's elements, so the compiler computes 1 / b once per row and the division
# costs a multiply per element)
RECIPROCAL_DIVISION = "{0} * (1.0f / {1})"


# The loop skeletons' locals holding the rows and the loop's length (this sequence's when
# packed: templates/common/loop_packed.inc.j2 declares them)
LOOP_SIZES = ("rows", "loop_len")


def statements(section: pp.Section, col_end: str, acc: str = "acc0",
               fold: tuple[int, ...] = (), ops=OP_CPP,
               exp_of_difference: str | None = None, scaled_exp: bool = False,
               sizes: tuple[str, str] = LOOP_SIZES, staged: bool = False,
               tiles: dict[str, str] | None = None,
               reciprocal: bool = False, unmask: tuple[int, ...] = (),
               vote: bool = False) -> list[CStatement]:
    """The section's statements for the skeleton, compute runs split by rank (in order);
    the values in `fold` read 1 in a block inside the mask; `ops`: the C++ of each operation
    (a skeleton may spell one otherwise, as the same value); `exp_of_difference`: the C++ of
    exp(a - b) on a and b, where a skeleton computes it in one piece (the difference stays a
    value of its own for other readers); `sizes`: what reads the rows and the loop's length;
    `staged`, `tiles`: see _reference; `reciprocal`: a TILE value divided by a ROW or UNIFORM
    one as a times b's reciprocal (plan.division); `unmask`: the masks where(P, e, -inf) that
    read e on a block mask's full block (plan.bounds.listed.masks); `vote`: a rescale by
    where(c, 1, e) is skipped where a warp's factors are all 1 (WgmmaLoop.rescale)."""
    refs = [_reference(value, col_end, acc, sizes, staged, tiles) for value in section.values]
    fused = (_fused_differences(section, fold, scaled_exp) if exp_of_difference is not None
             else frozenset())
    drawn: set[int] | None = set() if sizes == LOOP_SIZES else None  # the row kernel's: inline
    out: list[CStatement] = []
    for stmt in section.statements:
        if isinstance(stmt, pp.Compute):
            ids = tuple(v for v in stmt.values if v not in fused)
            out += _runs(section, ids, refs, fold, ops, fused, exp_of_difference or "",
                         reciprocal, unmask, drawn)
        elif isinstance(stmt, pp.GemmStep):
            out.append(CStatement("mma", gemm=stmt.gemm))
        else:  # a statement reading a value: after the draws it needs
            out += drawing(draws(section, stmt.value, fused, drawn))
            out.append(_reader(stmt, refs[stmt.value], vote))
    return out


def _reader(stmt: pp.Statement, value: str, vote: bool) -> CStatement:
    """The statement of a carry update, a rescale, the hand-on or a store, reading `value`."""
    if isinstance(stmt, pp.UpdateCarry):
        return CStatement("update", target=stmt.carry, value=value)
    if isinstance(stmt, pp.Rescale):
        return CStatement("rescale", target=stmt.gemm, value=value, skip_ones=stmt.ones and vote)
    if isinstance(stmt, pp.HandOn):
        return CStatement("hand_on", value=value)
    if isinstance(stmt, pp.StoreTile):
        return CStatement("store_tile", target=stmt.param, value=value)
    assert isinstance(stmt, pp.StoreRow), stmt
    return CStatement("store_row", target=stmt.param, value=value)


def _fused_exp(section: pp.Section, arg: int, refs: list[str], fused: frozenset[int],
               exp_of_difference: str) -> str:
    """The C++ of exp(arg) where arg is fused (_fused_differences): a - b, c * a - b or
    c * (a - b), on a, b and c."""
    kind = section.values[arg].kind
    if kind.op is Op.MUL:  # c * (a - b)
        d = next(x for x in kind.args if x in fused)
        c = kind.args[1] if d == kind.args[0] else kind.args[0]
        a, b = section.values[d].kind.args
        return FAST_EXP_SCALED_DIFFERENCE.format(refs[a], refs[b], refs[c])
    a, b = kind.args
    if a in fused:  # c * a - b
        product = section.values[a].kind.args
        c, x = product if _scale(section, product[0]) else product[::-1]
        return FAST_EXP_DIFFERENCE_SCALED.format(refs[x], refs[c], refs[b])
    return exp_of_difference.format(refs[a], refs[b])


def _scale(section: pp.Section, c: int) -> bool:
    """Whether c is a factor a fused exp takes as its scale: not a tile value (the same for a
    row's elements, so c log2 e is computed once)."""
    return section.values[c].rank is not Rank.TILE


def _fused_differences(section: pp.Section, fold: tuple[int, ...],
                       scaled: bool) -> frozenset[int]:
    """The values exp reads through and computes in one multiply-add itself (no value of their
    own): a difference a - b read only by exp; and where `scaled`, with a factor c that is not
    a tile value, c * a in c * a - b, or the difference and the product in c * (a - b), each
    read only by the next. None the mask folds."""
    readers: dict[int, list[object]] = {}
    for value in section.values:
        kind = value.kind
        args = (kind.args if isinstance(kind, dag.Apply)
                else (kind.arg,) if isinstance(kind, (dag.Cast, pp.RowReduction)) else ())
        for a in args:
            readers.setdefault(a, []).append(kind)
    for stmt in section.statements:
        if isinstance(stmt, (pp.UpdateCarry, pp.Rescale, pp.HandOn, pp.StoreTile, pp.StoreRow)):
            readers.setdefault(stmt.value, []).append(stmt)

    def only(v: int, op: Op) -> bool:  # v is read, and only by `op`s
        return bool(readers.get(v)) and v not in fold and all(
            isinstance(r, dag.Apply) and r.op is op for r in readers[v])

    def apply(v: int, op: Op) -> dag.Apply | None:
        kind = section.values[v].kind
        return kind if isinstance(kind, dag.Apply) and kind.op is op else None

    fused: set[int] = set()
    for v in section.values:
        if apply(v.id, Op.SUB) and only(v.id, Op.EXP):  # exp(a - b), exp(c * a - b)
            fused.add(v.id)
            product = apply(v.kind.args[0], Op.MUL) if scaled else None
            if (product and only(v.kind.args[0], Op.SUB)
                    and any(_scale(section, c) for c in product.args)):
                fused.add(v.kind.args[0])
        product = apply(v.id, Op.MUL) if scaled else None
        if product and only(v.id, Op.EXP):  # exp(c * (a - b))
            for c, d in (product.args, product.args[::-1]):
                if apply(d, Op.SUB) and only(d, Op.MUL) and _scale(section, c):
                    fused.update((v.id, d))
                    break
    return frozenset(fused)


def draws(section: pp.Section, index: int, fused: frozenset[int],
          drawn: set[int] | None) -> tuple[CRandom, ...]:
    """The random values a reader of value `index` needs drawn first: each it reads (through
    the fused values it computes itself) not drawn yet in the section (`drawn`, updated; None:
    the row kernel, whose references call Philox inline)."""
    if drawn is None:
        return ()
    reads, stack = set(), [index]
    while stack:
        value = section.values[stack.pop()]
        kind = value.kind
        if isinstance(kind, pp.RandomValue):
            reads.add(value.id)
        elif value.id == index or value.id in fused:  # what its expression reads
            stack += (kind.args if isinstance(kind, dag.Apply) else
                      (kind.arg,) if isinstance(kind, (dag.Cast, pp.RowReduction)) else ())
    new = sorted(reads - drawn)
    drawn.update(new)
    return tuple(CRandom(f"v{r}", section.values[r].kind.seed, section.values[r].kind.offset,
                         section.values[r].kind.transposed) for r in new)


def drawing(items: tuple[CRandom, ...]) -> list[CStatement]:
    """A "random" statement drawing `items` in a loop of its own (for a reader that is no tile
    run: a tile run draws in its own loop, CStatement.draws)."""
    return [CStatement("random", values=items)] if items else []


def _runs(section: pp.Section, ids: tuple[int, ...], refs: list[str],
          fold: tuple[int, ...] = (), ops=OP_CPP, fused: frozenset[int] = frozenset(),
          exp_of_difference: str = "", reciprocal: bool = False,
          unmask: tuple[int, ...] = (), drawn: set[int] | None = None) -> list[CStatement]:
    """Compute runs of the values `ids`, the random values each reads drawn first (`draws`):
    by the tile run holding it (its values read them in the loop that draws them), else by a
    "random" statement before it."""
    runs: list[CStatement] = []
    for index in ids:
        value = section.values[index]
        new = draws(section, index, fused, drawn)
        if isinstance(value.kind, pp.RowReduction):
            combine, merge, identity = REDUCE[value.kind.op]
            item = CReduce(f"v{index}", refs[value.kind.arg], literal(identity), combine,
                           merge)
            runs += drawing(new) + [CStatement("reduce", values=(item,))]
            continue
        kind = value.rank.value
        if kind != "tile":
            runs += drawing(new)
            new = ()
        item = CValue(f"v{index}", _expression(value, refs, ops, section, fused,
                                               exp_of_difference, reciprocal), index in fold,
                      refs[value.kind.args[1]] if index in unmask else "")
        if runs and runs[-1].kind == kind:
            runs[-1] = CStatement(kind, values=runs[-1].values + (item,),
                                  draws=runs[-1].draws + new)
        else:
            runs.append(CStatement(kind, values=(item,), draws=new))
    return runs


def _arch_guard(plan: pp.ProgramPlan):
    """The project's arch gates (kgen/targets/common/arch_guard.py) for a program: mma.sync code
    (no wgmma), so sm_90a's is the 'planned for sm_90a' gate."""
    return guard_for(plan.name, plan.arch, wgmma=False)


def _header(plan: pp.ProgramPlan, source_name: str, source_hash: str, command: str) -> list[str]:
    """The .cu's first lines, as a gemm's (kgen/targets/common/operands.header)."""
    return [f"{plan.name}.cu: generated by kgen {__version__} from {source_name} "
            f"(sha256 {source_hash}). Do not edit.",
            f"Regenerate with: {command}",
            f"Target {plan.arch.value}; a {plan.kind} kernel; {plan.threads} threads; "
            f"{plan.smem_bytes} bytes of shared memory. The plan: kgen inspect"]


CTYPES = {"ptr": "const void*", "i64": "long long", "i32": "int", "f32": "float"}


# What each kind of member holds, for its comment in the params struct (by name suffix)
_STRIDES = {"_ld": "rows apart", "_bs": "batches apart", "_hs": "heads apart"}
_SIZES = {"rows": "rows per (batch, head)", "loop_len": "the loop's length",
          "rows_total": "rows of every packed sequence together",
          "loop_total": "the loop's length over every packed sequence together",
          "heads": "query heads", "group": "query heads per KV head (GQA; 1: one KV head each)",
          "batches": "batches (grid.z)"}


# A block mask's lists (plan.bounds.listed), by parameter kind: their pointers' comments
BLOCK_LISTS = {"block_counts": "a block mask's counts (int32, [batches, heads, row tiles])",
               "block_indices": "a block mask's block indices (int32, [batches, heads, row "
                                "tiles, blocks])"}


def _fields(plan: pp.ProgramPlan) -> list[dict]:
    """The params struct's members (C++ type, name, comment), for common/params_struct.inc.j2:
    the struct the gemms' .cu and .h share, under the same guard."""
    out = []
    for f in plan.fields:
        if f.ctype == "ptr" and f.param is None:  # a DAG loop's deterministic semaphores
            out.append(dict(ctype="int*", name=f.name, comment="deterministic mode's semaphores "
                            "(int32): the workspace, <name>_workspace_bytes(p) of it"))
        elif f.ctype == "ptr" and plan.param(f.param).kind == "offsets":
            out.append(dict(ctype="const int*", name=f.name,
                            comment="offsets of the packed sequences (int32, batches + 1)"))
        elif f.ctype == "ptr" and plan.param(f.param).kind in BLOCK_LISTS:
            out.append(dict(ctype="const int*", name=f.name,
                            comment=BLOCK_LISTS[plan.param(f.param).kind]))
        elif f.param is not None and plan.param(f.param).kind in BLOCK_LISTS:
            stride = {"_ld": "tiles of rows apart", **_STRIDES}[f.name[len(f.param):]]
            out.append(dict(ctype=CTYPES[f.ctype], name=f.name,
                            comment=f"{f.param}'s stride in elements: {stride}"))
        elif f.ctype == "ptr":
            p = plan.param(f.param)
            const = "" if p.role.value == "out" else "const "
            out.append(dict(ctype=f"{const}{p.dtype.cpp}*", name=f.name,
                            comment=f"{p.kind} {p.name} ({p.dtype.dsl_name}, {p.role.value})"))
        elif f.param is None:
            out.append(dict(ctype=CTYPES[f.ctype], name=f.name, comment=_SIZES[f.name]))
        elif f.name == f.param:
            positive = " (declared positive: > 0)" if plan.param(f.param).positive else ""
            out.append(dict(ctype=CTYPES[f.ctype], name=f.name,
                            comment=f"scalar {f.name}{positive}"))
        else:
            stride = _STRIDES[f.name[len(f.param):]]
            out.append(dict(ctype=CTYPES[f.ctype], name=f.name,
                            comment=f"{f.param}'s stride in elements: {stride}"))
    return out


def _aligned(plan: pp.ProgramPlan) -> list[dict]:
    """The tensors whose address and strides the host API checks for 16-byte alignment (every
    tensor: the kernels copy 16-byte chunks), with their stride members and element bytes."""
    return [dict(name=p.name, bytes=p.dtype.nbytes,
                 strides=[f.name for f in plan.fields if f.param == p.name and f.name != p.name])
            for p in plan.params if p.kind == "tensor"]


def _loop_chunks(plan: pp.ProgramPlan) -> str | None:
    """The streamed operand read across the loop's dimension in 16-byte chunks (the loop's
    length must then be a multiple of 8), or None."""
    if not isinstance(plan, pp.LoopPlan):
        return None
    return next((t.param for t in (plan.b_tile, plan.c_tile) if not t.rows_along_loop), None)


def _params_guard(plan: pp.ProgramPlan) -> str:
    return f"KGEN_{plan.name.upper()}_PARAMS_DEFINED"


@dataclass(frozen=True, slots=True)
class CBound:
    """A mask's bound for the skeleton: `col op slope * row + offset`; the row of the tile
    (row_lo, row_hi) where some row keeps the most columns (`any_row`) and where every row
    keeps the columns (`all_row`), and the offset's terms (coef: a literal; term: "one",
    "scalar", "rows", "loop_len"; param: the scalar)."""

    op: str
    upper: bool
    strict: str  # "true" or "false"
    slope: int
    any_row: str
    all_row: str
    terms: tuple[dict, ...]
    kind: str = "linear"


@dataclass(frozen=True, slots=True)
class CEqual:
    """A mask's `row_vector[row] == col_vector[col]` for the skeleton (plan EqualBound): the
    two vectors' parameters (templates/common/loop_bounds.inc.j2 scans them)."""

    row_vector: pp.ProgramParam
    col_vector: pp.ProgramParam
    kind: str = "equal"


def _bounds(plan: pp.LoopPlan) -> list[CBound | CEqual]:
    """The skeleton's bounds: the linear ones, then the equalities (scanned per tile)."""
    out: list[CBound | CEqual] = []
    for b in plan.bounds.bounds:
        high = "row_hi" if b.slope >= 0 else "row_lo"
        low = "row_lo" if b.slope >= 0 else "row_hi"
        # upper: the most columns at the row where slope * row is largest; lower: smallest
        any_row, all_row = (high, low) if b.upper else (low, high)
        op = ("<" if b.strict else "<=") if b.upper else (">" if b.strict else ">=")
        terms = tuple(dict(coef=literal(t.coef), term=t.term.value, param=t.param)
                      for t in b.offset)
        out.append(CBound(op, b.upper, "true" if b.strict else "false", b.slope, any_row,
                          all_row, terms))
    out += [CEqual(plan.param(q.row_vector), plan.param(q.col_vector))
            for q in plan.bounds.equalities]
    return out


# The mma.sync skeleton spells exp(x) as exp_fast(x) (templates/common/loop_mma.inc.j2): a
# multiply by log2(e) and the MUFU's ex2 (relative error about 2^-22, results below 2^-126 flushed
# to 0), where expf's full-range path takes about 8 instructions: the softmax issues one per
# score, in the same issue slots as the mma.sync of the two gemms. exp(a - b) is exp_diff(a, b):
# one multiply-add a * log2(e) - b * log2(e) (b's product once per row) and the ex2.
FAST_EXP_OPS = {**OP_CPP, Op.EXP: "exp_fast({0})"}
FAST_EXP_OF_DIFFERENCE = "exp_diff({0}, {1})"
# With a factor c that is the same for a row's elements (a scalar, a row's value): exp(c * a - b)
# and exp(c * (a - b)) are one multiply-add too, c log2 e computed once; the softmax's scale
# multiplies no score of its own. The forward loops take them (statements' scaled_exp); the
# backward's (loop_dag) do not: at 255 registers its P = exp(scale * acc - lse) so spelled
# spilled 24 B (sm_80 skeleton built for sm_90a, D 128) and its softcap build 12 B more.
FAST_EXP_DIFFERENCE_SCALED = "exp_diff_scaled({0}, {1}, {2})"  # a, c, b
FAST_EXP_SCALED_DIFFERENCE = "exp_scaled_diff({0}, {1}, {2})"  # a, b, c


def body_ops(plan: pp.LoopPlan, ops: dict) -> dict:
    """`ops` with the body's tanh as the plan spells it (plan.tanh: tanh_approx,
    templates/common/loop_helpers.inc.j2, where the plan takes the hardware's)."""
    return {**ops, Op.TANH: "tanh_approx({0})"} if approx_tanh(plan) else ops


def unmasked(plan: pp.LoopPlan) -> tuple[int, ...]:
    """The masks that read their kept value on a block mask's full block (none without)."""
    listed = plan.bounds.listed
    return listed.masks if listed is not None else ()


def approx_tanh(plan: pp.LoopPlan) -> bool:
    return plan.tanh.value == pp.TANH_APPROX


def reciprocal_division(plan: pp.LoopPlan) -> bool:
    return plan.division.value == pp.RECIPROCAL


def uses_random(plan: pp.ProgramPlan) -> bool:
    """Whether a section reads random(seed, offset): the skeleton then has philox_uniform."""
    sections = (plan.body, plan.epilogue) if isinstance(plan, pp.LoopPlan) else (plan.body,)
    return any(isinstance(v.kind, pp.RandomValue) for s in sections for v in s.values)


def emit_loop(plan: pp.LoopPlan, *, source_name: str, source_hash: str, command: str) -> str:
    body = statements(plan.body, "loop_len", fold=plan.bounds.fold,
                      ops=body_ops(plan, FAST_EXP_OPS), exp_of_difference=FAST_EXP_OF_DIFFERENCE,
                      scaled_exp=True, reciprocal=reciprocal_division(plan),
                      unmask=unmasked(plan))
    tail = statements(plan.epilogue, "kN1", acc="acc1", ops=FAST_EXP_OPS,
                      exp_of_difference=FAST_EXP_OF_DIFFERENCE, scaled_exp=True,
                      reciprocal=reciprocal_division(plan))
    return render(
        "common/loop.cu.j2", plan=plan, name=plan.name, ns=f"{plan.name}_cfg",
        header=_header(plan, source_name, source_hash, command), arch_guard=_arch_guard(plan),
        fields=_fields(plan), params_guard=_params_guard(plan), body=body, tail=tail,
        aligned=_aligned(plan), loop_chunks=_loop_chunks(plan),
        element=plan.dtype.cpp, bounds=_bounds(plan), listed=plan.bounds.listed,
        mma_ab=plan.dtype.dsl_name,
        carries=[(name, literal(init)) for name, init in plan.carries],
        pointers=[p for p in plan.params if p.kind in ("tensor", "vector")],
        philox=uses_random(plan), approx_tanh=approx_tanh(plan))


def emit_rows(plan: pp.RowsPlan, *, source_name: str, source_hash: str, command: str) -> str:
    body = statements(plan.body, "kCols", sizes=("p.rows", "p.loop_len"), staged=True)
    inputs = [p for p in plan.params if p.kind == "tensor" and p.role.value == "in"]
    return render(
        "common/rows.cu.j2", plan=plan, name=plan.name, ns=f"{plan.name}_cfg",
        header=_header(plan, source_name, source_hash, command), arch_guard=_arch_guard(plan),
        fields=_fields(plan), params_guard=_params_guard(plan), body=body, inputs=inputs,
        bounds=[],
        aligned=_aligned(plan), loop_chunks=None,
        pointers=[p for p in plan.params if p.kind != "scalar"], philox=uses_random(plan))


def emit_header(plan: pp.ProgramPlan, *, source_name: str, source_hash: str, command: str,
                header_name: str | None = None) -> str:
    """The .h of a program: include guard, the params struct, the launcher's declaration."""
    return render("common/program_header.h.j2", name=plan.name, fields=_fields(plan),
                  params_guard=_params_guard(plan),
                  header=header_file_lines(plan, source_name, source_hash, command, header_name),
                  include_guard=f"KGEN_{plan.name.upper()}_H")


def emit(plan: pp.ProgramPlan, *, source_name: str, source_hash: str, command: str) -> str:
    """The .cu of a program plan: its skeleton by kind (one per kind, the same for sm_80 and
    sm_90a: mma.sync)."""
    emitter = emit_loop if isinstance(plan, pp.LoopPlan) else emit_rows
    return emitter(plan, source_name=source_name, source_hash=source_hash, command=command)
