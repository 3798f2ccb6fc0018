"""Flash attention forward: kgen's loop kernel (written as a tile program, both targets' code:
kgen_sm80 the mma.sync skeleton, kgen_sm90a the sm_90a skeleton the rulebook picks, the
warp-specialized wgmma one) beside torch SDPA's flash, cuDNN and memory-efficient backends.
bf16, 16k tokens in all (batch = 16384 / S), head dims 64 and 128, S = T in {1024, 4096},
causal and not.
TFLOP/s = 4 * B * H * S * S * D / time, halved when causal; CUDA events, median of 30.

    python3 bench/attention.py            # prints a table (and --json FILE writes it)
    python3 bench/attention.py --long     # sm_90a at S 16384 and with GQA 8:1
    python3 bench/attention.py --mods     # kgen.attention's mods beside FlexAttention's

--mods: D 128, S 4096, causal and not (and GQA 16/2 with --gqa): plain, softcap 30, ALiBi (a slope per
head), a sliding window of 1024 (two-sided when not causal), a document mask (packed documents
of random lengths, about 1/1000 of the tokens start one) and an additive bias ([1, H, S, T],
bf16, shared by the batch), each through kgen.attention (the GPU's target) and through
torch.compile(flex_attention) with the same mods (masks as a BlockMask made once, outside the
timing); then each mod's kgen time / plain kgen time and Flex time / kgen time.
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

import kgen  # noqa: E402
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


def kgen_runner(arch: ir.Arch):
    """kgen's tile program (tests/loop_kernels.py) on `arch`'s skeleton: a runner."""
    def make(q, k, v, causal, mod):
        d = q.shape[-1]
        run = load_built(build_verified(lk.attention(d, causal=causal,
                                                     gqa=k.shape[1] != q.shape[1], arch=arch),
                                        arch))
        o, lse = torch.empty_like(q), torch.empty(q.shape[:3], device="cuda")
        return lambda: run(Q=q, K=k, V=v, O=o, lse=lse, scale=1.0 / math.sqrt(d))
    return make


def sdpa_runner(backend):
    return lambda q, k, v, causal, mod: sdpa(backend, q, k, v, causal)


def measure(d: int, s: int, causal: bool, kv_heads: int, runners, mod: str | None = None
            ) -> dict:
    """TFLOP/s of each runner (name -> make(q, k, v, causal, mod) -> a call) on the same
    fresh inputs: HEADS query heads, `kv_heads` key/value heads, batch TOKENS / s. The FLOPs
    are those of the plain (causal or not) attention, whatever the mod masks."""
    batch = TOKENS // s
    q = torch.randn(batch, HEADS, s, d, device="cuda").bfloat16()
    k, v = (torch.randn(batch, kv_heads, s, d, device="cuda").bfloat16() for _ in range(2))
    flops = 4 * batch * HEADS * s * s * d / (2 if causal else 1)
    row = {"d": d, "s": s, "causal": causal, "kv_heads": kv_heads, "mod": mod}
    for name, make in runners.items():
        try:
            ms = timed(make(q, k, v, causal, mod))
        except RuntimeError as err:  # a backend this build or GPU lacks
            row[name] = row[f"{name}_ms"] = None
            print(f"  {name}: {str(err).splitlines()[0]}")
            continue
        row[name], row[f"{name}_ms"] = flops / ms / 1e9, ms
    return row


def table(cases, runners, json_path: str | None, skeletons: bool = True) -> list[dict]:
    """One row per (D, S, causal, KV heads, mod) of `cases`, printed as it lands."""
    columns = list(runners)
    print(f"{torch.cuda.get_device_name()}, bf16, {TOKENS} tokens, {HEADS} query heads; "
          "TFLOP/s")
    for d in sorted({c[0] for c in cases}) if skeletons else ():  # kgen_sm90a's skeleton
        plan = build_verified(lk.attention(d, arch=ir.Arch.SM90A), ir.Arch.SM90A).plan
        skeleton = ("warp-specialized wgmma; " + plan.wgmma.overlap.value
                    if plan.wgmma is not None else "mma.sync")
        print(f"  kgen_sm90a at D {d}: {plan.config.value}, {skeleton}")
    mods = any(c[4] for c in cases)
    print(f"{'D':>4} {'S':>6} {'causal':>6} {'heads':>6} " + (f"{'mod':>10} " if mods else "")
          + " ".join(f"{n:>18}" for n in columns))
    rows = []
    for d, s, causal, kv_heads, mod in cases:
        row = measure(d, s, causal, kv_heads, runners, mod)
        rows.append(row)
        cells = " ".join(f"{row[n]:18.1f}" if row[n] is not None else f"{'-':>18}"
                         for n in columns)
        print(f"{d:>4} {s:>6} {str(causal):>6} {f'{HEADS}/{kv_heads}':>6} "
              + (f"{mod:>10} " if mods else "") + cells)
    if json_path:
        Path(json_path).write_text(json.dumps(rows, indent=1))
    return rows


# ---------------------------------------------------------------------------------------------
# --mods: kgen.attention's mods beside FlexAttention's

MODS = ("plain", "softcap", "alibi", "window", "document", "bias")
WINDOW = 1024


def _mod_inputs(q, k, mod):
    """The tensors a mod reads, made once per shape (seeded: the same for both runners)."""
    batch, heads, s = q.shape[0], q.shape[1], q.shape[2]
    gen = torch.Generator(device="cuda").manual_seed(s + heads)
    if mod == "alibi":
        return torch.tensor([2.0 ** (-8 * (h + 1) / heads) for h in range(heads)],
                            device="cuda")
    if mod == "document":  # about one document start per 1000 tokens, per batch
        starts = torch.rand(batch, s, device="cuda", generator=gen) < 1e-3
        return torch.cumsum(starts.int(), dim=1)
    if mod == "bias":
        return torch.randn(1, heads, s, k.shape[2], device="cuda", generator=gen).bfloat16()
    return None


def kgen_mods_runner(q, k, v, causal, mod):
    """kgen.attention with `mod` written as kgen expressions."""
    extra = _mod_inputs(q, k, mod)
    gqa = k.shape[1] != q.shape[1]
    options = {"plain": {},
               "softcap": dict(score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0}),
               "alibi": dict(score_mod="score - slopes[head] * (row - col)",
                             vectors={"slopes": extra}),
               "window": dict(mask_mod="col > row - window" if causal else
                              "(col > row - window) * (col < row + window)",
                              scalars={"window": float(WINDOW)}),
               "document": dict(mask_mod="qd[row] == kd[col]", vectors={"qd": extra, "kd": extra}),
               "bias": dict(attn_mask=extra)}[mod]
    return lambda: kgen.attention(q, k, v, is_causal=causal, enable_gqa=gqa, **options)


_FLEX = None


def flex_mods_runner(q, k, v, causal, mod):
    """torch.compile(flex_attention) with the same mod: score_mod for softcap, ALiBi and the
    bias; the masks (causal, window, document) as one BlockMask, made here."""
    global _FLEX
    from torch.nn.attention.flex_attention import and_masks, create_block_mask, flex_attention

    if _FLEX is None:
        _FLEX = torch.compile(flex_attention)
    extra = _mod_inputs(q, k, mod)
    batch, heads, s, t = q.shape[0], q.shape[1], q.shape[2], k.shape[2]
    score_mod = {
        "softcap": lambda x, b, h, i, j: 30.0 * torch.tanh(x / 30.0),
        "alibi": lambda x, b, h, i, j: x - extra[h] * (i - j),
        "bias": lambda x, b, h, i, j: x + extra[0, h, i, j],
    }.get(mod)
    masks = [lambda b, h, i, j: j <= i] if causal else []
    if mod == "window":
        masks.append(lambda b, h, i, j: (j > i - WINDOW) & (j < i + WINDOW))
    if mod == "document":
        masks.append(lambda b, h, i, j: extra[b, i] == extra[b, j])
    block_mask = None
    if masks:
        mask = and_masks(*masks) if len(masks) > 1 else masks[0]
        block_mask = create_block_mask(mask, batch if mod == "document" else None,
                                       None, s, t, device="cuda")
    gqa = k.shape[1] != q.shape[1]
    return lambda: _FLEX(q, k, v, score_mod=score_mod, block_mask=block_mask, enable_gqa=gqa)


def _cell(x, width: int, digits: int) -> str:
    return f"{x:{width}.{digits}f}" if x is not None else f"{'-':>{width}}"


def mods_summary(rows: list[dict]) -> None:
    """Each mod's kgen time over the plain kgen time of its (causal, heads) setting, and
    FlexAttention's time over kgen's (kgen's speedup), from `table`'s rows."""
    plain = {(r["causal"], r["kv_heads"]): r["kgen_ms"] for r in rows if r["mod"] == "plain"}
    print(f"{'causal':>6} {'heads':>6} {'mod':>10} {'kgen ms':>9} {'/ plain':>8} "
          f"{'Flex ms':>9} {'Flex/kgen':>10}")
    for r in rows:
        base = plain.get((r["causal"], r["kv_heads"]))
        ratio = r["kgen_ms"] / base if r["kgen_ms"] and base else None
        speed = r["flex_ms"] / r["kgen_ms"] if r["kgen_ms"] and r["flex_ms"] else None
        heads = f"{HEADS}/{r['kv_heads']}"
        print(f"{str(r['causal']):>6} {heads:>6} {r['mod']:>10} {_cell(r['kgen_ms'], 9, 3)} "
              f"{_cell(ratio, 8, 2)} {_cell(r['flex_ms'], 9, 3)} {_cell(speed, 10, 2)}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--json", default=None)
    parser.add_argument("--long", action="store_true",
                        help="the sm_90a kernel only, at S 16384 and with GQA 8:1 (16 query "
                             "heads, 2 KV heads) at S 4096, beside SDPA's flash and cuDNN")
    parser.add_argument("--mods", action="store_true",
                        help="kgen.attention's mods beside torch.compile(flex_attention)'s, "
                             "D 128 S 4096, causal and not")
    parser.add_argument("--gqa", action="store_true",
                        help="with --mods: a GQA 16/2 row too (not causal)")
    parser.add_argument("--once", action="store_true",
                        help="one ragged causal GQA call of each target's kernel, no timing "
                             "(for compute-sanitizer)")
    args = parser.parse_args()
    if args.once:
        return once()
    from torch.nn.attention import SDPBackend

    if args.mods:
        settings = ((False, HEADS), (True, HEADS)) + (((False, 2),) if args.gqa else ())
        cases = [(128, 4096, c, kv, mod) for c, kv in settings for mod in MODS]
        rows = table(cases, {"kgen": kgen_mods_runner, "flex": flex_mods_runner}, args.json,
                     skeletons=False)
        return mods_summary(rows)
    backends = {"sdpa_flash": sdpa_runner(SDPBackend.FLASH_ATTENTION),
                "sdpa_cudnn": sdpa_runner(SDPBackend.CUDNN_ATTENTION)}
    if args.long:
        cases = [(d, 16384, c, HEADS, None) for d in (64, 128) for c in (False, True)]
        cases += [(128, 4096, c, 2, None) for c in (False, True)]
        return table(cases, {"kgen_sm90a": kgen_runner(ir.Arch.SM90A), **backends}, args.json)
    backends["sdpa_mem_efficient"] = sdpa_runner(SDPBackend.EFFICIENT_ATTENTION)
    cases = [(d, s, c, HEADS, None) for d in (64, 128) for s in (1024, 4096)
             for c in (False, True)]
    table(cases, {"kgen_sm80": kgen_runner(ir.Arch.SM80),
                  "kgen_sm90a": kgen_runner(ir.Arch.SM90A), **backends}, args.json)


if __name__ == "__main__":
    main()
