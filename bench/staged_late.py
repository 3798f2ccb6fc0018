"""When the staged C's load issues (issue 15's C epilogue), on an H100/H200: the cooperative
kernel with C loaded into the output staging at the tile's start (the default until this
bench), or halfway through the tile's mainloop (GemmSchedule.staged_input_late), beside the
bare torch.matmul and the unfused PyTorch. The two are Schedule values of one plan; they are timed in turn, twice
each, on the same inputs (CUDA events, median of 30, rotated past L2), after a check against
a float32 reference with the outputs poisoned.

    bash .gpu/device-run.sh python3 bench/staged_late.py [--json OUT.json]
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

RESIDUAL = """\
kernel residual {
  target sm_90a
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor C : f16[M, N] row
  tensor D : f16[M, N] row out
  gemm g = A @ B accumulate f32 {
    epilogue { D = C + 0.5 * gelu(acc) }
  }
}
"""


def late(plan, halfway: bool = True):
    """The plan with its staged input issued halfway through each tile's mainloop (the
    default since this bench), or at the tile's start."""
    g = dataclasses.replace(plan.schedule.gemms[0], staged_input_late=halfway)
    return dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, gemms=(g,)))


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.lower import lower
    from kgen.parse import parse, parse_file

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    torch.manual_seed(0)
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    stream = torch.cuda.current_stream().cuda_stream
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    bias_relu = parse_file(ROOT / "examples/gemm_bias_relu.kg").kernels[0]
    residual = parse(RESIDUAL, "residual.kg").kernels[0]
    cases = [
        ("relu(alpha*acc+beta*C+bias)", bias_relu, (8192, 8192, 8192),
         lambda A, B, C, bias: torch.relu(1.5 * torch.matmul(A, B) + 0.5 * C + bias),
         lambda A, B, C, bias: torch.relu(1.5 * (A.float() @ B.float()) + 0.5 * C.float() + bias)),
        ("relu(alpha*acc+beta*C+bias)", bias_relu, (4096, 4096, 4096),
         lambda A, B, C, bias: torch.relu(1.5 * torch.matmul(A, B) + 0.5 * C + bias),
         lambda A, B, C, bias: torch.relu(1.5 * (A.float() @ B.float()) + 0.5 * C.float() + bias)),
        ("own: C + 0.5*gelu(acc)", residual, (6144, 5120, 3072),
         lambda A, B, C: C + 0.5 * torch.nn.functional.gelu(torch.matmul(A, B)),
         lambda A, B, C: C.float() + 0.5 * torch.nn.functional.gelu(A.float() @ B.float())),
        ("own: C + 0.5*gelu(acc)", residual, (8192, 8192, 1024),
         lambda A, B, C: C + 0.5 * torch.nn.functional.gelu(torch.matmul(A, B)),
         lambda A, B, C: C.float() + 0.5 * torch.nn.functional.gelu(A.float() @ B.float())),
    ]
    rows = []
    for tag, kernel, (m, n, k), unfused, reference in cases:
        sizes = dict(M=m, N=n, K=k)
        flops = 2 * m * n * k
        set_bytes = 2 * (m * k + n * k + 2 * m * n)
        sets = [make_inputs(torch, kernel, sizes)
                for _ in range(2 if set_bytes > l2 else rotation_count(set_bytes, l2))]
        plan = lower(dataclasses.replace(kernel, target=ir.Arch.SM90A))
        assert plan.schedule.gemms[0].staged_input == "C", plan.schedule.gemms[0]
        variants = {}
        for label, p in (("C at tile start", late(plan, False)), ("C halfway", late(plan))):
            made = dict(source_name="bench.kg", source_hash="", command="bench/staged_late.py")
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
        print(f"\n{tag} {m}x{n}x{k} | matmul {mm:.4f} ms | unfused {uf:.4f} ms")
        for label, ts in times.items():
            t = min(ts)
            row = dict(tag=tag, shape=[m, n, k], variant=label, ms=t, samples=ts, matmul_ms=mm,
                       unfused_ms=uf, time_x_matmul=t / mm, x_unfused=uf / t,
                       tflops=flops / t / 1e9, peak_fraction=flops / t / 1e9 / PEAK_TFLOPS,
                       rel_err=variants[label][2])
            rows.append(row)
            print(f"  {label:16s} {t:.4f} ms ({', '.join(f'{x:.4f}' for x in ts)}) time "
                  f"{row['time_x_matmul']:.3f}x the bare matmul, {row['x_unfused']:.2f}x unfused, "
                  f"{100 * row['peak_fraction']:.0f}% of peak; err {row['rel_err']:.1e}")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=props.name, date=time.strftime(
            "%Y-%m-%d"), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
