"""Flash attention forward: kgen's loop kernel (written as a tile program, both targets' code:
kgen_sm80 the mma.sync skeleton, kgen_sm90a the sm_90a skeleton the rulebook picks, the
warp-specialized wgmma one) beside torch SDPA's flash, cuDNN and memory-efficient backends.
bf16, 16k tokens in all (batch = 16384 / S), head dims 64 and 128, S = T in {1024, 4096},
causal and not.
TFLOP/s = 4 * B * H * S * S * D / time, halved when causal; CUDA events, median of 30.

    python3 bench/attention.py            # prints a table (and --json FILE writes it)
    python3 bench/attention.py --long     # sm_90a at S 16384 and with GQA 8:1
"""
from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from kgen import ir  # noqa: E402
from kgen.api import build_verified, load_built  # noqa: E402
from tests import loop_kernels as lk  # noqa: E402

HEADS = 16
TOKENS = 16384


def timed(fn, reps: int = 30) -> float:
    """Median milliseconds of `fn` over `reps` runs, after 3 warm-ups."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def sdpa(backend, q, k, v, causal):
    from torch.nn.attention import sdpa_kernel
    gqa = k.shape[1] != q.shape[1]

    def run():
        with sdpa_kernel(backend):
            torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal,
                                                             enable_gqa=gqa)
    return run


def once() -> None:
    for arch in (ir.Arch.SM80, ir.Arch.SM90A):
        run = load_built(build_verified(lk.attention(128, causal=True, gqa=True, arch=arch),
                                        arch))
        q = torch.randn(2, 8, 1000, 128, device="cuda").bfloat16()
        k, v = (torch.randn(2, 1, 4097, 128, device="cuda").bfloat16() for _ in range(2))
        o = torch.empty_like(q)
        lse = torch.empty(2, 8, 1000, device="cuda")
        run(Q=q, K=k, V=v, O=o, lse=lse)
        torch.cuda.synchronize()
        print(arch.value, "ran; O finite:", bool(torch.isfinite(o).all()))


def measure(d: int, s: int, causal: bool, kv_heads: int, archs, backends) -> dict:
    """TFLOP/s of kgen's kernel for each target in `archs` and of each SDPA backend, on the
    same fresh inputs: HEADS query heads, `kv_heads` key/value heads, batch TOKENS / s."""
    batch = TOKENS // s
    q = torch.randn(batch, HEADS, s, d, device="cuda").bfloat16()
    k, v = (torch.randn(batch, kv_heads, s, d, device="cuda").bfloat16() for _ in range(2))
    o = torch.empty_like(q)
    lse = torch.empty(batch, HEADS, s, device="cuda")
    flops = 4 * batch * HEADS * s * s * d / (2 if causal else 1)
    row = {"d": d, "s": s, "causal": causal, "kv_heads": kv_heads}
    for arch in archs:
        run = load_built(build_verified(lk.attention(d, causal=causal, gqa=kv_heads != HEADS,
                                                     arch=arch), arch))
        ms = timed(lambda: run(Q=q, K=k, V=v, O=o, lse=lse, scale=1.0 / math.sqrt(d)))
        row[f"kgen_{arch.value.replace('_', '')}"] = flops / ms / 1e9
    for name, backend in backends.items():
        try:
            row[name] = flops / timed(sdpa(backend, q, k, v, causal)) / 1e9
        except RuntimeError as err:  # a backend this build or GPU lacks
            row[name] = None
            print(f"  {name}: {str(err).splitlines()[0]}")
    return row


def table(cases, archs, backends, json_path: str | None) -> None:
    """One row per (D, S, causal, KV heads) of `cases`, printed as it lands."""
    columns = [f"kgen_{a.value.replace('_', '')}" for a in archs] + list(backends)
    print(f"{torch.cuda.get_device_name()}, bf16, {TOKENS} tokens, {HEADS} query heads; "
          "TFLOP/s")
    for d in sorted({c[0] for c in cases}):  # which skeleton each kgen column runs, and how
        if ir.Arch.SM80 in archs:
            plan = build_verified(lk.attention(d, arch=ir.Arch.SM80), ir.Arch.SM80).plan
            print(f"  kgen_sm80 at D {d}: {plan.config.value} "
                  f"({plan.tile_m // plan.warps} rows a warp), mma.sync")
        plan = build_verified(lk.attention(d, arch=ir.Arch.SM90A), ir.Arch.SM90A).plan
        skeleton = ("warp-specialized wgmma; " + plan.wgmma.overlap.value
                    if plan.wgmma is not None else "mma.sync")
        print(f"  kgen_sm90a at D {d}: {plan.config.value}, {skeleton}")
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'heads':>6} " + " ".join(f"{n:>18}" for n in columns))
    rows = []
    for d, s, causal, kv_heads in cases:
        row = measure(d, s, causal, kv_heads, archs, backends)
        rows.append(row)
        cells = " ".join(f"{row[n]:18.1f}" if row[n] is not None else f"{'-':>18}"
                         for n in columns)
        print(f"{d:>4} {s:>6} {str(causal):>6} {f'{HEADS}/{kv_heads}':>6} {cells}")
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--long", action="store_true",
                        help="the sm_90a kernel only, at S 16384 and with GQA 8:1 (16 query "
                             "heads, 2 KV heads) at S 4096, beside SDPA's flash and cuDNN")
    parser.add_argument("--once", action="store_true",
                        help="one ragged causal GQA call of each target's kernel, no timing "
                             "(for compute-sanitizer)")
    args = parser.parse_args()
    if args.once:
        return once()
    from torch.nn.attention import SDPBackend

    backends = {"sdpa_flash": SDPBackend.FLASH_ATTENTION,
                "sdpa_cudnn": SDPBackend.CUDNN_ATTENTION}
    if args.long:
        cases = [(d, 16384, c, HEADS) for d in (64, 128) for c in (False, True)]
        cases += [(128, 4096, c, 2) for c in (False, True)]
        return table(cases, (ir.Arch.SM90A,), backends, args.json)
    backends["sdpa_mem_efficient"] = SDPBackend.EFFICIENT_ATTENTION
    cases = [(d, s, c, HEADS) for d in (64, 128) for s in (1024, 4096) for c in (False, True)]
    table(cases, (ir.Arch.SM80, ir.Arch.SM90A), backends, args.json)


if __name__ == "__main__":
    main()
