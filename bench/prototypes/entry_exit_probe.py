"""A diagnostic, not a product path: what the sm_90a GEMM's entry and end cost at the sweep's
small launches (issue 17; bench/logs/small_launch/, bench/prototypes/cluster_clock.py).

The kernel now
  prefetch   prefetches its tensor maps while thread 0 sets up the barriers,
  read       ends once the copy engine has read the last staging (`wait_group.read`), not once
             the stores are complete (their writes complete by the kernel's end),
  tail       on clusters, ends its producer on every slot's last release by the consumers of
             the whole cluster, instead of a cluster barrier of every thread at the end,
  spread     on clusters, releases a slot in CTA r from lane 0 of warp r, not both from thread 0.
Each is undone in the emitted text alone ('-prefetch', '-read', '-tail', '-spread'), and all at once ('old',
the text of fa84dde's kernel body). Every variant is first checked against the float32 product
with its output poisoned. Then each variant's kernel device time (torch.profiler, warm, the
median of 20 launches; two rounds in turn) beside cuBLAS's, and 'new' and 'old' the benchmarks'
way (CUDA events, inputs rotated past L2) x torch.matmul.

    bash .gpu/device-run.sh python3 bench/prototypes/entry_exit_probe.py
"""
from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from defaults import BARE  # noqa: E402
from epilogue_clock import once  # noqa: E402
from small_launch_probe import device_us  # noqa: E402
from wide_probe import parsed  # noqa: E402

SHAPES = [(1024, 1024, 1024), (128, 4096, 4096), (2048, 2048, 2048), (256, 4096, 4096),
          (3000, 5000, 2000), (512, 2048, 1024)]
FULL_WAIT = 'asm volatile("cp.async.bulk.wait_group 0;\\n" ::: "memory")'


def without_prefetch(source: str) -> str:
    out, count = re.subn(r"    if \(!kNarrow\) \{  // the copy engine's views[^\n]*\n"
                         r"(      prefetch_tensor_map\(&maps\.\w+\);\n)+    \}\n", "", source)
    if count != 1:
        raise ValueError("no prefetch block")
    return out


def without_read(source: str) -> str:
    return once(source, "  if (!kNarrow && tid % kWarpgroupThreads == 0) bulk_wait_read();\n}\n",
                f"  if (!kNarrow && tid % kWarpgroupThreads == 0) {FULL_WAIT};\n}}\n")


def without_tail(source: str) -> str:
    out, count = re.subn(r"      // The consumers of every CTA of the cluster arrive[^\n]*\n"
                         r"(      //[^\n]*\n)*"
                         r"      for \(int i = 0; i < kStages; \+\+i, \+\+it\) \{\n"
                         r"[^\n]*\n[^\n]*\n      \}\n", "", source)
    if count != 1:
        raise ValueError("no producer tail")
    out = once(out, "    }\n    return;\n  }\n  setmaxnreg_inc",
               "    }\n    if constexpr (!kNarrow) {\n      __syncwarp();\n      cluster_sync();\n"
               "    }\n    return;\n  }\n  setmaxnreg_inc")
    end = re.search(r"  if \(!kNarrow && tid % kWarpgroupThreads == 0\) [^\n]*;\n}\n", out)
    return out[:end.end() - 2] + "  if constexpr (!kNarrow) cluster_sync();\n}\n" + out[end.end():]


def without_spread(source: str) -> str:
    out = once(source, "lane == 0 && warp < kClusterM * kClusterN;",
               "tid % kWarpgroupThreads == 0;")
    return once(out, "    mbarrier_arrive_cluster(cluster_address(bar, threadIdx.x / 32 % 4));\n",
                "#pragma unroll\n    for (int rank = 0; rank < kClusterM * kClusterN; ++rank)\n"
                "      mbarrier_arrive_cluster(cluster_address(bar, rank));\n")


def variants(source: str, clustered: bool) -> dict[str, str]:
    out = {"new": source, "-prefetch": without_prefetch(source), "-read": without_read(source)}
    old = without_read(without_prefetch(source))
    if clustered:
        out["-tail"] = without_tail(source)
        out["-spread"] = without_spread(source)
        old = without_spread(without_tail(old))
    out["old"] = old
    return out


