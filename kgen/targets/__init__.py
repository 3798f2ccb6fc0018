"""What each compilation target offers: shared-memory budget, MMA shapes and dtypes."""
from __future__ import annotations

from dataclasses import dataclass

from ..enums import Arch, DType


@dataclass(frozen=True, slots=True)
class Target:
    arch: Arch
    smem_limit: int  # bytes of dynamic shared memory one CTA may use
    max_threads: int
    registers_per_sm: int
    mma_shape: tuple[int, int, int]  # the warp-level MMA instruction, m x n x k
    operand_dtypes: frozenset[DType]  # A/B element types the MMA takes
    acc_dtypes: frozenset[DType]
    output_dtypes: frozenset[DType]
    emitter: str  # key of the emitter table in kgen.emit


_SM80_FAMILY = dict(
    max_threads=1024,
    registers_per_sm=65536,
    mma_shape=(16, 8, 16),
    operand_dtypes=frozenset({DType.F16, DType.BF16}),
    acc_dtypes=frozenset({DType.F32}),
    output_dtypes=frozenset({DType.F16, DType.BF16, DType.F32}),
    emitter="sm80",
)

TARGETS: dict[Arch, Target] = {
    Arch.SM80: Target(Arch.SM80, smem_limit=163 * 1024, **_SM80_FAMILY),
    Arch.SM86: Target(Arch.SM86, smem_limit=99 * 1024, **_SM80_FAMILY),
    Arch.SM89: Target(Arch.SM89, smem_limit=99 * 1024, **_SM80_FAMILY),
    # sm_90a runs the sm_80 mainloop until the TMA/wgmma path lands; the budget is Hopper's.
    Arch.SM90A: Target(Arch.SM90A, smem_limit=227 * 1024, **_SM80_FAMILY),
}


def target(arch: Arch) -> Target:
    return TARGETS[arch]
