"""Heavy EVTs (libdevice functions per element) on an H100/H200: the builder's default, the
cooperative 128x256 tile whose consumers run the epilogue with the tensor cores idle, against
ping-pong 128x128 (each consumer's epilogue under the other's mainloop) and the cooperative
128x192 tile, all Schedule values of one kernel text (its schedule lines). Also outputs that
leave as pairs from registers (two outputs, an f32 output), where the epilogue is longest.

Each kernel is checked against the float64 reference with its outputs poisoned (`kgen run`),
then the variants, torch.matmul and the unfused PyTorch are timed in turn, `--rounds` times
(CUDA events, median, inputs rotated past L2); each figure is the fastest round.

    bash .gpu/device-run.sh python3 bench/heavy_epilogues.py [--sizes 4096,4096,4096 ...]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

TEXT = """\
kernel {name} {{
  target sm_90a
  {head}
  tensor A : {dt}[M, K] row
  tensor B : {dt}[K, N] col
{tensors}  vector bias : f32[N]
  vector scale : f32[M]
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{
{body}
    }}
  }}
}}
"""
# (label, dtype, extra tensors, epilogue lines)
KERNELS = [
    ("relu(acc + bias[col]) (light)", "f16", ["D"], ["D = relu(acc + bias[col])"]),
    ("gelu(acc + bias[col])", "bf16", ["D"], ["D = gelu(acc + bias[col])"]),
    ("tanh(acc)", "f16", ["D"], ["D = tanh(acc)"]),
    ("silu(acc) * scale[row] + C", "f16", ["C", "D"], ["D = silu(acc) * scale[row] + C"]),
    ("gelu(acc) * scale[row] (example)", "bf16", ["D"], ["D = gelu(acc * scale[row])"]),
    ("Z, D = gelu(-z) * z (example)", "f16", ["Z", "D"],
     ["z = acc + bias[col] - scale[row]", "Z = z", "D = gelu(-z) * z"]),
    # outputs that leave as pairs from registers, light epilogues
    ("Z = acc, D = relu(acc + bias[col])", "f16", ["Z", "D"],
     ["Z = acc", "D = relu(acc + bias[col])"]),
    ("D = acc + bias[col], f32 out", "bf16", ["D:f32"], ["D = acc + bias[col]"]),
]
VARIANTS = {
    "default": ("", ""),
    "pingpong s4": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 4"),
    "pingpong s5": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 5"),
    "pingpong s6": ("schedule pingpong", "tile 128x128x64  warps 2x4  stages 6"),
    "coop 128x192 s4": ("", "tile 128x192x64  warps 2x4  stages 4"),
}


def kernel_of(label, dt, tensors, body, variant):
    import dataclasses

    from kgen.parse import parse

    head, lines = VARIANTS[variant]
    name = "heavy_" + "".join(ch for ch in label if ch.isalnum())[:16] + "_" + "".join(
        ch for ch in variant if ch.isalnum())
    decl = "".join(f"  tensor {t.split(':')[0]} : {(t.split(':') + [dt])[1]}[M, N] row"
                   f"{' out' if t != 'C' else ''}\n" for t in tensors)
    text = TEXT.format(name=name, head=head, dt=dt, tensors=decl, lines=lines,
                       body="\n".join(f"      {line}" for line in body))
    kernel = parse(text, f"{name}.kg").kernels[0]
    used = {"A", "B", *(t.split(":")[0] for t in tensors)} | {p for p in ("bias", "scale") if any(p in x for x in body)}
    return dataclasses.replace(kernel, params=tuple(p for p in kernel.params if p.name in used))


def main() -> int:
    import torch

    import kgen
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.harness.timing import rotation_count, time_kernel

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["4096,4096,4096", "8192,8192,4096"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kernels", nargs="*", default=None, help="labels (default all)")
    parser.add_argument("--variants", nargs="*", default=None, help="labels (default all)")
    parser.add_argument("--json", default=None)
    opts = parser.parse_args()
    if opts.variants:
        for v in [v for v in VARIANTS if v not in opts.variants]:
            del VARIANTS[v]
    props = torch.cuda.get_device_properties(0)
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)
    rows = []
    for label, dt, tensors, body in KERNELS:
        if opts.kernels and label not in opts.kernels:
            continue
        builts = {v: build(kernel_of(label, dt, tensors, body, v)) for v in VARIANTS}
        d = builts["default"].plan
        print(f"\n{label}: default {d.schedule.scheduler.kind.value} "
              f"{'x'.join(map(str, d.gemms[0].tile))} "
              f"s{d.gemms[0].stages}")
        for text in opts.sizes:
            m, n, k = (int(x) for x in text.split(","))
            sizes = dict(M=m, N=n, K=k)
            times = {v: [] for v in builts}
            unfused = []
            for r in range(opts.rounds):
                for v, b in builts.items():
                    report = run(b.kernel, b.plan, b.source, sizes, check=r == 0, bench=True)
                    if r == 0:
                        assert report.ok, (label, v, report.as_dict()["checks"])
                    times[v].append(report.timing.median_ms)
                    unfused.append(report.torch_timing.median_ms)
            a = torch.randn(m, k, device="cuda", dtype=torch.float16 if dt == "f16" else
                            torch.bfloat16)
            bm = torch.randn(k, n, device="cuda", dtype=a.dtype)
            rotate = rotation_count(2 * (m * k + k * n + m * n), props.L2_cache_size)
            sets = [(a.clone(), bm.clone()) for _ in range(max(2, rotate))]
            mm = min(time_kernel(lambda i: torch.matmul(*sets[i % len(sets)]), iters=30, warmup=5,
                                 rotate=rotate).median_ms for _ in range(opts.rounds))
            best_unfused = min(unfused)
            print(f"  {m}x{n}x{k}: torch.matmul {mm:.4f} ms, unfused PyTorch {best_unfused:.4f} ms")
            for v, ts in times.items():
                t = min(ts)
                rows.append(dict(kernel=label, variant=v, shape=[m, n, k], ms=t, samples=ts,
                                 matmul_ms=mm, unfused_ms=best_unfused))
                print(f"    {v:16s} {t:.4f} ms ({', '.join(f'{x:.4f}' for x in ts)}) "
                      f"{t / mm:.3f}x the matmul's time, {best_unfused / t:.3f}x unfused")
    if opts.json:
        Path(opts.json).write_text(json.dumps(dict(device=props.name, date=time.strftime(
            "%Y-%m-%d"), rows=rows), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
