"""Paired tiles on sm_90a's ping-pong chain (Pipeline.paired): where the first gemm's B (B0)
streams through the ring beside A, every 64-row tile rereads all of B0 from L2. Paired, the two
consumer warpgroups take a pair of the CTA's tiles at once (local tiles 2p and 2p + 1): fill
2 (p k_tiles + kt) of the ring, an even slot, holds k tile kt of B0 and of the first tile's A,
the odd slot after it the second tile's A, and both warpgroups multiply from the even slot's
B0, so B0 is read once per pair. The warpgroups then take no turns (Schedule.consumer_order):
each waits on the slots it reads, the even slot's empty barrier counting both, so neither can
run a round ahead of the producer. The shared memory is the unpaired ring's (the odd slots'
B0 stages go unused, the turn barriers stay), so the option leaves the storage plan as it is.

Legal where the ring streams B0 (chain_ring_b) with two consumer warpgroups, an even number of
slots (a pair's fills lie in one even and the next odd slot) and no batched operand (a pair
shares one B0), and then with one wgmma group in flight in the first gemm (each slot goes back
as soon as its group completes)."""
from __future__ import annotations

import dataclasses

from ...plan import GemmPlan, KernelPlan, Overlap
from ..common import batch
from .chain_values import CONSUMERS

WHY_PAIRED = ("the two consumer warpgroups take a pair of 64-row tiles at once: each even ring "
              "slot holds B0's k tile beside the first tile's A, the odd slot after it the "
              "second tile's A, and both multiply from that B0, which is read from L2 once per "
              "pair instead of once per tile")

# The rulebook pairs where B0's rows split 32-byte sectors (K0 = 8 mod 16 in f16 and bf16): there
# every tile's rereads of B0 from L2 cost far more than at K0 = 1024 (bench/RESULTS.md, section
# 18: K0 = 1000 with N0 of 96 to 160, B0 too wide to stay resident, ran 1.76-2.20x a copy of the
# chain's bytes streamed unpaired, against 1.14x at K0 = 1024).
WHY_RULE = ": B0's rows split 32-byte sectors, whose rereads from L2 cost the most"


def paired_refusal(first: GemmPlan, ring_b: bool, consumers: int, batched: bool) -> str | None:
    """Why a ping-pong chain's tiles cannot be paired (None: they can); `first`: the first
    gemm's plan, `ring_b`: whether B0 streams through the ring."""
    if not ring_b:
        return "B0 is resident: there are no k tiles of it to share"
    if consumers != CONSUMERS:
        return f"a pair needs {CONSUMERS} consumer warpgroups, not {consumers}"
    if first.stages % 2:
        return f"a pair's fills take an even and an odd slot: {first.stages} slots is odd"
    if batched:
        return "a batched chain's pair of tiles may lie in two batches"
    return None


def pairs(first: GemmPlan, ring_b: bool, consumers: int, batched: bool) -> bool:
    """The rulebook's choice of Pipeline.paired for a ping-pong chain (where it is legal):
    where B0's rows split 32-byte sectors (split_rows)."""
    return paired_refusal(first, ring_b, consumers, batched) is None and split_rows(first)


def split_rows(first: GemmPlan) -> bool:
    """Whether the first gemm's K-major B rows (K0 elements) are not whole 32-byte sectors."""
    k = first.k_dim
    return isinstance(k, int) and k * first.b.dtype.nbytes % 32 != 0


def with_paired(plan: KernelPlan, paired: bool) -> KernelPlan:
    """The ping-pong chain `plan` with its tiles paired or not (Pipeline.paired): a plan option
    for the bench's probe and the GPU tests; `pairs` says what the rulebook picks. Pairing
    takes the first gemm to one wgmma group in flight; the storage plan is unchanged."""
    schedule = plan.schedule
    ring = schedule.gemms[0]
    if paired:
        consumers = schedule.warps.role("consumer").groups
        refusal = paired_refusal(plan.gemms[0], schedule.chain_ring_b, consumers,
                                 batch.batched(plan))
        if refusal is not None:
            raise ValueError(f"{plan.name}: tiles not paired: {refusal}")
    pipeline = dataclasses.replace(ring.pipeline, paired=paired,
                                   why=WHY_PAIRED + " (the plan option with_paired)"
                                   if paired else "")
    ring = dataclasses.replace(ring, pipeline=pipeline,
                               overlap=Overlap() if paired else ring.overlap)
    return dataclasses.replace(plan, schedule=dataclasses.replace(
        schedule, gemms=(ring,) + schedule.gemms[1:]))
