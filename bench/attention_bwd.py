"""The attention backward: kgen's main kernel (examples/attention_bwd.kg without its tile line:
the rulebook's configuration; on a Hopper GPU the sm_90a build, the wgmma skeleton, with the
sm_80 build's mma.sync skeleton beside it as `kgen_mma_sync`) beside torch SDPA's cuDNN, flash
and memory-efficient backends' backward. bf16, 16k tokens in all (batch = 16384 / S), 16 heads,
head dims 64 and 128 (--d 256: the wgmma skeleton's split layout, kgen/targets/dag_wgmma_rules.py
DAG_WGMMA_SPLIT; the sm_80 build refuses D 256, so no kgen_mma_sync there), S = T in {1024,
4096} (--s), causal (top-left) and not.

Columns: `kgen_total` the whole backward called kernel by kernel: D = rowsum(dO * O) by the
row kernel examples/attention_bwd_dot.kg, the main kernel's call (its zeroing kernel of dQ, then
the main kernel) and dQ's conversion to bf16 (torch's copy); `kgen_seq` the backward sequence
kgen.attention's backward calls (kgen/attention_grad.py: D's row kernel zeroing dQ's f32
accumulator too, the main kernel, dQ's conversion; three launches), `kgen_seq_graph` that
sequence captured in a CUDA graph and the graph's replay timed (device time without the host's
launch gaps), `kgen_main` the main kernel's call alone (with the zeroing of dQ it launches
first) and `kgen_main_graph` its graph's replay; on the wgmma skeleton `kgen_mma_sync` the sm_80
build's main kernel (`kgen_mma_grid`: in its warp grid, kgen/targets/dag_mma_rules.py
DAG_WARP_GRID) and `kgen_rows_dq` the wgmma skeleton with dQ added by the copy engine's
bulk reduce-add per staged row (the plan option the rulebook took before its tensor reduce-add
per warpgroup; OTHER_ADDS); at D 192 and 256 (the split layout, where the rulebook takes
another way) `kgen_slots_dq` / `kgen_warp_dq` the add warp's tensor reduce-adds from each
warpgroup's own boxes of the streamed slots (D 256) / from a staging of their own (D 192;
SPLIT_ADDS, dag_wgmma_rules.DAG_WGMMA_SPLIT_ADDS); `sdpa_*` torch.autograd.grad of a saved
SDPA graph with the backend forced (the forward excluded). TFLOP/s = 2.5 x the forward's
4 * B * H * S * T * D / time, halved when causal; kgen/harness/timing.py's CUDA-event median.

    python3 bench/attention_bwd.py              # the table (--json FILE writes it)
    python3 bench/attention.py --bwd            # the same, from the forward's bench
    python3 bench/attention_bwd.py --once       # one small causal call, no timing (for
                                                # compute-sanitizer; --gqa HKV, --deterministic,
                                                # --schedule NAME: a variant, e.g. base+rows)
    python3 bench/attention_bwd.py --variants   # the wgmma skeleton's schedules (plan options,
                                                # schedule() reads their names, NAME+MODE the
                                                # dQ adds' way), each checked against the
                                                # rulebook's build, then timed; D 256's dQ:
                                                # --variants base base+slots --d 256
                                                # --s 1024 4096 16384 (D 192: base+warp)
    python3 bench/attention_bwd.py --mma-layouts  # the sm_80 build's warp rows against its
                                                # warp grid (kgen_mma_grid in the table too),
                                                # outputs compared, beside SDPA's flash
    python3 bench/attention_bwd.py --groups     # the main kernel at D 128: MHA against GQA 8:1
                                                # (16 / 2 heads) and deterministic against default
                                                # (--gqa-schedules gqa8: GQA's schedule before
                                                # session 9 beside the default GQA build)
    python3 bench/attention_bwd.py --mods       # the forward's mods' backward beside the plain
                                                # one and beside torch.compile(flex_attention)'s
                                                # backward with the same mods, its gradients
                                                # checked against kgen's; Flex/kgen's geomean
                                                # (kgen/harness/attention_bwd_mods.py; --no-flex:
                                                # kgen's only)
    python3 bench/attention_bwd.py --gqa-paths  # GQA 16:2 through kgen.attention: the MHA
                                                # program on repeated K, V against the GQA
                                                # program (D 64, 128; causal, deterministic)
    python3 bench/attention_bwd.py --options    # kgen.attention's backward with a value head
                                                # dim unlike the query's (192/128, 192/192,
                                                # 128/64, 64/128, 256/128, 128/256; D 128
                                                # beside) against SDPA's cuDNN, and with a block
                                                # mask (bench/mods.py's random BlockMask; MHA and
                                                # GQA 16:2) against the plain backward and
                                                # torch.compile(flex_attention)'s with the same
                                                # BlockMask (gradients checked); batch 4, 16
                                                # heads, S 4096; TFLOP/s = 2.5 x 2 B H S T
                                                # (D + D_v); --options --once: one small call of
                                                # each, for compute-sanitizer (--no-flex)
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from kgen import ir  # noqa: E402
from kgen.api import build_verified, load_built  # noqa: E402
from kgen.errors import KgenError  # noqa: E402
from kgen.harness.timing import rotation_count, time_kernel  # noqa: E402
from kgen.parse import parse  # noqa: E402
from kgen.runtime.device import device_info  # noqa: E402
from kgen.verify import verify  # noqa: E402

HEADS = 16
TOKENS = 16384
MASKED = "where(row <= col, exp(scale * acc - lse[col]), 0)"


def _kernel(path: str, d: int, replace: dict[str, str] | None = None) -> ir.Kernel:
    text = (ROOT / path).read_text().replace("128]", f"{d}]")
    text = text.replace("0.08838834764", repr(1.0 / math.sqrt(d))).replace("    tile 128x32\n", "")
    for old, new in (replace or {}).items():
        assert old in text, old
        text = text.replace(old, new)
    module = parse(text, path)
    assert verify(module) == []
    return module.kernels[0]


def device_arch() -> ir.Arch:
    """sm_90a on a Hopper GPU (the wgmma skeleton where the rulebook picks it), else sm_80."""
    return ir.Arch.SM90A if torch.cuda.get_device_capability() == (9, 0) else ir.Arch.SM80


def variant(kv_heads: int | None = None, deterministic: bool = False) -> dict[str, str]:
    """The replacements of examples/attention_bwd.kg for GQA (K, V, dK, dV of `kv_heads`
    heads, a number) and `reductions deterministic`."""
    out = {}
    if kv_heads is not None:
        for name in ("K", "V", "dK", "dV"):
            out[f"tensor {name} : bf16[B, H,"] = f"tensor {name} : bf16[B, {kv_heads},"
    if deterministic:
        out["kernel attention_bwd {\n"] = "kernel attention_bwd {\n  reductions deterministic\n"
    return out


def built_main(d: int, causal: bool, arch: ir.Arch | None = None,
               replace: dict[str, str] | None = None, grid: bool | None = None):
    """The main kernel's build; `grid` True / False: the mma.sync skeleton's warp grid where
    the rulebook allows it / its warp rows (the plan option dag_mma_rules.warp_grid), None: as
    the rulebook takes it."""
    from kgen.targets import dag_mma_rules

    mask = {} if causal else {MASKED: "exp(scale * acc - lse[col])"}
    kernel = _kernel("examples/attention_bwd.kg", d, {**mask, **(replace or {})})
    if grid is None:
        return build_verified(kernel, arch or device_arch())
    with dag_mma_rules.warp_grid(grid):
        return build_verified(kernel, arch or device_arch())


# the ways of adding dQ (loop_dag_schedule.ADD_MODES) timed beside the rulebook's in the table:
# the plain layout's (D 64, 128), the split layout's (D 192, 256: the add warp's tensor
# reduce-adds from the streamed slots or from a staging of their own, where each is built)
OTHER_ADDS = ("rows",)
SPLIT_ADDS = ("slots", "warp")


def kernels(d: int, causal: bool, arch: ir.Arch | None = None,
            grid: bool | None = None) -> tuple:
    """The loaded main kernel (the rulebook's configuration for D on `arch`, the device's by
    default; `grid`: built_main's) and the D row kernel."""
    built = built_main(d, causal, arch, grid=grid)
    dot = _kernel("examples/attention_bwd_dot.kg", d)
    return load_built(built), load_built(build_verified(dot, ir.Arch.SM80)), built.plan


def _inputs(b: int, s: int, d: int, causal: bool):
    q, k, v, do = (torch.randn(b, HEADS, s, d, device="cuda").bfloat16() for _ in range(4))
    o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return q, k, v, do, o, _lse_blocked(q, k, d, causal)


def _lse_blocked(q, k, d, causal):
    """lse row block by row block (the whole [S, S] in f32 would take 4 GiB at S 4096)."""
    out = []
    s = q.shape[-2]
    for r in range(0, s, 512):
        x = (q[..., r:r + 512, :].float() @ k.float().transpose(-1, -2)) / math.sqrt(d)
        if causal:
            rows = torch.arange(r, min(r + 512, s), device="cuda")[:, None]
            x = x.masked_fill(torch.arange(s, device="cuda")[None, :] > rows, -math.inf)
        out.append(torch.logsumexp(x, -1))
    return torch.cat(out, -1)


def measure(d: int, s: int, causal: bool, backends) -> dict:
    b = TOKENS // s
    main, dot, plan = kernels(d, causal)
    q, k, v, do, o, lse = _inputs(b, s, d, causal)
    dd = torch.empty(b, HEADS, s, device="cuda")
    dq = torch.empty(b, HEADS, s, d, device="cuda")
    dq16, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    scale = 1.0 / math.sqrt(d)
    stream = torch.cuda.current_stream().cuda_stream
    set_bytes = 2 * (q.numel() * 6) + 4 * dq.numel()
    rotate = 1 if set_bytes > 2 * device_info().l2_bytes else rotation_count(
        set_bytes, device_info().l2_bytes)

    def main_call(_):
        main(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv, scale=scale)

    def total(_):
        dot(dO=do, O=o, D=dd)
        main_call(_)
        dq16.copy_(dq)

    sequence, names = _sequence(d, causal)
    given = {"dO": do, "O": o, "Q": q, "K": k, "V": v, "lse": lse, "scale": scale}
    sequence_args = tuple(given[name] for name in names)

    def sequence_call(_):
        sequence(*sequence_args)

    flops = 2.5 * 4 * b * HEADS * s * s * d / (2 if causal else 1)
    row = {"d": d, "s": s, "causal": causal, "batch": b, "heads": HEADS,
           "tile": plan.config.value, "skeleton": "wgmma" if plan.wgmma else "mma.sync"}
    calls = [("kgen_total", total), ("kgen_seq", sequence_call),
             ("kgen_seq_graph", _replay(sequence_call)), ("kgen_main", main_call),
             ("kgen_main_graph", _replay(main_call))]
    if plan.wgmma is not None:  # beside it, the mma.sync skeleton's main kernel (sm_80 build)
        try:
            mma_sync = kernels(d, causal, ir.Arch.SM80)[0]
            calls.append(("kgen_mma_sync", lambda _: mma_sync(
                Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv, scale=scale)))
        except KgenError as err:  # (D 256: its accumulators do not fit mma.sync's registers)
            print(f"# kgen_mma_sync D {d}: {err.message}", file=sys.stderr)
    try:  # the sm_80 build in the mma.sync skeleton's warp grid (dag_mma_rules.DAG_WARP_GRID)
        grid_main, _, grid_plan = kernels(d, causal, ir.Arch.SM80, grid=True)
        if grid_plan.grid is not None:
            calls.append(("kgen_mma_grid", lambda _: grid_main(
                Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv, scale=scale)))
        else:
            print(f"# kgen_mma_grid D {d}: {grid_plan.layout.why}", file=sys.stderr)
    except KgenError as err:
        print(f"# kgen_mma_grid D {d}: {err.message}", file=sys.stderr)
    if plan.wgmma is not None:  # dQ added another way (a plan option)
        from kgen.targets.sm90.loop_dag_schedule import add_mode

        for mode in SPLIT_ADDS if plan.wgmma.split is not None else OTHER_ADDS:
            if mode == add_mode(plan.wgmma):
                continue
            try:
                other = load_built(with_options(built_main(d, causal), adds=mode))
            except ValueError as err:  # (the split layout: slots at D 256, warp at D 192)
                print(f"# kgen_{mode}_dq D {d}: {err}", file=sys.stderr)
                continue
            calls.append((f"kgen_{mode}_dq", lambda _, other=other: other(
                Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv, scale=scale)))
    for name, fn in calls:
        t = time_kernel(fn, rotate=rotate, stream=stream)
        row[name] = flops / (t.median_ms * 1e-3) / 1e12
    from torch.nn.attention import sdpa_kernel

    for name, backend in backends.items():
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        try:
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv,
                                                                       is_causal=causal)
            t = time_kernel(lambda _: torch.autograd.grad(out, (qq, kk, vv), do,
                                                          retain_graph=True),
                            rotate=1, stream=stream)
            row[name] = flops / (t.median_ms * 1e-3) / 1e12
        except RuntimeError as err:  # a backend that does not take this shape
            row[name] = None
            print(f"# {name} D {d} S {s}: {str(err).splitlines()[0]}", file=sys.stderr)
    return row


