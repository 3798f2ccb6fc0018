"""Which shared-memory row each lane hands to ldmatrix, and which chunk each thread copies.

The lowering proves its offset tables with these maps, and the bank check (tests, `kgen
inspect`) evaluates them over the 32 lanes; the emitters print the same maps in C++
(kgen.targets.common.operands.LDMATRIX_ROW_COL; tests/emit/test_targets.py checks they agree). A fragment row is a
(outer, inner) coordinate of the operand's SmemTile, the start of a 16-byte row of 8 elements.

ldmatrix.x4 fills four 8x8 matrices; lanes 8j..8j+7 address the rows of matrix j:
  A (16 x 16 of M x K) -> a0..a3 of mma.m16n8k16: (m0-7,k0-7) (m8-15,k0-7) (m0-7,k8-15) (m8-15,k8-15)
  B (16 x 16 of N x K) -> b0,b1 of two n8 tiles:  (n0-7,k0-7) (n0-7,k8-15) (n8-15,k0-7) (n8-15,k8-15)
K-major tiles (A row, B col) store K contiguous and need no transpose; M/N-major tiles (A col,
B row) store K as rows and use ldmatrix.trans, which hands each lane the transposed pair.
FP8 tiles (K-major only) take the same maps in bytes: `ldmatrix_map`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# (lane, warp_offset, frag16, kk) -> (outer, inner); warp_offset is the warp's first M (or N)
# row inside the CTA tile, frag16 the 16-wide fragment index, kk the k16 step.
CoordFn = Callable[[int, int, int, int], tuple[int, int]]


@dataclass(frozen=True, slots=True)
class FragmentMap:
    coord: CoordFn  # (lane, warp_off, f, kk) -> tile (row, column); the emitters print the
    # same map in C++ (kgen.targets.common.operands.LDMATRIX_ROW_COL, checked against this one)
    trans: bool


def _a_k_major(lane: int, off: int, f: int, kk: int) -> tuple[int, int]:
    return off + f * 16 + lane % 16, kk * 16 + (lane // 16) * 8


def _a_m_major(lane: int, off: int, f: int, kk: int) -> tuple[int, int]:
    j = lane // 8
    return kk * 16 + (j // 2) * 8 + lane % 8, off + f * 16 + (j % 2) * 8


def _b_k_major(lane: int, off: int, f: int, kk: int) -> tuple[int, int]:
    return off + f * 16 + lane % 8 + (lane // 16) * 8, kk * 16 + ((lane // 8) % 2) * 8


def _b_n_major(lane: int, off: int, f: int, kk: int) -> tuple[int, int]:
    return kk * 16 + ((lane // 8) % 2) * 8 + lane % 8, off + f * 16 + (lane // 16) * 8


# (operand, k_major) -> map
LDMATRIX: dict[tuple[str, bool], FragmentMap] = {
    ("a", True): FragmentMap(_a_k_major, False),
    ("a", False): FragmentMap(_a_m_major, True),
    ("b", True): FragmentMap(_b_k_major, False),
    ("b", False): FragmentMap(_b_n_major, True),
}


def k_step(elem_bytes: int) -> int:
    """Elements of k per MMA step: 32 bytes of each fragment row, 16 elements of 16 bits
    (m16n8k16) or 32 of 8 bits (m16n8k32, FP8)."""
    return 32 // elem_bytes


def ldmatrix_map(which: str, k_major: bool, elem_bytes: int) -> FragmentMap:
    """The operand's map for its element size. An 8-bit tile is K-major (verify refuses the
    others: .trans swaps 16-bit halves), and its m16n8k32 fragments are byte for byte the
    m16n8k16 ones of 16-bit elements: the same rows, each column twice the elements."""
    fmap = LDMATRIX[(which, k_major)]
    if elem_bytes == 2:
        return fmap
    assert elem_bytes == 1 and k_major, "8-bit operands are K-major"

    def coord(lane: int, off: int, f: int, kk: int) -> tuple[int, int]:
        row, col = fmap.coord(lane, off, f, kk)
        return row, col * 2

    return FragmentMap(coord, False)


def copy_coord(chunk: int, inner: int, elems_per_chunk: int) -> tuple[int, int]:
    """Tile (row, column) of the 16-byte chunk number `chunk` of a stage, row-major over chunks:
    consecutive threads copy consecutive 16 bytes of a row, for coalesced global reads."""
    per_row = inner // elems_per_chunk
    return chunk // per_row, (chunk % per_row) * elems_per_chunk


def split_offsets(
    base: Callable[[int], int], moved: Callable[[int, int], int], lanes, steps: list
) -> list[tuple[int, int]] | None:
    """Write each step's offset as (base ^ X) + Y with X, Y the same for every thread.

    `base(t)` is thread t's offset at step 0 and `moved(t, step)` its offset at `step`. Moving
    along a swizzled atom row flips low offset bits (an XOR); moving down whole swizzle periods
    of rows adds a constant. X is tried as the low bits of thread 0's difference for every split
    point, Y as the rest, and each candidate is checked on every thread, so a returned table is
    proved for this tile. None when some step has no such form."""
    table = []
    bases = [base(t) for t in lanes]  # each thread's offsets once (a planning hot spot)
    o0 = bases[0]
    for step in steps:
        offsets = [moved(t, step) for t in lanes]
        o = offsets[0]
        found = None
        for bit in range(0, 24):
            x = (o ^ o0) & ((1 << bit) - 1)
            y = o - (o0 ^ x)
            if all((b ^ x) + y == m for b, m in zip(bases, offsets)):
                found = (x, y)
                break
        if found is None:
            return None
        table.append(found)
    return table
