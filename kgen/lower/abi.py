"""ABI pass: the kernel's parameter block and what each argument must satisfy.

Fields come in a fixed order: pointers (declaration order), runtime sizes (first appearance),
leading dimensions (one per tensor), scalars. The runtime packs the same fields with ctypes.
"""
from __future__ import annotations

from typing import Collection, Mapping

from .. import ir
from ..errors import KgenError
from ..plan import Alignment, BlockDim, DimRule, FieldKind, GemmPlan, Param, ParamField
from ..targets import Candidate
from ..targets.rules import Refusal
from . import swizzle


def _pointer_type(p: ir.Param) -> str:
    const = "const " if p.role is ir.Role.IN else ""
    return f"{const}{p.dtype.cpp}*"


def params(kernel: ir.Kernel) -> tuple[Param, ...]:
    """The kernel's parameters as the plan carries them (no source locations)."""
    return tuple(Param(p.name, p.kind, p.dtype, p.shape, p.layout, p.role, p.default,
                       batch=p.batch, positive=p.positive)
                 for p in kernel.params)


def fields(kernel: ir.Kernel) -> tuple[ParamField, ...]:
    # scalar outputs (reductions to one value) are written through a pointer
    arrays = [p for p in kernel.params if p.kind is not ir.ParamKind.SCALAR or p.role is ir.Role.OUT]
    out = [ParamField(p.name, FieldKind.POINTER, _pointer_type(p), param=p.name) for p in arrays]
    if kernel.deterministic and _has_reduction(kernel) or _split(kernel):
        out.append(ParamField("workspace", FieldKind.WORKSPACE, "float*"))
    dims: list[str] = []
    for p in arrays:
        dims += [d for d in p.full_shape if isinstance(d, str) and d not in dims]
    out += [ParamField(d, FieldKind.SIZE, "int", dim=d) for d in dims]
    out += [
        ParamField(f"ld_{p.name}", FieldKind.LEADING_DIM, "long long", param=p.name)
        for p in arrays
        if p.kind is ir.ParamKind.TENSOR
    ]
    out += [
        ParamField(f"batch_{p.name}", FieldKind.BATCH_STRIDE, "long long", param=p.name)
        for p in arrays
        if p.batch is not None
    ]
    out += [
        ParamField(p.name, FieldKind.SCALAR, "float", param=p.name, default=p.default)
        for p in kernel.params
        if p.kind is ir.ParamKind.SCALAR and p.role is ir.Role.IN
    ]
    seen: dict[str, ParamField] = {}
    for f in out:
        if f.name in seen:
            other = kernel.param(f.param or seen[f.name].param or "")
            loc = other.loc if other else kernel.loc
            raise KgenError(
                loc, f"the name '{f.name}' is used both for a parameter and a dimension, a "
                "leading dimension or a batch stride; rename one"
            )
        seen[f.name] = f
    return tuple(out)


def block_dims(kernel: ir.Kernel) -> tuple[BlockDim, ...]:
    """The sizes of the block scales' tensors that count blocks (verify: names of their own,
    or numbers already equal): SA's [M, ceil(K / 128)], SB's [ceil(N / 128), ceil(K / 128)]."""
    out: list[BlockDim] = []
    for g in kernel.gemms:
        a, b = kernel.param(g.a.name), kernel.param(g.b.name)
        for s in g.scales:
            shape = kernel.param(s.param).shape
            counts = ((1, a.shape[1]),) if s.operand == g.a.name else (
                (0, b.shape[1]), (1, b.shape[0]))
            for axis, of in counts:
                rule = BlockDim(shape[axis], of, 128, s.param)
                if isinstance(rule.dim, str) and (rule.dim, of) not in [(r.dim, r.of) for r in out]:
                    out.append(rule)  # SA's and SB's K blocks: checked once
    return tuple(out)


