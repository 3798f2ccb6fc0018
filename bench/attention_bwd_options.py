"""The attention backward's options added in session 13, through kgen.attention (autograd):

- a value head dim unlike the query's (D_v != D): 192 / 128 (DeepSeek's), 128 / 64, 64 / 128,
  and D 192 alone, beside the plain D 128 backward; TFLOP/s count the backward as 2.5 x the
  forward's 2 * B * H * S * T * (D + D_v), halved when causal; beside SDPA's cuDNN backend where
  it takes the pair (its backward of a saved graph, the forward excluded), else its note;
- a block mask (bench/mods.py's random FlexAttention BlockMask: half the 128 x 128 blocks
  skipped and the rest full; causal: the diagonal partial, half the blocks below it full),
  beside the plain backward of the same causal setting and beside torch.compile(flex_attention)
  with the same BlockMask (its gradients checked against kgen's).

bf16, batch 4, 16 heads, S = T = 4096; each time is torch.autograd.grad of a saved graph
(kgen/harness/attention_bwd_mods.py `_grad`: the forward excluded), the median of 15 calls.

    python3 bench/attention_bwd_options.py [--s S] [--no-flex]
    python3 bench/attention_bwd_options.py --once   # one small call of each, no timing (for
                                                    # compute-sanitizer)
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

BATCH, HEADS = 4, 16
PAIRS = ((128, 128), (192, 128), (192, 192), (128, 64), (64, 128))


def _leaves(s: int, d: int, d_v: int, seed: int = 0):
    import torch

    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, k = (torch.randn(BATCH, HEADS, s, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    v, do = (torch.randn(BATCH, HEADS, s, d_v, device="cuda", generator=gen).bfloat16()
             for _ in range(2))
    return q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), do


def _tflops(s: int, d: int, d_v: int, causal: bool, ms: float) -> float:
    flops = 2.5 * 2 * BATCH * HEADS * s * s * (d + d_v) / (2 if causal else 1)
    return flops / (ms * 1e-3) / 1e12


def value_dims(s: int) -> None:
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import kgen
    from kgen.harness.attention_bwd_mods import _grad, _median_ms

    print(f"value head dims (B {BATCH}, H {HEADS}, S {s}): ms and TFLOP/s of the backward")
    print(f"{'D':>4} {'D_v':>4} {'causal':>6} {'kgen ms':>8} {'TFLOP/s':>8} {'cuDNN ms':>9} "
          f"{'TFLOP/s':>8} {'kgen/cuDNN':>10}")
    for d, d_v in PAIRS:
        for causal in (False, True):
            q, k, v, do = _leaves(s, d, d_v)
            ms = _median_ms(_grad(lambda: kgen.attention(q, k, v, is_causal=causal),
                                  (q, k, v), do))
            cudnn = None
            try:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    call = _grad(lambda: torch.nn.functional.scaled_dot_product_attention(
                        q, k, v, is_causal=causal), (q, k, v), do)
                    cudnn = _median_ms(call)
            except Exception as err:  # noqa: BLE001 (the backend's refusal, as a note)
                note = str(err).strip().splitlines()[0][:60] if str(err).strip() else "refused"
            cells = (f"{cudnn:9.3f} {_tflops(s, d, d_v, causal, cudnn):8.1f} "
                     f"{cudnn / ms:10.2f}" if cudnn else f"  cuDNN: {note}")
            print(f"{d:4} {d_v:4} {str(causal):>6} {ms:8.3f} "
                  f"{_tflops(s, d, d_v, causal, ms):8.1f} {cells}", flush=True)
            del q, k, v, do


def block_masks(s: int, flex: bool) -> None:
    import torch

    import kgen
    from kgen.harness.attention_bwd_mods import _grad, _median_ms, relative_difference
    from mods import _random_blocks

    print(f"block mask (D 128, B {BATCH}, H {HEADS}, S {s}): backward ms; blocks / plain; "
          "Flex / kgen")
    masks = _random_blocks(s, s, torch.Generator(device="cuda").manual_seed(s))
    if flex:
        from torch.nn.attention.flex_attention import flex_attention
        compiled = torch.compile(flex_attention)
    for causal in (False, True):
        q, k, v, do = _leaves(s, 128, 128)
        plain = _median_ms(_grad(lambda: kgen.attention(q, k, v, is_causal=causal),
                                 (q, k, v), do))
        call = _grad(lambda: kgen.attention(q, k, v, is_causal=causal,
                                            block_mask=masks[causal]), (q, k, v), do)
        want = call()
        ms = _median_ms(call)
        line = (f"causal {str(causal):5} plain {plain:7.3f} blocks {ms:7.3f} "
                f"({ms / plain:5.2f}x plain)")
        if flex:
            flex_call = _grad(lambda: compiled(q, k, v, block_mask=masks[causal]), (q, k, v),
                              do)
            diff = relative_difference(flex_call(), want)
            flex_ms = _median_ms(flex_call)
            line += f" Flex {flex_ms:7.3f} ({flex_ms / ms:5.2f}x kgen's speed; grads {diff:.1e})"
        print(line, flush=True)


def once() -> None:
    """One small call of each option (S 1000), forward and backward, for compute-sanitizer."""
    import torch

    import kgen
    from mods import _random_blocks

    for d, d_v in PAIRS[1:]:
        q, k, v, do = _leaves(1000, d, d_v)
        kgen.attention(q, k, v, is_causal=True).backward(do)
    masks = _random_blocks(1000, 1000, torch.Generator(device="cuda").manual_seed(1))
    for causal in (False, True):
        q, k, v, do = _leaves(1000, 128, 128)
        kgen.attention(q, k, v, is_causal=causal, block_mask=masks[causal]).backward(do)
    torch.cuda.synchronize()
    print("once: done")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--s", type=int, default=4096)
    parser.add_argument("--no-flex", action="store_true")
    parser.add_argument("--once", action="store_true")
    args = parser.parse_args(argv)
    if args.once:
        once()
        return
    value_dims(args.s)
    block_masks(args.s, not args.no_flex)


if __name__ == "__main__":
    main()