def mma_layouts(dims, lengths) -> list[dict]:
    """The sm_80 build's two warp layouts (the mma.sync skeleton: the warp rows, the warp grid;
    kgen/targets/dag_mma_rules.py DAG_WARP_GRID) on the same random inputs: dQ, dK, dV of the
    grid against the rows' (max |a - b| / max |b|), then each main kernel timed, beside SDPA's
    flash backend (FlashAttention-2's backward); TFLOP/s as the table's."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    print(f"# the mma.sync skeleton's warp layouts (sm_80 build), TFLOP/s, bf16, {TOKENS} "
          f"tokens, {HEADS} heads, {torch.cuda.get_device_name()}")
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'rows':>8} {'grid':>8} {'grid/rows':>9} "
          f"{'sdpa_flash':>10} {'grid/flash':>10} {'rel_err':>8}")
    rows = []
    for d in dims:
        for s in lengths:
            for causal in (False, True):
                b = TOKENS // s
                q, k, v, do, o, lse = _inputs(b, s, d, causal)
                dd = (do.float() * o.float()).sum(-1)
                scale = 1.0 / math.sqrt(d)
                stream = torch.cuda.current_stream().cuda_stream
                flops = 2.5 * 4 * b * HEADS * s * s * d / (2 if causal else 1)
                row = {"d": d, "s": s, "causal": causal}
                outs = {}
                for name, grid in (("rows", False), ("grid", True)):
                    main, _, plan = kernels(d, causal, ir.Arch.SM80, grid=grid)
                    if grid and plan.grid is None:
                        print(f"# grid D {d}: {plan.layout.why}", file=sys.stderr)
                        continue
                    dq = torch.empty(b, HEADS, s, d, device="cuda")
                    dk, dv = torch.empty_like(k), torch.empty_like(v)

                    def call(_, main=main, dq=dq, dk=dk, dv=dv):
                        main(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv,
                             scale=scale)
                    call(0)
                    outs[name] = (dq.clone(), dk.float(), dv.float())
                    t = time_kernel(call, rotate=1, stream=stream)
                    row[name] = flops / (t.median_ms * 1e-3) / 1e12
                if len(outs) == 2:
                    row["rel_err"] = max(float((a - r).abs().max() / r.abs().max())
                                         for a, r in zip(outs["grid"], outs["rows"]))
                qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
                with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                    out = torch.nn.functional.scaled_dot_product_attention(
                        qq, kk, vv, is_causal=causal)
                t = time_kernel(lambda _: torch.autograd.grad(out, (qq, kk, vv), do,
                                                              retain_graph=True),
                                rotate=1, stream=stream)
                row["sdpa_flash"] = flops / (t.median_ms * 1e-3) / 1e12
                rows.append(row)
                get = lambda n: row.get(n, math.nan)  # noqa: E731
                print(f"{d:>4} {s:>6} {str(causal):>6} {get('rows'):8.1f} {get('grid'):8.1f} "
                      f"{get('grid') / get('rows'):9.3f} {get('sdpa_flash'):10.1f} "
                      f"{get('grid') / get('sdpa_flash'):10.3f} {get('rel_err'):8.1e}",
                      flush=True)
    return rows


def _sequence(d: int, causal: bool):
    """The backward sequence kgen.attention's backward calls for bf16, head dim `d`, on the
    device's arch (kgen/attention_grad.py): its op and the names of its inputs, in order."""
    from kgen.attention_grad import BackwardSignature, _backward_op

    sig = BackwardSignature("bf16", d, causal, device_arch().value)
    op, inputs, _ = _backward_op(sig, torch.cuda.current_device())
    return op, inputs


