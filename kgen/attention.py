"""`kgen.attention`: a drop-in for `torch.nn.functional.scaled_dot_product_attention` whose
score and mask terms are kgen expressions, compiled once per signature into a tile program.

    o = kgen.attention(q, k, v, is_causal=True)                      # q, k, v: [B, H, S, D]
    o, lse = kgen.attention(q, k, v, score_mod="cap * tanh(score / cap)",
                            mask_mod="col > row - window", scalars={"cap": 30, "window": 256},
                            return_lse=True)
    o = kgen.attention(q, k, v, bias, is_causal=True,                # SDPA's attn_mask
                       score_mod="score - slopes[head] * (row - col)",  # ALiBi per head
                       mask_mod="qd[row] == kd[col]",                 # packed documents
                       vectors={"slopes": slopes, "qd": ids, "kd": ids})
    o, (seed, offset) = kgen.attention(q, k, v, dropout_p=0.1, return_rng=True)

The program is the flash attention forward of examples/attention_fwd.kg written as DSL text
(`program_text`), parsed and verified like a file: `score_mod` is an expression of `score`
(the scaled score, `scale * acc`, plus `Bias` with an attn_mask), `row`, `col`, `batch`,
`head`, the sizes `S` and `T`, the scalars named in `scalars` and the vectors named in
`vectors` (declared by the one index the mods read each at: row, col, head or batch);
`mask_mod` an expression whose nonzero elements are kept (`col <= row`, or a product of
comparisons: the linear ones let the kernel skip the blocks they empty). `is_causal` is
SDPA's: aligned top-left, `col <= row`. A mistake in a mod is a KgenError located in the mod's
own text (file `score_mod` or `mask_mod`, line 1). `attn_mask` becomes `tensor Bias` (read at
(row, col), broadcast dims at stride 0); `dropout_p` adds the u64 scalars `seed` and `offset`
and hands `where(random(seed, offset) >= dropout_p, pr * dropout_scale, 0)` to the PV gemm
while `l` sums every `pr`.

Each signature (dtypes, head dims, causal, the mods, the scalars' names, the GPU's target) is
compiled once (NVRTC, the content-keyed cache) and loaded once per process; a call binds the
tensors through the program's call path (kgen/runtime/program.py: CallPath, torch's current
stream, the outputs allocated by PyTorch), so it can be captured in a CUDA graph.

Under torch.compile a call is traced (fullgraph=True holds) to one forward op,
`torch.ops.kgen.attention_fwd`, whatever the signature (the options among its arguments, its
implementation this eager call), and with grad to an autograd.Function pairing it with the
backward op (kgen/attention_traced.py); `kgen.attention` is this module's namespace made
callable (kgen/callable_module.py), which dynamo traces where it calls no module object.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Mapping

from . import ir
from .callable_module import make_callable
from .errors import ArgumentError, KgenError, SourceLoc

__all__ = ["Signature", "attention", "program", "program_text", "signature"]

# A block mask's lists, as the program names them (FlexAttention's names)
BLOCK_LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")
# Names the program binds itself: a scalar may not take one
RESERVED = frozenset({"Q", "K", "V", "O", "lse", "scale", "score", "modded", "visible", "x",
                      "m", "l", "m_new", "m_use", "s", "r", "o", "kv", "row", "col", "acc",
                      "S", "T", "B", "H", "HKV", "inf", "batch", "head", "Bias", "pr",
                      "seed", "offset", "dropout_p", "dropout_scale", "random",
                      *BLOCK_LISTS})
# A vector's declaration by the index the mods read it at: one value per query row (per
# batch), per key (per batch), per query head, per batch
VECTOR_DIMS = {"row": "B, H, S", "col": "B, H, T", "head": "H", "batch": "B"}
DTYPES = {"bf16": ir.DType.BF16, "f16": ir.DType.F16}


@dataclass(frozen=True, slots=True)
class Signature:
    """What the program depends on; one compiled kernel each."""

    dtype: str  # "bf16" or "f16"
    d_qk: int
    d_v: int
    causal: bool
    score_mod: str | None
    mask_mod: str | None
    scalars: tuple[str, ...]  # the mods' scalars, sorted
    arch: str = "sm_80"
    bias: bool = False  # an additive bias tensor (SDPA's attn_mask), read at (row, col)
    vectors: tuple[tuple[str, str], ...] = ()  # the mods' vectors: (name, index), sorted
    dropout: bool = False  # dropout_p > 0: Philox keyed by the u64 scalars seed and offset
    # the bias is the same for every row (attn_mask [..., 1, T]): the vector Bias[col] (f32,
    # [B, H, T]) instead of the tensor read at (row, col), which the sm_90a skeleton stages
    # by the copy engine (a row stride of 0 is no tensor map's)
    bias_cols: bool = False
    # a block mask (kgen/attention_blocks.py): "partial" (its lists of partial blocks only) or
    # "full" (and of full blocks, where the mask does not apply); "": every block. `blocks`:
    # the tile (rows, keys) written on its line (None: the rulebook's)
    block_mask: str = ""
    blocks: tuple[int, int] | None = None
    # the scale is positive and no term follows it (raw_max_allowed): the maximum is of the
    # raw scores, max(scale * acc) = scale * max(acc), and exp takes scale * (x - m), one
    # multiply-add per score (the loop skeletons' fused exp): the scale multiplies no score of
    # its own. lse = scale * m + log(l). The program declares the scale `positive` (checked at
    # launch), from which the masked blocks' bounds are derived through scale * (x - m).
    raw_max: bool = False

    @property
    def name(self) -> str:
        values = dataclasses.astuple(self)[:-1]
        if not self.block_mask:  # without one, the name it had before block masks
            values = values[:-2]
        if self.raw_max:  # without it, the name it had before
            values += ("raw max",)
        digest = hashlib.sha256(repr(values).encode()).hexdigest()[:12]
        return f"attention_{self.d_qk}_{self.d_v}_{digest}"


def program_text(sig: Signature) -> str:
    """The tile program of `sig` as DSL text (the mods each on a line of their own)."""
    lines = [
        f"kernel {sig.name} {{",
        f"  target {sig.arch}",
        f"  tensor Q : {sig.dtype}[B, H, S, {sig.d_qk}] row",
        f"  tensor K : {sig.dtype}[B, HKV, T, {sig.d_qk}] row",
        f"  tensor V : {sig.dtype}[B, HKV, T, {sig.d_v}] row",
        f"  tensor O : {sig.dtype}[B, H, S, {sig.d_v}] row out",
        "  vector lse : f32[B, H, S] out",
        *([f"  tensor Bias : {sig.dtype}[B, H, S, T] row"] if sig.bias and not sig.bias_cols
          else []),
        *(["  vector Bias : f32[B, H, T]"] if sig.bias_cols else []),
        *(f"  vector {name} : f32[{VECTOR_DIMS[index]}]" for name, index in sig.vectors),
        # seed and offset have no default: before the scalars that have one (a torch op's
        # schema takes no positional argument without a default after one with)
        *(["  scalar seed : u64", "  scalar offset : u64"] if sig.dropout else []),
        "  scalar scale : f32 = 1" + (" positive" if sig.raw_max else ""),
        *(f"  scalar {name} : f32 = 0" for name in sig.scalars),
        *(["  scalar dropout_p : f32 = 0", "  scalar dropout_scale : f32 = 1"]
          if sig.dropout else []),
        "  loop kv over T {",
        *([f"    blocks{f' {sig.blocks[0]}x{sig.blocks[1]}' if sig.blocks else ''} by "
           f"{BLOCK_LISTS[0]}, {BLOCK_LISTS[1]}"
           + (f", full {BLOCK_LISTS[2]}, {BLOCK_LISTS[3]}" if sig.block_mask == "full" else "")]
          if sig.block_mask else []),
        "    carry m : f32[row] = -inf",
        "    carry l : f32[row] = 0",
        "    gemm s = Q @ K^T accumulate f32 {",
        "      epilogue {",
        *([] if sig.raw_max else
          ["        score = scale * acc" + (" + Bias[col]" if sig.bias_cols else
                                            " + Bias" if sig.bias else "")]),
    ]
    value = "acc" if sig.raw_max else "score"
    if sig.score_mod is not None:
        lines.append(MOD_LINE["score_mod"] + sig.score_mod)
        value = "modded"
    masks = (["col <= row"] if sig.causal else []) + (
        ["visible"] if sig.mask_mod is not None else [])
    if sig.mask_mod is not None:
        lines.append(MOD_LINE["mask_mod"] + sig.mask_mod)
    if masks:
        condition = " * ".join(f"({m})" for m in masks) if len(masks) > 1 else masks[0]
        lines.append(f"        x = where({condition}, {value}, -inf)")
    else:
        lines.append(f"        x = {value}")
    # dropout: l sums the probabilities kept or not; PV takes the kept ones, scaled
    p, kept = ("pr", ["        s = where(random(seed, offset) >= dropout_p, pr * dropout_scale, 0)"]
               ) if sig.dropout else ("s", [])
    scaled = "scale * " if sig.raw_max else ""
    factor = f"exp({scaled}(m - m_use))" if scaled else "exp(m - m_use)"
    # lazy: m is each row's reference maximum, moved only where the block's maximum passes it
    # by more than LAZY_MAX (the softmax is the same for any reference; exp stays below e^8):
    # on the other blocks r is 1 and the skeleton skips o's rescale (pp.Rescale.ones)
    lazy = lazy_maximum(sig.arch, sig.d_v)
    lines += [
        *(["        m_blk = max(m, rowmax(x))",
           f"        m_new = where({scaled}(m_blk - m) > {LAZY_MAX}, m_blk, m)" if scaled else
           f"        m_new = where(m_blk - m > {LAZY_MAX}, m_blk, m)"] if lazy else
          ["        m_new = max(m, rowmax(x))"]),
        "        m_use = where(m_new == -inf, 0, m_new)",
        f"        {p} = exp({scaled}(x - m_use))" if scaled else f"        {p} = exp(x - m_use)",
        *kept,
        f"        r = where(m_new == m, 1, {factor})" if lazy else f"        r = {factor}",
        f"        l = l * r + rowsum({p})",
        "        o = o * r",
        "        m = m_new",
        "      }",
        "    }",
        "    gemm o += s @ V accumulate f32",
        "  }",
        "  epilogue {",
        "    O = where(l == 0, 0, o / l)",
        f"    lse = where(l == 0, -inf, {scaled}m + log(l))",
        "  }",
        "}",
    ]
    return "\n".join(lines) + "\n"


# How far a block's maximum (of the scaled scores) may pass a row's reference maximum before
# the reference moves: each exp is then at most e^8 (about 2981), which bf16's P and the f32
# sums hold at any length (FlashAttention-4's conditional rescaling, exact here: the softmax's
# value does not depend on the reference)
LAZY_MAX = 8
# Where kgen.attention writes the lazy maximum: on sm_90a (its skeleton votes the rescale away;
# the sm_80 one multiplies) with D_v of at least 256, where o's rescale is 128 multiplies a
# thread. Measured on an H200 (bf16, 16k tokens, 16 heads, TFLOP/s lazy / eager, one run each,
# bench/attention.py --sm90a and --eager): D 256 S 1024 603 / 606, causal 443 / 413; S 4096
# 767 / 721, causal 645 / 584. D 128 (64 multiplies): S 1024 507 / 507, causal 344 / 334;
# S 4096 646 / 666, causal 530 / 559. D 64: S 1024 312 / 297, causal 187 / 201; S 4096 399 /
# 399, causal 333 / 337: within the runs' noise or below it, so the eager maximum there.
LAZY_MIN_DV = 256


def lazy_maximum(arch: str, d_v: int) -> bool:
    """Whether kgen.attention's program keeps a lazy reference maximum (LAZY_MIN_DV)."""
    return arch == "sm_90a" and d_v >= LAZY_MIN_DV

