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

It trains: where autograd records the call (q, k or v requires grad), an autograd.Function
pairs the forward with the backward's three programs (`backward_text`), launched in order:
- `<name>_dot`, D = rowsum(dO * O), a row kernel over the packed query rows (every sequence's
  rows together: [1, H, total_q, D], a row's D its own);
- `<name>_main`, kgen/attention_grad.py's loop kernel with the keys (its rows) packed by
  cu_seqlens_k and the queries (its loop) by cu_seqlens_q: a CTA owns a tile of one
  sequence's keys and walks that sequence's query blocks, causal bottom-right per sequence
  (`row <= col + T - S`, the key at most the query's position plus T - S); dQ added into an
  f32 accumulator that its `_zero` kernel zeroes per sequence;
- `<name>_dq`, the accumulator converted to the inputs' dtype, over the packed rows.
They are not one `sequence` (a sequence launches no packed kernel yet: its buffers would be
packed in one kernel and dense in the next). GQA and deterministic mode as kgen.attention's
backward; score_mod and mask_mod not yet in the backward (refused by name).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

from . import attention as dense
from . import ir
from .errors import ArgumentError, KgenError

__all__ = ["attention_varlen", "backward_module", "backward_text", "program", "program_text"]

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
                     arch: str | None = None, deterministic: bool | None = None):
    """Attention of packed torch tensors q [total_q, H, D], k [total_k, HKV, D], v [total_k,
    HKV, D_v] (bf16 or fp16, one CUDA device; HKV divides H: GQA) over the sequences the int32
    offsets delimit: O [total_q, H, D_v], and with `return_lse` the log-sum-exp [H, total_q]
    (f32, FlashAttention's softmax_lse layout). `max_seqlen_q` must be at least the longest
    query sequence (the grid covers it); `scale` defaults to 1 / sqrt(D). `arch` picks the
    target ("sm_80": the mma.sync skeleton, which runs on newer GPUs too); by default sm_90a on
    compute capability 9.0, else sm_80.

    Where autograd records the call (q, k or v requires grad; no mods), the result is
    differentiable (the module's note); `deterministic` orders the backward's dQ adds
    (bit-identical gradients run to run), None following
    torch.are_deterministic_algorithms_enabled()."""
    import torch

    from .attention_grad import wants_grad

    if wants_grad(q, k, v):
        if score_mod is not None or mask_mod is not None or scalars:
            raise ArgumentError("kgen.attention_varlen's backward takes no score_mod, mask_mod "
                                "or scalars yet; call it on tensors that do not require grad "
                                "(or under torch.no_grad())")
        if deterministic is None:
            deterministic = torch.are_deterministic_algorithms_enabled()
        if len(q.shape) == len(v.shape) == 3 and v.shape[-1] != q.shape[-1]:
            raise ArgumentError(f"kgen.attention_varlen's backward needs v's head dim "
                                f"({v.shape[-1]}) to be q's ({q.shape[-1]})")
        scale = float(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
        out, lse = _function().apply(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                     int(max_seqlen_k), bool(is_causal), scale,
                                     bool(deterministic), arch)
        return (out, lse) if return_lse else out

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
    scale = float(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)
    sig = dataclasses.replace(sig, raw_max=dense.raw_max_allowed(sig, scale))
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    kernel = _compiled(sig, device)
    out = torch.empty((q.shape[0], heads, v.shape[-1]), dtype=q.dtype, device=q.device)
    lse = torch.empty((heads, q.shape[0]), dtype=torch.float32, device=q.device)
    args = {"Q": dense._aligned(q).transpose(0, 1), "K": dense._aligned(k).transpose(0, 1),
            "V": dense._aligned(v).transpose(0, 1), "O": out.transpose(0, 1), "lse": lse,
            "cu_seqlens_q": cu_seqlens_q.contiguous(), "cu_seqlens_k": cu_seqlens_k.contiguous(),
            "scale": scale, **{n: float(x) for n, x in (scalars or {}).items()}}
    kernel(sizes={"S": int(max_seqlen_q), "T": int(max_seqlen_k)}, **args)
    return (out, lse) if return_lse else out


# ---------------------------------------------------------------------------------------------
# The backward (kgen/attention_grad.py's programs, packed)

BACKWARD_FILE = "<kgen.attention_varlen backward>"
# the dense backward's probability line, whose mask this backward adds (kgen/attention_grad_mods)
_PROBABILITY = "        pt = exp(score - lse[col])\n"
# causal bottom-right per sequence in the backward's orientation (row: the key, col: the query)
BACKWARD_CAUSAL = "row <= col + T - S"
PARTS = ("dot", "main", "dq")


def backward_name(sig) -> str:
    """The varlen backward's name of a kgen.attention_grad.BackwardSignature."""
    return sig.name.replace("attention_bwd_", "attention_varlen_bwd_", 1)


def backward_text(sig) -> str:
    """The varlen backward of `sig` (a BackwardSignature without mods) as DSL text: the dense
    backward's three kernels (kgen/attention_grad.py), named for varlen, the main one packed
    (`packed T by cu_seqlens_k`, `packed S by cu_seqlens_q`) and its causal mask aligned
    bottom-right per sequence; no `sequence` (see the module's note)."""
    from .attention_grad import backward_text as dense_text
    from .attention_grad_mods import Mods

    if sig.mods != Mods():
        raise ArgumentError("kgen.attention_varlen's backward takes no mods yet (score_mod, "
                            "mask_mod, scalars): call it on tensors that do not require grad")
    plain = dataclasses.replace(sig, causal=False)  # the causal term is this backward's own
    text = dense_text(plain)
    text = text[:text.index("sequence ")].replace(plain.name, backward_name(sig))
    assert _PROBABILITY in text, "the dense backward's probability line"
    out = []
    for line in text.splitlines(keepends=True):
        if line == "  loop q over S {\n":
            out += [f"  packed {dim} by {offsets}\n" for dim, offsets in zip("TS", OFFSETS[::-1])]
        elif sig.causal and line == _PROBABILITY:
            line = f"        pt = where({BACKWARD_CAUSAL}, exp(score - lse[col]), 0)\n"
        out.append(line)
    return "".join(out)


def backward_module(sig) -> ir.Module:
    """The verified ir.Module of the varlen backward of `sig`: kernels `_dot`, `_main`, `_dq`."""
    from .parse import parse
    from .verify import verify

    module = parse(backward_text(sig), BACKWARD_FILE)
    verify(module)
    return module


_BACKWARD: dict[tuple, Any] = {}  # (signature, device) -> its three CompiledPrograms


def _backward_programs(sig, device: int) -> dict[str, Any]:
    key = (sig, device)
    if key not in _BACKWARD:
        from .api import build_verified, load_built

        module = backward_module(sig)
        name = backward_name(sig)
        kernels = {k.name.removeprefix(name + "_"): k for k in module.kernels}
        _BACKWARD[key] = {part: load_built(build_verified(kernels[part], sig.arch),
                                           device=device) for part in PARTS}
    return _BACKWARD[key]


@functools.cache
def _function():
    """The autograd.Function (defined on first use: `import kgen` needs no torch)."""
    import torch

    from .attention_grad import BackwardSignature

    class VarlenFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, max_q: int, max_k: int, causal: bool,
                    scale: float, deterministic: bool, arch):
            out, lse = attention_varlen(q, k, v, cu_q, cu_k, max_q, max_k, is_causal=causal,
                                        scale=scale, return_lse=True, arch=arch)
            ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k)
            ctx.max_q, ctx.max_k, ctx.causal, ctx.scale = max_q, max_k, causal, scale
            ctx.deterministic, ctx.arch = deterministic, arch or dense._arch(q.device)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
            sig = BackwardSignature(dense._dtype_name(q.dtype), int(q.shape[-1]), ctx.causal,
                                    ctx.arch, gqa=k.shape[1] != q.shape[1],
                                    deterministic=ctx.deterministic)
            device = q.device.index if q.device.index is not None else \
                torch.cuda.current_device()
            dq, dk, dv = _backward(_backward_programs(sig, device), q, k, v, out, lse,
                                   dense._aligned(grad_out), cu_q, cu_k, ctx.max_q, ctx.max_k,
                                   ctx.scale)
            return dq, dk, dv, None, None, None, None, None, None, None, None

    return VarlenFunction


