"""Tile programs: a verified loop kernel (`Kernel.loop`) or row kernel (no gemm, only
`Kernel.epilogue`) to its plan (kgen/plan/program.py).

The loop's configuration (tile_m, block, warps, stages) comes from the source or, where a line
is left out, from the rulebook (kgen/targets/loop_rules.py): asked once, never learned by
catching errors. The statements are lowered in order into sections of typed values: a carry's
reads after an `Update` are the updated value itself, so sharing (structural, as the epilogue
pass does it) never merges a carry before and after an update.
"""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field

from .. import ir
from ..errors import NOWHERE, KgenError
from ..plan import epilogue as dag
from ..plan import loop_dag as ld
from ..plan import program as pp
from ..plan.program import Rank
from ..targets import target
from ..targets import loop_rules
from . import loop_bounds
from . import packed as packed_program
from ..verify.loop_gemms import is_forward_loop  # the LoopPlan's form, else a DAG loop
from ..targets.sm90 import loop_schedule

_ORDER = {Rank.UNIFORM: 0, Rank.ROW: 1, Rank.TILE: 2}
# A block mask's walk keeps its lists' offsets, the visit counts and the block live across the
# loop (a few registers a thread): counted as this many values per element past those the
# rulebook's estimate covers at 32 rows a warp. NVRTC 13, sm_80, D 128 at 128x32 with 32 rows a
# warp (the estimate's 252 of 255 without them): 255 registers and 8-24 B of spills with the
# lists; with this, 16 rows a warp at 128x64, 190-224 registers; D 64 and 96 keep 32 rows a
# warp with no spill (kgen.attention's programs, tests/test_block_mask.py)
LISTED_VALUES = 1
# the rank of a position, and of a vector indexed by it: batch and head are one per CTA
_POSITION_RANK = {ir.Axis.ROW: Rank.ROW, ir.Axis.COL: Rank.TILE, ir.Axis.BATCH: Rank.UNIFORM,
                  ir.Axis.HEAD: Rank.UNIFORM}


def run(kernel: ir.Kernel, arch: ir.Arch | None = None) -> pp.ProgramPlan | ld.LoopDagPlan:
    arch = arch or kernel.target
    if kernel.compute_dtype is not ir.DType.F32:
        raise KgenError(kernel.loc, "a loop or row kernel computes in f32 (compute "
                        f"{kernel.compute_dtype.dsl_name} is not supported there)")
    if kernel.loop is not None and not is_forward_loop(kernel.loop):
        from . import loop_dag  # a loop over a DAG of gemms (the backward's): its own module

        return loop_dag.run(kernel, arch)
    if kernel.loop is not None:
        return _loop(kernel, arch)
    return _rows(kernel, arch)


# ---------------------------------------------------------------------------------------------
# Values and statements


