"""A diagnostic, not a product path: what still bounds the ping-pong chains over 1.2x the copy
(256/128/256 above all) at the eleventh stop's code, issue 17, on the H200.

Each diagnostic removes one part of every tile's work from the builder's emitted text (their
results are wrong by design, so only the base is checked against the reference):
  -A reloads     A copied into the ring's first fills only: no DRAM reads after the first tile
  -D1 stores     the staging is written, the copy engine never stores it
  -A -D1         both: the consumers' path alone (wgmma, both epilogues, staging, turns)
  -pass wait     the second column pass writes its staging without waiting for the copy engine
                 to have read the first pass's (the bound of a second staging buffer)
  -g0 epilogue   g0's accumulators packed as they are (no vector reads, no math)
  -A -D1 -sync   -A -D1, and the staging written with no wait and no warpgroup barrier
and one prototype, checked against the reference like the base:
  warp stores    each warp stores its own 16 rows of the staging (64 x 16 boxes), with no
                 warpgroup barrier around the staging
All are timed in turn (kgen's timer: CUDA events, median of 30, inputs rotated past L2) over
`--rounds` rounds, the fastest kept; beside them a device copy of the same bytes.

    bash .gpu/device-run.sh python3 bench/prototypes/bound_probe.py [--chains 256/128/256,...]
"""
from __future__ import annotations

import argparse
import dataclasses
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "bench" / "prototypes"))

from chain_ring import (chain_copy_ms, chain_spec, kernel, label, time_in_turn,  # noqa: E402
                        warm)
from epilogue_clock import once  # noqa: E402
from feed_overlap_probe import without_a, without_store  # noqa: E402

PASS_WAIT = ("if (tid % kWarpgroupThreads == 0) bulk_wait_read();  // the copy engine has read "
             "this warpgroup's last tile")


def without_pass_wait(source: str) -> str:
    """Only the first column pass waits for the copy engine to have read the staging."""
    assert "for (int pass = 0;" in source, "one column pass"
    return once(source, PASS_WAIT, PASS_WAIT.replace("if (", "if (pass == 0 && ", 1))


def without_epilogue0(source: str) -> str:
    """g0's epilogue reads no vectors and does no math: the accumulators are packed as they are
    (with or without the early vectors' arguments)."""
    out, count = re.subn(r"g0_epilogue\(p, [^,]+, c, acc\[i\]\[j\]\[(\d)\], acc\[i\]\[j\]\[(\d)\], "
                         r"(x\d), (x\d)(?:, [^;]*)?\);", r"\3 = acc[i][j][\1]; \4 = acc[i][j][\2];",
                         source)
    assert count == 2, count
    return out


SYNC_HEAD = (PASS_WAIT + "\n{pad}warpgroup_barrier(warpgroup);\n")
FENCE = "fence_proxy_async();  // written through the generic proxy, read by the copy engine\n"
SYNC_TAIL = (FENCE
             + "{pad}warpgroup_barrier(warpgroup);\n"
             "{pad}if (tid % kWarpgroupThreads == 0) {{\n"
             "#pragma unroll\n"
             "{pad}  for (int box = 0; box < kTileN / 64; ++box)\n"
             "{pad}    tma_store_box(&maps.D1, staging + box * kStagingBoxBytes, n0 + box * 64, "
             "m0);\n"
             "{pad}  bulk_commit();\n"
             "{pad}}}\n")
END_WAIT = ("if (tid % kWarpgroupThreads == 0) bulk_wait_read();  // the copy engine has read this "
            "warpgroup's last staging")


def pad(source: str) -> str:
    """The epilogue's indent: 8 inside the column-pass loop, else 6."""
    return " " * 8 if "for (int pass = 0;" in source else " " * 6


