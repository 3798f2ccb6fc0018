"""sm_80 emitter of chained gemms (back-to-back): every stage in one CTA, the intermediate on chip.

The kernel runs the stages in order, each in its own block scope that opens the stage's
configuration namespace (`using namespace g0_cfg;`), so a stage's code reads like the single
gemm kernel's: the first stage is exactly that mainloop (templates/sm80/mainloop.inc.j2), a
chained stage reads A from registers or from the shared tile its source's epilogue wrote, and
streams B through its own cp.async pipeline over a k-tile count known at compile time (its K is
the source's whole N), unrolled here. Every string is prepared here; the template lays it out.

A persistent plan (plan.persistent) wraps the stages in a loop over tiles (tile += gridDim.x)
and issues the next tile's first stages of the first gemm (`load_first_stages`) behind the last
gemm's last B load; the last gemm's waits then count its cp.async groups exactly.
"""
from __future__ import annotations

from ... import ir
from ...lower.fragments import LDMATRIX
from ...lower import schedule
from ...plan import GemmPlan, KernelPlan
from ..common import epilogue_cpp, host_api
from ..common.epilogue_cpp import PAIR
from ..common.render import render
from . import epilogue as epilogue_emit, gemm as gemm_emit

INDENT = "  "
BARRIER_CTYPE = "unsigned long long"  # the only buffers without a dtype: mbarriers


def _cfg(g: GemmPlan) -> str:
    return f"{g.name}_cfg"


def _function_level(text: str) -> list[str]:
    """A fragment written at function level (two spaces) as lines without that indent; the
    caller indents them where they go."""
    return [x[2:] if x.startswith(INDENT) else x for x in text.rstrip("\n").split("\n")]


def _block(lines: list[str]) -> list[str]:
    """Indent a stage's lines one level; preprocessor lines stay where they are."""
    return [line if not line or line.startswith("#") else INDENT + line for line in lines]


def _zero_acc() -> list[str]:
    return [
        "float acc[kFragM][kFragN][4];",
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i)",
        "#pragma unroll",
        "  for (int j = 0; j < kFragN; ++j)",
        "#pragma unroll",
        "    for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;",
    ]


def _b_frag_loads(g: GemmPlan, kk: int, buf: int, stage: str) -> list[str]:
    b = g.b
    ld = "ldmatrix_x4_trans" if b.ldmatrix_trans else "ldmatrix_x4"
    lines = []
    for f, (xor, add) in enumerate(b.frag_steps[kk]):
        regs = ", ".join(f"b_frag[{buf}][{2 * f + n}][{r}]" for n in range(2) for r in range(2))
        lines.append(f"{ld}({regs}, {stage} + {gemm_emit._shifted('b_base', xor * 2, add * 2)});")
    return lines


def _a_frag_loads(g: GemmPlan, step: int, buf: int) -> list[str]:
    """ldmatrix of the intermediate tile at k step `step` of the whole K (smem residency)."""
    if g.a is None:
        return []
    eb = g.a.dtype.nbytes
    lines = []
    for f, (xor, add) in enumerate(g.a.frag_steps[step]):
        regs = ", ".join(f"a_frag[{buf}][{f}][{r}]" for r in range(4))
        lines.append(f"ldmatrix_x4({regs}, a_tile + {gemm_emit._shifted('a_base', xor * eb, add * eb)});")
    return lines


def _b_load(g: GemmPlan, tile: int, slot: int) -> str:
    b = g.b
    args = f"n0, N, {tile} * kTileK, K" if b.k_major else f"{tile} * kTileK, K, n0, N"
    return (f"load_b_stage(b_smem + {slot} * kBStageBytes, p.{b.param}, p.ld_{b.param}, "
            f"{args}, tid);")


FRAG_ROWS = ("// This thread's fragment rows at k step 0; step (kk, f) is at (base ^ X) + Y, "
             "proved by kgen.")


def _b_base_lines(b: dict) -> list[str]:
    """Inside a block: this thread's B fragment row offset at k step 0 (`b_base`)."""
    return ["  int warp_off = warp_n * kWarpTileN;", "  const int f = 0, kk = 0;",
            f"  b_base = BLayout::offset({b['frag_row']}, {b['frag_col']}) * {b['elem_bytes']};"]