# Where a mod's text starts on its line of the program (its columns are shifted by this)
MOD_LINE = {"score_mod": "        modded = ", "mask_mod": "        visible = "}
FILE = "<kgen.attention>"


def program(sig: Signature) -> ir.Kernel:
    """The verified ir.Kernel of `sig`; a mistake in a mod is located in the mod's text."""
    from .parse import parse
    from .verify import verify_kernel

    for field in ("score_mod", "mask_mod"):
        text = getattr(sig, field)
        if text is not None and ("\n" in text or "\r" in text or not text.strip()):
            raise KgenError(SourceLoc(field, 1, 1, 1, max(2, len(text) + 1)),
                            f"{field} must be one expression on one line")
    text = program_text(sig)
    try:
        kernel = parse(text, FILE).kernels[0]
        verify_kernel(kernel)
    except KgenError as err:
        raise _in_mod(err, sig, text) from None
    return kernel


def _in_mod(err: KgenError, sig: Signature, text: str) -> KgenError:
    """The error located in the mod whose line it points at (else as it is)."""
    loc = err.loc
    lines = text.splitlines()
    for field, prefix in MOD_LINE.items():
        if getattr(sig, field) is None or loc.file != FILE or not 0 < loc.line <= len(lines):
            continue
        if lines[loc.line - 1].startswith(prefix) and loc.line == _line_of(lines, prefix):
            shift = len(prefix)
            col = max(1, loc.col - shift)
            end = max(col + 1, loc.end_col - shift) if loc.end_line == loc.line else col + 1
            return KgenError(SourceLoc(field, 1, col, 1, end), err.message)
    return err


