"""sm_80 epilogue loop: the per-fragment calls of the epilogue function and, when the epilogue
has reductions, their per-thread partials, the CTA-level combine and the cross-CTA atomics.
Every line is prepared here; the template prints them."""
from __future__ import annotations

from ...enums import Axis, Dim, ReduceOp
from ...plan import GemmPlan, KernelPlan, ReductionPlan
from ..common import batch
from ..common.render import render

OP_STRUCT = {
    ReduceOp.SUM: "ReduceSum",
    ReduceOp.MAX: "ReduceMax",
    ReduceOp.MIN: "ReduceMin",
    ReduceOp.ABSMAX: "ReduceAbsMax",
}
PART_SHAPE = {Axis.ROW: "[kFragM][2]", Axis.COL: "[kFragN][2]", Axis.ALL: ""}


def _dim(dim: Dim | None) -> str:
    if dim is None:
        return "1"
    return str(dim) if isinstance(dim, int) else f"p.{dim}"


def epilogue_params(g: GemmPlan) -> str:
    """Extra parameters of the epilogue function: the reduced values of both elements."""
    return "".join(f", float& red{r.index}_0, float& red{r.index}_1" for r in g.epilogue.reductions)


def _combine(r: ReductionPlan, half: str) -> list[str]:
    k, op = r.index, OP_STRUCT[r.op]
    if r.axis is Axis.ROW:
        return [f"red{k}_part[i][{half}] = {op}::combine(red{k}_part[i][{half}], "
                f"{op}::combine({op}::element(red{k}_0), {op}::element(red{k}_1)));"]
    if r.axis is Axis.COL:
        return [f"red{k}_part[j][{e}] = {op}::combine(red{k}_part[j][{e}], "
                f"{op}::element(red{k}_{e}));" for e in (0, 1)]
    return [f"red{k}_part = {op}::combine(red{k}_part, "
            f"{op}::combine({op}::element(red{k}_0), {op}::element(red{k}_1)));"]


def _call(g: GemmPlan, row: str, regs: tuple[int, int], half: str, narrow: bool,
          params: str = "p", frag: str = "acc[i][j]") -> list[str]:
    reds = g.epilogue.reductions
    args = "".join(f", red{r.index}_0, red{r.index}_1" for r in reds)
    fn, both = (f"{g.name}_epilogue<kNarrow>", ", both") if narrow else (f"{g.name}_epilogue", "")
    call = f"{fn}({params}, {row}, col{both}, {frag}[{regs[0]}], {frag}[{regs[1]}]{args});"
    if not reds:
        return [call]
    decls = [f"float red{r.index}_0, red{r.index}_1;" for r in reds]
    # a last odd column's second element is not in the output: it reduces as the identity
    past = [f"if (!both) red{r.index}_1 = {OP_STRUCT[r.op]}::identity();" for r in reds
            ] if narrow else []
    body = decls + [call] + past + [line for r in reds for line in _combine(r, half)]
    return body


def partial_lines(g: GemmPlan) -> list[str]:
    """Each reduction's per-thread partials, at the op's identity."""
    lines: list[str] = []
    for r in g.epilogue.reductions:
        op = OP_STRUCT[r.op]
        what = f"{r.op.value} over {'columns' if r.axis is Axis.ROW else 'rows' if r.axis is Axis.COL else 'the tile'} into {r.target}"
        lines.append(f"// red{r.index}: {what}")
        if r.axis is Axis.ALL:
            lines.append(f"float red{r.index}_part = {op}::identity();")
            continue
        lines.append(f"float red{r.index}_part{PART_SHAPE[r.axis]};")
        outer = "kFragM" if r.axis is Axis.ROW else "kFragN"
        lines.append(f"for (int f = 0; f < {outer}; ++f) red{r.index}_part[f][0] = "
                     f"red{r.index}_part[f][1] = {op}::identity();")
    return lines