def configs(kernel, sizes):
    """The sized choice, and the cluster configurations cuBLAS's choices resemble."""
    from kgen.ir import Arch
    from kgen.lower import builder
    from kgen.plan import KernelKind
    from kgen.targets import Config, GemmConfig, target

    def pp(n, s, cluster):
        return Config((GemmConfig((64, n, 64), (2, 4), s, cluster=cluster),), KernelKind.PINGPONG)

    def coop(m, n, s, cluster):
        return Config((GemmConfig((m, n, 64), (2, 4), s, cluster=cluster),),
                      KernelKind.COOPERATIVE)
    out = {"sized": builder.sized(kernel, target(Arch.SM90A), sizes)}
    m, n = sizes["M"], sizes["N"]
    if m <= 256:
        out["pp 64x64 s12 c2x1"] = pp(64, 12, (2, 1))
    elif m * n <= 1024 * 1024:
        out["pp 64x128 s8 c2x1"] = pp(128, 8, (2, 1))
    else:
        out["co 128x256 s4 c2x1"] = coop(128, 256, 4, (2, 1))
    return out


def main() -> int:
    import torch

    from kgen.api import Built, build, load_built
    from kgen.harness.timing import rotation_count, time_kernel
    from kgen.ir import Arch
    from kgen.tune.compile import Job, compile_all

    kernel = parsed(BARE.format(t="f16"), "bare")
    print("device", torch.cuda.get_device_properties(0).name)
    builds = []  # (shape, config name, variant name, Built)
    for m, n, k in SHAPES:
        sizes = dict(M=m, N=n, K=k)
        for cname, config in configs(kernel, sizes).items():
            built = build(kernel, Arch.SM90A, source_name="probe.kg", config=config)
            clustered = built.plan.schedule.cluster_size > 1
            for vname, source in variants(built.source, clustered).items():
                builds.append(((m, n, k), cname, vname,
                               Built(built.kernel, built.plan, source, built.header)))
    jobs = [Job(i, b.source, b.plan.name, "sm_90a", b.plan.narrow_kernel)
            for i, (_, _, _, b) in enumerate(builds)]
    failed = [r for r in compile_all(jobs).values() if not r.ok]
    if failed:
        print("compile failed:", failed[0].error[:400])
        return 1
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    current = None
    for (m, n, k), cname, vname, built in builds:
        if current != (m, n, k):
            current = (m, n, k)
            a = torch.randn(m, k, device="cuda", dtype=torch.float16)
            b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()
            ref = a.float() @ b.float()
            cublas = device_us(lambda: torch.matmul(a, b), ("nvjet", "gemm", "Kernel"))
            print(f"\n{m}x{n}x{k}: cuBLAS " + "  ".join(f"{v:.2f} us {key[:44]}"
                                                     for key, v in cublas.items()), flush=True)
            table = {}
        compiled = load_built(built)
        d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        compiled(A=a, B=b, D=d)
        torch.cuda.synchronize()
        err = ((d.float() - ref).norm() / ref.norm()).item()
        if not err < 1e-2:
            print(f"  {cname} {vname}: WRONG (relative error {err})")
            continue
        table.setdefault(cname, {})[vname] = (compiled, d)
        if vname != "old":
            continue
        for _ in range(2):  # two rounds, each variant in turn
            for name, (kern, out) in table[cname].items():
                us = device_us(lambda: kern(A=a, B=b, D=out), ("bare",))
                print(f"  {cname:<20} {name:<10} " + " ".join(f"{v:8.2f} us" for v in us.values()),
                      flush=True)
        sets = [(torch.randn(m, k, device="cuda", dtype=torch.float16),
                 torch.randn(n, k, device="cuda", dtype=torch.float16).t(),
                 torch.empty(m, n, device="cuda", dtype=torch.float16))
                for _ in range(rotation_count(2 * (m * k + n * k + m * n), l2))]
        def timed(run):  # the benchmarks' way: events, median of 50, inputs rotated past L2
            return time_kernel(run, rotate=len(sets), iters=50,
                               stream=torch.cuda.current_stream().cuda_stream).median_ms

        for _ in range(2):
            ms = {name: timed(lambda i, kern=table[cname][name][0]:
                              kern(A=sets[i][0], B=sets[i][1], D=sets[i][2]))
                  for name in ("new", "old")}
            ms["torch"] = timed(lambda i: torch.matmul(sets[i][0], sets[i][1], out=sets[i][2]))
            print(f"  {cname:<20} events: new {ms['new'] * 1e3:.2f} us ({ms['torch'] / ms['new']:.3f}x)"
                  f"  old {ms['old'] * 1e3:.2f} us ({ms['torch'] / ms['old']:.3f}x)"
                  f"  torch {ms['torch'] * 1e3:.2f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
