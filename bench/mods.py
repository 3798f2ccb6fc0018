"""kgen.attention's mods beside FlexAttention's (`python3 bench/attention.py --mods`): D 128,
S 4096, causal and not (and GQA 16/2 with --gqa): plain, softcap 30, ALiBi (a slope per head), a
sliding window of 1024 (two-sided when not causal), a document mask (packed documents of random
lengths, about 1/1000 of the tokens start one), an additive bias ([1, H, S, T], bf16, shared
by the batch) and a random block mask (half the 128 x 128 blocks skipped, the rest full;
causal: the diagonal blocks partial, under the causal mask, and half the blocks below it full;
the same seeded FlexAttention BlockMask for both, kgen converting it), each through kgen.attention (the GPU's target) and through
torch.compile(flex_attention) with the same mods (masks as a BlockMask made once, outside the
timing); then each mod's kgen time / plain kgen time and Flex time / kgen time. bf16, 16k
tokens, 16 query heads; CUDA events, median of 30.
"""
from __future__ import annotations

import torch

import kgen

HEADS = 16
TOKENS = 16384



MODS = ("plain", "softcap", "alibi", "window", "document", "bias", "blocks")
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
    if mod == "blocks":
        return _random_blocks(s, k.shape[2], gen)
    return None


def _random_blocks(s: int, t: int, gen):
    """A FlexAttention BlockMask of 128 x 128 blocks shared by batch and heads, per causal
    setting (a dict by `causal`): not causal, half the blocks skipped and the rest full;
    causal, the diagonal partial (the causal mask applies there) and half the blocks below it
    full."""
    from torch.nn.attention.flex_attention import BlockMask

    tiles, blocks = -(-s // 128), -(-t // 128)
    visited = torch.rand(1, 1, tiles, blocks, device="cuda", generator=gen) < 0.5
    row = torch.arange(tiles, device="cuda")[:, None]
    col = torch.arange(blocks, device="cuda")[None, :]

    def ordered(dense):
        dense = dense.to(torch.int32)
        return (dense.sum(-1).to(torch.int32),
                torch.argsort(dense, dim=-1, descending=True, stable=True).to(torch.int32))

    out = {}
    for causal in (False, True):
        partial = ((row == col) & torch.ones_like(visited)) if causal else \
            torch.zeros_like(visited)
        full = visited & (col < row) if causal else visited
        out[causal] = BlockMask.from_kv_blocks(
            *ordered(partial), *ordered(full), BLOCK_SIZE=128,
            mask_mod=(lambda b, h, i, j: j <= i) if causal else None, seq_lengths=(s, t))
    return out


def kgen_mods_runner(q, k, v, causal, mod):
    """kgen.attention with `mod` written as kgen expressions."""
    options = mod_options(mod, causal, _mod_inputs(q, k, mod))
    gqa = k.shape[1] != q.shape[1]
    return lambda: kgen.attention(q, k, v, is_causal=causal, enable_gqa=gqa, **options)


def mod_options(mod: str, causal: bool, extra) -> dict:
    """kgen.attention's options for `mod` (MODS, or "dropout": p 0.1), `extra` the tensor it
    reads (_mod_inputs: ALiBi's slopes, the document ids, the bias, the BlockMasks by causal)."""
    if mod == "dropout":
        return dict(dropout_p=0.1)
    return {"plain": {},
            "softcap": dict(score_mod="cap * tanh(score / cap)", scalars={"cap": 30.0}),
            "alibi": dict(score_mod="score - slopes[head] * (row - col)",
                          vectors={"slopes": extra}),
            "window": dict(mask_mod="col > row - window" if causal else
                           "(col > row - window) * (col < row + window)",
                           scalars={"window": float(WINDOW)}),
            "document": dict(mask_mod="qd[row] == kd[col]", vectors={"qd": extra, "kd": extra}),
            "bias": dict(attn_mask=extra),
            "blocks": dict(block_mask=extra[causal] if mod == "blocks" else None)}[mod]


def flex_mods_runner(q, k, v, causal, mod):
    """torch.compile(flex_attention) with the same mod (kgen/harness/flex_mods.py): score_mod
    for softcap, ALiBi and the bias; the masks (causal, window, document) as one BlockMask,
    made here."""
    from kgen.harness import flex_mods

    extra = _mod_inputs(q, k, mod)
    batch, s, t = q.shape[0], q.shape[2], k.shape[2]
    if mod == "blocks":  # the same BlockMask as kgen's (its causal mask on the diagonal)
        score, block_mask = None, extra[causal]
    else:
        score = flex_mods.score_mod(mod, extra)
        block_mask = flex_mods.block_mask(flex_mods.mask_mods(mod, causal, extra, WINDOW),
                                          mod, batch, s, t)
    gqa = k.shape[1] != q.shape[1]
    flex = flex_mods.compiled()
    return lambda: flex(q, k, v, score_mod=score, block_mask=block_mask, enable_gqa=gqa)


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


def measure(s: int, causal: bool, kv_heads: int, mod: str, timed, d: int = 128,
            flex: bool = True) -> dict:
    """kgen's and Flex's milliseconds for `mod` on the same fresh inputs (batch TOKENS / s);
    without `flex`, kgen's only."""
    batch = TOKENS // s
    q = torch.randn(batch, HEADS, s, d, device="cuda").bfloat16()
    k, v = (torch.randn(batch, kv_heads, s, d, device="cuda").bfloat16() for _ in range(2))
    row = {"d": d, "s": s, "causal": causal, "kv_heads": kv_heads, "mod": mod, "flex_ms": None}
    runners = (("kgen", kgen_mods_runner),) + ((("flex", flex_mods_runner),) if flex else ())
    for name, make in runners:
        try:
            row[f"{name}_ms"] = timed(make(q, k, v, causal, mod))
        except RuntimeError as err:  # a backend this build or GPU lacks
            row[f"{name}_ms"] = None
            print(f"  {name} {mod}: {str(err).splitlines()[0]}")
    return row


def table(timed, gqa: bool = False, flex: bool = True, only=None) -> list[dict]:
    """Every mod (or those in `only`; plain always) at D 128, S 4096, causal and not (and GQA
    16/2 not causal with `gqa`), then the summary (without `flex`, kgen's times only)."""
    settings = ((False, HEADS), (True, HEADS)) + (((False, 2),) if gqa else ())
    print(f"{torch.cuda.get_device_name()}, bf16, {TOKENS} tokens, {HEADS} query heads, D 128, "
          "S 4096")
    rows = [measure(4096, causal, kv, mod, timed, flex=flex) for causal, kv in settings
            for mod in MODS if only is None or mod == "plain" or mod in only]
    mods_summary(rows)
    return rows


def once() -> None:
    """One call of the bias, document, window and block-mask mods at ragged lengths (S 1000,
    T 1000, 2 batches, 4 heads), causal and not, no timing: for compute-sanitizer (the bias
    staged by the copy engine on sm_90a; the block mask's lists read by producer and consumers)."""
    q, k, v = (torch.randn(2, 4, 1000, 128, device="cuda").bfloat16() for _ in range(3))
    for causal in (False, True):
        for mod in ("bias", "document", "window", "blocks"):
            kgen_mods_runner(q, k, v, causal, mod)()
    torch.cuda.synchronize()
    print("mods once: ok")


def _graphed(fn):
    """`fn` captured in a CUDA graph (after warm-ups on a side stream): its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return graph.replay


def graph_table(timed) -> None:
    """kgen's plain, document, bias and softcap kernels and one document (every id equal:
    nothing skipped, every block inside, the equality's scan alone), D 128 S 4096, causal and
    not: each call timed as `table` times it (the host's preparation inside) and replayed from
    a CUDA graph (the GPU's time alone)."""
    q, k, v = (torch.randn(TOKENS // 4096, HEADS, 4096, 128, device="cuda").bfloat16()
               for _ in range(3))
    one = torch.zeros(4096, device="cuda")
    for causal in (False, True):
        runs = {m: kgen_mods_runner(q, k, v, causal, m)
                for m in ("plain", "document", "bias", "softcap")}
        runs["one document"] = lambda: kgen.attention(
            q, k, v, is_causal=causal, mask_mod="qd[row] == kd[col]",
            vectors={"qd": one, "kd": one})
        base = None
        for name, fn in runs.items():
            eager = timed(fn)
            replay = timed(_graphed(fn))
            base = base or replay
            print(f"causal {causal!s:5} {name:12} per call {eager:.3f} ms  graph replay "
                  f"{replay:.3f} ms  replay / plain replay {replay / base:.2f}")

