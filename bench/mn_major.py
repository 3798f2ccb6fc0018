"""MN-major operands on the sm_90a warp-specialized GEMM, on an H100/H200, in one process: for
f16 and bf16 at 4096^3 and 8192^3, each layout combination (A row- or column-major, B column- or
row-major) of kgen's cooperative (128x256x64, 3 stages) and ping-pong (128x128x64, 5 stages)
kernels beside torch.matmul on the same storage (A @ B with B a contiguous [K, N] tensor for a
row-major B, A the transpose of a contiguous [K, M] one for a column-major A) and beside kgen's
K-major kernel (A row-major, B column-major) of the same schedule. Method (METHOD.md): CUDA
events around each run, the median of 30 after 5 warm-up runs, input sets rotated past L2; every
kgen kernel first checked against a float32 PyTorch reference (TF32 off) with its output
poisoned (NaN).

    bash .gpu/device-run.sh python3 bench/mn_major.py [--json OUT.json] [--quick]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

PEAK_TFLOPS = 989.0  # dense f16/bf16 on an H100/H200 SXM


def main() -> int:
    import torch

    import kgen
    from kgen.harness.timing import rotation_count, time_kernel
    from tests.gpu.test_mn_major_gpu import KINDS, LAYOUTS, kernel, operand

    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--quick", action="store_true")
    opts = parser.parse_args()
    torch.manual_seed(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    props = torch.cuda.get_device_properties(0)
    l2 = props.L2_cache_size
    print("device", props.name, "torch", torch.__version__, "kgen", kgen.__version__)
    stream = torch.cuda.current_stream().cuda_stream
    rows = []
    loaded = {}

    def timed(fn, set_bytes):
        return time_kernel(fn, iters=30, warmup=5, rotate=rotation_count(set_bytes, l2),
                           stream=stream).median_ms

    sizes = [4096] if opts.quick else [4096, 8192]
    for dtype in ("bf16", "f16"):
        tdtype = {"f16": torch.float16, "bf16": torch.bfloat16}[dtype]
        for size in sizes:
            m = n = k = size
            flops = 2 * m * n * k
            set_bytes = 2 * (m * k + n * k + m * n)
            nsets = 2 if set_bytes > l2 else rotation_count(set_bytes, l2)
            k_major_ms = {}
            for layouts, (a_layout, b_layout) in LAYOUTS.items():
                sets = [(operand(torch, m, k, a_layout, tdtype, scale=k ** -0.5),
                         operand(torch, k, n, b_layout, tdtype)) for _ in range(nsets)]
                outs = [torch.empty(m, n, device="cuda", dtype=tdtype) for _ in sets]
                torch_ms = timed(lambda i: torch.matmul(*sets[i % nsets], out=outs[i % nsets]),
                                 set_bytes)
                print(f"\n{dtype} {m}x{n}x{k} {layouts}: torch.matmul {torch_ms:.4f} ms "
                      f"({flops / torch_ms / 1e9:.0f} TFLOP/s)")
                want = sets[0][0].float() @ sets[0][1].float()
                for kind in KINDS:
                    key = (layouts, kind, dtype)
                    if key not in loaded:
                        started = time.perf_counter()
                        loaded[key] = (kgen.load(kernel(*key), "sm_90a", tuned=False),
                                       time.perf_counter() - started)
                    compiled, compile_s = loaded[key]
                    d = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
                    compiled(A=sets[0][0], B=sets[0][1], D=d)
                    torch.cuda.synchronize()
                    err = (float("inf") if not torch.isfinite(d).all()
                           else float((d.float() - want).norm() / want.norm()))
                    bound = [compiled.bind(A=a, B=b, D=o) for (a, b), o in zip(sets, outs)]
                    assert not any(bool(x.narrow) for x in bound), "the fast entry point"
                    ms = timed(lambda i: compiled.launch(bound[i % nsets], stream), set_bytes)
                    if layouts == "a_row_b_col":
                        k_major_ms[kind] = ms
                    s = compiled.plan.schedule
                    row = dict(dtype=dtype, shape=[m, n, k], layouts=layouts, kind=kind,
                               a_mn_major=s.gemms[0].a.mn_major, b_mn_major=s.gemms[0].b.mn_major,
                               ms=ms, tflops=flops / ms / 1e9,
                               peak_fraction=flops / ms / 1e9 / PEAK_TFLOPS, rel_err=err,
                               torch_matmul_ms=torch_ms, vs_matmul=torch_ms / ms,
                               k_major_ms=k_major_ms.get(kind),
                               vs_k_major=k_major_ms[kind] / ms if kind in k_major_ms else None,
                               store=s.gemms[0].store.value, compile_s=compile_s)
                    rows.append(row)
                    print(f"  {kind:12s} {ms:.4f} ms {row['tflops']:5.0f} TFLOP/s "
                          f"({100 * row['peak_fraction']:.0f}% of peak) "
                          f"{row['vs_matmul']:.3f}x matmul, "
                          f"{row['vs_k_major']:.3f}x kgen K-major; err {err:.1e}; "
                          f"A {'MN' if row['a_mn_major'] else 'K'}-major, "
                          f"B {'MN' if row['b_mn_major'] else 'K'}-major")
                    if not err < 1e-2:
                        print("  ^ WRONG RESULT")
    if opts.json:
        Path(opts.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
