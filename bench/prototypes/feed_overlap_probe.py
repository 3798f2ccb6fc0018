"""A diagnostic, not a product path: the ping-pong chain's g0 epilogue overlapped with g1's wgmma
(issue 17's chains on the H200; bench/RESULTS.md "What still stops K0 = 256, N0 = 128").

The kernel now runs, per tile and consumer warpgroup: g0's mainloop, then g0's whole epilogue
into g1's A fragments, then g1's wgmma (one group), waited on, then g1's epilogue. In the
variant 'overlap' the g0 epilogue of k step kk (n8 column tiles 2 kk and 2 kk + 1) is followed
at once by g1's wgmma of that k step: the tensor cores multiply step kk while the warpgroup
rounds and packs step kk + 1. It is an edit of the emitted text, for chains whose g1 runs in one
column pass.

Every variant is first checked against the float64 reference with its output poisoned, then
both are timed in turn (kgen's timer: CUDA events, median of 30, inputs rotated past L2) over
two rounds; the faster round of each is kept. Beside them: a device copy of the same bytes.

    bash .gpu/device-run.sh python3 bench/prototypes/feed_overlap_probe.py [--compile-only]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from chain_ring import M, kernel, label  # noqa: E402
from epilogue_clock import once  # noqa: E402

CHAINS = [(256, 128, 64), (256, 128, 128), (256, 64, 64), (256, 64, 128), (576, 128, 64),
          (576, 128, 128), (1024, 128, 128), (1536, 128, 64)]

G0_EPILOGUE = re.compile(
    r"(?P<head>#pragma unroll\n      for \(int i = 0; i < kFragM; \+\+i\) \{\n#pragma unroll\n"
    r"        for \(int j = 0; j < kFragN; \+\+j\) \{\n)(?P<body>(?:          [^\n]*\n)+)"
    r"        \}\n      \}\n    \}\n")
G1_WGMMA = re.compile(r"      wgmma_fence\(\);  // the A fragments[^\n]*\n(      wgmma_step_rs[^\n]*\n)+"
                      r"      wgmma_commit\(\);\n      wgmma_wait<0>\(\);\n")
ZERO = ("      float acc[kFragM][kFragN][4];\n#pragma unroll\n      for (int i = 0; i < kFragM; ++i)\n"
        "#pragma unroll\n        for (int j = 0; j < kFragN; ++j)\n#pragma unroll\n"
        "          for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;\n")


def overlapped(source: str, dtype_bytes: int = 2) -> str:
    """g0's epilogue k step by k step, each followed by g1's wgmma of that step."""
    frag = "    unsigned g1_a_frag[g1_cfg::kKSteps][g1_cfg::kFragM][4];\n"
    source = once(source, frag, frag + "    float g1_acc[g1_cfg::kFragM][g1_cfg::kFragN][4];  "
                  "// g1's accumulators, written by wgmma during g0's epilogue\n")
    match = G0_EPILOGUE.search(source)
    assert match, "no g0 epilogue"
    body = match["body"].replace("          ", "            ")
    new = (
        "#pragma unroll\n"
        "      for (int i = 0; i < g1_cfg::kFragM; ++i)\n#pragma unroll\n"
        "        for (int j = 0; j < g1_cfg::kFragN; ++j)\n#pragma unroll\n"
        "          for (int e = 0; e < 4; ++e) g1_acc[i][j][e] = 0.0f;\n"
        "      const unsigned g1_b = smem_address(smem.g1_b_smem());\n"
        "      constexpr unsigned kG1StageBytes = g1_cfg::BLayout::kStageElems * "
        f"{dtype_bytes};\n"
        "      constexpr int kStepsPerTile = g1_cfg::kTileK / 16;\n"
        "#pragma unroll\n"
        "      for (int kk = 0; kk < g1_cfg::kKSteps; ++kk) {\n"
        "#pragma unroll\n"
        "        for (int i = 0; i < kFragM; ++i) {\n"
        "#pragma unroll\n"
        "          for (int j = 2 * kk; j < 2 * kk + 2; ++j) {\n"
        + body +
        "          }\n"
        "        }\n"
        "        wgmma_fence();  // step kk's fragments were written by ordinary instructions\n"
        "        wgmma_step_rs(g1_acc, g1_a_frag[kk][0], smem_descriptor(g1_b + (kk / kStepsPerTile)"
        f" * kG1StageBytes + (kk % kStepsPerTile) * 16 * {dtype_bytes}));\n"
        "      }\n"
        "      wgmma_commit();\n"
        "    }\n")
    source = source[:match.start()] + new + source[match.end():]
    g1 = source.index("// ---- g1 = g0 @ B1")
    head, tail = source[:g1], source[g1:]
    tail = once(tail, ZERO, "      float (&acc)[kFragM][kFragN][4] = g1_acc;\n")
    match = G1_WGMMA.search(tail)
    assert match, "no g1 wgmma"
    tail = tail[:match.start()] + "      wgmma_wait<0>();  // g1's group, issued during g0's epilogue\n" \
        + tail[match.end():]
    return head + tail


def variants(kern):
    from kgen import ir
    from kgen.api import build
    from kgen.targets.sm90 import chain as sm90_chain

    plan = build(kern, ir.Arch.SM90A, source_name="chain.kg").plan
    source = sm90_chain.emit(plan, source_name="chain.kg", source_hash="",
                             command="feed_overlap_probe.py")
    try:
        return plan, {"base": source, "overlap": overlapped(source)}
    except AssertionError:  # g1 in column passes: not this edit's case
        return plan, {"base": source}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--m", type=int, default=M)
    parser.add_argument("--diagnose", action="store_true")
    args = parser.parse_args()
    if args.diagnose:
        diagnose([(256, 128, 64), (256, 128, 128), (256, 128, 256), (256, 64, 128),
                  (576, 128, 256)], args.rounds)
        return 0
    if args.compile_only:
        from kgen.runtime import compile_cubin
        for k0, n0, n1 in CHAINS:
            kern = kernel("f16", k0, n0, n1)
            plan, texts = variants(kern)
            texts.update({n: fn(texts["base"]) for n, fn in DIAGNOSTICS.items()})
            for name, text in texts.items():
                result = compile_cubin(text, plan.name, "sm_90a")
                serial = [ln for ln in result.log.splitlines() if "serializ" in ln]
                print(f"{k0}/{n0}/{n1} {name}: {result.registers} registers, "
                      f"spills {result.spill_stores}/{result.spill_loads}"
                      f"{' SERIALIZED: ' + serial[0] if serial else ''}", flush=True)
        return 0
    from b2b_bench import copy_ms
    from kgen.harness.run import run

    ok = True
    print(f"{'dtype':<5} {'K0':>5} {'N0':>4} {'N1':>4} {'schedule':<56} {'base':>8} {'overlap':>8}"
          f" {'ov/base':>8} {'copy':>7} {'base/c':>7} {'ov/c':>7}")
    for dtype in args.dtypes.split(","):
        for k0, n0, n1 in CHAINS:
            kern = kernel(dtype, k0, n0, n1)
            plan, texts = variants(kern)
            best = {}
            for round_ in range(args.rounds):
                for name, text in texts.items():
                    report = run(kern, plan, text, {"M": args.m}, check=round_ == 0,
                                 bench=True, compare_torch=False, iters=30)
                    if round_ == 0 and not report.ok:
                        print(f"  {dtype} {k0}/{n0}/{n1} {name}: CHECK FAILED", flush=True)
                        ok = False
                    best[name] = min(best.get(name, 1e9), report.timing.median_ms)
            copy = copy_ms((args.m * k0 + args.m * n1) * 2)
            print(f"{dtype:<5} {k0:>5} {n0:>4} {n1:>4} {label(plan):<56} {best['base']:8.4f} "
                  f"{best['overlap']:8.4f} {best['overlap'] / best['base']:8.3f} {copy:7.4f} "
                  f"{best['base'] / copy:7.3f} {best['overlap'] / copy:7.3f}", flush=True)
    return 0 if ok else 1


# Diagnostics (timing only: their results are wrong by design, so they are never checked). Each
# removes one part of a tile's work from the emitted text, to bound what that part costs.
EXPECT = "mbarrier_expect_tx(full_bar + 8 * slot, kAStageBytes + kBStageBytes);"
LOAD_A = "tma_load_box(a_smem + slot * kAStageBytes, &maps.A, full_bar + 8 * slot, kt * kTileK, m0);"
LOAD_B = ("tma_load_box(b_smem + slot * kBStageBytes, &maps.B0, full_bar + 8 * slot, kt * kTileK, "
          "0);")


def without_b0(source: str) -> str:
    """B0 copied into the ring's first kStages fills only (later fills reuse stale k tiles)."""
    source = once(source, EXPECT, "mbarrier_expect_tx(full_bar + 8 * slot, kAStageBytes + "
                  "(fill < kStages ? kBStageBytes : 0));")
    return once(source, LOAD_B, "if (fill < kStages) " + LOAD_B)


