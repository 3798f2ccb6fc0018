"""Paired tiles on sm_90a's ping-pong chain (Pipeline.paired), a plan option: where the first
gemm's B (B0) streams through the ring beside A, every 64-row tile rereads all of B0 from L2.
Paired, the two consumer warpgroups take a pair of the CTA's tiles at once (local tiles 2p and
2p + 1): fill 2 (p k_tiles + kt) of the ring, an even slot, holds k tile kt of B0 and of the
first tile's A, the odd slot after it the second tile's A, and both warpgroups multiply from the
even slot's B0, so B0 is read once per pair. The warpgroups then take no turns
(Schedule.consumer_order): each waits on the slots it reads, the even slot's empty barrier
counting both, so neither can run a round ahead of the producer. The shared memory is the
unpaired ring's (the odd slots' B0 stages go unused, the turn barriers stay), so the option
leaves the storage plan as it is.

Legal where the ring streams B0 (chain_ring_b) with two consumer warpgroups, an even number of
slots (a pair's fills lie in one even and the next odd slot) and no batched operand (a pair
shares one B0), and then with one wgmma group in flight in the first gemm (each slot goes back
as soon as its group completes).

The rulebook pairs where B0's rows split 32-byte sectors (`pairs_why`: a fixed K0 whose rows
are not a multiple of 32 bytes, K0 = 1000 in 16 bits), and where pairs are legal. H200, M =
81920 (bench/chain_sweep.py --pairs, 2026-11-30), time paired / unpaired on kgen's choice, both
checked against the reference: bf16 1000/96/192 0.762 (0.0690 / 0.0906 ms; 1.33x a copy of the
chain's bytes against 1.75x, 2.14x the PyTorch chain against 1.62x), f16 1000/128/320 0.868
(0.0898 / 0.1034; 1.56x against 1.80x), bf16 1000/160/64 0.696 (0.0768 / 0.1104; 1.64x against
2.34x). Where the rows are whole sectors the rereads cost little (bench/RESULTS.md, section 4)
and pairs lose the turns' overlap (2026-11-29: f16 64/32/64 1.01, bf16 128/128/64 1.06, f16
160/80/96 0.97): not paired there."""
from __future__ import annotations

import dataclasses

from ...plan import GemmPlan, KernelPlan, Overlap
from ..common import batch
from .chain_values import CONSUMERS

WHY_PAIRED = ("the two consumer warpgroups take a pair of 64-row tiles at once: each even ring "
              "slot holds B0's k tile beside the first tile's A, the odd slot after it the "
              "second tile's A, and both multiply from that B0, which is read from L2 once per "
              "pair instead of once per tile")


def paired_refusal(first: GemmPlan, ring_b: bool, consumers: int, batched: bool) -> str | None:
    """Why a ping-pong chain's tiles cannot be paired (None: they can); `first`: the first
    gemm's plan, `ring_b`: whether the copy engine streams B0 through the ring beside A."""
    if not ring_b:
        return "B0 is not streamed beside A by the copy engine: no k tiles of it to share"
    if consumers != CONSUMERS:
        return f"a pair needs {CONSUMERS} consumer warpgroups, not {consumers}"
    if first.stages % 2:
        return f"a pair's fills take an even and an odd slot: {first.stages} slots is odd"
    if batched:
        return "a batched chain's pair of tiles may lie in two batches"
    return None


def pairs_why(first: GemmPlan, ring_b: bool, consumers: int, batched: bool) -> str | None:
    """The rulebook's pairing of a ping-pong chain's tiles: why they are paired (the
    Pipeline's why), or None (not): B0's rows split 32-byte sectors and pairs are legal."""
    k = first.k_dim
    if not isinstance(k, int) or paired_refusal(first, ring_b, consumers, batched) is not None:
        return None
    row_bytes = k * first.b.dtype.nbytes
    if row_bytes % SECTOR_BYTES == 0:
        return None
    return (f"{WHY_PAIRED}: {first.b.param}'s rows of {row_bytes} bytes split {SECTOR_BYTES}-byte "
            "sectors, so each unpaired tile's rereads cost about twice its bytes (H200, K0 = "
            "1000: paired 0.70-0.87 of the unpaired time; kgen/targets/sm90/chain_pairs.py)")


SECTOR_BYTES = 32  # an L2 sector: rows of B0 not a multiple of it split sectors


def with_paired(plan: KernelPlan, paired: bool) -> KernelPlan:
    """The ping-pong chain `plan` with its tiles paired or not (Pipeline.paired): a plan option
    for the bench's --pairs and the GPU tests (the rulebook's choice: pairs_why). Pairing takes the
    first gemm to one wgmma group in flight, and unpairing leaves it there; the storage plan is
    unchanged."""
    schedule = plan.schedule
    ring = schedule.gemms[0]
    if paired:
        role = schedule.warps.role("consumer")
        consumers = role.groups if role is not None else 0
        refusal = paired_refusal(plan.gemms[0], schedule.chain_ring_b and schedule.tma_loads,
                                 consumers, batch.batched(plan))
        if refusal is not None:
            raise ValueError(f"{plan.name}: tiles not paired: {refusal}")
    pipeline = dataclasses.replace(ring.pipeline, paired=paired,
                                   why=WHY_PAIRED + " (the plan option with_paired)"
                                   if paired else "")
    ring = dataclasses.replace(ring, pipeline=pipeline,
                               overlap=Overlap() if paired else ring.overlap)
    return dataclasses.replace(plan, schedule=dataclasses.replace(
        schedule, gemms=(ring,) + schedule.gemms[1:]))
