"""The pieces of a chained (back-to-back) kernel that run on mma.sync, ldmatrix and cp.async,
so on sm_80 and sm_90a alike: a chained stage's mainloop (A on chip, B streamed or resident),
the epilogue that feeds the next stage, 16-byte stores from registers, and a persistent
kernel's resident B loads and first-stage prefetch. kgen.targets.common.chain lays them out.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...enums import Axis
from ...plan import GemmPlan, KernelPlan, LoadPath, TensorLoad, VectorLoad
from .epilogue_cpp import PAIR
from . import batch
from .operands import LDMATRIX_ROW_COL, LINES, KStep, dim_expr, load_args, operand, shifted
from .render import macro_lines, render_lines

INDENT = "  "
CHAIN_LINES = "common/chain_lines.inc.j2"


@dataclass(frozen=True, slots=True)
class KTile:
    """One k tile of a chained stage: its B refill and commit, a prefetch, its k steps."""

    index: int
    count: int
    refill: str
    commit: bool
    prefetch: tuple[str, ...]
    steps: tuple[KStep, ...]


@dataclass(frozen=True, slots=True)
class TileFragLoad:
    """One ldmatrix of a chained stage: four 8x8 matrices into registers `regs` ((fragment,
    register) of <operand>_frag[buf]) from shared address `tile` + `addr` (bytes)."""

    operand: str
    trans: bool
    buf: int
    regs: tuple[tuple[int, int], ...]
    tile: str
    addr: str


@dataclass(frozen=True, slots=True)
class ResidentLoad:
    """One gemm's whole B, loaded once per CTA into its stages (templates/common/resident_loads)."""

    name: str
    cfg: str
    buffer: str
    tiles: int
    elem_bytes: int
    param: str
    args: str  # row0, rows, col0, cols of k tile kt


def cfg(g: GemmPlan) -> str:
    return f"{g.name}_cfg"


def function_level(text: str) -> list[str]:
    """A fragment written at function level (two spaces) as lines without that indent; the
    caller indents them where they go."""
    return [x[2:] if x.startswith(INDENT) else x for x in text.rstrip("\n").split("\n")]


def block(lines: list[str]) -> list[str]:
    """Indent a stage's lines one level; preprocessor lines stay where they are."""
    return [line if not line or line.startswith("#") else INDENT + line for line in lines]


def _line(macro: str, **values) -> str:
    """The one line macro `macro` of templates/common/chain_lines.inc.j2 lays out."""
    (line,) = macro_lines(CHAIN_LINES, macro, **values)
    return line


def b_frag_loads(g: GemmPlan, kk: int, buf: int, stage: str) -> list[str]:
    """ldmatrix of B's k step `kk` from the shared stage at address `stage` into `buf`."""
    b = g.b
    loads = [TileFragLoad(operand="b", trans=b.ldmatrix_trans, buf=buf,
                          regs=tuple((2 * f + n, r) for n in range(2) for r in range(2)),
                          tile=stage, addr=shifted("b_base", xor * 2, add * 2))
             for f, (xor, add) in enumerate(b.frag_steps[kk])]
    return macro_lines(CHAIN_LINES, "frag_loads", loads=loads)


def a_frag_loads(g: GemmPlan, step: int, buf: int) -> list[str]:
    """ldmatrix of the intermediate tile at k step `step` of the whole K (smem residency)."""
    if g.a is None:
        return []
    eb = g.a.dtype.nbytes
    loads = [TileFragLoad(operand="a", trans=False, buf=buf,
                          regs=tuple((f, r) for r in range(4)), tile="a_tile",
                          addr=shifted("a_base", xor * eb, add * eb))
             for f, (xor, add) in enumerate(g.a.frag_steps[step])]
    return macro_lines(CHAIN_LINES, "frag_loads", loads=loads)


