"""Storage pass: every shared-memory buffer of a kernel, its lifetime and byte offset; the budget.

    phases    the kernel's phases in order: each gemm's `<gemm>.mainloop` and `<gemm>.epilogue`,
              and the user's own phases around them (`phases { ... }`)
    requests  what needs bytes: each gemm's operand stages and epilogue buffers (tagged with
              their stage, for `pipeline(g)` / `epilogue(g)`) and the user's buffers
    layout    a storage declaration, when there is one, places the buffers it mentions
              (kgen/lower/unions.py lays it out and checks it against the lifetimes); the packer
              places every other buffer around them
    budget    the total against the target's limit, with the largest buffers named if it fails

Buffers live in the same phase never share bytes; the others may. The packer is first fit
(each buffer at the lowest offset its alignment allows that no co-live buffer occupies), tried
in several orders, keeping the smallest. One of those orders is the offset order of the
declared layout, when there is one: first fit in the offset order of any valid layout puts
every buffer at or below its offset there (induction: a buffer's earlier co-live neighbours in
that order end at or below their old ends, so its old offset is still free), so packing never
needs more bytes than the declaration.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, field

from .. import ir
from ..errors import NOWHERE, KgenError, SourceLoc
from ..plan import Buffer, GemmPlan, StoragePlan, Swizzle
from ..targets import Placement, Target
from ..diagnostics import at_line, check_identifier, did_you_mean, quote
from . import unions

TILE_ALIGN = 128  # swizzled tiles: a whole 128-byte bank line
SCRATCH_ALIGN = 16
BARRIER_BYTES = 8  # an mbarrier: 8 bytes, 8-byte aligned
USER_ALIGN = 16  # user buffers: room for 16-byte vector accesses and cp.async
MAX_ALIGN = 1024  # the arena itself is __align__(1024)
SEARCH_ORDERS = 200  # extra random first-fit orders tried when no order reaches the peak...
SEARCH_WORK = 400_000  # ...fewer for many buffers: orders x buffers^2 stays under this
# Names the emitted SharedStorage itself uses for members.
_STORAGE_MEMBERS = frozenset({"bytes", "total_bytes"})


@dataclass(frozen=True, slots=True)
class Request:
    name: str
    bytes: int
    align: int
    live: tuple[int, int]
    role: str
    swizzle: Swizzle | None = None
    ranges: tuple[tuple[int, int], ...] = ()  # () means (live,)
    stage: tuple[ir.StageKind, str] | None = None  # the gemm stage that made it
    dtype: ir.DType | None = None
    loc: SourceLoc = field(default=NOWHERE, compare=False)  # a user buffer's declaration

    @property
    def live_ranges(self) -> tuple[tuple[int, int], ...]:
        return self.ranges or (self.live,)


def _co_live(a: tuple[tuple[int, int], ...], b: tuple[tuple[int, int], ...]) -> bool:
    return any(a0 <= b1 and b0 <= a1 for a0, a1 in a for b0, b1 in b)


def _up(value: int, align: int) -> int:
    return -(-value // align) * align


def _buffer(r: Request, offset: int, declared: bool = False) -> Buffer:
    return Buffer(r.name, r.bytes, r.align, offset, r.live, r.role, r.swizzle, r.dtype,
                  r.ranges, declared)


# ---------------------------------------------------------------------------------------------
# The packer


def place(requests: list[Request], fixed: tuple[Buffer, ...] = ()) -> tuple[Buffer, ...]:
    """First fit in the given order, around the `fixed` buffers: each request at the lowest
    offset, aligned as it requires, that no buffer live at the same time occupies."""
    placed: list[Buffer] = [b for b in fixed if b.bytes]
    out: list[Buffer] = []
    for r in requests:
        ranges = r.live_ranges
        offset = 0
        if r.bytes:
            busy = sorted((b.offset, b.end) for b in placed if _co_live(b.live_ranges, ranges))
            for start, end in busy:
                if end <= offset:
                    continue
                if start >= offset + r.bytes:
                    break
                offset = _up(end, r.align)
        b = _buffer(r, offset)
        out.append(b)
        if r.bytes:
            placed.append(b)
    return tuple(out)


def peak_bytes(requests: list[Request] | tuple[Buffer, ...], phases: int) -> int:
    """The most bytes live in one phase: a lower bound on any layout's size."""
    load = [0] * max(phases, 1)
    for r in requests:
        for phase in {p for a, z in r.live_ranges for p in range(a, z + 1)}:
            if 0 <= phase < len(load):
                load[phase] += r.bytes
    return max(load)


