"""A diagnostic, not a product path: how long the sm_90a cooperative kernel's epilogue takes,
read with clock64() in each consumer's first thread, for the kernels of bench/epilogue_cost.py.

The emitted source is edited (this is a measurement of the emitted code, not a variant worth
keeping): each consumer's thread 0 adds to a device buffer, per tile, the cycles from the
tile's start to the end of its mainloop (after wgmma_wait<0>), and from there to the issue of
the output's stores; with a staged input, also the cycles spent waiting for it. The buffer's
address is written into the source as a constant (the same process and context as torch's).

    bash .gpu/device-run.sh python3 bench/prototypes/epilogue_clock.py [--sizes 4096,4096,4096 ...]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from epilogue_cost import EPILOGUES, kernel_of  # noqa: E402
from hopper_gemm import alloc, make_inputs  # noqa: E402

KEEP = ("bare", "relu", "bias staged", "C", "full")


def once(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def with_clock_buffer(source: str, address: int) -> str:
    """The source with `kgen_clock`, the device buffer at `address` that the clock reads add
    into, defined before the kernel body."""
    body = "template <bool kNarrow>\n__device__ __forceinline__ void kernel_body("
    return once(source, body, f"#define kgen_clock reinterpret_cast<unsigned long long*>("
                f"{address:#x}ULL)\n{body}")


def instrument(source: str, address: int) -> str:
    """The source with the clock reads added (see the module's docstring)."""
    source = with_clock_buffer(source, address)
    source = once(source, "    float acc[kFragM][kFragN][4];\n",
                  "    const long long clock_tile = clock64();\n    float acc[kFragM][kFragN][4];\n")
    source = once(source, "    // Epilogue\n",
                  "    // Epilogue\n    const long long clock_epilogue = clock64();\n"
                  "    long long clock_waited = 0;\n")
    if "input_phase ^= 1;\n" in source:
        source = once(source, "        input_phase ^= 1;\n",
                      "        input_phase ^= 1;\n        clock_waited = clock64() - clock_epilogue;\n")
    # the tile loop's end: before the last boxes' wait (staged stores) or the body's end (pairs)
    end = ("  }\n  if (!kNarrow && tid % kWarpgroupThreads == 0) bulk_wait();"
           if "bulk_wait();  // the last boxes" in source else "  }\n}\n\n}  // namespace")
    source = once(source, end,
                  "    if (!kNarrow && tid % kWarpgroupThreads == 0) {\n"
                  "      const long long clock_end = clock64();\n"
                  "      atomicAdd(kgen_clock + 0, static_cast<unsigned long long>(clock_epilogue - clock_tile));\n"
                  "      atomicAdd(kgen_clock + 1, static_cast<unsigned long long>(clock_end - clock_epilogue));\n"
                  "      atomicAdd(kgen_clock + 2, static_cast<unsigned long long>(clock_waited));\n"
                  "      atomicAdd(kgen_clock + 3, 1ull);\n"
                  "    }\n"
                  + end)
    return source


def main() -> int:
    import torch

    import kgen
    from kgen import ir
    from kgen.api import Built
    from kgen.emit import emit, emit_header
    from kgen.lower import lower
    from kgen.parse import parse

    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", nargs="*", default=["4096,4096,4096", "8192,8192,8192"])
    parser.add_argument("--cubins", default=None, help="a folder to write each cubin into")
    opts = parser.parse_args()
    torch.manual_seed(0)
    stream = torch.cuda.current_stream().cuda_stream
    clock = torch.zeros(4, dtype=torch.int64, device="cuda")
    print("device", torch.cuda.get_device_properties(0).name)
    kernels = {}
    for label, expr, _, fields in EPILOGUES:
        if label not in KEEP:
            continue
        kernel = kernel_of(label, expr, ir, parse)
        plan = lower(kernel)
        g = dataclasses.replace(plan.schedule.gemms[0], **fields)
        plan = dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, gemms=(g,)))
        made = dict(source_name="clock.kg", source_hash="", command="epilogue_clock.py")
        source = instrument(emit(plan, **made), clock.data_ptr())
        kernels[label] = (kernel, kgen.api.load_built(Built(kernel, plan, source,
                                                            emit_header(plan, **made))))
        if opts.cubins:  # for cuobjdump --dump-sass
            Path(opts.cubins, label.replace(" ", "_") + ".cubin").write_bytes(kernels[label][1].cubin)
    for text in opts.sizes:
        m, n, k = (int(x) for x in text.split(","))
        sizes = dict(M=m, N=n, K=k)
        inputs = make_inputs(torch, kernels["full"][0], sizes)
        print(f"\nf16 {m}x{n}x{k}: cycles per tile, per consumer (mean over tiles and launches)")
        for label, (kernel, c) in kernels.items():
            names = {p.name for p in kernel.params}
            args = {q: v for q, v in inputs.items() if q in names}
            outs = {q.name: alloc(torch, q, sizes) for q in kernel.params if q.role is ir.Role.OUT}
            bound = c.bind(**args, **outs)
            for _ in range(3):
                c.launch(bound, stream)
            torch.cuda.synchronize()
            clock.zero_()
            for _ in range(10):
                c.launch(bound, stream)
            torch.cuda.synchronize()
            main_c, epi_c, wait_c, tiles = (int(x) for x in clock.tolist())
            print(f"  {label:14s} mainloop {main_c / tiles:9.0f}  epilogue {epi_c / tiles:7.0f} "
                  f"({100 * epi_c / (main_c + epi_c):4.1f}%)  of which waiting for C "
                  f"{wait_c / tiles:6.0f}   tiles {tiles // 10}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
