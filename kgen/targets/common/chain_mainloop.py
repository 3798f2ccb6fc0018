"""The pieces of a chained (back-to-back) kernel that run on mma.sync, ldmatrix and cp.async,
so on sm_80 and sm_90a alike: a chained stage's mainloop (A on chip, B streamed or resident),
the epilogue that feeds the next stage, 16-byte stores from registers, and a persistent
kernel's resident B loads and first-stage prefetch. kgen.targets.common.chain lays them out.
"""
from __future__ import annotations

from dataclasses import dataclass

from ...lower.epilogue import PAIR
from ...plan import GemmPlan, KernelPlan
from .operands import LDMATRIX_ROW_COL, dim_expr, operand, shifted
from .render import render_lines

INDENT = "  "


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


def zero_acc() -> list[str]:
    return [
        "float acc[kFragM][kFragN][4];",
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i)",
        "#pragma unroll",
        "  for (int j = 0; j < kFragN; ++j)",
        "#pragma unroll",
        "    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;",
    ]


def b_frag_loads(g: GemmPlan, kk: int, buf: int, stage: str) -> list[str]:
    b = g.b
    ld = "ldmatrix_x4_trans" if b.ldmatrix_trans else "ldmatrix_x4"
    lines = []
    for f, (xor, add) in enumerate(b.frag_steps[kk]):
        regs = ", ".join(f"b_frag[{buf}][{2 * f + n}][{r}]" for n in range(2) for r in range(2))
        lines.append(f"{ld}({regs}, {stage} + {shifted('b_base', xor * 2, add * 2)});")
    return lines


def a_frag_loads(g: GemmPlan, step: int, buf: int) -> list[str]:
    """ldmatrix of the intermediate tile at k step `step` of the whole K (smem residency)."""
    if g.a is None:
        return []
    eb = g.a.dtype.nbytes
    lines = []
    for f, (xor, add) in enumerate(g.a.frag_steps[step]):
        regs = ", ".join(f"a_frag[{buf}][{f}][{r}]" for r in range(4))
        lines.append(f"ldmatrix_x4({regs}, a_tile + {shifted('a_base', xor * eb, add * eb)});")
    return lines


def _b_load(g: GemmPlan, tile: int, slot: int) -> str:
    b = g.b
    args = f"n0, N, {tile} * kTileK, K" if b.k_major else f"{tile} * kTileK, K, n0, N"
    return (f"load_b_stage(b_smem + {slot} * kBStageBytes, p.{b.param}, p.ld_{b.param}, "
            f"{args}, tid);")


FRAG_ROWS = ("// This thread's fragment rows at k step 0; step (kk, f) is at (base ^ X) + Y, "
             "proved by kgen.")


def b_base_lines(b: dict) -> list[str]:
    """Inside a block: this thread's B fragment row offset at k step 0 (`b_base`)."""
    return ["  int warp_off = warp_n * kWarpTileN;", "  const int f = 0, kk = 0;",
            f"  b_base = BLayout::offset({b['frag_row']}, {b['frag_col']}) * {b['elem_bytes']};"]


