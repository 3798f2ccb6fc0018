"""The attention backward with the forward's mods (kgen/attention_grad_mods.py) against the plain
backward, on the GPU: the backward sequence (D, the main kernel, the dQ conversion) kgen.attention
runs, timed with CUDA events (median), each mod beside the plain backward of the same causal
setting, bf16, 16k tokens, hidden 2048 (D 128: 16 heads, S 4096: batch 4).

    python3 bench/attention_bwd.py --mods [--d 128] [--s 4096] [--arch sm_80]
    python3 bench/attention_bwd.py --mods --once    # one small call per mod, no timing (for
                                                    # compute-sanitizer; --only NAME: one)
    python3 bench/attention_bwd.py --mods --compile # only build and load them (NVRTC cache)
"""
from __future__ import annotations

import argparse
import math

from ..attention import _arch
from ..attention_grad import BackwardSignature, _backward_op
from ..attention_grad_mods import Mods, bias_transposed
from .timing import call_median_ms

TOKENS, HIDDEN = 16384, 2048
MODS = {  # name: (causal, Mods, scalars)
    "plain": (False, Mods(), {}),
    "plain causal": (True, Mods(), {}),
    "softcap": (False, Mods(score_mod="cap * tanh(score / cap)", scalars=("cap",)),
                {"cap": 30.0}),
    "softcap causal": (True, Mods(score_mod="cap * tanh(score / cap)", scalars=("cap",)),
                       {"cap": 30.0}),
    "alibi": (False, Mods(score_mod="score - slopes[head] * (row - col)",
                          vectors=(("slopes", "head"),)), {}),
    "alibi causal": (True, Mods(score_mod="score - slopes[head] * (row - col)",
                                vectors=(("slopes", "head"),)), {}),
    "window 1024 causal": (True, Mods(mask_mod="col > row - window", scalars=("window",)),
                           {"window": 1024.0}),
    "document": (False, Mods(mask_mod="qd[row] == kd[col]",
                             vectors=(("kd", "col"), ("qd", "row"))), {}),
    "dropout 0.1": (False, Mods(dropout=True), {"seed": 5, "offset": 8, "dropout_p": 0.1,
                                                 "dropout_scale": 1 / 0.9}),
    "bias": (False, Mods(bias="tensor"), {}),
    "bias grad": (False, Mods(bias="tensor", bias_grad=True), {}),
    "bias grad causal": (True, Mods(bias="tensor", bias_grad=True), {}),
}


def _inputs(sig: BackwardSignature, b: int, h: int, s: int, scalars: dict) -> dict:
    import torch

    d = sig.d
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, do, o = (torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16()
                      for _ in range(5))
    lse = torch.full((b, h, s), math.log(s) + 1.0, device="cuda")  # P about e^-1 / S
    given = {"dO": do, "O": o, "Q": q, "K": k, "V": v, "lse": lse, "scale": 1 / math.sqrt(d),
             **scalars}
    m = sig.mods
    if m.bias == "tensor":
        given["BiasT"] = bias_transposed(torch.randn(1, h, s, s, device="cuda",
                                                     generator=gen).bfloat16(), q, k)
    for name, index in m.vectors:
        if index == "head":
            given[name] = torch.rand(h, device="cuda") * 0.1
        else:  # 8 documents per sequence
            ids = (torch.arange(s, device="cuda") * 8 // s).float()
            given[name] = ids.expand(b, h, s)
    return given


def _call(sig: BackwardSignature, given: dict):
    import torch

    op, inputs, _ = _backward_op(sig, torch.cuda.current_device())
    args = [given[name] for name in inputs]
    return lambda: op(*args)


def _median_ms(fn, reps: int = 15) -> float:
    return call_median_ms(fn, reps, warmups=1)


def main(argv=None) -> None:
    import torch

    parser = argparse.ArgumentParser(prog="bench/attention_bwd.py --mods")
    parser.add_argument("--d", type=int, default=128)
    parser.add_argument("--s", type=int, default=4096)
    parser.add_argument("--arch", default=None)
    parser.add_argument("--once", action="store_true")
    parser.add_argument("--only", default=None, help="--once: one mod's name")
    parser.add_argument("--compile", action="store_true", help="build and load every "
                        "backward (the NVRTC cache), no call")
    args = parser.parse_args(argv)
    arch = args.arch or _arch(torch.device("cuda"))
    if args.compile:
        for d in (64, args.d):
            for causal, mods, _ in MODS.values():
                _backward_op(BackwardSignature("bf16", d, causal, arch, mods=mods),
                             torch.cuda.current_device())
        return
    if args.once:
        for name, (causal, mods, scalars) in MODS.items():
            if args.only and name != args.only:
                continue
            sig = BackwardSignature("bf16", 64, causal, arch, mods=mods)
            _call(sig, _inputs(sig, 1, 2, 304, scalars))()  # S: a multiple of 8 (dBiasT)
            torch.cuda.synchronize()
            print(f"{name}: ran")
        return
    h = HIDDEN // args.d
    b = TOKENS // args.s
    base = {}
    print(f"# D {args.d} S {args.s} batch {b} heads {h} {arch} (ms, median; ratio to the plain "
          "backward of the same causal setting)")
    for name, (causal, mods, scalars) in MODS.items():
        sig = BackwardSignature("bf16", args.d, causal, arch, mods=mods)
        ms = _median_ms(_call(sig, _inputs(sig, b, h, args.s, scalars)))
        flops = 2.5 * 4 * b * h * args.s * args.s * args.d / (2 if causal else 1)
        if name.startswith("plain"):
            base[causal] = ms
        print(f"{name:20s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s "
              f"{ms / base[causal]:5.2f}x")