def pair_loop(g: GemmPlan, row: str, col: str, narrow: bool = False,
              params: str = "p", groups: int = 1) -> list[str]:
    """One epilogue call per accumulator pair acc[i][j] (kFragM x kFragN m16n8 tiles) whose
    row (`row`: its expression for lane / 4 of tile i) and column (`col`, of tile j) are in
    the output, combining the reductions' partials. `narrow`: the kernel body's kNarrow
    instantiation may see an odd N, so each call is told whether the pair's second column is
    in the output (always, in the fast instantiation). `params`: the arguments the epilogue
    reads (a persistent kernel's: its tile's batch of them). `groups` > 1: each row of
    fragments in that many groups, a rolled loop (GemmSchedule.epilogue_groups)."""
    both = ["const bool both = !kNarrow || col + 1 < N;  // the pair's second column is in N"
            ] if narrow else []
    frag = "frag[jl]" if groups > 1 else "acc[i][j]"
    body = [
        f"const int row = {row};",
        f"const int col = {col};",
        *both,
        "if (col < N) {",
        "  if (row < M) {",
        *[f"    {x}" for x in _call(g, "row", (0, 1), "0", narrow, params, frag)],
        "  }",
        "  if (row + 8 < M) {",
        *[f"    {x}" for x in _call(g, "row + 8", (2, 3), "1", narrow, params, frag)],
        "  }",
        "}",
    ]
    lines = ["// Thread (lane / 4, lane % 4) of each m16n8 tile holds rows g and g + 8, columns",
             "// 2 * (lane % 4) and the next one.",
             "#pragma unroll",
             "for (int i = 0; i < kFragM; ++i) {"]
    if groups == 1:
        return lines + ["#pragma unroll", "  for (int j = 0; j < kFragN; ++j) {",
                        *[f"    {x}" for x in body], "  }", "}"]
    width = f"kFragN / {groups}"
    return lines + [
        f"#pragma unroll 1  // {groups} groups of fragments: the EVT's code once per group's width",
        f"  for (int grp = 0; grp < {groups}; ++grp) {{",
        f"    float frag[{width}][4];",
        "    select_group(acc[i], grp, frag);",
        "#pragma unroll",
        f"    for (int jl = 0; jl < {width}; ++jl) {{",
        f"      const int j = grp * ({width}) + jl;",
        *[f"      {x}" for x in body], "    }", "  }", "}"]


def split_partial_lines(row: str = "m0 + warp_m * kWarpTileM + i * 16 + lane / 4",
                        col: str = "n0 + warp_n * kWarpTileN + j * 8 + (lane % 4) * 2",
                        params: str = "p") -> list[str]:
    """Split-K: the CTA's partial sums, as f32 pairs, to its part of the workspace (the epilogue
    runs in <kernel>_splitk once the parts are summed); `row` and `col`: accumulator pair
    (i, j)'s first element (the other row is 8 below)."""
    return [
        "// Split-K: this CTA's partial sums to part `split` of the workspace: M rows of",
        "// tiles_n * kTileN floats (every column pair 8-byte aligned); <kernel>_splitk sums them.",
        "const long long ld_part = static_cast<long long>(tiles_n) * kTileN;",
        f"float* part = {params}.workspace + static_cast<long long>(split) * M * ld_part;",
        "#pragma unroll",
        "for (int i = 0; i < kFragM; ++i) {",
        "#pragma unroll",
        "  for (int j = 0; j < kFragN; ++j) {",
        f"    const int row = {row};",
        f"    const int col = {col};",
        "    if (col < N) {",
        "      if (row < M)",
        "        *reinterpret_cast<float2*>(part + row * ld_part + col) =",
        "            make_float2(acc[i][j][0], acc[i][j][1]);",
        "      if (row + 8 < M)",
        "        *reinterpret_cast<float2*>(part + (row + 8) * ld_part + col) =",
        "            make_float2(acc[i][j][2], acc[i][j][3]);",
        "    }",
        "  }",
        "}",
    ]


def split_kernel(plan: KernelPlan, g: GemmPlan, m_expr: str, n_expr: str) -> list[str]:
    """Split-K: the kernel that sums each output column pair's kSplitK partials in order
    (bit-identical from run to run) and runs the epilogue on the sum, once."""
    if plan.split_kernel is None:
        return []
    if g.epilogue.reductions:
        return _split_reduce_kernel(plan, g, m_expr, n_expr)
    ns = f"{plan.name}_kgen"
    threads = plan.INIT_THREADS
    if batch.batched(plan):  # one thread per column pair of every batch
        index = batch.helper_head(plan, "M * pairs")
    else:
        index = [f"  const long long i = blockIdx.x * {threads}ll + threadIdx.x;",
                 "  if (i >= M * pairs) return;"]
    return [
        "// Split-K: sums the kSplitK partials of each output column pair in a fixed order",
        "// (bit-identical from run to run) and runs the epilogue once, element by element (any",
        "// alignment); launched after the kernel above.",
        f'extern "C" __global__ void __launch_bounds__({threads})',
        f"{plan.split_kernel}({_helper_param(plan)}) {{",
        f"  using namespace {ns};",
        f"  const int M = {_helper_dims(plan, m_expr)};",
        f"  const int N = {_helper_dims(plan, n_expr)};",
        "  const long long pairs = (N + 1) / 2;",
        *index,
        "  const int row = static_cast<int>(i / pairs);",
        "  const int col = static_cast<int>(i % pairs) * 2;",
        "  const long long ld_part = static_cast<long long>((N + kTileN - 1) / kTileN) * kTileN;",
        *_sum_parts("  "),
        f"  {g.name}_epilogue<true>(p, row, col, col + 1 < N, acc_0, acc_1);",
        "}",
    ]


