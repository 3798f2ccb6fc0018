"""A diagnostic, not a product path: where do our clusters lose 1-4 us at the sweep's small
launches (bench/logs/small_launch/)? The bare GEMM (`D = acc`, f16) on ping-pong 64-row tiles,
alone and on clusters, timed in consumer 0's first thread with clock64() (the emitted text is
edited, as bench/prototypes/epilogue_clock.py does; a measurement, not a variant):

    entry -> init     barrier init and the block's (or cluster's) barrier
    init -> tile      the tile loop's start
    tile -> first     the first full slot of the tile (the first copies' latency)
    first -> last     the rest of the mainloop, to wgmma_wait<0>
    epilogue          the staging and the store's issue
    read_wait         the copy engine has read the staging (the kernel's end)
    full_waits        of first -> last and tile -> first: consumer 0 waiting for full slots
    wgmma_waits       of first -> last: consumer 0 in wgmma_wait<1>
    releases          of first -> last: consumer 0's first thread releasing slots (rank 0)
    releases_w1       the same in its warp 1's first thread (rank 1 on clusters; alone it
                      releases nothing: the clock reads' own cost)
    empty_waits       the producer's thread waiting for empty slots
    prod_tail         clusters: the producer's wait for every slot's last release

Mean cycles per CTA over 10 launches (one tile per CTA at these sizes), each kernel first
checked against torch.matmul in float32.

    bash .gpu/device-run.sh python3 bench/prototypes/cluster_clock.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from epilogue_clock import once, with_clock_buffer  # noqa: E402
from defaults import BARE  # noqa: E402
from wide_probe import parsed  # noqa: E402

SEGMENTS = ("entry->init", "init->tile", "tile->first", "first->last", "epilogue",
            "read_wait", "full_waits", "wgmma_waits", "releases", "releases_w1", "empty_waits",
            "prod_tail")
CASES = [((128, 4096, 4096), 64, 12, (1, 1)), ((128, 4096, 4096), 64, 12, (2, 1)),
         ((128, 4096, 4096), 64, 12, (1, 2)), ((1024, 1024, 1024), 128, 8, (1, 1)),
         ((1024, 1024, 1024), 128, 8, (2, 1))]


def instrument(source: str, address: int) -> str:
    """The source with the clock reads of consumer 0's first thread (tid 128) and of the
    producer's thread (tid 0) added."""
    source = with_clock_buffer(source, address)
    source = once(source, "  const int tid = threadIdx.x;\n",
                  "  const long long c_entry = clock64();\n  const int tid = threadIdx.x;\n")
    source = once(source, "\n  if (tid < kWarpgroupThreads) {  // the producer",
                  "\n  const long long c_init = clock64();\n"
                  "  long long c_tile = 0, c_first = 0, c_last = 0, c_full = 0, c_empty = 0, c_tail = 0, c_wg = 0, c_rel = 0;\n"
                  "  if (tid < kWarpgroupThreads) {  // the producer")
    source = once(source, "          if (round > 0) mbarrier_wait(empty + 8 * s, (round - 1) & 1);\n",
                  "          const long long w0 = clock64();\n"
                  "          if (round > 0) mbarrier_wait(empty + 8 * s, (round - 1) & 1);\n"
                  "          c_empty += clock64() - w0;\n")
    clustered = "      for (int i = 0; i < kStages; ++i, ++it) {\n" in source
    if clustered:
        source = once(source, "      for (int i = 0; i < kStages; ++i, ++it) {\n",
                      "      const long long t0 = clock64();\n"
                      "      for (int i = 0; i < kStages; ++i, ++it) {\n")
    source = once(source, "    }\n    return;\n  }\n  setmaxnreg_inc",
                  ("      c_tail = clock64() - t0;\n" if clustered else "")
                  + "    }\n    if (tid == 0 && c_empty + c_tail > 0) {\n"
                  "      atomicAdd(kgen_clock + 8, static_cast<unsigned long long>(c_empty));\n"
                  "      atomicAdd(kgen_clock + 9, static_cast<unsigned long long>(c_tail));\n"
                  "    }\n    return;\n  }\n  setmaxnreg_inc")
    source = once(source, "    float acc[kFragM][kFragN][4];\n",
                  "    if (c_tile == 0) c_tile = clock64();\n    float acc[kFragM][kFragN][4];\n")
    source = once(source, "      mbarrier_wait(full + 8 * s, (it / kStages) & 1);\n",
                  "      const long long w1 = clock64();\n"
                  "      mbarrier_wait(full + 8 * s, (it / kStages) & 1);\n"
                  "      c_full += clock64() - w1;\n"
                  "      if (c_first == 0) c_first = clock64();\n")
    source = once(source, "      wgmma_wait<1>();  // the group before this one is done: its slot may be refilled\n",
                  "      const long long w2 = clock64();\n"
                  "      wgmma_wait<1>();  // the group before this one is done: its slot may be refilled\n"
                  "      const long long w3 = clock64();\n"
                  "      c_wg += w3 - w2;\n")
    release = re.search(r"      if \(kt > 0 && [^\n]*\n", source).group(0)
    source = once(source, release, release + "      c_rel += clock64() - w3;\n")
    source = once(source, "    // Epilogue\n", "    // Epilogue\n    if (c_last == 0) c_last = clock64();\n")
    wait = "  if (!kNarrow && tid % kWarpgroupThreads == 0) bulk_wait_read();\n}\n"
    record = (
        "  if (tid == kWarpgroupThreads && c_tile != 0) {\n"
        "    const long long t[7] = {c_entry, c_init, c_tile, c_first, c_last, c_stored, clock64()};\n"
        "    for (int i = 0; i < 6; ++i) atomicAdd(kgen_clock + i, static_cast<unsigned long long>(t[i + 1] - t[i]));\n"
        "    atomicAdd(kgen_clock + 6, static_cast<unsigned long long>(c_full));\n"
        "    atomicAdd(kgen_clock + 10, static_cast<unsigned long long>(c_wg));\n"
        "    atomicAdd(kgen_clock + 11, static_cast<unsigned long long>(c_rel));\n"
        "    atomicAdd(kgen_clock + 7, 1ull);\n"
        "  }\n"
        "  if (tid == kWarpgroupThreads + 32 && c_tile != 0)\n"
        "    atomicAdd(kgen_clock + 12, static_cast<unsigned long long>(c_rel));\n")
    return once(source, wait, "  const long long c_stored = clock64();\n" + wait[:-2] + record + "}\n")


