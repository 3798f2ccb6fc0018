"""Batches in the emitted code (every target): where batch b of the arguments lives.

A batched kernel's grid covers L x the tiles of one batch on one axis (tile t of the walk is
tile t % tiles of batch t / tiles); each CTA or tile then works on `at_batch(p, b)`: the
arguments with every batched pointer advanced by b x its batch stride, and the workspace by one
batch's floats. That device function is the one home of the batch offsets: the mainloop, the
epilogue, the reductions and the helper kernels read the shifted arguments as they read an
unbatched kernel's. Everything here is a string or a list of lines for the templates.
"""
from __future__ import annotations

from ...enums import Axis
from ...plan import FieldKind, KernelPlan
from .operands import dim_expr


def batched(plan: KernelPlan) -> bool:
    return plan.batch is not None


def batch_count(plan: KernelPlan, prefix: str = "p.") -> str:
    """The batch count L as C++ (`p.L` or a fixed number); "1" without a batch dimension."""
    return "1" if plan.batch is None else dim_expr(plan.batch, prefix)


def workspace_lines(plan: KernelPlan, ctype: str, ns: str) -> tuple[list[str], str]:
    """Statements and an expression of C++ type `ctype`: the floats of workspace one batch
    uses (split-K partials, the deterministic reductions' slots, or both), or ([], "") for
    none."""
    g = plan.gemms[-1]
    m, n = dim_expr(g.m_dim), dim_expr(g.n_dim)
    prefix = f"{ns}::" if ns else ""
    if plan.split_kernel is not None and not plan.deterministic:
        return ([f"const {ctype} tiles_n = (static_cast<{ctype}>({n}) + {prefix}kTileN - 1) / "
                 f"{prefix}kTileN;"],
                f"{prefix}kSplitK * static_cast<{ctype}>({m}) * tiles_n * {prefix}kTileN")
    if not plan.deterministic:
        return [], ""
    slots = {Axis.ROW: ("tiles_n", "M"), Axis.COL: ("tiles_m", "N"),
             Axis.ALL: ("tiles_m * tiles_n", "1")}
    terms = " + ".join(f"{slots[r.axis][0]} * {slots[r.axis][1]}" for r in plan.reductions)
    setup = [f"const {ctype} M = static_cast<{ctype}>({m});",
             f"const {ctype} N = static_cast<{ctype}>({n});",
             f"const {ctype} tiles_m = (M + {prefix}kTileM - 1) / {prefix}kTileM;",
             f"const {ctype} tiles_n = (N + {prefix}kTileN - 1) / {prefix}kTileN;"]
    if plan.split_kernel is not None:
        # the split-K partials, then the reductions' slots, rounded up to an even count (the
        # next batch's partials keep their 8-byte column pairs)
        return setup, f"({prefix}kSplitK * M * tiles_n * {prefix}kTileN + ({terms} + 1) / 2 * 2)"
    return setup, f"({terms})"


def at_batch_lines(plan: KernelPlan) -> list[str]:
    """The device function `at_batch(p, batch)` (in the kernel's namespace), or none."""
    if not batched(plan):
        return []
    name = plan.name
    lines = [
        "// Batch `batch` of the arguments: every batched pointer advanced by batch x its batch",
        "// stride (0 broadcasts one matrix to every batch), the workspace by one batch's floats.",
        f"__device__ __forceinline__ {name}_params at_batch(const {name}_params& p, "
        "long long batch) {",
        f"  {name}_params q = p;",
    ]
    for f in plan.fields:
        if f.kind is FieldKind.BATCH_STRIDE:
            lines.append(f"  q.{f.param} += batch * p.{f.name};")
    setup, floats = workspace_lines(plan, "long long", "")
    if floats:
        lines += [f"  {line}" for line in setup]
        lines.append(f"  q.workspace += batch * {floats};")
    lines += ["  return q;", "}"]
    return lines


ALL_BATCHES = "all_batches"  # a batched helper kernel's parameter (`p` is its thread's batch)


def longest(exprs: list[str]) -> str:
    """max(...) of C++ expressions, nested, without repeats."""
    exprs = list(dict.fromkeys(exprs))
    out = exprs[0]
    for other in exprs[1:]:
        out = f"max({out}, {other})"
    return out


def helper_head(plan: KernelPlan, per_batch: str) -> list[str]:
    """The first lines of a batched helper kernel (reduction init and finalize, split-K) whose
    parameter is ALL_BATCHES: thread `i` of `per_batch` (a 64-bit C++ expression over
    ALL_BATCHES, the same in every batch) in every batch, with `p` that thread's batch."""
    ns = f"{plan.name}_kgen"
    threads = plan.INIT_THREADS
    return [
        f"  const long long per_batch = {per_batch};",
        f"  const long long thread = blockIdx.x * {threads}ll + threadIdx.x;",
        f"  if (per_batch == 0 || thread >= {batch_count(plan, ALL_BATCHES + '.')} * per_batch) "
        "return;",
        f"  const {plan.name}_params p = {ns}::at_batch({ALL_BATCHES}, thread / per_batch);",
        "  const long long i = thread % per_batch;",
    ]