def _sum_parts(indent: str) -> list[str]:
    """acc_0, acc_1: the kSplitK partial sums of the pair (row, col), added in a fixed order."""
    return [indent + line for line in (
        "float acc_0 = 0.0f, acc_1 = 0.0f;",
        "for (int s = 0; s < kSplitK; ++s) {",
        "  const float2 part = *reinterpret_cast<const float2*>(",
        "      p.workspace + (static_cast<long long>(s) * M + row) * ld_part + col);",
        "  acc_0 += part.x;",
        "  acc_1 += part.y;",
        "}")]


def _split_reduce_kernel(plan: KernelPlan, g: GemmPlan, m_expr: str, n_expr: str) -> list[str]:
    """Split-K with epilogue reductions: one block per output tile (of every batch). Thread t
    sums the kSplitK parts of column pair t % kPairs on rows t / kPairs, t / kPairs +
    kRowsPerPass, ... in order and runs the epilogue on them; the reductions' values meet in
    the block in a fixed order (shuffle trees across a row's lanes, shared memory across
    warps and passes), then go to the output by the op's atomic, or, in the deterministic
    mode, to the tile's workspace slot after the split-K partials (<kernel>_finalize then
    combines the slots in order). Every step's order is fixed: the deterministic mode is
    bit-identical from run to run."""
    ns = f"{plan.name}_kgen"
    threads = plan.INIT_THREADS
    reds = g.epilogue.reductions
    if batch.batched(plan):
        param = f"const __grid_constant__ {plan.name}_params {batch.ALL_BATCHES}"
        head = [
            f"  const int M = {_helper_dims(plan, m_expr)};",
            f"  const int N = {_helper_dims(plan, n_expr)};",
            "  const int tiles_m = (M + kTileM - 1) / kTileM;",
            "  const int tiles_n = (N + kTileN - 1) / kTileN;",
            "  // the blocks of batch b follow those of batch b - 1",
            f"  const {plan.name}_params p = at_batch({batch.ALL_BATCHES}, "
            "blockIdx.x / (tiles_m * tiles_n));",
            "  const int tile = blockIdx.x % (tiles_m * tiles_n);",
        ]
    else:
        param = f"const __grid_constant__ {plan.name}_params p"
        head = [
            f"  const int M = {m_expr};",
            f"  const int N = {n_expr};",
            "  const int tiles_m = (M + kTileM - 1) / kTileM;",
            "  const int tiles_n = (N + kTileN - 1) / kTileN;",
            "  const int tile = blockIdx.x;",
        ]
    lines = [
        "// Split-K with epilogue reductions: one block per output tile. Each thread sums the",
        "// kSplitK partials of its column pair on its rows in a fixed order and runs the epilogue",
        "// once; the reductions meet in the block in a fixed order, then leave as the kernel's",
        "// own epilogue's do. Launched after the kernel above.",
        f'extern "C" __global__ void __launch_bounds__({threads})',
        f"{plan.split_kernel}({param}) {{",
        f"  using namespace {ns};",
        f"  constexpr int kSplitThreads = {threads};",
        "  constexpr int kPairs = kTileN / 2;  // column pairs of a tile row",
        "  static_assert(kSplitThreads % kPairs == 0, \"a pass covers whole tile rows\");",
        "  constexpr int kRowsPerPass = kSplitThreads / kPairs;",
        "  constexpr int kPasses = (kTileM + kRowsPerPass - 1) / kRowsPerPass;",
        "  constexpr int kRowLanes = kPairs < 32 ? kPairs : 32;  // a row's lanes in one warp",
        "  constexpr int kRowWarps = kPairs / kRowLanes;  // warps sharing a tile row",
        *head,
        "  if (tile >= tiles_m * tiles_n) return;",
        "  const int tile_m = tile / tiles_n;",
        "  const int tile_n = tile % tiles_n;",
        "  const int m0 = tile_m * kTileM;",
        "  const int n0 = tile_n * kTileN;",
        "  const int tid = threadIdx.x;",
        "  const int lane = tid % 32;",
        "  const int col = n0 + (tid % kPairs) * 2;",
        "  const long long ld_part = static_cast<long long>(tiles_n) * kTileN;",
    ]
    for r in reds:
        op, k = OP_STRUCT[r.op], r.index
        if r.axis is Axis.ROW:
            lines.append(f"  __shared__ float red{k}_scratch[kTileM * kRowWarps];  "
                         f"// {r.target}: per tile row, per warp")
        elif r.axis is Axis.COL:
            lines += [f"  __shared__ float red{k}_scratch[kRowsPerPass * kTileN];  "
                      f"// {r.target}: per row of a pass, per column",
                      f"  float red{k}_part[2] = {{{op}::identity(), {op}::identity()}};"]
        else:
            lines += [f"  __shared__ float red{k}_scratch[kSplitThreads / 32];  "
                      f"// {r.target}: per warp",
                      f"  float red{k}_part = {op}::identity();"]
    lines += [
        "  // every thread makes every pass (the shuffles need whole warps); rows past the tile",
        "  // or M reduce as the identity",
        "  for (int pass = 0; pass < kPasses; ++pass) {",
        "    const int r = tid / kPairs + pass * kRowsPerPass;",
        "    const int row = m0 + r;",
        "    const bool in = r < kTileM && row < M && col < N;",
        *[f"    float red{r.index}_0 = {OP_STRUCT[r.op]}::identity(), "
          f"red{r.index}_1 = {OP_STRUCT[r.op]}::identity();" for r in reds],
        "    if (in) {",
        *_sum_parts("      "),
        "      const bool both = col + 1 < N;",
        f"      {g.name}_epilogue<true>(p, row, col, both, acc_0, acc_1"
        + "".join(f", red{r.index}_0, red{r.index}_1" for r in reds) + ");",
        *[f"      red{r.index}_0 = {OP_STRUCT[r.op]}::element(red{r.index}_0);" for r in reds],
        *[f"      red{r.index}_1 = both ? {OP_STRUCT[r.op]}::element(red{r.index}_1) : "
          f"{OP_STRUCT[r.op]}::identity();" for r in reds],
        "    }",
    ]
    for r in reds:
        op, k = OP_STRUCT[r.op], r.index
        if r.axis is Axis.ROW:
            lines += [
                f"    {{  // red{k}: the row's lanes, then one value per warp of the row",
                f"      float v = {op}::combine(red{k}_0, red{k}_1);",
                "#pragma unroll",
                "      for (int offset = kRowLanes / 2; offset > 0; offset /= 2)",
                f"        v = {op}::combine(v, __shfl_xor_sync(0xffffffffu, v, offset));",
                "      if (lane % kRowLanes == 0 && r < kTileM)",
                f"        red{k}_scratch[r * kRowWarps + (tid % kPairs) / 32] = v;",
                "    }",
            ]
        elif r.axis is Axis.COL:
            lines += [f"    red{k}_part[0] = {op}::combine(red{k}_part[0], red{k}_0);",
                      f"    red{k}_part[1] = {op}::combine(red{k}_part[1], red{k}_1);"]
        else:
            lines.append(f"    red{k}_part = {op}::combine(red{k}_part, "
                         f"{op}::combine(red{k}_0, red{k}_1));")
    lines.append("  }")
    for r in reds:
        op, k = OP_STRUCT[r.op], r.index
        if r.axis is Axis.COL:
            lines += [f"  red{k}_scratch[(tid / kPairs) * kTileN + (tid % kPairs) * 2] = red{k}_part[0];",
                      f"  red{k}_scratch[(tid / kPairs) * kTileN + (tid % kPairs) * 2 + 1] = "
                      f"red{k}_part[1];"]
        elif r.axis is Axis.ALL:
            lines += ["#pragma unroll",
                      "  for (int offset = 16; offset > 0; offset /= 2)",
                      f"    red{k}_part = {op}::combine(red{k}_part, "
                      f"__shfl_xor_sync(0xffffffffu, red{k}_part, offset));",
                      f"  if (lane == 0) red{k}_scratch[tid / 32] = red{k}_part;"]
    lines.append("  __syncthreads();")
    # Per axis: the loop over the tile's values (i: an element of the tile's row, column or
    # scalar), the scratch value of slice w, the slices, and the element's place in the output
    # (its first element: m0 or n0) and in the workspace slot (its index, then its length)
    shape = {
        Axis.ROW: ("for (int i = tid; i < kTileM && i < M - m0; i += kSplitThreads)",
                   "i * kRowWarps + w", "kRowWarps", "m0 + i", "tile_n", "M", "tiles_n"),
        Axis.COL: ("for (int i = tid; i < kTileN && i < N - n0; i += kSplitThreads)",
                   "w * kTileN + i", "kRowsPerPass", "n0 + i", "tile_m", "N", "tiles_m"),
        Axis.ALL: ("if (tid == 0)", "w", "kSplitThreads / 32", "0",
                   "tile_m * tiles_n + tile_n", "1", "tiles_m * tiles_n"),
    }
    if plan.deterministic:
        lines += ["  // Deterministic reductions: the tile's values go to its workspace slot, after",
                  "  // the split-K partials; <kernel>_finalize combines the slots in order.",
                  "  long long ws_offset = static_cast<long long>(kSplitK) * M * ld_part;"]
    for r in reds:
        op, k = OP_STRUCT[r.op], r.index
        loop, at, count, element, slot, length, slots = shape[r.axis]
        if plan.deterministic:
            dest = (f"p.workspace[ws_offset + static_cast<long long>({slot}) * {length} + "
                    f"{element}] = v;")
        else:
            out = f"p.{r.target}" if element == "0" else f"p.{r.target} + {element}"
            dest = f"{op}::atomic({out}, v);"
        lines += [
            f"  {loop} {{  // red{k}: {r.target}",
            f"    float v = {op}::identity();",
            f"    for (int w = 0; w < {count}; ++w) v = {op}::combine(v, red{k}_scratch[{at}]);",
            f"    {dest}",
            "  }",
        ]
        if plan.deterministic and r is not reds[-1]:
            lines.append(f"  ws_offset += static_cast<long long>({slots}) * {length};")
    lines.append("}")
    return lines


