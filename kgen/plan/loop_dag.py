"""The plan of a loop kernel whose gemms form a DAG (the attention backward's, issue 52):
score gemms (A a loop-invariant tile, B a streamed block), accumulating gemms (A a tile value
from registers, B a streamed block), and loop-row gemms (A a tile value transposed, staged
through shared memory; B a loop-invariant tile) whose epilogue adds the [block, N] tile into an
`out accumulate` tensor at the loop's rows. Built by kgen/lower/loop_dag.py; read only by the
emitter kgen/targets/common/loop_dag.py (templates/common/loop_bwd.cu.j2).

The orientation is FlashAttention-2's backward: a CTA owns tile_m of the kernel's rows (the
keys), loads its loop-invariant tiles (K, V) once and walks the loop's blocks (the queries),
streaming their tiles (Q, dO) through a ring; every warp owns 16 rows of each score tile and of
each accumulator; a loop-row gemm's [block, N] tile is shared out over the warps by m16 tiles
of the block and column groups of N. The warp grid (DagGrid, the rulebook's choice) shares
each out over a grid of warps instead, the values handed on staged in shared memory.

The forward's two-gemm loop (plan.program.LoopPlan) is the special case one score gemm and one
accumulating gemm; it keeps its own plan and skeletons.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass

from ..enums import Arch, Dim, DType
from . import StoragePlan
from .program import (Choice, LoopBounds, LoopTensorMap, PackedDim, ProgramField, ProgramParam,
                      Section, SmemTile, FragmentLoad, WgmmaTile)


# The params struct's member holding deterministic mode's semaphores (LoopDagPlan.deterministic):
# int32 [batches, heads, blocks of the loop, adders], the call's workspace, zeroed by `<name>_zero`
ORDER_FIELD = "add_order"


class GemmKind(enum.Enum):
    SCORE = "score"  # [rows, block] = A[rows, K0] @ B, A resident, B streamed
    ACCUMULATING = "accumulating"  # acc[rows, N] += t[rows, block] @ B[block, N], t in registers
    LOOP_ROW = "loop_row"  # [block, N] = t^T @ Z[rows, N], t staged, Z resident


class ALoad(enum.Enum):
    """Where a gemm's A fragments come from. Value: the device helper (or registers)."""

    SMEM = "ldsm_a"  # a row-major [m][k] shared tile: ldmatrix
    REGISTERS = "registers"  # a tile value's accumulator fragments, rounded (as the forward)
    SMEM_TRANSPOSED = "ldsm_a_km"  # a [k][m] shared tile (a staged tile value): ldmatrix.trans


@dataclass(frozen=True, slots=True)
class GemmResult:
    """`acc` in a gemm's epilogue: that gemm's result (a score gemm's [rows, block] tile, a
    loop-row gemm's [block, N] tile)."""

    gemm: str


@dataclass(frozen=True, slots=True)
class HandTile:
    """A TILE value, zero past the loop's end, rounded to `dtype` in registers: the A
    fragments of an accumulating gemm (fragments 2k, 2k + 1 of a row pair are k16 step k)."""

    value: int
    dtype: DType


@dataclass(frozen=True, slots=True)
class StageTile:
    """A TILE value rounded to `dtype` and written to shared tile `tile` ([rows, block], zero
    past the loop's end and past the kernel's rows), then a barrier: a loop-row gemm reads it
    transposed."""

    value: int
    dtype: DType
    tile: str


@dataclass(frozen=True, slots=True)
class AddTile:
    """A loop-row tile's value added into the f32 `out accumulate` tensor `param` at the loop's
    rows (rows past the loop's end left out), by atomic adds (CTAs of other key blocks add the
    same elements)."""

    param: str
    value: int


@dataclass(frozen=True, slots=True)
class AddBox:
    """Where one [block][32] f32 box of a consumer warpgroup's loop-row share is staged when the
    adds are staged in the streamed slots (DagWgmma.add_slots): 16-bit box `box + consumer *
    stride` (block x 128 bytes, the f32 box's bytes) of streamed tile `tile`'s slot of the
    block (each warpgroup's own half of the columns: its accumulating gemms read only those;
    where one issued after the loop-row gemm reads the tile, the warpgroup waits for its
    wgmmas before staging there: kgen/targets/sm90/loop_dag.py)."""

    tile: str
    box: int
    stride: int


