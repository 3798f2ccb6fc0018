"""`kgen inspect` for a loop over a DAG of gemms (kgen/plan/loop_dag.py, the attention
backward): the plan as plain data (`summary`, the --json schema beside report_program's) and as
tables (`print_summary`). kgen/report_program.py hands these plans here."""
from __future__ import annotations

from typing import Any

from .plan import epilogue as dag
from .plan import loop_dag as ld
from .plan import program as pp
from .report_program import PHASES, _arg, _bounds, _statements, _tile


def _shown(section: pp.Section) -> pp.Section:
    """The section with each gemm's result shown as `acc of <gemm>` (report_program's
    printer names the kinds it knows; a named stand-in prints as its name)."""
    values = tuple(pp.Value(v.id, dag.ScalarArg(f"acc of {v.kind.gemm}"), v.rank)
                   if isinstance(v.kind, ld.GemmResult) else v for v in section.values)
    return pp.Section(values, section.statements)


# How each gemm reads its operands on the wgmma skeleton (plan.wgmma): by kind, A and B
WGMMA_OPERANDS = {
    ld.GemmKind.SCORE: ("shared memory, K-major (the warpgroup's 64 rows)",
                        "its ring slot, K-major"),
    ld.GemmKind.ACCUMULATING: ("registers", "its ring slot, MN-major"),
    ld.GemmKind.LOOP_ROW: ("the staged value's slot, MN-major (transposed)",
                           "shared memory, MN-major (the warpgroup's columns)")}


def _lines(section: pp.Section, wgmma: bool = False) -> list[str]:
    """The section's statements: the DAG's own kinds here, the others as a forward's.
    `wgmma`: the plan runs the sm_90a wgmma skeleton (the gemms' operands read so)."""
    section = _shown(section)
    lines = []
    for s in section.statements:
        if isinstance(s, ld.DagStep) and wgmma:
            g = s.gemm
            a, b = WGMMA_OPERANDS[g.kind]
            a = f"{g.a} ({a})" if g.a else f"{a} (v{g.a_value} handed on)"
            op = "+=" if g.kind is ld.GemmKind.ACCUMULATING else "="
            lines.append(f"gemm {g.name} ({g.kind.value}) {op} wgmma, A from {a}, B from {g.b} "
                         f"({b}): {g.k_steps} k16 steps, n {g.n_warp} per warpgroup")
            if g.epilogue is not None:
                lines += [f"  {line}" for line in _lines(g.epilogue, wgmma)]
        elif isinstance(s, ld.DagStep):
            g = s.gemm
            a = {ld.ALoad.SMEM: f"{g.a} (ldmatrix)",
                 ld.ALoad.REGISTERS: f"registers (v{g.a_value} handed on)",
                 ld.ALoad.SMEM_TRANSPOSED: f"{g.a} (ldmatrix.trans: the staged value, "
                                            "transposed)"}[g.a_load]
            op = "+=" if g.kind is ld.GemmKind.ACCUMULATING else "="
            lines.append(f"gemm {g.name} ({g.kind.value}) {op} "
                         f"A from {a}, B from {g.b} ({g.b_load.value}): {g.k_steps} k16 steps "
                         f"x {g.n8_tiles} n8 tiles per warp")
            if g.epilogue is not None:
                lines += [f"  {line}" for line in _lines(g.epilogue)]
        elif isinstance(s, ld.HandTile):
            lines.append(f"hand on {_arg(section, s.value)} as {s.dtype.dsl_name} (A fragments, "
                         "in registers)")
        elif isinstance(s, ld.StageTile):
            read = {t.gemm.kind for t in section.statements
                    if isinstance(t, ld.DagStep) and t.gemm.a == s.tile}
            lines.append(f"stage {_arg(section, s.value)} as {s.dtype.dsl_name} in {s.tile} "
                         "(read " + " and ".join(
                             ["as A by an accumulating gemm"] * (ld.GemmKind.ACCUMULATING in read)
                             + ["transposed by a loop-row gemm"] * (ld.GemmKind.LOOP_ROW in read))
                         + "), then a barrier")
        elif isinstance(s, ld.AddTile):
            lines.append(f"add {_arg(section, s.value)} into {s.param} at the loop's rows "
                         "(atomic f32 adds)")
        else:
            lines += _statements(pp.Section(section.values, (s,)))
    return lines


