"""Verify the gemms of a loop: which kind each is, and its operands' shapes (docs/language.md,
"Loops" and "The backward").

A loop's gemms run in statement order each iteration. Three kinds (ir.Gemm.accumulate says the
semantics):
- a *score gemm* `st = K @ Q^T` (not accumulating, A a tensor): A loop-invariant [rows, K0]
  (the loop's first gemm is one, and its A gives the kernel's rows), B [K0, loop dim] after its
  optional transpose; its result and its epilogue's values are *tiles* [rows, block];
- an *accumulating gemm* `dv += pt @ dO`: A a tile value bound in an earlier score gemm's
  epilogue (a local, or the gemm's own handed-on value), not transposed; B [loop dim, N]; the
  accumulator is [rows, N];
- a *loop-row gemm* `dq = dst^T @ K` (not accumulating, A a tile value transposed): B
  loop-invariant [rows, N]; its result is a *loop-row tile* [block, N] at the loop's rows, and
  only its own epilogue reads it, to add it into an `out accumulate` tensor.
K0 and N are compile-time multiples of 16 up to 256; operands share one dtype (checked by
kgen/verify/loops.py, which also checks the epilogues through kgen/verify/tile_epilogue.py).
"""
from __future__ import annotations

import enum

from .. import ir
from ..diagnostics import loop_row_message
from ..diagnostics import at_line, did_you_mean, first_located, loc_of, quote, shape_text, shown
from ..errors import KgenError
from ..ir import DType
from .epilogue import local_refs
from .gemms import operand_param
from .state import KernelState, require_str

__all__ = ["Kind", "is_forward_loop", "kind_of", "check_score_gemm", "check_accumulating_gemm",
           "check_loop_row_gemm", "after_loop_groups", "MAX_OPERAND_COLS"]

MAX_OPERAND_COLS = 256  # K0 and N: multiples of 16 up to this


class Kind(enum.Enum):
    SCORE = "score gemm"
    ACCUMULATING = "accumulating gemm"
    LOOP_ROW = "loop-row gemm"


def is_forward_loop(loop: ir.Loop) -> bool:
    """The forward's form, which the LoopPlan's skeletons (sm_80, sm_90a) run: a score gemm,
    then an accumulating gemm whose A is the score gemm's own handed-on value. A verified loop
    of any other form (the backward's: more gemms, a tile value as A, a loop-row gemm and its
    `+=` store) is a DAG loop (kgen/lower/loop_dag.py), whose score gemms may store a tile."""
    if len(loop.gemms) != 2:
        return False
    g0, g1 = loop.gemms
    return g1.accumulate and g1.a.name == g0.name and not g1.a.transposed


def kind_of(state: KernelState, g: ir.Gemm) -> Kind:
    """A gemm's kind by its form: `+=` accumulates; otherwise a tensor A makes a score gemm and
    a value A (transposed or not: verify says which it must be) a loop-row gemm."""
    if g.accumulate:
        return Kind.ACCUMULATING
    if isinstance(g.a, ir.OperandRef) and g.a.name not in state.params:
        return Kind.LOOP_ROW
    return Kind.SCORE


def _start(state: KernelState, loop: ir.Loop, g: ir.Gemm):
    loc = first_located(g.loc, loop.loc)
    state.define(require_str(g.name, loc, "a gemm name"), "gemm", loc)
    _no_schedule_lines(loop, g, loc)
    _check_acc_dtype(g, loc)
    return loc, first_located(g.a.loc, loc), first_located(g.b.loc, loc)


