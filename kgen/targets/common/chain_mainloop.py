"""The pieces of a chained (back-to-back) kernel that run on mma.sync, ldmatrix and cp.async,
so on sm_80 and sm_90a alike: a chained stage's mainloop (A on chip, B streamed or resident),
the epilogue that feeds the next stage, 16-byte stores from registers, and a persistent
kernel's resident B loads and first-stage prefetch. kgen.targets.common.chain lays them out.
"""
from __future__ import annotations

from ...lower.epilogue import PAIR
from ...plan import GemmPlan, KernelPlan
from .operands import LDMATRIX_ROW_COL, dim_expr, operand, shifted
from .render import render

INDENT = "  "


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
    out = g.epilogue.packed_store[0]
    # columns past N exist only when the tiles overhang N; rows past M only in the last tile
    overhang = g.n_dim % g.tile[1] != 0
    col_ok = " && col < N" if overhang else ""
    return [
        "// Thread q = lane % 4 holds columns 2q, 2q + 1 of each n8 tile; after quad_transpose it "
        "holds 8 whole",
        f"// columns of {out}, stored as one 16-byte chunk (rows g and g + 8 of each m16 tile).",
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i) {",
        "#pragma unroll",
        "  for (int h = 0; h < 2; ++h) {",
        "    const int row = m0 + warp_m * kWarpTileM + i * 16 + lane / 4 + 8 * h;",
        "    const bool live = row < M;  // the epilogue may read row-indexed inputs",
        "#pragma unroll",
        "    for (int jj = 0; jj < kFragN / 4; ++jj) {",
        "      unsigned pairs[4] = {0u, 0u, 0u, 0u};",
        "      if (live) {",
        "#pragma unroll",
        "        for (int j = 0; j < 4; ++j) {",
        "          const int col = n0 + warp_n * kWarpTileN + (4 * jj + j) * 8 + (lane % 4) * 2;",
        *(["          if (col < N)"] if overhang else []),
        f"          pairs[j] = {g.name}_epilogue(p, row, col, acc[i][4 * jj + j][2 * h], "
        "acc[i][4 * jj + j][2 * h + 1]);",
        "        }",
        "      }",
        "      const uint4 chunk = quad_transpose(pairs, lane);  // every lane takes part",
        "      const int col = n0 + warp_n * kWarpTileN + jj * 32 + (lane % 4) * 8;",
        f"      if (live{col_ok}) *reinterpret_cast<uint4*>(p.{out} + row * p.ld_{out} + "
        "col) = chunk;",
        "    }",
        "  }",
        "}",
    ]


def resident_loads(plan: KernelPlan) -> list[str]:
    """Every gemm's whole B, once per CTA, as one cp.async group older than the ring's first
    stages: the first gemm's first wait (and its barrier) covers it."""
    lines = [f"// Resident: all of {', '.join(g.b.param for g in plan.gemms)}, loaded once; "
             "one cp.async group.", "{"]
    for g in plan.gemms:
        b = operand(g.b, "b")
        cfg_name = cfg(g)
        k = dim_expr(g.k_dim) if g.chain is None else str(g.chain.k)
        lines += block([
            f"const unsigned {g.name}_b = smem_address(smem.{b['buffer']}());",
            f"for (int kt = 0; kt < {g.b.smem.stages}; ++kt)",
            f"  {cfg_name}::load_b_stage({g.name}_b + kt * ({cfg_name}::BLayout::kStageElems * "
            f"{b['elem_bytes']}), p.{g.b.param}, p.ld_{g.b.param},",
            f"                      {_resident_b_args(g, k)}, tid);",
        ])
    return lines + ["  cp_async_commit();", "}"]


def _resident_b_args(g: GemmPlan, k: str) -> str:
    n = dim_expr(g.n_dim)
    tile_k = f"kt * {g.tile[2]}"
    return f"0, {n}, {tile_k}, {k}" if g.b.k_major else f"{tile_k}, {k}, 0, {n}"


def _prologue_lines(g: GemmPlan) -> list[str]:
    """The first gemm's prologue (kStages - 1 cp.async groups), at function level."""
    a, b = operand(g.a, "a"), operand(g.b, "b")
    text = render("common/prologue.inc.j2", a=a, b=b)
    return function_level(text)


def first_stages_function(plan: KernelPlan) -> list[str]:
    """`load_first_stages` in the first gemm's namespace (persistent kernels): its prologue for
    the CTA tile at row m0, from before the tile loop and from inside the last gemm's scope."""
    g = plan.gemms[0]
    a, b = operand(g.a, "a"), operand(g.b, "b")
    return [
        f"// The first kStages - 1 stages of {g.name} for the CTA tile at row m0, one cp.async "
        "group each; the groups",
        "// are committed empty when `valid` is false, so that every thread counts the same groups.",
        f"__device__ __forceinline__ void load_first_stages(const {plan.name}_params& p, "
        "SharedStorage& smem, int m0, int M,",
        "                                                  bool valid, int tid) {",
        *block(_first_stages_body(plan, a, b)),
        "}",
    ]