def chained_mainloop(g: GemmPlan, prefetch: list[str] | None = None,
                      prefetch_groups: int = 0) -> list[str]:
    """A chained stage: A already on chip, B through kStages shared-memory stages. `prefetch`
    (a persistent kernel): the next tile's first-stage loads, issued once this stage's last B
    load is committed; the waits then count exactly the groups committed after each k tile's."""
    chain = g.chain
    b = operand(g.b, "b")
    stages, steps = g.stages, g.tile[2] // 16
    tiles = chain.k // g.tile[2]
    in_smem = g.a is not None
    prologue_tiles = min(stages - 1, tiles)
    last_refill = tiles - stages if tiles > stages - 1 else None  # k tile of the last B load
    group_of = {t: t for t in range(prologue_tiles)}  # k tile -> index of its cp.async group
    committed = stages - 1

    def wait(tile: int) -> str:
        if prefetch is None:
            return "cp_async_wait<kStages - 2>();"
        return f"cp_async_wait<{committed - 1 - group_of[tile]}>();  // k tile {tile}'s group has landed"

    def prefetch_lines() -> list[str]:
        nonlocal committed
        committed += prefetch_groups
        return [""] + prefetch

    lines = zero_acc() + [""]
    lines.append(f"const unsigned b_smem = smem_address(smem.{b['buffer']}());")
    if in_smem:
        lines.append(f"const unsigned a_tile = smem_address(smem.{g.a.smem.name}());")
    lines += [
        f"constexpr unsigned kBStageBytes = BLayout::kStageElems * {b['elem_bytes']};",
        "",
        f"// Prologue: fill kStages - 1 stages of {g.b.param}; A is already on chip. K is all of "
        f"{chain.source}'s N,",
        "// so the k tiles are a compile-time count and the loop below is unrolled.",
        "#pragma unroll",
        "for (int s = 0; s < kStages - 1; ++s) {",
        "  if (s < kKTiles) {",
        f"    {_b_load(g, 's', 's')}",
        "  }",
        "  cp_async_commit();",
        "}",
    ]
    if prefetch is not None and last_refill is None:
        lines += prefetch_lines()
    lines += [
        "",
        FRAG_ROWS,
    ]
    lines.append("unsigned b_base;" if not in_smem else "unsigned a_base, b_base;")
    lines += ["{", *b_base_lines(b)]
    if in_smem:
        row, col = LDMATRIX_ROW_COL[("a", True)]
        lines += ["  warp_off = warp_m * kWarpTileM;",
                  f"  a_base = ALayout::offset({row}, {col}) * "
                  f"{g.a.dtype.nbytes};"]
    lines += ["}", "", "unsigned b_frag[2][kFragN][2];"]
    if in_smem:
        lines.append("unsigned a_frag[2][kFragM][4];")
    why = (f" and every warp's rows of {chain.source}'s output tile are written" if in_smem else "")
    first_wait = ("  // Stage 0 has landed once at most kStages - 2 newer groups are in flight"
                  f"{why}." if prefetch is None else
                  f"  // Stage 0 has landed (the newer groups may still be in flight){why}.")
    lines += [
        "{",
        first_wait,
        "  " + wait(0),
        "  __syncthreads();",
        *[INDENT + x for x in a_frag_loads(g, 0, 0) + b_frag_loads(g, 0, 0, "b_smem")],
        "}",
    ]
    for kt in range(tiles):
        lines += ["", f"// k tile {kt} of {tiles}"]
        refill = kt + stages - 1
        if refill < tiles:
            lines.append(_b_load(g, refill, refill % stages))
        if prefetch is None or refill < tiles:  # a persistent kernel commits no empty group
            lines.append("cp_async_commit();")
            group_of[refill] = committed
            committed += 1
        if prefetch is not None and kt == last_refill:
            lines += prefetch_lines()
        here = f"b_smem + {kt % stages} * kBStageBytes" if kt % stages else "b_smem"
        there = (f"b_smem + {(kt + 1) % stages} * kBStageBytes" if (kt + 1) % stages
                 else "b_smem")
        for kk in range(steps):
            step = kt * steps + kk
            if kk + 1 < steps:
                lines.append(f"// k step {kk + 1}: fragments")
                lines += a_frag_loads(g, step + 1, (kk + 1) % 2)
                lines += b_frag_loads(g, kk + 1, (kk + 1) % 2, here)
            elif kt + 1 < tiles:
                lines += ["// next k tile, step 0: wait until it has landed, then read its fragments",
                          wait(kt + 1), "__syncthreads();"]
                lines += a_frag_loads(g, step + 1, 0)
                lines += b_frag_loads(g, 0, 0, there)
            a = f"a_frag[{kk % 2}]" if in_smem else f"{g.name}_a_frag[{step}]"
            lines += [f"// k step {kk}: MMAs", f"mma_step(acc, {a}, b_frag[{kk % 2}]);"]
    if prefetch is None:
        lines += ["cp_async_wait<0>();"]
    else:
        lines += [f"// Every {g.b.param} group has landed; only the next tile's prefetch is in flight."]
    return lines


