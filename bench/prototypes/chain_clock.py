"""A diagnostic, not a product path: where the ping-pong chain's time goes, read with clock64()
in each consumer warpgroup's first thread and in the producer's thread, for the chains of
bench/prototypes/chain_staging_probe.py (M = 81920).

The emitted source is edited (a measurement of the emitted code, not a variant worth keeping).
Per tile, each consumer adds to a device buffer the cycles it spent: waiting for its turn,
waiting for the ring's full barriers inside g0's mainloop, the rest of that mainloop, g0's
epilogue (the A fragments of g1), g1's wgmma, and g1's epilogue and stores. The producer adds
its cycles waiting for empty slots and its whole time. The buffer's address is written into the
source as a constant (the same process and context as torch's).

    bash .gpu/device-run.sh python3 bench/prototypes/chain_clock.py
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_ring import M, kernel, label  # noqa: E402
from hopper_gemm import alloc, make_inputs  # noqa: E402

SLOTS = ("turn wait", "full waits", "g0 mainloop", "g0 epilogue", "g1 wgmma", "g1 epilogue",
         "tiles", "producer empty waits", "producer total", "producers",
         # the span: first entry and last exit (globaltimer ns), then per consumer warpgroup its
         # ns from entry to exit, ns from entry to its first tile, its loop's cycles and ns
         "first entry", "last exit", "consumer ns", "before the loop ns", "loop cycles",
         "loop ns", "consumers")


def once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def instrument(source: str, address: int) -> str:
    """The source with the clock reads added (see the module's docstring)."""
    clock = f"reinterpret_cast<unsigned long long*>({address:#x}ULL)"
    source = once(source, "    const int m0 = tile_m * g0_cfg::kTileM;\n\n    // g0's output",
                  "    const int m0 = tile_m * g0_cfg::kTileM;\n"
                  "    long long c0 = clock64(), c1 = 0, c2 = 0, c3 = 0, c4 = 0, cfull = 0;\n\n"
                  "    // g0's output")
    source = once(source, "      if (local > 0) mbarrier_wait(order_bar + 8 * warpgroup, ((local - 1) / 2) & 1);\n",
                  "      if (local > 0) mbarrier_wait(order_bar + 8 * warpgroup, ((local - 1) / 2) & 1);\n"
                  "      c1 = clock64();\n")
    source = once(source, "        mbarrier_wait(full_bar + 8 * slot, (fill / kStages) & 1);  // the producer's copies landed\n",
                  "        { const long long w = clock64();\n"
                  "        mbarrier_wait(full_bar + 8 * slot, (fill / kStages) & 1);  // the producer's copies landed\n"
                  "        cfull += clock64() - w; }\n")
    # the mainloop ends once its last wgmma group has completed: after the turn (one group in
    # flight) or after the last slot's release (two groups, GemmSchedule.wgmma_in_flight)
    last = ("      if (k_tiles > 0) mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));  "
            "// the last k tile's slot\n")
    if last not in source:
        last = ("      mbarrier_arrive(order_bar + 8 * (1 - warpgroup));  // the other "
                "warpgroup's turn\n")
    source = once(source, last, last + "      c2 = clock64();\n")
    source = once(source, "    // ---- g1 = g0 @ B1", "    c3 = clock64();\n    // ---- g1 = g0 @ B1")
    source = once(source, "      wgmma_wait<0>();\n\n      // Epilogue\n",
                  "      wgmma_wait<0>();\n      c4 = clock64();\n\n      // Epilogue\n")
    add = (f"    if (tid % kWarpgroupThreads == 0) {{\n"
           f"      unsigned long long* k = {clock};\n"
           "      const long long c5 = clock64();\n"
           "      atomicAdd(k + 0, (unsigned long long)(c1 - c0));\n"
           "      atomicAdd(k + 1, (unsigned long long)cfull);\n"
           "      atomicAdd(k + 2, (unsigned long long)(c2 - c1 - cfull));\n"
           "      atomicAdd(k + 3, (unsigned long long)(c3 - c2));\n"
           "      atomicAdd(k + 4, (unsigned long long)(c4 - c3));\n"
           "      atomicAdd(k + 5, (unsigned long long)(c5 - c4));\n"
           "      atomicAdd(k + 6, 1ull);\n"
           "    }\n")
    end = ("  }\n  if (tid % kWarpgroupThreads == 0) bulk_wait();"
           if "bulk_wait();  // this warpgroup's last stores" in source else "  }\n#else")
    source = once(source, end, add + end)
    # the producer's thread
    source = once(source, "  int fill = 0;\n  for (int tile = blockIdx.x;",
                  "  int fill = 0;\n  const long long p0 = clock64();\n  long long pwait = 0;\n"
                  "  for (int tile = blockIdx.x;")
    source = once(source, "      if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);\n",
                  "      { const long long w = clock64();\n"
                  "      if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);\n"
                  "      pwait += clock64() - w; }\n")
    source = once(source, "    }\n  }\n}\n}  // namespace chain_kgen::g0_cfg",
                  "    }\n  }\n"
                  f"  atomicAdd({clock} + 7, (unsigned long long)pwait);\n"
                  f"  atomicAdd({clock} + 8, (unsigned long long)(clock64() - p0));\n"
                  f"  atomicAdd({clock} + 9, 1ull);\n"
                  "}\n}  // namespace chain_kgen::g0_cfg")
    # the span of the CTAs and each consumer's loop, against the SM clock
    timer = ("[] { unsigned long long t; asm volatile(\"mov.u64 %0, %%globaltimer;\" : \"=l\"(t)); "
             "return t; }()")
    source = once(source, "  const int M = p.M;\n",
                  f"  const int M = p.M;\n  const unsigned long long t_entry = {timer};\n")
    source = once(source, "  int local = warpgroup;",
                  f"  const unsigned long long t_loop = {timer};\n"
                  "  const long long c_loop = clock64();\n  int local = warpgroup;")
    source = once(source, "#else\n  __trap();",
                  f"  if (tid % kWarpgroupThreads == 0) {{\n"
                  f"    const unsigned long long t_exit = {timer};\n"
                  "    const long long c_exit = clock64();\n"
                  f"    unsigned long long* k = {clock};\n"
                  "    atomicMin(k + 10, t_entry);\n    atomicMax(k + 11, t_exit);\n"
                  "    atomicAdd(k + 12, t_exit - t_entry);\n    atomicAdd(k + 13, t_loop - t_entry);\n"
                  "    atomicAdd(k + 14, (unsigned long long)(c_exit - c_loop));\n"
                  "    atomicAdd(k + 15, t_exit - t_loop);\n    atomicAdd(k + 16, 1ull);\n"
                  "  }\n#else\n  __trap();")
    return source


def span(compiled, bound, stream, clock, torch) -> str:
    """One launch's span (first CTA entry to last exit) against its CUDA-event time, and each
    consumer warpgroup's mean time before its first tile, and its loop's SM clock."""
    clock.zero_()
    clock[10] = 2 ** 63 - 1  # (the launch before used another input set: A is past L2)
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    compiled.launch(bound, stream)
    stop.record()
    torch.cuda.synchronize()
    c = [int(x) for x in clock.tolist()]
    n = max(c[16], 1)
    return (f"  one launch: event {start.elapsed_time(stop) * 1e3:.1f} us, CTAs' span "
            f"{(c[11] - c[10]) / 1e3:.1f} us (first entry to last exit); a consumer warpgroup: "
            f"{c[12] / n / 1e3:.1f} us entry to exit, {c[13] / n / 1e3:.2f} us before its first "
            f"tile, its loop at {c[14] / max(c[15], 1):.2f} GHz")


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built, build
    from kgen.emit import emit_header
    from kgen.lower import builder
    from kgen.targets import target
    from kgen.targets.sm90 import schedules

    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    clock = torch.zeros(len(SLOTS), dtype=torch.int64, device="cuda")
    print("device", torch.cuda.get_device_properties(0).name)
    limit = schedules.STAGING_MAX_VALUES
    runs = [("f16", 256, 128, 256, None, limit), ("f16", 256, 128, 256, 4, 256),
            ("f16", 576, 128, 256, None, limit), ("f16", 256, 64, 256, None, limit),
            ("f16", 256, 128, 128, None, limit), ("f16", 256, 128, 64, None, limit)]
    for dtype, k0, n0, n1, stages, values in runs:
        kern = kernel(dtype, k0, n0, n1)
        config = builder.listed(kern, target(ir.Arch.SM90A))[0][0]
        if stages is not None:
            config = dataclasses.replace(config, gemms=(dataclasses.replace(
                config.gemms[0], stages=stages),) + config.gemms[1:])
        schedules.STAGING_MAX_VALUES = values
        built = build(kern, ir.Arch.SM90A, source_name="chain.kg", config=config)
        schedules.STAGING_MAX_VALUES = limit
        made = dict(source_name="chain.kg", source_hash="", command="chain_clock.py")
        source = instrument(built.source, clock.data_ptr())
        compiled = kgen.api.load_built(Built(kern, built.plan, source,
                                             emit_header(built.plan, **made)))
        sizes = dict(M=M, K=k0)
        outs = {q.name: alloc(torch, q, sizes) for q in kern.params if q.role is ir.Role.OUT}
        # three input sets, launched in turn: each launch finds its A past L2, as the tables do
        bounds = [compiled.bind(**make_inputs(torch, kern, sizes), **outs) for _ in range(3)]
        for b in bounds:
            compiled.launch(b, stream)
        torch.cuda.synchronize()
        clock.zero_()
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for i in range(10):
            compiled.launch(bounds[i % 3], stream)
        stop.record()
        torch.cuda.synchronize()
        c = [int(x) for x in clock.tolist()]
        tiles, producers = c[6], c[9]
        consumers = max(c[16], 1)
        loop = (f"  a consumer's loop: {c[14] / consumers:8.0f} cycles for {tiles / consumers:.2f} "
                f"tiles ({c[14] / max(tiles, 1):6.0f} a tile against the phases' "
                f"{sum(c[:6]) / tiles:6.0f}); {c[13] / consumers / 1e3:.2f} us before its first tile")
        spanned = span(compiled, bounds[1], stream, clock, torch)
        per = "  ".join(f"{name} {c[i] / tiles:6.0f}" for i, name in enumerate(SLOTS[:6]))
        print(f"\n{dtype} K0={k0} N0={n0} N1={n1} [{label(built.plan)}]: "
              f"{start.elapsed_time(stop) / 10:.4f} ms a launch (instrumented)\n"
              f"  cycles per tile and consumer: {per}  sum {sum(c[:6]) / tiles:6.0f}\n"
              f"  producer: empty waits {c[7] / producers:8.0f}  total {c[8] / producers:8.0f} "
              f"cycles a CTA ({100 * c[7] / max(c[8], 1):.0f}% waiting for slots)\n{loop}\n{spanned}",
              flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
