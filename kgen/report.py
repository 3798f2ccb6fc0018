"""Plans and runs as plain data and as text: the schema of `kgen inspect --json`, the storage
chart, the tables `kgen inspect` prints, and the tables of a `kgen run` report. Pure functions
of a plan (and NVRTC's resource report when given); rich is imported only to print."""
from __future__ import annotations

from typing import Any

from .enums import Layout, ParamKind
from .plan import Mma, StoreEffect, StorePath


def instruction(plan, g) -> str:
    """The MMA instruction a gemm's mainloop issues, and where its A comes from."""
    schedule = plan.schedule.gemm(g.name)
    n = g.tile[1] // schedule.passes.count  # one column pass's (`<gemm> column passes`)
    if schedule.atom.instruction is Mma.WGMMA_SS:
        k = 32 if g.a.dtype.fp8 else 16  # 32 bytes of k either way
        return f"wgmma m64n{n}k{k}, A from shared memory"
    if schedule.atom.instruction is Mma.WGMMA_RS:
        return f"wgmma m64n{n}k16, A from registers"
    if schedule.atom.instruction is Mma.MMA_SYNC_FP8:  # sm_89's (kgen/targets/sm80/fp8.py)
        return f"mma.sync m16n8k32, {g.a.dtype.dsl_name} x {g.b.dtype.dsl_name}"
    return "mma.sync m16n8k16"


def store_path(plan, g) -> str:
    """How a gemm's epilogue writes its output (a chained gemm's feeds the next gemm)."""
    if g is not plan.gemms[-1]:
        return f"feeds {plan.gemms[plan.gemms.index(g) + 1].name}"
    return plan.schedule.gemm(g.name).output.path.value


def output_paths(plan) -> list[dict[str, str]]:
    """How each output of the last gemm leaves the kernel, in each entry point."""
    if not plan.gemms:
        return []
    g = plan.gemms[-1]
    store = plan.schedule.gemm(g.name).output.path
    packed = g.epilogue.staged_store
    out = []
    for e in g.epilogue.effects:
        if not isinstance(e, StoreEffect):
            continue
        width = 2 * e.dtype.nbytes
        if e.layout is Layout.COL and store is StorePath.TMA and packed is not None:
            how = ("column-major: staged in shared memory transposed (stmatrix .trans, 128-byte "
                   "swizzle), stored by the copy engine in 64x64 boxes")
        elif e.layout is Layout.COL:
            how = ("column-major: each element of a thread's column pair stored on its own "
                   f"({e.dtype.nbytes}-byte stores, one column apart, M-contiguous)")
        elif store is StorePath.TMA and packed is not None and packed.param == e.param:
            how = ("staged in shared memory (128-byte swizzle), stored by the copy engine in "
                   + ("64x64 boxes" if e.dtype.nbytes == 2 else
                      "64x128 boxes (128-byte rows of 8-bit values), written as byte pairs"))
        elif store is StorePath.WIDE and packed is not None and packed.param == e.param:
            how = "16-byte chunks: a quad's four column pairs, gathered by shuffles"
        else:
            how = f"row-major column pairs, one {width}-byte store each"
        if plan.split_kernel is not None:
            how = (f"from {plan.split_kernel}, once it has summed the split-K parts: element "
                   + ("stores, one block per output tile (a thread per column pair of its rows)"
                      if g.epilogue.reductions else "stores, one thread per column pair"))
        narrow = ("element stores, the second of a pair only inside N" if plan.narrow_kernel
                  else "none (no narrow entry point)")
        out.append({"param": e.param, "layout": e.layout.value, "fast": how,
                    "narrow": narrow})
    from .targets.sm90.consumer_epilogue import walk_reduced

    walk = walk_reduced(plan, g)
    for r in g.epilogue.reductions:
        mode = ("per-CTA partials to a workspace, combined in a fixed order by a second kernel"
                if plan.deterministic else "per-CTA partials merged with atomics")
        fast = mode
        if walk:
            fast = ("each consumer thread's partial over the CTA's tiles, folded as the staging "
                    "is written; one atomic per consumer warp at the walk's end")
        if plan.split_kernel is not None:
            mode = (f"in {plan.split_kernel}, after the split-K parts are summed: one block per "
                    "output tile reduces it in a fixed order, then "
                    + (f"its partials to a workspace slot, combined in a fixed order by "
                       f"{plan.finalize_kernel} (bit-identical run to run)" if plan.deterministic
                       else "merges into the output with atomics"))
        over = {"row": "columns", "col": "rows"}.get(r.axis.value, "the tile")
        out.append({"param": r.target, "layout": f"{r.op.value} over {over}",
                    "fast": fast if plan.split_kernel is None else mode,
                    "narrow": mode if plan.narrow_kernel else ""})
    return out