@dataclass
class _Section:
    kernel: ir.Kernel
    # what a name reads: Let locals, carries (their current value), accumulators
    env: dict[str, int] = field(default_factory=dict)
    values: list[pp.Value] = field(default_factory=list)
    memo: dict[tuple, int] = field(default_factory=dict)
    statements: list[pp.Statement] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)
    acc: str | None = None  # what `acc` reads: the first gemm's accumulator in the loop body

    def add(self, kind: pp.NodeKind, rank: Rank) -> int:
        key = (kind, rank)
        if key in self.memo:
            return self.memo[key]
        self.values.append(pp.Value(len(self.values), kind, rank))
        index = len(self.values) - 1
        self.memo[key] = index
        if isinstance(kind, (dag.Apply, dag.Cast, pp.RowReduction)):
            self.pending.append(index)  # computed where first needed
        return index

    def rank(self, index: int) -> Rank:
        return self.values[index].rank

    def statement(self, stmt: pp.Statement) -> None:
        self.flush()
        self.statements.append(stmt)

    def flush(self) -> None:
        if self.pending:
            self.statements.append(pp.Compute(tuple(self.pending)))
            self.pending = []

    def value(self, node: ir.Expr) -> int:
        if isinstance(node, ir.LocalRef):
            assert node.name in self.env, f"unverified IR: {node.name} read before it is bound"
            return self.env[node.name]
        if isinstance(node, ir.Acc):
            assert self.acc is not None, "unverified IR: acc outside a gemm's epilogue"
            return self.add(dag.Accumulator(), Rank.TILE)
        if isinstance(node, ir.Const):
            return self.add(dag.Constant(_single(node.value)), Rank.UNIFORM)
        if isinstance(node, ir.ScalarLoad):
            return self.add(dag.ScalarArg(node.name), Rank.UNIFORM)
        if isinstance(node, ir.Position):
            return self.add(pp.PositionValue(node.axis), _POSITION_RANK[node.axis])
        if isinstance(node, ir.Random):
            return self.add(pp.RandomValue(node.seed, node.offset, node.transposed), Rank.TILE)
        if isinstance(node, ir.Extent):
            loop = self.kernel.loop is not None and node.dim == self.kernel.loop.dim
            return self.add(pp.ExtentValue(node.dim, loop), Rank.UNIFORM)
        if isinstance(node, ir.VectorLoad):
            p = self.kernel.param(node.name)
            return self.add(dag.VectorLoad(p.name, node.axis, p.dtype),
                            _POSITION_RANK[node.axis])
        if isinstance(node, ir.TensorLoad):
            p = self.kernel.param(node.name)
            return self.add(dag.TensorLoad(p.name, p.dtype, p.layout), Rank.TILE)
        if isinstance(node, ir.Call):
            args = tuple(self.value(a) for a in node.args)
            rank = max((self.rank(a) for a in args), key=_ORDER.__getitem__)
            return self.add(dag.Apply(node.op, args), rank)
        if isinstance(node, ir.Cast):
            arg = self.value(node.arg)
            if node.dtype is ir.DType.F32:
                return arg
            return self.add(dag.Cast(node.dtype, arg), self.rank(arg))
        if isinstance(node, ir.Reduce):
            if node.axis is not ir.Axis.ROW:
                raise KgenError(node.loc, "only row reductions (rowsum, rowmax, rowmin, "
                                "rowabsmax) are values in a loop or row kernel")
            arg = self.value(node.arg)
            if self.rank(arg) is not Rank.TILE:
                raise KgenError(node.loc, "a row reduction needs a tile value (one per "
                                "element); this one is already one per row")
            return self.add(pp.RowReduction(node.op, arg), Rank.ROW)
        raise KgenError(getattr(node, "loc", NOWHERE),
                        f"cannot lower {type(node).__name__} in a tile program")

    def row_value(self, expr: ir.Expr, what: str, loc) -> int:
        index = self.value(expr)
        if self.rank(index) is Rank.TILE:
            raise KgenError(loc, f"{what} needs a value per row; this one is per element")
        return index

    def section(self) -> pp.Section:
        self.flush()
        return pp.Section(tuple(self.values), tuple(self.statements))


