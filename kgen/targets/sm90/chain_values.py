"""The register budget of sm_90a's ping-pong chain (kgen/targets/sm90/schedules.py): the values a
consumer thread holds at each chained gemm, the last gemm's column passes (of 128 columns, or of
one staging box where a wide first tile leaves no room for more), when its output staging fits,
and the consumer warpgroups and passes in flight those values allow. Each limit is one NVRTC
measured without a spill, each choice one an H200 measured (bench/RESULTS.md, section 4)."""
from __future__ import annotations

from typing import Sequence

from ...plan import GemmPlan, Overlap
from .tensor_map import STAGING_BOX

CONSUMERS = 2  # warpgroups, each with a tile of its own (a chain may take 3: consumer_count)

# A ping-pong chain's consumer thread holds consumer_values of its tiles. With 232 registers
# each (setmaxnreg; the producer warpgroup keeps 40), NVRTC 13 compiled up to 224 such values
# (N0 128, N1 256) without a spill; N0 = 160 with N1 = 256 (248) spilled.
PINGPONG_MAX_VALUES = 224
# A later gemm of a longer chain, whose A comes from a gemm that took its own A from registers
# (gemm 2 on): NVRTC 13 spilled at 224 values there (bf16 and f16, N 64/256/64 at K0 = 256 and
# 576: 44-48 bytes; 64/256/64/64: 60) and at 208 (64/256/32: 4 bytes), though 128/256/64 (224)
# and 64/192/128 (208) compiled clean. Under this rule, 37 three- and four-gemm chains that plan
# (bf16, K0 = 256, N of 64 to 256 each) compiled without a spill.
CHAINED_MAX_VALUES = 192
# The values a ping-pong chain's consumer thread holds (consumer_values) above which its output
# staging spilled: NVRTC 13 compiled N0 128 with N1 256 (224 values) to 84 bytes of spills
# when staged, none when stored from registers; N0 64 with N1 256 (176) staged without one.
STAGING_MAX_VALUES = 192


def consumer_values(n0: int, n1: int) -> int:
    """Per consumer thread of a ping-pong chain: g0's 64 x n0 accumulators (n0 / 2 floats),
    their repacked A fragments for g1 (n0 / 4) and g1's accumulators (n1 / 2)."""
    return n0 // 2 + n0 // 4 + n1 // 2