def batch_summary(plan) -> dict[str, Any] | None:
    """The batch dimension, which arguments have it, and how the grid covers the batches."""
    if plan.batch is None:
        return None
    persistent = plan.schedule.scheduler.persistent
    walk = ("each CTA walks tiles t of L x tiles, batch t / tiles" if persistent
            else "CTA c runs tile c % tiles of batch c / tiles")
    return {"dim": plan.batch,
            "batched": [p.name for p in plan.params if p.batch is not None],
            "shared": [p.name for p in plan.params
                       if p.batch is None and p.kind is not ParamKind.SCALAR],
            "grid": f"{plan.batch} x the tiles of one batch on one axis: {walk}"}


def plan_summary(plan, resources: dict | None = None) -> dict[str, Any]:
    """The plan as plain data (the schema of `kgen inspect --json`)."""
    from .targets import target

    if getattr(plan, "kind", None) in ("loop", "rows", "loop_dag"):  # a tile program
        from .report_program import program_summary

        return program_summary(plan, resources)

    storage = plan.storage

    def tile(t) -> dict:
        return {"name": t.name, "dtype": t.dtype.dsl_name, "outer": t.outer, "inner": t.inner,
                "atom_inner": t.atom_inner, "swizzle": str(t.swizzle), "stages": t.stages,
                "bytes": t.bytes}

    def operand(role: str, o) -> dict:
        return {"role": role, "param": o.param, "dtype": o.dtype.dsl_name, "k_major": o.k_major,
                "smem": tile(o.smem), "copies_per_thread": o.copies_per_thread,
                "ldmatrix_trans": o.ldmatrix_trans}

    summary = {
        "name": plan.name,
        "arch": plan.arch.value,
        "threads": plan.schedule.warps.threads,
        "min_blocks_per_sm": plan.schedule.scheduler.min_blocks_per_sm,
        "group_m": plan.schedule.scheduler.raster.group_m,
        "smem_bytes": plan.smem_bytes,
        "smem_limit": storage.limit_bytes,
        "smem_peak": storage.peak_bytes,  # most bytes live in one phase: no layout does better
        "smem_declared": storage.declared_bytes,  # the storage declaration's size, if any
        "smem_packed": storage.packed_bytes,  # the packer alone on the same buffers, if declared
        "phases": list(storage.phases),
        "buffers": [
            {"name": b.name, "offset": b.offset, "bytes": b.bytes, "align": b.align,
             "live": list(b.live),
             "live_phases": [storage.phases[b.live[0]], storage.phases[b.live[1]]],
             "live_ranges": [list(r) for r in b.live_ranges],
             "placed": "declared" if b.declared else "packer",
             "dtype": b.dtype.dsl_name if b.dtype is not None else None,
             "swizzle": str(b.swizzle) if b.swizzle else None,
             "role": b.role}
            for b in storage.buffers
        ],
        "gemms": [
            {"name": g.name, "tile": list(g.tile), "warps": list(g.warps),
             "warp_tile": list(g.warp_tile), "mma": list(g.mma), "frags": list(g.frags),
             "instruction": instruction(plan, g),
             "store": store_path(plan, g),
             "stages": g.stages, "m": g.m_dim, "n": g.n_dim, "k": g.k_dim,
             "operands": [operand(role, o) for role, o in (("a", g.a), ("b", g.b))
                          if o is not None],  # a chained A kept in registers has no tile
             "chain": None if g.chain is None else {
                 "source": g.chain.source, "keep": g.chain.residency.value,
                 "dtype": g.chain.dtype.dsl_name, "k": g.chain.k},
             "epilogue_values": g.epilogue.value_count}
            for g in plan.gemms
        ],
        "params": [
            {"name": f.name, "kind": f.kind.value, "ctype": f.ctype, "param": f.param,
             "dim": f.dim, "default": f.default}
            for f in plan.fields
        ],
        "alignments": [
            {"param": a.param, "ptr_bytes": a.ptr_bytes, "ld_multiple": a.ld_multiple,
             "reason": a.reason}
            for a in plan.alignments
        ],
        # every choice of the plan's Schedule, with why (kgen/lower/select.py chose it among
        # the target's legal schedules; `not <kind>` rows are the ones it refused)
        "schedule": [{"setting": label, "value": value, "why": why}
                     for label, value, why in (plan.schedule.describe() if plan.gemms else [])],
        # how each output leaves, in the fast entry point and in the narrow one
        "output_paths": output_paths(plan),
        "batch": batch_summary(plan),
    }
    occupancy = {"blocks_per_sm_by_smem": storage.limit_bytes // max(plan.smem_bytes, 1)}
    if resources is not None:
        summary["resources"] = resources
        registers = resources.get("registers")
        if registers:
            # Registers are handed out per warp in units of 256.
            per_warp = -(-registers * 32 // 256) * 256
            warps = -(-plan.schedule.warps.threads // 32)
            per_sm = target(plan.arch).registers_per_sm
            occupancy["blocks_per_sm_by_registers"] = per_sm // (per_warp * warps)
    summary["occupancy"] = occupancy
    return summary


def phase_span(phases: list[str], live: list[int]) -> str:
    first, last = live

    def name(i: int) -> str:
        return phases[i] if 0 <= i < len(phases) else str(i)

    return name(first) if first == last else f"{name(first)} .. {name(last)}"


LIVE, DEAD = "\u2588\u2588", "\u00b7 "  # one strip-chart cell per phase: "██" or "· "
SPARK = " \u2581\u2582\u2583\u2584\u2585\u2586\u2587\u2588"  # live bytes, 1/8 steps


def storage_chart(s: dict) -> list[str]:
    """The storage map as text: one row per buffer (by offset), one column per phase, the
    buffer's byte range; then the bytes live in each phase, as bars and in numbers."""
    phases = s["phases"]
    buffers = sorted(s["buffers"], key=lambda b: (b["offset"], -b["bytes"], b["name"]))
    name_width = max([len(b["name"]) for b in buffers] + [len("live bytes")])
    ranges = [f"{b['offset']:,}..{b['offset'] + b['bytes']:,}" for b in buffers]
    range_width = max([len(r) for r in ranges] + [len("bytes")])
    head = " " * (name_width + range_width + 4)
    lines = []
    if len(phases) > 10:  # phase numbers in two rows: tens, then units
        lines.append(head + "".join(f"{i // 10 or ' '} " for i in range(len(phases))).rstrip())
    lines.append(head + "".join(f"{i % 10} " for i in range(len(phases))).rstrip())
    load = [0] * len(phases)
    for b, span in zip(buffers, ranges):
        live = {p for first, last in b["live_ranges"] for p in range(first, last + 1)}
        for p in live:
            if 0 <= p < len(load):
                load[p] += b["bytes"]
        cells = "".join(LIVE if p in live else DEAD for p in range(len(phases)))
        lines.append(f"{b['name']:<{name_width}}  {span:>{range_width}}  {cells}")
    peak = max(load, default=0)
    bars = "".join(SPARK[-(-8 * n // peak) if peak else 0] * 2 for n in load)
    lines.append(f"{'live bytes':<{name_width}}  {'':>{range_width}}  {bars}")
    lines.append("phases: " + ", ".join(f"{i} {name} ({n:,} B)"
                                        for i, (name, n) in enumerate(zip(phases, load))))
    return lines


def print_plan(console, s: dict) -> None:
    """Render a plan_summary on a rich console: tables, the storage chart, occupancy."""
    from rich.table import Table

    if s.get("kind") in ("loop", "rows", "loop_dag"):  # a tile program
        from .report_program import print_program

        return print_program(console, s)

    used = s["smem_bytes"]
    limit = s["smem_limit"]
    share = f" ({100 * used / limit:.0f}%)" if limit else ""
    launch = (f"{s['threads']} threads  min {s['min_blocks_per_sm']} block(s)/SM"
              if s["gemms"] else "no gemm: storage plan only")
    console.print(
        f"[bold]{s['name']}[/bold]  {s['arch']}  {launch}  "
        f"shared memory {used:,} of {limit:,} B{share}"
    )
    gemms = Table(title="gemms", title_justify="left")
    for column in ("gemm", "tile MxNxK", "warps", "warp tile", "mma", "frags", "stages",
                   "instruction"):
        gemms.add_column(column)
    tiles = Table(title="shared-memory tiles", title_justify="left")
    for column in ("tile", "operand", "dtype", "outer x inner", "atom", "swizzle", "stages",
                   "bytes"):
        tiles.add_column(column, justify="right" if column == "bytes" else "left")
    for g in s["gemms"]:
        gemms.add_row(g["name"], "x".join(map(str, g["tile"])), "x".join(map(str, g["warps"])),
                      "x".join(map(str, g["warp_tile"])), "x".join(map(str, g["mma"])),
                      "x".join(map(str, g["frags"])), str(g["stages"]), g["instruction"])
        for o in g["operands"]:
            t = o["smem"]
            tiles.add_row(t["name"], f"{g['name']}.{o['role']} ({o['param']})", t["dtype"],
                          f"{t['outer']} x {t['inner']}", str(t["atom_inner"]), t["swizzle"],
                          str(t["stages"]), f"{t['bytes']:,}")
    if s["gemms"]:
        console.print(gemms)
        console.print(f"output: {s['gemms'][-1]['store']}")
        if s.get("batch"):
            b = s["batch"]
            shared = f"; shared by every batch: {', '.join(b['shared'])}" if b["shared"] else ""
            console.print(f"batches: {b['dim']} (batched: {', '.join(b['batched'])}{shared}; "
                          f"any batch stride, 0 broadcasts an input)")
            console.print(f"grid: {b['grid']}")
        console.print(tiles)
    if s.get("schedule"):
        schedule = Table(title="schedule", title_justify="left")
        for column in ("setting", "value", "why"):
            schedule.add_column(column)
        for row in s["schedule"]:
            schedule.add_row(row["setting"], row["value"], row["why"])
        console.print(schedule)
    if s.get("output_paths"):
        outputs = Table(title="outputs", title_justify="left")
        for column in ("output", "layout", "fast entry point", "narrow entry point"):
            outputs.add_column(column)
        for o in s["output_paths"]:
            outputs.add_row(o["param"], o["layout"], o["fast"], o["narrow"])
        console.print(outputs)
    storage = Table(title="storage", title_justify="left")
    for column in ("buffer", "offset", "bytes", "align", "live", "placed", "swizzle", "role"):
        storage.add_column(column, justify="right" if column in ("offset", "bytes", "align")
                           else "left")
    phases = s["phases"]
    for b in s["buffers"]:
        live = ", ".join(phase_span(phases, r) for r in b.get("live_ranges", [b["live"]]))
        storage.add_row(b["name"], f"{b['offset']:,}", f"{b['bytes']:,}", str(b["align"]),
                        live, b.get("placed", "packer"), b["swizzle"] or "-", b["role"])
    storage.add_section()
    storage.add_row("total", "", f"{used:,}", "", "", "", "", f"limit {limit:,}")
    console.print(storage)
    if s["buffers"]:
        console.print("storage over phases (\u2588\u2588 live, \u00b7 not)", style="bold")
        for line in storage_chart(s):
            console.print(line, markup=False, highlight=False, soft_wrap=True)
    notes = [f"peak live {s['smem_peak']:,} B (no layout of these buffers is smaller)"]
    if s.get("smem_declared") is not None:
        notes.append(f"storage declaration {s['smem_declared']:,} B")
        notes.append(f"packer alone {s['smem_packed']:,} B")
    console.print("; ".join(notes))
    params = Table(title="params struct", title_justify="left")
    for column in ("member", "kind", "C++ type", "of", "default"):
        params.add_column(column)
    for f in s["params"]:
        params.add_row(f["name"], f["kind"], f["ctype"], f["param"] or f["dim"] or "",
                       "" if f["default"] is None else str(f["default"]))
    if s["params"]:
        console.print(params)
    if s["alignments"]:
        aligns = Table(title="argument alignment", title_justify="left")
        for column in ("param", "pointer", "ld multiple of", "why"):
            aligns.add_column(column)
        for a in s["alignments"]:
            aligns.add_row(a["param"], f"{a['ptr_bytes']} B", str(a["ld_multiple"]), a["reason"])
        console.print(aligns)
    occupancy = s["occupancy"]
    line = f"occupancy: {occupancy['blocks_per_sm_by_smem']} block(s)/SM by shared memory"
    if "blocks_per_sm_by_registers" in occupancy:
        line += f", {occupancy['blocks_per_sm_by_registers']} by registers"
    console.print(line)
    if "resources" in s:
        r = s["resources"]
        console.print(
            f"NVRTC {r['nvrtc']} for {r['arch']}: {r['registers']} registers/thread, "
            f"{r['spill_stores']} B spill stores, {r['spill_loads']} B spill loads, "
            f"{r['stack_bytes']} B stack ({r['seconds']:.2f} s{', cached' if r['cached'] else ''})"
        )


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "-" if value is None else f"{value:{spec}}{suffix}"


def print_run_report(console, report) -> None:
    """Render a harness RunReport: the check table, the timing table, notes, PASS/FAIL."""
    from rich.table import Table

    sizes = ", ".join(f"{k}={v}" for k, v in report.sizes.items())
    scalars = ", ".join(f"{k}={v:g}" for k, v in report.scalars.items())
    compile_info = report.compile
    compiled = ""
    if compile_info:
        compiled = (f"; {compile_info.get('registers')} registers, "
                    f"{compile_info.get('spill_stores', 0)} B spilled, "
                    + ("cached" if compile_info.get("cached")
                       else f"compiled in {compile_info.get('seconds', 0):.2f} s"))
    console.print(f"[bold]{report.kernel}[/bold] ({report.plan_arch} plan, {report.compile_arch} "
                  f"code) on {report.device}{compiled}")
    console.print(f"sizes {sizes}" + (f"; scalars {scalars}" if scalars else "")
                  + f"; seed {report.seed}; tensors from {report.backend}")
    if report.checked:
        table = Table(title="check against the NumPy reference", title_justify="left")
        for column in ("output", "dtype", "shape", "rows", "max abs", "max rel", "atol, rtol",
                       "unwritten", "result"):
            table.add_column(column)
        for c in report.checks:
            r = c.result
            verdict = "[green]ok[/green]" if r.ok else f"[red]FAIL[/red] ({r.bad} bad)"
            table.add_row(c.name, c.dtype, "x".join(map(str, c.shape)),
                          "all" if c.rows_checked is None else str(c.rows_checked),
                          f"{r.max_abs:.3g}", f"{r.max_rel:.3g}", f"{r.atol:g}, {r.rtol:g}",
                          str(r.unwritten), verdict)
        console.print(table)
    if report.timing is not None:
        table = Table(title="time (median of runs, inputs rotated past L2)", title_justify="left")
        for column in ("", "time", "TFLOP/s", "GB/s", "of peak", "vs PyTorch"):
            table.add_column(column, justify="right")
        peak = report.peak_fraction
        table.add_row("kgen", _fmt(report.timing.median_ms * 1e3, ".1f", " us"),
                      _fmt(report.tflops, ".1f"), _fmt(report.gbps, ".0f"),
                      _fmt(None if peak is None else 100 * peak, ".0f", "%"),
                      _fmt(report.speedup, ".2f", "x"))
        if report.torch_timing is not None:
            table.add_row("PyTorch", _fmt(report.torch_timing.median_ms * 1e3, ".1f", " us"),
                          _fmt(report.torch_tflops, ".1f"), "", "", "1.00x")
        console.print(table)
    if report.baselines:
        table = Table(title="attention baselines (same inputs, same run)", title_justify="left")
        for column in ("", "time", "TFLOP/s", "kgen's speed over it"):
            table.add_column(column, justify="right")
        for name, timing in report.baselines.items():
            table.add_row(name, _fmt(timing.median_ms * 1e3, ".1f", " us"),
                          _fmt(report._tflops(timing), ".1f"),
                          _fmt(report.speedup_over(timing), ".2f", "x"))
        console.print(table)
    for note in report.notes:
        console.print(f"[dim]note: {note}[/dim]")
    if report.checked:
        console.print("[green]PASS[/green]" if report.ok else "[red]FAIL[/red]")
