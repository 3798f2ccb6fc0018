"""The shared memory of a DAG loop's mma.sync skeleton (templates/common/loop_bwd.cu.j2), placed
by kgen's storage planner (kgen/lower/storage.py): every tile a buffer with a lifetime over the
kernel's phases, the byte offsets first fit's, buffers never live together sharing bytes.

The phases, in the order a CTA runs them:

    prologue   the loop-invariant tiles (K, V) and the ring's first blocks are loaded
    loads      a block's streamed tiles land in their ring slot (the top of each iteration)
    <gemm>     one phase per gemm of the loop, in statement order: its MMAs, the epilogue
               statements after them, and the A operand handed on or staged before them
    epilogue   after the loop: the accumulators are stored

The loop's iterations run the phases `loads` to the last gemm's over and over, with a barrier
between two iterations (the skeleton's last `__syncthreads()`), so a buffer used within one
iteration only is live from its first phase to its last reader there:

- a loop-invariant tile (resident): prologue to the last gemm, carried across the iterations;
- a streamed tile's ring with two slots or more: prologue to the last gemm (a slot refills while
  another is read, across the iterations); with one slot: from `loads` to its last reader;
- a staged tile value (dS^T for a loop-row gemm; the warp grid's P^T and dS^T for the
  accumulating gemms, plan.loop_dag.DagGrid): from the phase of the gemm it is staged before
  to its last reader (the grid's P^T to the last gemm: dag_mma_rules.DAG_GRID_OWN_BYTES);
- a vector of the loop's dimension staged per block (lse, D): as a streamed tile, its last
  reader the last score gemm.

So with one ring slot a staged tile may take the bytes of a streamed tile whose last reader came
before it (dS^T over dO: the seed's `tmp_shared_storage` over its dO.V^T operands). Such a
staged tile is `fenced`: a barrier precedes its writes, since the warps run the phases at their
own pace and another warp may still be reading the bytes it is about to write (not for a buffer
live from a later phase only: its last reads of the previous block were before the block's
barrier: the warp grid's dS^T in P^T's bytes would be fenced, P^T not).
"""
from __future__ import annotations

from ..plan import StoragePlan
from ..plan import loop_dag as ld
from ..plan import program as pp
from ..targets import Target, dag_mma_rules
from . import storage

PROLOGUE, LOADS, EPILOGUE = "prologue", "loads", "epilogue"


def vector_buffer(param: str) -> str:
    """The buffer of a vector staged per block (the template's `vec_<param>`)."""
    return f"vec_{param}"


def plan(resident: tuple[pp.SmemTile, ...], streamed: tuple[pp.SmemTile, ...],
         staged: tuple[pp.SmemTile, ...], vectors: tuple[str, ...], gemms: tuple[ld.DagGemm, ...],
         body: pp.Section, stages: int, block: int,
         tgt: Target) -> tuple[StoragePlan, tuple[str, ...]]:
    """The placed buffers (tiles by name, vectors as `vec_<param>`) and the staged tiles that
    need a barrier before their writes."""
    phases = [PROLOGUE, LOADS] + [g.name for g in gemms] + [EPILOGUE]
    phase_of = {g.name: 2 + i for i, g in enumerate(gemms)}
    last = 1 + len(gemms)  # the last gemm's phase
    readers: dict[str, list[int]] = {}
    for g in gemms:
        for tile in (g.a, g.b):
            if tile:
                readers.setdefault(tile, []).append(phase_of[g.name])
    staged_at: dict[str, int] = {}  # a staged tile: the phase of the gemm it is staged before
    pending: list[str] = []
    for stmt in body.statements:
        if isinstance(stmt, ld.StageTile):
            pending.append(stmt.tile)
        elif isinstance(stmt, ld.DagStep):
            for name in pending:
                staged_at.setdefault(name, phase_of[stmt.gemm.name])
            pending = []
    scores = [phase_of[g.name] for g in gemms if g.kind is ld.GemmKind.SCORE]

    def streamed_live(last_reader: int) -> tuple[int, int]:
        return (0, last) if stages > 1 else (1, last_reader)

    ring_why = (f"a ring of {stages} slots: one refills while another is read, across the "
                "iterations" if stages > 1 else "one slot, loaded at the top of each iteration")
    requests = []
    for t in resident:
        requests.append(storage.Request(
            t.name, t.bytes, storage.TILE_ALIGN, (0, last),
            f"{t.param}: [{t.rows}][{t.cols}], loop-invariant, loaded once", dtype=t.dtype))
    for t in streamed:
        requests.append(storage.Request(
            t.name, t.bytes, storage.TILE_ALIGN, streamed_live(max(readers[t.name])),
            f"{t.param}: {t.slots} x [{t.rows}][{t.cols}] of the block, {ring_why}",
            dtype=t.dtype))
    for t in staged:
        read = {g.kind for g in gemms if g.a == t.name}
        # the warp grid's P^T: to the block's end, where the rulebook says so
        end = (last if read == {ld.GemmKind.ACCUMULATING} and dag_mma_rules.DAG_GRID_OWN_BYTES
               else max(readers[t.name]))
        requests.append(storage.Request(
            t.name, t.bytes, storage.TILE_ALIGN, (staged_at[t.name], end),
            f"tile value {t.param} staged: [{t.rows}][{t.cols}], read "
            + ("as A by an accumulating gemm (the warp grid)" + (", " if len(read) > 1 else "")
               if ld.GemmKind.ACCUMULATING in read else "")
            + ("transposed by a loop-row gemm" if ld.GemmKind.LOOP_ROW in read else ""),
            dtype=t.dtype))
    for v in vectors:
        requests.append(storage.Request(
            vector_buffer(v), 4 * stages * block, storage.SCRATCH_ALIGN,
            streamed_live(max(scores)), f"{v}: {stages} x [{block}] f32 of the block, staged "
            "with the streamed tiles", dtype=None))
    placed = storage.planned(phases, requests, tgt)
    by_name = {b.name: b for b in placed.buffers}
    # a buffer live from a later phase than a staged tile is done with its bytes before the
    # block's last barrier: the staged tile's writes need no barrier for it
    fenced = tuple(t.name for t in staged
                   if any(by_name[t.name].shares_bytes(b) for b in placed.buffers
                          if b.name != t.name and b.live[0] <= by_name[t.name].live[0]))
    return placed, fenced
