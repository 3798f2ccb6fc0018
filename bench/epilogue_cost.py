"""Where a fused epilogue's time goes on sm_90a (issue 15's C target), on an H100/H200.

The cooperative 128x256 s3 kernel (the plan of examples/gemm_bias_relu.kg for sm_90a) under
epilogues that add one piece at a time to `D = acc`: a scalar, relu, a staged column vector,
the same vector read from global memory (Schedule value `staged_vectors = ()`), a staged C, and
the whole `relu(alpha*acc + beta*C + bias[col])`. Every kernel is checked against a float32
reference with its outputs poisoned, then all of them and torch.matmul are timed in turn,
`--rounds` times (CUDA events, median of 30, inputs rotated past L2); each figure is the
fastest round. The differences between rows place the epilogue's cost.

    bash .gpu/device-run.sh python3 bench/epilogue_cost.py [--sizes 8192,8192,8192 ...] [--json OUT]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from hopper_gemm import PEAK_TFLOPS, alloc, check, make_inputs  # noqa: E402

HEAD = """\
kernel {name} {{
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor C : f16[M, N] row
  tensor D : f16[M, N] row out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  scalar beta : f32 = 0.5
  gemm g = A @ B accumulate f32 {{
    tile 128x256x64  warps 2x4  stages 3
    epilogue {{ D = {expr} }}
  }}
}}
"""

# (label, epilogue, float32 reference of (A @ B) as `acc`, the GemmSchedule fields changed)
C_REF = lambda acc, C, bias: acc + 0.5 * C  # noqa: E731
FULL = "relu(alpha * acc + beta * C + bias[col])"
FULL_REF = lambda acc, C, bias: (1.5 * acc + 0.5 * C + bias).relu()  # noqa: E731
EPILOGUES = [
    ("bare", "acc", lambda acc, C, bias: acc, {}),
    ("alpha", "alpha * acc", lambda acc, C, bias: 1.5 * acc, {}),
    ("relu", "relu(acc)", lambda acc, C, bias: acc.relu(), {}),
    ("bias staged", "acc + bias[col]", lambda acc, C, bias: acc + bias, {}),
    ("bias global", "acc + bias[col]", lambda acc, C, bias: acc + bias, dict(staged_vectors=())),
    ("C", "acc + beta * C", C_REF, {}),
    ("full", FULL, FULL_REF, {}),
]


def kernel_of(label: str, expr: str, ir, parse):
    """The kernel of one epilogue, its unused inputs dropped (a tensor nothing reads is refused)."""
    name = "ep_" + "".join(ch if ch.isalnum() else "_" for ch in label)
    kernel = parse(HEAD.format(name=name, expr=expr), f"{name}.kg").kernels[0]
    used = {"A", "B", "D"} | {p for p in ("C", "bias", "alpha", "beta")
                                   if p in expr.replace("bias[col]", "bias")}
    kernel = dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))
    return dataclasses.replace(kernel, target=ir.Arch.SM90A)


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.lower import lower
    from kgen.parse import parse

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["8192,8192,8192", "4096,4096,4096"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", default=None)
    parser.add_argument("--profile", action="store_true",
                        help="launch each kernel once at the first size, untimed (for ncu)")
    opts = parser.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    stream = torch.cuda.current_stream().cuda_stream
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)

    compiled = {}
    for label, expr, _, fields in EPILOGUES:
        kernel = kernel_of(label, expr, ir, parse)
        plan = lower(kernel).with_gemm_schedule(**fields)
        g = plan.schedule.gemms[0]
        made = dict(source_name="bench.kg", source_hash="", command="bench/epilogue_cost.py")
        built = Built(kernel, plan, emit(plan, **made), emit_header(plan, **made))
        compiled[label] = (kernel, kgen.api.load_built(built))
        print(f"{label:18s} {expr:42s} staged input {g.staged_input} vectors "
              f"{g.staged_vectors} {fields}")

    rows = []
    for text in opts.sizes:
        m, n, k = (int(x) for x in text.split(","))
        sizes = dict(M=m, N=n, K=k)
        flops = 2 * m * n * k
        set_bytes = 2 * (m * k + n * k + 2 * m * n)
        full = compiled["full"][0]
        sets = [make_inputs(torch, full, sizes)
                for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
        runs = {}
        for label, expr, reference, _ in EPILOGUES:
            kernel, c = compiled[label]
            names = {p.name for p in kernel.params}
            args = [{q: s[q] for q in s if q in names} for s in sets]

            def ref(reference=reference, **a):
                acc = a["A"].float() @ a["B"].float()
                return reference(acc, a["C"].float() if "C" in a else None,
                                 a["bias"] if "bias" in a else None)

            err = check(torch, c, kernel, args[0], ref)
            outs = [{q.name: alloc(torch, q, sizes) for q in kernel.params
                     if q.role is ir.Role.OUT} for _ in sets]
            runs[label] = ([c.bind(**a, **o) for a, o in zip(args, outs)], c, err)

        if opts.profile:
            for label, (bound, c, _) in runs.items():
                c.launch(bound[0], stream)
            torch.cuda.synchronize()
            return 0

        def timed(fn):
            return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                               stream=stream).median_ms

        times = {label: [] for label in ["matmul", *runs]}
        for _ in range(opts.rounds):  # in turn: drift hits every row alike
            times["matmul"].append(timed(lambda i: torch.matmul(
                sets[i % len(sets)]["A"], sets[i % len(sets)]["B"])))
            for label, (bound, c, _) in runs.items():
                times[label].append(timed(lambda i: c.launch(bound[i % len(bound)], stream)))
        mm = min(times["matmul"])
        bare = min(times["bare"])
        print(f"\nf16 {m}x{n}x{k} | torch.matmul {mm:.4f} ms ({flops / mm / 1e9:.0f} TFLOP/s)")
        for label, ts in times.items():
            t = min(ts)
            err = runs[label][2] if label in runs else 0.0
            row = dict(shape=[m, n, k], variant=label, ms=t, samples=ts, matmul_ms=mm,
                       time_x_matmul=t / mm, over_bare_us=(t - bare) * 1e3,
                       peak_fraction=flops / t / 1e9 / PEAK_TFLOPS, rel_err=err)
            rows.append(row)
            print(f"  {label:18s} {t:.4f} ms ({', '.join(f'{x:.4f}' for x in ts)}) "
                  f"{row['time_x_matmul']:.3f}x matmul's time, {row['over_bare_us']:+7.1f} us over "
                  f"bare, {100 * row['peak_fraction']:.0f}% of peak; err {err:.1e}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=props.name, date=time.strftime(
            "%Y-%m-%d"), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