def _b_load(g: GemmPlan, tile: int | str, slot: int | str) -> str:
    """B's k tile `tile` into shared stage `slot`."""
    return _line("b_load", slot=slot, param=g.b.param, args=load_args(g.b, "b", k_tile=str(tile)))


def chained_mainloop(g: GemmPlan, prefetch: list[str] | None = None,
                     prefetch_groups: int = 0) -> list[str]:
    """A chained stage: A already on chip, B through kStages shared-memory stages. `prefetch`
    (a persistent kernel): the next tile's first-stage loads, issued once this stage's last B
    load is committed; the waits then count exactly the groups committed after each k tile's."""
    chain = g.chain
    stages, steps = g.stages, g.tile[2] // 16
    tiles = chain.k // g.tile[2]
    in_smem = g.a is not None
    prologue_tiles = min(stages - 1, tiles)
    last_refill = tiles - stages if tiles > stages - 1 else None  # k tile of the last B load
    group_of = {t: t for t in range(prologue_tiles)}  # k tile -> index of its cp.async group
    committed = stages - 1

    def wait(tile: int) -> str:
        if prefetch is None:  # the ring's wait: every stage but the newest has landed
            return "".join(macro_lines(LINES, "ring_wait"))
        return _line("group_wait", newer=committed - 1 - group_of[tile], tile=tile)

    prologue_prefetch: list[str] = []
    if prefetch is not None and last_refill is None:
        prologue_prefetch = prefetch
        committed += prefetch_groups
    why = (f" and every warp's rows of {chain.source}'s output tile are written" if in_smem else "")
    first_wait_comment = ("// Stage 0 has landed once at most kStages - 2 newer groups are in "
                          f"flight{why}." if prefetch is None else
                          f"// Stage 0 has landed (the newer groups may still be in flight){why}.")
    first_wait = wait(0)
    first_loads = a_frag_loads(g, 0, 0) + b_frag_loads(g, 0, 0, "b_smem")
    k_tiles = []
    for kt in range(tiles):
        refill = kt + stages - 1
        commit = prefetch is None or refill < tiles  # a persistent kernel commits no empty group
        if commit:
            group_of[refill] = committed
            committed += 1
        tile_prefetch: tuple[str, ...] = ()
        if prefetch is not None and kt == last_refill:
            tile_prefetch = tuple(prefetch)
            committed += prefetch_groups
        here = f"b_smem + {kt % stages} * kBStageBytes" if kt % stages else "b_smem"
        there = (f"b_smem + {(kt + 1) % stages} * kBStageBytes" if (kt + 1) % stages
                 else "b_smem")
        k_steps = []
        for kk in range(steps):
            step = kt * steps + kk
            fetch, next_wait, loads = "", "", []
            # fragments alternate between two buffers by the chain's step, not the tile's:
            # a k tile of one step (16 wide, a source N of 16 mod 32) still alternates
            this, other = step % 2, (step + 1) % 2
            if kk + 1 < steps:
                fetch = "step"
                loads = (a_frag_loads(g, step + 1, other)
                         + b_frag_loads(g, kk + 1, other, here))
            elif kt + 1 < tiles:
                fetch, next_wait = "tile", wait(kt + 1)
                loads = a_frag_loads(g, step + 1, other) + b_frag_loads(g, 0, other, there)
            a = f"a_frag[{this}]" if in_smem else f"{g.name}_a_frag[{step}]"
            k_steps.append(KStep(kk=kk, next_kk=kk + 1, fetch=fetch, wait=next_wait,
                                 loads=tuple(loads), a=a, buf=this))
        k_tiles.append(KTile(index=kt, count=tiles,
                             refill=_b_load(g, refill, refill % stages) if refill < tiles else "",
                             commit=commit, prefetch=tile_prefetch, steps=tuple(k_steps)))
    a_base = None
    if in_smem:
        row, col = LDMATRIX_ROW_COL[("a", True)]
        a_base = dict(frag_row=row, frag_col=col, elem_bytes=g.a.dtype.nbytes)
    return render_lines(
        "common/chained_mainloop.inc.j2", b=operand(g.b, "b"), source=chain.source,
        a_tile=g.a.smem.name if in_smem else "", prologue_load=_b_load(g, "s", "s"),
        prologue_prefetch=prologue_prefetch, a_base=a_base,
        first_wait_comment=first_wait_comment, first_wait=first_wait, first_loads=first_loads,
        tiles=k_tiles, prefetching=prefetch is not None)