def _backward(programs, q, k, v, out, lse, grad_out, cu_q, cu_k, max_q: int, max_k: int,
              scale: float):
    """dQ, dK, dV [total, heads, D] of packed q, k, v: the three programs in order on the
    current stream (D and the f32 dQ accumulator allocated here, by torch's allocator)."""
    import torch

    heads, total_q = q.shape[1], q.shape[0]
    d = torch.empty((heads, total_q), dtype=torch.float32, device=q.device)
    dq_acc = torch.empty((heads, total_q, q.shape[-1]), dtype=torch.float32, device=q.device)
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    programs["dot"](dO=_rows(grad_out), O=_rows(out), D=d.unsqueeze(0))
    programs["main"](sizes={"S": int(max_q), "T": int(max_k)},
                     Q=q.transpose(0, 1), K=k.transpose(0, 1), V=v.transpose(0, 1),
                     dO=grad_out.transpose(0, 1), lse=lse, D=d, dQacc=dq_acc,
                     dK=dk.transpose(0, 1), dV=dv.transpose(0, 1), cu_seqlens_q=cu_q,
                     cu_seqlens_k=cu_k, scale=scale)
    programs["dq"](dQacc=dq_acc.unsqueeze(0), dQ=_rows(dq))
    return dq, dk, dv


def _rows(t):
    """A packed [total, H, D] tensor as a row kernel's [1, H, total, D] (every sequence's rows
    together: D and the conversion are per row)."""
    return t.transpose(0, 1).unsqueeze(0)


class _CallableModule(type(__import__("sys"))):
    """This module, callable: `kgen.attention_varlen(q, ...)` is
    `kgen.attention_varlen.attention_varlen(...)`, however `kgen.attention_varlen` was reached
    (kgen/attention.py's arrangement)."""

    def __call__(self, *args, **kwargs):
        return attention_varlen(*args, **kwargs)


__import__("sys").modules[__name__].__class__ = _CallableModule