@dataclass(frozen=True, slots=True)
class DagGemm:
    """One gemm of the loop, mma.sync m16n8k16. SCORE and ACCUMULATING: per warp 16 rows, k16
    steps over `k`, n8 tiles over `n`; LOOP_ROW: per warp m16 tile `warp % m_tiles` of the
    block and `n_warp` columns from `n_warp * (warp / m_tiles)`."""

    index: int  # its place among the loop's gemms: the C++ names (acc_g<index>)
    name: str
    kind: GemmKind
    a: str  # SMEM: a shared tile; REGISTERS: "" (the HandTile before it); SMEM_TRANSPOSED: tile
    a_load: ALoad
    a_value: int | None  # REGISTERS: the value handed on
    b: str  # its B tile in shared memory
    b_load: FragmentLoad
    k: int
    n: int
    n_warp: int  # the columns a warp computes (n, but for a loop-row gemm)
    epilogue: Section | None = None  # a loop-row gemm's: over its [block, N] tile
    m_tiles: int = 1  # the m16 tiles a warp computes (more than one: the warp grid, DagGrid)

    @property
    def k_steps(self) -> int:
        return self.k // 16

    @property
    def n8_tiles(self) -> int:  # per warp
        return self.n_warp // 8


@dataclass(frozen=True, slots=True)
class DagGrid:
    """The mma.sync skeleton's warp grid (FlashAttention-2's sm_80 layout; the rulebook's
    choice, kgen/targets/dag_mma_rules.py dag_warp_grid), each pair (warps along M, warps along
    N) of one kind of gemm, a warp computing a [M / m, N / n] share: `score` over a score tile
    [tile_m, block], `acc` over an accumulator [tile_m, N], `loop_row` over a loop-row tile
    [block, N]. Every value handed on to an accumulating gemm is staged in shared memory
    ([tile_m, block]; the loop-row gemm's tile where one reads it too) and read by ldmatrix
    from there. None on the plan: each warp owns 16 rows of the score tiles and accumulators,
    the handed values in registers (the warp rows)."""

    score: tuple[int, int]
    acc: tuple[int, int]
    loop_row: tuple[int, int]


@dataclass(frozen=True, slots=True)
class DagTail:
    """The kernel's epilogue on the accumulators of one N, once after the loop over their
    [rows, n] tile (kgen/verify/loop_gemms.py after_loop_groups: the attention backward's
    `dK = scale * dk` at D and `dV = dv` at D_v are two where D_v != D, one where equal)."""

    n: int
    accumulators: tuple[str, ...]
    section: Section


@dataclass(frozen=True, slots=True)
class DagStep:
    """A gemm's MMAs on this block (a statement of the body); a loop-row gemm's epilogue (its
    own section) runs right after them."""

    gemm: DagGemm