def resident_mainloop(g: GemmPlan) -> list[str]:
    """A chained stage whose B is resident: A on chip, B in shared memory since the first tile
    (the first gemm's first wait and barrier saw it land), so no copy, wait or barrier here.
    One buffer of fragments (KStep.buf 0)."""
    tiles, steps = g.chain.k // g.tile[2], g.tile[2] // 16
    k_tiles = []
    for kt in range(tiles):
        here = f"b_smem + {kt} * kBStageBytes" if kt else "b_smem"
        k_steps = tuple(
            KStep(kk=kk, next_kk=kk + 1, fetch="", wait="",
                  loads=tuple(b_frag_loads(g, kk, 0, here)),
                  a=f"{g.name}_a_frag[{kt * steps + kk}]", buf=0)
            for kk in range(steps))
        k_tiles.append(KTile(index=kt, count=tiles, refill="", commit=False, prefetch=(),
                             steps=k_steps))
    return render_lines("common/resident_mainloop.inc.j2", b=operand(g.b, "b"), a_base=None,
                        tiles=k_tiles)


def wide_store_lines(g: GemmPlan) -> list[str]:
    """The last gemm's epilogue as 16-byte stores (StorePath.WIDE): per m16 row and run of four
    n8 tiles, each thread computes its four pairs, the quad transposes them, and thread q stores
    the 8 columns of n8 tile 4 jj + q. Pairs outside the output are zeros and never stored."""
    # columns past N exist only when the tiles overhang N; rows past M only in the last tile
    overhang = g.n_dim % g.tile[1] != 0
    return render_lines("common/wide_store_epilogue.inc.j2", out=g.epilogue.packed_store.param,
                        name=g.name, overhang=overhang,
                        col_check=" && col < N" if overhang else "")


def resident_loads(plan: KernelPlan) -> list[str]:
    """Every resident B, once per CTA, as one cp.async group older than the ring's first
    stages: the first gemm's first wait (and its barrier) covers it."""
    loads = []
    resident = [g for g in plan.gemms
                if plan.schedule.gemm(g.name).pipeline.b.load is LoadPath.RESIDENT]
    for g in resident:
        b = operand(g.b, "b")
        k = dim_expr(g.k_dim) if g.chain is None else str(g.chain.k)
        # the last B of a chain in column blocks: this CTA's block of it (KernelPlan.column_blocks)
        n0 = (f"(blockIdx.x % tiles_n) * {cfg(g)}::kTileN"
              if plan.column_blocks > 1 and g is plan.gemms[-1] else "0")
        loads.append(ResidentLoad(name=g.name, cfg=cfg(g), buffer=b["buffer"],
                                  tiles=g.b.smem.stages, elem_bytes=b["elem_bytes"],
                                  param=g.b.param, args=_resident_b_args(g, k, n0)))
    return render_lines("common/resident_loads.inc.j2", loads=loads,
                        params=", ".join(g.b.param for g in resident))


def _resident_b_args(g: GemmPlan, k: str, n0: str = "0") -> str:
    n = dim_expr(g.n_dim)
    tile_k = f"kt * {g.tile[2]}"
    return f"{n0}, {n}, {tile_k}, {k}" if g.b.k_major else f"{tile_k}, {k}, {n0}, {n}"


