"""`kgen.attention_varlen`: attention over packed variable-length sequences, shaped like
FlashAttention's `flash_attn_varlen_func`:

    o = kgen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                              is_causal=True)   # q [total_q, H, D], k and v [total_k, HKV, D]

Sequence b is the query rows cu_seqlens_q[b] to cu_seqlens_q[b + 1] and the keys
cu_seqlens_k[b] to cu_seqlens_k[b + 1] (int32, B + 1 entries each, on the device).
`is_causal` is FlashAttention's: aligned bottom-right within each sequence (query row r of S
sees the keys c <= r + T - S), which is top-left when a sequence's queries and keys have one
length. `score_mod`, `mask_mod` and `scalars` are kgen.attention's, with `row`, `col`, `S`
and `T` the sequence's own, and `vectors` those read at `head` (ALiBi's slopes[head]). Rows
that see no key give O = 0 and lse = -inf.

The program is kgen/attention.py's (its text, parse and error locations), with two lines
more: `packed S by cu_seqlens_q` and `packed T by cu_seqlens_k` (docs/language.md, "Packed
sequences"); the grid covers max_seqlen_q and a CTA past its sequence's end exits at once.

It trains: where autograd records the call (q, k or v requires grad), an autograd.Function
pairs the forward with the backward's three programs (`backward_text`), launched in order:
- `<name>_dot`, D = rowsum(dO * O), a row kernel over the packed query rows (every sequence's
  rows together: [1, H, total_q, D], a row's D its own);
- `<name>_main`, kgen/attention_grad.py's loop kernel with the keys (its rows) packed by
  cu_seqlens_k and the queries (its loop) by cu_seqlens_q: a CTA owns a tile of one
  sequence's keys and walks that sequence's query blocks; dQ added into an f32 accumulator
  that its `_zero` kernel zeroes per sequence;
- `<name>_dq`, the accumulator converted to the inputs' dtype, over the packed rows.
They are not one `sequence` (a sequence launches no packed kernel yet: its buffers would be
packed in one kernel and dense in the next). The forward's mods are the dense backward's
(kgen/attention_grad_mods.py: score_mod differentiated by kgen, the mask applied to P and dS,
the scalars), the causal term the forward's bottom-right one (`col <= row + T - S`) joined to
mask_mod, so that both are transposed into the backward's orientation as one mask; `row`,
`col`, `S`, `T` are the sequence's own there too. GQA (with the mods too) and deterministic
mode as kgen.attention's backward, and a value head dim unlike the query's (dO, O, V, dV at
D_v) as its too.

Both directions are torch ops (kgen/torch_library.py `function_op`), one each whatever the
signature: `torch.ops.kgen.attention_varlen_fwd` and `_bwd` take the tensors, the max_seqlen
as ints and the signature's options (causal, the mods' texts, the scalars' names and values,
the target, the head vectors' names and tensors) as arguments; their implementations look the
compiled programs up by those options (compiling on a signature's first call) and launch on
torch's current stream without synchronizing (the offsets stay on the device), the outputs
allocated by torch's caching allocator in FlashAttention's layout; their fake implementations
give torch.compile the shapes.
The ops and the Function are defined when this module is imported (it imports torch; `import
kgen` does not import it), so torch.compile traces a call of `kgen.attention_varlen(...)` (a
callable namespace, kgen/callable_module.py, as `kgen.attention` is) or of the function
`attention_varlen` to two op calls, forward and backward, in one graph (fullgraph=True), and a
training step captures in a CUDA graph.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from . import attention as dense
from . import ir
from .callable_module import make_callable
from .errors import ArgumentError, KgenError, KgenRuntimeError

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
                     arch: str | None = None, deterministic: bool | None = None,
                     vectors: Mapping[str, Any] | None = None):
    """Attention of packed torch tensors q [total_q, H, D], k [total_k, HKV, D], v [total_k,
    HKV, D_v] (bf16 or fp16, one CUDA device; HKV divides H: GQA) over the sequences the int32
    offsets delimit: O [total_q, H, D_v], and with `return_lse` the log-sum-exp [H, total_q]
    (f32, FlashAttention's softmax_lse layout). `max_seqlen_q` must be at least the longest
    query sequence (the grid covers it); `scale` defaults to 1 / sqrt(D). `arch` picks the
    target ("sm_80": the mma.sync skeleton, which runs on newer GPUs too); by default sm_90a on
    compute capability 9.0, else sm_80. `vectors`: tensors the mods read at `head`, one value
    per query head ([H]: ALiBi's `slopes[head]`, FlashAttention's alibi_slopes), read as f32;
    a vector read at row, col or batch is not taken yet (refused by name).

    Where autograd records the call (q, k or v requires grad), the result is differentiable,
    with the mods (the module's note); `deterministic` orders the backward's dQ adds
    (bit-identical gradients run to run), None following
    torch.are_deterministic_algorithms_enabled()."""
    import torch

    from .attention_grad import wants_grad

    _check(torch, q, k, v, cu_seqlens_q, cu_seqlens_k, scalars)
    scale = dense.default_scale(q, scale)
    names = tuple(sorted(scalars or {}))
    vector_names = tuple(sorted(vectors or {}))
    tensors = [_head_vector(name, vectors[name], q, score_mod, mask_mod)
               for name in vector_names]
    options = (_length(max_seqlen_q), _length(max_seqlen_k), scale, bool(is_causal), score_mod,
               mask_mod, names, tuple(float(scalars[n]) for n in names), arch, vector_names)
    if wants_grad(q, k, v):
        _check_grad(names + vector_names)
        if deterministic is None:
            deterministic = torch.are_deterministic_algorithms_enabled()
        # one offsets tensor for both (self-attention) passed once: torch.compile does not
        # trace a Function given one tensor twice
        same = cu_seqlens_k is cu_seqlens_q
        out, lse = _function().apply(q, k, v, cu_seqlens_q, None if same else cu_seqlens_k,
                                     options, bool(deterministic), *tensors)
    else:
        out, lse = _ops()[0](q, k, v, cu_seqlens_q, cu_seqlens_k, *options, tensors)
    return (out, lse) if return_lse else out


def _head_vector(name: str, t, q, score_mod, mask_mod):
    """A vector the mods read at head: [H] (query heads), as given (the programs read it as
    f32); one read at row, col or batch is refused by name. (q [total_q, H, D] has its heads
    where kgen.attention's [B, H, S, D] has them: the dense check serves.)"""
    import torch

    index = dense._vector_index(name, score_mod, mask_mod)
    if index != "head":
        raise ArgumentError(f"kgen.attention_varlen takes vectors read at head (one value per "
                            f"query head, slopes[head]); {name!r} is read at {index}: not yet")
    t = t if isinstance(t, torch.Tensor) else torch.as_tensor(t)
    dense.check_vector(name, index, t, q, q)
    return t


def _length(n) -> int:
    """A max_seqlen: a Python int as it is (torch.compile keeps it as given), else int(n)."""
    return n if isinstance(n, int) else int(n)


def _check(torch, q, k, v, cu_seqlens_q, cu_seqlens_k, scalars) -> None:
    """The call's shapes and offsets (the dtypes and the mods: the signature's, on its
    first call)."""
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


def _check_grad(names) -> None:  # the scalars' and the vectors' names
    """What the backward does not take, refused by name."""
    from .attention_grad_mods import BACKWARD_NAMES

    for name in names:
        if name in BACKWARD_NAMES:
            raise ArgumentError(f"{name!r} is a name of kgen.attention_varlen's backward "
                                f"program; pass the scalar or vector under another name "
                                f"({sorted(BACKWARD_NAMES)} are taken)")


# ---------------------------------------------------------------------------------------------
# The torch ops: the forward and the backward, one each, the signature among the arguments

# the options after the tensors, as the ops take them (attention_varlen's `options`)
OPTIONS = ("int S, int T, float scale, bool causal, str? score_mod, str? mask_mod, "
           "str[] scalar_names, float[] scalar_values, str? arch, str[] vector_names, "
           "Tensor[] vectors")
FORWARD_SCHEMA = ("(Tensor Q, Tensor K, Tensor V, Tensor cu_seqlens_q, Tensor cu_seqlens_k, "
                  f"{OPTIONS}) -> (Tensor, Tensor)")
BACKWARD_SCHEMA = ("(Tensor dO, Tensor Q, Tensor K, Tensor V, Tensor O, Tensor lse, "
                   f"Tensor cu_seqlens_q, Tensor cu_seqlens_k, {OPTIONS}, bool deterministic) "
                   "-> (Tensor, Tensor, Tensor)")


def _ops():
    """`torch.ops.kgen.attention_varlen_fwd` and `_bwd` (kgen.torch_library.function_op):
    their implementations look the compiled programs up by the options, so torch.compile
    traces one op call whatever the signature."""
    if _DEFINED is None:
        raise KgenRuntimeError("kgen.attention_varlen runs on torch tensors: torch is not "
                               "installed")
    return _DEFINED[:2]


def _function():
    """The autograd.Function pairing the two ops."""
    _ops()
    return _DEFINED[2]


_FORWARDS: dict[tuple, Any] = {}  # a call's options and device -> its CompiledProgram


def _forward(Q, K, V, cu_seqlens_q, cu_seqlens_k, S, T, scale, causal, score_mod, mask_mod,
             scalar_names, scalar_values, arch, vector_names, vectors):
    """The forward op: O [total_q, H, D_v] and lse [H, total_q], allocated by torch's caching
    allocator, the program launched on the current stream (no synchronization)."""
    import torch

    device = Q.device.index
    key = (Q.dtype, K.dtype, V.dtype, Q.shape[-1], K.shape[-1], V.shape[-1], causal, score_mod,
           mask_mod, tuple(scalar_names), arch, math.isfinite(scale) and scale > 0,
           tuple(vector_names), device)
    kernel = _FORWARDS.get(key)
    if kernel is None:  # the signature checked (dtypes, head dims, the mods), then compiled
        views = [t.transpose(0, 1).unsqueeze(0) for t in (Q, K, V)]
        sig = dense.signature(*views, is_causal=causal, score_mod=score_mod, mask_mod=mask_mod,
                              scalars=dict.fromkeys(scalar_names, 0.0),
                              arch=arch or dense._arch(Q.device),
                              vectors=dict.fromkeys(vector_names))
        sig = dataclasses.replace(sig, raw_max=dense.raw_max_allowed(sig, scale))
        kernel = _FORWARDS[key] = _compiled(sig, device)
    out = torch.empty((Q.shape[0], Q.shape[1], V.shape[-1]), dtype=Q.dtype, device=Q.device)
    lse = torch.empty((Q.shape[1], Q.shape[0]), dtype=torch.float32, device=Q.device)
    kernel(sizes={"S": S, "T": T}, Q=_heads_first(Q), K=_heads_first(K), V=_heads_first(V),
           O=out.transpose(0, 1), lse=lse, cu_seqlens_q=cu_seqlens_q.contiguous(),
           cu_seqlens_k=cu_seqlens_k.contiguous(), scale=scale,
           **dict(zip(scalar_names, scalar_values)), **_vectors(vector_names, vectors, Q))
    return out, lse


def _vectors(names, vectors, q) -> dict:
    """The head vectors by name, as the programs read them (f32 [H] on q's device; q [total,
    H, D] has its heads where the dense [B, H, S, D] has them)."""
    return {name: dense._vector(name, "head", t, q, q) for name, t in zip(names, vectors)}


def _forward_fake(Q, K, V, *options):
    import torch

    return (Q.new_empty((Q.shape[0], Q.shape[1], V.shape[-1])),
            Q.new_empty((Q.shape[1], Q.shape[0]), dtype=torch.float32))


def _heads_first(t):
    """A packed [total, H, D] tensor as the program's [H, total, D] (16-byte aligned)."""
    return dense._aligned(t).transpose(0, 1)


def _define():
    """The ops and the autograd.Function, defined when this module is imported (where torch
    is: `import kgen` imports neither), so that torch.compile, tracing a call, reads them
    and never traces their definition."""
    import torch

    from .attention_grad import gradients_fake
    from .torch_library import function_op

    forward_op = function_op(_forward, FORWARD_SCHEMA, _forward_fake,
                             name="attention_varlen_fwd")
    backward_op = function_op(_backward, BACKWARD_SCHEMA, gradients_fake,
                              name="attention_varlen_bwd")

    class VarlenFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, cu_q, cu_k, options, deterministic, *vectors):
            cu_k = cu_q if cu_k is None else cu_k
            out, lse = forward_op(q, k, v, cu_q, cu_k, *options, list(vectors))
            ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, *vectors)
            ctx.options, ctx.deterministic = options, deterministic  # attention_varlen's
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            q, k, v, out, lse, cu_q, cu_k, *vectors = ctx.saved_tensors
            dq, dk, dv = backward_op(grad_out, q, k, v, out, lse, cu_q, cu_k, *ctx.options,
                                     vectors, ctx.deterministic)
            return (dq, dk, dv, None, None, None, None) + (None,) * len(vectors)

    return forward_op, backward_op, VarlenFunction


# ---------------------------------------------------------------------------------------------
# The backward (kgen/attention_grad.py's programs, packed)

BACKWARD_FILE = "<kgen.attention_varlen backward>"
PARTS = ("dot", "main", "dq")


def backward_name(sig) -> str:
    """The varlen backward's name of a kgen.attention_grad.BackwardSignature."""
    return sig.name.replace("attention_bwd_", "attention_varlen_bwd_", 1)


def backward_text(sig) -> str:
    """The varlen backward of `sig` (a BackwardSignature) as DSL text: the dense backward's
    three kernels (kgen/attention_grad.py, its mods by kgen/attention_grad_mods.py), named for
    varlen, the main one packed (`packed T by cu_seqlens_k`, `packed S by cu_seqlens_q`), its
    causal term the forward's bottom-right one per sequence; no `sequence` (see the module's
    note). The mods it takes: score_mod, mask_mod, their scalars and vectors read at head."""
    from .attention_grad import backward_text as dense_text

    m = sig.mods
    for what, used in (("attn_mask (a bias tensor)", m.bias),
                       ("vectors read at row, col or batch",
                        any(index != "head" for _, index in m.vectors)),
                       ("dropout", m.dropout)):
        if used:
            raise ArgumentError(f"kgen.attention_varlen's backward takes no {what}: its mods "
                                "are score_mod, mask_mod, scalars and vectors read at head")
    # the causal term as the forward writes it (CAUSAL), a mask of the dense backward's mods:
    # kgen/attention_grad_mods.py transposes it into the backward's orientation
    mask = m.mask_mod if not sig.causal else CAUSAL if m.mask_mod is None else (
        f"{CAUSAL_PREFIX}{m.mask_mod})")
    plain = dataclasses.replace(sig, causal=False, mods=dataclasses.replace(m, mask_mod=mask))
    try:
        text = dense_text(plain)
    except KgenError as err:  # located in the user's mask_mod, not in the causal term's
        raise _in_user_mask(err, sig) from None
    text = text[:text.index("sequence ")].replace(plain.name, backward_name(sig))
    out = []
    for line in text.splitlines(keepends=True):
        if line == "  loop q over S {\n":
            out += [f"  packed {dim} by {offsets}\n" for dim, offsets in zip("TS", OFFSETS[::-1])]
        out.append(line)
    return "".join(out)


# a causal mask_mod's text in the backward's mods: the causal term, then the user's
CAUSAL_PREFIX = f"({CAUSAL}) * ("


def _in_user_mask(err: KgenError, sig) -> KgenError:
    """An error in a causal call's mask_mod, its columns those of the user's text."""
    from .errors import SourceLoc

    loc = err.loc
    if not sig.causal or loc.file != "mask_mod" or sig.mods.mask_mod is None:
        return err
    shift = len(CAUSAL_PREFIX)
    col = max(1, loc.col - shift)
    return KgenError(SourceLoc("mask_mod", 1, col, 1, max(col + 1, loc.end_col - shift)),
                     err.message)


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


_BACKWARDS: dict[tuple, Any] = {}  # a call's options and device -> its three programs


def _backward(dO, Q, K, V, O, lse, cu_seqlens_q, cu_seqlens_k, S, T, scale, causal, score_mod,
              mask_mod, scalar_names, scalar_values, arch, vector_names, vectors, deterministic):
    """The backward op: dQ [total, H, D], dK [total, HKV, D] and dV [total, HKV, D_v] of packed
    q, k, v, the three programs in order on the current stream (D and the f32 dQ accumulator
    allocated here, by torch's allocator; no synchronization)."""
    import torch

    from .attention_grad import BackwardSignature
    from .attention_grad_mods import Mods

    device = Q.device.index
    gqa = K.shape[1] != Q.shape[1]
    key = (Q.dtype, Q.shape[-1], V.shape[-1], gqa, causal, score_mod, mask_mod,
           tuple(scalar_names), arch, deterministic, tuple(vector_names), device)
    programs = _BACKWARDS.get(key)
    if programs is None:
        sig = BackwardSignature(dense._dtype_name(Q.dtype), int(Q.shape[-1]), causal,
                                arch or dense._arch(Q.device), gqa=gqa,
                                deterministic=deterministic,
                                mods=Mods(score_mod, mask_mod, tuple(scalar_names),
                                          tuple((name, "head") for name in vector_names)),
                                d_v=int(V.shape[-1]))
        programs = _BACKWARDS[key] = _backward_programs(sig, device)
    heads, total_q = Q.shape[1], Q.shape[0]
    d = torch.empty((heads, total_q), dtype=torch.float32, device=Q.device)
    dq_acc = torch.empty((heads, total_q, Q.shape[-1]), dtype=torch.float32, device=Q.device)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (Q, K, V))
    grad_out = dense._aligned(dO)
    programs["dot"](dO=_rows(grad_out), O=_rows(O), D=d.unsqueeze(0))
    programs["main"](sizes={"S": S, "T": T}, Q=_heads_first(Q), K=_heads_first(K),
                     V=_heads_first(V), dO=grad_out.transpose(0, 1), lse=lse, D=d,
                     dQacc=dq_acc, dK=dk.transpose(0, 1), dV=dv.transpose(0, 1),
                     cu_seqlens_q=cu_seqlens_q.contiguous(),
                     cu_seqlens_k=cu_seqlens_k.contiguous(), scale=scale,
                     **dict(zip(scalar_names, scalar_values)),
                     **_vectors(vector_names, vectors, Q))
    programs["dq"](dQacc=dq_acc.unsqueeze(0), dQ=_rows(dq))
    return dq, dk, dv


def _rows(t):
    """A packed [total, H, D] tensor as a row kernel's [1, H, total, D] (every sequence's rows
    together: D and the conversion are per row)."""
    return t.transpose(0, 1).unsqueeze(0)


make_callable(__name__, attention_varlen)  # kgen.attention_varlen(q, ...), traced too

try:
    _DEFINED = _define()
except ImportError:  # no torch: the program texts work, the calls say why they do not
    _DEFINED = None