def check_score_gemm(state: KernelState, loop: ir.Loop, g: ir.Gemm, lead: ir.Param | None):
    """`st = A @ B`: returns (A, B) as parameters. `lead` is the first score gemm's A (None for
    the first itself): every score gemm's A has its rows and heads."""
    loc, a_loc, b_loc = _start(state, loop, g)
    if g.accumulate:  # the loop's first gemm, written with +=
        raise KgenError(loc, f"the first gemm of loop '{loop.name}' computes a new tile each "
                             f"block: write 'gemm {g.name} = ...' (the gemms after it may "
                             "accumulate, +=)")
    a = operand_param(state, g, g.a, "A", a_loc)
    if g.a.transposed:
        raise KgenError(a_loc, f"only a B operand can be transposed; the A operand '{a.name}' "
                               "holds the kernel's rows")
    if lead is not None and (a.shape[0] != lead.shape[0] or a.heads != lead.heads):
        raise KgenError(a_loc, f"every score gemm of loop '{loop.name}' computes the kernel's "
                               f"rows: '{a.name}' is {shape_text(a.full_shape)} but '{lead.name}'"
                               f" (gemm A of the first) is {shape_text(lead.full_shape)}")
    b = _tensor_b(state, loop, g, b_loc)
    b_shape = _operand_shape(b, g.b)
    b_text = f"{b.name}^T" if g.b.transposed else b.name
    if a.shape[1] != b_shape[0]:
        raise KgenError(b_loc, f"inner dimensions differ: {a.name} is {shape_text(a.shape)} but "
                               f"{b_text} is {shape_text(b_shape)}")
    if b_shape[1] != loop.dim:
        raise KgenError(b_loc, f"loop '{loop.name}' runs over {loop.dim}, so the B operand of "
                               f"gemm '{g.name}' needs {loop.dim} columns; {b_text} is "
                               f"{shape_text(b_shape)}")
    what = f"K0, the columns of '{a.name}' (the k of gemm '{g.name}')"
    compile_time_cols(a.shape[1], what, a_loc)
    return a, b


def _value_a(state: KernelState, loop: ir.Loop, g: ir.Gemm, values: dict, loop_rows: dict,
             a_loc, example: str) -> None:
    """A tile value as A: bound before this gemm, in a score gemm's epilogue."""
    name = g.a.name
    if not isinstance(name, str):
        raise KgenError(a_loc, f"an operand name must be a string, got {shown(name)}")
    if name in loop_rows:
        g_row = loop_rows[name]
        raise KgenError(a_loc, loop_row_message(name, g_row.a.name, g_row.b.name))
    if name in values:
        return
    kind = state.names.get(name, ("",))[0]
    later = [h for h in loop.gemms if isinstance(h, ir.Gemm) and _binds(h, name)]
    if kind == "gemm":  # a score gemm whose epilogue does not hand its value on
        raise KgenError(first_located(loc_of(state.kernel.gemm(name) or _gemm(loop, name)),
                                      a_loc),
                        f"gemm '{name}' feeds gemm '{g.name}' but its epilogue never sets "
                        f"'{name}' (add e.g. '{name} = acc')")
    if later:
        raise KgenError(a_loc, f"'{name}' is not bound yet: gemm '{g.name}' reads it before "
                               f"gemm '{later[0].name}'{_at(later[0])} binds it; the loop's "
                               "statements run in order")
    if state.params.get(name) is not None:
        raise KgenError(a_loc, f"the {example}")
    known = list(values)
    raise KgenError(a_loc, f"unknown operand {quote(name)}: the A operand of gemm '{g.name}' is "
                           f"a tile value of an earlier score gemm's epilogue"
                           f"{did_you_mean(name, known)}")


def _gemm(loop: ir.Loop, name: str):
    return next((h for h in loop.gemms if getattr(h, "name", None) == name), None)


def _at(g: ir.Gemm) -> str:
    return at_line(g.loc)


def _binds(g: ir.Gemm, name: str) -> bool:
    stmts = getattr(getattr(g, "epilogue", None), "stmts", ())
    return any(isinstance(s, ir.Let) and s.name == name for s in stmts) or (
        g.name == name and any(isinstance(s, ir.Store) and s.target == name for s in stmts))


def check_accumulating_gemm(state: KernelState, loop: ir.Loop, g: ir.Gemm, values: dict,
                            loop_rows: dict, first: ir.Gemm) -> ir.Param:
    """`o += t @ C`: t a tile value, C [loop dim, N]. Returns C."""
    loc, a_loc, b_loc = _start(state, loop, g)
    example = (f"accumulating gemm '{g.name}' of loop '{loop.name}' multiplies a tile value of "
               f"an earlier score gemm's epilogue: write 'gemm {g.name} += {first.name} @ ...'")
    _value_a(state, loop, g, values, loop_rows, a_loc, example)
    if g.a.transposed:
        raise KgenError(a_loc, f"the A operand of accumulating gemm '{g.name}' is a tile value "
                               f"as it is, [rows, block]; '{g.a.name}^T' is its transpose "
                               f"(a loop-row gemm's A: 'gemm x = {g.a.name}^T @ ...')")
    c = _tensor_b(state, loop, g, b_loc)
    if g.b.transposed:
        raise KgenError(b_loc, f"only a score gemm's B operand can be transposed for now; "
                               f"declare '{c.name}' with {loop.dim} rows (the other layout, "
                               "row or col, if its memory is the transpose)")
    if c.shape[0] != loop.dim:
        raise KgenError(b_loc, f"loop '{loop.name}' runs over {loop.dim}, so the B operand of "
                               f"gemm '{g.name}' needs {loop.dim} rows; {c.name} is "
                               f"{shape_text(c.shape)}")
    compile_time_cols(c.shape[1], f"N1, the columns of '{c.name}' (the n of gemm '{g.name}')",
                      b_loc)
    if g.epilogue.stmts:
        raise KgenError(first_located(g.epilogue.loc, loc),
                        f"an accumulating gemm has no epilogue of its own; read '{g.name}' in "
                        "the kernel's epilogue, after the loop")
    return c


