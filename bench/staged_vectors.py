"""The epilogue's vectors staged in shared memory (EpilogueVectors, STAGED) on fused
epilogues, on an H100/H200: issue 15's targets (relu(alpha*acc + beta*C + bias[col]) at 8192^3,
the user's where(...) * scale[row] + bias[col]), issue 16's gelu(acc + bias[col]) and kernels of
my own, each as kgen plans it (kgen run's choice for the sizes) and as the same plan with the
Schedule value off (every vector read from global memory in the epilogue), beside the bare
torch.matmul and the unfused PyTorch. Timed in turn, twice each, on the same inputs (CUDA
events, median of 30, rotated past L2), after a check against a float32 reference with the
outputs poisoned.

    bash .gpu/device-run.sh python3 bench/staged_vectors.py [--json OUT.json]
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

from hopper_gemm import PEAK_TFLOPS, alloc, check, device_setup, make_inputs  # noqa: E402

KERNEL = """\
kernel {name} {{
  target sm_90a
  tensor A : {t}[M, K] row
  tensor B : {t}[K, N] col
  tensor D : {t}[M, N] row out
  vector scale : {t}[M]
  vector bias : f32[N]
  gemm g = A @ B accumulate f32 {{
    epilogue {{ D = {epilogue} }}
  }}
}}
"""
USER = "where(acc > 0.0, acc, 0.01 * acc) * scale[row] + bias[col]"  # issue 15's user's
GELU = "gelu(acc + bias[col])"  # issue 16's table
SILU = "silu(acc * scale[row] + bias[col])"  # my own


def vectors_off(plan):
    """The plan with every epilogue vector read from global memory (the Schedule value off)."""
    from kgen.plan import EpilogueVectors

    return plan.with_gemm_schedule(vectors=EpilogueVectors())


def main() -> int:
    import torch
    import torch.nn.functional as F

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.lower import builder, lower
    from kgen.parse import parse, parse_file
    from kgen.targets import target
    from kgen.plan import VectorHome

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    props, stream, l2 = device_setup(torch)

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    def mine(name, t, epilogue):
        return parse(KERNEL.format(name=name, t=t, epilogue=epilogue), f"{name}.kg").kernels[0]

    bias_relu = parse_file(ROOT / "examples/gemm_bias_relu.kg").kernels[0]
    relu_ref = (lambda A, B, C, bias: torch.relu(1.5 * (A.float() @ B.float()) + 0.5 * C.float()
                                                + bias))
    relu_unfused = lambda A, B, C, bias: torch.relu(1.5 * torch.matmul(A, B) + 0.5 * C + bias)
    user_ref = (lambda A, B, scale, bias: torch.where(
        (acc := A.float() @ B.float()) > 0, acc, 0.01 * acc) * scale.float()[:, None] + bias)

    def user_unfused(A, B, scale, bias):
        acc = torch.matmul(A, B)
        return torch.where(acc > 0, acc, 0.01 * acc) * scale[:, None] + bias

    gelu_ref = lambda A, B, scale, bias: F.gelu(A.float() @ B.float() + bias)
    gelu_unfused = lambda A, B, scale, bias: F.gelu(torch.matmul(A, B) + bias)
    silu_ref = lambda A, B, scale, bias: F.silu(
        (A.float() @ B.float()) * scale.float()[:, None] + bias)
    silu_unfused = lambda A, B, scale, bias: F.silu(torch.matmul(A, B) * scale[:, None] + bias)
    cases = [
        ("relu(alpha*acc+beta*C+bias[col]) f16", bias_relu, (8192, 8192, 8192), relu_unfused,
         relu_ref),
        ("relu(alpha*acc+beta*C+bias[col]) f16", bias_relu, (4096, 4096, 4096), relu_unfused,
         relu_ref),
        ("user: where(...)*scale[row]+bias[col] f16", mine("user_leaky", "f16", USER),
         (8192, 8192, 8192), user_unfused, user_ref),
        ("gelu(acc+bias[col]) f16", mine("bias_gelu", "f16", GELU), (4096, 11008, 4096),
         gelu_unfused, gelu_ref),
        ("gelu(acc+bias[col]) f16", mine("bias_gelu", "f16", GELU), (4096, 4096, 4096),
         gelu_unfused, gelu_ref),
        ("own: silu(acc*scale[row]+bias[col]) bf16", mine("rowscale_silu", "bf16", SILU),
         (6144, 5120, 3072), silu_unfused, silu_ref),
        ("own: where(...)*scale[row]+bias[col] bf16", mine("user_leaky16", "bf16", USER),
         (2048, 8192, 1024), user_unfused, user_ref),
    ]
    rows = []
    for tag, kernel, (m, n, k), unfused, reference in cases:
        sizes = dict(M=m, N=n, K=k)
        flops = 2 * m * n * k
        kernel = dataclasses.replace(kernel, target=ir.Arch.SM90A)
        set_bytes = 2 * (m * k + n * k + 2 * m * n)
        sets = [make_inputs(torch, kernel, sizes)
                for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
        config = builder.sized(kernel, target(ir.Arch.SM90A), sizes)
        plan = lower(kernel, config=config)
        g = plan.schedule.gemms[0]
        kind = f"{plan.schedule.scheduler.kind.value} {'x'.join(map(str, plan.gemms[0].tile))} " \
               f"s{plan.gemms[0].stages}"
        variants = {}
        for label, p in (("vectors staged", plan), ("vectors off", vectors_off(plan))):
            made = dict(source_name="bench.kg", source_hash="", command="bench/staged_vectors.py")
            built = Built(kernel, p, emit(p, **made), emit_header(p, **made))
            compiled = kgen.api.load_built(built)
            err = check(torch, compiled, kernel, sets[0], reference)
            outs = [{q.name: alloc(torch, q, sizes) for q in kernel.params
                     if q.role is ir.Role.OUT} for _ in sets]
            bound = [compiled.bind(**s, **o) for s, o in zip(sets, outs)]
            variants[label] = (compiled, bound, err)
        times = {label: [] for label in variants}
        base = {"matmul": [], "unfused": []}
        for _ in range(2):  # in turn, twice: drift hits both alike
            base["matmul"].append(timed(lambda i: torch.matmul(
                sets[i % len(sets)]["A"], sets[i % len(sets)]["B"]), set_bytes))
            base["unfused"].append(timed(lambda i: unfused(**sets[i % len(sets)]), set_bytes))
            for label, (compiled, bound, _) in variants.items():
                times[label].append(timed(lambda i: compiled.launch(bound[i % len(bound)], stream),
                                          set_bytes))
        mm, uf = min(base["matmul"]), min(base["unfused"])
        staged = ", ".join(g.vectors.held(VectorHome.STAGED)) or "none"
        print(f"\n{tag} {m}x{n}x{k} [{kind}; staged: {staged}]"
              f" | matmul {mm:.4f} ms | unfused {uf:.4f} ms")
        for label, ts in times.items():
            t = min(ts)
            row = dict(tag=tag, shape=[m, n, k], kind=kind, variant=label, ms=t, samples=ts,
                       matmul_ms=mm, unfused_ms=uf, time_x_matmul=t / mm, x_unfused=uf / t,
                       tflops=flops / t / 1e9, peak_fraction=flops / t / 1e9 / PEAK_TFLOPS,
                       rel_err=variants[label][2])
            rows.append(row)
            print(f"  {label:15s} {t:.4f} ms ({', '.join(f'{x:.4f}' for x in ts)}) time "
                  f"{row['time_x_matmul']:.3f}x the bare matmul, {row['x_unfused']:.2f}x unfused, "
                  f"{100 * row['peak_fraction']:.0f}% of peak; err {row['rel_err']:.1e}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=props.name, date=time.strftime(
            "%Y-%m-%d"), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