def resident_mainloop(g: GemmPlan) -> list[str]:
    """A chained stage whose B is resident: A on chip, B in shared memory since the first tile
    (the first gemm's first wait and barrier saw it land), so no copy, wait or barrier here."""
    b = operand(g.b, "b")
    tiles, steps = g.chain.k // g.tile[2], g.tile[2] // 16
    lines = zero_acc() + [
        "",
        f"const unsigned b_smem = smem_address(smem.{b['buffer']}());  // all of "
        f"{g.b.param}, resident",
        f"constexpr unsigned kBStageBytes = BLayout::kStageElems * {b['elem_bytes']};",
        "",
        FRAG_ROWS,
        "unsigned b_base;",
        "{",
        *b_base_lines(b),
        "}",
        "",
        "// One buffer of fragments: the accumulators and A fragments hold most registers here,",
        "// and the few ldmatrix per tile wait on shared memory only.",
        "unsigned b_frag[1][kFragN][2];",
    ]
    for kt in range(tiles):
        here = f"b_smem + {kt} * kBStageBytes" if kt else "b_smem"
        lines += ["", f"// k tile {kt} of {tiles}"]
        for kk in range(steps):
            step = kt * steps + kk
            lines += [f"// k step {kk}", *b_frag_loads(g, kk, 0, here),
                      f"mma_step(acc, {g.name}_a_frag[{step}], b_frag[0]);"]
    return lines


def wide_store_lines(g: GemmPlan) -> list[str]:
    """The last gemm's epilogue as 16-byte stores (plan.wide_stores): per m16 row and run of four
    n8 tiles, each thread computes its four pairs, the quad transposes them, and thread q stores
    the 8 columns of n8 tile 4 jj + q. Pairs outside the output are zeros and never stored."""
    # columns past N exist only when the tiles overhang N; rows past M only in the last tile
    overhang = g.n_dim % g.tile[1] != 0
    return render_lines("common/wide_store_epilogue.inc.j2", out=g.epilogue.packed_store[0],
                        name=g.name, overhang=overhang,
                        col_check=" && col < N" if overhang else "")


def resident_loads(plan: KernelPlan) -> list[str]:
    """Every gemm's whole B, once per CTA, as one cp.async group older than the ring's first
    stages: the first gemm's first wait (and its barrier) covers it."""
    loads = []
    for g in plan.gemms:
        b = operand(g.b, "b")
        k = dim_expr(g.k_dim) if g.chain is None else str(g.chain.k)
        loads.append(ResidentLoad(name=g.name, cfg=cfg(g), buffer=b["buffer"],
                                  tiles=g.b.smem.stages, elem_bytes=b["elem_bytes"],
                                  param=g.b.param, args=_resident_b_args(g, k)))
    return render_lines("common/resident_loads.inc.j2", loads=loads,
                        params=", ".join(g.b.param for g in plan.gemms))


def _resident_b_args(g: GemmPlan, k: str) -> str:
    n = dim_expr(g.n_dim)
    tile_k = f"kt * {g.tile[2]}"
    return f"0, {n}, {tile_k}, {k}" if g.b.k_major else f"{tile_k}, {k}, 0, {n}"


def first_stages_function(plan: KernelPlan) -> list[str]:
    """`load_first_stages` in the first gemm's namespace (persistent kernels): its prologue for
    the CTA tile at row m0, from before the tile loop and from inside the last gemm's scope.
    A resident plan loads A only (B is resident): no n0, N or B buffer."""
    g = plan.gemms[0]
    return render_lines("common/load_first_stages.inc.j2", gemm=g.name, name=plan.name,
                        a=operand(g.a, "a"), b=operand(g.b, "b"), with_b=not plan.resident,
                        n_expr=dim_expr(g.n_dim), k_expr=dim_expr(g.k_dim))


def first_stage_loads(plan: KernelPlan, tile: str, why: list[str]) -> list[str]:
    """A block that issues the first gemm's prologue for linear tile `tile` (empty groups past
    the last tile)."""
    return render_lines("common/first_stage_loads.inc.j2", why=why, tile=tile,
                        cfg=cfg(plan.gemms[0]))


def feed_lines(g: GemmPlan, nxt: GemmPlan) -> list[str]:
    """The epilogue of a stage that feeds the next one: into registers or the shared tile."""
    dtype = nxt.chain.dtype
    if nxt.a is None:
        return render_lines("common/feed_registers.inc.j2", name=g.name, next=nxt.name,
                            dtype=dtype.dsl_name)
    pair, _, _, to_pair, _ = PAIR[dtype]
    tile = nxt.a.smem
    return render_lines("common/feed_smem.inc.j2", name=g.name, next=nxt.name,
                        dtype=dtype.dsl_name, swizzle=str(tile.swizzle), ctype=dtype.cpp,
                        tile=tile.name, pair=pair, layout=f"{cfg(nxt)}::ALayout",
                        pack_lo=to_pair.format("x0", "x1"), pack_hi=to_pair.format("x2", "x3"))
