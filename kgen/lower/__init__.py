"""Lowering: a verified ir.Kernel to a plan.KernelPlan, through an explicit list of passes.

    chain                 the rules of back-to-back gemms (kgen/lower/chain.py)
    mainloop  (per gemm)  tiles, warp tiles, operand shared-memory layouts and swizzles; a
                          chained gemm's A from the gemm before it (registers or smem)
    epilogue  (per gemm)  the visitor tree as straight-line C++ per accumulator pair
    abi                   the params struct, argument alignments and size rules
    storage               phases, shared-memory buffers and their lifetimes, the declared
                          storage layout (checked by unions) and the packer, budget check

A kernel without a gemm but with a storage declaration lowers to a plan with no gemm: its
storage can be planned and inspected, not emitted.
"""
from __future__ import annotations

import dataclasses

from .. import ir
from ..errors import KgenError
from ..plan import GemmPlan, KernelPlan, OperandPlan
from ..targets import target
from . import abi, chain, epilogue, mainloop, schedule, storage

GROUP_M = 8  # CTA rasterization: 8 tile rows share the B tiles they stream through L2


def can_persist(kernel: ir.Kernel, gemms: list[GemmPlan]) -> bool:
    """A persistent kernel (CTAs loop over row tiles, prefetching the next tile's first stages
    of the first gemm during the last one) is emitted for two chained gemms with the
    intermediate in registers and no user storage or phases (their lifetimes assume one tile)."""
    return (len(gemms) == 2 and gemms[1].chain is not None and gemms[1].a is None
            and kernel.storage is None and not kernel.phases)