def _helper_param(plan: KernelPlan) -> str:
    """A helper kernel's parameter: the arguments (of every batch, in a batched kernel)."""
    name = batch.ALL_BATCHES if batch.batched(plan) else "p"
    return f"const __grid_constant__ {plan.name}_params {name}"


def _helper_dims(plan: KernelPlan, expr: str) -> str:
    """A size expression over `p` at a helper kernel's top, before a batched one has `p`."""
    return expr.replace("p.", f"{batch.ALL_BATCHES}.") if batch.batched(plan) else expr


def host_split_lines(plan: KernelPlan, m_expr: str, n_expr: str) -> list[str]:
    if plan.split_kernel is None:
        return []
    if plan.reductions:
        return _host_helper_launch(
            plan, plan.split_kernel, "split",
            "split-K: sum the CTAs' partials and run the epilogue and its reductions (one "
            f"block of {plan.INIT_THREADS} threads per output tile)",
            f"static_cast<long long>(tiles_m) * tiles_n * {plan.INIT_THREADS}")
    return _host_helper_launch(
        plan, plan.split_kernel, "split",
        "split-K: sum the CTAs' partials (one thread per column pair) and run the epilogue",
        f"static_cast<long long>({m_expr}) * (({n_expr} + 1) / 2)")


def loop_lines(plan: KernelPlan, g: GemmPlan) -> list[str]:
    """The kernel's epilogue: one call per accumulator pair, then the reductions (with
    split-K, the partial sums to the workspace instead)."""
    if plan.schedule.split_k > 1:
        return split_partial_lines()
    reds = g.epilogue.reductions
    lines = partial_lines(g) + pair_loop(
        g, "m0 + warp_m * kWarpTileM + i * 16 + lane / 4",
        "n0 + warp_n * kWarpTileN + j * 8 + (lane % 4) * 2", plan.schedule.narrow)
    if not reds:
        return lines
    lines += ["// The reduction scratch reuses the mainloop's shared memory: wait for every warp.",
              "__syncthreads();"]
    for r in reds:
        op, k = OP_STRUCT[r.op], r.index
        scratch = f"smem.{r.scratch}()"
        if r.axis is Axis.ROW:
            lines.append(f"reduce_rows_to_scratch<{op}>(red{k}_part, {scratch}, lane, warp_m, warp_n);")
        elif r.axis is Axis.COL:
            lines.append(f"reduce_cols_to_scratch<{op}>(red{k}_part, {scratch}, lane, warp_m, warp_n);")
        else:
            lines.append(f"reduce_all_to_scratch<{op}>(red{k}_part, {scratch}, lane, warp_id);")
    lines.append("__syncthreads();")
    if plan.deterministic:
        return lines + _workspace_lines(reds)
    for r in reds:
        _, _, _, first, valid = _SLOTS[r.axis]
        count, stride = _SCRATCH_SHAPE[r.axis]
        out = f"p.{r.target}" if first == "0" else f"p.{r.target} + {first}"
        lines.append(f"merge_scratch<{OP_STRUCT[r.op]}>(smem.{r.scratch}(), {count}, {stride}, "
                     f"{out}, {valid}, tid);")
    return lines


