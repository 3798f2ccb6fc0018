"""The call path: what a kgen kernel costs called from Python, next to torch.matmul.

    python3 bench/call_path.py [--quick] [--attention] [--json OUT.json]

1. Host time per call, small arguments (256^3 bf16): the microseconds a loop of calls spends
   per call on the host (no synchronization inside the loop), for torch.matmul(out=),
   torch.matmul, a kgen.load kernel with its output given and with it allocated, the torch op
   (kgen.torch_op), and a Triton matmul's launch.
2. The bf16 GEMM of a .kg with `target sm_90a` and no schedule lines (kgen's builder chooses)
   against torch.matmul at decode and prefill shapes: Llama-class weights (N x K) at M from 1 to
   8192 and a few odd shapes. Each is checked first against the float32 product (output
   poisoned with NaN). Reported: CUDA-event time around each call (what a user sees: the host
   cost shows wherever it exceeds the kernel's), median over rotated input sets past L2, and
   the device time alone (20 calls captured in a CUDA graph, replayed, per call).
3. `--attention`: the same two views of `kgen.attention` (bf16, 16 heads, D 128, causal and
   not) beside SDPA's cuDNN and flash backends: host time per call at S 128, then events
   around each call and CUDA-graph device time from S 128 (B 1) to S 4096 (B 4), each output
   checked first against a float32 SDPA.
The last lines: the ratio table, its geometric mean and the worst shape.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import tempfile
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import kgen  # noqa: E402

GEMM = """kernel gemm_bf16 {
  target sm_90a
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor D : bf16[M, N] row out
  gemm mma0 = A @ B accumulate f32 {
    epilogue { D = acc }
  }
}
"""
WEIGHTS = [(4096, 4096), (14336, 4096), (4096, 14336), (6144, 4096), (28672, 8192)]  # N x K
MS = [1, 16, 64, 2048, 8192]
ODD = [(7, 5000, 3000), (333, 12288, 4096), (1000, 1000, 1000), (8192, 8192, 8192)]
L2_BYTES = 60 << 20


def host_us(fn, n: int = 2000) -> float:
    """Host microseconds per call of a loop of `n` calls (after a warm-up)."""
    for _ in range(100):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / n * 1e6


def event_ms(fn, sets: int, iters: int) -> float:
    """Median CUDA-event time around each call, input sets rotated."""
    for i in range(5):
        fn(i % sets)
    torch.cuda.synchronize()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        starts[i].record()
        fn(i % sets)
        ends[i].record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def graph_ms(fn, sets: int, calls: int = 20, replays: int = 10) -> float:
    """Device time per call: `calls` calls captured in one CUDA graph, its replays timed."""
    fn(0)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            fn(i % sets)
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times)


def triton_matmul():
    """A small Triton matmul (for its launch cost), or None without Triton."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    @triton.jit
    def matmul(a, b, c, M, N, K, sam, sbk, scm, BLOCK: tl.constexpr):
        pm, pn = tl.program_id(0), tl.program_id(1)
        rm = pm * BLOCK + tl.arange(0, BLOCK)
        rn = pn * BLOCK + tl.arange(0, BLOCK)
        rk = tl.arange(0, BLOCK)
        acc = tl.zeros((BLOCK, BLOCK), dtype=tl.float32)
        for k in range(0, K, BLOCK):
            x = tl.load(a + rm[:, None] * sam + (k + rk)[None, :])
            y = tl.load(b + (k + rk)[:, None] + rn[None, :] * sbk)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * scm + rn[None, :], acc.to(tl.bfloat16))

    def run(a, b, c):
        m, k = a.shape
        n = b.shape[1]
        matmul[(m // 64, n // 64)](a, b, c, m, n, k, a.stride(0), b.stride(1), c.stride(0),
                                   BLOCK=64)

    return run


def inputs(m: int, n: int, k: int, sets: int, seed: int = 0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    out = []
    for _ in range(sets):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16, generator=g).t()  # [K, N] col
        out.append((a, b, torch.empty(m, n, device="cuda", dtype=torch.bfloat16)))
    return out


def schedule_of(kernel, sizes) -> str:
    """The tile and split the builder chose for these sizes."""
    plan = (kernel.variant(sizes) if hasattr(kernel, "variant") else kernel).plan
    s = plan.schedule.scheduler
    split = " stream-K" if s.stream_k else f" split {s.split_k}" if s.split_k > 1 else ""
    return f"{s.kind.value} {'x'.join(map(str, plan.gemms[0].tile))}{split}"


def host_section(kernel) -> dict:
    m = n = k = 256
    ((a, b, d),) = inputs(m, n, k, 1)
    d2 = torch.empty_like(d)
    op = kgen.torch_op(kernel, name="bench_call_path_gemm")
    rows = {
        "torch.matmul(out=)": host_us(lambda: torch.matmul(a, b, out=d2)),
        "torch.matmul": host_us(lambda: torch.matmul(a, b)),
        "kgen.load kernel, output given": host_us(lambda: kernel(A=a, B=b, D=d)),
        "kgen.load kernel, output allocated": host_us(lambda: kernel(A=a, B=b)),
        "kgen.torch_op": host_us(lambda: op(a, b)),
    }
    triton_run = triton_matmul()
    if triton_run is not None:
        rows["Triton matmul launch"] = host_us(lambda: triton_run(a, b, d2))
    return rows


def shape_section(kernel, shapes, quick: bool) -> list[dict]:
    results = []
    for m, n, k in shapes:
        set_bytes = 2 * (m * k + k * n + m * n)
        sets = max(1, min(8, math.ceil(2 * L2_BYTES / set_bytes)))
        data = inputs(m, n, k, sets, seed=m + n + k)
        a, b, d = data[0]
        d.fill_(float("nan"))
        kernel(A=a, B=b, D=d)
        ref = a.float() @ b.float()
        err = float((d.float() - ref).norm() / ref.norm())
        assert torch.isfinite(d).all() and err < 1e-2, (m, n, k, err)
        iters = 30 if quick else 100
        kgen_call = lambda i: kernel(A=data[i][0], B=data[i][1], D=data[i][2])  # noqa: E731
        torch_call = lambda i: torch.matmul(data[i][0], data[i][1], out=data[i][2])  # noqa: E731
        row = {"M": m, "N": n, "K": k, "err": err,
               "kgen_event_ms": event_ms(kgen_call, sets, iters),
               "torch_event_ms": event_ms(torch_call, sets, iters)}
        # once more each, interleaved, the faster median of the two kept
        row["kgen_event_ms"] = min(row["kgen_event_ms"], event_ms(kgen_call, sets, iters))
        row["torch_event_ms"] = min(row["torch_event_ms"], event_ms(torch_call, sets, iters))
        row["kgen_device_ms"] = graph_ms(kgen_call, sets)
        row["torch_device_ms"] = graph_ms(torch_call, sets)
        row["schedule"] = schedule_of(kernel, {"M": m, "N": n, "K": k})
        results.append(row)
        print(f"{m:5d} {n:6d} {k:6d}  event kgen {row['kgen_event_ms']*1e3:9.1f} us  torch "
              f"{row['torch_event_ms']*1e3:9.1f} us  x{row['torch_event_ms']/row['kgen_event_ms']:.2f}"
              f"   device kgen {row['kgen_device_ms']*1e3:9.1f} torch "
              f"{row['torch_device_ms']*1e3:9.1f}  x{row['torch_device_ms']/row['kgen_device_ms']:.2f}"
              f"  {row['schedule']}",
              flush=True)
        data = kgen_call = torch_call = None
    return results


def sdpa_backend(name: str):
    """A call of SDPA forced onto one backend ("cudnn", "flash")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[name]

    def call(q, k, v, causal):
        with sdpa_kernel(backend):
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

    return call


ATTENTION_SHAPES = [(1, 128), (1, 512), (1, 2048), (4, 4096)]  # (B, S); 16 heads, D 128


def attention_section(quick: bool) -> list[dict]:
    """kgen.attention's host time per call and its time per call at small to mid sizes."""
    callers = {"kgen": lambda q, k, v, c: kgen.attention(q, k, v, is_causal=c),
               "cudnn": sdpa_backend("cudnn"), "flash": sdpa_backend("flash")}
    rows = []
    for causal in (False, True):
        for b, s in ATTENTION_SHAPES[:2] if quick else ATTENTION_SHAPES:
            set_bytes = 4 * b * 16 * s * 128 * 2
            sets = max(1, min(8, math.ceil(2 * L2_BYTES / set_bytes)))
            g = torch.Generator(device="cuda").manual_seed(s + b)
            data = [tuple(torch.randn(b, 16, s, 128, device="cuda", dtype=torch.bfloat16,
                                      generator=g) for _ in range(3)) for _ in range(sets)]
            q, k, v = data[0]
            ref = torch.nn.functional.scaled_dot_product_attention(
                q.float(), k.float(), v.float(), is_causal=causal)
            row = {"B": b, "S": s, "causal": causal}
            for name, call in callers.items():
                out = call(q, k, v, causal)
                err = float((out.float() - ref).norm() / ref.norm())
                assert torch.isfinite(out).all() and err < 2e-2, (name, b, s, causal, err)
                fn = lambda i, call=call: call(*data[i], causal)  # noqa: E731
                if s == ATTENTION_SHAPES[0][1]:
                    row[f"{name}_host_us"] = host_us(lambda: fn(0), n=1000)
                row[f"{name}_event_ms"] = event_ms(fn, sets, 30 if quick else 100)
                row[f"{name}_device_ms"] = graph_ms(fn, sets)
            rows.append(row)
            host = "".join(f" {n} {row[n + '_host_us']:.1f}" for n in callers
                           if n + "_host_us" in row)
            print(f"B {b} S {s:5d} {'causal' if causal else 'full  '}"
                  + (f"  host us/call:{host}" if host else "")
                  + "  event us: " + " ".join(f"{n} {row[n + '_event_ms']*1e3:.1f}"
                                                for n in callers)
                  + "  device us: " + " ".join(f"{n} {row[n + '_device_ms']*1e3:.1f}"
                                                 for n in callers), flush=True)
            data = q = k = v = ref = None
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer shapes and iterations")
    parser.add_argument("--json", help="write every figure to this file")
    parser.add_argument("--attention", action="store_true",
                        help="only kgen.attention beside SDPA's cuDNN and flash backends")
    options = parser.parse_args()
    if options.attention:
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, kgen {kgen.__version__}")
        rows = attention_section(options.quick)
        if options.json:
            with open(options.json, "w") as f:
                json.dump({"gpu": torch.cuda.get_device_name(), "attention": rows}, f, indent=1)
        return
    path = os.path.join(tempfile.mkdtemp(), "gemm_bf16.kg")
    with open(path, "w") as f:
        f.write(GEMM)
    kernel = kgen.load(path)
    shapes = [(m, n, k) for n, k in WEIGHTS for m in MS] + ODD
    if options.quick:
        shapes = [(1, 4096, 4096), (16, 14336, 4096), (2048, 4096, 4096), (1000, 1000, 1000)]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, kgen {kgen.__version__}")
    hosts = host_section(kernel)
    rows = shape_section(kernel, shapes, options.quick)
    print("\nhost time per call (256^3 bf16, no sync in the loop):")
    base = hosts["torch.matmul(out=)"]
    for name, us in hosts.items():
        print(f"  {name:36s} {us:7.2f} us  {us / base:5.2f}x torch.matmul(out=)")
    ratios = [r["torch_event_ms"] / r["kgen_event_ms"] for r in rows]
    device = [r["torch_device_ms"] / r["kgen_device_ms"] for r in rows]
    geo = math.exp(statistics.fmean(math.log(x) for x in ratios))
    geo_device = math.exp(statistics.fmean(math.log(x) for x in device))
    worst = min(zip(ratios, rows), key=lambda t: t[0])
    print(f"\nbf16 GEMM, {len(rows)} shapes, speed vs torch.matmul (higher is faster): events "
          f"around each call geomean {geo:.3f}, min {worst[0]:.3f} at "
          f"{worst[1]['M']}x{worst[1]['N']}x{worst[1]['K']}; device time geomean "
          f"{geo_device:.3f}, min {min(device):.3f}")
    if options.json:
        with open(options.json, "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "host_us": hosts, "shapes": rows,
                       "geomean_event": geo, "geomean_device": geo_device}, f, indent=1)


if __name__ == "__main__":
    main()
