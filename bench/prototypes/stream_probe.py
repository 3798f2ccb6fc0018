"""A diagnostic, not a product path: why stream-K (`split stream`) runs slower than the
data-parallel walk on sm_90a's cooperative kernel (bench/RESULTS.md: 0.655x torch.matmul against
0.996x at 4096x4096x11008, 0.748x against 0.846x at 1536x1536x6144 where every tile is shared).
The emitted source is edited for each variant (a measurement, not a variant worth keeping):

    dp        the data-parallel walk, 128x256 s4 (the builder's tile)
    sk        stream-K as emitted: the tiles past whole waves and one wave more are shared
    sk tail   stream-K over the tiles past whole waves alone (stream_tiles returns the rest)
    sk nofix  stream-K with the fixup's waits and adds cut out (its output is wrong: timed only)
    sk nostore  stream-K with the later parts' stores and flags cut out too (wrong: timed only)

Each is timed by kgen run's harness (CUDA events, median of 30, inputs rotated past L2); the
edited ones whose output must be wrong are not checked.

    bash .gpu/device-run.sh python3 bench/prototypes/stream_probe.py
"""
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from chain_clock import once  # noqa: E402
from defaults import BARE  # noqa: E402

SHAPES = [(1536, 1536, 6144), (4096, 4096, 11008), (3000, 5000, 2000), (2048, 2048, 2048),
          (4096, 4096, 4096), (6144, 5120, 3072), (256, 2048, 16384)]


def edits(source: str, variant: str) -> str:
    if variant in ("sk", "dp"):
        return source
    if variant == "sk tail":
        return once(source, "  return tiles >= 2 * ctas ? rest + ctas : tiles;",
                    "  return tiles >= ctas ? rest : tiles;")
    source = once(source, "      stream_wait(flags, share + 1, last, consumer_warp, lane);\n"
                  "      stream_add(acc, p.workspace, share + 1, last, consumer_tid);\n",
                  "      (void)last;\n")
    if variant == "sk nostore":
        source = once(source, "      stream_store(acc, p.workspace + static_cast<long long>(share) * kTileM * kTileN,\n"
                      "                   flags + share * kStreamFlags + consumer_warp, consumer_tid, lane);\n",
                      "")
    return source


def main() -> int:
    from kgen import ir
    from kgen.api import build
    from kgen.harness.run import run
    from kgen.parse import parse
    from kgen.targets import Config, GemmConfig
    from kgen.verify import verify

    module = parse(BARE.format(t="f16"), "bare.kg")
    verify(module)
    kernel = module.kernels[0]
    variants = ["dp", "sk", "sk tail", "sk nofix", "sk nostore"]
    built = {stream: build(kernel, ir.Arch.SM90A, source_name="bare.kg", config=Config(
        (GemmConfig((128, 256, 64), (2, 4), 4, stream=stream),))) for stream in (False, True)}
    print(f"{'M x N x K':<18} {'matmul ms':>9} " + " ".join(f"{v:>11}" for v in variants))
    for m, n, k in SHAPES:
        sizes, torch_ms, cells = dict(M=m, N=n, K=k), None, []
        for variant in variants:
            b = built[variant != "dp"]
            checked = variant in ("dp", "sk", "sk tail")
            report = run(b.kernel, b.plan, edits(b.source, variant), sizes, check=checked,
                         bench=True, compare_torch=torch_ms is None, iters=30)
            torch_ms = torch_ms or report.torch_timing.median_ms
            ratio = torch_ms / report.timing.median_ms
            cells.append(f"{ratio:>11.3f}" if report.ok or not checked else f"{'FAILED':>11}")
        print(f"{f'{m}x{n}x{k}':<18} {torch_ms:>9.4f} " + " ".join(cells), flush=True)
    print("(x torch.matmul, f16, 128x256x64 s4 cooperative; nofix and nostore unchecked)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
