"""`kgen inspect` for tile programs (a loop kernel or a row kernel): the plan as plain data
(`program_summary`, the --json schema) and as tables (`print_program`). kgen/report.py hands
program plans here."""
from __future__ import annotations

import math
from typing import Any

from .plan import program as pp


_COMPUTED = ("Apply", "Cast", "RowReduction")


def _arg(section: pp.Section, index: int) -> str:
    """A computed value by its name, anything else (acc, row, a carry, a load) as itself."""
    if type(section.values[index].kind).__name__ in _COMPUTED:
        return f"v{index}"
    return _detail(section, index)


def _value(section: pp.Section, index: int) -> str:
    return f"v{index} = {_detail(section, index)} ({section.values[index].rank.value})"


def _detail(section: pp.Section, index: int) -> str:
    kind = section.values[index].kind
    name = type(kind).__name__
    return {
        "Apply": lambda: (f"{kind.op.name.lower()}("
                          f"{', '.join(_arg(section, a) for a in kind.args)})"),
        "Cast": lambda: f"cast<{kind.dtype.dsl_name}>({_arg(section, kind.arg)})",
        "Constant": lambda: f"{kind.value:g}",
        "ScalarArg": lambda: kind.param,
        "VectorLoad": lambda: f"{kind.param}[{kind.axis.value}]",
        "TensorLoad": lambda: kind.param,
        "PositionValue": lambda: kind.axis.value,
        "ExtentValue": lambda: f"size {kind.dim}",
        "RandomValue": lambda: (f"random{'_t' if kind.transposed else ''}({kind.seed}, "
                                f"{kind.offset})"),
        "CarryValue": lambda: f"carry {kind.carry}",
        "AccumulatorValue": lambda: f"accumulator {kind.gemm}",
        "RowReduction": lambda: f"row{kind.op.value}({_arg(section, kind.arg)})",
        "Accumulator": lambda: "acc",
    }[name]()


def _statements(section: pp.Section) -> list[str]:
    lines = []
    for s in section.statements:
        if isinstance(s, pp.Compute):
            lines += [f"compute {_value(section, i)}" for i in s.values]
        elif isinstance(s, pp.GemmStep):
            g = s.gemm
            a = "registers (the value handed on)" if g.accumulate else f"{g.a} (ldmatrix)"
            lines.append(f"gemm {g.name} {'+=' if g.accumulate else '='} A from {a}, B from "
                         f"{g.b} ({g.b_load.value}): {g.k_steps} k16 steps x {g.n8_tiles} n8 "
                         "tiles per warp")
        elif isinstance(s, pp.UpdateCarry):
            lines.append(f"update carry {s.carry} = {_arg(section, s.value)}")
        elif isinstance(s, pp.Rescale):
            lines.append(f"rescale {s.gemm} *= {_arg(section, s.value)} (per row"
                         + ("; 1 where the reference stays)" if s.ones else ")"))
        elif isinstance(s, pp.HandOn):
            lines.append(f"hand on {_arg(section, s.value)} as {s.dtype.dsl_name} (A fragments "
                         "of the next gemm, in registers)")
        elif isinstance(s, pp.StoreTile):
            lines.append(f"store {s.param} = {_arg(section, s.value)} ({s.dtype.dsl_name}, rows "
                         "in bounds)")
        else:
            lines.append(f"store {s.param} = {_arg(section, s.value)} (one per row)")
    return lines


# A loop kernel's phases: the prologue loads the loop-invariant tile and the first ring slots,
# the loop streams the others, the epilogue works in registers (no shared tile live)
PHASES = ("prologue", "loop", "epilogue")
STORAGE_ALIGN = 128  # the storage's alignment; its members' sizes are multiples of it


def _tile(t: pp.SmemTile, role: str) -> dict[str, Any]:
    """A shared tile as a buffer of the storage map (the gemm plans' keys where they mean
    the same: name, offset, bytes, align, live phases, swizzle)."""
    return {"name": t.name, "param": t.param, "role": role, "rows": t.rows, "cols": t.cols,
            "slots": t.slots, "dtype": t.dtype.dsl_name, "offset": t.offset, "bytes": t.bytes,
            "align": STORAGE_ALIGN, "live": [0, 1], "live_phases": list(PHASES[:2]),
            "swizzle": f"chunk ^ ((row >> {t.swizzle_shift}) & {t.swizzle_mask})",
            "rows_along_loop": t.rows_along_loop}


def _gemm(plan: pp.LoopPlan, g: pp.LoopGemm) -> dict[str, Any]:
    return {"name": g.name, "a": g.a, "b": g.b, "k": g.k, "n": g.n,
            "tile": [plan.tile_m, g.n, g.k], "warps": [plan.warps, 1], "stages": plan.stages,
            "instruction": plan.mma.value, "k16_steps": g.k_steps,
            "n8_tiles_per_warp": g.n8_tiles, "b_fragments": g.b_load.value,
            "accumulate": g.accumulate}