@dataclass(frozen=True, slots=True)
class DagWgmma:
    """The sm_90a skeleton of a DAG loop (FlashAttention-3's backward structure; templates/sm90/
    loop_bwd.cu.j2): one producer warpgroup whose one thread issues every copy-engine load (the
    loop-invariant tiles once, the streamed tiles per block into rings of full/empty
    mbarriers), `consumers` warpgroups of 64 of the kernel's rows each. A score gemm is a
    wgmma from shared memory (both K-major, M the rows); an accumulating gemm a wgmma with A
    from registers and B MN-major from the ring slot; a staged tile value is written to shared
    memory in the 128-byte swizzle (`staged`, two slots: a block's writes never meet the
    previous block's reads) and a loop-row gemm reads it transposed (A MN-major), each
    warpgroup computing 1/consumers of its columns (`n_warp` of the gemm). Tiles are boxes of
    [rows][64] (plan.program.WgmmaTile); the mbarriers follow them: the loop-invariant tiles'
    one, then per streamed tile its `slots` full and `slots` empty ones."""

    consumers: int
    producer_registers: int
    consumer_registers: int
    resident: tuple[WgmmaTile, ...]  # the loop-invariant tiles, [tile_m rows], once
    streamed: tuple[WgmmaTile, ...]  # per block, [block rows], ring slots
    staged: tuple[WgmmaTile, ...]  # the staged tile values, [tile_m rows][block]
    barrier_offset: int
    smem_bytes: int
    maps: tuple[LoopTensorMap, ...]  # resident, then streamed: the kernel's second parameter
    roles: Choice
    mma: Choice
    pipeline: Choice
    overlap: Choice
    # an accumulating gemm is waited for right after it is issued (its A registers free before
    # the next gemm's accumulator is live), else together with the next gemm's wait
    wait_accumulating: bool = True
    # the later score gemms are issued right after the first (all in flight while its epilogue
    # runs; each waited for where its own epilogue starts), else each at its own statement
    issue_ahead: bool = False
    # an accumulating gemm right before a loop-row gemm is issued after the loop-row gemm's
    # wgmma (FlashAttention-3's dQ before dK): in flight while the loop-row tile is added
    defer_accumulating: bool = False
    # the f32 vectors of the loop's dimension the body reads at `col` (lse, D): staged per
    # block by the producer's second warp (cp.async, zero past the loop's end; its lanes
    # arrive on the first streamed tile's full mbarrier) into `stages` slots of `block` floats
    # at `vector_offset`, or (None) loaded by the consumers into registers while a score gemm
    # runs
    vectors: tuple[str, ...] = ()
    vector_offset: int | None = None
    # longest first: the CTAs walk sections of (batch, head) pairs whose streamed tiles fit
    # this many bytes of L2, tile 0 of each pair first (None: the grid's order), and why
    lpt_l2_bytes: int | None = None
    lpt_why: str = "the grid's order"
    # the blocks inside the mask but the last run a second copy of the body without bounds
    # checks, the mask's predicates read 1 (the plan's bounds.fold); else one checked body
    fast_body: bool = False
    fast_body_why: str = "one body for every block"
    # deterministic mode's order of the tiles of rows adding a block: descending (the tile
    # after adds first; the CTAs launched in reverse tile order, so a waited-for tile is
    # launched first), else ascending (the tile before adds first, the grid's order); and why
    descending: bool = False
    order_why: str = "the tiles of rows add a block in increasing order"
    # a loop-row tile's adds: by the copy engine's bulk reduce-add from a staging of
    # `add_row_bytes` a row at `add_offset` (kBlock rows per consumer warpgroup), or by f32
    # atomics from registers (add_offset None); `adds` says which and why
    add_offset: int | None = None
    add_row_bytes: int = 0
    adds: Choice = Choice("f32 atomics", "the default")
    # a tensor the body reads at (row, col) (the attention backward's bias), staged per block:
    # its [tile_m, block] tile loaded by the producer's copy engine into a ring of its own
    # (`bias.slots` slots, a full and an empty mbarrier each, after the streamed tiles'), each
    # consumer warp taking its share by ldmatrix after the score gemm `bias_gemm` (its index);
    # a column-major tensor's as its memory lies (`bias.rows` the block's columns, boxes of 64
    # of the tile's rows), read by ldmatrix .trans; None: read per element from global memory.
    # `staging` says which and why
    bias: WgmmaTile | None = None
    bias_gemm: int | None = None
    staging: Choice = Choice("none", "the body reads no tensor at (row, col)")
    # a score gemm's tile store of the value a loop-row gemm stages (the bias gradient): the
    # output's name, stored from the staged tile `store_tile`'s slot by the copy engine (its
    # map among `maps`), else None (stored per element from registers); `tile_store` says why
    store_param: str | None = None
    store_tile: str | None = None
    tile_store: Choice = Choice("none", "no score gemm stores its tile")
    # the kernel's epilogue's tile outputs (dK, dV) stored by the copy engine: (output, the
    # streamed tile whose ring stages it once the loop is done: consumer warpgroup c's 64 rows
    # in slot c), their maps among `maps`; () stores them per element from registers;
    # `tail_store` says which and why
    tail_stores: tuple[tuple[str, str], ...] = ()
    tail_store: Choice = Choice("per element from registers", "the default")
    # the tensor reduce-add instead of the rows' (add_offset set, add_row_bytes 0): each
    # consumer warpgroup stages its [kBlock, n_warp] share as boxes of [kBlock][32] f32 (the
    # 128-byte swizzle, 1024-byte aligned) and one of its threads adds them through this map of
    # the `out accumulate` tensor (rank 4, f32; rows past the loop's end clipped by the copy
    # engine); None: the rows' bulk adds or the atomics
    add_map: LoopTensorMap | None = None
    # with add_map: the tensor reduce-adds issued by a warp of the producer warpgroup (warp 2,
    # FlashAttention-3's), the consumers handing it their staged shares through named barriers
    # (and, in deterministic mode, it waits on the semaphores), else by a thread of each
    # consumer warpgroup
    add_warp: bool = False
    # with add_warp, the split layout (kgen/targets/dag_wgmma_rules.py DAG_WGMMA_SPLIT_ADDS):
    # each warpgroup's share staged in its own boxes of the block's streamed slots (a storage
    # union by phase: no staging of its own, add_offset None), one AddBox per f32 box of a
    # share; the add warp arrives on those tiles' empty mbarriers once its adds have read them
    add_slots: tuple[AddBox, ...] = ()
    # the split layout (kgen/targets/dag_wgmma_rules.py, DAG_WGMMA_SPLIT; D 192, 256): the consumer
    # warpgroups share the kernel's rows (tile_m 64) and split the accumulators along N and the
    # score tiles along the block's columns; every value handed on to an accumulating gemm is
    # staged ([tile_m, block], two slots: `handed` holds those no loop-row gemm stages) and the
    # gemm reads it from shared memory (`a_tiles`: accumulating gemm index -> its tile); None:
    # the plain layout (a warpgroup owns 64 of the rows). `split` says which and why
    split: Choice | None = None
    # (split) every accumulating gemm issued after the loop-row gemm's barrier, with
    # defer_accumulating (their A staged: one consumer barrier a block); else dK's alone
    defer_all: bool = False
    handed: tuple[WgmmaTile, ...] = ()
    a_tiles: tuple[tuple[int, str], ...] = ()
    # (split) the accumulating and loop-row gemms whose warpgroup half of N is not whole 64-column
    # boxes (D 192's 96 columns: dag_wgmma_rules.DAG_WGMMA_SPLIT_PIECE), issued as wgmma pieces
    # of this N each inside a half of a box: (gemm index, the pieces' N)
    pieces: tuple[tuple[int, int], ...] = ()

    @property
    def tensor_maps(self) -> tuple[LoopTensorMap, ...]:
        """The kernel's second parameter: the loads' maps, then the adds' (if any)."""
        return self.maps + ((self.add_map,) if self.add_map is not None else ())

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def tiles(self) -> tuple[WgmmaTile, ...]:
        """The shared tiles in storage order: the resident, streamed and staged ones, the
        handed values' (split), then the staged bias's ring, if any."""
        return self.resident + self.streamed + self.staged + self.handed + (
            (self.bias,) if self.bias is not None else ())

    @property
    def loads(self) -> tuple[LoopTensorMap, ...]:
        """The maps the producer loads through (resident, streamed, the bias's), not a stored
        output's (the tile store's, the epilogue's)."""
        stored = {self.store_param, *(name for name, _ in self.tail_stores)}
        return tuple(m for m in self.maps if m.param not in stored)

    def a_tile(self, gemm: int) -> WgmmaTile | None:
        """The split layout's staged tile an accumulating gemm reads its A from, or None."""
        return next((self.tile_of(t) for g, t in self.a_tiles if g == gemm), None)

    def piece(self, gemm: int) -> int | None:
        """The N of the wgmma pieces gemm `gemm` (its index) is issued in, or None (one)."""
        return next((n for g, n in self.pieces if g == gemm), None)

    @property
    def score_n(self) -> int:
        """A warpgroup's columns of a score tile (the block's, halved where split)."""
        return self.streamed[0].rows // (self.consumers if self.split else 1)

    def tile_of(self, smem_tile: str) -> WgmmaTile:
        """The wgmma tile standing for the mma.sync plan's tile `smem_tile` (same order)."""
        return next(t for t in self.tiles if t.name == smem_tile)