def first_stages_function(plan: KernelPlan) -> list[str]:
    """`load_first_stages` in the first gemm's namespace (persistent kernels): its prologue for
    the CTA tile at row m0, from before the tile loop and from inside the last gemm's scope.
    A resident plan loads A only (B is resident): no n0, N or B buffer."""
    g = plan.gemms[0]
    return render_lines("common/load_first_stages.inc.j2", gemm=g.name, name=plan.name,
                        a=operand(g.a, "a"), b=operand(g.b, "b"), with_b=not plan.schedule.resident,
                        n_expr=dim_expr(g.n_dim), k_expr=dim_expr(g.k_dim))


def first_stage_loads(plan: KernelPlan, tile: str, why: list[str]) -> list[str]:
    """A block that issues the first gemm's prologue for linear tile `tile` (empty groups past
    the last tile)."""
    # a batched kernel's prefetch of the next tile takes what the tile's top computed: its
    # coordinates and arguments (no division amid the last gemm's registers)
    precomputed = batch.batched(plan) and tile == "next_tile"
    return render_lines("common/first_stage_loads.inc.j2", why=why, tile=tile,
                        cfg=cfg(plan.gemms[0]), precomputed=precomputed,
                        params="next_p" if precomputed else batch.tile_params(plan, tile))


def feed_reads_rows(g: GemmPlan) -> bool:
    """Whether the epilogue that feeds the next stage reads memory at a pair's row (a row
    vector, or an input shaped like the output) or reduces. Only then does it skip the rows
    past M. Otherwise it runs on every row, branch-free (its column reads stay inside the
    stage's N, which one tile covers), and those rows take zeros after. The skipped rows' branches
    kept each call's loads apart: g0's epilogue of relu(acc * scale0[col] + bias0[col]) took
    1620-1975 cycles per 64-row tile at N0 = 128 on an H200 (bench/prototypes/chain_clock.py)."""
    if g.epilogue.reductions:
        return True
    return any(isinstance(n.kind, TensorLoad)
               or isinstance(n.kind, VectorLoad) and n.kind.axis is Axis.ROW
               for n in g.epilogue.nodes)


def early_vectors(g: GemmPlan, params: tuple[str, ...]) -> list[tuple[str, str]]:
    """(param, pair type) of each of `params`, g's epilogue column vectors loaded before its
    mainloop (EpilogueVectors, REGISTERS), in the schedule's order."""
    dtypes = g.epilogue.column_vectors
    return [(param, PAIR[dtypes[param]][0]) for param in params]


def early_lines(g: GemmPlan, params: tuple[str, ...]) -> list[str]:
    """Each thread's pairs of g's early column vectors, loaded at the top of the stage (before
    its mainloop) at the columns its epilogue reads."""
    if not params:
        return []
    return render_lines("common/early_vectors.inc.j2", name=g.name,
                        vectors=early_vectors(g, params))


def feed_lines(g: GemmPlan, nxt: GemmPlan, early: tuple[str, ...] = ()) -> list[str]:
    """The epilogue of a stage that feeds the next one: into registers or the shared tile.
    `early`: the column vectors its epilogue takes as arguments (early_lines loaded them)."""
    dtype = nxt.chain.dtype
    predicated = feed_reads_rows(g)
    early_args = "".join(f", early_{param}[j]" for param in early)
    if nxt.a is None:
        return render_lines("common/feed_registers.inc.j2", name=g.name, next=nxt.name,
                            dtype=dtype.dsl_name, predicated=predicated, early_args=early_args)
    pair, _, _, to_pair, _ = PAIR[dtype]
    tile = nxt.a.smem
    return render_lines("common/feed_smem.inc.j2", name=g.name, next=nxt.name,
                        predicated=predicated, early_args=early_args,
                        dtype=dtype.dsl_name, swizzle=str(tile.swizzle), ctype=dtype.cpp,
                        tile=tile.name, pair=pair, layout=f"{cfg(nxt)}::ALayout",
                        pack_lo=to_pair.format("x0", "x1"), pack_hi=to_pair.format("x2", "x3"))