def resident_plans(kernel: ir.Kernel, gemms: list[GemmPlan], persist: bool) -> list[GemmPlan]:
    """`keep B0 resident` on every gemm of a persistent chain: each B operand's shared tile
    holds all of its k tiles (loaded once per CTA), and the first gemm's stages hold A only.
    The rules, each with a located message: a persistent chain, every gemm or none, fixed K
    and N."""
    asked = [g for g in kernel.gemms if g.resident]
    if not asked:
        return gemms
    first = asked[0]
    where = first.resident_loc or first.loc
    if not persist:
        raise KgenError(
            where,
            f"keep {first.b.name} resident needs the persistent kernel: two chained gemms, the "
            "second keeping the first in registers, and no storage or phases declaration",
        )
    for g in kernel.gemms:
        if not g.resident:
            raise KgenError(
                g.loc,
                f"gemm '{g.name}' must keep {g.b.name} resident too: {first.name} keeps "
                f"{first.b.name} resident, and a chain keeps every B resident or none "
                f"(add 'keep {g.b.name} resident')",
            )
    out = []
    for g, plan in zip(kernel.gemms, gemms):
        for what, dim in (("K", plan.k_dim), ("N", plan.n_dim)):
            if not isinstance(dim, int):
                raise KgenError(
                    g.resident_loc or g.loc,
                    f"keep {g.b.name} resident needs a fixed {what}, not {dim}: the whole "
                    f"{g.b.name} must have a known size",
                )
        if plan.n_dim > plan.tile[1]:
            raise KgenError(
                g.resident_loc or g.loc,
                f"keep {g.b.name} resident needs the CTA tile N of gemm '{g.name}' "
                f"({plan.tile[1]}) to cover all of its N ({plan.n_dim}): each CTA keeps one "
                f"tile of {g.b.name}",
            )
        k_tiles = -(-plan.k_dim // plan.tile[2])
        smem = dataclasses.replace(plan.b.smem, stages=k_tiles)
        out.append(dataclasses.replace(plan, b=dataclasses.replace(plan.b, smem=smem)))
    return out


def wide_stores(last: GemmPlan) -> bool:
    """Whether a resident chain's last gemm can store its output as 16-byte chunks: its epilogue
    only stores one row-major 16-bit tensor, N is a fixed multiple of 8 (no partial chunk) and
    each warp's columns come in whole chunks of four n8 tiles."""
    return (last.epilogue.packed_store is not None and isinstance(last.n_dim, int)
            and last.n_dim % 8 == 0 and last.warp_tile[1] % 32 == 0)


def can_wgmma(arch: ir.Arch, first: GemmPlan, storage_plan) -> bool:
    """Whether a resident chain's first gemm can run on wgmma (sm_90a): warpgroups of 4 warps
    along M with 16 rows per warp (the accumulators then sit where mma.sync would put them),
    A and B K-major with one 128-byte swizzled row per k tile (the wgmma 128-byte swizzle
    layout), N a multiple of 8 up to 256, and both stage buffers 1024-byte aligned."""
    offsets = {b.name: b.offset for b in storage_plan.buffers}
    return (arch is ir.Arch.SM90A and _wgmma_shape(first, offsets)
            and _wgmma_tile(first, first.a, offsets))


def _wgmma_shape(g: GemmPlan, offsets: dict[str, int]) -> bool:
    """The rules every wgmma gemm shares: warpgroups of 4 warps along M, 16 rows per warp, N a
    multiple of 8 up to 256, and B as wgmma reads it (see _wgmma_tile)."""
    return (g.warps[1] == 1 and g.warps[0] % 4 == 0 and g.warp_tile[0] == 16
            and g.tile[1] % 8 == 0 and 8 <= g.tile[1] <= 256 and _wgmma_tile(g, g.b, offsets))


def _wgmma_tile(g: GemmPlan, op: OperandPlan, offsets: dict[str, int]) -> bool:
    """An operand wgmma reads through a descriptor: K-major, one 128-byte swizzled row per k
    tile, its buffer 1024-byte aligned."""
    nbytes = op.dtype.nbytes
    return (op.k_major and g.tile[2] * nbytes == 128 and op.smem.atom_inner * nbytes == 128
            and offsets[op.smem.name] % 1024 == 0)


def can_wgmma_chained(arch: ir.Arch, g: GemmPlan, storage_plan) -> bool:
    """Whether a chained gemm that takes its A from registers (`keep ... in registers`) and
    keeps its B resident can run on wgmma (sm_90a) with A read from registers: the A fragments
    of m16n8k16 are wgmma's register layout for a warp's 16 rows, so the rules are the first
    gemm's for the warps and for B (K-major, one 128-byte swizzled row per k tile, N a multiple
    of 8 up to 256, 1024-byte aligned). The caller asks only for a resident plan."""
    offsets = {b.name: b.offset for b in storage_plan.buffers}
    return (arch is ir.Arch.SM90A and g.chain is not None and g.a is None
            and _wgmma_shape(g, offsets))


def lower(kernel: ir.Kernel, arch: ir.Arch | None = None, *,
          persistent: bool | None = None) -> KernelPlan:
    """`persistent`: None lets kgen choose (persistent when can_persist), False never, True
    when can_persist (else the plain grid)."""
    arch = arch or kernel.target
    tgt = target(arch)
    if not kernel.gemms and kernel.storage is None:
        raise KgenError(kernel.loc, f"kernel '{kernel.name}' has no gemm")
    chain.check(kernel)
    pingpong = schedule.wanted(kernel)
    if pingpong:
        schedule.check_kernel(kernel, arch)
    gemms: list[GemmPlan] = []
    chained = len(kernel.gemms) > 1
    for g in kernel.gemms:
        if kernel.param(g.a.name) is None:
            fields = chain.run(kernel, g, tgt)
        else:  # a chain names each gemm's buffers after it: g0_a_smem, g1_b_smem
            # with schedule pingpong the producer warps alone copy the first gemm's A
            a_threads = schedule.PRODUCER_THREADS if pingpong and g is kernel.gemms[0] else None
            fields = mainloop.run(kernel, g, tgt, f"{g.name}_" if chained else "", a_threads)
        gemms.append(GemmPlan(**fields, epilogue=epilogue.run(kernel, g)))
    fields = abi.fields(kernel)
    operands = [op.param for g in gemms for op in (g.a, g.b)
                if op is not None and kernel.param(op.param) is not None]
    alignments, dim_rules = abi.requirements(kernel, operands)
    budget_loc = kernel.gemms[0].stages.loc if kernel.gemms else kernel.storage.loc
    persist = can_persist(kernel, gemms) and persistent is not False
    resident = any(g.resident for g in kernel.gemms)
    gemms = resident_plans(kernel, gemms, persist)
    wide = resident and wide_stores(gemms[-1])
    tma_store = pingpong and schedule.tma_store(gemms[-1], wide)
    try:
        storage_plan = storage.run(
            kernel, gemms, tgt, budget_loc, persistent=persist, resident=resident,
            ring_barriers=schedule.ring_barriers(gemms[0]) if pingpong else 0,
            staging=((schedule.staging_bytes(gemms[-1]), schedule.STAGING_ALIGN)
                     if tma_store else (0, 0)))
    except KgenError:
        if not persist or resident:  # a resident B was asked for: no quiet fallback
            raise
        # the prefetched stages do not fit beside the later gemms' own: one CTA per tile
        persist = False
        storage_plan = storage.run(kernel, gemms, tgt, budget_loc)
    if wide:  # the output's 16-byte chunks need 16-byte rows
        out = gemms[-1].epilogue.packed_store.param
        alignments = tuple(
            dataclasses.replace(a, ptr_bytes=16, ld_multiple=8,
                                reason="the epilogue writes it in 16-byte chunks of 8 columns")
            if a.param == out else a for a in alignments)
    warps = gemms[0].warps if gemms else (0, 0)
    wgmma = resident and can_wgmma(arch, gemms[0], storage_plan)
    # the later gemms follow the first onto wgmma where their own rules hold
    wgmma_chain = tuple(g.name for g in gemms[1:]
                        if wgmma and can_wgmma_chained(arch, g, storage_plan))
    if pingpong:
        schedule.check_plan(kernel, gemms[0], wgmma)
    return KernelPlan(
        kernel=kernel,
        arch=arch,
        threads=schedule.threads() if pingpong else warps[0] * warps[1] * 32,
        fields=fields,
        gemms=tuple(gemms),
        storage=storage_plan,
        group_m=GROUP_M,
        min_blocks_per_sm=1,
        alignments=alignments,
        dim_rules=dim_rules,
        persistent=persist,
        resident=resident,
        wide_stores=wide,
        wgmma=wgmma,
        wgmma_chain=wgmma_chain,
        pingpong=pingpong,
        tma_store=tma_store,
        params=abi.params(kernel),
        compute_dtype=kernel.compute_dtype,
        deterministic_reductions=kernel.deterministic,
    )