def _first_stages_body(plan: KernelPlan, a: dict, b: dict) -> list[str]:
    """A resident plan loads A only (B is resident): no n0, N or B buffer."""
    g = plan.gemms[0]
    with_b = not plan.resident
    return [
        *(["const int n0 = 0;", f"const int N = {dim_expr(g.n_dim)};"] if with_b else []),
        f"const int K = {dim_expr(g.k_dim)};",
        f"const unsigned a_smem = smem_address(smem.{a['buffer']}());",
        *([f"const unsigned b_smem = smem_address(smem.{b['buffer']}());"] if with_b else []),
        f"constexpr unsigned kAStageBytes = {a['layout']}::kStageElems * {a['elem_bytes']};",
        *([f"constexpr unsigned kBStageBytes = {b['layout']}::kStageElems * {b['elem_bytes']};"]
          if with_b else []),
        "const int k_tiles = valid ? (K + kTileK - 1) / kTileK : 0;",
        *(_prologue_lines(g) if with_b else _ring_prologue_lines(a)),
    ]


def _ring_prologue_lines(a: dict) -> list[str]:
    """The first tile's first kStages - 1 k tiles of A into ring slots 0.. (B is resident)."""
    return [
        "// Prologue: fill kStages - 1 ring slots with A; one cp.async group each, even when empty.",
        "#pragma unroll",
        "for (int s = 0; s < kStages - 1; ++s) {",
        "  if (s < k_tiles) {",
        f"    {a['load_fn']}(a_smem + s * kAStageBytes, p.{a['param']}, p.ld_{a['param']}, "
        f"{a['load_args']}, tid);",
        "  }",
        "  cp_async_commit();",
        "}",
    ]


def first_stage_loads(plan: KernelPlan, tile: str, why: list[str]) -> list[str]:
    """A block that issues the first gemm's prologue for linear tile `tile` (empty groups past
    the last tile)."""
    first = cfg(plan.gemms[0])
    return [
        *why,
        "{",
        *block([
            "int load_m = 0, load_n = 0;",
            f"if ({tile} < tiles) tile_coords({tile}, tiles_m, tiles_n, load_m, load_n);",
            f"{first}::load_first_stages(p, smem, load_m * {first}::kTileM, M, {tile} < tiles, tid);",
        ]),
        "}",
    ]


def feed_lines(g: GemmPlan, nxt: GemmPlan) -> list[str]:
    """The epilogue of a stage that feeds the next one: into registers or the shared tile."""
    dtype = nxt.chain.dtype
    pair, _, _, to_pair, _ = PAIR[dtype]
    head = [
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i) {",
        "#pragma unroll",
        "  for (int j = 0; j < kFragN; ++j) {",
        "    const int r = warp_m * kWarpTileM + i * 16 + lane / 4;  // row in the CTA tile",
        "    const int c = warp_n * kWarpTileN + j * 8 + (lane % 4) * 2;",
        "    float x0 = 0.0f, x1 = 0.0f, x2 = 0.0f, x3 = 0.0f;",
        f"    if (m0 + r < M) {g.name}_epilogue(p, m0 + r, c, acc[i][j][0], acc[i][j][1], x0, x1);",
        f"    if (m0 + r + 8 < M) {g.name}_epilogue(p, m0 + r + 8, c, acc[i][j][2], acc[i][j][3], "
        "x2, x3);",
    ]
    if nxt.a is None:
        comment = [
            f"// Epilogue of {g.name} into registers: each pair goes through the epilogue, is "
            f"rounded once to {dtype.dsl_name}",
            f"// and packed as {nxt.name}'s A fragments. The m16n8 accumulators of n8 tiles 2kk "
            "and 2kk + 1 are",
            "// the m16n8k16 A fragment of k step kk: a0 = (2kk: c0 c1), a1 = (2kk: c2 c3), "
            "a2 = (2kk + 1: c0 c1),",
            "// a3 = (2kk + 1: c2 c3). Rows past M feed zeros (their results are never stored).",
        ]
        body = [
            f"    {nxt.name}_a_frag[j / 2][i][(j % 2) * 2] = pack_operands(x0, x1);",
            f"    {nxt.name}_a_frag[j / 2][i][(j % 2) * 2 + 1] = pack_operands(x2, x3);",
        ]
        return comment + head + body + ["  }", "}"]
    tile = nxt.a.smem
    layout = f"{cfg(nxt)}::ALayout"
    comment = [
        f"// Epilogue of {g.name} into shared memory: its output tile, rounded once to "
        f"{dtype.dsl_name}, K-major and",
        f"// {tile.swizzle} for {nxt.name}'s ldmatrix (conflict-free 4-byte stores too). Rows "
        "past M hold zeros.",
        f"{dtype.cpp}* out_tile = smem.{tile.name}();",
    ]
    body = [
        f"    *reinterpret_cast<{pair}*>(out_tile + {layout}::offset(r, c)) = "
        f"{to_pair.format('x0', 'x1')};",
        f"    *reinterpret_cast<{pair}*>(out_tile + {layout}::offset(r + 8, c)) = "
        f"{to_pair.format('x2', 'x3')};",
    ]
    return comment + head + body + ["  }", "}"]