# Per axis: (partial slots, elements per slot, this CTA's slot, first element, valid elements)
_SLOTS = {
    Axis.ROW: ("tiles_n", "M", "tile_n", "m0", "M - m0"),
    Axis.COL: ("tiles_m", "N", "tile_m", "n0", "N - n0"),
    Axis.ALL: ("tiles_m * tiles_n", "1", "tile_m * tiles_n + tile_n", "0", "1"),
}
_SCRATCH_SHAPE = {
    Axis.ROW: ("kWarpsN", "kTileM"),
    Axis.COL: ("kWarpsM", "kTileN"),
    Axis.ALL: ("kWarpsM * kWarpsN", "1"),
}


def _workspace_lines(reds: tuple[ReductionPlan, ...]) -> list[str]:
    """Deterministic mode: each CTA writes its partials to its own slot of the workspace."""
    lines = ["// Deterministic reductions: this CTA's partials go to its workspace slot.",
             "long long ws_offset = 0;"]
    for r in reds:
        slots, length, slot, first, valid = _SLOTS[r.axis]
        count, stride = _SCRATCH_SHAPE[r.axis]
        lines.append(
            f"store_scratch<{OP_STRUCT[r.op]}>(smem.{r.scratch}(), {count}, {stride}, "
            f"p.workspace + ws_offset + (long long)({slot}) * {length} + {first}, {valid}, tid);"
        )
        if r is not reds[-1]:
            lines.append(f"ws_offset += (long long)({slots}) * {length};")
    return lines