def build(kernel, n, stages, cluster, address):
    from kgen.api import Built, build as build_kernel, load_built
    from kgen.ir import Arch
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig

    config = Config((GemmConfig((64, n, 64), (2, 4), stages, cluster=cluster),),
                    KernelKind.PINGPONG)
    built = build_kernel(kernel, Arch.SM90A, source_name="clock.kg", config=config)
    source = instrument(built.source, address)
    return load_built(Built(built.kernel, built.plan, source, built.header)) if address else source


def main() -> int:
    import torch

    kernel = parsed(BARE.format(t="f16"), "bare")
    clock = torch.zeros(16, dtype=torch.int64, device="cuda")
    print("device", torch.cuda.get_device_properties(0).name)
    print(f"{'case':<34}" + "".join(f"{s:>13}" for s in SEGMENTS) + "   total   CTAs")
    for (m, n, k), tile_n, stages, cluster in CASES:
        compiled = build(kernel, tile_n, stages, cluster, clock.data_ptr())
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        compiled(A=a, B=b, D=d)
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        err = ((d.float() - ref).norm() / ref.norm()).item()
        for _ in range(3):
            compiled(A=a, B=b, D=d)
        torch.cuda.synchronize()
        clock.zero_()
        for _ in range(10):
            compiled(A=a, B=b, D=d)
        torch.cuda.synchronize()
        sums = clock.tolist()
        count = max(sums[7], 1)
        cells = [v / count for v in sums[:7] + sums[10:13] + sums[8:10]]
        label = f"{m}x{n}x{k} 64x{tile_n} s{stages} c{cluster[0]}x{cluster[1]}"
        print(f"{label:<34}" + "".join(f"{c:13.0f}" for c in cells)
              + f" {sum(cells[:6]):7.0f} {count // 10:6d}  err {err:.1e}", flush=True)
    print("(cycles per CTA, consumer 0's first thread, mean over 10 launches)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