def _end(buffers) -> int:
    return max((b.end for b in buffers), default=0)


def pack(requests: list[Request], fixed: tuple[Buffer, ...] = (), *,
         hints: tuple[tuple[str, ...], ...] = (), phases: int = 0) -> tuple[Buffer, ...]:
    """The smallest first-fit layout of `requests` around `fixed` over several orders: as given,
    by size, by first phase, by alignment, by lifetime, each order in `hints` (names), then the
    best layout's own offset order until it stops shrinking, then random orders while the result
    is above the peak. Deterministic; returns buffers in the order of `requests`."""
    if not requests:
        return ()
    index = {r.name: i for i, r in enumerate(requests)}
    first = {r.name: min(a for a, _ in r.live_ranges) for r in requests}
    span = {r.name: sum(z - a + 1 for a, z in r.live_ranges) for r in requests}
    orders = [
        list(requests),
        sorted(requests, key=lambda r: (-r.bytes, index[r.name])),
        sorted(requests, key=lambda r: (first[r.name], -r.bytes, index[r.name])),
        sorted(requests, key=lambda r: (-r.align, -r.bytes, index[r.name])),
        sorted(requests, key=lambda r: (-span[r.name], -r.bytes, index[r.name])),
        sorted(requests, key=lambda r: (-r.bytes * span[r.name], index[r.name])),
    ]
    for hint in hints:
        rank = {name: i for i, name in enumerate(hint)}
        orders.append(sorted(requests, key=lambda r: (rank.get(r.name, len(rank)), index[r.name])))
    floor = max(_end(fixed), peak_bytes(list(requests) + list(fixed), phases) if phases else 0)

    best: tuple[Buffer, ...] | None = None

    def consider(order: list[Request]) -> bool:
        nonlocal best
        layout = place(order, fixed)
        if best is None or _end(layout) < _end(best):
            best = layout
            return True
        return False

    for order in orders:
        consider(order)

    def compact() -> None:
        # First fit in the best layout's offset order never does worse; repeat while it helps.
        while True:
            offsets = {b.name: b.offset for b in best}
            order = sorted(requests, key=lambda r: (offsets[r.name], -r.bytes, index[r.name]))
            if not consider(order):
                return

    compact()
    rng = random.Random(len(requests))
    tries = 0
    limit = max(10, min(SEARCH_ORDERS, SEARCH_WORK // len(requests) ** 2))
    while _end(best) > floor and tries < limit:
        tries += 1
        order = list(requests)
        rng.shuffle(order)
        if consider(order):
            compact()
    by_name = {b.name: b for b in best}
    return tuple(by_name[r.name] for r in requests)


# ---------------------------------------------------------------------------------------------
# Phases


def _gemm_phases(gemms: list[GemmPlan]) -> list[str]:
    return [name for g in gemms for name in (f"{g.name}.mainloop", f"{g.name}.epilogue")]


def phase_order(kernel: ir.Kernel, gemms: list[GemmPlan]) -> list[str]:
    """The kernel's phases in order: the user's order when given (it must list every gemm phase,
    in the order the gemms run), else the gemms' own phases."""
    lowered = _gemm_phases(gemms)
    if not kernel.phases:
        return lowered or ["kernel"]
    seen: dict[str, SourceLoc] = {}
    for p in kernel.phases:
        if p.name in seen:
            raise KgenError(p.loc,
                            f"phase '{p.name}' is listed twice (first{at_line(seen[p.name])})")
        if "." in str(p.name):
            if p.name not in lowered:
                known = ", ".join(lowered) or "none: this kernel has no gemm"
                raise KgenError(
                    p.loc, f"{quote(p.name)} is not a phase of a gemm of this kernel "
                           f"(those are {known}){did_you_mean(str(p.name), lowered)}")
        else:  # phase names reach the emitted comments: the same rules as every other name
            check_identifier(p.name, p.loc, "phase")
        seen[p.name] = p.loc
    where = kernel.phases[0].loc
    missing = [name for name in lowered if name not in seen]
    if missing:
        raise KgenError(
            where, f"phases must list every gemm phase to say where it falls; add "
                   f"{', '.join(missing)}")
    listed = [p.name for p in kernel.phases if p.name in lowered]
    if listed != lowered:
        raise KgenError(where, f"gemm phases must come in the order the kernel runs them: "
                               f"{', '.join(lowered)}")
    return [p.name for p in kernel.phases]


def _live(ranges: tuple[ir.LiveRange, ...], phases: list[str], what: str,
          loc: SourceLoc) -> tuple[tuple[int, int], tuple[tuple[int, int], ...]]:
    """(first, last) and the phase ranges of a user buffer; every phase when none are given."""
    if not ranges:
        whole = (0, len(phases) - 1)
        return whole, ()
    index = {name: i for i, name in enumerate(phases)}
    out = []
    for r in ranges:
        ends = []
        for name in (r.first, r.last):
            if name not in index:
                raise KgenError(
                    r.loc, f"{what}: unknown phase {quote(name)}{did_you_mean(str(name), phases)} "
                           f"(the kernel's phases: {', '.join(phases)})")
            ends.append(index[name])
        if ends[0] > ends[1]:
            raise KgenError(r.loc, f"{what}: phase '{r.last}' comes before '{r.first}'")
        out.append(tuple(ends))
    out.sort()
    merged: list[list[int]] = []
    for a, z in out:
        if merged and a <= merged[-1][1] + 1:
            merged[-1][1] = max(merged[-1][1], z)
        else:
            merged.append([a, z])
    ranges_out = tuple((a, z) for a, z in merged)
    span = (ranges_out[0][0], ranges_out[-1][1])
    return span, (ranges_out if len(ranges_out) > 1 else ())


# ---------------------------------------------------------------------------------------------
# Requests


def _stage_requests(g: GemmPlan, index: dict[str, int], prefetched: bool = False,
                    resident: bool = False, ring_b: bool = False) -> list[Request]:
    """`prefetched`: a persistent kernel loads the next tile's first stages of this (first) gemm
    while the later gemms run, so its operand stages live to the last phase. `resident`: B is
    loaded once, before the tile loop, and lives through every phase; with `ring_b`, this
    (first) gemm's B instead streams through the ring beside A, which runs on across the
    tiles (every phase)."""
    mainloop = index[f"{g.name}.mainloop"]
    epilogue = index[f"{g.name}.epilogue"]
    pipeline = (ir.StageKind.PIPELINE, g.name)
    out = []
    for op in (g.a, g.b):
        if op is None:  # a chained A kept in registers
            continue
        t = op.smem
        live = (mainloop, len(index) - 1 if prefetched else mainloop)
        role = f"{op.param} stages of {g.name}: {t.stages} x {t.outer}x{t.inner} {t.dtype.dsl_name}"
        if prefetched:
            role += ", the next tile's first stages loaded during the later gemms"
        if resident and ring_b and op is g.b:
            live = (0, len(index) - 1)
            role = (f"{op.param} stages of {g.name}: a ring of {t.stages} x {t.outer}x{t.inner} "
                    f"{t.dtype.dsl_name}, beside {g.a.param}'s, that runs on across the CTA's "
                    "tiles")
        elif resident and op is g.b:
            live = (0, len(index) - 1)
            role = (f"{op.param} of {g.name}, resident: {t.stages} k tiles x {t.outer}x{t.inner} "
                    f"{t.dtype.dsl_name}, loaded once per CTA")
        elif resident:
            role = (f"{op.param} stages of {g.name}: a ring of {t.stages} x {t.outer}x{t.inner} "
                    f"{t.dtype.dsl_name} that runs on across the CTA's tiles")
        if g.chain is not None and op is g.a:
            # written once by the source's epilogue, read by this gemm's mainloop
            live = (index[f"{g.chain.source}.epilogue"], mainloop)
            role = (f"{g.chain.source}'s output, A of {g.name}: {t.outer}x{t.inner} "
                    f"{t.dtype.dsl_name}, K-major")
        out.append(Request(t.name, t.bytes, TILE_ALIGN, live, role, t.swizzle, stage=pipeline,
                           dtype=t.dtype))
    # Reduction scratch is used after the mainloop: it may reuse the operand stages' bytes.
    for r in g.epilogue.reductions:
        if not r.scratch_floats:  # each row's partials meet in one warp (sm_90a)
            continue
        out.append(
            Request(
                r.scratch,
                r.scratch_floats * 4,
                SCRATCH_ALIGN,
                (epilogue, epilogue),
                f"{r.op.value} {r.axis.value} reduction of {r.target} ({g.name} epilogue): "
                f"{r.scratch_floats} f32",
                stage=(ir.StageKind.EPILOGUE, g.name),
                dtype=ir.DType.F32,
            )
        )
    return out


def _members(decl: ir.StorageDecl):
    """Every member of a declaration, depth first."""
    stack = list(reversed(list(decl.persistent) + ([decl.root] if decl.root else [])
                          + list(decl.packed)))
    while stack:
        m = stack.pop()
        yield m
        if isinstance(m, (ir.Struct, ir.Union)):
            stack.extend(reversed(m.members))


def _user_request(b: ir.SmemBuffer, phases: list[str]) -> Request:
    check_identifier(b.name, b.loc, "buffer")
    if not isinstance(b.dtype, ir.DType):
        raise KgenError(b.loc, f"buffer '{b.name}': unknown dtype {quote(b.dtype)}")
    if not isinstance(b.shape, tuple) or not b.shape:
        raise KgenError(b.loc, f"buffer '{b.name}' needs a shape, e.g. {b.name} : f16[64, 64]")
    count = 1
    for d in b.shape:
        if isinstance(d, bool) or not isinstance(d, int) or d <= 0:
            raise KgenError(b.loc, f"buffer '{b.name}': dimensions must be positive integers, "
                                   f"got {quote(d)}")
        count *= d
    nbytes = count * b.dtype.nbytes
    if nbytes > unions.MAX_BYTES:
        raise KgenError(b.loc, f"buffer '{b.name}' needs {nbytes} bytes, more than any GPU has")
    align = USER_ALIGN if b.align is None else b.align
    if isinstance(align, bool) or not isinstance(align, int) or align < b.dtype.nbytes \
            or align > MAX_ALIGN or align & (align - 1):
        raise KgenError(b.loc, f"buffer '{b.name}': align must be a power of two from "
                               f"{b.dtype.nbytes} (its element size) to {MAX_ALIGN}, got "
                               f"{quote(align)}")
    live, ranges = _live(b.live, phases, f"buffer '{b.name}'", b.loc)
    shape = ", ".join(map(str, b.shape))
    return Request(b.name, nbytes, align, live, f"user buffer {b.dtype.dsl_name}[{shape}]",
                   ranges=ranges, dtype=b.dtype, loc=b.loc)


def _user_requests(kernel: ir.Kernel, phases: list[str], made: list[Request]) -> list[Request]:
    if kernel.storage is None:
        return []
    lowered = {r.name for r in made}
    out: dict[str, Request] = {}
    for m in _members(kernel.storage):
        if not isinstance(m, ir.SmemBuffer):
            continue
        if m.name in lowered:
            raise KgenError(m.loc, f"buffer name '{m.name}' is taken by a buffer kgen makes; "
                                   f"to place that one, write its name alone: {m.name}")
        if m.name in out:
            raise KgenError(
                m.loc, f"buffer '{m.name}' is declared twice (first{at_line(out[m.name].loc)}); "
                       f"to mention it again, write its name alone: {m.name}")
        out[m.name] = _user_request(m, phases)
    # The emitted SharedStorage declares <name>_offset, <name>_bytes and <name>() per buffer.
    taken: dict[str, str] = {name: "SharedStorage" for name in _STORAGE_MEMBERS}
    for r in made + list(out.values()):
        for ident in (r.name, f"{r.name}_offset", f"{r.name}_bytes"):
            if ident in taken:
                owner = out.get(r.name) or out.get(taken[ident])
                loc = owner.loc if owner is not None else kernel.storage.loc
                raise KgenError(loc, f"buffer name '{r.name}' clashes in the emitted "
                                     f"SharedStorage with '{ident}' of {taken[ident]}; rename it")
            taken[ident] = r.name
    return list(out.values())


# ---------------------------------------------------------------------------------------------
# The pass


def budget_loc(kernel: ir.Kernel) -> SourceLoc:
    """Where the budget's message points: the first gemm's stages line (the declaration of a
    kernel without a gemm)."""
    return kernel.gemms[0].stages.loc if kernel.gemms else kernel.storage.loc


def selected(kernel: ir.Kernel, tgt: Target, placement: Placement) -> StoragePlan:
    """The storage pass: the selected schedule's buffers placed (targets.Placement: its gemm
    plans and run's options); over the budget, its located message (the largest buffers, what
    to change)."""
    return run(kernel, list(placement.gemms), tgt, budget_loc(kernel), **placement.options)


def budget_refusal(kernel: ir.Kernel, tgt: Target, placement: Placement) -> str | None:
    """The budget's message for a placement over the target's shared memory (the largest
    buffers, what to change), or None where it fits: the rulebook's shared-memory rule
    (kgen/targets/rules.py), the one accounting, the same the storage pass raises."""
    return _placed(kernel, list(placement.gemms), tgt, **placement.options)[1]


def run(kernel: ir.Kernel, gemms: list[GemmPlan], tgt: Target,
        budget_loc: SourceLoc, *, check_budget: bool = True, **options) -> StoragePlan:
    """The buffers of `gemms` placed (_placed's `options`); over the target's limit, the
    budget's located message (the largest buffers, what to change), unless `check_budget` is
    False: then the plan over the limit (a schedule candidate that is then refused for it)."""
    plan, over = _placed(kernel, gemms, tgt, **options)
    if over is not None and check_budget:
        raise KgenError(budget_loc, over)
    return plan


def _placed(kernel: ir.Kernel, gemms: list[GemmPlan], tgt: Target, *,
            persistent: bool = False, resident: bool = False, ring_barriers: int = 0,
            staging: tuple[int, int] = (0, 0),
            vectors: tuple[tuple[str, int, ir.DType, str], ...] = (),
            ring_b: bool = False, turn_barriers: int = 0) -> tuple[StoragePlan, str | None]:
    """`persistent`: the first gemm's stages are prefetched for the next tile (see
    _stage_requests). `ring_barriers`: mbarriers that guard the first gemm's ring (schedule
    pingpong), live through every phase. `staging`: (bytes, alignment) of the last gemm's
    output staging for the copy engine's stores (schedule pingpong), also live through every
    phase: the copy engine reads it after the epilogue that wrote it has moved on.
    `vectors`: (name, bytes, element type, role) of the epilogue vectors staged per tile (the
    last gemm's), live through every phase like the staging.
    `ring_b`: with `resident`, the first gemm's B streams through the ring beside A instead.
    `turn_barriers`: mbarriers after the ring's, by which the consumers take turns at it.
    Returns the plan, and the budget's message where it is over the target's limit."""
    phases = phase_order(kernel, gemms)
    index = {name: i for i, name in enumerate(phases)}
    requests: list[Request] = [r for i, g in enumerate(gemms)
                               for r in _stage_requests(g, index, persistent and i == 0,
                                                        resident, ring_b and i == 0)]
    if ring_barriers:
        first = gemms[0]
        extra = ", then one per consumer warpgroup for their turns" if turn_barriers else ""
        ring_barriers += turn_barriers
        requests.append(Request(
            f"{first.name}_ring_barriers", ring_barriers * BARRIER_BYTES, BARRIER_BYTES,
            (0, len(phases) - 1),
            f"mbarriers of {first.a.param}'s ring in {first.name}: a full and an empty one per "
            f"slot{extra}, {ring_barriers} x {BARRIER_BYTES} bytes",
            stage=(ir.StageKind.PIPELINE, first.name)))
    if staging[0]:
        last = gemms[-1]
        out = last.epilogue.staged_store.param
        requests.append(Request(
            f"{last.name}_d_staging", staging[0], staging[1], (0, len(phases) - 1),
            f"{out} staged for the copy engine's stores: a {last.tile[0]}x{last.tile[1]} tile per "
            "consumer warpgroup, as "
            + ("64x64" if last.epilogue.staged_store.dtype.nbytes == 2 else "64x128")
            + " boxes with a 128-byte swizzle",
            stage=(ir.StageKind.EPILOGUE, last.name)))
    for name, nbytes, dtype, role in vectors:
        requests.append(Request(name, nbytes, 16, (0, len(phases) - 1), role,
                                stage=(ir.StageKind.EPILOGUE, gemms[-1].name), dtype=dtype))
    requests += _user_requests(kernel, phases, requests)

    declared_bytes = None
    fixed: tuple[Buffer, ...] = ()
    decl = kernel.storage
    places = decl is not None and (bool(decl.persistent) or decl.root is not None)
    if places:
        sized = {r.name: unions.Sized(r.name, r.bytes, r.align, r.live_ranges) for r in requests}
        stages: dict[tuple[ir.StageKind, str], list[str]] = {}
        for r in requests:
            if r.stage is not None:
                stages.setdefault(r.stage, []).append(r.name)
        declared = unions.run(kernel.storage, sized, stages, [g.name for g in gemms], phases)
        declared_bytes = declared.size
        fixed = tuple(_buffer(r, declared.offsets[r.name], declared=True)
                      for r in requests if r.name in declared.offsets)
    rest = [r for r in requests if r.name not in {b.name for b in fixed}]
    by_name = {b.name: b for b in fixed + pack(rest, fixed, phases=len(phases))}
    buffers = tuple(by_name[r.name] for r in requests)

    packed_bytes = None
    if places:
        # What the packer alone makes of the same buffers; one of its orders is this layout's.
        order = tuple(b.name for b in sorted(buffers, key=lambda b: (b.offset, -b.bytes)))
        packed = pack(requests, hints=(order,), phases=len(phases))
        packed_bytes = _total(packed)
        assert packed_bytes <= max(_total(buffers), declared_bytes or 0), "first fit regressed"

    total = _total(buffers)
    if declared_bytes is not None:
        total = max(total, _up(declared_bytes, _arena_align(buffers)))
    over = None
    if total > tgt.smem_limit:
        largest = sorted(buffers, key=lambda b: (-b.bytes, b.name))[:4]
        listing = ", ".join(f"{b.name} {b.bytes} B ({b.role})" for b in largest)
        advice = "use fewer stages or a smaller tile" if gemms else "make buffers smaller"
        if any(r.stage is None for r in requests):
            advice += ", or let buffers that are not live together share bytes"
        if packed_bytes is not None and packed_bytes < total:
            advice += f" (the packer alone, without the storage layout, needs {packed_bytes})"
        over = (f"shared memory over budget: {total} bytes needed, {tgt.arch.value} allows "
                f"{tgt.smem_limit}; largest buffers: {listing}; {advice}")
    return StoragePlan(tuple(phases), buffers, total, tgt.smem_limit,
                       peak_bytes=peak_bytes(requests, len(phases)),
                       declared_bytes=declared_bytes, packed_bytes=packed_bytes), over


def _arena_align(buffers) -> int:
    return max((b.align for b in buffers), default=USER_ALIGN)


def _total(buffers) -> int:
    """The arena's size: the end of the last buffer, rounded up as C rounds a struct's size."""
    return _up(_end(buffers), _arena_align(buffers))


def planned(phases: list[str], requests: list[Request], tgt: Target) -> StoragePlan:
    """A skeleton's own buffers placed by the packer over its own phases (a tile program's:
    kgen/lower/loop_dag_storage.py), no declaration. Its rules size it within the target's
    limit (a layout is never larger than its buffers end to end)."""
    buffers = pack(requests, phases=len(phases))
    total = _total(buffers)
    assert total <= tgt.smem_limit, (total, tgt.smem_limit)
    return StoragePlan(tuple(phases), buffers, total, tgt.smem_limit,
                       peak_bytes=peak_bytes(requests, len(phases)))
