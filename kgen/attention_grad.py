"""kgen.attention that trains: a `torch.autograd.Function` pairing the forward tile program
(kgen/attention.py, which returns the log-sum-exp) with the backward as a kgen sequence.

    q.requires_grad_(); o = kgen.attention(q, k, v, is_causal=True); o.sum().backward()

The backward is three kernels launched in order (kgen/runtime/sequence.py), written as DSL
text by `backward_text` from the forward's options (dtype, head dim, causal; the scale is a
scalar of the call):
- `<name>_dot`, a row kernel: D = rowsum(dO * O), one value per query row;
- `<name>_main`, a loop kernel whose rows are the keys and whose loop walks the query blocks
  (FlashAttention-2's orientation, tests/programs/attention_bwd.kg's form): P^T recomputed
  from the LSE, dV += P^T dO, dS^T = P^T * (dP^T - D), dK += dS^T Q, and dQ += scale * dS K
  added into an f32 accumulator at the loop's rows;
- `<name>_dq`, a row kernel converting that accumulator to the inputs' dtype.
D and the f32 accumulator are the sequence's workspace (allocated per call by torch's caching
allocator). `<name>_dot` zeroes the accumulator's rows beside computing D, so the main kernel is
launched without its own zeroing kernel: three launches, as FlashAttention-3's preprocessing
(kgen/sequence_zeroing.py decides it; in deterministic mode the main kernel's own zeroing
launch zeroes the accumulator with its semaphores).

The forward's mods (score_mod, differentiated by kgen; mask_mod; scalars; vectors; attn_mask,
with its gradient when it requires grad; dropout, its mask regenerated from the forward's seed
and offset) are written into the main kernel by kgen/attention_grad_mods.py. GQA (enable_gqa,
as the forward: dK and dV summed over each KV head's group in the main kernel's loop) and
deterministic mode (`deterministic=`, or torch.are_deterministic_algorithms_enabled(): dQ's
adds ordered) are the signature's; the mods take GQA (`head` the visit's query head, attn_mask's
gradient stored per visit). A value head dim unlike the query's (D_v != D, DeepSeek's 192 / 128)
is the signature's d_v: dO, O, V and dV at D_v (the dot kernel, dV's accumulator), Q, K, dK
and dQ's accumulator at D (on sm_90a at D 192 the mma.sync skeleton holds dK's accumulator: the
wgmma one cannot box it). A block mask (`block_mask=`, as the forward's) is the main kernel's
`blocks by q_num_blocks, q_indices, full ...` line: each tile of keys visits the query blocks
the mask lists for it (kgen/attention_blocks.py `transposed_lists`, at the backward's tile),
partial ones with the mask applied, full ones without, the rest not at all (with GQA, a CTA
walks each query head of its group in turn, that head's lists); not in deterministic mode or
with attn_mask's gradient (`check_block_mask`). kgen's sequences do not carry
a block mask's lists yet, so that backward's three kernels run as programs called in order
(`_listed_gradients`, as kgen/attention_varlen.py's backward: the main kernel zeroes dQacc
itself, four launches). The backward is a torch op (kgen/torch_library.py's `sequence_op`), and
a CUDA graph can capture it.

Under torch.compile, a call recorded by autograd runs kgen/attention_traced.py's
`TracedFunction` instead, whose backward op's implementation is this module's `_gradients`,
so the compiled step launches the same kernels.
"""
from __future__ import annotations

import dataclasses
import functools
import hashlib
from dataclasses import dataclass
from typing import Any

from .attention import default_scale
from .attention_grad_mods import (Mods, bias_gradient, bias_layout, call_inputs, call_mods,
                                  mod_lines)
from .errors import ArgumentError, KgenError, KgenRuntimeError

__all__ = ["BackwardSignature", "attention_with_grad", "backward_module", "backward_text",
           "wants_grad"]

FILE = "<kgen.attention backward>"
# the main kernel's block mask lists (kgen/attention_blocks.py transposed_lists), in order
BLOCK_LISTS = ("q_num_blocks", "q_indices", "full_q_num_blocks", "full_q_indices")


