"""B2B chains with no schedule line on sm_90a: the ping-pong chain with a ring shorter than the
first gemm's k tiles (the consumers take turns) and with B0 streamed through the ring, against
the configurations the builder took before (bench/RESULTS.md, section 4).

For each chain (M = 81920, `relu(relu(A @ B0 * scale0 + bias0) @ B1)`), every configuration of
the builder's sm_90a list that plans is run in turn: checked against the float64 reference with
its output poisoned, then timed (CUDA events, median of 30, inputs rotated past L2). Beside
them: the PyTorch chain in the operand dtype and a device copy of the same bytes (A read, D1
written). `--table` runs only the builder's first choice, for both dtypes, over the issue's 12
shapes and this script's own.

    python3 bench/chain_ring.py [--table | --shapes issue|own|all | --one K0,N0,N1] [--json OUT]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from b2b_bench import copy_ms, torch_chain_ms  # noqa: E402
from tests.kernels import B2B_CHAIN  # noqa: E402

M = 81920
ISSUE = [(k0, n0, n1) for k0 in (256, 576) for n0 in (64, 128) for n1 in (64, 128, 256)]
# chains nothing was tuned on: a longer K0 (B0 resident no longer fits at N0 128), N0 96
OWN = [(1024, 128, 128), (1024, 64, 256), (2048, 64, 64), (768, 96, 128), (1536, 128, 64)]
# chains that did not plan before single-step chained k tiles and narrow B1 stages (N0 of 16
# mod 32, N1 under 16)
NEW = [(576, 48, 128), (576, 80, 8), (1024, 112, 64), (576, 144, 100), (768, 48, 256)]
KINDS = ("pingpong", "persistent")  # the sm_90a configurations probed (not the sm_80 chains)


def kernel(dtype: str, k0: int, n0: int, n1: int):
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


def chain_spec(spec: str) -> tuple[str, int, int, int]:
    """A probe's chain argument "dtype/K0/N0/N1" as (dtype, K0, N0, N1)."""
    dtype, k0, n0, n1 = spec.split("/")
    return dtype, int(k0), int(n0), int(n1)


def chain_copy_ms(k0: int, n1: int, m: int = M) -> float:
    """A device copy of a chain's bytes at m rows: reading A, writing D1 (16-bit elements)."""
    return copy_ms((m * k0 + m * n1) * 2)


def time_in_turn(kern, variants: dict, rounds: int, tag: str,
                 unchecked: frozenset = frozenset()) -> tuple[dict, bool]:
    """Each variant {name: (plan, source)} checked against the reference (outputs poisoned) in
    the first round, then all timed in turn for `rounds` rounds at M rows (kgen's timer: CUDA
    events, median of 30, inputs rotated past L2): {name: the fastest round's ms}, and whether
    every check passed. A failed check prints `tag` and the variant's name. The variants named
    in `unchecked` (diagnostics, wrong by design) are timed only."""
    from kgen.harness.run import run

    best, ok = {}, True
    for round_ in range(rounds):
        for name, (plan, text) in variants.items():
            checked = round_ == 0 and name not in unchecked
            report = run(kern, plan, text, {"M": M}, check=checked, bench=True,
                         compare_torch=False, iters=30)
            if checked and not report.ok:
                print(f"  {tag} {name}: CHECK FAILED", flush=True)
                ok = False
            best[name] = min(best.get(name, 1e9), report.timing.median_ms)
    return best, ok


def _compile(job):
    """One (source, kernel name, narrow entry) into the cubin cache (a worker of warm)."""
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    text, name, narrow = job
    result = compile_cubin(text, name, "sm_90a", extra_options=fast_entry_options(narrow))
    return result.spill_stores


def warm(jobs) -> None:
    """Compile every (source, kernel name, narrow entry) into the cubin cache, one process a
    core, so the timed runs find them there."""
    import concurrent.futures
    import multiprocessing
    import os

    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(os.cpu_count(), mp_context=context) as pool:
        list(pool.map(_compile, jobs))


def label(plan) -> str:
    s = plan.schedule
    text = " | ".join(f"{'x'.join(map(str, g.tile))} s{g.stages}" for g in plan.gemms)
    extra = (" B0 ring" if s.chain_ring_b else " resident" if s.resident else "")
    extra += " turns" if s.consumer_order else ""
    extra += " tma-out" if s.tma_output is not None else ""
    passes = s.gemms[-1].passes.count
    extra += f" {passes} passes" if passes > 1 else ""
    extra += " 2 in flight" if s.gemms[0].overlap.wgmma_groups > 1 else ""
    return f"{s.scheduler.kind.value} {text}{extra}"