@dataclass(frozen=True, slots=True)
class LoopDagPlan:
    """A loop kernel over a DAG of gemms (see the module's note)."""

    name: str
    arch: Arch
    params: tuple[ProgramParam, ...]
    fields: tuple[ProgramField, ...]
    dtype: DType  # the operands'
    rows_dim: Dim  # the kernel's rows (the keys, T)
    loop_dim: Dim  # the loop's dimension (the queries, S)
    tile_m: int
    block: int
    warps: int
    stages: int
    resident: tuple[SmemTile, ...]  # loaded once (K, V): rows along the kernel's rows
    streamed: tuple[SmemTile, ...]  # per block, `stages` ring slots (Q, dO)
    staged: tuple[SmemTile, ...]  # tile values written for a loop-row gemm (dS^T)
    gemms: tuple[DagGemm, ...]
    accumulators: tuple[str, ...]  # the accumulating gemms, carried, [rows, N] each
    body: Section  # once per block; DagStep, HandTile, StageTile among its statements
    tails: tuple[DagTail, ...]  # the kernel's epilogue, once after the loop: one per N
    zeroed: tuple[str, ...]  # the `out accumulate` tensors: zeroed before the kernel
    smem_bytes: int
    mma: Choice
    config: Choice
    registers: Choice  # the rulebook's estimate per thread, and why it fits
    heads_param: str | None
    kv_param: str | None
    batch_param: str | None
    bounds: LoopBounds = LoopBounds((), (), "no mask")
    min_ctas: Choice = Choice("1", "the default")
    # f32 vectors of the loop's dimension read at `col` in the body (lse, D): staged per block
    # into `stages` ring slots of `block` floats with the streamed tiles (cp.async, zero past
    # the loop's end), after the staged tiles in shared memory (the mma.sync skeleton's; the
    # wgmma skeleton loads them into registers while a score gemm runs)
    vectors: tuple[str, ...] = ()
    vectors_why: str = "no vector is read at col"
    # the sm_90a wgmma skeleton (the rulebook's choice, its why in `mma`), or None: mma.sync
    wgmma: DagWgmma | None = None
    # `reductions deterministic`: the loop-row tile's adds ordered by semaphores (ORDER_FIELD),
    # one per (batch, query head, block of the loop, adding warp): the CTA of tile j of the rows
    # adds a block after the CTA of tile j - 1 did (j + 1 where DagWgmma.descending), where
    # that one visits the block (the same bounds); None: in whatever order they come
    deterministic: Choice | None = None
    # the mma.sync skeleton's shared memory as kgen's storage planner placed it (phases,
    # buffers, lifetimes: kgen/lower/loop_dag_storage.py; the tiles' offsets are its), and the
    # staged tiles whose bytes another buffer used earlier in the block: a barrier before their
    # writes. None on the wgmma skeleton (its own layout)
    storage: StoragePlan | None = None
    fenced: tuple[str, ...] = ()
    # how the loop spells tanh and a tile value divided by a row or uniform one (the forward
    # loop's rules: LoopPlan.tanh, LoopPlan.division; the kernel's epilogue keeps tanhf, a / b)
    tanh: Choice = Choice("none", "the loop computes no tanh")
    division: Choice = Choice("none", "the loop divides no tile value by a row or uniform value")
    # packed sequences (`packed T by cu_seqlens_k`, `packed S by cu_seqlens_q`: the varlen
    # backward): a CTA's tile of rows and the blocks it walks lie in its batch's sequence, the
    # forward loop's PackedDims (kgen/lower/packed.py)
    packed: tuple[PackedDim, ...] = ()
    # the mma.sync skeleton's warp layout: the warp grid (DagGrid), or None: the warp rows;
    # `layout` says which and why (kgen/targets/dag_mma_rules.py)
    grid: DagGrid | None = None
    layout: Choice = Choice("warp rows", "the default")

    @property
    def gqa(self) -> bool:
        """GQA: some parameters have the KV heads (ProgramParam.kv; the kernel's rows, K, among
        them): a CTA owns (tile of rows, KV head) and its loop walks the blocks of every query
        head of the group in turn (group x blocks visits), the accumulators summing over the
        group."""
        return any(p.kv for p in self.params)

    @property
    def adders(self) -> int:
        """The warps (the warpgroups, where the tensor reduce-add adds a warpgroup's share at
        once; the one add warp of DagWgmma.add_warp) that add a share of the loop-row tile
        (disjoint elements): one semaphore each per (batch, query head, block)."""
        if self.wgmma is None:
            return self.warps
        if self.wgmma.add_warp:  # (its staging after the tiles or in the streamed slots)
            return 1
        return self.wgmma.consumers * (1 if self.wgmma.add_map is not None else 4)

    def order_words(self, values) -> int:
        """The semaphores' int32 words for one launch's params-struct sizes `values`."""
        blocks = -(-int(values["loop_len"]) // self.block)
        return int(values["batches"]) * int(values["heads"]) * blocks * self.adders

    @property
    def threads(self) -> int:
        return self.wgmma.threads if self.wgmma is not None else self.warps * 32

    @property
    def kind(self) -> str:
        return "loop_dag"

    @property
    def tiles(self) -> tuple[SmemTile, ...]:
        return self.resident + self.streamed + self.staged

    def param(self, name: str) -> ProgramParam | None:
        return next((p for p in self.params if p.name == name), None)

    @property
    def n_acc(self) -> int | None:
        """The accumulators' N where they share one, else None (a tail each: `tails`)."""
        return self.tails[0].n if len(self.tails) == 1 else None

    def packed_along(self, along: str) -> PackedDim | None:
        """The packed line of the rows ("rows") or of the loop's dimension ("loop"), if any."""
        return next((d for d in self.packed if d.along == along), None)

    def gemm(self, name: str) -> DagGemm:
        return next(g for g in self.gemms if g.name == name)