@dataclass(frozen=True, slots=True)
class BackwardSignature:
    """What the backward's program depends on; one compiled sequence each."""

    dtype: str  # "bf16" or "f16"
    d: int  # the head dim of q, k and v
    causal: bool
    arch: str = "sm_80"
    _: dataclasses.KW_ONLY  # the options below by name (a positional one would be silent)
    gqa: bool = False  # k and v have fewer heads (HKV) than q (H): dK, dV summed over groups
    deterministic: bool = False  # dQ's adds ordered: bit-identical gradients run to run
    mods: "Mods" = None  # the forward's mods (score_mod, masks, bias, vectors): Mods() if None
    d_v: int | None = None  # the head dim of v (and of dO, O, dV): d if None
    # a block mask: the main kernel's lists of partial and of full query blocks (the full ones
    # empty where the mask has none: one program for both, which NVRTC builds without spills)
    blocks: bool = False

    def __post_init__(self):
        if self.mods is None:
            object.__setattr__(self, "mods", Mods())
        if self.d_v is None:
            object.__setattr__(self, "d_v", self.d)

    @property
    def name(self) -> str:
        # d_v and blocks below: a backward with neither keeps the name it had before them
        fields = tuple(value for f, value in zip(dataclasses.fields(self),
                                                 dataclasses.astuple(self))
                       if f.name not in ("d_v", "blocks"))
        if self.blocks:  # a block mask's flag after the mods (plain ones too)
            fields += (True,)
        elif self.mods == Mods():  # the plain backward keeps its name (and its cached builds)
            fields = fields[:-1]
        dims = f"{self.d}" if self.d_v == self.d else f"{self.d}_{self.d_v}"
        fields += (self.d_v,) if self.d_v != self.d else ()
        digest = hashlib.sha256(repr(fields).encode()).hexdigest()[:12]
        return f"attention_bwd_{dims}_{digest}"


def backward_text(sig: BackwardSignature) -> str:
    """The backward of `sig` as DSL text: three kernels and the sequence launching them (none
    with a block mask: its kernels run as programs)."""
    n, t, d, dv = sig.name, sig.dtype, sig.d, sig.d_v  # dO, O, V, dV at v's head dim
    kv = "HKV" if sig.gqa else "H"  # K, V, dK, dV: a CTA owns a KV head, walks its group
    mods = mod_lines(sig)
    lines = [
        f"kernel {n}_dot {{",
        f"  target {sig.arch}",
        f"  tensor dO : {t}[B, H, S, {dv}] row",
        f"  tensor O : {t}[B, H, S, {dv}] row",
        "  vector D : f32[B, H, S] out",
        "  epilogue { D = rowsum(cast<f32>(dO) * O) }",
        "}",
        f"kernel {n}_main {{",
        f"  target {sig.arch}",
        *(["  reductions deterministic"] if sig.deterministic else []),
        f"  tensor Q : {t}[B, H, S, {d}] row",
        f"  tensor K : {t}[B, {kv}, T, {d}] row",
        f"  tensor V : {t}[B, {kv}, T, {dv}] row",
        f"  tensor dO : {t}[B, H, S, {dv}] row",
        "  vector lse : f32[B, H, S]",
        "  vector D : f32[B, H, S]",
        *mods.inputs,
        f"  tensor dQacc : f32[B, H, S, {d}] row out accumulate",
        f"  tensor dK : {t}[B, {kv}, T, {d}] row out",
        f"  tensor dV : {t}[B, {kv}, T, {dv}] row out",
        *mods.outputs,
        "  scalar scale : f32 = 1",
        *mods.scalars,
        "  loop q over S {",
        *([f"    blocks by {', '.join(BLOCK_LISTS[:2])}, full {', '.join(BLOCK_LISTS[2:])}"]
          if sig.blocks else []),
        "    gemm st = K @ Q^T accumulate f32 {",
        "      epilogue {",
        *mods.probability,
        "      }",
        "    }",
        "    gemm dv += pt @ dO accumulate f32",
        "    gemm dpt = V @ dO^T accumulate f32 {",
        "      epilogue {",
        *mods.ds,
        "      }",
        "    }",
        "    gemm dk += dst @ Q accumulate f32",
        "    gemm dq = dst^T @ K accumulate f32 {",
        "      epilogue { dQacc += scale * acc }",
        "    }",
        "  }",
        "  epilogue {",
        "    dK = scale * dk",
        "    dV = dv",
        "  }",
        "}",
        f"kernel {n}_dq {{",
        f"  target {sig.arch}",
        f"  tensor dQacc : f32[B, H, S, {d}] row",
        f"  tensor dQ : {t}[B, H, S, {d}] row out",
        "  epilogue { dQ = dQacc }",
        "}",
    ]
    if not sig.blocks:  # (a block mask's lists are no sequence's parameter: `_listed_gradients`)
        lines += [f"sequence {n} {{", "  workspace D, dQacc", f"  launch {n}_dot",
                  f"  launch {n}_main", f"  launch {n}_dq", "}"]
    return "\n".join(lines) + "\n"