def run_config(kern, config):
    """(plan, report) of `config` filled into the kernel, or None where it does not plan."""
    from kgen.api import build
    from kgen.errors import KgenError
    from kgen.harness.run import run

    from kgen import ir

    from kgen.plan import LoadPath

    try:
        built = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=config)
    except KgenError:
        return None
    plan = built.plan
    taken = [(g.tile, g.stages, s.pipeline.b.load is LoadPath.RESIDENT)
             for g, s in zip(plan.gemms, plan.schedule.gemms)]
    if taken != [(c.tile, c.stages, c.resident) for c in config.gemms]:
        return None  # the configuration did not plan: a later one of the list did
    report = run(built.kernel, built.plan, built.source, {"M": M}, check=True, bench=True,
                 compare_torch=False, iters=30)
    return built.plan, report


def probe(dtype: str, shapes, out: list) -> None:
    import torch

    from kgen.lower import builder
    from kgen.targets import target
    from kgen import ir

    tdtype = torch.float16 if dtype == "f16" else torch.bfloat16
    for k0, n0, n1 in shapes:
        kern = kernel(dtype, k0, n0, n1)
        chain_ms = torch_chain_ms(tdtype, M, k0, n0, n1)
        copy = copy_ms((M * k0 + M * n1) * 2)
        print(f"\n{dtype} K0={k0} N0={n0} N1={n1}: PyTorch chain {chain_ms:.4f} ms, copy "
              f"{copy:.4f} ms")
        first = True
        for config, _, _ in builder.listed(kern, target(ir.Arch.SM90A)):
            if config.schedule is not None and config.schedule.value not in KINDS:
                continue
            if config.schedule is None and config.gemms[0].tile[0] != 128:
                continue  # the sm_80 chains: not probed
            got = run_config(kern, config)
            if got is None:
                continue
            plan, report = got
            ms = report.timing.median_ms
            row = dict(dtype=dtype, k0=k0, n0=n0, n1=n1, schedule=label(plan), ms=ms,
                       ok=report.ok, builder=first, torch_ms=chain_ms, copy_ms=copy,
                       speedup=chain_ms / ms, copy_ratio=ms / copy,
                       spills=report.compile.get("spill_stores"))
            out.append(row)
            print(f"  {'*' if first else ' '} {row['schedule']:<58} {ms:8.4f} ms "
                  f"{row['speedup']:6.2f}x torch {row['copy_ratio']:5.2f}x copy"
                  + ("" if report.ok else "  CHECK FAILED"))
            first = False


def table(out: list, shapes) -> None:
    import torch

    from kgen.api import build
    from kgen.harness.run import run
    from kgen import ir

    print(f"\n{'dtype':<5} {'K0':>5} {'N0':>4} {'N1':>4} {'kgen choice':<58} {'ms':>8} "
          f"{'torch':>8} {'x torch':>8} {'copy':>8} {'/copy':>6}")
    for dtype in ("f16", "bf16"):
        tdtype = torch.float16 if dtype == "f16" else torch.bfloat16
        for k0, n0, n1 in shapes:
            built = build(kernel(dtype, k0, n0, n1), ir.Arch.SM90A, source_name="chain.kg")
            report = run(built.kernel, built.plan, built.source, {"M": M}, check=True,
                         bench=True, compare_torch=False, iters=30)
            chain_ms = torch_chain_ms(tdtype, M, k0, n0, n1)
            copy = copy_ms((M * k0 + M * n1) * 2)
            ms = report.timing.median_ms
            row = dict(dtype=dtype, k0=k0, n0=n0, n1=n1, schedule=label(built.plan), ms=ms,
                       ok=report.ok, torch_ms=chain_ms, copy_ms=copy, speedup=chain_ms / ms,
                       copy_ratio=ms / copy, own=(k0, n0, n1) not in ISSUE,
                       spills=report.compile.get("spill_stores"))
            out.append(row)
            print(f"{dtype:<5} {k0:>5} {n0:>4} {n1:>4} {row['schedule']:<58} {ms:8.4f} "
                  f"{chain_ms:8.4f} {row['speedup']:7.2f}x {copy:8.4f} {row['copy_ratio']:6.2f}"
                  + (" own" if row["own"] else "") + ("" if report.ok else "  CHECK FAILED"))
    issue = [r for r in out if (r["k0"], r["n0"], r["n1"]) in ISSUE]
    if issue:
        print(f"issue's 24: lowest x torch {min(r['speedup'] for r in issue):.2f} (target >= 2); "
              f"{sum(r['copy_ratio'] <= 1.2 for r in issue)} within 1.2x of the copy")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--table", action="store_true")
    parser.add_argument("--shapes", choices=["issue", "own", "all", "new"], default="all")
    parser.add_argument("--one", help="K0,N0,N1: probe this chain only (one process per chain "
                        "keeps a failed launch from ending the others)")
    parser.add_argument("--json")
    args = parser.parse_args()
    out: list = []
    shapes = {"issue": ISSUE, "own": OWN, "all": ISSUE + OWN, "new": NEW}[args.shapes]
    if args.table:
        table(out, shapes)
    else:
        if args.one:
            shapes = [tuple(int(v) for v in args.one.split(","))]
        probe("f16", shapes, out)
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