def _line_of(lines: list[str], prefix: str) -> int:
    return next(i + 1 for i, line in enumerate(lines) if line.startswith(prefix))


def signature(q, k, v, *, is_causal: bool = False, score_mod: str | None = None,
              mask_mod: str | None = None, scalars: Mapping[str, float] | None = None,
              arch: str = "sm_80", attn_mask=None, vectors: Mapping[str, Any] | None = None,
              dropout_p: float = 0.0) -> Signature:
    """The signature of a call's tensors and options (shapes and dtypes only: no GPU)."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(t.shape) != 4:
            raise ArgumentError(f"{name} must be [B, H, S, D] (4 dims), got shape "
                                f"{list(t.shape)}")
    dtype = _dtype_name(q.dtype)
    for name, t in (("k", k), ("v", v)):
        if _dtype_name(t.dtype) != dtype:
            raise ArgumentError(f"{name} is {t.dtype}, but q is {q.dtype}; all three must "
                                "have one dtype")
    if k.shape[-1] != q.shape[-1]:
        raise ArgumentError(f"k's head dim {k.shape[-1]} differs from q's {q.shape[-1]}")
    if k.shape[:3] != v.shape[:3]:
        raise ArgumentError(f"k {list(k.shape)} and v {list(v.shape)} must agree in batch, "
                            "heads and length")
    if q.shape[0] != k.shape[0]:
        raise ArgumentError(f"q has batch {q.shape[0]}, k has {k.shape[0]}")
    names = tuple(sorted(scalars or {}))
    for name in names:
        _usable(name, "scalar")
    if attn_mask is not None:
        _check_mask(attn_mask, q, k, dtype)
    indexed = []
    for name in sorted(vectors or {}):
        _usable(name, "vector")
        if name in names:
            raise ArgumentError(f"{name!r} is both a scalar and a vector")
        indexed.append((name, _vector_index(name, score_mod, mask_mod)))
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not (
            0.0 <= dropout_p < 1.0):
        raise ArgumentError(f"dropout_p must be a number in [0, 1), got {dropout_p!r}")
    bias_cols = attn_mask is not None and (len(attn_mask.shape) < 2 or attn_mask.shape[-2] == 1)
    return Signature(dtype, int(q.shape[-1]), int(v.shape[-1]), bool(is_causal), score_mod,
                     mask_mod, names, arch, attn_mask is not None, tuple(indexed),
                     dropout_p > 0, bias_cols)


def raw_max_allowed(sig: Signature, scale: float) -> bool:
    """Whether `sig`'s program takes the maximum of the raw scores (Signature.raw_max): the
    scale is positive and finite, and no term follows it (a score_mod or a bias reads the
    scaled score). A mask may: its blocks' bounds are derived from where(P, e, -inf) reaching
    exp as -inf through scale * (x - m), which holds for the scale the program declares
    `positive` (kgen/lower/loop_bounds.py), unless it reads the scaled score itself."""
    import re

    reads_score = sig.mask_mod is not None and re.search(r"(?<![\w.])score(?!\w)",
                                                         sig.mask_mod)
    return (math.isfinite(scale) and scale > 0 and sig.score_mod is None and not sig.bias
            and not reads_score)


def _usable(name: str, what: str) -> None:
    if not name.isidentifier() or name in RESERVED or name in ir.FUNCTIONS:
        raise ArgumentError(f"{what} name {name!r} is not usable (an identifier that is "
                            f"not one of the program's own names: {sorted(RESERVED)})")


def _vector_index(name: str, *mods: str | None) -> str:
    """The one index (row, col, head, batch) the mods read vector `name` at."""
    index, why = _vector_read(name, *mods)
    if why:
        raise ArgumentError(why)
    return index


def _at_trace_time(function):
    """`function` of strings, run as it is when torch.compile traces a call (dynamo does not
    trace `re`), its result a constant of the graph; without torch, itself."""
    try:
        import torch
    except ModuleNotFoundError:
        return function
    return torch.compiler.assume_constant_result(function)


@_at_trace_time
def _vector_read(name: str, *mods: str | None) -> tuple[str, str]:
    """(the index the mods read vector `name` at, "") or ("", why that is no one index)."""
    import re

    found = {m.group(1) for text in mods if text for m in re.finditer(
        rf"(?<![\w.]){re.escape(name)}\s*\[\s*(\w+)\s*\]", text)}
    if not found:
        return "", (f"vector {name!r} is not read by score_mod or mask_mod (as "
                    f"{name}[row], {name}[col], {name}[head] or {name}[batch])")
    if len(found) > 1 or not found <= set(VECTOR_DIMS):
        return "", (f"vector {name!r} is read at {', '.join(sorted(found))}: a vector is "
                    "indexed one way (row, col, head or batch); pass it under a second name "
                    "for the other (doc[row] == kdoc[col])")
    return found.pop(), ""


def _check_mask(mask, q, k, dtype: str) -> None:
    """SDPA's attn_mask: bool (True keeps) or q's dtype (added to the scaled score), at most
    4 dims, broadcastable to [B, H, S, T]."""
    text = str(mask.dtype).removeprefix("torch.")
    if text != "bool" and _dtype_name_or_none(text) != dtype:
        raise ArgumentError(f"attn_mask is {text}: it must be bool (True keeps a key) or q's "
                            f"dtype ({str(q.dtype).removeprefix('torch.')}), an additive bias")
    want = (int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2]))
    shape = tuple(int(d) for d in mask.shape)
    if len(shape) > 4 or any(d not in (1, w) for d, w in zip(shape[::-1], want[::-1])):
        raise ArgumentError(f"attn_mask has shape {list(shape)}, which does not broadcast to "
                            f"[B, H, S, T] = {list(want)}")


def _dtype_name_or_none(text: str) -> str | None:
    return {"bfloat16": "bf16", "float16": "f16"}.get(text)


def _dtype_name(dtype) -> str:
    text = str(dtype).removeprefix("torch.")
    found = {"bfloat16": "bf16", "float16": "f16"}.get(text)
    if found is None:
        raise ArgumentError(f"kgen.attention takes bfloat16 or float16 tensors, got {text}")
    return found


_LOADED: dict[tuple, Any] = {}  # (signature, device) -> its torch op (a KernelOp)


def _compiled(sig: Signature, device: int):
    """The program of `sig` loaded on `device`, as a torch op (kgen.torch_op: a fake
    implementation for torch.compile; eager calls go straight to the kernel's call path)."""
    key = (sig, device)
    if key not in _LOADED:
        from .api import build_verified, load_built
        from .torch_library import torch_op

        loaded = load_built(build_verified(program(sig), sig.arch), device=device)
        _LOADED[key] = torch_op(loaded, name=f"{sig.name}_cuda{device}")
    return _LOADED[key]


def attention(q, k, v, attn_mask=None, *, is_causal: bool = False, scale: float | None = None,
              enable_gqa: bool = False, score_mod: str | None = None,
              mask_mod: str | None = None, scalars: Mapping[str, float] | None = None,
              vectors: Mapping[str, Any] | None = None, dropout_p: float = 0.0,
              dropout_rng: tuple[int, int] | None = None, return_lse: bool = False,
              return_rng: bool = False, deterministic: bool | None = None,
              block_mask=None):
    """Attention of torch tensors q [B, H, S, D], k [B, HKV, T, D], v [B, HKV, T, D_v]
    (bf16 or fp16, on one CUDA device): O [B, H, S, D_v], and the log-sum-exp [B, H, S] (f32)
    with `return_lse`. As SDPA: `scale` defaults to 1 / sqrt(D); `enable_gqa` lets HKV divide
    H (query head h reads KV head h / (H / HKV)); `attn_mask`, broadcastable to [B, H, S, T],
    is bool (True keeps the key) or q's dtype (added to the scaled score, before score_mod).
    `vectors`: tensors the mods index (`slopes[head]`: [H]; `doc[row]`: [B, S] or [S];
    `kdoc[col]`: [B, T] or [T]; `w[batch]`: [B]), read as f32 (integer ids exact below
    2^24). `dropout_p` in [0, 1): each probability is kept where random(seed, offset) >=
    dropout_p (Philox, counted by batch, head, row and key, 16 bits each: dropout_p is
    quantized to 2^-16; see ir.Random) and scaled by 1 / (1 - dropout_p); lse and the
    normalizer count every probability, kept or not. The
    (seed, offset) is `dropout_rng` when given, else drawn from torch's CUDA generator of q's
    device (seed: its initial seed, offset: its offset, which advances by 4), so
    torch.manual_seed makes a run reproducible; `return_rng` appends the (seed, offset) used
    to the result (a backward passes it back as dropout_rng to regenerate the mask; not
    drawn anew when a CUDA graph replays). `block_mask`: FlexAttention's BlockMask or a
    kgen.attention_blocks.BlockLists: each tile of query rows visits only its listed blocks,
    the partial ones with the mask (is_causal, mask_mod) applied, the full ones without, as
    FlexAttention (kgen/attention_blocks.py; the backward too, GQA among it, not in
    deterministic mode: kgen/attention_grad.py). Rows that keep no key give O = 0 and lse = -inf (SDPA
    gives NaN there). `deterministic` (inputs that require grad): the
    backward's gradients bit-identical run to run (dQ's adds ordered); None follows
    torch.are_deterministic_algorithms_enabled(). Under torch.compile every option is traced
    (no graph break, forward and backward: kgen/attention_traced.py) but a dropout without
    dropout_rng: with one the call breaks the graph and runs eagerly."""
    import torch

    if torch.compiler.is_compiling():  # torch.compile traces the call: the ops
        return attention_traced.traced(
            q, k, v, attn_mask, is_causal, scale, enable_gqa, score_mod, mask_mod, scalars,
            vectors, dropout_p, dropout_rng, return_lse, return_rng, deterministic, block_mask)
    from .attention_grad import attention_with_grad, wants_grad

    if wants_grad(q, k, v, attn_mask):  # recorded by autograd: kgen/attention_grad.py
        return attention_with_grad(
            q, k, v, is_causal=is_causal, scale=scale, return_lse=return_lse,
            attn_mask=attn_mask, enable_gqa=enable_gqa, score_mod=score_mod, mask_mod=mask_mod,
            scalars=scalars, vectors=vectors, dropout_p=dropout_p, dropout_rng=dropout_rng,
            return_rng=return_rng, deterministic=deterministic, block_mask=block_mask)
    _check_heads(q, k, enable_gqa)
    sig = signature(q, k, v, is_causal=is_causal, score_mod=score_mod, mask_mod=mask_mod,
                    scalars=scalars, arch=_arch(q.device), attn_mask=attn_mask,
                    vectors=vectors, dropout_p=dropout_p)
    lists = []
    if block_mask is not None:  # at kgen's tile (kgen/attention_blocks.py)
        from . import attention_blocks

        full = getattr(block_mask, "full_kv_num_blocks", None) is not None
        sig = dataclasses.replace(sig, block_mask="full" if full else "partial")
        rulebook = default_tile(sig)  # the program's own tile, with the lists
        tile = attention_blocks.tile_for(attention_blocks.block_size(block_mask), rulebook)
        if tile != rulebook:  # a smaller one divides the mask's blocks: written on the line
            sig = dataclasses.replace(sig, blocks=tile)
        lists = attention_blocks.lists_for(block_mask, tile, q, k)
    scale = default_scale(q, scale)
    sig = dataclasses.replace(sig, raw_max=raw_max_allowed(sig, scale))
    # the op's inputs in declaration order: Q, K, V, the bias, the vectors, the dropout's seed
    # and offset, scale, the mods' scalars by name, the dropout's probability and scale (the
    # vectors and the (seed, offset) checked before the program is compiled)
    extra = [(_bias_cols if sig.bias_cols else _bias)(attn_mask, q, k)] if sig.bias else []
    extra += [_vector(name, index, vectors[name], q, k) for name, index in sig.vectors]
    extra += lists  # the block mask's lists: before the scalars (kgen/lower/program.py)
    values = [float(scalars[name]) for name in sig.scalars]
    rng = None
    if sig.dropout:
        rng = _rng(q.device, dropout_rng)
        extra += [_signed(rng[0]), _signed(rng[1])]
        values += [float(dropout_p), float(1.0 / (1.0 - dropout_p))]
    kernel = _compiled(sig, q.device.index if q.device.index is not None else
                       torch.cuda.current_device())
    out, lse = kernel(_aligned(q), _aligned(k), _aligned(v), *extra, scale, *values)
    result = (out,) + ((lse,) if return_lse else ()) + ((rng,) if return_rng else ())
    return result if len(result) > 1 else out


def default_scale(q, scale: float | None) -> float:
    """The softmax's scale as SDPA takes it: 1 / sqrt(D) when None."""
    return float(1.0 / math.sqrt(q.shape[-1]) if scale is None else scale)


def _check_heads(q, k, enable_gqa: bool) -> None:
    heads, kv_heads = q.shape[1], k.shape[1]
    if kv_heads != heads and not (enable_gqa and kv_heads and heads % kv_heads == 0):
        hint = "" if enable_gqa else " (pass enable_gqa=True for grouped-query attention)"
        raise ArgumentError(f"q has {heads} heads, k and v {kv_heads}{hint}; with GQA the "
                            "query heads must be a multiple of the key/value heads")


_TILES: dict[Signature, tuple[int, int]] = {}


def default_tile(sig: Signature) -> tuple[int, int]:
    """The tile (rows, keys) the rulebook gives `sig`'s program (planned once, no GPU)."""
    if sig not in _TILES:
        from .lower.program import run as plan_program

        plan = plan_program(program(sig), ir.Arch.from_name(sig.arch))
        _TILES[sig] = (plan.tile_m, plan.block)
    return _TILES[sig]


def _rng(device, given: tuple[int, int] | None) -> tuple[int, int]:
    """The (seed, offset) of a dropout: as given, else from torch's CUDA generator of `device`,
    whose offset then advances by 4 (torch's unit), so the next call draws another mask."""
    if given is not None:
        seed, offset = given
        for name, value in (("seed", seed), ("offset", offset)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < 2**64:
                raise ArgumentError(f"dropout_rng's {name} must be an int in [0, 2**64), got "
                                    f"{value!r}")
        return int(seed), int(offset)
    import torch

    index = device.index if device.index is not None else torch.cuda.current_device()
    generator = torch.cuda.default_generators[index]
    seed, offset = int(generator.initial_seed()), int(generator.get_offset())
    generator.set_offset(offset + 4)
    return seed, offset


def _signed(value: int) -> int:
    """A u64 as the int64 with its bits (the runtime's long long)."""
    return value - 2**64 if value >= 2**63 else value


def _bias(mask, q, k):
    """attn_mask as the program's Bias [B, H, S, T]: a bool mask as 0 / -inf in q's dtype; the
    broadcast dims at stride 0 (nothing copied for them); the rest copied only where the
    kernel's strides need it (a unit stride along T, rows 16-byte apart)."""
    import torch

    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~mask.to(q.device), -math.inf)
    mask = mask.to(q.device)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    length = int(k.shape[2])
    unit = mask.shape[-1] == 1 or mask.stride(-1) == 1
    rows_ok = mask.shape[-2] == 1 or (mask.stride(-2) * mask.element_size()) % 16 == 0
    lead_ok = all(mask.shape[d] == 1 or (mask.stride(d) * mask.element_size()) % 16 == 0
                  for d in (0, 1))
    if mask.shape[-1] != length or not (unit and rows_ok and lead_ok) or mask.data_ptr() % 16:
        padded = -(-length // 8) * 8  # rows 16 bytes apart
        copy = torch.empty((*mask.shape[:-1], padded), dtype=q.dtype, device=q.device)
        copy = copy[..., :length]
        copy.copy_(mask.expand(*mask.shape[:-1], length))
        mask = copy
    b, h, s = int(q.shape[0]), int(q.shape[1]), int(q.shape[2])
    mask = mask.expand(b, h, s, length)
    # a dim of size 1 that is not broadcast keeps its stride: any value serves, 0 is aligned
    return mask.as_strided(mask.shape, tuple(0 if n == 1 else st for n, st in
                                             zip(mask.shape, mask.stride())))


def _bias_cols(mask, q, k):
    """attn_mask [..., 1, T] (the same for every row) as the program's vector Bias [B, H, T],
    f32 (a bool mask as 0 / -inf), its broadcast batch and heads at stride 0."""
    import torch

    mask = mask.to(q.device)
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=torch.float32, device=q.device).masked_fill_(
            ~mask, -math.inf)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))[:, :, 0, :]
    b, h, length = int(q.shape[0]), int(q.shape[1]), int(k.shape[2])
    mask = mask.to(torch.float32).expand(mask.shape[0], mask.shape[1], length).contiguous()
    return mask.expand(b, h, length)