def check_loop_row_gemm(state: KernelState, loop: ir.Loop, g: ir.Gemm, values: dict,
                        loop_rows: dict, lead: ir.Param) -> ir.Param:
    """`dq = t^T @ Z`: t a tile value transposed, Z loop-invariant [rows, N]. Returns Z."""
    loc, a_loc, b_loc = _start(state, loop, g)
    example = (f"gemm '{g.name}' of loop '{loop.name}' reads a tensor A, so it is a score gemm")
    _value_a(state, loop, g, values, loop_rows, a_loc, example)
    if not g.a.transposed:
        raise KgenError(a_loc, f"gemm '{g.name}' multiplies tile value '{g.a.name}' [rows, "
                               f"block] without accumulating: write 'gemm {g.name} += "
                               f"{g.a.name} @ ...' (an accumulator), or 'gemm {g.name} = "
                               f"{g.a.name}^T @ ...' (a loop-row tile, added into an "
                               "'out accumulate' tensor)")
    z = _tensor_b(state, loop, g, b_loc)
    if g.b.transposed:
        raise KgenError(b_loc, f"the B operand of loop-row gemm '{g.name}' is loop-invariant "
                               f"[{lead.shape[0]}, N] as declared; it cannot be transposed for "
                               "now")
    if z.shape[0] != lead.shape[0] or z.heads != lead.heads:
        raise KgenError(b_loc, f"'{g.a.name}^T' is [{loop.dim}, {lead.shape[0]}] (the loop's "
                               f"block by the kernel's rows), so the B operand of gemm "
                               f"'{g.name}' is the kernel's rows of a tensor like "
                               f"'{lead.name}', {shape_text(lead.full_shape[:-1] + ('N',))}; "
                               f"'{z.name}' is {shape_text(z.full_shape)}")
    compile_time_cols(z.shape[1], f"N, the columns of '{z.name}' (the n of gemm '{g.name}')",
                      b_loc)
    return z


def _tensor_b(state: KernelState, loop: ir.Loop, g: ir.Gemm, b_loc) -> ir.Param:
    name = g.b.name
    if isinstance(name, str) and name not in state.params and any(
            _binds(h, name) for h in loop.gemms if isinstance(h, ir.Gemm)):
        raise KgenError(b_loc, f"'{name}' is a tile value: it can only be a gemm's A operand "
                               f"(from registers); the B operand of gemm '{g.name}' is a tensor")
    return operand_param(state, g, g.b, "B", b_loc)


def _no_schedule_lines(loop: ir.Loop, g: ir.Gemm, loc) -> None:
    """A gemm in a loop takes no schedule line: the loop's tile, warps and stages are its."""
    for attr, cls in (("a", ir.OperandRef), ("b", ir.OperandRef), ("epilogue", ir.Epilogue)):
        if not isinstance(getattr(g, attr), cls):
            raise KgenError(loc, f"gemm '{g.name}': {attr} must be a kgen.ir.{cls.__name__}")
    lines = (("tile", g.tile), ("warps", g.warps), ("stages", g.stages), ("split", g.split),
             ("cluster", g.cluster))
    for what, node in lines:
        if node is not None:
            raise KgenError(
                first_located(loc_of(node), loc),
                f"gemm '{g.name}' is in loop '{loop.name}': its {what} line goes on the loop "
                f"(loop {loop.name} over {loop.dim} {{ tile 128x64  warps 8  stages 2 ... }})",
            )
    if g.keep is not None or g.resident:
        raise KgenError(first_located(g.resident_loc or loc, loc),
                        f"gemm '{g.name}' is in loop '{loop.name}': keep applies to chains "
                        "outside loops")


