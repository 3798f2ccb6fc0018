"""Issue 17 on a GPU: `kgen tune` against the hand-written schedules. For each one-gemm example
(the GEMMs and the EVT epilogues) with its schedule lines deleted, at each size and arch:

    hand     the example as checked in (its tile, warps, stages, split lines)
    builder  the example without its lines, as kgen's builder fills them (no tune entry)
    tuned    the same, after `kgen tune` (run as a command, <= 50 candidates, a cold cubin
             cache by default: its wall time is the whole command's)

All three are timed in one process on the same inputs (kgen/tune/measure.py: kgen run's harness,
CUDA events, the median, inputs rotated past L2), in alternation over --rounds rounds, after
each was checked against the reference with poisoned outputs. `tuned / hand` at most 1.00 is
the issue's "at least as fast"; the tune's wall time is bounded by 60 s.

    python3 bench/tune_bench.py [--arch sm_90a] [--example gemm] [--size M=..,N=..,K=..]
                                [--warm] [--json OUT.json]

Each case runs one `kgen tune` (up to a minute from a cold cubin cache): pick examples and
sizes with --example and --size to stay within a time limit.
"""
from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

EXAMPLES = ["gemm", "gemm_bias_relu", "gemm_gelu_rowscale", "evt_colsum", "evt_multi_output",
            "evt_residual", "evt_select", "evt_softmax_stats", "splitk_gelu"]
SIZES = ["M=4096,N=4096,K=4096", "M=8192,N=8192,K=512", "M=512,N=512,K=8192"]
_LINES = re.compile(r"^[ \t]*(tile|warps|stages|split|schedule|keep)\b[^\n]*\n", re.M)


def sizes_of(text: str) -> dict[str, int]:
    return {name: int(value) for name, value in (item.split("=") for item in text.split(","))}


def tune_command(path: Path, arch: str, sizes: str, limit: int, cold: bool) -> tuple[dict, float]:
    """`kgen tune` in its own process; its JSON and wall time."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    with tempfile.TemporaryDirectory() as cache:
        if cold:
            env["KGEN_CACHE_DIR"] = cache  # compile every candidate: the honest wall time
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "kgen", "tune", str(path), "--arch", arch,
                               "--size", sizes, "--limit", str(limit), "--no-cache", "--json"],
                              capture_output=True, text=True, env=env, check=False)
        seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise RuntimeError(f"kgen tune failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return json.loads(done.stdout), seconds


def main() -> int:
    import kgen
    from kgen import ir
    from kgen.api import build, load_built
    from kgen.parse import parse
    from kgen.tune.codec import config_from_json
    from kgen.tune.measure import GpuBench
    from kgen.verify import verify

    parser = argparse.ArgumentParser()
    parser.add_argument("--arch", action="append", choices=["sm_80", "sm_90a"], default=None)
    parser.add_argument("--size", action="append", default=None)
    parser.add_argument("--example", action="append", default=None)
    parser.add_argument("--limit", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iters", type=int, default=30)
    parser.add_argument("--warm", action="store_true", help="keep the cubin cache for the tune")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    rows = []
    header = (f"{'example':20s} {'arch':6s} {'sizes':22s} {'hand ms':>9s} {'builder':>9s} "
              f"{'tuned':>9s} {'tuned/hand':>10s} {'tune s':>7s} {'timed':>5s}  winner")
    print("kgen", kgen.__version__)
    with tempfile.TemporaryDirectory() as folder:
        for name in opts.example or EXAMPLES:
            text = (ROOT / "examples" / f"{name}.kg").read_text()
            hand_module = parse(text, f"{name}.kg")
            verify(hand_module)
            hand_kernel = hand_module.kernels[0]
            free_path = Path(folder) / f"{name}.kg"
            free_path.write_text(_LINES.sub("", text))
            free_module = parse(free_path.read_text(), str(free_path))
            verify(free_module)
            free_kernel = free_module.kernels[0]
            for arch in opts.arch or ["sm_90a"]:
                target = ir.Arch.from_name(arch)
                for size_text in opts.size or SIZES:
                    sizes = sizes_of(size_text)
                    tuned, tune_s = tune_command(free_path, arch, size_text, opts.limit,
                                                 not opts.warm)
                    config = config_from_json(tuned["winner"]["config"])
                    bench = GpuBench(free_kernel, sizes)
                    if not rows:
                        print("device", bench.device_name)
                        print(header)
                    variants = {"hand": build(hand_kernel, target),
                                "builder": build(free_kernel, target),
                                "tuned": build(free_kernel, target, config=config)}
                    loaded = {}
                    for label, built in variants.items():
                        loaded[label] = load_built(built)
                        passed, why = bench.check(_Candidate(built), loaded[label])
                        if not passed:
                            raise RuntimeError(f"{name} {label} failed its check: {why}")
                    samples = {label: [] for label in variants}
                    for _ in range(opts.rounds):
                        for label in variants:
                            samples[label] += bench.time(loaded[label], opts.iters).samples_ms
                    ms = {label: statistics.median(s) for label, s in samples.items()}
                    row = dict(example=name, arch=arch, sizes=sizes, **{f"{k}_ms": v
                               for k, v in ms.items()}, tuned_over_hand=ms["tuned"] / ms["hand"],
                               tune_s=tune_s, timed=tuned["timing"]["timed"],
                               candidates=len(tuned["candidates"]),
                               winner=tuned["winner"]["label"], device=bench.device_name)
                    rows.append(row)
                    print(f"{name:20s} {arch:6s} {size_text:22s} {ms['hand']:9.4f} "
                          f"{ms['builder']:9.4f} {ms['tuned']:9.4f} "
                          f"{row['tuned_over_hand']:10.3f} {tune_s:7.1f} {row['timed']:5d}  "
                          f"{row['winner']}", flush=True)
    slow = [r for r in rows if r["tuned_over_hand"] > 1.0]
    over = [r for r in rows if r["tune_s"] > 60]
    print(f"\n{len(rows)} cases: tuned at least as fast as hand in {len(rows) - len(slow)}; "
          f"tune within 60 s in {len(rows) - len(over)}; worst tuned/hand "
          f"{max(r['tuned_over_hand'] for r in rows):.3f}; slowest tune "
          f"{max(r['tune_s'] for r in rows):.1f} s")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


class _Candidate:
    """What GpuBench.check reads of a candidate: its plan and source."""

    def __init__(self, built):
        self.plan = built.plan
        self.source = built.source


if __name__ == "__main__":
    sys.exit(main())