def finalize_kernel(plan: KernelPlan, m_expr: str, n_expr: str) -> list[str]:
    """Deterministic mode: combine every CTA's partials in slot order, then store."""
    if not plan.deterministic:
        return []
    ns = f"{plan.name}_kgen"
    reds = plan.reductions
    axes = {r.axis for r in reds}
    lines = [
        "// Combines the CTAs' partial reductions in a fixed order (bit-identical run to run);",
        "// launched after the kernel above.",
        f'extern "C" __global__ void __launch_bounds__({plan.INIT_THREADS})',
        f"{plan.finalize_kernel}({_helper_param(plan)}) {{",
        f"  using namespace {ns};",
        *_helper_index(plan),
    ]
    split = plan.split_kernel is not None
    need_tiles_m = bool(axes & {Axis.COL, Axis.ALL})
    need_tiles_n = bool(axes & {Axis.ROW, Axis.ALL}) or split
    if need_tiles_m or Axis.ROW in axes or split:
        lines.append(f"  const long long M = {m_expr};")
    if need_tiles_n or Axis.COL in axes:
        lines.append(f"  const long long N = {n_expr};")
    if need_tiles_m:
        lines.append("  const long long tiles_m = (M + kTileM - 1) / kTileM;")
    if need_tiles_n:
        lines.append("  const long long tiles_n = (N + kTileN - 1) / kTileN;")
    if split:  # the slots follow the split-K partials
        lines.append("  long long ws_offset = kSplitK * M * tiles_n * kTileN;")
    else:
        lines.append("  long long ws_offset = 0;")
    for r in reds:
        slots, length, _, _, _ = _SLOTS[r.axis]
        op = OP_STRUCT[r.op]
        lines += [
            f"  if (i < {length}) {{  // red{r.index}: {r.target}",
            f"    float v = {op}::identity();",
            f"    for (long long s = 0; s < {slots}; ++s) "
            f"v = {op}::combine(v, p.workspace[ws_offset + s * {length} + i]);",
            f"    p.{r.target}[i] = v;",
            "  }",
        ]
        if r is not reds[-1]:
            lines.append(f"  ws_offset += {slots} * {length};")
    lines.append("}")
    return lines