def _chained_mainloop(g: GemmPlan, prefetch: list[str] | None = None,
                      prefetch_groups: int = 0) -> list[str]:
    """A chained stage: A already on chip, B through kStages shared-memory stages. `prefetch`
    (a persistent kernel): the next tile's first-stage loads, issued once this stage's last B
    load is committed; the waits then count exactly the groups committed after each k tile's."""
    chain = g.chain
    b = gemm_emit._operand(g, g.b, "b")
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

    lines = _zero_acc() + [""]
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
    lines += ["{", *_b_base_lines(b)]
    if in_smem:
        fmap = LDMATRIX[("a", True)]
        lines += ["  warp_off = warp_m * kWarpTileM;",
                  f"  a_base = ALayout::offset({fmap.outer_cpp}, {fmap.inner_cpp}) * "
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
        *[INDENT + x for x in _a_frag_loads(g, 0, 0) + _b_frag_loads(g, 0, 0, "b_smem")],
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
                lines += _a_frag_loads(g, step + 1, (kk + 1) % 2)
                lines += _b_frag_loads(g, kk + 1, (kk + 1) % 2, here)
            elif kt + 1 < tiles:
                lines += ["// next k tile, step 0: wait until it has landed, then read its fragments",
                          wait(kt + 1), "__syncthreads();"]
                lines += _a_frag_loads(g, step + 1, 0)
                lines += _b_frag_loads(g, 0, 0, there)
            a = f"a_frag[{kk % 2}]" if in_smem else f"{g.name}_a_frag[{step}]"
            lines += [f"// k step {kk}: MMAs", f"mma_step(acc, {a}, b_frag[{kk % 2}]);"]
    if prefetch is None:
        lines += ["cp_async_wait<0>();"]
    else:
        lines += [f"// Every {g.b.param} group has landed; only the next tile's prefetch is in flight."]
    return lines


def _resident_mainloop(g: GemmPlan, wgmma: bool) -> list[str]:
    """A chained stage whose B is resident: A on chip, B in shared memory since the first tile
    (the first gemm's first wait and barrier saw it land), so no copy, wait or barrier here."""
    b = gemm_emit._operand(g, g.b, "b")
    tiles, steps = g.chain.k // g.tile[2], g.tile[2] // 16
    if wgmma:
        return _resident_wgmma(g, b, tiles, steps)
    lines = _zero_acc() + [
        "",
        f"const unsigned b_smem = smem_address(smem.{b['buffer']}());  // all of "
        f"{g.b.param}, resident",
        f"constexpr unsigned kBStageBytes = BLayout::kStageElems * {b['elem_bytes']};",
        "",
        FRAG_ROWS,
        "unsigned b_base;",
        "{",
        *_b_base_lines(b),
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
            lines += [f"// k step {kk}", *_b_frag_loads(g, kk, 0, here),
                      f"mma_step(acc, {g.name}_a_frag[{step}], b_frag[0]);"]
    return lines


def _resident_wgmma(g: GemmPlan, b: dict, tiles: int, steps: int) -> list[str]:
    """The resident chained stage on wgmma (plan.wgmma_chain): the warpgroup's rows times all
    of B, one k16 step per instruction, A from this thread's fragments, B through descriptors;
    one commit group, waited on before the epilogue reads the accumulators."""
    src = g.chain.source
    lines = _zero_acc() + [
        "",
        f"const unsigned b_smem = smem_address(smem.{b['buffer']}());  // all of "
        f"{g.b.param}, resident",
        *([f"constexpr unsigned kBStageBytes = BLayout::kStageElems * {b['elem_bytes']};"]
          if tiles > 1 else []),
        "",
        f"// wgmma: A is {src}'s output in registers (the m16n8k16 A fragments are wgmma's "
        "register layout",
        "// for a warp's 16 rows), B is read from shared memory; no ldmatrix.",
        "wgmma_fence();  // the A fragments and accumulators were written by ordinary "
        "instructions",
    ]
    for kt in range(tiles):
        here = f"b_smem + {kt} * kBStageBytes" if kt else "b_smem"
        for kk in range(steps):
            step = kt * steps + kk
            at = f"{here} + {kk * 32}" if kk else here
            lines.append(f"wgmma_step_rs(acc, {g.name}_a_frag[{step}][0], smem_descriptor({at}));")
    return lines + ["wgmma_commit();", "wgmma_wait<0>();"]


def _wide_store_lines(g: GemmPlan) -> list[str]:
    """The last gemm's epilogue as 16-byte stores (plan.wide_stores): per m16 row and run of four
    n8 tiles, each thread computes its four pairs, the quad transposes them, and thread q stores
    the 8 columns of n8 tile 4 jj + q. Pairs outside the output are zeros and never stored."""
    out = g.epilogue.packed_store.param
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


def _tma_store_lines(g: GemmPlan) -> list[str]:
    """The last gemm's epilogue through the copy engine (plan.tma_store): the warpgroup writes
    its tile into its staging as 64x64 swizzled boxes, then one thread stores the boxes with
    cp.async.bulk.tensor. The staging is rewritten only once the copy engine has read the last
    tile's boxes. Rows past M hold zeros and are clipped by the tensor map."""
    out = g.epilogue.packed_store.param
    return [
        f"// {out} through the copy engine: this warpgroup's staging takes the tile as 64x64 "
        "boxes (128-byte swizzle),",
        "// then one thread stores each box with cp.async.bulk.tensor.",
        f"const unsigned staging = smem_address(smem.{g.name}_d_staging()) + warpgroup * "
        "(kTileN / 64) * kStagingBoxBytes;",
        "if (tid % kWarpgroupThreads == 0) bulk_wait_read();  // the copy engine has read this "
        "warpgroup's last tile",
        "warpgroup_barrier(warpgroup);",
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i) {",
        "#pragma unroll",
        "  for (int h = 0; h < 2; ++h) {",
        "    const int r = warp_m * kWarpTileM + i * 16 + lane / 4 + 8 * h;  // row in the tile",
        "    const bool live = m0 + r < M;  // the epilogue may read row-indexed inputs",
        "#pragma unroll",
        "    for (int j = 0; j < kFragN; ++j) {",
        "      const int c = warp_n * kWarpTileN + j * 8 + (lane % 4) * 2;  // column in the tile",
        f"      const unsigned pair = live ? {g.name}_epilogue(p, m0 + r, n0 + c, acc[i][j][2 * h], "
        "acc[i][j][2 * h + 1]) : 0u;",
        "      st_shared_b32(staging + (c / 64) * kStagingBoxBytes + staging_offset(r, c % 64), pair);",
        "    }",
        "  }",
        "}",
        "fence_proxy_async();  // written through the generic proxy, read by the copy engine",
        "warpgroup_barrier(warpgroup);",
        "if (tid % kWarpgroupThreads == 0) {",
        "#pragma unroll",
        "  for (int box = 0; box < kTileN / 64; ++box)",
        f"    tma_store_box(&maps.{out}, staging + box * kStagingBoxBytes, n0 + box * 64, m0);",
        "  bulk_commit();",
        "}",
    ]


def _resident_loads(plan: KernelPlan) -> list[str]:
    """Every gemm's whole B, once per CTA, as one cp.async group older than the ring's first
    stages: the first gemm's first wait (and its barrier) covers it."""
    lines = [f"// Resident: all of {', '.join(g.b.param for g in plan.gemms)}, loaded once; "
             "one cp.async group.", "{"]
    for g in plan.gemms:
        b = gemm_emit._operand(g, g.b, "b")
        cfg = _cfg(g)
        k = _dim(g.k_dim) if g.chain is None else str(g.chain.k)
        lines += _block([
            f"const unsigned {g.name}_b = smem_address(smem.{b['buffer']}());",
            f"for (int kt = 0; kt < {g.b.smem.stages}; ++kt)",
            f"  {cfg}::load_b_stage({g.name}_b + kt * ({cfg}::BLayout::kStageElems * "
            f"{b['elem_bytes']}), p.{g.b.param}, p.ld_{g.b.param},",
            f"                      {_resident_b_args(g, k)}, tid);",
        ])
    return lines + ["  cp_async_commit();", "}"]


def _resident_b_args(g: GemmPlan, k: str) -> str:
    n = _dim(g.n_dim)
    tile_k = f"kt * {g.tile[2]}"
    return f"0, {n}, {tile_k}, {k}" if g.b.k_major else f"{tile_k}, {k}, 0, {n}"


def _prologue_lines(g: GemmPlan) -> list[str]:
    """The first gemm's prologue (kStages - 1 cp.async groups), at function level."""
    a, b = gemm_emit._operand(g, g.a, "a"), gemm_emit._operand(g, g.b, "b")
    text = render("sm80/prologue.inc.j2", a=a, b=b)
    return _function_level(text)


def _first_stages_function(plan: KernelPlan) -> list[str]:
    """`load_first_stages` in the first gemm's namespace (persistent kernels): its prologue for
    the CTA tile at row m0, from before the tile loop and from inside the last gemm's scope."""
    g = plan.gemms[0]
    a, b = gemm_emit._operand(g, g.a, "a"), gemm_emit._operand(g, g.b, "b")
    return [
        f"// The first kStages - 1 stages of {g.name} for the CTA tile at row m0, one cp.async "
        "group each; the groups",
        "// are committed empty when `valid` is false, so that every thread counts the same groups.",
        f"__device__ __forceinline__ void load_first_stages(const {plan.name}_params& p, "
        "SharedStorage& smem, int m0, int M,",
        "                                                  bool valid, int tid) {",
        *_block(_first_stages_body(plan, a, b)),
        "}",
    ]


def _first_stages_body(plan: KernelPlan, a: dict, b: dict) -> list[str]:
    """A resident plan loads A only (B is resident): no n0, N or B buffer."""
    g = plan.gemms[0]
    with_b = not plan.resident
    return [
        *(["const int n0 = 0;", f"const int N = {_dim(g.n_dim)};"] if with_b else []),
        f"const int K = {_dim(g.k_dim)};",
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


def _first_stage_loads(plan: KernelPlan, tile: str, why: list[str]) -> list[str]:
    """A block that issues the first gemm's prologue for linear tile `tile` (empty groups past
    the last tile)."""
    cfg = _cfg(plan.gemms[0])
    return [
        *why,
        "{",
        *_block([
            "int load_m = 0, load_n = 0;",
            f"if ({tile} < tiles) tile_coords({tile}, tiles_m, tiles_n, load_m, load_n);",
            f"{cfg}::load_first_stages(p, smem, load_m * {cfg}::kTileM, M, {tile} < tiles, tid);",
        ]),
        "}",
    ]


def _feed_lines(g: GemmPlan, nxt: GemmPlan) -> list[str]:
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
    layout = f"{_cfg(nxt)}::ALayout"
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


def _dim(d: ir.Dim) -> str:
    return gemm_emit.dim_expr(d)


def _stage_lines(plan: KernelPlan, i: int) -> list[str]:
    g = plan.gemms[i]
    gemm = plan.kernel.gemms[i]
    last = i == len(plan.gemms) - 1
    nxt = None if last else plan.gemms[i + 1]
    lines: list[str] = []
    if nxt is not None and nxt.a is None:
        lines += [
            f"// {g.name}'s output, rounded to {nxt.chain.dtype.dsl_name}, as {nxt.name}'s A "
            "fragments: [k step][m16 tile][4 registers]",
            f"unsigned {nxt.name}_a_frag[{_cfg(nxt)}::kKSteps][{_cfg(nxt)}::kFragM][4];",
            "",
        ]
    where = "all of its N in every CTA" if not last else "this CTA's columns"
    lines += [
        f"// ---- {gemm.name} = {gemm.a.name} @ {gemm.b.name}: CTA tile "
        f"{g.tile[0]}x{g.tile[1]}x{g.tile[2]}, {where} ----",
        "{",
    ]
    # A resident first gemm loads no B in its mainloop (no n0, N); a resident chained one
    # loads nothing (no K).
    b_in_loop = not (plan.resident and g.chain is None)
    k_in_loop = not (plan.resident and g.chain is not None)
    # 16-byte stores over tiles that divide N check no column against N
    n_used = b_in_loop and not (plan.wide_stores and last and g.n_dim % g.tile[1] == 0)
    warp = "math_warp" if plan.pingpong else "warp_id"  # ping-pong: the warp in its warpgroup
    body = [
        f"using namespace {_cfg(g)};",
        f"const int warp_m = {warp} / kWarpsN;",
        f"const int warp_n = {warp} % kWarpsN;",
        *(["const int n0 = tile_n * kTileN;" if last else "const int n0 = 0;"]
          if b_in_loop else []),
        *([f"const int N = {_dim(g.n_dim)};"] if n_used else []),
        *([f"const int K = {_dim(g.k_dim)};"] if k_in_loop else []),
        "",
    ]
    if g.chain is None:
        a, b = gemm_emit._operand(g, g.a, "a"), gemm_emit._operand(g, g.b, "b")
        ring_load_args = gemm_emit._load_args(g.a, "a", "load_m0", "load_k")  # the ring's refill
        if plan.pingpong:  # the producer warps load the ring (produce_ring)
            text = render("sm90/pingpong_wgmma.inc.j2", a=a, b=b)
        elif plan.wgmma:
            text = render("sm90/ring_wgmma.inc.j2", a=a, b=b, ring_load_args=ring_load_args)
        else:
            text = render("sm80/mainloop.inc.j2", a=a, b=b,
                          first_fragments=gemm_emit._frag_loads(g, 0, 0, "_next"),
                          mainloop_steps=gemm_emit._mainloop_steps(g), prologue=not plan.persistent,
                          resident=plan.resident, ring_load_args=ring_load_args)
        body += _function_level(text)
    elif plan.resident:
        body += _resident_mainloop(g, g.name in plan.wgmma_chain)
    elif plan.persistent and last:
        first = plan.gemms[0]
        why = [f"// Prefetch: the next tile's first kStages - 1 stages of {first.name} "
               f"({first.a.param}, {first.b.param}) start now,",
               f"// behind {g.name}'s last {g.b.param} load, so the memory system streams "
               f"{first.a.param} while this tile finishes."]
        body += _chained_mainloop(g, _first_stage_loads(plan, "next_tile", why), first.stages - 1)
    else:
        body += _chained_mainloop(g)
    body.append("")
    if nxt is not None:
        if not plan.resident:  # a resident plan's buffers are never reused within a tile
            body += [f"// Every warp is done with {g.name}'s stages: later stages may reuse "
                     "their bytes.", "__syncthreads();", ""]
        body += _feed_lines(g, nxt)
    else:
        body.append("// Epilogue")
        if plan.tma_store:
            body += _tma_store_lines(g)
        elif plan.wide_stores:
            body += _wide_store_lines(g)
        else:
            body += epilogue_emit.loop_lines(plan, g)
    lines += _block(body)
    lines += ["}"]
    return lines


def _config(g: GemmPlan, plan: KernelPlan) -> list[str]:
    gemm = plan.kernel.gemm(g.name)
    lines = [
        f"constexpr int kTileM = {g.tile[0]};",
        f"constexpr int kTileN = {g.tile[1]};",
        f"constexpr int kTileK = {g.tile[2]};",
        f"constexpr int kWarpsM = {g.warps[0]};",
        f"constexpr int kWarpsN = {g.warps[1]};",
        ('static_assert(kWarpsM * kWarpsN * 32 == kWarpgroupThreads, "every stage runs on a '
         'whole consumer warpgroup");' if plan.pingpong else
         'static_assert(kWarpsM * kWarpsN * 32 == kThreads, "every stage runs on all the warps");'),
        f"constexpr int kWarpTileM = {g.warp_tile[0]};",
        f"constexpr int kWarpTileN = {g.warp_tile[1]};",
        f"constexpr int kFragM = {g.frags[0]};  // m16n8k16 MMAs per warp along M",
        f"constexpr int kFragN = {g.frags[1]};  // ... along N",
    ]
    if plan.resident and g.chain is not None:
        lines.append(f"// kStages: none; {g.b.param} is resident and A is {g.chain.source}'s "
                     "output in registers")
    else:
        lines.append(f"constexpr int kStages = {g.stages};")
    if g.chain is not None:
        if g.a is None:  # the register-resident A fragments are indexed by k step
            lines.append(f"constexpr int kKSteps = {g.chain.k_steps};  // k16 steps over all of "
                         f"K ({g.chain.source}'s N = {g.chain.k})")
        lines += [
            f"constexpr int kKTiles = {g.chain.k // g.tile[2]};  // K is {g.chain.source}'s N, "
            f"{g.chain.k}",
            *(["static_assert(kKTiles * kTileK == " + str(g.chain.k) + ", \"the resident B holds "
               "all of K\");"] if plan.resident else []),
            f"static_assert(kTileM == {g.chain.source}_cfg::kTileM, \"a CTA keeps its rows "
            "through the chain\");",
        ]
    if g is not plan.gemms[-1]:
        lines.append(f"static_assert(kTileN == {g.n_dim}, \"a stage that feeds the next one "
                     "computes its whole N\");")
    keep = "" if g.chain is None else f"; A = {g.chain.source} kept in {g.chain.residency.value}"
    return [f"// {gemm.name} = {gemm.a.name} @ {gemm.b.name}{keep}"] + lines


def _chain_asserts(plan: KernelPlan) -> list[str]:
    out = []
    ns = f"{plan.name}_kgen"
    for src, g in zip(plan.gemms, plan.gemms[1:]):
        if g.a is None:
            a, b = f"{ns}::{_cfg(src)}", f"{ns}::{_cfg(g)}"
            out.append(
                f"static_assert({a}::kFragN == 2 * {b}::kKSteps && {a}::kFragM == {b}::kFragM,")
            out.append(f"              \"{src.name}'s accumulators are {g.name}'s A fragments\");")
    return out


def _wgmma_outs(n: int) -> str:
    """The asm outputs of a warp's m64nNk16 accumulators, in the m16n8 layout acc[0][j][e]."""
    return ", ".join(f'"+f"(acc[0][{j}][{e}])' for j in range(n // 8) for e in range(4))


def emit(plan: KernelPlan, *, source_name: str, source_hash: str, command: str) -> str:
    first, last = plan.gemms[0], plan.gemms[-1]
    ns = f"{plan.name}_kgen"
    buffers = [
        dict(name=b.name, role=b.role, live=plan.storage.live_text(b), offset=b.offset,
             bytes=b.bytes, ctype=b.dtype.cpp if b.dtype is not None else BARRIER_CTYPE)
        for b in plan.storage.buffers
    ]
    stages = []
    for g in plan.gemms:
        # a resident chain reads each A tile once: its ring's copies ask L2 to evict them first.
        # Not when the output leaves through the copy engine (tma_store, whose stores carry that
        # hint): there A's hint measured 2% slower on an H200 (bench/RESULTS.md).
        ring = plan.resident and g is first and not plan.tma_store
        operands = [gemm_emit._operand(g, op, w, "cp_async_16_evict_first" if ring and w == "a"
                                  else "cp_async_16")
                    for op, w in ((g.a, "a"), (g.b, "b")) if op is not None and op.copies_per_thread]
        layouts = []
        if g.a is not None and not g.a.copies_per_thread:  # the chained intermediate
            t = g.a.smem
            sw = t.swizzle
            layouts.append(dict(
                param=g.a.param, dtype=t.dtype.dsl_name, outer=t.outer, inner=t.inner,
                layout="ALayout", major="K contiguous",
                atom_inner=t.atom_inner, swizzle=str(sw), sw_shift=sw.shift,
                sw_mask=((1 << sw.bits) - 1) << sw.base))
        epi = epilogue_cpp.render(g.epilogue)
        extra = ", float& inter_0, float& inter_1" if g is not last else ""
        wide = plan.wide_stores and g is last
        body = list(epi.loads) + list(epi.compute) + list(epi.stores)
        if wide:
            pair, packed = epi.packed
            body = list(epi.loads) + list(epi.compute) + [
                f"const {pair} packed = {packed};",
                "return *reinterpret_cast<const unsigned*>(&packed);",
            ]
        functions = []
        if plan.pingpong and g is first:
            functions = render(
                "sm90/pingpong_producer.inc.j2", name=plan.name, a=gemm_emit._operand(g, g.a, "a"),
                m_expr=_dim(g.m_dim), k_expr=_dim(g.k_dim),
                load_args=gemm_emit._load_args(g.a, "a", "m0", "kt")).rstrip("\n").split("\n")
        elif plan.persistent and g is first:
            functions = _first_stages_function(plan)
        stages.append(dict(
            cfg=_cfg(g), name=g.name, config=_config(g, plan), operands=operands,
            functions=functions,
            layouts=layouts, epilogue=body, epilogue_params=extra,
            epilogue_type="unsigned" if wide else "void",
            epilogue_note=(", packed (the caller stores four pairs as one 16-byte chunk)"
                           if wide else ""),
        ))
    body = _kernel_body(plan)
    dtype = plan.gemms[1].chain.dtype
    pair, _, _, to_pair, _ = PAIR[dtype]
    kernel_gemms = plan.kernel.gemms
    summary = ", then ".join(f"{h.name} = {h.a.name} @ {h.b.name}" for h in kernel_gemms)
    return render(
        "sm80/chain.cu.j2",
        header=gemm_emit.header(plan, source_name, source_hash, command),
        name=plan.name,
        ns=ns,
        threads=plan.threads,
        group_m=plan.group_m,
        smem_bytes=plan.smem_bytes,
        stages=stages,
        chain_asserts=_chain_asserts(plan),
        **host_api.template_values(plan),
        buffers=buffers,
        storage_asserts=gemm_emit._storage_asserts(plan),
        mma_types=f"{dtype.dsl_name} x {dtype.dsl_name} -> f32",
        mma_ab=gemm_emit.MMA_TYPE[dtype],
        operand_pair=pair,
        pack_expr=to_pair.format("lo", "hi"),
        operand_dtype=dtype.dsl_name,
        summary=summary,
        min_blocks=plan.min_blocks_per_sm,
        resident=plan.resident,
        # helpers only where the kernel calls them: the quad transpose of 16-byte stores from
        # registers, and mma_step wherever a gemm still multiplies with mma.sync
        quad_stores=plan.wide_stores and not plan.tma_store,
        mma_sync=not plan.wgmma or any(g.name not in plan.wgmma_chain for g in plan.gemms[1:]),
        wgmma=plan.wgmma,
        pingpong=plan.pingpong,
        tma_store=plan.tma_store,
        tma_output=last.epilogue.packed_store.param if plan.tma_store else "",
        tma_dtype=schedule.TMA_DTYPE[last.epilogue.packed_store.dtype]
        if plan.tma_store else "",
        producer_threads=schedule.PRODUCER_THREADS,
        wgmma_n=first.tile[1],
        wgmma_regs=", ".join(f"%{i}" for i in range(first.tile[1] // 2)),
        wgmma_outs=_wgmma_outs(first.tile[1]),
        wgmma_rs=[dict(n=n, regs=", ".join(f"%{i}" for i in range(n // 2)), outs=_wgmma_outs(n))
                  for n in sorted({g.tile[1] for g in plan.gemms if g.name in plan.wgmma_chain})],
        m_expr=_dim(first.m_dim),
        first_cfg=_cfg(first),
        last_cfg=_cfg(last),
        last_n_expr=_dim(last.n_dim),
        host_m_expr=_dim(first.m_dim),
        host_n_expr=_dim(last.n_dim),
        body=body,
        host_checks=gemm_emit._host_checks(plan),
        grid_lines=_grid_lines(plan),
    )


def _kernel_body(plan: KernelPlan) -> list[str]:
    """The stages for one tile, or (persistent) for every tile of this CTA's loop."""
    first = _cfg(plan.gemms[0])
    stages: list[str] = []
    for i in range(len(plan.gemms)):
        stages += _stage_lines(plan, i) + [""]
    stages = stages[:-1]
    if not plan.persistent:
        return _block([
            "int tile_m, tile_n;",
            "tile_coords(blockIdx.x, tiles_m, tiles_n, tile_m, tile_n);",
            f"const int m0 = tile_m * {first}::kTileM;",
            "",
            *stages,
        ])
    g0 = plan.gemms[0]
    if plan.pingpong:
        return _pingpong_body(plan, stages)
    if plan.resident:
        return _resident_body(plan, stages)
    why = [f"// The first tile's first kStages - 1 stages of {g0.name}; later tiles' are "
           "prefetched by the tile before."]
    return _block([
        "// Persistent: gridDim.x CTAs (SM count x resident CTAs per SM, from the launcher) loop "
        "over the tiles.",
        f"// While a tile runs {plan.gemms[-1].name} and stores, its CTA streams the next tile's "
        f"first {g0.name} stages:",
        f"// {g0.name}'s stage buffers live through the whole tile (the storage plan says so).",
        "const int tiles = tiles_m * tiles_n;",
        *_first_stage_loads(plan, "blockIdx.x", why),
        "for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {",
        *_block([
            "int tile_m, tile_n;",
            "tile_coords(tile, tiles_m, tiles_n, tile_m, tile_n);",
            f"const int m0 = tile_m * {first}::kTileM;",
            "const int next_tile = tile + gridDim.x;",
            "",
            *stages,
        ]),
        "}",
        "cp_async_wait<0>();  // the last prefetch committed empty groups only",
    ])


def _resident_body(plan: KernelPlan, stages: list[str]) -> list[str]:
    """Persistent with resident B: the B operands once, then one ring of A stages that the
    first gemm's mainloop keeps loading across this CTA's tiles."""
    g0 = plan.gemms[0]
    first = _cfg(g0)
    why = [f"// The first tile's first kStages - 1 k tiles of {g0.a.param}; later tiles' are "
           f"loaded by the tile before, in its {g0.name} mainloop."]
    return _block([
        "// Persistent: gridDim.x CTAs (SM count x resident CTAs per SM, from the launcher) loop "
        "over the tiles.",
        "const int tiles = tiles_m * tiles_n;",
        *_resident_loads(plan),
        *_first_stage_loads(plan, "blockIdx.x", why),
        f"int ring = 0;  // the ring slot of this tile's first k tile of {g0.a.param}",
        "for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {",
        *_block([
            "int tile_m, tile_n;",
            "tile_coords(tile, tiles_m, tiles_n, tile_m, tile_n);",
            f"const int m0 = tile_m * {first}::kTileM;",
            "const int next_tile = tile + gridDim.x;",
            "int next_m = 0, next_n = 0;",
            "if (next_tile < tiles) tile_coords(next_tile, tiles_m, tiles_n, next_m, next_n);",
            f"const int next_m0 = next_m * {first}::kTileM;",
            "",
            *stages,
        ]),
        "}",
        "cp_async_wait<0>();  // the last tile's ring refills past the end were empty groups",
    ])


def _pingpong_body(plan: KernelPlan, stages: list[str]) -> list[str]:
    """schedule pingpong: the barriers and the resident B operands, then the producer warps fill
    the ring while the two consumer warpgroups run every other tile of this CTA."""
    g0 = plan.gemms[0]
    first = _cfg(g0)
    bars = f"{g0.name}_ring_barriers"
    return _block([
        "// Persistent: gridDim.x CTAs (SM count x resident CTAs per SM, from the launcher) loop "
        "over the tiles.",
        "const int tiles = tiles_m * tiles_n;",
        f"const unsigned full_bar = smem_address(smem.{bars}());  // kStages full barriers,",
        f"const unsigned empty_bar = full_bar + 8 * {first}::kStages;  // then kStages empty ones",
        "if (tid == 0) {",
        f"  for (int s = 0; s < {first}::kStages; ++s) {{",
        "    mbarrier_init(full_bar + 8 * s, kProducerThreads);  // as each one's copies land",
        "    mbarrier_init(empty_bar + 8 * s, kWarpgroupThreads);  // the consuming warpgroup",
        "  }",
        "}",
        "__syncthreads();  // the barriers are initialized",
        "",
        "if (tid >= 2 * kWarpgroupThreads) {  // the producers: A streams in while the consumers "
        "wait for B",
        f"  {first}::produce_ring(p, smem, tiles_m, tiles_n, full_bar, empty_bar, "
        "tid - 2 * kWarpgroupThreads);",
        "  return;",
        "}",
        "// The first warpgroup loads the resident operands; both wait for them.",
        "if (warp_id < 4) {",
        *_block(_resident_loads(plan) + [
            "cp_async_wait<0>();", "fence_proxy_async();  // read by wgmma, through the async proxy"]),
        "}",
        "consumer_barrier();  // B is in shared memory",
        "const int warpgroup = warp_id / 4;",
        "const int math_warp = warp_id % 4;",
        "int local = warpgroup;  // this warpgroup's tiles are the CTA's local tiles local, local + 2, ...",
        "for (int tile = blockIdx.x + warpgroup * gridDim.x; tile < tiles; tile += 2 * gridDim.x, "
        "local += 2) {",
        *_block([
            "int tile_m, tile_n;",
            "tile_coords(tile, tiles_m, tiles_n, tile_m, tile_n);",
            f"const int m0 = tile_m * {first}::kTileM;",
            "",
            *stages,
        ]),
        "}",
        *(["if (tid % kWarpgroupThreads == 0) bulk_wait();  // this warpgroup's last stores are "
           "complete"] if plan.tma_store else []),
    ])


def _grid_lines(plan: KernelPlan) -> list[str]:
    """The host launcher's grid: one CTA per tile, or (persistent) one per resident slot."""
    if not plan.persistent:
        return ["const int grid = tiles_m * tiles_n;"]
    return [
        "// Persistent: one CTA per resident slot (SM count x CTAs per SM), at most one per tile.",
        "int device = 0, sm_count = 0, per_sm = 0;",
        "cudaError_t err = cudaGetDevice(&device);",
        "if (err == cudaSuccess)",
        "  err = cudaDeviceGetAttribute(&sm_count, cudaDevAttrMultiProcessorCount, device);",
        "if (err == cudaSuccess)",
        f"  err = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, {plan.name}, "
        f"{plan.name}_kgen::kThreads, {plan.name}_kgen::kSmemBytes);",
        "if (err != cudaSuccess) return err;",
        "const int slots = sm_count * (per_sm > 0 ? per_sm : 1);",
        "const int grid = tiles_m * tiles_n < slots ? tiles_m * tiles_n : slots;",
    ]