def without_a(source: str) -> str:
    """A copied into the ring's first kStages fills only: no DRAM reads after the first tile."""
    source = once(source, EXPECT, "mbarrier_expect_tx(full_bar + 8 * slot, kBStageBytes + "
                  "(fill < kStages ? kAStageBytes : 0));")
    return once(source, LOAD_A, "if (fill < kStages) " + LOAD_A)


def without_store(source: str) -> str:
    """The staging is written, but the copy engine never stores it."""
    out, count = re.subn(r"(\n\s+)(tma_store_box\(&maps\.D1,)", r"\1if (M < 0) \2", source)
    assert count >= 1, "no store"
    return out


def without_epilogue0(source: str) -> str:
    """g0's epilogue reads no vectors and does no math: the accumulators are packed as they are."""
    out, count = re.subn(r"g0_epilogue\(p, [^,]+, c, acc\[i\]\[j\]\[(\d)\], acc\[i\]\[j\]\[(\d)\], "
                         r"(x\d), (x\d)\);",
                         r"\3 = acc[i][j][\1]; \4 = acc[i][j][\2];", source)
    assert count == 2, count
    return out


DIAGNOSTICS = {"-B0 reloads": without_b0, "-A reloads": without_a, "-D1 stores": without_store,
               "-g0 epilogue": without_epilogue0}


