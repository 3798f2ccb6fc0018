"""The warp grid of a DAG loop's mma.sync skeleton (plan.loop_dag.DagGrid; the rulebook's
choice, kgen/targets/dag_mma_rules.py dag_warp_grid): whether the loop takes it, and each
gemm's share of its tile per warp under it. Read by kgen/lower/loop_dag.py."""
from __future__ import annotations

from .. import ir
from ..plan import loop_dag as ld
from ..targets import Target, dag_mma_rules, loop_rules


def choose(kernel: ir.Kernel, config: loop_rules.LoopConfig, shape: loop_rules.DagShape,
           dtype: ir.DType, acc_ns: tuple[int, ...], loop_row_ns: tuple[int, ...],
           tgt: Target) -> tuple[ld.DagGrid | None, str]:
    """The rulebook's warp grid for this loop in `config`, or None (the warp rows), with why:
    its shared memory counted with every handed value staged in bytes of its own."""
    dims, why = dag_mma_rules.dag_warp_grid(
        config.tile_m, config.block, config.warps, acc_ns, loop_row_ns,
        loop_rules.dag_smem_bytes(config, shape, dtype)
        + shape.handed * config.tile_m * config.block * dtype.nbytes, tgt.smem_limit,
        refusal(kernel, max(acc_ns)))
    return (ld.DagGrid(*dims) if dims else None), why


def share(grid: ld.DagGrid, kind: ld.GemmKind, config: loop_rules.LoopConfig,
          n: int) -> tuple[int, int]:
    """A warp's share of a gemm's [M, n] tile under the grid: (its columns, its m16 tiles);
    M the rows (tile_m) but for a loop-row gemm (the block)."""
    m, (along_m, along_n) = {ld.GemmKind.SCORE: (config.tile_m, grid.score),
                             ld.GemmKind.ACCUMULATING: (config.tile_m, grid.acc),
                             ld.GemmKind.LOOP_ROW: (config.block, grid.loop_row)}[kind]
    return n // along_n, m // (16 * along_m)


def refusal(kernel: ir.Kernel, n_acc: int) -> str | None:
    """What of this loop the warp grid does not take (dag_warp_grid's `unsupported`), or None:
    a row reduction or row store (DAG_GRID_REDUCE_WHY); a tanh, a tile store or a block mask's
    walk where the grid spilled (DAG_GRID_SPILLS_WHY)."""
    def has(node, test) -> bool:
        kids = getattr(node, "args", None) or ((node.arg,) if isinstance(
            node, (ir.Cast, ir.Reduce)) else ())
        return test(node) or any(has(c, test) for c in kids)

    looped = [s for g in kernel.loop.gemms for s in (g.epilogue.stmts if g.epilogue else ())]
    for s in looped + list(kernel.epilogue.stmts if kernel.epilogue else ()):
        p = kernel.param(s.target) if isinstance(s, ir.Store) else None
        if has(s.value, lambda n: isinstance(n, ir.Reduce)):
            return (f"the row reduction in '{getattr(s, 'name', None) or s.target}': "
                    + dag_mma_rules.DAG_GRID_REDUCE_WHY)
        if p is not None and p.kind is ir.ParamKind.VECTOR:
            return f"the row store of '{p.name}': " + dag_mma_rules.DAG_GRID_REDUCE_WHY
    if kernel.loop.blocks is not None and n_acc >= dag_mma_rules.DAG_GRID_HEAVY_N:
        return f"a block mask's walk at N {n_acc}: " + dag_mma_rules.DAG_GRID_SPILLS_WHY
    for s in looped:
        p = kernel.param(s.target) if isinstance(s, ir.Store) else None
        if has(s.value, lambda n: isinstance(n, ir.Call) and n.op is ir.Op.TANH):
            return "the loop's tanh: " + dag_mma_rules.DAG_GRID_SPILLS_WHY
        if (p is not None and p.kind is ir.ParamKind.TENSOR and not s.accumulate
                and n_acc >= dag_mma_rules.DAG_GRID_HEAVY_N):
            return (f"the tile store of '{p.name}' at N {n_acc}: "
                    + dag_mma_rules.DAG_GRID_SPILLS_WHY)
    return None