def _vector(name: str, index: str, t, q, k):
    """A mod's vector as the program declares it (VECTOR_DIMS), f32 on q's device; a row or
    col vector is shared by every head (stride 0), and a [S] or [T] one by every batch."""
    import torch

    t = torch.as_tensor(t, device=q.device).to(torch.float32)
    check_vector(name, index, t, q, k)
    if index in ("row", "col"):
        t = (t.unsqueeze(0) if t.dim() == 1 else t).contiguous()
        batch, heads, length = int(q.shape[0]), int(q.shape[1]), int(t.shape[-1])
        return t.as_strided((batch, heads, length), (0 if t.shape[0] == 1 else length, 0, 1))
    return t.contiguous()


def check_vector(name: str, index: str, t, q, k) -> None:
    """A vector's shape for the index the mods read it at: [S] or [B, S] at row, [T] or [B, T]
    at col, [H] at head, [B] at batch (shapes only: a traced call's fake tensors too)."""
    if index in ("row", "col"):
        length = int(q.shape[2] if index == "row" else k.shape[2])
        batch = int(q.shape[0])
        shape = tuple(int(d) for d in t.shape)
        if len(shape) == 1:
            shape = (1, *shape)
        if len(shape) != 2 or shape[-1] != length or shape[0] not in (1, batch):
            raise ArgumentError(f"vector {name!r} is read at {index}: it must be "
                                f"[{'S' if index == 'row' else 'T'}] or [B, "
                                f"{'S' if index == 'row' else 'T'}] = [{batch}, {length}], "
                                f"got {list(t.shape)}")
        return
    want = int(q.shape[1] if index == "head" else q.shape[0])
    if len(t.shape) != 1 or t.shape[0] != want:
        raise ArgumentError(f"vector {name!r} is read at {index}: it must be "
                            f"[{'H' if index == 'head' else 'B'}] = [{want}], got "
                            f"{list(t.shape)}")