def _bounds(bounds: pp.LoopBounds) -> dict[str, Any]:
    """The blocks each tile of rows visits: the mask's bounds on col, and why."""
    def side(b: pp.ColumnBound) -> str:
        terms = [(float(b.slope), "row")] if b.slope else []
        terms += [(t.coef, "" if t.term is pp.Term.ONE else t.param) for t in b.offset]
        text = ""
        for coef, name in terms:
            size = abs(coef)
            word = name if size == 1 and name else (f"{size:g} * {name}" if name else f"{size:g}")
            text += (" - " if coef < 0 else " + ") + word if text else ("-" if coef < 0 else "") + word
        return text or "0"

    def op(b: pp.ColumnBound) -> str:
        return ("<" if b.strict else "<=") if b.upper else (">" if b.strict else ">=")

    return {"skips": bounds.skips, "why": bounds.why,
            "bounds": [f"col {op(b)} {side(b)}" for b in bounds.bounds]
            + [f"{q.row_vector}[row] == {q.col_vector}[col] (scanned per tile)"
               for q in bounds.equalities]
            + ([f"listed: {', '.join(bounds.listed.names)} (block mask, read per tile)"]
               if bounds.listed is not None else [])}


def _wgmma(plan: pp.LoopPlan) -> dict[str, Any]:
    """The sm_90a skeleton's schedule (plan.wgmma) and the storage it lays out: the copy
    engine's 128-byte swizzled boxes, then the mbarriers."""
    w = plan.wgmma
    roles = {t.name: r for t, r in ((w.q_tile, f"A of {plan.gemm0.name}, loaded once (TMA)"),
                                     (w.k_tile, f"B of {plan.gemm0.name}, ring (TMA)"),
                                     (w.v_tile, f"B of {plan.gemm1.name}, ring (TMA)"))}
    if w.staged_tile is not None:
        roles[w.staged_tile.name] = "read at (row, col) by the body, ring (TMA)"
    buffers = [{"name": t.name, "param": t.param, "role": roles[t.name], "rows": t.rows,
                "cols": 64 * t.boxes, "slots": t.slots, "dtype": plan.dtype.dsl_name,
                "offset": t.offset, "bytes": t.bytes, "align": 1024, "live": [0, 1],
                "live_phases": list(PHASES[:2]), "swizzle": "128-byte (boxes of 64 columns)",
                "rows_along_loop": t is not w.q_tile}
               for t in w.tiles]
    buffers.append({"name": "barriers", "param": "", "role": "mbarriers: Q, K/V full/empty",
                    "rows": 1 + 4 * plan.stages, "cols": 1, "slots": 1, "dtype": "b64",
                    "offset": w.barrier_offset, "bytes": 8 * (1 + 4 * plan.stages),
                    "align": 8, "live": [0, 1], "live_phases": list(PHASES[:2]),
                    "swizzle": "", "rows_along_loop": False})
    choice = lambda c: {"value": c.value, "why": c.why}  # noqa: E731
    gemms = [dict(_gemm(plan, plan.gemm0), a=w.q_tile.name, b=w.k_tile.name,
                  b_fragments="wgmma descriptor (K-major)"),
             dict(_gemm(plan, plan.gemm1), b=w.v_tile.name,
                  b_fragments="wgmma descriptor (MN-major, transposed)")]
    steps = {f"gemm {g.name} ": (
        f"gemm {g.name} {'+=' if g.accumulate else '='} " + (
            f"A from registers (the value handed on), B from {w.v_tile.name}: wgmma RS, "
            f"{g.k_steps} k16 steps" if g.accumulate else
            f"A from {w.q_tile.name}, B from {w.k_tile.name}: wgmma SS, {g.k_steps} k16 "
            "steps")) for g in (plan.gemm0, plan.gemm1)}
    body = [next((text for head, text in steps.items() if line.startswith(head)), line)
            for line in _statements(plan.body)]
    return {"skeleton": {"value": "sm_90a warp-specialized wgmma",
                         "roles": choice(w.roles), "pipeline": choice(w.pipeline),
                         "overlap": choice(w.overlap), "staging": choice(w.staging),
                         "rescale": choice(w.rescale), "consumers": w.consumers,
                         "registers": {"producer": w.producer_registers,
                                       "consumer": w.consumer_registers}},
            "buffers": buffers, "gemms": gemms, "body": body}