def _check_acc_dtype(g: ir.Gemm, loc) -> None:
    if g.acc_dtype is not DType.F32:
        name = getattr(g.acc_dtype, "dsl_name", None) or shown(g.acc_dtype)
        raise KgenError(loc, f"gemm '{g.name}' accumulates in {name}; a loop's gemms accumulate "
                             "in f32")


def _operand_shape(param: ir.Param, ref: ir.OperandRef) -> tuple:
    if not isinstance(ref.transposed, bool):
        raise KgenError(ref.loc, f"transposed must be True or False, got {shown(ref.transposed)}")
    return tuple(reversed(param.shape)) if ref.transposed else param.shape


def compile_time_cols(value: object, what: str, loc) -> None:
    if not isinstance(value, int) or isinstance(value, bool):
        raise KgenError(loc, f"{what} must be a compile-time size (a multiple of 16 up to "
                             f"{MAX_OPERAND_COLS}), got {quote(value)}")
    if value % 16 or value > MAX_OPERAND_COLS:
        raise KgenError(loc, f"{what} must be a multiple of 16 up to {MAX_OPERAND_COLS}, got "
                             f"{value}")


def after_loop_groups(stmts: tuple, widths: dict[str, int],
                      columns: dict[str, int]) -> tuple[tuple[int, tuple], ...]:
    """The kernel's epilogue of a loop by the accumulators' N (`widths`: accumulator -> N, in
    statement order), as (N, its statements) per N in that order: each works on its own
    [rows, N] tile (the attention backward's `dK = scale * dk` at D, `dV = dv` at D_v). A
    statement's N is that of the accumulators it reads, through locals too; one reading
    accumulators of two N is refused (no one tile holds it). A local reading none goes with the
    statements reading it (refused where those have two N); a store reading none, with the N of
    its tensor's columns (`columns`: output -> columns), else the first. One N: one group, the
    statements as written; every N has its group (empty where no statement reads it). The
    verifier refuses with it; the lowering groups with it."""
    order = list(dict.fromkeys(widths.values()))
    if len(order) <= 1:
        return ((order[0] if order else 0, tuple(stmts)),)
    local_n: dict[str, set[int]] = {}  # local -> the N of the accumulators it reads
    own: list[set[int]] = []
    for stmt in stmts:
        names = local_refs(getattr(stmt, "value", None))
        found = {widths[n] for n in names if n in widths}
        for n in names:
            found |= local_n.get(n, set())
        if len(found) > 1:
            what = (f"local '{stmt.name}'" if isinstance(stmt, ir.Let) else
                    f"the store of '{getattr(stmt, 'target', '?')}'")
            _refuse_widths(stmt, found, widths, f"{what} reads accumulators of different widths",
                           "store each accumulator's value on its own")
        if isinstance(stmt, ir.Let):
            local_n[stmt.name] = found
        own.append(found)
    # last to first: a statement reading no accumulator takes its readers' N (a local) or its
    # tensor's (a store)
    placed: list[int] = [0] * len(stmts)
    needed: dict[str, set[int]] = {}
    for i in reversed(range(len(stmts))):
        stmt = stmts[i]
        if own[i]:
            ns = own[i]
        elif isinstance(stmt, ir.Let):
            ns = needed.get(stmt.name, set())
            if len(ns) > 1:
                _refuse_widths(stmt, ns, widths, f"local '{stmt.name}' is read by statements "
                               "of different widths", "bind one local per width")
        else:
            n = columns.get(getattr(stmt, "target", None))
            ns = {n} if n in order else set()
        placed[i] = next(iter(ns), order[0])
        for name in local_refs(getattr(stmt, "value", None)):
            if name in local_n and not local_n[name]:
                needed.setdefault(name, set()).add(placed[i])
    groups: dict[int, list] = {n: [] for n in order}
    for stmt, n in zip(stmts, placed):
        groups[n].append(stmt)
    return tuple((n, tuple(group)) for n, group in groups.items())


def _refuse_widths(stmt, found: set[int], widths: dict[str, int], what: str, fix: str) -> None:
    parts = " and ".join(", ".join(f"'{a}'" for a, w in widths.items() if w == n) + f" N {n}"
                         for n in sorted(found))
    raise KgenError(stmt.loc, f"{what} ({parts}): after the loop a statement works on the "
                    f"[rows, N] tile of the accumulators of one N; {fix}")
