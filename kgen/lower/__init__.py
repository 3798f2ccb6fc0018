"""Lowering: a verified ir.Kernel to a plan.KernelPlan, through an explicit list of passes.

    mainloop  (per gemm)  tiles, warp tiles, operand shared-memory layouts and swizzles
    epilogue  (per gemm)  the visitor tree as straight-line C++ per accumulator pair
    abi                   the params struct, argument alignments and size rules
    storage               phases, shared-memory buffers and their lifetimes, the declared
                          storage layout (checked by unions) and the packer, budget check

A kernel without a gemm but with a storage declaration lowers to a plan with no gemm: its
storage can be planned and inspected, not emitted.
"""
from __future__ import annotations

from .. import ir
from ..errors import KgenError
from ..plan import GemmPlan, KernelPlan
from ..targets import target
from . import abi, epilogue, mainloop, storage

GROUP_M = 8  # CTA rasterization: 8 tile rows share the B tiles they stream through L2


def lower(kernel: ir.Kernel, arch: ir.Arch | None = None) -> KernelPlan:
    arch = arch or kernel.target
    tgt = target(arch)
    if len(kernel.gemms) > 1 or (not kernel.gemms and kernel.storage is None):
        loc = kernel.gemms[1].loc if kernel.gemms else kernel.loc
        raise KgenError(loc, "this kgen version lowers exactly one gemm per kernel")
    gemms: list[GemmPlan] = []
    for g in kernel.gemms:
        fields = mainloop.run(kernel, g, tgt)
        gemms.append(GemmPlan(**fields, epilogue=epilogue.run(kernel, g)))
    fields = abi.fields(kernel)
    operands = [name for g in gemms for name in (g.a.param, g.b.param)]
    alignments, dim_rules = abi.requirements(kernel, operands)
    budget_loc = kernel.gemms[0].stages.loc if kernel.gemms else kernel.storage.loc
    storage_plan = storage.run(kernel, gemms, tgt, budget_loc)
    warps = gemms[0].warps if gemms else (0, 0)
    return KernelPlan(
        kernel=kernel,
        arch=arch,
        threads=warps[0] * warps[1] * 32,
        fields=fields,
        gemms=tuple(gemms),
        storage=storage_plan,
        group_m=GROUP_M,
        min_blocks_per_sm=1,
        alignments=alignments,
        dim_rules=dim_rules,
    )