def host_lines(plan: KernelPlan) -> list[str]:
    """The host launcher's batch count (after tiles_m and tiles_n): nothing to run for none."""
    if not batched(plan):
        return []
    return [f"const int batches = {batch_count(plan)};",
            "if (batches == 0) return cudaSuccess;"]


def grid_count(plan: KernelPlan, tiles: str) -> str:
    """The host launcher's CTA count for `tiles` CTAs of one batch (params_reason has checked
    that every batch's together fit an int)."""
    return f"{tiles} * batches" if batched(plan) else tiles


def body_call(plan: KernelPlan, narrow: bool, ns: str) -> list[str]:
    """A tiled kernel's entry point: its body on the CTA's batch, the CTA's index in it."""
    kind = "true" if narrow else "false"
    if not batched(plan):
        return [f"{ns}::kernel_body<{kind}>(p);"]
    g = plan.gemms[-1]
    m, n = dim_expr(g.m_dim), dim_expr(g.n_dim)
    split = " * kSplitK" if plan.schedule.split_k > 1 else ""
    return [
        f"using namespace {ns};",
        "// the CTAs of batch b follow those of batch b - 1",
        f"const int ctas = (({m} + kTileM - 1) / kTileM) * (({n} + kTileN - 1) / kTileN){split};",
        f"kernel_body<{kind}>(at_batch(p, blockIdx.x / ctas), blockIdx.x % ctas);",
    ]


# ---- chained gemms: the kernel's parameter is every batch's arguments; `p`, at the kernel's top
# a reference to them (sizes, and the shared operands a resident chain loads once), is in each
# tile's scope that tile's batch (a declaration in the tile loop's block hides the outer one).


def chain_values(plan: KernelPlan) -> dict:
    """What the chain templates print about batches (nothing for a kernel without them)."""
    on = batched(plan)
    name = plan.name
    return dict(
        batched=on,
        kernel_param=ALL_BATCHES if on else "p",
        # a tiled chain's kernel is one tile: its `p` is that tile's batch, from the top
        kernel_head=[f"const {name}_params& p = {ALL_BATCHES};  // sizes and shared operands: "
                     "each tile's scope has its batch's p"] if on and plan.schedule.persistent
        else [],
        times_batches=f" * {batch_count(plan)}" if on else "",
        at_batch=at_batch_lines(plan),
        host_batches=host_lines(plan),
        host_tiles=grid_count(plan, "tiles_m * tiles_n"),
    )


def size_prefix(plan: KernelPlan) -> str:
    """How a chain kernel's top reads its sizes: from `p`, or, in a batched tiled chain (whose
    `p` is declared with the tile's batch), from ALL_BATCHES."""
    return f"{ALL_BATCHES}." if batched(plan) and not plan.schedule.persistent else "p."


def tile_batch(plan: KernelPlan, tile: str) -> list[str]:
    """In a chain's tile scope: the batch of linear tile `tile` and its arguments, as `p`."""
    if not batched(plan):
        return []
    return [f"const int batch = {tile} / (tiles_m * tiles_n);",
            f"const {plan.name}_params p = at_batch({ALL_BATCHES}, batch);  // this tile's "
            "batch of the arguments"]


def tile_params(plan: KernelPlan, tile: str) -> str:
    """The arguments of linear tile `tile` (any tile of the walk, or one past it), as C++."""
    if not batched(plan):
        return "p"
    return f"at_batch({ALL_BATCHES}, {tile} < tiles ? {tile} / (tiles_m * tiles_n) : 0)"


def next_tile_lines(plan: KernelPlan) -> list[str]:
    """A persistent chain's tile top (batched): the next tile's coordinates and arguments, for
    the prefetch of its first stages at the end of this tile (computed here, away from the last
    gemm's live registers: a division there made ptxas spill)."""
    if not batched(plan):
        return []
    return ["int next_m = 0, next_n = 0;",
            "if (next_tile < tiles) tile_coords(next_tile, tiles_m, tiles_n, next_m, next_n);",
            f"const {plan.name}_params next_p = {tile_params(plan, 'next_tile')};  // its batch"]


def next_operand(plan: KernelPlan, param: str) -> tuple[list[str], str]:
    """A resident chain's ring refills past this tile load the next tile's rows of `param`:
    lines (in the tile scope) naming that batch's pointer, and the pointer a refill reads."""
    if not batched(plan) or plan.param(param).batch is None:
        return [], f"p.{param}"
    return ([f"const auto next_{param} = {tile_params(plan, 'next_tile')}.{param};  // the "
             "next tile's batch"], f"(this_tile ? p.{param} : next_{param})")