def without_sync(source: str) -> str:
    """The staging written with no wait for the copy engine and no warpgroup barrier, never
    stored (with -A: the consumers' math alone, no store path)."""
    indent = pad(source)
    source = once(source, SYNC_HEAD.format(pad=indent), "")
    return once(source, SYNC_TAIL.format(pad=indent), "")


def warp_stores(source: str) -> str:
    """A prototype, checked: each warp stores its own 16 rows of the staging (boxes of 64 x 16,
    the map's box below), its lane 0 waiting for its own stores' reads; no warpgroup barrier."""
    indent = pad(source)
    source = once(source, SYNC_HEAD.format(pad=indent),
                  "if (lane == 0) bulk_wait_read();  // this warp's last stores have read its "
                  f"rows\n{indent}__syncwarp();\n")
    source = once(source, SYNC_TAIL.format(pad=indent),
                  FENCE
                  + f"{indent}__syncwarp();\n"
                  f"{indent}if (lane == 0) {{\n"
                  "#pragma unroll\n"
                  f"{indent}  for (int box = 0; box < kTileN / 64; ++box)\n"
                  f"{indent}    tma_store_box(&maps.D1, staging + box * kStagingBoxBytes"
                  " + math_warp * 16 * 128, n0 + box * 64, m0 + 16 * math_warp);\n"
                  f"{indent}  bulk_commit();\n"
                  f"{indent}}}\n")
    return once(source, END_WAIT, "if (lane == 0) bulk_wait_read();  // each warp's last stores")


def warp_plan(plan):
    """The plan with the output map's box 16 rows high (warp_stores)."""
    maps = tuple(dataclasses.replace(m, box=(m.box[0], 16)) if m.store else m
                 for m in plan.schedule.tensor_maps)
    return dataclasses.replace(plan, schedule=dataclasses.replace(plan.schedule, tensor_maps=maps))


DIAGNOSTICS = {"-A reloads": without_a, "-D1 stores": without_store,
               "-A -D1": lambda s: without_store(without_a(s)),
               "-pass wait": without_pass_wait, "-g0 epilogue": without_epilogue0,
               "-A -D1 -sync": lambda s: without_sync(without_a(s))}
CHECKED = {"warp stores": (warp_plan, warp_stores)}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--chains", default="f16/256/128/256,bf16/256/128/256,f16/256/128/128,"
                        "f16/576/128/256,f16/256/64/256")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    from kgen import ir
    from kgen.api import build
    from kgen.targets.sm90 import chain as sm90_chain

    todo = []
    for spec in args.chains.split(","):
        kern = kernel(*chain_spec(spec))
        plan = build(kern, ir.Arch.SM90A, source_name="chain.kg").plan
        base = sm90_chain.emit(plan, source_name="chain.kg", source_hash="",
                               command="bound_probe.py")
        texts = {"base": (plan, base)}
        for name, edit in DIAGNOSTICS.items():
            try:
                texts[name] = (plan, edit(base))
            except AssertionError:  # not this chain's code (one column pass)
                pass
        for name, (replan, edit) in CHECKED.items():
            try:
                texts[name] = (replan(plan), edit(base))
            except AssertionError:
                pass
        todo.append((spec, kern, plan, texts))
    warm([(text, plan.name, plan.narrow_kernel) for _, _, plan, texts in todo
          for _, text in texts.values()])
    names = ["base", *DIAGNOSTICS, *CHECKED]
    print(f"{'chain':<16} {'copy':>7} " + " ".join(f"{n:>15}" for n in names))
    for spec, kern, plan, texts in todo:
        best, _ = time_in_turn(kern, texts, args.rounds, spec, frozenset(DIAGNOSTICS))
        _, k0, _, n1 = chain_spec(spec)
        copy = chain_copy_ms(k0, n1)
        print(f"{spec:<16} {copy:7.4f} " + " ".join(
            f"{best[n]:7.4f} ({best[n] / copy:.3f})" if n in best else f"{'-':>15}"
            for n in names) + f"  [{label(plan)}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
