"""A diagnostic, not a product variant: where stream-K's time goes on the cooperative kernel.
The emitted source of `split stream` is timed as emitted and with one piece of the fixup cut out
of the text (results then wrong, so unchecked): the flag waits, the adds, the partial stores
and their fences. bench/stream_k.py times the real variants.

    bash .gpu/device-run.sh python3 bench/prototypes/stream_k_probe.py
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from defaults import BARE  # noqa: E402

CUTS = {
    "as emitted": [],
    "no wait": [("  if (lane == 0) {\n    for (int later = first;", "  if (false) {\n    for (int later = first;")],
    "no add": [("  for (int later = first; later <= last; ++later) {\n    const float4* slot",
                "  for (int later = first; later < first; ++later) {\n    const float4* slot")],
    "no wait, no add, no store": [
        ("  if (lane == 0) {\n    for (int later = first;", "  if (false) {\n    for (int later = first;"),
        ("  for (int later = first; later <= last; ++later) {\n    const float4* slot",
         "  for (int later = first; later < first; ++later) {\n    const float4* slot"),
        ("  for (int i = 0; i < kFragM; ++i)\n#pragma unroll\n    for (int j = 0; j < kFragN; ++j)\n      __stcg(",
         "  for (int i = 0; i < 0; ++i)\n#pragma unroll\n    for (int j = 0; j < kFragN; ++j)\n      __stcg(")],
    "no fence": [("             make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));\n  __threadfence();",
                  "             make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));\n")],
}


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
    for m, n, k, tile, stages in ((2048, 2048, 2048, (128, 256, 64), 3),
                                  (1024, 1024, 1024, (128, 128, 64), 5),
                                  (4096, 4096, 4096, (128, 256, 64), 3)):
        sizes = dict(M=m, N=n, K=k)
        for stream in (False, True):
            built = build(kernel, ir.Arch.SM90A, source_name="probe.kg",
                          config=Config((GemmConfig(tile, (2, 4), stages, stream=stream),)))
            cuts = CUTS if stream else {"data-parallel": []}
            for name, edits in cuts.items():
                source = built.source
                for old, new in edits:
                    assert old in source, (name, old)
                    source = source.replace(old, new)
                report = run(built.kernel, built.plan, source, sizes, check=not edits, bench=True,
                             iters=30)
                print(f"{m}x{n}x{k} {tile} {name}: {report.timing.median_ms:.4f} ms"
                      + ("" if edits else f" ok={report.ok}"), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