def backward_module(sig: BackwardSignature):
    """The verified ir.Module of the backward of `sig` (its one sequence: the backward; with a
    block mask, its three kernels)."""
    from .parse import parse
    from .verify import verify

    module = parse(backward_text(sig), FILE)
    verify(module)
    return module


def wants_grad(*tensors) -> bool:
    """Whether autograd records a call on these tensors (kgen.attention's hook)."""
    import torch

    return torch.is_grad_enabled() and any(
        isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def _refuse(q, k, v, options: dict[str, Any]) -> None:
    if k.shape[1] != q.shape[1]:
        if not options.get("enable_gqa") or k.shape[1] == 0 or q.shape[1] % k.shape[1]:
            raise ArgumentError(f"q has {q.shape[1]} heads, k and v {k.shape[1]}: GQA takes "
                                "enable_gqa=True and a number of KV heads dividing q's")


def check_block_mask(q, k, block_mask, deterministic: bool, bias_grad: bool) -> None:
    """What the backward does not take beside a block mask, by name (its program refuses the
    same: kgen/lower/loop_dag.py `_check_listed`); the lists' shapes (checked_lists)."""
    from .attention_blocks import checked_lists

    if deterministic:
        raise ArgumentError("kgen.attention's backward does not take block_mask in "
                            "deterministic mode (deterministic=True, or torch's deterministic "
                            "algorithms): its ordered dQ adds chain every tile of keys, which "
                            "the lists leave out; pass deterministic=False")
    if bias_grad:
        raise ArgumentError("kgen.attention's backward does not compute attn_mask's gradient "
                            "with block_mask (the blocks it leaves out are not visited); "
                            "detach attn_mask")
    checked_lists(block_mask, q, k)


def check_block_tile(q, k, v, causal: bool, mods: Mods, size: tuple[int, int]) -> None:
    """A block mask of BLOCK_SIZE `size` fits the tile of the backward of this call (the
    signature `_gradients` builds: GQA and D_v among it); the eager and the traced call's one
    check."""
    from . import attention as forward
    from .attention_blocks import backward_tile_check

    sig = BackwardSignature(forward._dtype_name(q.dtype), int(q.shape[-1]), causal,
                            forward._arch(q.device), gqa=k.shape[1] != q.shape[1], mods=mods,
                            d_v=int(v.shape[-1]), blocks=True)
    backward_tile_check(tuple(size), backward_tile(sig))


@functools.cache
def backward_tile(sig: BackwardSignature) -> tuple[int, int]:
    """The main kernel's tile (keys, queries) as the rulebook plans it: a block mask's lists
    are built at it (kgen/attention_blocks.py transposed_lists)."""
    from .api import plan_kernel

    module = backward_module(sig)
    plan = plan_kernel(next(k for k in module.kernels if k.name == f"{sig.name}_main"),
                       sig.arch)
    return plan.tile_m, plan.block


_LOADED: dict[tuple, Any] = {}  # (signature, device) -> the backward's torch op


def _backward_op(sig: BackwardSignature, device: int):
    """The backward sequence of `sig` loaded on `device`, as a torch op. A program the back end
    refuses (a skeleton not built yet) is a KgenRuntimeError saying so."""
    key = (sig, device)
    if key not in _LOADED:
        from .sequence import build_sequence, load_built_sequence
        from .torch_library import sequence_op

        module = backward_module(sig)
        try:
            built = build_sequence(module, module.sequences[0], sig.arch)
        except KgenError as err:
            dims = (f"head dim {sig.d}" if sig.d_v == sig.d else
                    f"head dims {sig.d} (q, k) and {sig.d_v} (v)")
            raise KgenRuntimeError(f"kgen.attention's backward ({sig.dtype}, {dims}, "
                                   f"{'causal' if sig.causal else 'not causal'}) cannot be "
                                   f"built for {sig.arch}: {err.message}") from None
        loaded = load_built_sequence(built, device=device)
        op = sequence_op(loaded, name=f"{sig.name}_cuda{device}")
        # the op's inputs (the parameters no kernel writes) and outputs, in its order
        plan = loaded.plan
        _LOADED[key] = (op, tuple(b.name for b in plan.params if not b.written),
                        tuple(b.name for b in plan.outputs))
    return _LOADED[key]


_PROGRAMS: dict[tuple, Any] = {}  # (signature with a block mask, device) -> its programs


def _listed_gradients(sig: BackwardSignature, device: int, given: dict) -> dict[str, Any]:
    """dQ, dK, dV of a backward with a block mask (sig.blocks): its three kernels as programs,
    called in order on the current stream (D, the f32 dQ accumulator and the gradients
    allocated here by torch's allocator; the main kernel's call zeroes the accumulator; no
    synchronization, so a CUDA graph captures it)."""
    import torch

    key = (sig, device)
    if key not in _PROGRAMS:
        from .api import build_verified, load_built

        module = backward_module(sig)
        try:
            _PROGRAMS[key] = {k.name.removeprefix(f"{sig.name}_"):
                              load_built(build_verified(k, sig.arch), device=device)
                              for k in module.kernels}
        except KgenError as err:
            raise KgenRuntimeError(f"kgen.attention's backward with a block mask ({sig.dtype}, "
                                   f"head dim {sig.d}) cannot be built for {sig.arch}: "
                                   f"{err.message}") from None
    programs = _PROGRAMS[key]
    q, k, v = given["Q"], given["K"], given["V"]
    d = torch.empty(tuple(q.shape[:3]), dtype=torch.float32, device=q.device)
    acc = torch.empty(tuple(q.shape), dtype=torch.float32, device=q.device)
    dq, dk, dv = (torch.empty(t.shape, dtype=t.dtype, device=t.device) for t in (q, k, v))
    programs["dot"](dO=given["dO"], O=given["O"], D=d)
    names = {p.name for p in programs["main"].plan.params}
    programs["main"](**{name: x for name, x in given.items() if name in names}, D=d,
                     dQacc=acc, dK=dk, dV=dv)
    programs["dq"](dQacc=acc, dQ=dq)
    return {"dQ": dq, "dK": dk, "dV": dv}


@functools.cache
def _function():
    """The autograd.Function (defined on first use: `import kgen` needs no torch)."""
    import torch

    from . import attention as forward

    class AttentionFunction(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v, scale: float, causal: bool, deterministic: bool, mods: Mods,
                    values: tuple[float, ...], dropout: tuple, block_mask, bias, *vectors):
            q, k, v = forward._aligned(q), forward._aligned(k), forward._aligned(v)
            gqa = k.shape[1] != q.shape[1]
            options = _mod_options(mods, values, dropout, bias, vectors)
            out, lse = forward.attention(q, k, v, is_causal=causal, scale=scale,
                                         enable_gqa=gqa, return_lse=True,
                                         block_mask=block_mask, **options)
            ctx.save_for_backward(q, k, v, out, lse, bias, *vectors)
            ctx.scale, ctx.causal, ctx.mods, ctx.values = scale, causal, mods, values
            ctx.dropout, ctx.gqa, ctx.deterministic = dropout, gqa, deterministic
            ctx.block_mask = block_mask  # (its lists are no output: kept as they are)
            ctx.mark_non_differentiable(lse)
            return out, lse

        @staticmethod
        def backward(ctx, grad_out, grad_lse):
            q, k, v, out, lse, bias, *vectors = ctx.saved_tensors
            options = _mod_options(ctx.mods, ctx.values, ctx.dropout, bias, vectors)
            found = _gradients(grad_out, q, k, v, out, lse, ctx.scale, ctx.causal, ctx.gqa,
                               ctx.deterministic, ctx.mods,
                               {**options, "block_mask": ctx.block_mask})
            dbias = (bias_gradient(found["dBiasT"], bias) if ctx.mods.bias_grad else None)
            return (found["dQ"], found["dK"], found["dV"], None, None, None, None, None, None,
                    None, dbias, *(None for _ in vectors))

    return AttentionFunction


def _gradients(grad_out, q, k, v, out, lse, scale: float, causal: bool, gqa: bool,
               deterministic: bool, mods: Mods, options: dict[str, Any]) -> dict[str, Any]:
    """The backward sequence's outputs by name (dQ, dK, dV, dBiasT), of the forward's aligned
    q, k, v, its O and lse, and its options (`_mod_options`, and the block mask if any)."""
    import torch

    from . import attention as forward

    block_mask = options.get("block_mask")
    sig = BackwardSignature(forward._dtype_name(q.dtype), int(q.shape[-1]), causal,
                            forward._arch(q.device), gqa=gqa, deterministic=deterministic,
                            mods=mods, d_v=int(v.shape[-1]), blocks=block_mask is not None)
    device = q.device.index if q.device.index is not None else torch.cuda.current_device()
    group = q.shape[1] // k.shape[1]
    expanded = gqa_expanded(sig)
    if expanded:  # K and V per query head, the MHA program's backward (GQA_EXPANDED_CAUSAL)
        sig = dataclasses.replace(sig, gqa=False)
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    given = {"dO": forward._aligned(grad_out), "O": out, "Q": q, "K": k, "V": v, "lse": lse,
             "scale": scale}
    given.update(call_inputs(mods, options, q, k, bias_layout(sig)))
    if block_mask is not None:  # at the main kernel's tile, per tile of keys
        from .attention_blocks import transposed_lists

        lists = transposed_lists(block_mask, backward_tile(sig), q, k)
        given.update(zip(BLOCK_LISTS, lists))
        return _listed_gradients(sig, device, given)
    op, inputs, outputs = _backward_op(sig, device)
    found = dict(zip(outputs, op(*(given[name] for name in inputs))))
    if expanded:  # each KV head's gradients: its group's query heads' summed in f32
        for name in ("dK", "dV"):
            g = found[name]
            found[name] = g.view(g.shape[0], -1, group, *g.shape[2:]).sum(
                2, dtype=torch.float32).to(g.dtype)
    return found


# GQA under a causal mask (the sm_90a wgmma program): the GQA program's CTA owns a tile of keys of
# a KV head and walks the G query heads of its group, so tile j visits G (S / 64 - 2 j) blocks:
# at 16:2 (G 8), S 4096, batch 4, 256 CTAs of 16-512 visits on 132 SMs, the longest as long as
# the average SM's whole share, which no order packs (the non-causal GQA main kernel runs at
# MHA's speed: 530.0 against 532.7 TFLOP/s a query head, causal 341.6 against 518.3; H200,
# bench/attention_bwd.py --groups, 2026-11-30). There K and V are repeated over the group (two
# copies of [B, H, T, D]), the MHA program runs a CTA per (tile of keys, query head), and dK, dV
# per query head are summed over each group in f32 (rounded to the output type per head first:
# a group's sum carries up to G roundings; 2.6e-3 relative from the GQA program's). Measured
# through kgen.attention's autograd (bench/attention_bwd.py --gqa-paths, 16:2, S 4096, ms,
# repeated / GQA program): D 128 causal 2.015 / 2.475, deterministic 2.197 / 3.913; D 64 causal
# 1.301 / 1.195 (slower: the MHA program's D 64 tiles are short, the copies and the sum are not),
# deterministic 1.591 / 2.433. So at D 128, and at D 64 when deterministic; not with a block
# mask (its own lists), dropout (the GQA program's draws are tested as they are), other head
# dims, nor on sm_80 (none measured).
GQA_EXPANDED_CAUSAL = True


def gqa_expanded(sig: BackwardSignature) -> bool:
    """Whether the backward of `sig` runs the MHA program on K and V repeated over each group
    (GQA_EXPANDED_CAUSAL) rather than the GQA program."""
    return (GQA_EXPANDED_CAUSAL and sig.gqa and sig.causal and not sig.blocks
            and not sig.mods.dropout and sig.arch == "sm_90a" and sig.d == sig.d_v
            and (sig.d == 128 or (sig.d == 64 and sig.deterministic)))


def attention_with_grad(q, k, v, *, is_causal: bool = False, scale: float | None = None,
                        return_lse: bool = False, deterministic: bool | None = None, **options):
    """kgen.attention(q, k, v, ...) recorded by autograd (see the module's note).
    `deterministic`: the backward's dQ adds ordered (bit-identical gradients run to run); None
    follows torch.are_deterministic_algorithms_enabled()."""
    import torch

    _refuse(q, k, v, options)
    scale = default_scale(q, scale)
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    bias = options.get("attn_mask")
    block_mask = options.get("block_mask")
    mods = call_mods(q, k, v, options, bias is not None and bias.requires_grad)
    check_bias_grad(q, mods)
    if block_mask is not None:  # checked now, not in the backward
        from .attention_blocks import block_size

        check_block_mask(q, k, block_mask, deterministic, mods.bias_grad)
        check_block_tile(q, k, v, bool(is_causal), mods, block_size(block_mask))
    scalars, vectors = options.get("scalars") or {}, options.get("vectors") or {}
    # the dropout's (seed, offset), drawn here (as the forward draws it): the backward's too
    dropout = ((float(options["dropout_p"]), *forward_rng(q, options.get("dropout_rng")))
               if mods.dropout else ())
    out, lse = _function().apply(q, k, v, scale, bool(is_causal), bool(deterministic), mods,
                                 tuple(float(scalars[name]) for name in mods.scalars), dropout,
                                 block_mask, bias, *(vectors[name] for name, _ in mods.vectors))
    result = (out,) + ((lse,) if return_lse else ()) + (
        (tuple(dropout[1:]) if dropout else None,) if options.get("return_rng") else ())
    return result if len(result) > 1 else out


def check_bias_grad(q, mods: Mods) -> None:
    """attn_mask's gradient is stored [keys, queries]: the query length a multiple of 8."""
    if mods.bias_grad and q.shape[2] % 8:
        raise ArgumentError(f"attn_mask's gradient needs the query length to be a multiple of 8 "
                            f"(got {q.shape[2]}): the backward stores it [keys, queries], rows "
                            "16 bytes apart; pad the queries, or detach attn_mask")


def forward_rng(q, given):
    """The (seed, offset) of a dropout (kgen/attention.py `_rng`)."""
    from .attention import _rng

    return _rng(q.device, given)


def _mod_options(mods: Mods, values: tuple[float, ...], dropout: tuple, bias,
                 vectors) -> dict[str, Any]:
    """kgen.attention's options of the mods, from the Function's arguments."""
    options = {"score_mod": mods.score_mod, "mask_mod": mods.mask_mod,
               "scalars": dict(zip(mods.scalars, values)) or None, "attn_mask": bias,
               "vectors": {name: t for (name, _), t in zip(mods.vectors, vectors)} or None}
    if dropout:
        options.update(dropout_p=dropout[0], dropout_rng=(dropout[1], dropout[2]))
    return options


def gradients_fake(dO, Q, K, V, *options):
    """dQ, dK, dV's fake tensors: Q's, K's and V's shapes (the dense and the packed backward op,
    kgen/attention_traced.py and kgen/attention_varlen.py)."""
    return Q.new_empty(Q.shape), K.new_empty(K.shape), V.new_empty(V.shape)
