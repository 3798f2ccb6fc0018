"""Declared storage: a `storage { persistent { ... } union { ... } }` tree to byte offsets, checked
against lifetimes.

The tree is laid out as C lays out nested structs and unions: a struct's members follow each
other, each at the next offset its alignment allows; a union's members all start at the union's
offset; a struct or union is aligned to its strictest member and its size is rounded up to that
alignment. The whole declaration is one struct: the persistent members, then the root.

A buffer may be mentioned more than once (a union of phases that each name the buffers they
use, as the seed's SharedStorage does with `tmp_shared_storage`): every mention must land at
the same offset. The layout is accepted only if buffers that share bytes are never live in the
same phase; otherwise the error names both buffers and the first phase where both are live.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir
from ..errors import KgenError, SourceLoc
from ..diagnostics import at_line, did_you_mean, quote

MAX_BYTES = 2**31 - 1  # offsets are emitted as C++ int


@dataclass(frozen=True, slots=True)
class Sized:
    """What the layout needs to know of a buffer: its size, alignment and live phases."""

    name: str
    bytes: int
    align: int
    ranges: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class Declared:
    """The declared buffers' offsets and the size of the declared struct (C's sizeof)."""

    offsets: dict[str, int]
    size: int
    align: int


def _up(value: int, align: int) -> int:
    return -(-value // align) * align


class _Layout:
    def __init__(self, buffers: dict[str, Sized], stages: dict[tuple[ir.StageKind, str], list[str]],
                 gemms: list[str], phases: list[str]):
        self.buffers = buffers
        self.stages = stages
        self.gemms = gemms
        self.phases = phases
        self.mentions: dict[str, tuple[int, SourceLoc]] = {}  # name -> (offset, first mention)
        self.declared: dict[str, SourceLoc] = {}  # user buffers declared in the tree

    # -- sizes --------------------------------------------------------------------------------

    def stage_names(self, m: ir.StageBuffers) -> list[str]:
        key = (m.kind, m.gemm)
        if m.gemm not in self.gemms:
            raise KgenError(
                m.loc,
                f"{m.kind.value}({m.gemm}) names no gemm of this kernel"
                f"{did_you_mean(str(m.gemm), self.gemms)}",
            )
        return self.stages.get(key, [])

    def buffer(self, name: str, loc: SourceLoc) -> Sized:
        found = self.buffers.get(name)
        if found is None:
            raise KgenError(
                loc, f"unknown buffer {quote(name)}{did_you_mean(str(name), self.buffers)}; a "
                "member is a buffer declared here (name : dtype[shape]), a buffer the lowering "
                "makes (kgen inspect lists them), pipeline(gemm) or epilogue(gemm)",
            )
        return found

    def measure(self, m: ir.Member) -> tuple[int, int]:
        """(size, alignment) of a member."""
        if isinstance(m, (ir.SmemBuffer, ir.BufferRef)):
            b = self.buffer(m.name, m.loc)
            return b.bytes, b.align
        if isinstance(m, ir.StageBuffers):
            return self.measure_struct([self.buffers[n] for n in self.stage_names(m)])
        if isinstance(m, ir.Struct):
            return self.measure_struct(m.members)
        if isinstance(m, ir.Union):
            sizes = [self.measure(x) for x in m.members]
            align = max((a for _, a in sizes), default=1)
            return _up(max((s for s, _ in sizes), default=0), align), align
        raise KgenError(getattr(m, "loc", SourceLoc("<python>", 0, 0, 0, 0)),
                        f"not a storage member: {type(m).__name__}")

    def measure_struct(self, members) -> tuple[int, int]:
        cursor, align = 0, 1
        for x in members:
            size, a = (x.bytes, x.align) if isinstance(x, Sized) else self.measure(x)
            cursor = _up(cursor, a) + size
            align = max(align, a)
        return _up(cursor, align), align

    # -- offsets ------------------------------------------------------------------------------

    def mention(self, name: str, offset: int, loc: SourceLoc) -> None:
        if name not in self.mentions:
            self.mentions[name] = (offset, loc)
            return
        first, first_loc = self.mentions[name]
        if first != offset:
            raise KgenError(
                loc,
                f"buffer '{name}' lands at byte {offset} here but at byte {first} where it is "
                f"first mentioned{at_line(first_loc)}; every mention of a buffer must land at "
                "the same offset",
            )

    def place(self, m: ir.Member, base: int) -> None:
        if isinstance(m, ir.SmemBuffer):
            if m.name in self.declared:
                raise KgenError(
                    m.loc,
                    f"buffer '{m.name}' is declared twice (first{at_line(self.declared[m.name])}); "
                    f"to mention it again, write its name alone: {m.name}",
                )
            self.declared[m.name] = m.loc
            self.mention(m.name, base, m.loc)
        elif isinstance(m, ir.BufferRef):
            self.buffer(m.name, m.loc)
            self.mention(m.name, base, m.loc)
        elif isinstance(m, ir.StageBuffers):
            cursor = 0
            for name in self.stage_names(m):
                b = self.buffers[name]
                cursor = _up(cursor, b.align)
                self.mention(name, base + cursor, m.loc)
                cursor += b.bytes
        elif isinstance(m, ir.Struct):
            self.place_struct(m.members, base)
        elif isinstance(m, ir.Union):
            for x in m.members:
                self.place(x, base)
        else:
            self.measure(m)  # raises

    def place_struct(self, members, base: int) -> None:
        cursor = 0
        for x in members:
            size, align = self.measure(x)
            cursor = _up(cursor, align)
            self.place(x, base + cursor)
            cursor += size

    # -- lifetimes ----------------------------------------------------------------------------

    def check_lifetimes(self) -> None:
        names = list(self.mentions)
        for i, x in enumerate(names):
            bx, (ox, lx) = self.buffers[x], self.mentions[x]
            for y in names[i + 1:]:
                by, (oy, ly) = self.buffers[y], self.mentions[y]
                if not (bx.bytes and by.bytes and ox < oy + by.bytes and oy < ox + bx.bytes):
                    continue
                phase = _first_common_phase(bx.ranges, by.ranges)
                if phase is None:
                    continue
                later, other, other_loc = (y, x, lx) if (ly.line, ly.col) >= (lx.line, lx.col) \
                    else (x, y, ly)
                lo, hi = max(ox, oy), min(ox + bx.bytes, oy + by.bytes)
                raise KgenError(
                    self.mentions[later][1],
                    f"'{later}' and '{other}'{at_line(other_loc)} share bytes {lo}..{hi} but are "
                    f"both live in phase '{self.phases[phase]}' ('{later}' is live "
                    f"{self.live_text(self.buffers[later])}, '{other}' "
                    f"{self.live_text(self.buffers[other])}); put them in a struct, not a union, "
                    "or shorten a lifetime",
                )

    def live_text(self, b: Sized) -> str:
        return ", ".join(self.phases[a] if a == z else f"{self.phases[a]}..{self.phases[z]}"
                         for a, z in b.ranges)


def _first_common_phase(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]):
    common = [max(a0, b0) for a0, a1 in a for b0, b1 in b if a0 <= b1 and b0 <= a1]
    return min(common, default=None)


def run(decl: ir.StorageDecl, buffers: dict[str, Sized],
        stages: dict[tuple[ir.StageKind, str], list[str]], gemms: list[str],
        phases: list[str]) -> Declared:
    """Lay out a storage declaration and check it; `buffers` holds every buffer of the kernel
    (the lowering's and the user's), `stages` the names of each gemm stage's buffers."""
    layout = _Layout(buffers, stages, gemms, phases)
    members = list(decl.persistent) + ([decl.root] if decl.root is not None else [])
    size, align = layout.measure_struct(members)
    if size > MAX_BYTES:
        raise KgenError(decl.loc, f"the storage declaration needs {size} bytes, more than any "
                                  "GPU has")
    layout.place_struct(members, 0)
    layout.check_lifetimes()
    offsets = {name: offset for name, (offset, _) in layout.mentions.items()}
    return Declared(offsets, size, align)
