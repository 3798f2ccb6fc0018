"""`kgen.attention_varlen`: attention over packed variable-length sequences, shaped like
FlashAttention's `flash_attn_varlen_func`:

    o = kgen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              is_causal=True)   # q [total_q, H, D], k and v [total_k, HKV, D]

Sequence b is the query rows cu_seqlens_q[b] to cu_seqlens_q[b + 1] and the keys
cu_seqlens_k[b] to cu_seqlens_k[b + 1] (int32, B + 1 entries each, on the device).
`is_causal` is FlashAttention's: aligned bottom-right within each sequence (query row r of S
sees the keys c <= r + T - S), which is top-left when a sequence's queries and keys have one
length. `score_mod`, `mask_mod` and `scalars` are kgen.attention's, with `row`, `col`, `S`
and `T` the sequence's own. Rows that see no key give O = 0 and lse = -inf.

The program is kgen/attention.py's (its text, parse and error locations), with two lines
more: `packed S by cu_seqlens_q` and `packed T by cu_seqlens_k` (docs/language.md, "Packed
sequences"); the grid covers max_seqlen_q and a CTA past its sequence's end exits at once.
"""
from __future__ import annotations

import math
from typing import Any, Mapping

from . import attention as dense
from . import ir
from .errors import ArgumentError, KgenError

__all__ = ["attention_varlen", "program", "program_text"]

OFFSETS = ("cu_seqlens_q", "cu_seqlens_k")
# bottom-right aligned within each sequence (FlashAttention's varlen causal)
CAUSAL = "col <= row + T - S"


def name(sig: dense.Signature) -> str:
    return sig.name.replace("attention_", "attention_varlen_", 1)


# the dense program's score line (kgen's own, never a mod's), whose causal term changes here
SCORES = "        x = where("


def program_text(sig: dense.Signature) -> str:
    """The varlen program of `sig` as DSL text: the dense program's, packed, with the causal
    term aligned bottom-right per sequence."""
    lines = dense.program_text(sig).splitlines(keepends=True)
    out = []
    for line in lines:
        if line.startswith(f"kernel {sig.name} {{"):
            line = f"kernel {name(sig)} {{\n"
        elif line == "  loop kv over T {\n":
            out += [f"  packed {dim} by {offsets}\n" for dim, offsets in zip("ST", OFFSETS)]
        elif sig.causal and line.startswith(SCORES):
            assert "col <= row" in line, "the dense program's causal term"
            line = line.replace("col <= row", CAUSAL, 1)
        out.append(line)
    return "".join(out)


def program(sig: dense.Signature) -> ir.Kernel:
    """The verified ir.Kernel of `sig`; a mistake in a mod is located in the mod's text."""
    from .parse import parse
    from .verify import verify_kernel

    text = program_text(sig)
    try:
        kernel = parse(text, dense.FILE).kernels[0]
        verify_kernel(kernel)
    except KgenError as err:
        raise dense._in_mod(err, sig, text) from None
    return kernel


_LOADED: dict[tuple, Any] = {}  # (signature, device) -> its CompiledProgram


def _compiled(sig: dense.Signature, device: int):
    key = (sig, device)
    if key not in _LOADED:
        from .api import build_verified, load_built

        _LOADED[key] = load_built(build_verified(program(sig), sig.arch), device=device)
    return _LOADED[key]


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q: int,
                     max_seqlen_k: int, *, is_causal: bool = False, scale: float | None = None,
                     score_mod: str | None = None, mask_mod: str | None = None,
                     scalars: Mapping[str, float] | None = None, return_lse: bool = False,
                     arch: str | None = None):
    """Attention of packed torch tensors q [total_q, H, D], k [total_k, HKV, D], v [total_k,
    HKV, D_v] (bf16 or fp16, one CUDA device; HKV divides H: GQA) over the sequences the int32
    offsets delimit: O [total_q, H, D_v], and with `return_lse` the log-sum-exp [H, total_q]
    (f32, FlashAttention's softmax_lse layout). `max_seqlen_q` must be at least the longest
    query sequence (the grid covers it); `scale` defaults to 1 / sqrt(D). `arch` picks the
    target ("sm_80": the mma.sync skeleton, which runs on newer GPUs too); by default sm_90a on
    compute capability 9.0, else sm_80."""
    import torch

    for label, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 3:
            raise ArgumentError(f"{label} must be [total, heads, D] (3 dims), got shape "
                                f"{list(t.shape)}")
    for label, t in zip(OFFSETS, (cu_seqlens_q, cu_seqlens_k)):
        if not isinstance(t, torch.Tensor) or t.dtype != torch.int32 or t.dim() != 1:
            raise ArgumentError(f"{label} must be a 1-D int32 torch tensor of B + 1 offsets")
    if cu_seqlens_q.shape[0] != cu_seqlens_k.shape[0]:
        raise ArgumentError(f"cu_seqlens_q holds {cu_seqlens_q.shape[0]} offsets and "
                            f"cu_seqlens_k {cu_seqlens_k.shape[0]}: one batch, B + 1 each")
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads == 0 or heads % kv_heads:
        raise ArgumentError(f"q has {heads} heads, k and v {kv_heads}: the query heads must be "
                            "a multiple of the key/value heads (GQA)")
    if any(name in OFFSETS for name in (scalars or {})):
        raise ArgumentError(f"scalar names {OFFSETS} are the program's offsets")
    # the dense signature's checks, on [1, H, total, D] views: dtypes, head dims, lengths
    views = [t.transpose(0, 1).unsqueeze(0) for t in (q, k, v)]
    sig = dense.signature(*views, is_causal=is_causal, score_mod=score_mod, mask_mod=mask_mod,
                          scalars=scalars, arch=arch or dense._arch(q.device))
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    kernel = _compiled(sig, device)
    scale = float(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    out = torch.empty((q.shape[0], heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads, q.shape[0]), dtype=torch.float32, device=q.device)
    args = {"Q": dense._aligned(q).transpose(0, 1), "K": dense._aligned(k).transpose(0, 1),
            "V": dense._aligned(v).transpose(0, 1), "O": out.transpose(0, 1), "lse": lse,
            "cu_seqlens_q": cu_seqlens_q.contiguous(), "cu_seqlens_k": cu_seqlens_k.contiguous(),
            "scale": scale, **{n: float(x) for n, x in (scalars or {}).items()}}
    kernel(sizes={"S": int(max_seqlen_q), "T": int(max_seqlen_k)}, **args)
    return (out, lse) if return_lse else out


class _CallableModule(type(__import__("sys"))):
    """This module, callable: `kgen.attention_varlen(q, ...)` is
    `kgen.attention_varlen.attention_varlen(...)`, however `kgen.attention_varlen` was reached
    (kgen/attention.py's arrangement)."""

    def __call__(self, *args, **kwargs):
        return attention_varlen(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
