"""The forward's mods in the attention backward (kgen/attention_grad.py): what the backward's
main kernel declares and computes for kgen.attention's score_mod, mask_mod, is_causal, vectors,
scalars and attn_mask, as lines of its program text (`mod_lines`; kgen/attention_grad.py's
`backward_text` places them: one home for the program).

The backward's rows are keys and its columns queries, so the forward's expressions are read
transposed (kgen/differentiate.py `transposed`: `row` and `col` swap, `doc[row]` becomes
`doc[col]`). With s = scale * acc (+ the bias), the forward's x = where(mask, f(s), -inf):
    pt  = where(mask, exp(f(s) - lse'), 0)        lse' = lse, or 0 where lse is -inf (with a
                                                  bias or a score_mod holding an infinity: a
                                                  query whose every score was -inf, P 0)
    dst = where(mask, pt * (acc - D[col]) * f'(s), 0)
f'(s) is kgen's own derivative of score_mod (kgen/differentiate.py); where it is the constant
1 (no score_mod, ALiBi, a bias) dst is the plain pt * (acc - D[col]), whose zero on a masked
block comes from pt's. The masks are `where(P, e, 0)`, so the DAG loop skips the query blocks
a linear mask empties, and those outside a tile's documents where the mask is an equality of
ids (`kd[row] == qd[col]`, scanned per tile; not with GQA or deterministic adds:
kgen/lower/loop_dag.py `_bounds`).

The additive bias (attn_mask) is `tensor BiasT : [B, H, T, S]`, the forward's Bias transposed,
read at (row, col) = (key, query), its layout per target (`bias_layout`): `col` where sm_90a's
wgmma skeleton stages it, the forward's Bias [B, H, S, T] itself seen transposed (no copy: the
copy engine stages its tiles, read by ldmatrix .trans), else `row`, a transposed copy (read per
element, coalesced along the queries); broadcast dims at stride 0 either way. Or
`vector Bias : f32[B, H, T]` read at row when it is one row for every query (attn_mask
[..., 1, T]) and needs no gradient. Its gradient is dS:
`dBiasT = dst` stores the tile [keys, queries] into `dBiasT : [B, H, T, S]` (kgen.attention
returns it transposed, summed over attn_mask's broadcast dims).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from . import ir
from .differentiate import derivative, dsl_text, transposed
from .errors import KgenError

__all__ = ["Mods", "ModLines", "mod_lines", "forward_signature"]

# The bias's forms in the backward: none, the tensor BiasT, the vector Bias[row]
BIAS_FORMS = ("", "tensor", "cols")


@dataclass(frozen=True, slots=True)
class Mods:
    """The forward's options the backward's program depends on (kgen.attention's names)."""

    score_mod: str | None = None
    mask_mod: str | None = None
    scalars: tuple[str, ...] = ()  # the mods' f32 scalars, sorted
    vectors: tuple[tuple[str, str], ...] = ()  # (name, index in the forward), sorted
    bias: str = ""  # one of BIAS_FORMS
    bias_grad: bool = False  # dBiasT is an output (bias is "tensor")
    dropout: bool = False  # dropout_p > 0: the forward's mask regenerated (random_t)


@dataclass(frozen=True, slots=True)
class ModLines:
    """The lines the mods add to the backward's main kernel, by place."""

    inputs: tuple[str, ...]  # declarations after lse and D
    outputs: tuple[str, ...]  # declarations after dK, dV
    scalars: tuple[str, ...]  # after `scalar scale`
    probability: tuple[str, ...]  # st's epilogue: binds pt
    ds: tuple[str, ...]  # dpt's epilogue: binds dst (and stores dBiasT)


def forward_signature(sig):
    """The forward's kgen.attention Signature whose mods `sig` (a BackwardSignature) takes."""
    from .attention import Signature

    m = sig.mods
    return Signature(sig.dtype, sig.d, sig.d_v, sig.causal, m.score_mod, m.mask_mod, m.scalars,
                     sig.arch, bool(m.bias), m.vectors, False, m.bias == "cols")


def mod_lines(sig) -> ModLines:
    """The lines of `sig`'s mods (a BackwardSignature). A mistake in a mod, or an op kgen
    does not differentiate, is a KgenError located in the mod's own text."""
    m, t = sig.mods, sig.dtype
    if m.bias not in BIAS_FORMS or (m.bias_grad and m.bias != "tensor"):
        raise ValueError(f"bias {m.bias!r} (gradient {m.bias_grad}) is not a backward's form")
    inputs = []
    if m.bias == "tensor":
        inputs.append(f"  tensor BiasT : {t}[B, H, T, S] {bias_layout(sig)}")
    elif m.bias == "cols":
        inputs.append("  vector Bias : f32[B, H, T]")
    # a vector keeps its dims; its index swaps (the forward's row is the backward's col)
    dims = {"row": "B, H, S", "col": "B, H, T", "head": "H", "batch": "B"}
    inputs += [f"  vector {name} : f32[{dims[index]}]" for name, index in m.vectors]
    # seed and offset have no default: before the scalars that have one (the torch op's schema)
    inputs += ["  scalar seed : u64", "  scalar offset : u64"] if m.dropout else []
    outputs = [f"  tensor dBiasT : {t}[B, H, T, S] row out"] if m.bias_grad else []
    scalars = [f"  scalar {name} : f32 = 0" for name in m.scalars]
    scalars += (["  scalar dropout_p : f32 = 0", "  scalar dropout_scale : f32 = 1"]
                if m.dropout else [])

    score = "scale * acc" + {"": "", "tensor": " + BiasT", "cols": " + Bias[row]"}[m.bias]
    mod, mask, slope = _forward_terms(sig)
    probability = [f"        score = {score}"]
    value = "score"
    if mod is not None:
        probability.append(f"        modded = {dsl_text(transposed(mod), bare=True)}")
        value = "modded"
    # lse is -inf where every score of the query was -inf (a bias of -inf, a score_mod with an
    # infinity): its probabilities are 0, not exp(-inf + inf)
    lse = "lse[col]"
    if m.bias or (mod is not None and _infinite(mod)):
        probability.append("        lse_use = where(lse[col] == -inf, 0, lse[col])")
        lse = "lse_use"
    p = f"exp({value} - {lse})"
    condition = dsl_text(transposed(mask), bare=True) if mask is not None else None
    # pt: what dV's gemm multiplies; with dropout the kept probabilities, scaled, of pf (the
    # forward's own element (query, key) of the mask: random_t at the backward's (key, query))
    name = "pf" if m.dropout else "pt"
    probability.append(f"        {name} = where({condition}, {p}, 0)" if condition else
                       f"        {name} = {p}")
    dp = "acc"
    if m.dropout:
        probability += ["        kept = random_t(seed, offset) >= dropout_p",
                        "        pt = where(kept, pf * dropout_scale, 0)"]
        dp = "where(kept, acc * dropout_scale, 0)"  # dP of the probabilities before dropout
    ds = f"{name} * ({dp} - D[col])"
    if not (isinstance(slope, ir.Const) and slope.value == 1.0):
        ds = f"{ds} * {dsl_text(transposed(slope))}"  # parenthesized
        if condition:  # zero on a masked element whatever the derivative is there
            ds = f"where({condition}, {ds}, 0)"
    lines = [f"        dst = {ds}"]
    if m.bias_grad:
        lines.append("        dBiasT = dst")
    return ModLines(tuple(inputs), tuple(outputs), tuple(scalars), tuple(probability),
                    tuple(lines))


def _forward_terms(sig) -> tuple[ir.Expr | None, ir.Expr | None, ir.Expr]:
    """The forward's score_mod (None without one), its mask's condition (None without one)
    and score_mod's derivative in the score (the constant 1 without one), in the forward's
    orientation, from its verified program (kgen/attention.py: its mods' errors located)."""
    from . import attention

    if sig.mods == type(sig.mods)() and not sig.causal:
        return None, None, ir.Const(1.0)
    fsig = forward_signature(sig)
    kernel = attention.program(fsig)
    lets = {s.name: s.value for s in kernel.loop.gemms[0].epilogue.stmts
            if isinstance(s, ir.Let)}
    x = lets["x"]
    mask = x.args[0] if isinstance(x, ir.Call) and x.op is ir.Op.WHERE else None
    if mask is not None:  # the forward's `visible` local, inlined
        mask = _inline(mask, lets)
    mod = lets.get("modded")
    if mod is None:
        return None, mask, ir.Const(1.0)
    try:
        slope = derivative(mod, "score")
    except KgenError as err:
        raise attention._in_mod(err, fsig, attention.program_text(fsig)) from None
    return mod, mask, slope


def _infinite(e: ir.Expr) -> bool:
    """Whether the expression holds an infinite constant (`where(.., score, -inf)`)."""
    if isinstance(e, ir.Const):
        return not math.isfinite(float(e.value))
    if isinstance(e, ir.Call):
        return any(_infinite(a) for a in e.args)
    return isinstance(e, ir.Cast) and _infinite(e.arg)


def _inline(e: ir.Expr, lets: dict) -> ir.Expr:
    """`visible` replaced by the mask_mod it binds (the backward binds no such local)."""
    if isinstance(e, ir.LocalRef) and e.name == "visible":
        return lets["visible"]
    if isinstance(e, ir.Call):
        return ir.Call(e.op, tuple(_inline(a, lets) for a in e.args), e.loc)
    if isinstance(e, ir.Cast):
        return ir.Cast(e.dtype, _inline(e.arg, lets), e.loc)
    return e


# ---------------------------------------------------------------------------------------------
# A call's options as the backward's Mods and inputs (torch tensors; kgen/attention_grad.py)


# The backward program's own names: a scalar or vector of the mods may not take one
BACKWARD_NAMES = frozenset({"dO", "D", "dQacc", "dQ", "dK", "dV", "st", "pt", "pf", "dv", "dpt",
                            "dst", "dk", "dq", "BiasT", "dBiasT", "lse_use", "kept"})


def call_mods(q, k, v, options: dict, bias_grad: bool) -> Mods:
    """The Mods of a kgen.attention call (its options checked as the forward checks them)."""
    from . import attention
    from .errors import ArgumentError

    mask = options.get("attn_mask")
    fsig = attention.signature(q, k, v, is_causal=False, score_mod=options.get("score_mod"),
                               mask_mod=options.get("mask_mod"), scalars=options.get("scalars"),
                               attn_mask=mask, vectors=options.get("vectors"),
                               dropout_p=options.get("dropout_p") or 0.0)
    for name in (*fsig.scalars, *(n for n, _ in fsig.vectors)):
        if name in BACKWARD_NAMES:
            raise ArgumentError(f"{name!r} is a name of kgen.attention's backward program; pass "
                                f"the scalar or vector under another name "
                                f"({sorted(BACKWARD_NAMES)} are taken)")
    bias = "" if mask is None else "tensor" if bias_grad or not fsig.bias_cols else "cols"
    return Mods(fsig.score_mod, fsig.mask_mod, fsig.scalars, fsig.vectors, bias, bias_grad,
                fsig.dropout)


def call_inputs(mods: Mods, options: dict, q, k, layout: str) -> dict[str, Any]:
    """The backward's inputs the mods add, by name: BiasT (the attn_mask transposed, in the
    `layout` its program declares: `bias_layout`; a bool one as 0 / -inf), Bias (one row per
    key), the vectors; and the scalars' values (the dropout's seed and offset from
    options["dropout_rng"], the one the forward used)."""
    from . import attention

    found: dict[str, Any] = {}
    mask = options.get("attn_mask")
    if mods.bias == "tensor":
        found["BiasT"] = bias_t(mask, q, k, layout)
    elif mods.bias == "cols":
        found["Bias"] = attention._bias_cols(mask, q, k)
    vectors = options.get("vectors") or {}
    for name, index in mods.vectors:
        found[name] = attention._vector(name, index, vectors[name], q, k)
    scalars = options.get("scalars") or {}
    for name in mods.scalars:
        found[name] = float(scalars[name])
    if mods.dropout:  # the forward's (seed, offset): u64 as the int64 of their bits
        p = float(options["dropout_p"])
        seed, offset = options["dropout_rng"]
        found.update(seed=attention._signed(seed), offset=attention._signed(offset),
                     dropout_p=p, dropout_scale=float(1.0 / (1.0 - p)))
    return found


def bias_layout(sig) -> str:
    """BiasT's layout in the backward program of `sig` (a BackwardSignature; the one place that
    decides it), and so what kgen.attention hands it.
    `col` where the sm_90a wgmma skeleton stages the bias (MHA at the head dims its plain layout
    takes, loop_rules.DAG_WGMMA_N): the forward's Bias [B, H, S, T] seen transposed, nothing
    copied; the copy engine stages its tiles over the memory as it is (boxes of [block
    queries][64 keys]) and the consumers read them by ldmatrix .trans (kgen/targets/sm90/
    loop_dag_schedule.py `_bias`). The transposed copy cost 1.85 ms a call on an H200 (D 128,
    S 4096, batch 4, 16 heads: 0.54 TB/s, beside the backward's own 2.9 ms).
    `row`, the transposed copy (`bias_transposed`), where the bias is read per element from
    global memory: sm_80's mma.sync skeleton, and sm_90a's GQA (its visits walk the query
    heads: not staged) and split layout (D past 128). There a thread's two columns are one
    4-byte load along the queries; column-major they are two 2-byte loads a row apart (NVRTC
    13.5, sm_90a GQA D 128: 28 B of spills where the row-major build has none)."""
    from .targets.dag_wgmma_rules import DAG_WGMMA_STAGE_BIAS
    from .targets.loop_rules import DAG_WGMMA_N

    staged = (sig.arch == "sm_90a" and DAG_WGMMA_STAGE_BIAS and not sig.gqa
              and sig.d in DAG_WGMMA_N and sig.d_v in DAG_WGMMA_N)
    return "col" if staged else "row"


def bias_t(mask, q, k, layout: str):
    """attn_mask as the backward's BiasT [B, H, T, S] in q's dtype and the program's `layout`
    (`bias_layout`): `row` bias_transposed's copy; `col` the forward's Bias (kgen/attention.py
    `_bias`: copied only where its rows are not 16 bytes apart) seen transposed, its rows
    copied per query where it has one for every query (the copy engine takes no 0 pitch)."""
    if layout == "row":
        return bias_transposed(mask, q, k)
    import torch

    from .attention import _bias

    bias = _bias(mask, q, k)
    if bias.shape[2] > 1 and bias.stride(2) == 0:  # attn_mask [..., 1, T] (with its gradient)
        lead = tuple(1 if st == 0 else n for n, st in zip(bias.shape[:2], bias.stride()[:2]))
        t = int(bias.shape[3])
        copy = torch.empty((*lead, bias.shape[2], -(-t // 8) * 8), dtype=bias.dtype,
                           device=bias.device)[..., :t]
        copy.copy_(bias[:lead[0], :lead[1]])
        copy = copy.expand(bias.shape)
        bias = copy.as_strided(copy.shape, tuple(0 if n == 1 else st for n, st in
                                                 zip(copy.shape, copy.stride())))
    return bias.transpose(-1, -2)


def bias_transposed(mask, q, k):
    """attn_mask as the backward's BiasT [B, H, T, S] in q's dtype: transposed (a copy of the
    dims it has, rows 16 bytes apart), its broadcast dims at stride 0."""
    import math

    import torch

    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=q.dtype, device=q.device).masked_fill_(
            ~mask.to(q.device), -math.inf)
    mask = mask.to(device=q.device, dtype=q.dtype)
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    b, h, s, t = int(q.shape[0]), int(q.shape[1]), int(q.shape[2]), int(k.shape[2])
    padded = -(-s // 8) * 8  # rows of S 16 bytes apart
    lead = tuple(mask.shape[:2])
    copy = torch.empty((*lead, t, padded), dtype=q.dtype, device=q.device)[..., :s]
    copy.copy_(mask.expand(*lead, s, t).transpose(-1, -2))
    copy = copy.expand(b, h, t, s)
    return copy.as_strided(copy.shape, tuple(0 if n == 1 else st for n, st in
                                             zip(copy.shape, copy.stride())))


def bias_gradient(dbias_t, mask):
    """The gradient of attn_mask from the backward's dBiasT [B, H, T, S]: transposed, summed
    over the dims attn_mask broadcasts, in its shape and dtype."""
    import torch

    shape = (1,) * (4 - mask.dim()) + tuple(mask.shape)
    shape = shape[:2] + (shape[3], shape[2])  # attn_mask's broadcast, in dBiasT's order
    dims = tuple(d for d in range(4) if shape[d] == 1 and dbias_t.shape[d] != 1)
    grad = dbias_t
    if dims:  # summed over dBiasT's own (contiguous) layout, transposed after (a sum over the
        # transposed view ran 0.22 TB/s on the H200: 9.5 ms of a 12.7 ms backward), into
        # attn_mask's dtype at once (torch's CUDA sum of bf16 / f16 accumulates in f32)
        grad = grad.sum(dim=dims, keepdim=True, dtype=mask.dtype)
    return grad.transpose(-1, -2).reshape(mask.shape).to(mask.dtype)