def summary(plan: ld.LoopDagPlan, resources: dict | None = None) -> dict[str, Any]:
    from .targets import target

    choice = lambda c: {"value": c.value, "why": c.why}  # noqa: E731
    roles = {**{t.name: f"loop-invariant {t.param}, loaded once" for t in plan.resident},
             **{t.name: f"{t.param}, streamed ({t.slots} slots)" for t in plan.streamed},
             **{t.name: f"tile value {t.param}, staged for a loop-row gemm" for t in plan.staged}}
    for t in plan.staged if plan.grid is not None else ():  # the warp grid's
        roles[t.name] = (f"tile value {t.param}, staged for an accumulating gemm (the warp "
                         "grid)" + (" and a loop-row gemm" if any(
                             g.a == t.name and g.kind is ld.GemmKind.LOOP_ROW
                             for g in plan.gemms) else ""))
    bias = plan.wgmma.bias if plan.wgmma is not None else None
    for t in plan.wgmma.handed if plan.wgmma is not None else ():  # the split layout's
        roles[t.name] = "a tile value handed on, staged for an accumulating gemm (split)"
    if bias is not None:  # the tensor read at (row, col), staged per block
        roles[bias.name] = f"{bias.param}, read at (row, col), streamed ({bias.slots} slot(s))"
    return {
        "name": plan.name, "arch": plan.arch.value, "kind": plan.kind,
        "threads": plan.threads, "smem_bytes": plan.smem_bytes,
        "smem_limit": target(plan.arch).smem_limit,
        "params": [{"name": f.name, "ctype": f.ctype} for f in plan.fields],
        "body": _lines(plan.body, plan.wgmma is not None), "resources": resources,
        "skeleton": "wgmma" if plan.wgmma is not None else "mma.sync",
        "wgmma": _wgmma(plan.wgmma) if plan.wgmma is not None else None,
        "config": choice(plan.config), "mma": choice(plan.mma),
        "registers": choice(plan.registers), "min_ctas": choice(plan.min_ctas),
        "layout": choice(plan.layout),
        "tanh": choice(plan.tanh), "division": choice(plan.division),
        "grid": f"(ceil({plan.rows_dim} / {plan.tile_m}), "
                f"{'KV heads' if plan.gqa else 'heads'}, batch)",
        "gqa": (("a CTA owns a KV head; its loop walks the blocks of every query head of the "
                 "group in turn " + ("(each head's listed blocks: the sum of the group's counts)"
                                     if plan.bounds.listed is not None else
                                     "(group x blocks)")
                 + ", the accumulators summing over the group") if plan.gqa else None),
        "deterministic": choice(plan.deterministic) if plan.deterministic else None,
        "loop": {"dim": plan.loop_dim, "block": plan.block, "stages": plan.stages},
        "loop_bounds": _bounds(plan.bounds),
        "gemms": [{"name": g.name, "kind": g.kind.value, "a": g.a or f"v{g.a_value}",
                   "a_load": (WGMMA_OPERANDS[g.kind][0] if plan.wgmma is not None
                              else g.a_load.value), "b": g.b,
                   "b_fragments": (WGMMA_OPERANDS[g.kind][1] if plan.wgmma is not None
                                   else g.b_load.value),
                   "k": g.k, "n": g.n, "n_per_warp": g.n_warp, "k16_steps": g.k_steps,
                   "tile": [plan.tile_m if g.kind is not ld.GemmKind.LOOP_ROW else plan.block,
                            g.n, g.k], "stages": plan.stages, "instruction": plan.mma.value,
                   "n8_tiles_per_warp": g.n8_tiles} for g in plan.gemms],
        "zeroed": list(plan.zeroed),
        "phases": list(plan.storage.phases if plan.storage is not None else PHASES),
        "buffers": ([_wgmma_tile(t, roles[t.name]) for t in plan.wgmma.tiles]
                    if plan.wgmma is not None else _planned(plan, roles)),
        "smem_peak": plan.storage.peak_bytes if plan.storage is not None else None,
        "unions": _unions(plan.storage) if plan.storage is not None else [],
        "fenced": list(plan.fenced),
        "epilogue": _tails(plan),
    }