def _split(kernel: ir.Kernel) -> bool:
    """`split S` with S > 1 or `split stream`: the partial sums go through the workspace."""
    return any(g.split is not None and (g.split.count > 1 or g.split.stream)
               for g in kernel.gemms)


def _has_reduction(kernel: ir.Kernel) -> bool:
    return any(g.epilogue.reductions for g in kernel.gemms)


def _fixed_rows_refusal(p: ir.Param, elems: int, copy_engine: bool) -> Refusal | None:
    """An operand whose contiguous rows (columns, for `col`) have a fixed length that is not a
    whole number of 16-byte chunks: its leading dimension could never pass the launch's check,
    so no contiguous tensor could run; refused here, at the declaration. `copy_engine`: the
    copy engine (TMA) loads it, else cp.async."""
    if p.kind is not ir.ParamKind.TENSOR:
        return None
    row = p.layout is ir.Layout.ROW
    extent = p.shape[1] if row else p.shape[0]
    if isinstance(extent, int) and extent % elems:
        dims = ", ".join(str(d) for d in p.shape)
        return Refusal(
            f"{p.name} : {p.dtype.dsl_name}[{dims}] {p.layout.value}: stored contiguously, its "
            f"{'rows' if row else 'columns'} are {extent} elements apart, but "
            + (f"the copy engine (TMA) loads it in rows of 16-byte multiples ({elems} elements)"
               if copy_engine else
               f"the mainloop copies 16-byte chunks ({elems} elements) with cp.async")
            + f", so no contiguous {p.name} could run; make that extent a multiple of {elems} "
            "(pad it with zeros)", loc=p.loc)
    return None


def _batch_multiple(p: ir.Param, elems: int) -> int:
    """A batched argument's batch stride keeps every batch's matrix as aligned as the first:
    a multiple of the elements its pointer's alignment spans (1: no rule)."""
    return elems if p.batch is not None else 1


# Why a gemm operand needs 16-byte aligned rows: how the fast entry point's mainloop loads it
CP_ASYNC = "the mainloop copies 16-byte chunks with cp.async"
COPY_ENGINE = "the copy engine (TMA) loads it, in rows of 16-byte multiples"


def of_schedule(kernel: ir.Kernel, gemms: list[GemmPlan], chosen: Candidate) -> dict:
    """requirements' arguments for the chosen candidate (`gemms`: the mainloop pass's plans for
    the source's warp grid): the operands, the narrow variant, the copy engine's loads, the
    column vectors and the epilogue tensors that need 16-byte rows."""
    sched = chosen.schedule
    operands = [op.param for g in gemms for op in (g.a, g.b)
                if op is not None and kernel.param(op.param) is not None]
    rows16 = {s: "the copy engine loads it into the output's staging"
              for s in sched.staged_inputs}
    if sched.wide_stores:  # the output's 16-byte chunks need 16-byte rows (columns)
        packed = chosen.gemms[-1].epilogue.staged_store
        rows16[packed.param] = (f"the epilogue writes it in 16-byte chunks of {16 // packed.dtype.nbytes} "
                                + ("rows" if packed.layout is ir.Layout.COL else "columns"))
    return dict(operands=operands, narrow=sched.entry.narrow,
                copy_engine={m.param for m in sched.tensor_maps if not m.store},
                column_vectors={v for g in gemms for v in g.epilogue.column_vectors},
                rows16=rows16)


def requirements(kernel: ir.Kernel, operands: list[str], narrow: bool = False,
                 **options) -> tuple[tuple[Alignment, ...], tuple[DimRule, ...]]:
    """_requirements, its refusal raised."""
    aligns, rules, refused = _requirements(kernel, operands, narrow, **options)
    if refused is not None:
        raise KgenError(refused.loc, refused.message)
    return aligns, rules


def refusal(kernel: ir.Kernel, operands: list[str], narrow: bool = False,
            **options) -> Refusal | None:
    """The rule of _requirements that refuses a fixed size (located), or None: the rulebook's
    interface rule (kgen/targets/rules.py)."""
    return _requirements(kernel, operands, narrow, **options)[2]