def tile_values(widths: Sequence[int], passes: int = 1) -> list[int]:
    """consumer_values at each chained gemm of a ping-pong chain whose tiles are `widths`
    columns wide (the first gemm's first): the gemm before's accumulators, their A fragments
    and this gemm's accumulators, one column pass's of them in the last gemm (`passes`). The
    stages run one after the other: only one gemm's values are live at a time."""
    last = len(widths) - 1
    return [consumer_values(n0, n1 // (passes if i + 1 == last else 1))
            for i, (n0, n1) in enumerate(zip(widths, widths[1:]))]


def gemm_values(gemms: Sequence[GemmPlan], passes: int = 1) -> list[int]:
    """tile_values of a chain's gemm plans: one figure per gemm after the first."""
    return tile_values([g.tile[1] for g in gemms], passes)


def chain_values(gemms: Sequence[GemmPlan], passes: int = 1) -> int:
    """The most values a consumer thread of a ping-pong chain holds at once (gemm_values); for
    two gemms consumer_values(N0, N1 / passes)."""
    return max(gemm_values(gemms, passes))


def max_values(i: int) -> int:
    """The values a consumer thread may hold at gemm `i` of a ping-pong chain (tile_values)."""
    return PINGPONG_MAX_VALUES if i == 1 else CHAINED_MAX_VALUES


def values_over(widths: Sequence[int], passes: int = 1) -> list[int]:
    """The gemms (their indices) of a ping-pong chain with tiles `widths` columns wide where a
    consumer thread would hold more values than max_values allows: they would spill."""
    return [i for i, v in enumerate(tile_values(widths, passes), 1) if v > max_values(i)]


def register_refusal(gemms: Sequence[GemmPlan], i: int) -> str:
    """The located words for a chain whose gemm `i` holds too many values per consumer thread."""
    src, g = gemms[i - 1], gemms[i]
    return (f"a consumer thread would hold {gemm_values(gemms)[i - 1]} values at gemm "
            f"'{g.name}' (over {max_values(i)}: they spill): {src.name}'s accumulators "
            f"({src.tile[1] // 2}), their A fragments ({src.tile[1] // 4}) and {g.name}'s "
            f"accumulators ({g.tile[1] // 2}); narrow tile N of '{src.name}' or '{g.name}'")


def staging_refusal(gemms: Sequence[GemmPlan], passes: int = 1) -> str | None:
    values = chain_values(gemms, passes)
    limit = staging_max_values(gemms[-1].tile[1], passes, len(gemms) - 1)
    if values > limit:
        return (f"each consumer thread holds {values} accumulator values (over "
                f"{limit}): the staging's stores would spill")
    return None


# Narrow column passes: where a wide first tile (N0 of 160 to 256) leaves a consumer thread over
# STAGING_MAX_VALUES with the last tile whole or in passes of 128, the last gemm runs in passes
# of NARROW_PASS columns (one staging box each) where they fit NARROW_STAGING_MAX_VALUES; the
# output then still leaves through the copy engine and N0 = 224 and 256 stay on the ping-pong
# chain. Before, on an H200 at M = 81920 (bench/chain_sweep.py, 2026-11-29): N0 = 224 and 256
# with N1 of 128 and more fell to the mma.sync chains, 3.6-7.1x a copy of their bytes with 296-
# 1276 bytes of spills, and N0 of 160 to 256 beside N1 of 64 to 192 stored from registers,
# 1.43-1.65x. A pass of 64 columns holds 32 accumulators; g0's 64 x N0 are dead by its staging
# (their A fragments alone are live), so the staging fits up to PINGPONG_MAX_VALUES: NVRTC 13
# compiled every sweep chain of N0 160-256 so (224 values at N0 = 256) without a spill.
NARROW_PASS = STAGING_BOX
NARROW_STAGING_MAX_VALUES = PINGPONG_MAX_VALUES


def staging_max_values(n1: int, passes: int, i: int = 1) -> int:
    """The values a consumer thread may hold at the last gemm (gemm `i`) of a ping-pong chain
    whose tile `n1` wide runs in `passes` and stages its output: where a pass (or the whole
    tile) is NARROW_PASS columns, NARROW_STAGING_MAX_VALUES and at most max_values(i) (a later
    gemm of a longer chain spilled over CHAINED_MAX_VALUES), else STAGING_MAX_VALUES."""
    if n1 == passes * NARROW_PASS:
        return min(NARROW_STAGING_MAX_VALUES, max_values(i))
    return STAGING_MAX_VALUES


def narrow_passes(n0: int, n1: int) -> bool:
    """Whether the last tile, `n1` wide beside a first tile `n0` wide, runs in narrow passes:
    whole or in passes of 128 its staging is over STAGING_MAX_VALUES, in passes of NARROW_PASS
    it fits NARROW_STAGING_MAX_VALUES, and g1 can take passes (on wgmma: N0 a multiple of 32)."""
    return (n1 >= 2 * NARROW_PASS and n1 % NARROW_PASS == 0 and n0 % 32 == 0
            and consumer_values(n0, n1 // wide_passes(n0, n1)) > STAGING_MAX_VALUES
            and consumer_values(n0, NARROW_PASS) <= NARROW_STAGING_MAX_VALUES)


def column_passes(n0: int, n1: int) -> int:
    """How many passes over its tile's columns the last gemm of a ping-pong chain takes, for
    tiles N0 wide (the first gemm) and N1 wide (the last; ColumnPasses): 2 where
    the tile is 256 columns and a pass's values fit under STAGING_MAX_VALUES, else 1. N1 = 256
    beside N0 = 128 holds 224 values with the whole tile, 160 in halves, and only the halves'
    staging fits beside the ring: 20-30% faster on an H200; beside N0 = 64 (176 values, 112)
    halves ran 1-3% faster on the same ring (bench/RESULTS.md, "column passes"). Where those
    leave the staging over STAGING_MAX_VALUES (a first tile of 160 to 256 columns), passes of
    NARROW_PASS columns where they fit (narrow_passes)."""
    if narrow_passes(n0, n1):
        return n1 // NARROW_PASS
    return wide_passes(n0, n1)


def wide_passes(n0: int, n1: int) -> int:
    """column_passes but the narrow ones: of 128 columns, or the whole tile."""
    if n1 <= 128 or n1 % 128:
        return 1
    if n1 > 256:  # wgmma's N is at most 256: passes of 128 columns
        return n1 // 128
    return 2 if consumer_values(n0, n1 // 2) <= STAGING_MAX_VALUES else 1


def pass_n(n0: int, n1: int) -> int:
    """The columns of one pass of a chained tile N1 wide beside N0 where the tile is wider than
    wgmma's 256 (column_passes); else all of N1."""
    return n1 // column_passes(n0, n1) if n1 > 256 else n1


def staging_needs_passes(n0: int, n1: int) -> bool:
    """Whether a ping-pong chain's output staging fits a consumer thread's registers only in
    column passes (N1 = 256 beside N0 = 128): the whole tile's values are over
    STAGING_MAX_VALUES and the passes' are not, and g1 can take passes (on wgmma: its k tiles
    of 64 or 32, RS_B_ROW_BYTES, need N0 a multiple of 32)."""
    return (column_passes(n0, n1) > 1 and n0 % 32 == 0
            and consumer_values(n0, n1) > STAGING_MAX_VALUES)


def staging_fits(widths: Sequence[int], passes: int) -> bool:
    """Whether a ping-pong chain of tiles `widths` wide stages its output in `passes`: each
    consumer thread's values within staging_max_values."""
    return max(tile_values(widths, passes)) <= staging_max_values(widths[-1], passes,
                                                                  len(widths) - 1)


def staged_passes(n0: int, n1: int) -> int:
    """The column passes a ping-pong chain's last tile, `n1` wide beside a first tile `n0`
    wide, takes for its staging: always over 256 columns (wgmma's widest), and up to 256 where
    only the passes' staging fits a consumer thread's registers (staging_needs_passes)."""
    return column_passes(n0, n1) if n1 > 256 or staging_needs_passes(n0, n1) else 1



def passes_why(gemms: Sequence[GemmPlan], passes: int) -> str:
    """Why the last gemm of a ping-pong chain runs in `passes` over its tile's columns."""
    last = gemms[-1]
    n, values = last.tile[1] // passes, chain_values(gemms, passes)
    if n == NARROW_PASS:
        wide = wide_passes(gemms[-2].tile[1], last.tile[1])
        return (f"{passes} passes of {n} columns, one staging box each: a consumer thread holds "
                f"{values} accumulator values a pass against {chain_values(gemms, wide)} "
                f"{'with the whole tile' if wide == 1 else f'in passes of {last.tile[1] // wide}'}"
                f" (the staging's stores spill over {STAGING_MAX_VALUES}); a pass's "
                f"{n // 2} accumulators beside the A fragments stage within "
                f"{staging_max_values(last.tile[1], passes, len(gemms) - 1)}")
    if last.tile[1] > 256:
        return (f"{passes} passes of {n} columns: one tile covers all {last.tile[1]} columns (B "
                f"resident), wgmma multiplies at most 256 at once, and a consumer thread holds "
                f"{values} accumulator values a pass, the staging one pass's columns")
    return (f"{passes} passes of {n} columns: a consumer thread holds {values} accumulator values "
            f"with one pass against {chain_values(gemms)} with the whole tile (the staging's "
            f"stores spill over {STAGING_MAX_VALUES}), and the staging one pass's columns")

# Three consumer warpgroups (setmaxnreg 40 / 152) take a ping-pong chain's tiles in turn where
# a consumer thread's values (consumer_values, one column pass) fit 152 registers without a
# spill, the last gemm's pass is at least 128 columns wide (the longer epilogue that a third
# warpgroup hides) and the first gemm has at most 4 k tiles (the consumers' path, not the
# ring's bytes, bounds it). H200, two rounds, both dtypes (bench/logs/consumers/):
#   K0 = 256, N0 = 64, N1 = 128 and 256: 1.4-2.5% faster (N1 = 64: 0-1%);
#   K0 = 320, 576, 1024, 2048 at N0 = 64: -1.3% to +0.9%;
#   N0 = 96 with N1 = 64 (104 values, no spill): 8-9% slower;
#   N0 = 128 (128 values and more): 56-204 bytes of spills at 152 or 160 registers, and
#   4-26% slower. Three such consumers need more than the 64K registers of an SM.
THREE_CONSUMERS_MAX_VALUES = 112
THREE_CONSUMERS_MIN_PASS_N = 128
THREE_CONSUMERS_MAX_K_TILES = 4
WHY_THREE = ("each consumer thread's values fit 152 registers, the last gemm's epilogue is at "
             f"least {THREE_CONSUMERS_MIN_PASS_N} columns wide and the first gemm has at most "
             f"{THREE_CONSUMERS_MAX_K_TILES} k tiles, where a third warpgroup shortens the "
             "consumers' path (H200: 1.4-2.5% faster at K0 = 256, N0 = 64, N1 >= 128)")


def few_k_tiles(first: GemmPlan) -> bool:
    """Whether a ping-pong chain's first gemm has a fixed K of at most
    THREE_CONSUMERS_MAX_K_TILES k tiles: the consumers' path, not the ring's bytes, bounds it."""
    k = first.k_dim
    return isinstance(k, int) and -(-k // first.tile[2]) <= THREE_CONSUMERS_MAX_K_TILES


def consumer_count(gemms: Sequence[GemmPlan], passes: int) -> int:
    """A ping-pong chain's consumer warpgroups (see THREE_CONSUMERS_MAX_VALUES): 3 or 2."""
    first, last = gemms[0], gemms[-1]
    width = last.tile[1] // passes
    fits = chain_values(gemms, passes) <= THREE_CONSUMERS_MAX_VALUES
    return 3 if few_k_tiles(first) and fits and width >= THREE_CONSUMERS_MIN_PASS_N else CONSUMERS


# Overlap.passes: two where the last gemm runs in 2 or 3 column passes on two
# consumer warpgroups, the first gemm has at most THREE_CONSUMERS_MAX_K_TILES k tiles (the
# consumers' path, not the ring, bounds the chain) and a thread's A fragments and two passes'
# accumulators fit PASSES_IN_FLIGHT_MAX_VALUES (g0's accumulators are dead by then). H200, both
# dtypes, in turn (bench/logs/stop10/b/passes_in_flight.log), time with two over one: 0.90-0.91
# at 256/128/448 (column blocks), 0.97-0.98 at 256/128/320, 0.99 at 256/128/256, 1.00 at
# 256/128/384, 1.00-1.01 at 256/96/256; at K0 = 576 (9 k tiles) 1.03-1.04, at 1000/64/320
# 1.00-1.01. The pass loop is unrolled: with 4 passes (N1 = 448 and 512 beside N0 = 64, 144
# values) NVRTC 13 spilled 16 bytes and serialized the wgmma for want of registers; 3 passes at
# 160 values (N0 = 128) compiled clean.
PASSES_IN_FLIGHT_MAX_VALUES = 160
PASSES_IN_FLIGHT_MAX_PASSES = 3
WHY_PASSES_IN_FLIGHT = ("each pass's wgmma group is issued before the pass before it runs its "
                        "epilogue, into a second set of accumulators: the tensor cores multiply "
                        "one pass while the warpgroup stages the last")


def passes_in_flight(gemms: Sequence[GemmPlan], passes: int,
                     consumers: int) -> Overlap:
    """The last gemm's column passes in flight (Overlap.passes) and why (1: one pass at a
    time)."""
    first, source, last = gemms[0], gemms[-2], gemms[-1]
    values = source.tile[1] // 4 + last.tile[1] // passes
    if (not 2 <= passes <= PASSES_IN_FLIGHT_MAX_PASSES or consumers != CONSUMERS
            or values > PASSES_IN_FLIGHT_MAX_VALUES or not few_k_tiles(first)):
        return Overlap()
    return Overlap(passes=2, why=WHY_PASSES_IN_FLIGHT)