def _replay(fn):
    """fn(0) captured in a CUDA graph (after a call on a side stream: loads, allocations);
    the timed call replays the graph on the current stream."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(0)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(0)
    return lambda _: graph.replay()


def table(json_path: str | None = None, dims=(64, 128), lengths=(1024, 4096)) -> list[dict]:
    from torch.nn.attention import SDPBackend

    backends = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION,
                "sdpa_flash": SDPBackend.FLASH_ATTENTION,
                "sdpa_mem_efficient": SDPBackend.EFFICIENT_ATTENTION}
    columns = ["kgen_total", "kgen_seq", "kgen_seq_graph", "kgen_main", "kgen_main_graph",
               "kgen_mma_sync", "kgen_mma_grid",
               *(f"kgen_{m}_dq" for m in OTHER_ADDS + SPLIT_ADDS), *backends]
    print(f"# TFLOP/s (2.5x the forward's flops), bf16, {TOKENS} tokens, {HEADS} heads, "
          f"{torch.cuda.get_device_name()}")
    print(f"# kgen_main: the {device_arch().value} build; where it is the wgmma skeleton, "
          "kgen_mma_sync: the sm_80 build (mma.sync), kgen_<mode>_dq: dQ added another way "
          "(a plan option: rows, the copy engine's bulk reduce-add per staged row; at D 192 and "
          "256 slots / warp, the add warp's tensor reduce-adds from the streamed slots / from a "
          "staging of their own)")
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'tile':>28} " + " ".join(f"{n:>18}" for n in columns))
    rows = []
    for d in dims:
        for s in lengths:
            for causal in (False, True):
                row = measure(d, s, causal, backends)
                rows.append(row)
                cells = " ".join(f"{row[n]:18.1f}" if row.get(n) is not None else f"{'-':>18}"
                                 for n in columns)
                print(f"{d:>4} {s:>6} {str(causal):>6} {row['tile']:>28} {cells}", flush=True)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    return rows


def schedule(name: str) -> dict:
    """A variant's plan options (loop_dag_schedule.with_schedule) from its name: "base" the
    rulebook's; "none" every option off (the skeleton of session 5); else letters a
    (issue_ahead), v (stage_vectors), d (defer_accumulating), l (lpt, where a mask skips
    blocks), f (fast_body), e (defer_all: every accumulating gemm after the loop-row gemm, the
    split layout's, D 256), each off when absent, and w0 / w1 (wait_accumulating; the
    rulebook's when absent); "gqa8" the rulebook's but the fast body, the longest-first order
    and the staged vectors off (GQA's schedule before session 9); "regtail" the rulebook's
    but dK and dV stored per element from registers (not by the copy engine from the rings:
    dag_wgmma_rules.DAG_WGMMA_TAIL_TMA); a suffix +MODE adds dQ so
    (loop_dag_schedule.ADD_MODES: warp, tensor, rows, atomics, slots; the rulebook's when
    absent), e.g. base+rows; the split layout (D 192, 256) takes atomics, slots (D 256, 128 /
    256) and warp (where its staging fits: D 192), e.g. base+slots."""
    name, _, adds = name.partition("+")
    if adds:
        return {**schedule(name), "adds": adds}
    if name == "base":
        return {}
    if name == "regtail":
        return dict(tail_tma=False)
    if name == "gqa8":  # session 8's GQA schedule: no fast body, grid order, vectors loaded
        return dict(fast_body=False, lpt=False, stage_vectors=False)
    name = "" if name == "none" else name
    options = dict(issue_ahead="a" in name, stage_vectors="v" in name,
                   defer_accumulating="d" in name, lpt="l" in name, fast_body="f" in name,
                   defer_all="e" in name)
    if "w" in name:
        options["wait_accumulating"] = name[name.index("w") + 1] == "1"
    return options


SCHEDULES = ("base", "regtail", "base+tensor", "base+rows", "none", "vdl", "avdl", "avdlf")
CAUSAL_SCHEDULES = ()


def with_options(built, **options):
    """The sm_90a build with plan options of loop_dag_schedule.with_schedule, its source
    emitted again."""
    import dataclasses

    from kgen.targets.sm90.loop_dag import emit
    from kgen.targets.sm90.loop_dag_schedule import with_schedule

    plan = with_schedule(built.plan, **options)
    source = emit(plan, source_name="bench", source_hash="0", command="bench/attention_bwd.py")
    return dataclasses.replace(built, plan=plan, source=source)


def variants(d: int, s: int, causal: bool, names) -> dict:
    """The wgmma skeleton's schedules (SCHEDULES) on one shape: each checked against the
    rulebook's build on the same random inputs (relative error of dQ, dK, dV), then timed;
    cuDNN's and flash's backward beside them (TFLOP/s as measure())."""
    b = TOKENS // s
    base = built_main(d, causal)
    q, k, v, do, o, lse = _inputs(b, s, d, causal)
    dd = (do.float() * o.float()).sum(-1)
    scale = 1.0 / math.sqrt(d)
    stream = torch.cuda.current_stream().cuda_stream
    flops = 2.5 * 4 * b * HEADS * s * s * d / (2 if causal else 1)
    ref = load_built(base)(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, scale=scale)
    row = {"d": d, "s": s, "causal": causal}
    for name in names:
        try:
            fn = load_built(with_options(base, **schedule(name)))
        except ValueError as err:  # a plan option this layout does not build (e.g. D 256's rows)
            print(f"# {name} D {d}: {err}", file=sys.stderr)
            continue
        outs = fn(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, scale=scale)
        err = max(float((x.float() - r.float()).norm() / r.float().norm())
                  for x, r in zip(outs, ref))
        dq = torch.empty(b, HEADS, s, d, device="cuda")
        dk, dv = torch.empty_like(k), torch.empty_like(v)
        t = time_kernel(lambda _: fn(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv,
                                     scale=scale), stream=stream)
        row[name] = (flops / (t.median_ms * 1e-3) / 1e12, err)
    from torch.nn.attention import SDPBackend, sdpa_kernel

    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        qq, kk, vv = (x.detach().requires_grad_() for x in (q, k, v))
        with sdpa_kernel(backend):
            out = torch.nn.functional.scaled_dot_product_attention(qq, kk, vv, is_causal=causal)
        t = time_kernel(lambda _: torch.autograd.grad(out, (qq, kk, vv), do, retain_graph=True),
                        stream=stream)
        row[name] = flops / (t.median_ms * 1e-3) / 1e12
    return row


def variants_table(dims, lengths, names) -> None:
    print("# TFLOP/s (relative difference from the rulebook's build), "
          f"{torch.cuda.get_device_name()}")
    for d in dims:
        for s in lengths:
            for causal in (False, True):
                shown = names + [n for n in CAUSAL_SCHEDULES if causal and n not in names]
                row = variants(d, s, causal, shown)
                cells = " ".join(f"{n}={row[n][0]:.1f}({row[n][1]:.0e})" for n in shown
                                 if n in row)
                print(f"D {d} S {s} causal {causal}: {cells} cudnn={row['cudnn']:.1f} "
                      f"flash={row['flash']:.1f}", flush=True)


def once(arch: ir.Arch | None = None, d: int = 64, kv_heads: int | None = None,
         deterministic: bool = False, name: str | None = None) -> None:
    """One small ragged causal call (B 1, H 2, S 200, T 333, D 64), no timing, on the device's
    arch by default: for compute-sanitizer's memcheck and racecheck. `kv_heads`: GQA (H 4
    then); `deterministic`: `reductions deterministic`; `name`: a schedule of the wgmma
    skeleton (schedule(); e.g. base+rows: dQ by the bulk reduce-add per staged row)."""
    replace = variant(kv_heads, deterministic)
    built = build_verified(_kernel("examples/attention_bwd.kg", d, replace),
                           arch or device_arch())
    if name:
        built = with_options(built, **schedule(name))
    adds = built.plan.wgmma.adds.value if built.plan.wgmma else "-"
    print(f"{built.plan.arch.value}: {built.plan.mma.value}; GQA {built.plan.gqa}; "
          f"deterministic {built.plan.deterministic is not None}; dQ: {adds}")
    main = load_built(built)
    heads = 2 if kv_heads is None else 4
    q, do = (torch.randn(1, heads, 200, d, device="cuda").bfloat16() for _ in range(2))
    k, v = (torch.randn(1, kv_heads or heads, 333, d, device="cuda").bfloat16()
            for _ in range(2))
    lse = torch.full((1, heads, 200), 4.0, device="cuda")
    dd = torch.randn(1, heads, 200, device="cuda")
    dq, dk, dv = main(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, scale=0.125)
    torch.cuda.synchronize()
    print("attention_bwd ran; finite:", bool(torch.isfinite(dq).all() and
                                             torch.isfinite(dk.float()).all() and
                                             torch.isfinite(dv.float()).all()))


def groups(d: int = 128, lengths=(4096, 16384), kv_heads: int = 2,
           gqa_schedules=()) -> list[dict]:
    """The main kernel alone (its zeroing included) at D `d`, 16 heads, 16k tokens: MHA and
    GQA 16 / `kv_heads`, each by default and deterministic, causal and not; TFLOP/s counted as
    the MHA backward's (per query head), and the times' ratios. `gqa_schedules`: names of
    schedule() (e.g. gqa8) timed on the default GQA build's inputs beside it, each checked
    against it (relative difference of dQ, dK, dV), a line each."""
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    print(f"# main kernel TFLOP/s (2.5x the forward's flops per query head), bf16, D {d}, "
          f"{HEADS} heads, {torch.cuda.get_device_name()}, {device_arch().value}")
    print(f"{'S':>6} {'causal':>6} {'mha':>8} {'mha_det':>8} {'gqa':>8} {'gqa_det':>8} "
          f"{'det/def mha':>11} {'det/def gqa':>11} {'gqa/mha time':>12} "
          f"{'inc/def mha':>11} {'inc/def gqa':>11} {'grid/def mha':>12} {'grid/def gqa':>12}")
    for s in lengths:
        b = max(TOKENS // s, 1)
        for causal in (False, True):
            q, do = (torch.randn(b, HEADS, s, d, device="cuda").bfloat16() for _ in range(2))
            lse = torch.randn(b, HEADS, s, device="cuda") + 8.0
            dd = torch.randn(b, HEADS, s, device="cuda")
            dq = torch.empty(b, HEADS, s, d, device="cuda")
            flops = 2.5 * 4 * b * HEADS * s * s * d / (2 if causal else 1)
            row = {"d": d, "s": s, "batch": b, "causal": causal, "kv_heads": kv_heads}
            # *_inc: deterministic in the increasing order of the tiles of rows (the plan
            # option descending=False; the rulebook's is decreasing where a mask skips blocks);
            # *_grid: deterministic launched in the grid's order (lpt=False; the rulebook's
            # launches in sections of pairs, dag_wgmma_rules.DAG_WGMMA_ORDERED_SECTIONS)
            for name, kv, det in (("mha", None, False), ("mha_det", None, True),
                                  ("gqa", kv_heads, False), ("gqa_det", kv_heads, True),
                                  ("mha_inc", None, True), ("gqa_inc", kv_heads, True),
                                  ("mha_grid", None, True), ("gqa_grid", kv_heads, True)):
                built = built_main(d, causal, None, variant(kv, det))
                if name.endswith("_inc"):
                    built = with_options(built, descending=False)
                if name.endswith("_grid"):
                    built = with_options(built, lpt=False)
                main = load_built(built)
                heads = HEADS if kv is None else kv
                k, v = (torch.randn(b, heads, s, d, device="cuda").bfloat16() for _ in range(2))
                dk, dv = torch.empty_like(k), torch.empty_like(v)

                def call(_):
                    main(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq, dK=dk, dV=dv,
                         scale=1.0 / math.sqrt(d))

                t = time_kernel(call, rotate=1, stream=stream)
                row[name] = flops / (t.median_ms * 1e-3) / 1e12
                row[name + "_ms"] = t.median_ms
                if name == "gqa":  # the other GQA schedules on these inputs
                    call(0)
                    gqa_out = [x.clone() for x in (dq, dk, dv)]
                    for other in gqa_schedules:
                        fn = load_built(with_options(built, **schedule(other)))
                        t = time_kernel(lambda _: fn(Q=q, K=k, V=v, dO=do, lse=lse, D=dd, dQ=dq,
                                                     dK=dk, dV=dv, scale=1.0 / math.sqrt(d)),
                                        rotate=1, stream=stream)
                        err = max(float((x.float() - r.float()).norm() / r.float().norm())
                                  for x, r in zip((dq, dk, dv), gqa_out))
                        row[f"gqa[{other}]"] = flops / (t.median_ms * 1e-3) / 1e12
                        row[f"gqa[{other}]_ms"] = t.median_ms
                        row[f"gqa[{other}]_diff"] = err
            rows.append(row)
            print(f"{s:>6} {str(causal):>6} {row['mha']:8.1f} {row['mha_det']:8.1f} "
                  f"{row['gqa']:8.1f} {row['gqa_det']:8.1f} "
                  f"{row['mha_det_ms'] / row['mha_ms']:11.3f} "
                  f"{row['gqa_det_ms'] / row['gqa_ms']:11.3f} "
                  f"{row['gqa_ms'] / row['mha_ms']:12.3f} "
                  f"{row['mha_inc_ms'] / row['mha_ms']:11.3f} "
                  f"{row['gqa_inc_ms'] / row['gqa_ms']:11.3f} "
                  f"{row['mha_grid_ms'] / row['mha_ms']:12.3f} "
                  f"{row['gqa_grid_ms'] / row['gqa_ms']:12.3f}", flush=True)
            for other in gqa_schedules:
                print(f"{'':>6} {'':>6} gqa[{other}] {row[f'gqa[{other}]']:.1f} TFLOP/s, time "
                      f"{row[f'gqa[{other}]_ms'] / row['gqa_ms']:.3f}x the default GQA's, "
                      f"relative difference {row[f'gqa[{other}]_diff']:.1e}", flush=True)
    return rows


# ---------------------------------------------------------------------------------------------
# --options: the backward's value head dims unlike the query's and its block mask, through
# kgen.attention's autograd (torch.autograd.grad of a saved graph, the forward excluded)

OPTION_BATCH, OPTION_HEADS = 4, 16  # --options: batch 4, 16 heads, S 4096
PAIRS = ((128, 128), (192, 128), (192, 192), (128, 64), (64, 128), (256, 128), (128, 256))


def _option_leaves(s: int, d: int, d_v: int, seed: int = 0, kv_heads: int = OPTION_HEADS):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    shape, kv = (OPTION_BATCH, OPTION_HEADS, s), (OPTION_BATCH, kv_heads, s)
    q = torch.randn(*shape, d, device="cuda", generator=gen).bfloat16()
    k = torch.randn(*kv, d, device="cuda", generator=gen).bfloat16()
    v = torch.randn(*kv, d_v, device="cuda", generator=gen).bfloat16()
    do = torch.randn(*shape, d_v, device="cuda", generator=gen).bfloat16()
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def _option_tflops(s: int, d: int, d_v: int, causal: bool, ms: float) -> float:
    flops = 2.5 * 2 * OPTION_BATCH * OPTION_HEADS * s * s * (d + d_v) / (2 if causal else 1)
    return flops / (ms * 1e-3) / 1e12


def value_dims(s: int) -> None:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kgen
    from kgen.harness.attention_bwd_mods import _grad, _median_ms

    print(f"value head dims (B {OPTION_BATCH}, H {OPTION_HEADS}, S {s}): ms and TFLOP/s of the "
          "backward")
    print(f"{'D':>4} {'D_v':>4} {'causal':>6} {'kgen ms':>8} {'TFLOP/s':>8} {'cuDNN ms':>9} "
          f"{'TFLOP/s':>8} {'kgen/cuDNN':>10}")
    for d, d_v in PAIRS:
        for causal in (False, True):
            q, k, v, do = _option_leaves(s, d, d_v)
            ms = _median_ms(_grad(lambda: kgen.attention(q, k, v, is_causal=causal),
                                  (q, k, v), do))
            cudnn = None
            try:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    call = _grad(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal), (q, k, v), do)
                    cudnn = _median_ms(call)
            except Exception as err:  # noqa: BLE001 (the backend's refusal, as a note)
                note = str(err).strip().splitlines()[0][:60] if str(err).strip() else "refused"
            cells = (f"{cudnn:9.3f} {_option_tflops(s, d, d_v, causal, cudnn):8.1f} "
                     f"{cudnn / ms:10.2f}" if cudnn else f"  cuDNN: {note}")
            print(f"{d:4} {d_v:4} {str(causal):>6} {ms:8.3f} "
                  f"{_option_tflops(s, d, d_v, causal, ms):8.1f} {cells}", flush=True)
            del q, k, v, do


def gqa_paths(s: int) -> None:
    """GQA 16:2 through kgen.attention's autograd: the backward on the MHA program with K and V
    repeated over the group (kgen/attention_grad.py GQA_EXPANDED_CAUSAL, taken under the causal
    mask) against the GQA program, their gradients compared, cuDNN's GQA beside."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kgen
    import kgen.attention_grad as grad
    from kgen.harness.attention_bwd_mods import _grad, _median_ms, relative_difference

    kv_heads = OPTION_HEADS // 8
    print(f"GQA {OPTION_HEADS}:{kv_heads} (B {OPTION_BATCH}, S {s}), backward ms: the MHA program "
          "on repeated K, V / the GQA program / cuDNN")
    print(f"{'D':>4} {'causal':>6} {'det':>5} {'repeated':>9} {'GQA prog':>9} {'cuDNN':>8} "
          f"{'rep/GQA':>8} {'TFLOP/s':>8} {'x cuDNN':>8} {'grad diff':>9}")
    for d in (64, 128):
        for causal in (False, True):
            for det in (False, True):
                q, k, v, do = _option_leaves(s, d, d, kv_heads=kv_heads)
                call = _grad(lambda: kgen.attention(q, k, v, is_causal=causal, enable_gqa=True,
                                                    deterministic=det), (q, k, v), do)
                saved = grad.GQA_EXPANDED_CAUSAL
                try:
                    grad.GQA_EXPANDED_CAUSAL = True
                    want = call()
                    repeated = _median_ms(call)
                    grad.GQA_EXPANDED_CAUSAL = False
                    got = call()
                    program = _median_ms(call)
                finally:
                    grad.GQA_EXPANDED_CAUSAL = saved
                diff = relative_difference(got, want)
                cudnn = None
                try:
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        cudnn = _median_ms(_grad(
                            lambda: torch.nn.functional.scaled_dot_product_attention(
                                q, k, v, is_causal=causal, enable_gqa=True), (q, k, v), do))
                except Exception:  # noqa: BLE001 (the backend's refusal: an empty cell)
                    pass
                best = min(repeated, program) if causal else program
                cells = (f"{cudnn:8.3f}" if cudnn else f"{'-':>8}")
                print(f"{d:4} {str(causal):>6} {str(det):>5} {repeated:9.3f} {program:9.3f} "
                      f"{cells} {repeated / program:8.2f} "
                      f"{_option_tflops(s, d, d, causal, best):8.1f} "
                      f"{(cudnn / best if cudnn else float('nan')):8.2f} {diff:9.1e}",
                      flush=True)
                del q, k, v, do


def block_masks(s: int, flex: bool) -> None:
    import kgen
    from kgen.harness.attention_bwd_mods import _grad, _median_ms, relative_difference
    sys.path.insert(0, str(ROOT / "bench"))
    from mods import _random_blocks

    print(f"block mask (D 128, B {OPTION_BATCH}, H {OPTION_HEADS}, S {s}): backward ms; blocks / "
          "plain; Flex / kgen")
    masks = _random_blocks(s, s, torch.Generator(device="cuda").manual_seed(s))
    if flex:
        from torch.nn.attention.flex_attention import flex_attention
        compiled = torch.compile(flex_attention)
    for kv_heads, causal in ((OPTION_HEADS, False), (OPTION_HEADS, True),
                             (OPTION_HEADS // 8, False), (OPTION_HEADS // 8, True)):
        q, k, v, do = _option_leaves(s, 128, 128, kv_heads=kv_heads)
        gqa = kv_heads != OPTION_HEADS
        plain = _median_ms(_grad(lambda: kgen.attention(q, k, v, is_causal=causal,
                                                        enable_gqa=gqa), (q, k, v), do))
        call = _grad(lambda: kgen.attention(q, k, v, is_causal=causal, enable_gqa=gqa,
                                            block_mask=masks[causal]), (q, k, v), do)
        want = call()
        ms = _median_ms(call)
        heads = f"GQA {OPTION_HEADS}:{kv_heads} " if gqa else ""
        line = (f"{heads}causal {str(causal):5} plain {plain:7.3f} blocks {ms:7.3f} "
                f"({ms / plain:5.2f}x plain)")
        if flex:
            flex_call = _grad(lambda: compiled(q, k, v, block_mask=masks[causal],
                                               enable_gqa=gqa), (q, k, v), do)
            diff = relative_difference(flex_call(), want)
            flex_ms = _median_ms(flex_call)
            line += f" Flex {flex_ms:7.3f} ({flex_ms / ms:5.2f}x kgen's speed; grads {diff:.1e})"
        print(line, flush=True)


def options_once() -> None:
    """One small call of each option (S 1000), forward and backward, for compute-sanitizer."""
    import kgen
    sys.path.insert(0, str(ROOT / "bench"))
    from mods import _random_blocks

    for d, d_v in PAIRS[1:]:
        q, k, v, do = _option_leaves(1000, d, d_v)
        kgen.attention(q, k, v, is_causal=True).backward(do)
    masks = _random_blocks(1000, 1000, torch.Generator(device="cuda").manual_seed(1))
    for kv_heads, causal in ((OPTION_HEADS, False), (OPTION_HEADS, True), (2, True)):
        q, k, v, do = _option_leaves(1000, 128, 128, kv_heads=kv_heads)
        kgen.attention(q, k, v, is_causal=causal, enable_gqa=kv_heads != OPTION_HEADS,
                       block_mask=masks[causal]).backward(do)
    torch.cuda.synchronize()
    print("once: done")


def main(argv=None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if "--mods" in argv:  # kgen/harness/attention_bwd_mods.py
        from kgen.harness.attention_bwd_mods import main as mods_main

        mods_main([a for a in argv if a != "--mods"])
        return
    if "--gqa-paths" in argv:  # GQA's backward: the MHA program on repeated K, V or its own
        gqa_paths(4096)
        return
    if "--options" in argv:  # the value head dims and the block mask (--once: one call each)
        if "--once" in argv:
            options_once()
        else:
            value_dims(4096)
            block_masks(4096, "--no-flex" not in argv)
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--d", type=int, nargs="+", default=None)
    parser.add_argument("--s", type=int, nargs="+", default=None, help="lengths S = T")
    parser.add_argument("--arch", default=None, help="--once: sm_80 or sm_90a (the device's)")
    parser.add_argument("--gqa", type=int, default=None, metavar="HKV",
                        help="--once: GQA, K and V of HKV heads (Q of 4)")
    parser.add_argument("--deterministic", action="store_true",
                        help="--once: 'reductions deterministic' (dQ's adds ordered)")
    parser.add_argument("--groups", action="store_true",
                        help="MHA against GQA 16/2, default against deterministic (D 128)")
    parser.add_argument("--gqa-schedules", nargs="+", default=(),
                        help="--groups: GQA schedules (names as schedule() reads them, e.g. "
                             "gqa8: the schedule before the fast body, the longest first and "
                             "the staged vectors) timed beside the default GQA build")
    parser.add_argument("--variants", nargs="*", default=None,
                        help="time the wgmma skeleton's schedules (names as schedule() reads "
                             "them; none: SCHEDULES, and CAUSAL_SCHEDULES when causal)")
    parser.add_argument("--schedule", default=None, help="--once: a schedule (see schedule())")
    parser.add_argument("--mma-layouts", action="store_true",
                        help="the sm_80 build's warp rows against its warp grid (and SDPA's "
                             "flash backend), outputs compared, then timed (--d, --s)")
    args = parser.parse_args(argv)
    if args.mma_layouts:
        rows = mma_layouts(tuple(args.d or (64, 128)), tuple(args.s or (1024, 4096)))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    if args.variants is not None:
        variants_table(tuple(args.d or (64, 128)), tuple(args.s or (4096,)),
                       list(args.variants or SCHEDULES))
        return
    if args.once:
        for d in args.d or (64,):
            once(ir.Arch(args.arch) if args.arch else None, d, args.gqa, args.deterministic,
                 args.schedule)
        return
    if args.groups:
        rows = groups((args.d or (128,))[0], tuple(args.s or (4096, 16384)),
                      gqa_schedules=tuple(args.gqa_schedules))
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    table(args.json, tuple(args.d or (64, 128)), tuple(args.s or (1024, 4096)))


if __name__ == "__main__":
    main()
