"""Ping-pong chains with one or two wgmma groups in flight in the first gemm's mainloop
(GemmSchedule.wgmma_in_flight), in one run.

For each chain (M = 81920, `relu(relu(A @ B0 * scale0 + bias0) @ B1)`, no schedule line), both
variants are emitted from the builder's plan with only that Schedule value changed, checked
against the float64 reference with their outputs poisoned, then timed in turn over `--rounds`
rounds (kgen's timer: CUDA events, median of 30, inputs rotated past L2); the faster round of
each is kept. Beside them: a device copy of the same bytes and the PyTorch chain.

The log in bench/logs/chain_variants/variants.log also has the first gemm's column vectors
staged in shared memory once per CTA (columns staged/1, staged/2): that ran at commit 7197e36,
whose next commit removed the staging (no gain).

    python3 bench/chain_variants.py [--rounds 2] [--shapes issue|own|all] [--dtypes f16,bf16]
                                    [--json OUT]
    python3 bench/chain_variants.py --once K0,N0,N1 --m 17 --variant 2  (one checked launch of
        one variant, f16: for compute-sanitizer)
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from b2b_bench import copy_ms, torch_chain_ms  # noqa: E402
from chain_ring import ISSUE, M, OWN, kernel, label  # noqa: E402

VARIANTS = ("1", "2")  # wgmma groups in flight


def variants(kern):
    """(name, plan, source) of the builder's plan with each number of groups in flight."""
    from kgen import ir
    from kgen.api import build
    from kgen.targets.sm90 import chain as sm90_chain

    plan = build(kern, ir.Arch.SM90A, source_name="chain.kg").plan
    first = plan.schedule.gemms[0]
    out = []
    for name in VARIANTS:
        g0 = dataclasses.replace(first, wgmma_in_flight=int(name))
        schedule = dataclasses.replace(plan.schedule, gemms=(g0,) + plan.schedule.gemms[1:])
        var = dataclasses.replace(plan, schedule=schedule)
        out.append((name, var, sm90_chain.emit(var, source_name="chain.kg", source_hash="",
                                               command="chain_variants.py")))
    return out


def timed(kern, rounds: int) -> tuple[dict[str, float], bool, str]:
    """Each variant's fastest median over `rounds` rounds in turn (checked in the first), whether
    every check passed, and the plan's label."""
    from kgen.harness.run import run

    runs, best, ok = variants(kern), {}, True
    for round_ in range(rounds):
        for name, plan, source in runs:
            report = run(kern, plan, source, {"M": M}, check=round_ == 0, bench=True,
                         compare_torch=False, iters=30)
            ok = ok and report.ok
            best[name] = min(best.get(name, 1e9), report.timing.median_ms)
    return best, ok, label(runs[0][1])


def main() -> int:
    import torch

    from kgen.harness.run import run

    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--shapes", choices=("issue", "own", "all"), default="all")
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--json")
    parser.add_argument("--once")
    parser.add_argument("--m", type=int, default=17)
    parser.add_argument("--variant", default="2")
    parser.add_argument("--example", action="append", default=[],
                        help="a .kg file instead of the shapes (its own schedule lines)")
    args = parser.parse_args()
    if args.example:
        return examples(args.example, args.rounds)
    if args.once:
        k0, n0, n1 = map(int, args.once.split(","))
        kern = kernel("f16", k0, n0, n1)
        (name, plan, source), = [v for v in variants(kern) if v[0] == args.variant]
        report = run(kern, plan, source, {"M": args.m}, check=True, bench=False,
                     compare_torch=False)
        print(f"{k0},{n0},{n1} M={args.m} {name} {label(plan)}: "
              f"{'checked' if report.ok else 'CHECK FAILED'}")
        return 0 if report.ok else 1
    shapes = {"issue": ISSUE, "own": OWN, "all": ISSUE + OWN}[args.shapes]
    names = list(VARIANTS)
    rows = []
    print(f"{'dtype':<5} {'K0':>5} {'N0':>4} {'N1':>4} {'schedule':<56} "
          + " ".join(f"{n:>9}" for n in names) + f" {'copy':>7} "
          + " ".join(f"{n + '/c':>10}" for n in names) + f" {'best x torch':>12}")
    for dtype in args.dtypes.split(","):
        tdtype = torch.float16 if dtype == "f16" else torch.bfloat16
        for k0, n0, n1 in shapes:
            kern = kernel(dtype, k0, n0, n1)
            best, ok, schedule = timed(kern, args.rounds)
            copy = copy_ms((M * k0 + M * n1) * 2)
            chain_ms = torch_chain_ms(tdtype, M, k0, n0, n1)
            row = dict(dtype=dtype, k0=k0, n0=n0, n1=n1, schedule=schedule, copy_ms=copy,
                       torch_ms=chain_ms, ok=ok, own=(k0, n0, n1) not in ISSUE,
                       ms={n: best.get(n) for n in names})
            rows.append(row)
            cells = [f"{best[n]:9.4f}" if n in best else f"{'-':>9}" for n in names]
            ratios = [f"{best[n] / copy:10.3f}" if n in best else f"{'-':>10}" for n in names]
            print(f"{dtype:<5} {k0:>5} {n0:>4} {n1:>4} {schedule:<56} " + " ".join(cells)
                  + f" {copy:7.4f} " + " ".join(ratios)
                  + f" {chain_ms / min(best.values()):11.2f}x" + (" own" if row["own"] else "")
                  + ("" if ok else "  CHECK FAILED"), flush=True)
    issue = [r for r in rows if not r["own"]]
    for n in names:
        have = [r for r in issue if r["ms"][n] is not None]
        if not have:
            continue
        within = sum(r["ms"][n] / r["copy_ms"] <= 1.2 for r in have)
        print(f"{n}: {within} of {len(have)} issue chains within 1.2x of the copy; lowest x "
              f"torch {min(r['torch_ms'] / r['ms'][n] for r in have):.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0 if all(r["ok"] for r in rows) else 1


def examples(paths: list[str], rounds: int) -> int:
    """Each example at M = 81920 with one and two groups in flight, in turn."""
    from kgen.parse import parse
    from kgen.verify import verify

    ok = True
    for path in paths:
        module = parse(Path(path).read_text(), Path(path).name)
        verify(module)
        kern = module.kernels[0]
        best, checked, _ = timed(kern, rounds)
        ok = ok and checked
        print(f"{Path(path).stem}: " + "  ".join(f"{n} in flight {best[n]:.4f} ms"
                                                 for n in VARIANTS)
              + f"  2/1 {best['2'] / best['1']:.3f}" + ("" if ok else "  CHECK FAILED"),
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