def _tails(plan: ld.LoopDagPlan) -> list[str]:
    """The kernel's epilogue: its lines, under a heading per N where the accumulators' N
    differ (plan.tails)."""
    if len(plan.tails) == 1:
        return _lines(plan.tails[0].section)
    return [line for t in plan.tails for line in (
        f"on {' and '.join(t.accumulators)}'s [{plan.rows_dim}, {t.n}]:",
        *(f"  {text}" for text in _lines(t.section)))]


def _planned(plan: ld.LoopDagPlan, roles: dict[str, str]) -> list[dict[str, Any]]:
    """The mma.sync skeleton's buffers as kgen's storage planner placed them: the tiles (the
    keys of _tile) and the vectors staged per block, with their lifetimes over the phases."""
    storage = plan.storage
    tiles = {t.name: t for t in plan.tiles}
    out = []
    for b in storage.buffers:
        t = tiles.get(b.name)
        row = (_tile(t, roles[t.name]) if t is not None else
               {"name": b.name, "param": b.name.removeprefix("vec_"), "role": b.role, "rows": 1,
                "cols": plan.block, "slots": plan.stages, "dtype": "f32", "swizzle": "",
                "rows_along_loop": True})
        row.update(offset=b.offset, bytes=b.bytes, align=b.align, live=list(b.live),
                   live_phases=[storage.phases[b.live[0]], storage.phases[b.live[1]]],
                   live_ranges=[list(r) for r in b.live_ranges], lifetime=b.role)
        out.append(row)
    return out


def _unions(storage) -> list[dict[str, Any]]:
    """The buffers that share bytes (never live in the same phase): the unions the planner
    found."""
    return [{"buffers": [x.name, y.name], "bytes": [max(x.offset, y.offset), min(x.end, y.end)],
             "live": [storage.live_text(x), storage.live_text(y)]}
            for i, x in enumerate(storage.buffers) for y in storage.buffers[i + 1:]
            if x.shares_bytes(y)]


def _first(w: ld.DagWgmma) -> str:
    """Which tile of a pair's rows a section launches first."""
    return ("the last tile of rows first (deterministic adds' decreasing order)"
            if w.descending else "the first tile of rows first (the longest under a mask)")


