"""Shared-memory tile layouts: atom width and XOR swizzle, and the bank model that proves them.

A tile stage is `outer` rows of `inner` contiguous elements (see plan.SmemTile). Rows are cut
into atoms at most 128 bytes wide; each atom is swizzled so that any 8 consecutive rows read at
the same 16-byte column land in 8 different 16-byte bank groups. That is what a phase of
ldmatrix (8 lanes, one 16-byte row each) and a phase of 16-byte cp.async stores touch.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from ..plan import SmemTile, Swizzle
from .. import ir

CHUNK_BYTES = 16  # one cp.async / one ldmatrix row
ATOM_MAX_BYTES = 128  # 32 banks x 4 bytes
BANKS = 32
BANK_BYTES = 4


def atom_inner(inner: int, dtype: ir.DType) -> int | None:
    """Elements per atom row: the whole row if it is 32, 64 or 128 bytes, else 128-byte atoms.

    None when the row cannot be cut into atoms of a swizzlable width."""
    row_bytes = inner * dtype.nbytes
    if row_bytes in (32, 64, 128):
        return inner
    if row_bytes % ATOM_MAX_BYTES == 0:
        return ATOM_MAX_BYTES // dtype.nbytes
    return None


def choose_swizzle(atom_row_bytes: int, dtype: ir.DType) -> Swizzle:
    """Swizzle<B, M, 3>: M = log2(elements per 16 bytes); B = log2(16-byte chunks per atom row).

    Row r of an atom XORs its chunk index with bits of r: 128-byte rows with r % 8, 64-byte rows
    with (r / 2) % 4, 32-byte rows with (r / 4) % 2. The shift is always log2(128 / 16) = 3,
    because the XOR source starts at the element offset of the 128-byte boundary."""
    base = (CHUNK_BYTES // dtype.nbytes).bit_length() - 1
    bits = (atom_row_bytes // CHUNK_BYTES).bit_length() - 1
    return Swizzle(bits=bits, base=base, shift=3)


def make_tile(name: str, dtype: ir.DType, outer: int, inner: int, stages: int) -> SmemTile | None:
    width = atom_inner(inner, dtype)
    if width is None:
        return None
    return SmemTile(
        name=name,
        dtype=dtype,
        outer=outer,
        inner=inner,
        atom_inner=width,
        swizzle=choose_swizzle(width * dtype.nbytes, dtype),
        stages=stages,
    )


def is_bijection(tile: SmemTile) -> bool:
    """Every (row, column) of one stage maps to a distinct element offset inside the stage."""
    seen = {tile.offset(r, c) for r in range(tile.outer) for c in range(tile.inner)}
    return len(seen) == tile.stage_elems and min(seen) == 0 and max(seen) == tile.stage_elems - 1


def max_bank_conflict(byte_addresses: Iterable[int], access_bytes: int) -> int:
    """Worst bank conflict of one warp-wide shared-memory access (1 = conflict-free).

    The 32 lanes are served in phases of 128 bytes: lanes [8i, 8i+8) for 16-byte accesses.
    Within a phase, the conflict degree of a bank is the number of distinct 4-byte words the
    phase touches in it."""
    addrs = list(byte_addresses)
    lanes_per_phase = ATOM_MAX_BYTES // access_bytes
    worst = 0
    for start in range(0, len(addrs), lanes_per_phase):
        words_by_bank: dict[int, set[int]] = defaultdict(set)
        for addr in addrs[start : start + lanes_per_phase]:
            for word in range(addr // BANK_BYTES, (addr + access_bytes) // BANK_BYTES):
                words_by_bank[word % BANKS].add(word)
        worst = max(worst, max(len(w) for w in words_by_bank.values()))
    return worst