def _arch(device) -> str:
    """The program's target on this device: sm_90a on compute capability 9.0 (the warp-
    specialized wgmma skeleton where its rulebook takes the program, else mma.sync), sm_80
    elsewhere (the mma.sync skeleton, which runs on newer GPUs too). Asked once per CUDA
    device (torch reads the device's properties at each get_device_capability)."""
    import torch

    if getattr(device, "type", None) == "cuda":
        return _cuda_arch(device.index if device.index is not None
                          else torch.cuda.current_device())
    return _target(torch.cuda.get_device_capability(device))


@functools.cache
def _cuda_arch(index: int) -> str:
    import torch

    return _target(torch.cuda.get_device_capability(index))


def _target(capability: tuple[int, int]) -> str:
    return "sm_90a" if tuple(capability) == (9, 0) else "sm_80"


def _aligned(t):
    """A tensor whose last dim is contiguous and whose strides are multiples of 16 bytes (the
    kernel copies 16-byte chunks): itself when it is, else a contiguous copy."""
    strides = t.stride()
    if strides[-1] == 1 and all((s * t.element_size()) % 16 == 0 for s in strides[:-1]) and (
            t.data_ptr() % 16 == 0):
        return t
    return t.contiguous()


make_callable(__name__, attention)  # kgen.attention(q, k, v), traced by torch.compile
try:  # the ops torch.compile traces a call to (defined on import, never traced)
    from . import attention_traced  # noqa: E402
except ModuleNotFoundError as err:  # no torch: the program texts work, the calls need torch
    if err.name != "torch":
        raise
    attention_traced = None