def _wgmma(w: ld.DagWgmma) -> dict[str, Any]:
    choice = lambda c: {"value": c.value, "why": c.why}  # noqa: E731
    return {"roles": choice(w.roles), "mma": choice(w.mma), "pipeline": choice(w.pipeline),
            "overlap": choice(w.overlap), "adds": choice(w.adds), "staging": choice(w.staging),
            "tile_store": choice(w.tile_store), "tail_store": choice(w.tail_store),
            "consumers": w.consumers,
            "order": {"value": (f"{_first(w)}, in sections of {w.lpt_l2_bytes} bytes of L2"
                                if w.lpt_l2_bytes else "the grid's order"),
                      "why": w.lpt_why},
            "fast_body": {"value": ("a fast body inside the mask, the checked one on its edge"
                                    if w.fast_body else "one checked body"),
                          "why": w.fast_body_why},
            "split": choice(w.split) if w.split is not None else None,
            "registers": {"producer": w.producer_registers, "consumer": w.consumer_registers},
            "barrier_offset": w.barrier_offset,
            "tensor_maps": [{"param": m.param, "box": [m.box_rows, 128 // m.dtype.nbytes],
                             "boxes": m.boxes} for m in w.tensor_maps]}


def _wgmma_tile(t: pp.WgmmaTile, role: str) -> dict[str, Any]:
    """A tile of the wgmma skeleton as a buffer of the storage map (the keys of _tile)."""
    return {"name": t.name, "param": t.param, "role": role, "rows": t.rows, "cols": 64 * t.boxes,
            "slots": t.slots, "dtype": "16-bit", "offset": t.offset, "bytes": t.bytes,
            "align": 1024, "live": [0, 1], "live_phases": list(PHASES[:2]),
            "swizzle": f"128-byte, {t.boxes} box(es) of [{t.rows}][64]",
            "rows_along_loop": False}


def print_summary(console, s: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    console.print(f"[bold]{s['name']}[/bold]  {s['arch']}  a loop over a DAG of gemms  "
                  f"{s['threads']} threads  grid {s['grid']}  shared memory "
                  f"{s['smem_bytes']:,} of {s['smem_limit']:,} B")
    for what in ("config", "mma", "registers", "min_ctas") + (
            ("layout",) if s["skeleton"] == "mma.sync" else ()):
        console.print(f"{what}: {s[what]['value']} ({s[what]['why']})")
    if s.get("wgmma"):
        for what in ("split", "roles", "pipeline", "overlap", "adds", "staging", "tile_store",
                     "tail_store", "order", "fast_body"):
            if what in ("staging", "tile_store") and s["wgmma"][what]["value"] == "none" or (
                    s["wgmma"].get(what) is None):
                continue
            console.print(f"{what}: {s['wgmma'][what]['value']} ({s['wgmma'][what]['why']})")
    for what in ("tanh", "division"):
        if s[what]["value"] != "none":
            console.print(f"{what}: {s[what]['value']} ({s[what]['why']})")
    if s.get("gqa"):
        console.print(f"GQA: {s['gqa']}")
    if s.get("deterministic"):
        console.print(f"deterministic: {s['deterministic']['value']} "
                      f"({s['deterministic']['why']})")
    bounds = s["loop_bounds"]  # (escaped: an equality's `kd[row]` is no rich markup)
    console.print(escape(f"loop bounds: {'; '.join(bounds['bounds']) or 'every block'} "
                         f"({bounds['why']})"))
    console.print(f"loop over {s['loop']['dim']}: blocks of {s['loop']['block']}, "
                  f"{s['loop']['stages']} ring slot(s); zeroed before the kernel: "
                  + (", ".join(s["zeroed"]) or "none"))
    gemms = Table(title="gemms", title_justify="left")
    for column in ("gemm", "kind", "A", "B", "k", "n", "n per warp", "B fragments"):
        gemms.add_column(column)
    for g in s["gemms"]:
        gemms.add_row(g["name"], g["kind"], f"{g['a']} ({g['a_load']})", g["b"], str(g["k"]),
                      str(g["n"]), str(g["n_per_warp"]), g["b_fragments"])
    console.print(gemms)
    tiles = Table(title="storage", title_justify="left")
    for column in ("buffer", "param", "slots x rows x cols", "offset", "bytes", "swizzle",
                   "role"):
        tiles.add_column(column)
    for t in s["buffers"]:
        tiles.add_row(t["name"], t["param"], f"{t['slots']} x {t['rows']} x {t['cols']}",
                      f"{t['offset']:,}", f"{t['bytes']:,}", t["swizzle"], t["role"])
    tiles.add_section()
    tiles.add_row("total", "", "", "", f"{s['smem_bytes']:,}", "", f"limit {s['smem_limit']:,}")
    console.print(tiles)
    if s.get("smem_peak") is not None:  # placed by the storage planner: its phases and unions
        from .report import storage_chart

        console.print("storage over phases (\u2588\u2588 live, \u00b7 not): kgen's storage "
                      f"planner, {s['smem_bytes']:,} B (at least {s['smem_peak']:,} B live in "
                      "one phase)", style="bold")
        for line in storage_chart(s):
            console.print(line, markup=False, highlight=False)
        for u in s["unions"]:
            x, y = u["buffers"]
            console.print(f"union: {x} ({u['live'][0]}) and {y} ({u['live'][1]}) share bytes "
                          f"{u['bytes'][0]:,}..{u['bytes'][1]:,}"
                          + ("; a barrier before the staged tile's writes"
                             if x in s["fenced"] or y in s["fenced"] else ""))
        if not s["unions"]:
            console.print("unions: none (every buffer is live in the loop's every phase, or "
                          "alone in its bytes)")
    console.print("body (per block):")
    for line in s["body"]:
        console.print(f"  {line}")
    console.print("after the loop:")
    for line in s["epilogue"]:
        console.print(f"  {line}")
    if s.get("resources"):
        console.print(f"resources: {s['resources']}")