def _requirements(
    kernel: ir.Kernel, operands: list[str], narrow: bool = False, *,
    copy_engine: Collection[str] = (), column_vectors: Collection[str] = (),
    rows16: Mapping[str, str] | None = None,
) -> tuple[tuple[Alignment, ...], tuple[DimRule, ...], Refusal | None]:
    """Operands need 16-byte rows (cp.async chunks, or the copy engine's rules for those in
    `copy_engine`, the schedule's TMA loads), and so do the epilogue tensors in `rows16` (moved
    in 16-byte chunks or by the copy engine: why); the epilogue's paired accesses need even
    columns: other row-major tensors, and the vectors it reads at a column (`column_vectors`,
    bias[col]). A `v[row]` vector and a `col` epilogue tensor are read (and written) one element
    at a time: element alignment alone, which every argument needs. With a narrow variant
    (EntryPoints.narrow) these are the fast entry point's rules only: any argument that misses
    them runs the narrow one, so no fixed size is refused for them. The third value: the first
    of these rules a fixed size breaks (None: none)."""
    rows16 = rows16 or {}
    refused: Refusal | None = None
    aligns: list[Alignment] = []
    needs_even_n: list[ir.Dim] = []
    # a block scale is read one element at a time (__ldg of a float): element alignment alone
    scales = {s.param for g in kernel.gemms for s in g.scales}
    for p in kernel.params:
        if p.kind is ir.ParamKind.SCALAR or p.role is ir.Role.OUT and p.kind is not ir.ParamKind.TENSOR:
            continue
        if p.name in scales:
            continue
        if p.name in operands:
            elems = swizzle.CHUNK_BYTES // p.dtype.nbytes
            if not narrow and refused is None:
                refused = _fixed_rows_refusal(p, elems, p.name in copy_engine)
            aligns.append(
                Alignment(p.name, swizzle.CHUNK_BYTES, elems,
                          COPY_ENGINE if p.name in copy_engine else CP_ASYNC,
                          _batch_multiple(p, elems))
            )
        elif p.kind is ir.ParamKind.TENSOR and p.name in rows16:
            elems = swizzle.CHUNK_BYTES // p.dtype.nbytes
            aligns.append(Alignment(p.name, swizzle.CHUNK_BYTES, elems, rows16[p.name],
                                    _batch_multiple(p, elems)))
            if p.layout is ir.Layout.ROW:
                needs_even_n.append(p.shape[1])
        elif p.kind is ir.ParamKind.TENSOR and p.layout is ir.Layout.ROW:
            aligns.append(
                Alignment(p.name, 2 * p.dtype.nbytes, 2,
                          "the epilogue reads and writes two adjacent columns at once",
                          _batch_multiple(p, 2))
            )
            needs_even_n.append(p.shape[1])
        elif p.kind is ir.ParamKind.VECTOR and p.name in column_vectors:
            aligns.append(
                Alignment(p.name, 2 * p.dtype.nbytes, 1,
                          "the epilogue reads two adjacent elements at once",
                          _batch_multiple(p, 2))
            )
    if narrow:
        # the fast entry point computes every epilogue value in column pairs: an odd N would
        # reduce (or store, column-major) one column past the output, tensor outputs or not
        b = kernel.param(kernel.gemms[-1].b.name)
        if b is not None:
            needs_even_n.append(b.shape[1])
    # a fixed odd N (narrow variant only) keeps its rule: the fast entry point never runs
    rules = tuple(
        DimRule(d, 2, "the epilogue handles output columns in pairs")
        for d in dict.fromkeys(needs_even_n)
        if isinstance(d, str) or narrow and d % 2
    )
    for d in needs_even_n:
        if isinstance(d, int) and d % 2 and not narrow and refused is None:
            refused = Refusal(f"the output has {d} columns; kgen needs an even count",
                              loc=kernel.loc)
    return tuple(aligns), rules, refused
