"""A diagnostic, not a product path: where a ping-pong chain's launch spends its wall time,
read with %globaltimer (nanoseconds) in every CTA, for chains of the issue's table (M = 81920).

bench/prototypes/chain_clock.py summed each consumer's cycles per tile; those sums covered about
half of the launch's CUDA-event time. This probe records, per CTA and launch: its entry, the end
of the resident block (the consumers start their tiles), the producer's last fill issued, and each
consumer warpgroup's last tile done and its stores complete. The launches are timed as every
benchmark times them (kgen's timer: a hold kernel, then an event pair around each launch,
three input sets in turn past L2). Per timed launch: its event time against its span (first CTA
entry to last store), the time from its last store to the next launch's first entry, and the
tail (first CTA done to last). Beside them: the chain uninstrumented, a device copy of the
same bytes (and that copy at the bandwidth of a 1 GiB copy), and kernels that do nothing with
the chain's launch shape. The SM clock is read as clock64 ticks per globaltimer nanosecond.

The emitted source is edited (a measurement of the emitted code, not a variant worth keeping).

    bash .gpu/device-run.sh python3 bench/prototypes/chain_timeline.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_clock import once  # noqa: E402
from chain_ring import M, kernel, label  # noqa: E402
from hopper_gemm import alloc, make_inputs  # noqa: E402

WARMUP, ITERS = 5, 30  # kgen's timer: launches 0-4 warm up, 5-34 are the timed samples
LAUNCHES = WARMUP + ITERS
SLOTS = 8  # entry, resident loaded, producer done, consumer 0 done, 1 done, 0 stored, 1 stored, MHz
NAMES = ("entry", "resident loaded", "producer done", "consumer 0 done", "consumer 1 done",
         "consumer 0 stored", "consumer 1 stored")


def buffer_words(ctas: int) -> int:
    """The probe's buffer: LAUNCHES x ctas x SLOTS timer words, a launch index per CTA, then the
    entry counter."""
    return LAUNCHES * ctas * SLOTS + ctas + 1


def instrument(source: str, address: int, ctas: int) -> str:
    """The source with the timer reads added. Each CTA's thread 0 takes a ticket from the entry
    counter at entry; launches run in stream order, so ticket / gridDim.x is the launch index."""
    buf = f"reinterpret_cast<unsigned long long*>({address:#x}ULL)"
    slots = f"({buf} + {LAUNCHES * ctas * SLOTS})"
    count = f"({buf} + {LAUNCHES * ctas * SLOTS + ctas})"
    helper = (
        "__device__ __forceinline__ unsigned long long kgen_probe_now() {\n"
        "  unsigned long long t;\n"
        "  asm volatile(\"mov.u64 %0, %globaltimer;\" : \"=l\"(t));\n"
        "  return t;\n"
        "}\n"
        "__device__ __forceinline__ unsigned long long* kgen_probe_row(unsigned long long launch) {\n"
        f"  return {buf} + ((launch % {LAUNCHES}) * {ctas} + blockIdx.x) * {SLOTS};\n"
        "}\n")
    source = once(source, "extern \"C\" __global__ void __launch_bounds__",
                  helper + "extern \"C\" __global__ void __launch_bounds__")
    source = once(source, "  const int M = p.M;\n",
                  "  const int M = p.M;\n"
                  "  if (threadIdx.x == 0) {\n"
                  "    const unsigned long long now = kgen_probe_now(), ticks = clock64();\n"
                  f"    const unsigned long long launch = atomicAdd({count}, 1ull) / gridDim.x;\n"
                  f"    {slots}[blockIdx.x] = launch;\n"
                  "    kgen_probe_row(launch)[0] = now;\n"
                  "    kgen_probe_row(launch)[7] = ticks;\n"
                  "  }\n")
    source = once(source, "  __syncthreads();  // the barriers are initialized\n",
                  "  __syncthreads();  // the barriers are initialized\n"
                  f"  unsigned long long* probe_row = kgen_probe_row(*(volatile unsigned long long*)({slots} + blockIdx.x));\n")
    source = once(source, "  const int warpgroup = warp_id / 4;\n",
                  "  if (tid == 0) probe_row[1] = kgen_probe_now();\n"
                  "  const int warpgroup = warp_id / 4;\n")
    source = once(source, "g0_cfg::produce_ring(p, maps, smem, tiles_m, tiles_n, full_bar, empty_bar, "
                  "tid - 2 * kWarpgroupThreads);\n",
                  "g0_cfg::produce_ring(p, maps, smem, tiles_m, tiles_n, full_bar, empty_bar, "
                  "tid - 2 * kWarpgroupThreads);\n"
                  "    if (tid == 2 * kWarpgroupThreads) probe_row[2] = kgen_probe_now();\n")
    end = "  if (tid % kWarpgroupThreads == 0) bulk_wait();  // this warpgroup's last stores are complete\n"
    if end not in source:  # stores from registers: done and stored are one time
        end = "#else\n  __trap();  // the compute_90 pass"
    source = once(source, end,
                  "  if (tid % kWarpgroupThreads == 0) probe_row[3 + warpgroup] = kgen_probe_now();\n"
                  + (end if "bulk_wait" in end else "") +
                  "  if (tid % kWarpgroupThreads == 0) {\n"
                  "    probe_row[5 + warpgroup] = kgen_probe_now();\n"
                  "    if (tid == 0) {\n"
                  "      const unsigned long long ticks = clock64() - probe_row[7];\n"
                  "      const unsigned long long ns = probe_row[5] - probe_row[0];\n"
                  "      probe_row[7] = ns ? 1000ull * ticks / ns : 0ull;  // MHz\n"
                  "    }\n"
                  "  }\n" + ("" if "bulk_wait" in end else end))
    return source


def summarize(rows, samples_ms) -> str:
    """rows: LAUNCHES x ctas x SLOTS nanoseconds (slot 7: the CTA's clock in MHz); samples_ms:
    the timer's event time of each timed launch (launch WARMUP + i)."""
    import numpy as np

    r = np.asarray(rows, dtype=np.float64)
    spans, over, gaps, tails = [], [], [], []
    for i, sample in enumerate(samples_ms):
        x = r[WARMUP + i]
        stored = x[:, 5:7].max(axis=1)
        span = (stored.max() - x[:, 0].min()) / 1e3
        spans.append(span)
        over.append(sample * 1e3 - span)
        tails.append((stored.max() - stored.min()) / 1e3)
        if WARMUP + i + 1 < LAUNCHES:
            gaps.append((r[WARMUP + i + 1][:, 0].min() - stored.max()) / 1e3)
    med = np.median
    out = [f"  timed launches: event time {med(samples_ms) * 1e3:6.2f} us, span (first CTA entry to "
           f"last store) {med(spans):6.2f} us, event - span {med(over):5.2f} us, last store to the "
           f"next launch's first entry {med(gaps):5.2f} us, tail (first CTA done to last) "
           f"{med(tails):5.2f} us (medians over {len(samples_ms)})"]
    x = r[WARMUP + ITERS // 2]
    rel = (x[:, :7] - x[:, 0].min()) / 1e3
    stored = rel[:, 5:7].max(axis=1)
    out.append(f"  launch {WARMUP + ITERS // 2}, microseconds from the first CTA's entry (min / median / max over CTAs):")
    for s, name in enumerate(NAMES):
        col = rel[:, s]
        out.append(f"    {name:18s} {col.min():7.2f} {med(col):7.2f} {col.max():7.2f}")
    load = rel[:, 1] - rel[:, 0]
    steady = stored - rel[:, 1]
    out.append(f"    resident phase     {load.min():7.2f} {med(load):7.2f} {load.max():7.2f}")
    out.append(f"    consumers' phase   {steady.min():7.2f} {med(steady):7.2f} {steady.max():7.2f}")
    mhz = x[:, 7]
    out.append(f"    SM clock (MHz)     {mhz.min():7.0f} {med(mhz):7.0f} {mhz.max():7.0f}")
    return "\n".join(out)


EMPTY = """\
extern "C" __global__ void __launch_bounds__(384, 1) kgen_empty(int* flag) {
  extern __shared__ unsigned char smem[];
  if (threadIdx.x == 0 && flag != nullptr && *flag == 12345) smem[0] = 1;
}
"""


def empty_ms(ctas: int, smem: int) -> float:
    """kgen's timer on a kernel that does nothing: `ctas` CTAs of 384 threads, `smem` bytes."""
    import ctypes

    from cuda.bindings import driver
    from cuda.core import ObjectCode

    from kgen.harness.timing import time_kernel
    from kgen.runtime.device import check, current_device_id, device_info
    from kgen.runtime.entries import allow_smem
    from kgen.runtime.nvrtc import compile_cubin

    import torch

    code = ObjectCode.from_cubin(compile_cubin(EMPTY, "kgen_empty", device_info(
        current_device_id()).arch).cubin, name="kgen_empty")
    function = check(driver.cuKernelGetFunction(code.get_kernel("kgen_empty").handle), "function")
    allow_smem(function, smem)
    flag = (ctypes.c_void_p * 1)(0)
    args = (ctypes.c_void_p * 1)(ctypes.addressof(flag))
    stream = int(torch.cuda.current_stream().cuda_stream)

    def launch(_):
        (err,) = driver.cuLaunchKernel(function, ctas, 1, 1, 384, 1, 1, smem, driver.CUstream(stream),
                                       ctypes.addressof(args), 0)
        check((err,), "launching kgen_empty")

    return time_kernel(launch, warmup=WARMUP, iters=ITERS, stream=stream).median_ms


def main() -> int:
    import torch

    import kgen
    from b2b_bench import copy_bandwidth, copy_ms
    from kgen import ir
    from kgen.api import Built, build
    from kgen.emit import emit_header
    from kgen.harness.timing import time_kernel
    from kgen.lower import builder
    from kgen.targets import target

    torch.manual_seed(0)
    stream = int(torch.cuda.current_stream().cuda_stream)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print("device", torch.cuda.get_device_properties(0).name, "SMs", sms)
    bandwidth = copy_bandwidth()  # bytes per ms
    print(f"copy bandwidth (1 GiB copy): {bandwidth / 1e9:.3f} TB/s")
    for smem in (0, 222208):
        print(f"empty kernel, {sms} CTAs of 384 threads, {smem} B shared: "
              f"{empty_ms(sms, smem) * 1e3:.2f} us a launch (kgen's timer)")
    chains = ((256, 128, 64), (256, 128, 128), (256, 128, 256), (256, 64, 64), (256, 64, 256),
              (576, 64, 64), (576, 128, 128))
    for k0, n0, n1 in chains:
        kern = kernel("f16", k0, n0, n1)
        config = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
        built = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=config)
        tiles = -(-M // built.plan.gemms[0].tile[0])
        ctas = min(tiles, sms)
        buf = torch.zeros(buffer_words(ctas), dtype=torch.int64, device="cuda")
        made = dict(source_name="chain.kg", source_hash="", command="chain_timeline.py")
        probed = kgen.api.load_built(Built(kern, built.plan, instrument(built.source, buf.data_ptr(), ctas),
                                           emit_header(built.plan, **made)))
        plain = kgen.api.load_built(Built(kern, built.plan, built.source, emit_header(built.plan, **made)))
        sizes = dict(M=M, K=k0)
        sets = [(make_inputs(torch, kern, sizes),
                 {q.name: alloc(torch, q, sizes) for q in kern.params if q.role is ir.Role.OUT})
                for _ in range(3)]  # rotated past L2
        timing = {}
        for name, compiled in (("plain", plain), ("probed", probed)):
            bounds = [compiled.bind(**args, **outs) for args, outs in sets]
            buf.zero_()
            torch.cuda.synchronize()
            timing[name] = time_kernel(lambda i, c=compiled, b=bounds: c.launch(b[i], stream),
                                       warmup=WARMUP, iters=ITERS, rotate=len(bounds), stream=stream)
        torch.cuda.synchronize()
        rows = buf[:LAUNCHES * ctas * SLOTS].view(LAUNCHES, ctas, SLOTS).cpu().numpy()
        total = 2 * M * (k0 + n1)
        copy = copy_ms(total)
        print(f"\nf16 K0={k0} N0={n0} N1={n1} [{label(built.plan)}], {ctas} CTAs, {tiles} tiles: "
              f"kgen's timer {timing['plain'].median_ms * 1e3:.2f} us ({timing['probed'].median_ms * 1e3:.2f} "
              f"probed); copy of the same bytes {copy * 1e3:.2f} us (at the 1 GiB copy's bandwidth "
              f"{total / bandwidth * 1e3:.2f} us)")
        print(summarize(rows, timing["probed"].samples_ms), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
