"""The meaning of a tile program (a loop kernel or a row kernel): its IR evaluated with NumPy in
float64, as kgen/reference.py does for gemm kernels (whose `evaluate` dispatches here).

A loop kernel, per (batch, head), for the given rows: carries start at their `init` (one value
per row), the accumulator at 0. The loop runs over its dimension in blocks of `block` columns,
in order, the last one partial (columns past the end do not exist). Per block:
    acc = A @ B[:, block] in float64;
    the first gemm's epilogue, statement by statement: `Let` binds, `Update` sets a carry (or
    rescales the accumulator) and later statements read the new value, `Store` to the gemm's
    own name gives the value handed on (and later statements read it);
    o += round(handed value, the accumulating gemm's operand dtype) @ C[block, :].
Then the kernel's epilogue over the [rows, N1] accumulator (per N where a backward's
accumulators differ in N: dK's D, dV's D_v), each output rounded once to its dtype. A row
kernel is its epilogue over the [rows, cols] of its tensors. Row reductions are values (one per
row). Constants and scalars are float32 values, everything else float64; `row`
and `col` are global indices (`col` along the loop's dimension in the loop, 0..N1-1 after it);
`batch` and `head` the instance's (batch, query head), `v[head]` its element of a vector; a
tensor read in the loop is its element at (row, col); `random(seed, offset)` the Philox value
ir.Random defines, bit for bit as the kernels compute it (`philox4x32`, `random_uniform`).

A block mask (`blocks MxN by COUNTS, INDICES[, full FULL_COUNTS, FULL_INDICES]`, ir.BlockMask)
is FlexAttention's: each tile of M rows (rows r with r // M = t) visits, in order, the blocks
INDICES[b, h, t, :COUNTS[b, h, t]] (partial: the body as written), then FULL_INDICES[b, h, t,
:FULL_COUNTS[b, h, t]] (full: every mask is `e` there: `where(P, e, -inf)` in the forward's
loop; in a DAG loop, the backward's, `where(P, e, 0)` whose P reads only indices: positions,
sizes, scalars, vectors and constants, not acc, a tensor or a random value), each of N columns
(without sizes on the line: the loop's tile, else M from the counts' extent and N the `block`
given);
a block listed twice runs twice and a block listed in neither is not visited, whatever its
elements hold. Counts are clipped to [0, blocks] and indices to [0, blocks - 1], as the kernels
do; a list with B or H of 1 is shared; the loop's block is N.

Two batch dimensions: each (batch b, head h) is one instance; a parameter with heads Hp (GQA,
fewer than the kernel's H) gives head h its head h // (H // Hp); a parameter without batch
dimensions is shared. A backward's GQA (`query_param`: the kernel's rows, K, have the KV heads
HKV and the loop's streamed operands the query heads H): each (batch, KV head) is one instance
whose loop walks the blocks of every query head of its group in turn (`head` the query head;
under a block mask, each query head's own lists: they have the query heads H, or 1 shared),
the carried accumulators summing over the group, each query head's `+=` adds its own. The
results depend on `block` only through the rounding of the handed-on value, as the kernels'
do: pass the kernel's block (its plan's tile.n).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from . import ir
from .reference import _NUMPY_REDUCE, batch_count, host_dtype, numpy_op, round_to
from .verify.loop_gemms import after_loop_groups, is_forward_loop  # (one home each)

DEFAULT_BLOCK = 64  # the loop's block when the caller gives none
DEFAULT_ROWS = 64  # the kernel's rows per block (CTA) of a loop with `+=` stores, without tile

# Philox 4x32-10's multipliers and key increments (Salmon et al., SC 2011; Random123)
PHILOX_M = (0xD2511F53, 0xCD9E8D57)
PHILOX_W = (0x9E3779B9, 0xBB67AE85)
MASK32 = 0xFFFFFFFF


def philox4x32(counter, key, rounds: int = 10) -> tuple[np.ndarray, ...]:
    """Philox 4x32 of counters (four uint32 arrays, broadcast together) and a key (two ints):
    the four output words, uint64 arrays holding 32-bit values."""
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) & np.uint64(MASK32) for c in counter)
    c0, c1, c2, c3 = np.broadcast_arrays(c0, c1, c2, c3)
    k0, k1 = int(key[0]) & MASK32, int(key[1]) & MASK32
    m0, m1, low = np.uint64(PHILOX_M[0]), np.uint64(PHILOX_M[1]), np.uint64(MASK32)
    for _ in range(rounds):
        p0, p1 = m0 * c0, m1 * c2  # exact: 32 x 32 bits fit in 64
        hi0, lo0, hi1, lo1 = p0 >> np.uint64(32), p0 & low, p1 >> np.uint64(32), p1 & low
        c0, c1, c2, c3 = (hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0)
        k0, k1 = (k0 + PHILOX_W[0]) & MASK32, (k1 + PHILOX_W[1]) & MASK32
    return c0, c1, c2, c3


def random_uniform(seed: int, offset: int, batch: int, head: int, heads: int,
                   rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """ir.Random's value at rows x cols of instance (batch, head): see its docstring (one
    Philox call per group {r, r + 8} x {c, c + 1, c + 8, c + 9}, bit 3 of r and bits 0 and 3
    of c clear; word 2 * (bit 3 of row) + (bit 3 of col), its low or high 16 bits by bit 0 of
    col)."""
    seed, offset = int(seed) % 2**64, int(offset) % 2**64
    rows = np.asarray(rows, dtype=np.int64)[:, None]
    cols = np.asarray(cols, dtype=np.int64)[None, :]
    counter = (cols & ~9, rows & ~8, (batch * heads + head) & MASK32, offset & MASK32)
    key = (seed & MASK32, (seed >> 32) ^ (offset >> 32))
    words = philox4x32(counter, key)
    pick = 2 * ((rows >> 3) & 1) + ((cols >> 3) & 1)
    word = np.choose(np.broadcast_to(pick, np.broadcast_shapes(rows.shape, cols.shape)), words)
    half = (word >> (np.uint64(16) * (cols & 1).astype(np.uint64))) & np.uint64(0xFFFF)
    return half.astype(np.float64) * 2.0 ** -16


def is_tile_program(kernel: ir.Kernel) -> bool:
    return kernel.loop is not None or (kernel.epilogue is not None and not kernel.gemms)


def rows_param(kernel: ir.Kernel) -> ir.Param:
    """The parameter whose rows the kernel computes: a loop's first A, or a row kernel's first
    input tensor (its first tensor when it has no input tensor)."""
    if kernel.loop is not None:
        return kernel.param(kernel.loop.gemms[0].a.name)
    tensors = [p for p in kernel.params if p.kind is ir.ParamKind.TENSOR]
    inputs = [p for p in tensors if p.role is ir.Role.IN]
    return (inputs or tensors)[0]


def query_param(kernel: ir.Kernel) -> ir.Param | None:
    """A backward loop's GQA: the first score gemm's B (Q), whose heads are not the kernel's
    rows' (K's), in a loop that adds into an `out accumulate` tensor; else None."""
    if kernel.loop is None or not any(p.accumulate for p in kernel.params):
        return None
    b = kernel.param(kernel.loop.gemms[0].b.name)
    lead = rows_param(kernel)
    if b is None or b.heads is None or b.heads == lead.heads:
        return None
    return b


def evaluate_tiles(kernel: ir.Kernel, inputs: Mapping[str, np.ndarray],
                   scalars: Mapping[str, float], rows: np.ndarray | None,
                   batches: int | None, block: int | None) -> dict[str, np.ndarray]:
    """Every output of a tile program, in its dtype (see the module's docstring)."""
    block = DEFAULT_BLOCK if block is None else int(block)
    if block <= 0:
        raise ValueError(f"block must be positive, got {block}")
    listed = kernel.loop.blocks if kernel.loop is not None else None
    if listed is not None and listed.n is not None and block != listed.n:
        raise ValueError(f"the block mask's blocks have {listed.n} columns: the reference runs "
                         f"the loop in blocks of {listed.n}, not {block}")
    batched = [p for p in kernel.params if p.batch is not None]
    if not batched:
        return _Instance(kernel, inputs, scalars, rows, block, 0, 0, 1).run()
    count = batch_count(kernel, inputs, batches)
    lead = rows_param(kernel)
    heads = None
    if lead.heads is not None:
        heads = int(np.shape(inputs[lead.name])[1]) if lead.name in inputs else lead.heads
        if not isinstance(heads, int):
            raise ValueError(f"the reference needs input {lead.name!r} to know the heads")
    outputs = [p for p in kernel.params if p.role is ir.Role.OUT]
    query = query_param(kernel)
    if query is not None and heads:
        return _grouped(kernel, inputs, scalars, rows, block, count, heads, query, outputs)
    if count == 0 or heads == 0:
        lead_shape = (count,) if heads is None else (count, heads)
        return {p.name: np.zeros((*lead_shape, 0), host_dtype(p.dtype)) for p in outputs}
    per_batch = []
    for b in range(count):
        per_head = []
        for h in range(heads if heads is not None else 1):
            view = {name: _instance_view(kernel.param(name), array, b, h, heads)
                    for name, array in inputs.items()}
            if listed is not None:  # the lists at this (batch, head), or shared
                lead = rows_param(kernel)
                view.update((name, _list_view(inputs[name], b, h, lead)) for name in
                            listed.names if name in inputs)
            per_head.append(_Instance(kernel, view, scalars, rows, block, b, h,
                                      heads or 1).run())
        per_batch.append(per_head)
    result = {}
    for p in outputs:
        if heads is None:
            result[p.name] = np.stack([one[0][p.name] for one in per_batch])
        else:
            result[p.name] = np.stack([np.stack([h[p.name] for h in one]) for one in per_batch])
    return result


def _grouped(kernel, inputs, scalars, rows, block, count, kv_heads, query, outputs):
    """A backward's GQA: per (batch, KV head) one instance walking its group's query heads."""
    if query.name not in inputs:
        raise ValueError(f"the reference needs input {query.name!r} to know the query heads")
    heads = int(np.shape(inputs[query.name])[1])
    if heads % kv_heads:
        raise ValueError(f"{query.name} has {heads} heads, not a multiple of the {kv_heads} "
                         "KV heads")
    group = heads // kv_heads
    listed = kernel.loop.blocks
    lead = rows_param(kernel)
    result = {p.name: [] for p in outputs}
    for b in range(count):
        per_head: dict[str, list] = {p.name: [] for p in outputs}
        for kv in range(kv_heads):
            members = []
            for h in range(kv * group, (kv + 1) * group):
                view = {name: _instance_view(kernel.param(name), array, b, h, heads)
                        for name, array in inputs.items()}
                if listed is not None:  # the lists of query head h (per query head, or shared)
                    view.update((name, _list_view(inputs[name], b, h, lead))
                                for name in listed.names if name in inputs)
                members.append((h, view))
            one = _Instance(kernel, members[0][1], scalars, rows, block, b, members[0][0],
                            heads, members).run()
            for p in outputs:
                if isinstance(one[p.name], list):  # one per query head of the group
                    per_head[p.name].extend(one[p.name])
                else:
                    per_head[p.name].append(one[p.name])
        for p in outputs:
            result[p.name].append(np.stack(per_head[p.name]))
    return {name: np.stack(parts) for name, parts in result.items()}


def _list_view(array: Any, b: int, h: int, lead: ir.Param) -> np.ndarray:
    """A block mask's list at (batch b, head h): its dims follow the rows' operand `lead`;
    an extent of 1 is shared."""
    array = np.asarray(array)
    for present, index in ((lead.batch is not None, b), (lead.heads is not None, h)):
        if present:
            array = array[index if array.shape[0] > 1 else 0]
    return array


def _instance_view(param: ir.Param | None, array: Any, b: int, h: int, heads: int | None):
    if param is None or param.batch is None:
        return array
    array = np.asarray(array)[b]
    if param.heads is None:
        return array
    own = int(array.shape[0])
    if own == 0 or heads % own:
        raise ValueError(f"{param.name} has {own} heads, which does not divide the kernel's "
                         f"{heads} heads")
    return array[h // (heads // own)]  # GQA: one head of it per heads // own query heads


class _Instance:
    """One (batch, head) of a tile program: 2-D tensors, 1-D vectors."""

    def __init__(self, kernel: ir.Kernel, inputs: Mapping[str, Any],
                 scalars: Mapping[str, float], rows: np.ndarray | None, block: int,
                 batch: int, head: int, heads: int,
                 members: list[tuple[int, Mapping[str, Any]]] | None = None):
        self.kernel = kernel
        self.batch, self.head, self.heads = batch, head, heads  # the instance, of `heads`
        # a backward's GQA: the query heads the loop walks in turn, each with its inputs' view
        # (its `+=` adds kept apart); None: the one head
        self.members = members
        self.inputs = inputs
        self.scalars = scalars
        self.block = block
        lead = rows_param(kernel)
        count = int(np.shape(self._input(lead.name))[0]) if lead.role is ir.Role.IN else None
        if count is None:  # a row kernel of outputs only: the rows of its first output
            count = _extent(lead.shape[0], kernel, inputs)
        self.rows = np.arange(count) if rows is None else np.asarray(rows, dtype=np.int64)
        self.cols = np.zeros(0)  # the current tile's global column indices
        self.col_slice = slice(None)  # the same, for v[col]
        self.acc = None
        # `out accumulate` tensors, float64 sums, by (name, query head: None but in GQA)
        self.adds: dict[tuple, np.ndarray] = {}
        self.tile = 0  # the tile of rows a block mask's lists are read at
        self.full = False  # the current block is a block mask's full one
        self.lets: dict[str, ir.Expr] = {}  # the current epilogue's locals, as written
        # tensors a DAG loop's score gemm stores, by (name, query head: None but in GQA)
        self.tiles: dict[tuple, np.ndarray] = {}

    def _input(self, name: str) -> np.ndarray:
        if name not in self.inputs:
            raise KeyError(f"the reference needs input {name!r}")
        return np.asarray(self.inputs[name])

    def _operand(self, ref: ir.OperandRef) -> np.ndarray:
        array = self._input(ref.name).astype(np.float64)
        return array.T if ref.transposed else array

    # -- running -------------------------------------------------------------------------------

    def run(self) -> dict[str, np.ndarray]:
        outputs: dict[str, np.ndarray] = {}
        env: dict[str, Any] = {}
        with np.errstate(all="ignore"):
            if self.kernel.loop is not None:
                env = self._loop_by_rows()
            else:
                tensor = rows_param(self.kernel)
                if tensor.role is ir.Role.IN:
                    width = int(self._input(tensor.name).shape[1])
                else:
                    width = _extent(tensor.shape[1], self.kernel, self.inputs)
                self._columns(0, width)
            for width, epilogue in self._epilogues(env):
                if width is not None:
                    self._columns(0, width)
                self._statements(epilogue, env, outputs)
        # `out accumulate` tensors (zero, plus every add) and a DAG loop's tile stores (zero
        # where no block stored): one array, or in a backward's GQA one per query head
        heads = [None] if self.members is None else [h for h, _ in self.members]
        kept = [(p, self.adds) for p in self.kernel.params if p.accumulate]
        kept += [(self.kernel.param(name), self.tiles)
                 for name in dict.fromkeys(name for name, _ in self.tiles)]
        for p, found in kept:
            arrays = [found.get((p.name, h), None) for h in heads]
            arrays = [(self._zero_tile(p) if a is None else a).astype(host_dtype(p.dtype))
                      for a in arrays]
            outputs[p.name] = arrays[0] if self.members is None else arrays
        return outputs

    def _epilogues(self, env: dict[str, Any]) -> list[tuple[int | None, ir.Epilogue]]:
        """The kernel's epilogue as run: per N where a loop's accumulators differ in N (each
        statement on the tile of one N: kgen/verify/loop_gemms.py after_loop_groups), else as
        written (None: the columns as they are)."""
        epilogue, loop = self.kernel.epilogue, self.kernel.loop
        if epilogue is None:
            return []
        widths = ({g.name: int(env[g.name].shape[1]) for g in loop.gemms if g.accumulate}
                  if loop is not None else {})
        if len(set(widths.values())) <= 1:
            return [(None, epilogue)]
        columns = {p.name: p.shape[1] for p in self.kernel.params
                   if p.kind is ir.ParamKind.TENSOR}
        return [(n, ir.Epilogue(stmts, epilogue.loc))
                for n, stmts in after_loop_groups(epilogue.stmts, widths, columns)]

    def _zero_tile(self, param: ir.Param) -> np.ndarray:
        """A [rows, cols] float64 zero of `param`'s shape (its sizes from the inputs)."""
        return np.zeros((_extent(param.shape[0], self.kernel, self.inputs),
                         _extent(param.shape[1], self.kernel, self.inputs)))

    def _columns(self, start: int, stop: int) -> None:
        self.cols = np.arange(start, stop, dtype=np.float64)
        self.col_slice = slice(start, stop)

    def _loop_by_rows(self) -> dict[str, Any]:
        """The loop, per block of the kernel's rows (the loop's tile.m, else DEFAULT_ROWS) when
        the kernel adds into an `out accumulate` tensor: each block adds its share, as each
        CTA does (every other value is per row, so the blocking changes nothing else)."""
        listed = self.kernel.loop.blocks
        if listed is not None and len(self.rows):  # per tile of rows: its own lists
            rows, parts = self.rows, []
            tiles = rows // self._tile_rows()
            for tile in np.unique(tiles):
                self.rows, self.tile = rows[tiles == tile], int(tile)
                parts.append(self._loop())
            self.rows = rows
            # back in the rows' own order
            order = np.argsort(np.concatenate([np.nonzero(tiles == t)[0]
                                               for t in np.unique(tiles)]), kind="stable")
            return {name: np.concatenate([part[name] for part in parts])[order]
                    for name in parts[0]}
        if not any(p.accumulate for p in self.kernel.params) or not len(self.rows):
            return self._loop()
        tile = self.kernel.loop.tile
        step = tile.m if tile is not None else DEFAULT_ROWS
        rows, parts = self.rows, []
        for start in range(0, len(rows), step):
            self.rows = rows[start:start + step]
            parts.append(self._loop())
        self.rows = rows
        return {name: np.concatenate([part[name] for part in parts]) for name in parts[0]}

    def _tile_rows(self) -> int:
        """The rows of a block mask's tile: its line's M, else the loop's tile's, else the one
        of 64 and 128 whose tiles of the kernel's rows number as the counts' entries."""
        loop = self.kernel.loop
        if loop.blocks.m is not None:
            return loop.blocks.m
        if loop.tile is not None:
            return loop.tile.m
        total = int(np.shape(self._input(rows_param(self.kernel).name))[0])
        tiles = int(np.shape(self._input(loop.blocks.counts))[-1])
        found = next((m for m in (64, 128) if -(-total // m) == tiles), None)
        if found is None:
            raise ValueError(f"{loop.blocks.counts} holds {tiles} tiles of rows, which is "
                             f"ceil({total} / M) for neither M = 64 nor 128")
        return found

    def _visits(self, extent: int) -> list[tuple[int, bool]]:
        """The blocks the loop visits, in order, each with whether it is a block mask's full
        one: every block (none full) without a block mask."""
        count = -(-extent // self.block)
        listed = self.kernel.loop.blocks
        if listed is None:
            return [(j, False) for j in range(count)]
        out = []
        pairs = [(listed.counts, listed.indices, False)]
        if listed.full_counts is not None:
            pairs.append((listed.full_counts, listed.full_indices, True))
        for counts, indices, full in pairs:
            n = int(np.clip(self._input(counts)[self.tile], 0, count))
            out += [(int(np.clip(j, 0, count - 1)), full)
                    for j in self._input(indices)[self.tile][:n]]
        return out

    def _loop(self) -> dict[str, Any]:
        loop = self.kernel.loop
        first = loop.gemms[0]
        count = len(self.rows)
        env: dict[str, Any] = {carry.name: np.full((count, 1), float(carry.init))
                               for carry in loop.carries}
        for g in loop.gemms:
            if g.accumulate:
                env[g.name] = np.zeros((count, self._operand(g.b).shape[1]))
        for head, view in self.members or [(self.head, self.inputs)]:
            self.head, self.inputs = head, view
            self._blocks(loop, first, env, count)
        self.acc = None
        self.full = False
        widths = [env[g.name].shape[1] for g in loop.gemms if g.accumulate]
        self._columns(0, widths[0] if widths else 0)
        carried = {carry.name for carry in loop.carries} | {g.name for g in loop.gemms
                                                             if g.accumulate}
        return {name: value for name, value in env.items() if name in carried}

    def _blocks(self, loop: ir.Loop, first: ir.Gemm, env: dict, count: int) -> None:
        """The loop's blocks over its dimension, in order, for the current (query) head."""
        extent = self._operand(first.b).shape[1]
        for index, self.full in self._visits(extent):
            start = index * self.block
            stop = min(start + self.block, extent)
            self._columns(start, stop)
            values: dict[str, Any] = {}  # this block's tile values, in statement order
            for g in loop.gemms:
                if not g.accumulate and self.kernel.param(g.a.name) is not None:  # score
                    a = self._input(g.a.name).astype(np.float64)[self.rows]
                    self.acc = a @ self._operand(g.b)[:, start:stop]
                    self._statements(g.epilogue, env, {}, own=g.name, values=values)
                    continue
                if g.a.name not in values:
                    raise ValueError(f"gemm {g.name!r} reads {g.a.name!r}, which no earlier "
                                     f"epilogue binds ({g.a.name} = ...)")
                tile = np.broadcast_to(values[g.a.name], (count, stop - start))
                operand = round_to(tile, self.kernel.param(g.b.name).dtype)
                if g.accumulate:
                    env[g.name] = env[g.name] + operand @ self._operand(g.b)[start:stop]
                else:  # a loop-row gemm: [block, N] at the loop's rows
                    self._loop_rows(g, operand.T @ self._operand(g.b)[self.rows], start, stop)

    def _loop_rows(self, g: ir.Gemm, acc: np.ndarray, start: int, stop: int) -> None:
        """A loop-row gemm's epilogue over its [block, N] tile: `row` is the loop position,
        `col` 0..N; `+=` stores add into self.adds (float64, rounded once at the end)."""
        rows, cols, col_slice = self.rows, self.cols, self.col_slice
        self.rows = np.arange(start, stop)
        self._columns(0, acc.shape[1])
        self.acc = acc
        self._statements(g.epilogue, {}, {})
        self.rows, self.cols, self.col_slice = rows, cols, col_slice

    def _statements(self, epilogue: ir.Epilogue, carried: dict[str, Any],
                    outputs: dict[str, np.ndarray], own: str | None = None,
                    values: dict[str, Any] | None = None) -> Any:
        """Run one epilogue; `carried` (carries and accumulators) is updated in place, and
        `values` (a loop's tile values of this block) receives its locals and the value stored
        to `own` (a score gemm's handed-on value). Returns the value stored to `own`."""
        env = {**(values or {}), **carried}
        handed = None
        self.lets = {}
        for stmt in epilogue.stmts:
            value = self.value(stmt.value, env)
            if isinstance(stmt, ir.Let):
                env[stmt.name] = value
                self.lets[stmt.name] = stmt.value
                if values is not None:
                    values[stmt.name] = value
            elif isinstance(stmt, ir.Update):
                shape = carried[stmt.name].shape
                carried[stmt.name] = np.array(np.broadcast_to(value, shape), dtype=np.float64)
                env[stmt.name] = carried[stmt.name]
            elif stmt.target == own:
                handed = value
                env[stmt.target] = value
                if values is not None:
                    values[stmt.target] = value
            elif stmt.accumulate:
                self._add(self.kernel.param(stmt.target), value)
            elif values is not None:  # a score gemm's tile output, at this block's elements
                self._store_block(self.kernel.param(stmt.target), value)
            else:
                outputs[stmt.target] = self._store(value, self.kernel.param(stmt.target))
        return handed

    def _add(self, param: ir.Param, value: Any) -> None:
        """`dQ += value` at the current rows (the loop's) and columns, summed in float64."""
        key = (param.name, None if self.members is None else self.head)
        if key not in self.adds:
            self.adds[key] = self._zero_tile(param)
        tile = np.broadcast_to(value, (len(self.rows), len(self.cols)))
        self.adds[key][self.rows, self.col_slice] += tile

    def _store_block(self, param: ir.Param, value: Any) -> None:
        """`dBiasT = dst` in a DAG loop's score gemm: the tile at the current rows and this
        block's columns (float64, rounded once at the end; elements no block stores are 0); in a
        backward's GQA, per query head of the group (the visit's)."""
        key = (param.name, None if self.members is None else self.head)
        if key not in self.tiles:
            self.tiles[key] = self._zero_tile(param)
        tile = np.broadcast_to(value, (len(self.rows), len(self.cols)))
        self.tiles[key][self.rows, self.col_slice] = tile

    def _store(self, value: Any, param: ir.Param) -> np.ndarray:
        count = len(self.rows)
        if param.kind is ir.ParamKind.TENSOR:
            value = np.broadcast_to(value, (count, len(self.cols)))
        else:
            value = np.broadcast_to(value, (count, 1))[:, 0]
        return np.array(np.asarray(value, dtype=np.float64).astype(host_dtype(param.dtype)))

    # -- values ----------------------------------------------------------------------------------

    def value(self, node: ir.Expr, env: Mapping[str, Any]) -> Any:
        if isinstance(node, ir.LocalRef):
            return env[node.name]
        if isinstance(node, ir.Acc):
            if self.acc is None:
                raise ValueError("acc is read outside a loop's first gemm")
            return self.acc
        if isinstance(node, ir.Const):
            return np.float64(np.float32(node.value))
        if isinstance(node, ir.ScalarLoad):
            return self._scalar(node.name)
        if isinstance(node, ir.TensorLoad):  # at (row, col): the loop's block of columns
            return self._input(node.name).astype(np.float64)[self.rows][:, self.col_slice]
        if isinstance(node, ir.VectorLoad):
            vector = self._input(node.name).astype(np.float64)
            if node.axis is ir.Axis.ROW:
                return vector[self.rows][:, None]
            if node.axis is ir.Axis.COL:
                return vector[self.col_slice][None, :]
            return vector[self.head if node.axis is ir.Axis.HEAD else self.batch]
        if isinstance(node, ir.Position):
            if node.axis is ir.Axis.ROW:
                return self.rows.astype(np.float64)[:, None]
            if node.axis is ir.Axis.COL:
                return self.cols[None, :]
            return np.float64(self.head if node.axis is ir.Axis.HEAD else self.batch)
        if isinstance(node, ir.Extent):
            return np.float64(_extent(node.dim, self.kernel, self.inputs))
        if isinstance(node, ir.Random) and node.transposed:  # random_t: at (col, row)
            return random_uniform(self._integer(node.seed), self._integer(node.offset),
                                  self.batch, self.head, self.heads, self.cols.astype(np.int64),
                                  self.rows).T
        if isinstance(node, ir.Random):
            return random_uniform(self._integer(node.seed), self._integer(node.offset),
                                  self.batch, self.head, self.heads, self.rows,
                                  self.cols.astype(np.int64))
        if isinstance(node, ir.Call) and self.full and self._is_mask(node):
            return self.value(node.args[1], env)  # a block mask's full block: the value kept
        if isinstance(node, ir.Call):
            return numpy_op(node.op, *(self.value(arg, env) for arg in node.args))
        if isinstance(node, ir.Cast):
            return round_to(self.value(node.arg, env), node.dtype)
        if isinstance(node, ir.Reduce):
            if node.axis is not ir.Axis.ROW:
                raise ValueError("a tile program reduces along rows only")
            tile = np.broadcast_to(self.value(node.arg, env), (len(self.rows), len(self.cols)))
            return _NUMPY_REDUCE[node.op](tile, axis=1)[:, None]
        raise TypeError(f"not an epilogue expression: {node!r}")

    def _is_mask(self, node: ir.Call) -> bool:
        """`where(P, e, -inf)` in the forward's loop: its third argument the constant -inf
        (through locals and f32 casts, as the lowering sees it); in a DAG loop `where(P, e, 0)`
        whose P reads only indices (kgen/lower/loop_dag.py `mask_values`)."""
        if node.op is not ir.Op.WHERE:
            return False
        other = self._through(node.args[2])
        if not is_forward_loop(self.kernel.loop):
            return (isinstance(other, ir.Const) and float(other.value) == 0.0
                    and self._indices_only(node.args[0]))
        return isinstance(other, ir.Const) and np.float32(other.value) == -np.inf

    def _through(self, node: ir.Expr) -> ir.Expr:
        """`node` through the epilogue's locals and f32 casts."""
        while True:
            if isinstance(node, ir.LocalRef) and node.name in self.lets:
                node = self.lets[node.name]
            elif isinstance(node, ir.Cast) and node.dtype is ir.DType.F32:
                node = node.arg
            else:
                return node

    def _indices_only(self, node: ir.Expr) -> bool:
        """Whether an expression reads only positions, sizes, scalars, vectors, constants."""
        if isinstance(node, ir.LocalRef) and node.name in self.lets:
            return self._indices_only(self.lets[node.name])
        if isinstance(node, (ir.Const, ir.ScalarLoad, ir.VectorLoad, ir.Position, ir.Extent)):
            return True
        if isinstance(node, ir.Cast):
            return self._indices_only(node.arg)
        return isinstance(node, ir.Call) and all(self._indices_only(a) for a in node.args)

    def _integer(self, name: str) -> int:
        """A u64 scalar (random's seed or offset): an int, taken modulo 2^64."""
        if name not in self.scalars:
            raise KeyError(f"the reference needs scalar {name!r}")
        return int(self.scalars[name]) % 2**64

    def _scalar(self, name: str) -> np.float64:
        if name in self.scalars:
            return np.float64(np.float32(self.scalars[name]))
        param = self.kernel.param(name)
        if param is None or param.default is None:
            raise KeyError(f"the reference needs scalar {name!r}")
        return np.float64(np.float32(param.default))


def _extent(dim: ir.Dim, kernel: ir.Kernel, inputs: Mapping[str, Any]) -> int:
    """A dimension's size: fixed, or read from an input that has it."""
    if isinstance(dim, int):
        return dim
    for p in kernel.params:
        if p.name in inputs and dim in p.shape:
            return int(np.shape(inputs[p.name])[-len(p.shape) + p.shape.index(dim)])
    raise ValueError(f"no input tells the size of {dim}")
