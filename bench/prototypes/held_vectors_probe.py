"""A probe, not a product path: the ping-pong chain's g0 epilogue with its column vectors held in
registers (issue 17's chains on the H200; bench/RESULTS.md "What bounds the K0 = 256, N0 = 128
chains": without g0's epilogue those chains run 1.15-1.20x the copy).

g0 covers all of N0 in every tile, so the columns each consumer thread reads in g0's epilogue are
the same in every tile. The kernel reads them from global memory (L1) each tile, after the last
wgmma group has drained; the clock reads put that epilogue at about 1100 cycles a tile at
N0 = 128, mostly waits on those loads. Variants, edits of the emitted text:
- 'held': each consumer thread loads its columns of every g0 column vector once, before its tile
  loop, and the epilogue takes them as arguments;
- 'early': the same loads at the top of each tile, before g0's mainloop (live across it only).

Every variant is first checked against the float64 reference with its output poisoned, then all
are timed in turn (kgen's timer: CUDA events, median of 30, inputs rotated past L2) over
`--rounds` rounds, the fastest kept. Beside them: a device copy of the same bytes.

    bash .gpu/device-run.sh python3 bench/prototypes/held_vectors_probe.py [--compile-only]
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

from chain_ring import M, kernel, label, time_in_turn, warm  # noqa: E402
from epilogue_clock import once  # noqa: E402

CHAINS = [(256, 128, 64), (256, 128, 128), (256, 128, 256), (576, 128, 256), (256, 64, 256),
          (256, 64, 128), (576, 64, 64), (576, 128, 128),
          # not in the issue
          (1024, 128, 128), (256, 96, 256), (256, 128, 320), (256, 160, 320)]

LOAD = re.compile(r"const (float2|__half2|__nv_bfloat162) (v\d+) = \*reinterpret_cast<const \1\*>"
                  r"\(p\.(\w+) \+ col\);")
TILE_LOOP = re.compile(r"\n(\s*)for \(int tile = blockIdx\.x \+ warpgroup \* gridDim\.x;")
G0_START = "    // ---- g0 = A @ B0"


def held(source: str, where: str) -> str:
    """g0's column-vector loads out of its epilogue into per-thread arrays loaded `where`:
    'loop' (once, before the tile loop) or 'tile' (at each tile's top)."""
    start = source.index("__device__ __forceinline__ void g0_epilogue(")
    end = source.index("\n}\n", start)
    func = source[start:end]
    loads = LOAD.findall(func)
    assert loads, "g0's epilogue reads no column vector"
    for pair, name, param in loads:
        func = func.replace(f"*reinterpret_cast<const {pair}*>(p.{param} + col)", f"held_{param}")
    extra = "".join(f", {pair} held_{param}" for pair, _, param in loads)
    func = func.replace("float& inter_1)", "float& inter_1" + extra + ")")
    source = source[:start] + func + source[end:]
    args = "".join(f", held_{param}[j]" for _, _, param in loads)
    source, count = re.subn(r"(g0_epilogue\(p, m0 \+ r(?: \+ 8)?, c, acc\[i\]\[j\]\[\d\], "
                            r"acc\[i\]\[j\]\[\d\], x\d, x\d)\);", r"\1" + args + ");", source)
    assert count == 2, count
    decl = [f"{pair} held_{param}[g0_cfg::kFragN];  // this thread's columns of {param}"
            for pair, _, param in loads]
    fill = ["{", "  using namespace g0_cfg;", "  const int warp_n = math_warp % kWarpsN;",
            "#pragma unroll", "  for (int j = 0; j < kFragN; ++j) {",
            "    const int c = warp_n * kWarpTileN + j * 8 + (lane % 4) * 2;"]
    fill += [f"    held_{param}[j] = *reinterpret_cast<const {pair}*>(p.{param} + c);"
             for pair, _, param in loads]
    fill += ["  }", "}"]
    if where == "loop":
        match = TILE_LOOP.search(source)
        indent = match[1]
        text = "".join(f"\n{indent}{line}" for line in decl + fill)
        return source[:match.start()] + text + source[match.start():]
    text = "".join(f"    {line}\n" for line in decl + fill)
    return once(source, G0_START, text + G0_START)


def variants(kern):
    from kgen import ir
    from kgen.api import build
    from kgen.targets.sm90 import chain as sm90_chain

    plan = build(kern, ir.Arch.SM90A, source_name="chain.kg").plan
    source = sm90_chain.emit(plan, source_name="chain.kg", source_hash="",
                             command="held_vectors_probe.py")
    return plan, {"base": source, "held": held(source, "loop"), "early": held(source, "tile")}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--compile-only", action="store_true")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dtypes", default="f16,bf16")
    parser.add_argument("--dump", default=None, help="write the first chain's variants here")
    args = parser.parse_args()
    if args.compile_only:
        from kgen.runtime import compile_cubin
        for k0, n0, n1 in CHAINS:
            plan, texts = variants(kernel("f16", k0, n0, n1))
            for name, text in texts.items():
                if args.dump:
                    Path(args.dump, f"{k0}_{n0}_{n1}_{name}.cu").write_text(text)
                result = compile_cubin(text, plan.name, "sm_90a")
                print(f"{k0}/{n0}/{n1} {name}: {result.registers} registers, "
                      f"spills {result.spill_stores}/{result.spill_loads}", flush=True)
        return 0
    from b2b_bench import copy_ms

    ok = True
    names = ("base", "held", "early")
    todo = [(dtype, chain, variants(kernel(dtype, *chain))) for dtype in args.dtypes.split(",")
            for chain in CHAINS]
    warm([(text, plan.name, plan.narrow_kernel) for _, _, (plan, texts) in todo
          for text in texts.values()])
    print(f"{'dtype':<5} {'K0':>5} {'N0':>4} {'N1':>4} {'schedule':<56} "
          + " ".join(f"{n:>8}" for n in names) + f" {'copy':>7} "
          + " ".join(f"{n + '/c':>8}" for n in names) + "  held/base early/base")
    for dtype, (k0, n0, n1), (plan, texts) in todo:
        kern = kernel(dtype, k0, n0, n1)
        best, good = time_in_turn(kern, {n: (plan, t) for n, t in texts.items()},
                                  args.rounds, f"{dtype} {k0}/{n0}/{n1}")
        ok &= good
        copy = copy_ms((M * k0 + M * n1) * 2)
        print(f"{dtype:<5} {k0:>5} {n0:>4} {n1:>4} {label(plan):<56} "
              + " ".join(f"{best[n]:8.4f}" for n in names) + f" {copy:7.4f} "
              + " ".join(f"{best[n] / copy:8.3f}" for n in names)
              + f"  {best['held'] / best['base']:9.3f} {best['early'] / best['base']:10.3f}",
              flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