def helpers(plan: KernelPlan) -> str:
    return render("sm80/reduce.cu.j2") if plan.reductions else ""


def init_kernel(plan: KernelPlan) -> list[str]:
    """A kernel that sets every reduction output to its op's identity (before the main one)."""
    if plan.init_kernel is None:
        return []
    ns = f"{plan.name}_kgen"
    lines = [
        "// Sets every reduction output to its identity; launched before the kernel above.",
        f'extern "C" __global__ void __launch_bounds__({plan.INIT_THREADS})',
        f"{plan.init_kernel}({_helper_param(plan)}) {{",
        *_helper_index(plan),
    ]
    for r in plan.reductions:
        lines.append(f"  if (i < {_dim(r.length)}) p.{r.target}[i] = {ns}::{OP_STRUCT[r.op]}::identity();")
    lines.append("}")
    return lines


def _helper_index(plan: KernelPlan) -> list[str]:
    """The init and finalize kernels' thread index `i`: an element of the longest reduction
    output (of its batch: `p` is then that batch's arguments)."""
    if batch.batched(plan):
        lengths = [_dim(r.length).replace("p.", f"{batch.ALL_BATCHES}.") for r in plan.reductions]
        return batch.helper_head(plan, f"static_cast<long long>({batch.longest(lengths)})")
    return [f"  const long long i = blockIdx.x * {plan.INIT_THREADS}ll + threadIdx.x;"]


def _host_helper_launch(plan: KernelPlan, kernel: str, label: str, why: str,
                        count: str | None = None) -> list[str]:
    """Host lines launching a helper kernel of INIT_THREADS-thread blocks: one thread per
    element of the longest reduction output, or per `count` (a 64-bit C++ expression), in
    every batch."""
    threads = plan.INIT_THREADS
    if count is None and batch.batched(plan):
        lengths = [_dim(r.length) for r in plan.reductions]
        count = f"static_cast<long long>({batch.longest(lengths)})"
    if count is not None and batch.batched(plan):
        count = f"{batch.batch_count(plan)} * {count}"
    if count is None:
        lengths = list(dict.fromkeys(_dim(r.length) for r in plan.reductions))
        longest = lengths[0]
        for other in lengths[1:]:
            longest = f"max({longest}, {other})"
        blocks = [f"const int {label}_blocks = ({longest} + {threads - 1}) / {threads};"]
    else:
        blocks = [f"const long long {label}_threads = {count};",
                  f"const int {label}_blocks = static_cast<int>(({label}_threads + {threads - 1}) "
                  f"/ {threads});"]
    return [
        f"// {why}",
        *blocks,
        f"{kernel}<<<{label}_blocks > 0 ? {label}_blocks : 1, {threads}, 0, stream>>>(p);",
    ]


def host_init_lines(plan: KernelPlan) -> list[str]:
    if plan.init_kernel is None:
        return []
    return _host_helper_launch(
        plan, plan.init_kernel, "init",
        "reduction outputs start at their identity; CTAs then merge into them atomically",
    )


def host_finalize_lines(plan: KernelPlan) -> list[str]:
    if plan.finalize_kernel is None:
        return []
    return _host_helper_launch(
        plan, plan.finalize_kernel, "finalize",
        "deterministic reductions: combine the CTAs' partials in a fixed order",
    )


def host_empty_lines(plan: KernelPlan) -> list[str]:
    """The host launcher's answer to M or N = 0 (no tile): nothing to launch, but reduction
    outputs over the empty axis (an [N] vector when M = 0, a scalar) still get their op's
    identity, from the init kernel (atomic mode) or the finalize kernel over no partials."""
    if not plan.reductions:
        return ["if (tiles_m == 0 || tiles_n == 0) return cudaSuccess;"]
    helper = host_init_lines(plan) if plan.init_kernel is not None else host_finalize_lines(plan)
    return [
        "if (tiles_m == 0 || tiles_n == 0) {",
        "  // no tile to compute; the reductions over an empty axis still hold their identity",
        *[f"  {line}" for line in helper],
        "  return cudaGetLastError();",
        "}",
    ]
