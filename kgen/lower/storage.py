"""Storage pass: place every shared-memory buffer by lifetime and check the budget.

Buffers whose live phase ranges overlap never share bytes; the others may. Placement is
first-fit in order: each buffer goes to the lowest offset, aligned as it requires, that does
not collide with an already placed buffer live at the same time.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import KgenError, SourceLoc
from ..plan import Buffer, GemmPlan, StoragePlan, Swizzle
from ..targets import Target

TILE_ALIGN = 128  # swizzled tiles: a whole 128-byte bank line


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    bytes: int
    align: int
    live: tuple[int, int]
    role: str
    swizzle: Swizzle | None = None


def _overlaps(a: tuple[int, int], b: tuple[int, int]) -> bool:
    return a[0] <= b[1] and b[0] <= a[1]


def place(requests: list[Request]) -> tuple[Buffer, ...]:
    placed: list[Buffer] = []
    for r in requests:
        offset = 0
        while True:
            offset = -(-offset // r.align) * r.align
            clash = next(
                (
                    b
                    for b in placed
                    if _overlaps(b.live, r.live)
                    and offset < b.offset + b.bytes
                    and b.offset < offset + r.bytes
                ),
                None,
            )
            if clash is None:
                break
            offset = clash.offset + clash.bytes
        placed.append(Buffer(r.name, r.bytes, r.align, offset, r.live, r.role, r.swizzle))
    return tuple(placed)


def run(kernel: ir.Kernel, gemms: list[GemmPlan], tgt: Target, budget_loc: SourceLoc) -> StoragePlan:
    phases: list[str] = []
    requests: list[Request] = []
    for g in gemms:
        mainloop = len(phases)
        phases += [f"{g.name}.mainloop", f"{g.name}.epilogue"]
        for op in (g.a, g.b):
            t = op.smem
            requests.append(
                Request(
                    t.name,
                    t.bytes,
                    TILE_ALIGN,
                    (mainloop, mainloop),
                    f"{op.param} stages of {g.name}: {t.stages} x {t.outer}x{t.inner} "
                    f"{t.dtype.dsl_name}",
                    t.swizzle,
                )
            )
    buffers = place(requests)
    total = max((b.offset + b.bytes for b in buffers), default=0)
    total = -(-total // TILE_ALIGN) * TILE_ALIGN
    if total > tgt.smem_limit:
        largest = sorted(buffers, key=lambda b: -b.bytes)[:4]
        listing = ", ".join(f"{b.name} {b.bytes} B ({b.role})" for b in largest)
        raise KgenError(
            budget_loc,
            f"shared memory over budget: {total} bytes needed, {tgt.arch.value} allows "
            f"{tgt.smem_limit}; largest buffers: {listing}; use fewer stages or a smaller tile",
        )
    return StoragePlan(tuple(phases), buffers, total, tgt.smem_limit)
