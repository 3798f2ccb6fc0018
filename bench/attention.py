"""Flash attention forward: kgen's loop kernel (written as a tile program, both targets' code:
kgen_sm80 the mma.sync skeleton, kgen_sm90a the sm_90a skeleton the rulebook picks, the
warp-specialized wgmma one; kgen_sm90a_tiled and kgen_sm90a_persistent the same kernel with each
tile scheduler, a plan option) beside torch SDPA's flash, cuDNN and memory-efficient backends.
The kernels are the programs kgen.attention writes for a positive scale: the maximum of the raw
scores and exp(scale * (x - m)), the scale declared `positive` (kgen.attention.Signature.raw_max;
`--scaled`: the scaled scores' maximum, scale * acc, instead), and the lazy reference maximum
whose rescale a warp skips where it stays, where kgen.attention writes it (sm_90a, D_v >= 256:
kgen.attention.lazy_maximum; `--eager`: the running maximum, rescaled every block, everywhere).
bf16, 16k tokens in all (batch = 16384 / S), head dims 64, 128 and 256, S = T in
{1024, 4096}, causal and not.
TFLOP/s = 4 * B * H * S * S * D / time, halved when causal; CUDA events, median of 30.

    python3 bench/attention.py            # prints a table (and --json FILE writes it)
    python3 bench/attention.py --long     # sm_90a at S 16384 and with GQA 8:1
    python3 bench/attention.py --sm90a --d 128   # sm_90a only (both schedulers), D 128
    python3 bench/attention.py --sm90a --o-registers   # and O stored from registers
    python3 bench/attention.py --long --tile 128x64x2   # a written tile instead of the rule's
    python3 bench/attention.py --variants 128x128x2 192x112x2 --d 64 --s 1024 4096
                                          # written tiles side by side (sm_90a), with spills
    python3 bench/attention.py --varlen   # packed documents vs padded-dense (bench/varlen.py)
    python3 bench/attention.py --varlen --bwd   # the same, the backward through autograd
    python3 bench/attention.py --mods     # kgen.attention's mods beside FlexAttention's (bench/mods.py)
    python3 bench/attention.py --bwd      # the backward beside SDPA's (bench/attention_bwd.py)
    python3 bench/attention.py --mods --once   # one call of each masked/biased mod (sanitizers)
    python3 bench/attention.py --mods --graph  # mods per call and replayed from a CUDA graph
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kgen import ir  # noqa: E402
from kgen.attention import lazy_maximum  # noqa: E402
from kgen.api import build_verified, load_built  # noqa: E402
from kgen.harness.timing import call_median_ms  # noqa: E402
from tests import loop_kernels as lk  # noqa: E402

HEADS = 16
TOKENS = 16384


def timed(fn, reps: int = 30) -> float:
    """Median milliseconds of `fn` over `reps` runs, after 3 warm-ups."""
    return call_median_ms(fn, reps)


def sdpa(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel
    gqa = k.shape[1] != q.shape[1]

    def run():
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                             enable_gqa=gqa)
    return run


def with_plan(built, plan):
    """The built sm_90a kernel with another plan (a plan option), its source emitted again."""
    from kgen.targets.sm90.loop import emit_loop

    source = emit_loop(plan, source_name="bench", source_hash="0", command="bench/attention.py")
    return dataclasses.replace(built, plan=plan, source=source)


def with_scheduler(built, persistent: bool):
    """The built sm_90a kernel with the tile scheduler `persistent` picks (plan.wgmma.scheduler,
    a plan value the rulebook sets; the bench times both)."""
    from kgen.targets.sm90.loop_schedule import with_scheduler as plan_with

    return with_plan(built, plan_with(built.plan, persistent))


def with_o_registers(built):
    """The tiled sm_90a kernel with O stored from registers by every thread (a plan option:
    loop_schedule.with_o_store; the rulebook stages it in Q's buffer for the copy engine)."""
    from kgen.targets.sm90.loop_schedule import with_o_store, with_scheduler as plan_with

    return with_plan(built, with_o_store(plan_with(built.plan, False), False))


def once() -> None:
    """One ragged causal GQA call of each target's kernel, and of sm_90a's with each tile
    scheduler (the persistent one on 5 CTAs, so each walks many tiles and its rings wrap) and
    with O stored from registers; the lazy maximum (its rescale voted on sm_90a)."""
    for arch in (ir.Arch.SM80, ir.Arch.SM90A):
        built = build_verified(lk.attention(128, causal=True, gqa=True, arch=arch, raw_max=True,
                                            lazy=True), arch)
        variants = {arch.value: built}
        if built.plan.wgmma is not None:
            variants = {f"{arch.value} tiled": with_scheduler(built, False),
                        f"{arch.value} persistent (5 CTAs)": with_scheduler(built, True),
                        f"{arch.value} tiled, O from registers": with_o_registers(built)}
        for name, variant in variants.items():
            run = load_built(variant)
            if variant.plan.wgmma is not None and variant.plan.wgmma.persistent:
                run.persistent_ctas = 5
            q = torch.randn(2, 8, 1000, 128, device="cuda").bfloat16()
            k, v = (torch.randn(2, 1, 4097, 128, device="cuda").bfloat16() for _ in range(2))
            o = torch.empty_like(q)
            lse = torch.empty(2, 8, 1000, device="cuda")
            run(Q=q, K=k, V=v, O=o, lse=lse)
            torch.cuda.synchronize()
            print(name, "ran; O finite:", bool(torch.isfinite(o).all()))


# the softmax on the raw scores (kgen.attention's program for a positive scale); --scaled: on
# scale * acc
RAW_MAX = True
LAZY = True  # kgen.attention's lazy reference maximum where it writes one; --eager: never


def kernels(d: int, causal: bool, kv_heads: int, archs, tile=None, o_registers=False) -> dict:
    """The built kernels of one row by column: each target's, and sm_90a's with each tile
    scheduler (kgen_sm90a_tiled, kgen_sm90a_persistent; the rulebook's pick is one of them);
    `tile` (rows, block, stages) written, else the rulebook's."""
    out = {}
    for arch in archs:
        written = dict(tile=tile[:2], stages=tile[2]) if tile else {}
        built = build_verified(lk.attention(d, causal=causal, gqa=kv_heads != HEADS, arch=arch,
                                            raw_max=RAW_MAX, **written,
                                            lazy=LAZY and lazy_maximum(arch.value, d)), arch)
        if built.plan.wgmma is None:
            out[f"kgen_{arch.value.replace('_', '')}"] = built
            continue
        out["kgen_sm90a_tiled"] = with_scheduler(built, False)
        out["kgen_sm90a_persistent"] = with_scheduler(built, True)
        out["kgen_sm90a"] = f"kgen_sm90a_{built.plan.wgmma.scheduler.value}"  # the pick's column
        if o_registers:
            out["kgen_sm90a_o_registers"] = with_o_registers(built)
    return out


def _compile(job) -> None:
    from kgen.runtime.nvrtc import compile_cubin
    compile_cubin(*job)


def compile_all(builts, arch: str) -> None:
    """NVRTC on every kernel at once, a process each (the cache keeps the cubins for
    load_built): the bench's compiles would otherwise take longer than its timing."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    jobs = list({(b.source, b.plan.name, arch) for b in builts})
    with ProcessPoolExecutor(max_workers=min(len(jobs), os.cpu_count() or 1),
                             mp_context=multiprocessing.get_context("spawn")) as pool:
        list(pool.map(_compile, jobs))


def measure(d: int, s: int, causal: bool, kv_heads: int, built: dict, backends) -> dict:
    """TFLOP/s of each of kgen's `built` kernels and of each SDPA backend, on the same fresh
    inputs: HEADS query heads, `kv_heads` key/value heads, batch TOKENS / s."""
    batch = TOKENS // s
    q = torch.randn(batch, HEADS, s, d, device="cuda").bfloat16()
    k, v = (torch.randn(batch, kv_heads, s, d, device="cuda").bfloat16() for _ in range(2))
    o = torch.empty_like(q)
    lse = torch.empty(batch, HEADS, s, device="cuda")
    flops = 4 * batch * HEADS * s * s * d / (2 if causal else 1)
    row = {"d": d, "s": s, "causal": causal, "kv_heads": kv_heads}
    for name, variant in built.items():
        if isinstance(variant, str):  # the column of the rulebook's pick
            continue
        run = load_built(variant)
        ms = timed(lambda: run(Q=q, K=k, V=v, O=o, lse=lse, scale=1.0 / math.sqrt(d)))
        row[name] = flops / ms / 1e9
    row.update({name: row[pick] for name, pick in built.items() if isinstance(pick, str)})
    for name, backend in backends.items():
        try:
            row[name] = flops / timed(sdpa(backend, q, k, v, causal)) / 1e9
        except RuntimeError as err:  # a backend this build or GPU lacks
            row[name] = None
            print(f"  {name}: {str(err).splitlines()[0]}")
    return row


def table(cases, archs, backends, json_path: str | None, tile=None, o_registers=False) -> None:
    """One row per (D, S, causal, KV heads) of `cases`, printed as it lands."""
    from kgen.runtime.device import device_info

    columns = [f"kgen_{a.value.replace('_', '')}" for a in archs]
    columns += [n for n in ("kgen_sm90a_tiled", "kgen_sm90a_persistent")
                + (("kgen_sm90a_o_registers",) if o_registers else ()) if ir.Arch.SM90A in archs]
    columns += list(backends)
    print(f"{torch.cuda.get_device_name()}, bf16, {TOKENS} tokens, {HEADS} query heads; "
          "TFLOP/s")
    written = dict(tile=tile[:2], stages=tile[2]) if tile else {}
    for d in sorted({c[0] for c in cases}):  # which skeleton each kgen column runs, and how
        if ir.Arch.SM80 in archs:
            plan = build_verified(lk.attention(d, arch=ir.Arch.SM80), ir.Arch.SM80).plan
            print(f"  kgen_sm80 at D {d}: {plan.config.value} "
                  f"({plan.tile_m // plan.warps} rows a warp), mma.sync")
        plan = build_verified(lk.attention(d, arch=ir.Arch.SM90A, **written), ir.Arch.SM90A).plan
        skeleton = ("warp-specialized wgmma; " + plan.wgmma.overlap.value
                    if plan.wgmma is not None else "mma.sync")
        print(f"  kgen_sm90a at D {d}: {plan.config.value}, {skeleton}")
    print("  (kgen_sm90a: the scheduler the rulebook picks per row; the two after it: each one)")
    built = {case: kernels(case[0], case[2], case[3], archs, tile, o_registers)
             for case in cases}
    compile_all([b for row in built.values() for b in row.values() if not isinstance(b, str)],
                device_info().arch)
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'heads':>6} " + " ".join(f"{n:>18}" for n in columns))
    rows = []
    for case in cases:
        d, s, causal, kv_heads = case
        row = measure(d, s, causal, kv_heads, built[case], backends)
        rows.append(row)
        cells = " ".join(f"{row[n]:18.1f}" if row.get(n) is not None else f"{'-':>18}"
                         for n in columns)
        print(f"{d:>4} {s:>6} {str(causal):>6} {f'{HEADS}/{kv_heads}':>6} {cells}")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def variants(dims, seqs, tiles, json_path: str | None, rounds: int = 2) -> None:
    """The sm_90a kernel with each written tile of `tiles` (rows, block, stages) side by side
    beside cuDNN, at each D of `dims`, S of `seqs`, causal and not (HEADS heads both); the
    rulebook's own pick named per D. Each point runs `rounds` times in turn, the fastest kept;
    NVRTC's registers and spills of each kernel printed first. A tile the rulebook refuses
    (or that leaves the wgmma skeleton) is a '-' with why."""
    from torch.nn.attention import SDPBackend

    from kgen.errors import KgenError
    from kgen.runtime.device import device_info
    from kgen.runtime.nvrtc import compile_cubin

    arch = device_info().arch
    names = ["x".join(map(str, t)) for t in tiles]
    built = {}
    for d in dims:
        rule = build_verified(lk.attention(d, arch=ir.Arch.SM90A), ir.Arch.SM90A).plan
        print(f"D {d}: the rulebook's {rule.config.value}")
        for causal in (False, True):
            for name, (m, n, stages) in zip(names, tiles):
                try:
                    b = build_verified(lk.attention(d, causal=causal, arch=ir.Arch.SM90A,
                                                    tile=(m, n), stages=stages,
                                                    raw_max=RAW_MAX,
                                                    lazy=LAZY and lazy_maximum("sm_90a", d)),
                                       ir.Arch.SM90A)
                except KgenError as err:
                    print(f"  {name} causal={causal}: refused: {str(err).splitlines()[0]}")
                    continue
                if b.plan.wgmma is None:
                    print(f"  {name} causal={causal}: mma.sync: {b.plan.mma.why}")
                    continue
                built[(d, causal, name)] = b
    compile_all(list(built.values()), arch)
    for (d, causal, name), b in built.items():
        r = compile_cubin(b.source, b.plan.name, arch)
        print(f"  D {d} {name} causal={causal}: {r.registers} registers, {r.spill_stores} B "
              f"spill stores, {r.spill_loads} B spill loads, stack {r.stack_bytes} B; "
              f"smem {b.plan.smem_bytes} B")
    backends = {"sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    print(f"{torch.cuda.get_device_name()}, bf16, {TOKENS} tokens, {HEADS} heads; TFLOP/s, "
          f"the best of {rounds} rounds")
    print(f"{'D':>4} {'S':>6} {'causal':>6} " + " ".join(f"{n:>10}" for n in names + ["cudnn"]))
    rows = []
    for d in dims:
        for s in seqs:
            for causal in (False, True):
                row = {}
                point = {n: built[(d, causal, n)] for n in names if (d, causal, n) in built}
                for _ in range(rounds):
                    got = measure(d, s, causal, HEADS, point, backends)
                    row.update({k: max(v, row.get(k) or 0.0) if isinstance(v, float) else v
                                for k, v in got.items()})
                rows.append(row)
                cells = " ".join(f"{row[n]:10.1f}" if row.get(n) else f"{'-':>10}"
                                 for n in names + ["sdpa_cudnn"])
                print(f"{d:>4} {s:>6} {str(causal):>6} {cells}")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def main() -> None:
    from bench.mods import MODS as mods_names

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--long", action="store_true",
                        help="the sm_90a kernel only, at S 16384 and with GQA 8:1 (16 query "
                             "heads, 2 KV heads) at S 4096, beside SDPA's flash and cuDNN")
    parser.add_argument("--once", action="store_true",
                        help="one ragged causal GQA call of each target's kernel, no timing "
                             "(for compute-sanitizer; with --varlen, the varlen kernel's)")
    parser.add_argument("--sm90a", action="store_true",
                        help="the sm_90a kernel only (both schedulers), beside SDPA's flash and "
                             "cuDNN")
    parser.add_argument("--tile", default=None,
                        help="ROWSxBLOCKxSTAGES written in the kernels (e.g. 128x80x2), else "
                             "the rulebook's")
    parser.add_argument("--variants", nargs="+", default=None, metavar="ROWSxBLOCKxSTAGES",
                        help="sm_90a kernels with each written tile side by side, beside cuDNN "
                             "(with --d and --s), NVRTC's spills of each printed")
    parser.add_argument("--s", type=int, nargs="+", default=None,
                        help="sequence lengths (default 1024 and 4096; with --variants too)")
    parser.add_argument("--o-registers", action="store_true",
                        help="a kgen_sm90a_o_registers column: the tiled kernel with O stored "
                             "from registers by every thread (a plan option; the rulebook stores "
                             "it by the copy engine)")
    parser.add_argument("--d", type=int, nargs="+", default=None,
                        help="head dims (default: 64, 128 and 256)")
    parser.add_argument("--varlen", action="store_true",
                        help="packed documents of random lengths in 16k tokens, D 128: kgen's "
                             "varlen kernel vs its padded-dense one (bench/varlen.py)")
    parser.add_argument("--mods", action="store_true",
                        help="kgen.attention's mods (softcap, ALiBi, window, document, bias) "
                             "beside torch.compile(flex_attention)'s, D 128 S 4096, causal and "
                             "not (bench/mods.py)")
    parser.add_argument("--gqa", action="store_true", help="with --mods: a GQA 16/2 row too")
    parser.add_argument("--bwd", action="store_true",
                        help="the backward: kgen's kernels beside SDPA's backends' backward "
                             "(bench/attention_bwd.py; with --once, its sanitizer call)")
    parser.add_argument("--only", nargs="+", default=None, choices=mods_names,
                        help="with --mods: these mods (and the plain kernel) only")
    parser.add_argument("--no-flex", action="store_true",
                        help="with --mods: kgen's kernels only (no torch.compile of Flex)")
    parser.add_argument("--graph", action="store_true",
                        help="with --mods: kgen's plain, document, bias and softcap kernels "
                             "per call and replayed from a CUDA graph (the GPU's time alone)")
    parser.add_argument("--scaled", action="store_true",
                        help="the kernels' softmax on the scaled scores (scale * acc) instead "
                             "of the raw maximum kgen.attention writes")
    parser.add_argument("--eager", action="store_true",
                        help="the kernels' running maximum, the accumulator rescaled every "
                             "block, instead of kgen.attention's lazy reference maximum")
    args = parser.parse_args()
    global RAW_MAX, LAZY
    RAW_MAX, LAZY = not args.scaled, not args.eager
    if args.bwd and args.varlen:  # the varlen backward against the padded dense one
        from bench import varlen

        rows = varlen.backward_table(timed)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    if args.bwd:
        from bench import attention_bwd

        if args.once:
            return attention_bwd.once()
        attention_bwd.table(args.json, tuple(args.d or (64, 128)))
        return
    if args.mods:
        from bench import mods

        if args.once:  # one bias-staged call (for compute-sanitizer)
            return mods.once()
        if args.graph:
            return mods.graph_table(timed)
        rows = mods.table(timed, args.gqa, flex=not args.no_flex, only=args.only)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    if args.varlen:
        from bench import varlen

        if args.once:
            return varlen.once()
        rows = varlen.table(timed)
        if args.json:
            Path(args.json).write_text(json.dumps(rows, indent=1))
        return
    if args.once:
        return once()
    if args.variants:
        tiles = [tuple(int(x) for x in v.split("x")) for v in args.variants]
        return variants(tuple(args.d or (64, 128)), tuple(args.s or (1024, 4096)), tiles,
                        args.json)
    from torch.nn.attention import SDPBackend

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    dims = tuple(args.d or (64, 128, 256))
    tile = tuple(int(x) for x in args.tile.split("x")) if args.tile else None
    if args.long:
        cases = [(d, 16384, c, HEADS) for d in dims for c in (False, True)]
        cases += [(d, 4096, c, 2) for d in dims if d == 128 for c in (False, True)]
        return table(cases, (ir.Arch.SM90A,), backends, args.json, tile, args.o_registers)
    if not args.sm90a:
        backends["sdpa_mem_efficient"] = SDPBackend.EFFICIENT_ATTENTION
    cases = [(d, s, c, HEADS) for d in dims for s in tuple(args.s or (1024, 4096))
             for c in (False, True)]
    table(cases, (ir.Arch.SM90A,) if args.sm90a else (ir.Arch.SM80, ir.Arch.SM90A), backends,
          args.json, tile, args.o_registers)


if __name__ == "__main__":
    main()