def diagnose(chains, rounds: int) -> None:
    """Each chain's base kernel beside each diagnostic, f16, in turn over `rounds` rounds."""
    from b2b_bench import copy_ms
    from kgen.harness.run import run

    names = ["base", *DIAGNOSTICS]
    print(f"{'K0':>5} {'N0':>4} {'N1':>4} {'copy':>7} " + " ".join(f"{n:>13}" for n in names))
    for k0, n0, n1 in chains:
        kern = kernel("f16", k0, n0, n1)
        plan, texts = variants(kern)
        texts = {"base": texts["base"],
                 **{n: fn(texts["base"]) for n, fn in DIAGNOSTICS.items()}}
        best = {}
        for round_ in range(rounds):
            for name, text in texts.items():
                report = run(kern, plan, text, {"M": M}, check=round_ == 0 and name == "base",
                             bench=True, compare_torch=False, iters=30)
                best[name] = min(best.get(name, 1e9), report.timing.median_ms)
        copy = copy_ms((M * k0 + M * n1) * 2)
        print(f"{k0:>5} {n0:>4} {n1:>4} {copy:7.4f} "
              + " ".join(f"{best[n]:7.4f} ({best[n] / copy:.2f})" for n in names), flush=True)


if __name__ == "__main__":
    sys.exit(main())