def _single(value: float) -> float:
    """A constant as the float32 the kernel computes with (inf stays inf)."""
    if not math.isfinite(value):
        return value
    try:
        return struct.unpack("<f", struct.pack("<f", value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def _store(section: _Section, kernel: ir.Kernel, stmt: ir.Store, rows_dim, cols) -> None:
    """A store of the kernel epilogue (loop) or of a row kernel."""
    p = kernel.param(stmt.target)
    assert p is not None and p.role is ir.Role.OUT, f"unverified IR: store to {stmt.target}"
    if p.kind is ir.ParamKind.VECTOR:
        index = section.row_value(stmt.value, f"the store to vector '{p.name}'", stmt.loc)
        section.statement(pp.StoreRow(p.name, index, p.dtype))
        return
    if p.kind is not ir.ParamKind.TENSOR or p.layout is not ir.Layout.ROW:
        raise KgenError(stmt.loc, f"'{p.name}': a tile program stores row-major tensors and "
                        "vectors (not yet column-major tensors or scalars)")
    if tuple(p.shape) != (rows_dim, cols):
        raise KgenError(stmt.loc, f"'{p.name}' must be [{rows_dim}, {cols}] per (batch, head): "
                        "the tile the statements run over")
    index = section.value(stmt.value)
    section.statement(pp.StoreTile(p.name, index, p.dtype))


# ---------------------------------------------------------------------------------------------
# Parameters and the params struct


def _params(kernel: ir.Kernel, query_heads) -> tuple[tuple[pp.ProgramParam, ...],
                                                     tuple[pp.ProgramField, ...]]:
    params, fields = [], []
    for p in kernel.params:
        kv = p.heads is not None and p.heads != query_heads
        params.append(pp.ProgramParam(
            name=p.name, kind=p.kind.value, dtype=p.dtype, role=p.role, shape=tuple(p.shape),
            layout=p.layout, batched=p.batch is not None, headed=p.heads is not None, kv=kv,
            default=p.default, positive=p.positive))
        if p.kind is ir.ParamKind.SCALAR:
            # a u64 scalar travels as its 64 bits in a long long (the runtime's int64)
            ctype = "i64" if p.dtype is ir.DType.U64 else "f32"
            fields.append(pp.ProgramField(p.name, ctype, p.name))
            continue
        fields.append(pp.ProgramField(p.name, "ptr", p.name))
        if p.kind is ir.ParamKind.TENSOR:
            fields.append(pp.ProgramField(f"{p.name}_ld", "i64", p.name))
        fields.append(pp.ProgramField(f"{p.name}_bs", "i64", p.name))
        fields.append(pp.ProgramField(f"{p.name}_hs", "i64", p.name))
    fields += [pp.ProgramField(name, "i32") for name in ("rows", "loop_len", "heads", "group",
                                                               "batches")]
    names = [f.name for f in fields]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate is not None:
        raise KgenError(kernel.loc, f"the parameter name '{duplicate}' collides with a member "
                        "kgen adds to the params struct; rename it")
    return tuple(params), tuple(fields)


def _roles(kernel: ir.Kernel, query_heads) -> tuple[str | None, str | None, str | None]:
    """Parameters that carry the runtime batch count, query heads and KV heads."""
    batch = next((p.name for p in kernel.params if p.batch is not None), None)
    heads = next((p.name for p in kernel.params
                  if p.heads is not None and p.heads == query_heads), None)
    kv = next((p.name for p in kernel.params
               if p.heads is not None and p.heads != query_heads), None)
    return batch, heads, kv


# ---------------------------------------------------------------------------------------------
# Loop kernels


def _loop(kernel: ir.Kernel, arch: ir.Arch) -> pp.LoopPlan:
    loop = kernel.loop
    assert len(loop.gemms) == 2 and loop.gemms[1].accumulate, "unverified IR: the loop's gemms"
    g0, g1 = loop.gemms
    a = kernel.param(g0.a.name)
    b = kernel.param(g0.b.name)
    c = kernel.param(g1.b.name)
    if a.layout is not ir.Layout.ROW or g0.a.transposed:
        raise KgenError(g0.a.loc, f"'{a.name}': a loop's first operand must be a row-major "
                        "tensor, not transposed (not yet otherwise)")
    dtype = a.dtype
    k0 = int(a.shape[1])
    rows_dim = a.shape[0]
    b_loop_index = 0 if g0.b.transposed else 1  # where the loop dim is in B's shape
    c_loop_index = 1 if g1.b.transposed else 0
    n1 = int(c.shape[1 - c_loop_index])
    # what verify enforces (the contract's limits), relied on here
    assert all(g.acc_dtype is ir.DType.F32 for g in loop.gemms), "unverified IR: accumulate"
    assert k0 % 16 == 0 and n1 % 16 == 0 and k0 <= 256 and n1 <= 256, "unverified IR: K0, N1"
    assert b.dtype is dtype and c.dtype is dtype, "unverified IR: operand dtypes differ"
    b_along = _memory_rows(b) == b_loop_index
    c_along = _memory_rows(c) == c_loop_index
    tgt = target(arch)
    # a block mask's blocks are the tile (verify: a written tile says the same sizes)
    tile = loop.tile or (loop.blocks if loop.blocks and loop.blocks.m is not None else None)
    written = (tile.m if tile else None, tile.n if tile else None,
               loop.stages.count if loop.stages else None)
    # the body's values per element (the same for any block): the rulebook's register estimate
    # of a warp of 32 rows counts them
    probe = _body(kernel, g0, g1, dtype, *_loop_gemms(g0, g1, k0, n1, 64, b_along, c_along))
    tile_values = sum(v.rank is Rank.TILE for v in probe.values)
    if loop.blocks is not None:  # the lists' registers, past what the estimate's overhead covers
        tile_values = max(tile_values, loop_rules.WIDE_TILE_VALUES) + LISTED_VALUES
    # sm_90a: the wgmma skeleton where the rulebook allows it, else mma.sync (and why not)
    wgmma_config, wgmma_why = (loop_rules.wgmma_default(k0, n1, dtype, tgt, b_along, c_along,
                                                        *written)
                               if arch is ir.Arch.SM90A else (None, None))
    if wgmma_config is not None:
        config, why = wgmma_config, wgmma_why
    else:
        try:
            config, why = loop_rules.default(k0, n1, dtype, tgt, *written,
                                             warps=loop.warps.m if loop.warps else None,
                                             tile_values=tile_values)
        except ValueError as err:
            at = loop.blocks.loc if loop.tile is None and tile is not None else loop.loc
            refused = (f" (sm_90a's wgmma skeleton refuses it too: {wgmma_why})"
                       if wgmma_why else "")
            raise KgenError(at, f"loop '{loop.name}': {err}{refused}") from None
    if loop.warps is not None and loop.warps.m != config.warps:
        raise KgenError(loop.warps.loc, f"loop '{loop.name}': {config.tile_m} rows take "
                        f"{config.warps} warps ({config.warp_rows} rows each)")
    if any(written):
        why = "the source's lines, " + ("completed by " + why if None in written else "legal")

    a_tile = smem_tile("a_smem", a.name, config.tile_m, k0, 1, dtype, 0, False)
    b_rows, b_cols = (config.block, k0) if b_along else (k0, config.block)
    b_tile = smem_tile("b_smem", b.name, b_rows, b_cols, config.stages, dtype, a_tile.bytes,
                       b_along)
    c_rows, c_cols = (config.block, n1) if c_along else (n1, config.block)
    c_tile = smem_tile("c_smem", c.name, c_rows, c_cols, config.stages, dtype,
                   a_tile.bytes + b_tile.bytes, c_along)
    gemm0, gemm1 = _loop_gemms(g0, g1, k0, n1, config.block, b_along, c_along)
    body = _body(kernel, g0, g1, dtype, gemm0, gemm1)

    tail = _Section(kernel)
    for carry in loop.carries:
        tail.env[carry.name] = tail.add(pp.CarryValue(carry.name), Rank.ROW)
    tail.env[g1.name] = tail.add(pp.AccumulatorValue(g1.name), Rank.TILE)
    for stmt in (kernel.epilogue.stmts if kernel.epilogue else ()):
        if isinstance(stmt, ir.Let):
            tail.env[stmt.name] = tail.value(stmt.value)
        elif isinstance(stmt, ir.Store):
            _store(tail, kernel, stmt, rows_dim, n1)
        else:
            raise KgenError(stmt.loc, "the kernel's epilogue runs after the loop: it may not "
                            f"update '{stmt.name}'")

    body_section, tail_section = body.section(), tail.section()
    bounds = (loop_bounds.listed(body_section, loop.blocks, config.tile_m, config.block)
              if loop.blocks is not None else
              loop_bounds.derive(body_section, tuple((c.name, c.init) for c in loop.carries),
                                 frozenset(p.name for p in kernel.params if p.positive)))
    query_heads = a.heads
    params, fields = _params(kernel, query_heads)
    params, fields, packed = packed_program.run(kernel, rows_dim, loop.dim, params, fields)
    params, fields = _block_params(kernel, a, params, fields)
    batch, heads, kv = _roles(kernel, query_heads)
    smem = c_tile.offset + c_tile.bytes
    assert smem == loop_rules.smem_bytes(config, k0, n1, dtype)
    mma = pp.Choice("mma.sync.m16n8k16", _mma_why(arch, wgmma_why))
    wgmma = None
    if wgmma_config is not None:
        reads = tuple(dict.fromkeys(kernel.param(v.kind.param) for v in body_section.values
                                    if isinstance(v.kind, dag.TensorLoad)))
        stores = tuple(s for s in tail_section.statements if isinstance(s, pp.StoreTile))
        ones = any(isinstance(s, pp.Rescale) and s.ones for s in body_section.statements)
        wgmma = loop_schedule.wgmma_loop(config, a, b, c, k0, n1, dtype, a.heads, bounds,
                                         reads, bool(packed), tgt, stores, ones)
        smem, mma = wgmma.smem_bytes, wgmma.mma
    return pp.LoopPlan(
        name=kernel.name, arch=arch, params=params, fields=fields, dtype=dtype,
        rows_dim=rows_dim, loop_dim=loop.dim, tile_m=config.tile_m, block=config.block,
        warps=config.warps, stages=config.stages,
        carries=tuple((c.name, c.init) for c in loop.carries),
        a_tile=a_tile, b_tile=b_tile, c_tile=c_tile, gemm0=gemm0, gemm1=gemm1,
        body=body_section, epilogue=tail_section, smem_bytes=smem, mma=mma,
        config=pp.Choice(f"tile {config.tile_m}x{config.block} warps {config.warps} stages "
                         f"{config.stages}", why),
        heads_param=heads, kv_param=kv, batch_param=batch, wgmma=wgmma, bounds=bounds,
        min_ctas=pp.Choice(*map(str, loop_rules.min_ctas_per_sm(config, n1))), packed=packed,
        tanh=pp.Choice(*loop_rules.loop_tanh(any(
            isinstance(v.kind, dag.Apply) and v.kind.op is ir.Op.TANH
            for v in body_section.values))),
        division=pp.Choice(*loop_rules.loop_division(any(
            loop_rules.shared_divisor(section, v)
            for section in (body_section, tail_section) for v in section.values),
            "the loop's body and the epilogue after it")))


def _block_params(kernel: ir.Kernel, a: ir.Param, params: tuple[pp.ProgramParam, ...],
                  fields: tuple[pp.ProgramField, ...]
                  ) -> tuple[tuple[pp.ProgramParam, ...], tuple[pp.ProgramField, ...]]:
    """A block mask's lists as parameters: per pair, the counts (int32 [B, H, row tiles]) and
    the indices (int32 [B, H, row tiles, blocks]), batched and headed as the rows' operand `a`
    (one of 1 at run time: shared, stride 0), placed before the first scalar; members (after
    the others): the pointer, the stride between tiles of rows (indices), between heads and
    between batches."""
    blocks = kernel.loop.blocks
    if blocks is None:
        return params, fields
    added, extra = [], []
    for name, kind, shape in zip(blocks.names, ("block_counts", "block_indices") * 2,
                                 (("row tiles",), ("row tiles", "blocks")) * 2):
        added.append(pp.ProgramParam(
            name=name, kind=kind, dtype=None, role=ir.Role.IN, shape=shape,
            layout=ir.Layout.ROW, batched=a.batch is not None, headed=a.heads is not None,
            kv=False))
        extra.append(pp.ProgramField(name, "ptr", name))
        if kind == "block_indices":
            extra.append(pp.ProgramField(f"{name}_ld", "i64", name))
        extra += [pp.ProgramField(f"{name}_bs", "i64", name),
                  pp.ProgramField(f"{name}_hs", "i64", name)]
    names = [f.name for f in fields]
    for f in extra:
        if f.name in names:
            raise KgenError(blocks.loc, f"the block mask's member '{f.name}' collides with a "
                            "member kgen adds to the params struct; rename the list")
        names.append(f.name)
    # before the scalars (a torch op's schema takes the tensors before arguments with defaults)
    at = next((i for i, p in enumerate(params) if p.kind == "scalar"), len(params))
    return params[:at] + tuple(added) + params[at:], tuple(fields) + tuple(extra)


def _loop_gemms(g0: ir.Gemm, g1: ir.Gemm, k0: int, n1: int, block: int, b_along: bool,
                c_along: bool) -> tuple[pp.LoopGemm, pp.LoopGemm]:
    gemm0 = pp.LoopGemm(g0.name, "a_smem", "b_smem",
                        pp.FragmentLoad.N_MAJOR if b_along else pp.FragmentLoad.K_MAJOR,
                        k=k0, n=block, accumulate=False)
    gemm1 = pp.LoopGemm(g1.name, g0.name, "c_smem",
                        pp.FragmentLoad.K_MAJOR if c_along else pp.FragmentLoad.N_MAJOR,
                        k=block, n=n1, accumulate=True)
    return gemm0, gemm1


def _body(kernel: ir.Kernel, g0: ir.Gemm, g1: ir.Gemm, dtype: ir.DType, gemm0: pp.LoopGemm,
          gemm1: pp.LoopGemm) -> _Section:
    """The loop's body: the first gemm, its epilogue, the accumulating gemm."""
    body = _Section(kernel, acc=g0.name)
    body.statement(pp.GemmStep(gemm0))
    for carry in kernel.loop.carries:
        body.env[carry.name] = body.add(pp.CarryValue(carry.name), Rank.ROW)
    for stmt in g0.epilogue.stmts:
        _loop_statement(body, kernel, g0, g1, stmt, dtype)
    if sum(isinstance(s, pp.HandOn) for s in body.statements) != 1:
        raise KgenError(g0.loc, f"gemm '{g0.name}' must store its own name once: the value "
                        f"handed to '{g1.name}'")
    body.statement(pp.GemmStep(gemm1))
    return body


def _mma_why(arch: ir.Arch, wgmma_refused: str | None) -> str:
    if arch is ir.Arch.SM90A:
        return ("sm_90a runs the loop's mma.sync skeleton here: the rulebook refuses its wgmma "
                f"skeleton ({wgmma_refused})")
    return f"{arch.value} has mma.sync (m16n8k16, f32 accumulate)"


def _memory_rows(param: ir.Param) -> int:
    """The index in param.shape whose consecutive elements are a row apart in memory."""
    return 0 if param.layout is ir.Layout.ROW else 1


def smem_tile(name: str, param: str, rows: int, cols: int, slots: int, dtype: ir.DType,
          offset: int, along: bool) -> pp.SmemTile:
    chunks = cols * dtype.nbytes // 16
    assert chunks >= 2 and chunks % 2 == 0, f"{name}: {cols} columns"
    # XOR within aligned groups of `low` chunks (the row's chunks are whole groups of it:
    # 12 chunks, a head dim of 96, are groups of 4), by the row's place among the rows whose
    # starts share a 128-byte line's banks (8 // low of them)
    low = min(chunks & -chunks, 8)
    mask = low - 1
    shift = (8 // low).bit_length() - 1
    return pp.SmemTile(name=name, param=param, rows=rows, cols=cols, slots=slots, dtype=dtype,
                       offset=offset, swizzle_mask=mask, swizzle_shift=shift,
                       rows_along_loop=along)


def _one_or_else(body: _Section, index: int) -> bool:
    """Whether value `index` is where(c, 1, e): 1 on the rows where c holds (pp.Rescale's
    ones)."""
    kind = body.values[index].kind
    if not (isinstance(kind, dag.Apply) and kind.op is ir.Op.WHERE):
        return False
    one = body.values[kind.args[1]].kind
    return isinstance(one, dag.Constant) and one.value == 1.0


def _loop_statement(body: _Section, kernel: ir.Kernel, g0: ir.Gemm, g1: ir.Gemm,
                    stmt: ir.Stmt, dtype: ir.DType) -> None:
    if isinstance(stmt, ir.Let):
        body.env[stmt.name] = body.value(stmt.value)
        return
    if isinstance(stmt, ir.Update) and stmt.name == g1.name:
        factor = _rescale_factor(stmt.value, g1.name)
        if factor is None:
            raise KgenError(stmt.loc, f"'{g1.name}' is an accumulator: it may only be rescaled "
                            f"by a value per row ({g1.name} = {g1.name} * r)")
        index = body.row_value(factor, f"the rescale of '{g1.name}'", stmt.loc)
        body.statement(pp.Rescale(g1.name, index, _one_or_else(body, index)))
        return
    if isinstance(stmt, ir.Update):
        index = body.row_value(stmt.value, f"the carry '{stmt.name}'", stmt.loc)
        body.statement(pp.UpdateCarry(stmt.name, index))
        body.env[stmt.name] = index
        return
    if stmt.target == g0.name and kernel.param(stmt.target) is None:
        index = body.value(stmt.value)
        if body.rank(index) is not Rank.TILE:
            raise KgenError(stmt.loc, f"the value handed to '{g1.name}' must be per element")
        body.statement(pp.HandOn(index, dtype))
        body.env[stmt.target] = index  # later statements read the value handed on
        return
    raise KgenError(stmt.loc, f"a store to '{stmt.target}' inside the loop is not supported "
                    "yet; store in the kernel's epilogue, after the loop")


def _rescale_factor(value: ir.Expr, name: str) -> ir.Expr | None:
    if not (isinstance(value, ir.Call) and value.op is ir.Op.MUL):
        return None
    left, right = value.args
    if isinstance(left, ir.LocalRef) and left.name == name:
        return right
    if isinstance(right, ir.LocalRef) and right.name == name:
        return left
    return None


# ---------------------------------------------------------------------------------------------
# Row kernels

ROW_WARPS = 4  # rows per CTA: one warp each


def _rows(kernel: ir.Kernel, arch: ir.Arch) -> pp.RowsPlan:
    tensors = [p for p in kernel.params if p.kind is ir.ParamKind.TENSOR]
    assert tensors, "unverified IR: a row kernel without tensors"
    shape = tuple(tensors[0].shape)
    rows_dim, cols = shape[0], shape[1]
    for p in tensors:
        if tuple(p.shape) != shape or p.layout is not ir.Layout.ROW:
            raise KgenError(p.loc, f"'{p.name}': a row kernel's tensors are all row-major "
                            f"[{rows_dim}, {cols}] per (batch, head)")
    if not isinstance(cols, int) or cols % 8:
        raise KgenError(tensors[0].loc, f"a row kernel's columns must be a compile-time "
                        f"multiple of 8 (it reads 8-element chunks), not {cols}")
    section = _Section(kernel)
    for stmt in kernel.epilogue.stmts:
        if isinstance(stmt, ir.Let):
            section.env[stmt.name] = section.value(stmt.value)
        elif isinstance(stmt, ir.Store):
            _store(section, kernel, stmt, rows_dim, cols)
        else:
            raise KgenError(stmt.loc, "a row kernel has no carries to update")
    outputs = [p for p in kernel.params if p.role is ir.Role.OUT and p.heads is not None]
    query_heads = (outputs[0].heads if outputs else
                   next((p.heads for p in kernel.params if p.heads is not None), None))
    params, fields = _params(kernel, query_heads)
    batch, heads, kv = _roles(kernel, query_heads)
    return pp.RowsPlan(name=kernel.name, arch=arch, params=params, fields=fields,
                       rows_dim=rows_dim, cols=cols, warps=ROW_WARPS, body=section.section(),
                       heads_param=heads, kv_param=kv, batch_param=batch)
