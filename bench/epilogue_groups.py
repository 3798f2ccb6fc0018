"""The epilogue's groups (EpilogueGroups, issue 15's compile time) on an H100/H200:
each heavy-EVT kernel as the builder plans it (its epilogue in a rolled loop over groups of 64
columns) against the same plan with one unrolled walk (epilogue_groups=1, a Schedule value)
and, where the epilogue does not run box by box, with 8 groups of 32 columns.

For each kernel and variant: NVRTC's time for the fast entry point alone (empty cache, fastest
of 3, this machine's CPU), then `kgen run` at each size: checked against the float64 reference
with the outputs poisoned, timed with the unfused PyTorch beside it (CUDA events, median, inputs
rotated past L2). The variants run in turn, `--rounds` times; each figure is the fastest round.

    bash .gpu/device-run.sh python3 bench/epilogue_groups.py [--sizes 4096,4096,4096 ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OWN = """\
kernel {name} {{
  target sm_90a
  tensor A : {dt}[M, K] row
  tensor B : {dt}[K, N] col
  tensor C : {dt}[M, N] row
  tensor D : {dt}[M, N] row out
  vector bias : f32[N]
  vector scale : f32[M]
  gemm g = A @ B accumulate f32 {{
    epilogue {{ D = {expr} }}
  }}
}}
"""
# (label, example file or (dtype, epilogue) of a kernel of my own with no schedule lines)
KERNELS = [
    ("gemm_gelu_rowscale", "examples/gemm_gelu_rowscale.kg"),
    ("evt_multi_output", "examples/evt_multi_output.kg"),
    ("evt_softmax_stats", "examples/evt_softmax_stats.kg"),
    ("own: gelu(acc + bias[col]) bf16", ("bf16", "gelu(acc + bias[col])")),
    ("own: silu(acc) * scale[row] + C f16", ("f16", "silu(acc) * scale[row] + C")),
    ("own: tanh(acc) f16", ("f16", "tanh(acc)")),
]


def kernel_of(label, what):
    from kgen import ir
    from kgen.parse import parse, parse_file

    if isinstance(what, str):
        kernel = parse_file(ROOT / what).kernels[0]
        return dataclasses.replace(kernel, target=ir.Arch.SM90A)
    dt, expr = what
    name = "grp_" + "".join(ch for ch in label if ch.isalnum())[:24]
    kernel = parse(OWN.format(name=name, dt=dt, expr=expr), f"{name}.kg").kernels[0]
    used = {"A", "B", "D"} | {p for p in ("C", "bias", "scale") if p in expr}
    return dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))


def with_groups(plan, groups):
    """The same plan with its epilogue in `groups` groups (1: one unrolled walk)."""
    from kgen.plan import EpilogueGroups

    return plan.with_gemm_schedule(
        groups=EpilogueGroups(groups, f"bench: {groups} groups"))


def compile_seconds(source, plan) -> float:
    from kgen.runtime.cache import CompileCache
    from kgen.runtime.nvrtc import compile_cubin, fast_entry_options

    runs = []
    for _ in range(3):
        cache = CompileCache(Path(tempfile.mkdtemp()))
        started = time.perf_counter()
        compile_cubin(source, plan.name, "sm_90a", cache=cache,
                      extra_options=fast_entry_options(plan.narrow_kernel))
        runs.append(time.perf_counter() - started)
    return min(runs)


def main() -> int:
    import torch

    import kgen
    from kgen.emit import emit
    from kgen.harness.run import run
    from kgen.lower import lower

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["4096,4096,4096", "8192,8192,4096"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    print("device", torch.cuda.get_device_name(0), "torch", torch.__version__,
          "kgen", kgen.__version__)
    made = dict(source_name="bench.kg", source_hash="", command="bench/epilogue_groups.py")
    rows = []
    for label, what in KERNELS:
        kernel = kernel_of(label, what)
        grouped = lower(kernel)
        g = grouped.schedule.gemms[0]
        variants = {f"{g.groups.count} groups": grouped, "unrolled": with_groups(grouped, 1)}
        # the epilogue tile's groups are its boxes; the others may be narrower
        if not g.staging.boxes:
            variants["8 groups"] = with_groups(grouped, 8)
        sources = {v: emit(p, **made) for v, p in variants.items()}
        seconds = {v: compile_seconds(sources[v], variants[v]) for v in variants}
        print(f"\n{label}: {grouped.schedule.scheduler.kind.value} "
              f"{'x'.join(map(str, grouped.gemms[0].tile))} s{g.pipeline.stages} "
              f"store {g.output.path.name} stages_d {g.staging.boxes}; NVRTC "
              + ", ".join(f"{v} {s:.2f} s" for v, s in seconds.items()))
        for text in opts.sizes:
            m, n, k = (int(x) for x in text.split(","))
            sizes = dict(M=m, N=n, K=k)
            times = {v: [] for v in variants}
            torch_ms = []
            for r in range(opts.rounds):
                for v, plan in variants.items():
                    report = run(kernel, plan, sources[v], sizes, check=r == 0, bench=True)
                    if r == 0:
                        assert report.ok, (label, v, report.as_dict()["checks"])
                    times[v].append(report.timing.median_ms)
                    torch_ms.append(report.torch_timing.median_ms)
            best_torch = min(torch_ms)
            print(f"  {m}x{n}x{k}: unfused PyTorch {best_torch:.4f} ms")
            for v, ts in times.items():
                t = min(ts)
                rows.append(dict(kernel=label, variant=v, shape=[m, n, k], ms=t, samples=ts,
                                 torch_ms=best_torch, x_unfused=best_torch / t,
                                 nvrtc_s=seconds[v]))
                print(f"    {v:9s} {t:.4f} ms ({', '.join(f'{x:.4f}' for x in ts)}) "
                      f"{best_torch / t:.3f}x unfused; NVRTC {seconds[v]:.2f} s")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=torch.cuda.get_device_name(0),
                                                   date=time.strftime("%Y-%m-%d"), rows=rows),
                                              indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