def program_summary(plan: pp.ProgramPlan, resources: dict | None = None) -> dict[str, Any]:
    from .targets import target

    if plan.kind == "loop_dag":  # a loop over a DAG of gemms: kgen/report_loop_dag.py
        from .report_loop_dag import summary

        return summary(plan, resources)

    summary: dict[str, Any] = {
        "name": plan.name, "arch": plan.arch.value, "kind": plan.kind,
        "threads": plan.threads, "smem_bytes": plan.smem_bytes,
        "smem_limit": target(plan.arch).smem_limit,
        "params": [{"name": f.name, "ctype": f.ctype} for f in plan.fields],
        "body": _statements(plan.body),
        "resources": resources,
    }
    if isinstance(plan, pp.LoopPlan):
        summary.update({
            "config": {"value": plan.config.value, "why": plan.config.why},
            "mma": {"value": plan.mma.value, "why": plan.mma.why},
            "grid": f"(ceil({plan.rows_dim} / {plan.tile_m}), heads, batch)",
            "loop": {"dim": plan.loop_dim, "block": plan.block, "stages": plan.stages},
            "loop_bounds": _bounds(plan.bounds),
            "tanh": {"value": plan.tanh.value, "why": plan.tanh.why},
            "division": {"value": plan.division.value, "why": plan.division.why},
            "carries": [{"name": n, "init": ("-inf" if init == -math.inf else
                                             "inf" if init == math.inf else init)}
                        for n, init in plan.carries],
            "gemms": [_gemm(plan, g) for g in (plan.gemm0, plan.gemm1)],
            "phases": list(PHASES),
            "buffers": [_tile(plan.a_tile, f"A of {plan.gemm0.name}, loaded once"),
                        _tile(plan.b_tile, f"B of {plan.gemm0.name}, streamed"),
                        _tile(plan.c_tile, f"B of {plan.gemm1.name}, streamed")],
            "epilogue": _statements(plan.epilogue),
        })
        if plan.wgmma is not None:  # sm_90a's wgmma skeleton: its roles and its own storage
            summary.update(_wgmma(plan))
    else:
        summary.update({
            "grid": f"(ceil({plan.rows_dim} / {plan.rows_per_cta}), heads, batch)",
            "rows": {"per_cta": plan.rows_per_cta, "cols": plan.cols,
                     "chunks_per_lane": plan.lane_chunks},
            "gemms": [], "phases": [], "buffers": [],  # registers only: no gemm, no storage
        })
    return summary


def print_program(console, s: dict) -> None:
    from rich.markup import escape
    from rich.table import Table

    if s["kind"] == "loop_dag":
        from .report_loop_dag import print_summary

        return print_summary(console, s)

    console.print(f"[bold]{s['name']}[/bold]  {s['arch']}  a {s['kind']} kernel  "
                  f"{s['threads']} threads  grid {s['grid']}  shared memory "
                  f"{s['smem_bytes']:,} of {s['smem_limit']:,} B")
    if s["kind"] == "loop":
        console.print(f"configuration: {s['config']['value']} ({s['config']['why']})")
        console.print(f"mma: {s['mma']['value']} ({s['mma']['why']})")
        bounds = s["loop_bounds"]  # (escaped: an equality's `qd[row]` is no rich markup)
        console.print(escape(f"loop bounds: {'; '.join(bounds['bounds']) or 'every block'} "
                             f"({bounds['why']})"))
        if s["tanh"]["value"] != "none":
            console.print(f"tanh in the body: {s['tanh']['value']} ({s['tanh']['why']})")
        if s["division"]["value"] != "none":
            console.print(f"division in the body: {s['division']['value']} "
                          f"({s['division']['why']})")
        if s.get("skeleton"):
            k = s["skeleton"]
            console.print(f"skeleton: {k['value']}")
            for what in ("roles", "pipeline", "overlap", "staging", "rescale"):
                console.print(f"{what}: {k[what]['value']} ({k[what]['why']})")
        console.print(f"loop over {s['loop']['dim']}: blocks of {s['loop']['block']}, "
                      f"{s['loop']['stages']} ring slot(s); carries "
                      + (", ".join(f"{c['name']} = {c['init']}" for c in s["carries"]) or "none"))
        gemms = Table(title="gemms", title_justify="left")
        for column in ("gemm", "A", "B", "k", "n", "k16 steps", "n8 tiles/warp", "B fragments"):
            gemms.add_column(column)
        for g in s["gemms"]:
            gemms.add_row(g["name"] + (" +=" if g["accumulate"] else ""), g["a"], g["b"],
                          str(g["k"]), str(g["n"]), str(g["k16_steps"]),
                          str(g["n8_tiles_per_warp"]), g["b_fragments"])
        console.print(gemms)
    else:
        r = s["rows"]
        console.print(f"one warp per row, {r['per_cta']} rows per CTA, {r['cols']} columns, "
                      f"{r['chunks_per_lane']} 8-element chunk(s) per lane")
    tiles = Table(title="storage", title_justify="left")
    for column in ("buffer", "param", "slots x rows x cols", "offset", "bytes", "align",
                   "live", "swizzle", "role"):
        tiles.add_column(column)
    for t in s["buffers"]:
        tiles.add_row(t["name"], t["param"], f"{t['slots']} x {t['rows']} x {t['cols']}",
                      f"{t['offset']:,}", f"{t['bytes']:,}", str(t["align"]),
                      "..".join(t["live_phases"]), t["swizzle"], t["role"])
    tiles.add_section()
    tiles.add_row("total", "", "", "", f"{s['smem_bytes']:,}", "", "", "",
                  f"limit {s['smem_limit']:,}")
    console.print(tiles)
    console.print("body" + (" (per block)" if s["kind"] == "loop" else "") + ":")
    for line in s["body"]:
        console.print(f"  {line}")
    if s["kind"] == "loop":
        console.print("after the loop:")
        for line in s["epilogue"]:
            console.print(f"  {line}")
    if s.get("resources"):
        console.print(f"resources: {s['resources']}")
