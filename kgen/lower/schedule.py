"""Schedule pass: `schedule pingpong`, its rules and its numbers.

A ping-pong kernel (sm_90a) splits the CTA by role:
    producer   two warps stream the first gemm's A tiles into a ring of `stages` slots, each
               guarded by a full and an empty mbarrier (cp.async, signalled through
               cp.async.mbarrier.arrive), over every tile of the CTA in order
    consumers  two warpgroups take the CTA's tiles in turn (local tiles 0, 2, 4, ... and
               1, 3, 5, ...); each runs the whole chain on a 64-row tile of its own: g0 on wgmma
               from the ring, g1 from registers, then the epilogue and its stores. While one
               warpgroup stores, the other multiplies, and the producer never waits on either
               beyond the ring's depth.

The last gemm's output leaves through the copy engine where it can (see tma_store): each consumer
warpgroup writes its tile into a staging buffer of its own in shared memory (64x64 boxes,
128-byte swizzle) and one thread issues cp.async.bulk.tensor stores of it; the warpgroup
rewrites the buffer only once the copy engine has read it (cp.async.bulk.wait_group.read). On
an H200 this beat 16-byte stores from registers (bench/RESULTS.md); it takes 2 x 64 x tile N x 2
bytes of shared memory that the ring then cannot have.

The rules, each with a located message: target sm_90a; a persistent chain that keeps every B
resident (the consumers never wait for B); the first gemm's warps 4x1 (one warpgroup per
tile; the chain rules give every gemm the same warps); more ring slots than the first gemm's
k tiles (a consumer's next wait may be that far past the slot it last released, and an
mbarrier phase parity tells only two rounds apart).
"""
from __future__ import annotations

from .. import ir
from ..errors import KgenError
from ..plan import GemmPlan

STAGING_BOX = 64  # the copy engine's box: 64 rows x 64 columns (128 bytes of 16-bit values)
STAGING_ALIGN = 1024  # a 128-byte swizzled box starts on a 1024-byte boundary (8 rows x 128 B)
# The tensor map's element type of an output the copy engine stores (see tma_store)
TMA_DTYPE = {ir.DType.F16: "CU_TENSOR_MAP_DATA_TYPE_FLOAT16",
             ir.DType.BF16: "CU_TENSOR_MAP_DATA_TYPE_BFLOAT16"}
PRODUCER_THREADS = 64  # two warps issue the ring's copies (one warp could not keep up on an H200)
CONSUMERS = 2  # warpgroups, each with a tile of its own
WARPGROUP_WARPS = 4


def wanted(kernel: ir.Kernel) -> bool:
    return kernel.schedule is ir.Schedule.PINGPONG


def check_kernel(kernel: ir.Kernel, arch: ir.Arch) -> None:
    """The rules that need only the IR: the target, the chain's residency and the warps."""
    where = kernel.schedule_loc
    if arch is not ir.Arch.SM90A:
        raise KgenError(
            where,
            f"schedule pingpong needs target sm_90a (wgmma, mbarrier waits); this kernel "
            f"compiles for {arch.value}",
        )
    gemms = kernel.gemms
    if (len(gemms) != 2 or not all(g.resident for g in gemms)
            or gemms[1].keep is ir.Residency.SMEM):
        raise KgenError(
            where,
            "schedule pingpong needs two chained gemms, the second keeping the first in "
            "registers, and every B resident ('keep B0 resident' in each gemm)",
        )
    first = gemms[0]
    if (first.warps.m, first.warps.n) != (WARPGROUP_WARPS, 1):
        raise KgenError(
            first.warps.loc,
            f"schedule pingpong gives each consumer warpgroup a tile of its own: gemm "
            f"'{first.name}' needs warps 4x1, not {first.warps.m}x{first.warps.n}",
        )


def check_plan(kernel: ir.Kernel, first: GemmPlan, wgmma: bool) -> None:
    """The rules that need the plan: wgmma for the first gemm, and the ring's depth."""
    gemm = kernel.gemms[0]
    if not wgmma:
        raise KgenError(
            gemm.tile.loc,
            f"schedule pingpong runs gemm '{first.name}' on wgmma: it needs a 64-row tile, "
            "A and B K-major with 128-byte k tiles (64 f16/bf16), and N a multiple of 8 up "
            "to 256",
        )
    k_tiles = -(-first.k_dim // first.tile[2])
    if first.stages <= k_tiles:
        raise KgenError(
            gemm.stages.loc,
            f"schedule pingpong needs more ring slots than gemm '{first.name}' has k tiles "
            f"({k_tiles}): stages {first.stages} must be at least {k_tiles + 1}, since a "
            f"warpgroup's next tile starts up to {k_tiles + 1} slots past the last one it freed",
        )


def threads() -> int:
    return CONSUMERS * WARPGROUP_WARPS * 32 + PRODUCER_THREADS


def ring_barriers(first: GemmPlan) -> int:
    """mbarriers of the ring: a full and an empty one per slot."""
    return 2 * first.stages


def tma_store(last: GemmPlan, wide: bool) -> bool:
    """Whether the last gemm's output goes out through the copy engine: it already qualifies for
    16-byte stores (`wide`: one row-major 16-bit output and nothing else), its tile is 64 rows
    (one consumer warpgroup) and its tile N a multiple of the 64-column box, and the tiles cover
    N exactly (the box never overhangs a column the output does not have; rows past M are
    clipped by the tensor map)."""
    n = last.tile[1]
    return (wide and last.tile[0] == STAGING_BOX and n % STAGING_BOX == 0
            and isinstance(last.n_dim, int) and last.n_dim % n == 0)


def staging_bytes(last: GemmPlan) -> int:
    """Shared memory for the output staging: a tile of 16-bit values per consumer warpgroup."""
    return CONSUMERS * last.tile[0] * last.tile[1] * 2
