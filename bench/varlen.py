"""Packed variable-length sequences (`python3 bench/attention.py --varlen`): kgen's varlen
kernel (kgen.attention_varlen) on documents of random lengths packed into 16k tokens, beside
kgen's dense kernel on the same documents padded to the longest, and torch's flash varlen
(aten._flash_attention_forward with cumulative lengths) where this torch has it. bf16, D 128,
16 heads, causal (bottom-right per document) and not; CUDA events, median of 30.

Time per token: a kernel's time over the tokens it is given (the varlen kernel: the real
tokens; the padded one: batch x the longest). TFLOP/s counts each kernel's own work (the
padded kernel's includes its padding), halved when causal.
"""
from __future__ import annotations

import math

import torch

import kgen
from kgen import ir
from kgen.api import build_verified, load_built
from tests import loop_kernels as lk

HEADS = 16
D = 128
TOKENS = 16384


def documents(seed: int = 0, shortest: int = 64, longest: int = 4096) -> list[int]:
    """Random document lengths summing to TOKENS."""
    gen = torch.Generator().manual_seed(seed)
    lengths: list[int] = []
    while sum(lengths) < TOKENS:
        lengths.append(int(torch.randint(shortest, longest + 1, (1,), generator=gen)))
    lengths[-1] -= sum(lengths) - TOKENS
    return [n for n in lengths if n > 0]


def _flops(lengths: list[int], causal: bool) -> float:
    return sum(4 * HEADS * n * n * D for n in lengths) / (2 if causal else 1)


def measure(lengths: list[int], causal: bool, arch: str, timed) -> dict:
    total, longest, batch = sum(lengths), max(lengths), len(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    q, k, v = (torch.randn(total, HEADS, D, device="cuda").bfloat16() for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    row = {"arch": arch, "causal": causal, "documents": batch, "longest": longest}
    ms = timed(lambda: kgen.attention_varlen(q, k, v, cu, cu, longest, longest,
                                             is_causal=causal, scale=scale, arch=arch))
    row["varlen_ms"] = ms
    row["varlen_tflops"] = _flops(lengths, causal) / ms / 1e9
    row["varlen_us_per_token"] = 1e3 * ms / total
    # padded-dense: every document padded to the longest, [batch, H, longest, D]
    qp, kp, vp = (torch.randn(batch, HEADS, longest, D, device="cuda").bfloat16()
                  for _ in range(3))
    target = ir.Arch.from_name(arch)
    dense = load_built(build_verified(lk.attention(D, causal=causal, arch=target), target))
    op, lse = torch.empty_like(qp), torch.empty(batch, HEADS, longest, device="cuda")
    ms = timed(lambda: dense(Q=qp, K=kp, V=vp, O=op, lse=lse, scale=scale))
    row["padded_ms"] = ms
    row["padded_tflops"] = _flops([longest] * batch, causal) / ms / 1e9
    row["padded_us_per_token"] = 1e3 * ms / (batch * longest)
    row["per_token_ratio"] = row["varlen_us_per_token"] / row["padded_us_per_token"]
    try:
        flash = torch.ops.aten._flash_attention_forward
        ms = timed(lambda: flash(q, k, v, cu, cu, longest, longest, 0.0, causal, False,
                                 scale=scale))
        row["torch_flash_varlen_ms"] = ms
        row["torch_flash_varlen_tflops"] = _flops(lengths, causal) / ms / 1e9
    except (AttributeError, RuntimeError, TypeError) as err:
        row["torch_flash_varlen_ms"] = None
        print(f"  torch flash varlen: {str(err).splitlines()[0]}")
    return row


def table(timed, archs=("sm_90a", "sm_80")) -> list[dict]:
    lengths = documents()
    print(f"{torch.cuda.get_device_name()}, bf16, D {D}, {HEADS} heads, {len(lengths)} "
          f"documents of random lengths ({min(lengths)}-{max(lengths)}) in {sum(lengths)} "
          "tokens")
    print(f"{'arch':>7} {'causal':>6} {'varlen ms':>10} {'TFLOP/s':>8} {'us/token':>9} "
          f"{'padded ms':>10} {'TFLOP/s':>8} {'us/token':>9} {'ratio':>6} {'flash ms':>9}")
    rows = []
    for arch in archs:
        for causal in (False, True):
            r = measure(lengths, causal, arch, timed)
            rows.append(r)
            flash = r["torch_flash_varlen_ms"]
            print(f"{arch:>7} {str(causal):>6} {r['varlen_ms']:10.3f} {r['varlen_tflops']:8.1f} "
                  f"{r['varlen_us_per_token']:9.5f} {r['padded_ms']:10.3f} "
                  f"{r['padded_tflops']:8.1f} {r['padded_us_per_token']:9.5f} "
                  f"{r['per_token_ratio']:6.3f} "
                  f"{flash if flash is None else round(flash, 3)!s:>9}")
    return rows


def measure_backward(lengths: list[int], causal: bool, timed) -> dict:
    """The backward through autograd (kgen.attention_varlen's, the D row kernel, the main
    kernel and dQ's conversion) beside kgen.attention's dense backward on the documents padded
    to the longest, both on the device's arch, each checked first against float32 autograd
    of a per-document reference on the packed call."""
    total, longest, batch = sum(lengths), max(lengths), len(lengths)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    q, k, v = (torch.randn(total, HEADS, D, device="cuda").bfloat16().requires_grad_()
               for _ in range(3))
    scale = 1.0 / math.sqrt(D)
    o = kgen.attention_varlen(q, k, v, cu, cu, longest, longest, is_causal=causal, scale=scale)
    do = torch.randn_like(o)
    grads = torch.autograd.grad(o, (q, k, v), do, retain_graph=True)
    _check_backward(lengths, causal, scale, q, k, v, do, grads)
    row = {"causal": causal, "documents": batch, "longest": longest}
    ms = timed(lambda: torch.autograd.grad(o, (q, k, v), do, retain_graph=True))
    flops = 2.5 * _flops(lengths, causal)
    row.update(varlen_ms=ms, varlen_tflops=flops / ms / 1e9, varlen_us_per_token=1e3 * ms / total)
    qp, kp, vp = (torch.randn(batch, HEADS, longest, D, device="cuda").bfloat16()
                  .requires_grad_() for _ in range(3))
    op = kgen.attention(qp, kp, vp, is_causal=causal, scale=scale)
    dop = torch.randn_like(op)
    ms = timed(lambda: torch.autograd.grad(op, (qp, kp, vp), dop, retain_graph=True))
    row.update(padded_ms=ms, padded_us_per_token=1e3 * ms / (batch * longest))
    row["per_token_ratio"] = row["varlen_us_per_token"] / row["padded_us_per_token"]
    return row


def _check_backward(lengths, causal, scale, q, k, v, do, grads) -> None:
    """dQ, dK, dV of the packed call against float32 autograd of each document's attention
    (causal bottom-right: equal lengths, so the diagonal); raises on a mismatch."""
    start = 0
    for n in lengths:
        part = slice(start, start + n)
        qs, ks, vs = (x[part].detach().float().transpose(0, 1).requires_grad_()
                      for x in (q, k, v))
        ref = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal,
                                                               scale=scale)
        want = torch.autograd.grad(ref, (qs, ks, vs), do[part].float().transpose(0, 1))
        for name, got, w in zip("QKV", grads, want):
            got = got[part].float().transpose(0, 1)
            err = (got - w).abs().max().item()
            if not err <= 0.05 * w.abs().max().item() + 1e-2:
                raise AssertionError(f"varlen backward: d{name} of a document of {n} tokens "
                                     f"off by {err:.3g}")
        start += n


def backward_table(timed) -> list[dict]:
    lengths = documents()
    print(f"{torch.cuda.get_device_name()}, bf16, D {D}, {HEADS} heads, {len(lengths)} "
          f"documents ({min(lengths)}-{max(lengths)}) in {sum(lengths)} tokens; the backward "
          "(autograd of kgen.attention_varlen) against kgen.attention's on the padded documents")
    print(f"{'causal':>6} {'varlen ms':>10} {'TFLOP/s':>8} {'us/token':>9} {'padded ms':>10} "
          f"{'us/token':>9} {'ratio':>6}")
    rows = []
    for causal in (False, True):
        r = measure_backward(lengths, causal, timed)
        rows.append(r)
        print(f"{str(causal):>6} {r['varlen_ms']:10.3f} {r['varlen_tflops']:8.1f} "
              f"{r['varlen_us_per_token']:9.5f} {r['padded_ms']:10.3f} "
              f"{r['padded_us_per_token']:9.5f} {r['per_token_ratio']:6.3f}")
    return rows


def once() -> None:
    """One ragged causal GQA call per target, no timing (for compute-sanitizer): lengths
    (1, 17, 300, 129), 8 query heads, 2 KV heads, the outputs exactly the sequences' rows."""
    lengths = [1, 17, 300, 129]
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32,
                      device="cuda")
    q = torch.randn(sum(lengths), 8, D, device="cuda").bfloat16()
    k, v = (torch.randn(sum(lengths), 2, D, device="cuda").bfloat16() for _ in range(2))
    for arch in ("sm_80", "sm_90a"):
        o = kgen.attention_varlen(q, k, v, cu, cu, max(lengths), max(lengths), is_causal=True,
                                  arch=arch)
        torch.cuda.synchronize()
        print(arch, "ran; O finite:", bool(torch.isfinite(o).all()))
