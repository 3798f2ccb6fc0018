"""kgen.attention as torch.compile traces it: one forward op and one backward op, whatever the
signature, the call's options among their arguments, paired by an autograd.Function.

    torch.compile(step, fullgraph=True)   # step calls kgen.attention(q, k, v, bias, ...)

`traced` is the call under tracing (kgen/attention.py's `attention` hands it over when
`torch.compiler.is_compiling()`): it checks the options with the eager call's own functions
(a mistake is the eager call's ArgumentError), then calls `torch.ops.kgen.attention_fwd`, or,
where autograd records the call, `TracedFunction`, whose backward calls
`torch.ops.kgen.attention_bwd`. The ops' implementations are the eager forward and the eager
backward's sequence (kgen/attention_grad.py `_gradients`), so a compiled step launches the
eager step's kernels and gives its bits; their fake implementations give the outputs' shapes.

Traced: attn_mask (bool or additive, with its gradient where it requires grad), vectors, the
mods and their scalars, the dropout with a given `dropout_rng` (the (seed, offset) is then an
argument of both ops, so the backward regenerates the forward's mask), a block mask (its lists
and BLOCK_SIZE arguments of both ops, which rebuild it as kgen's BlockLists: the backward's
lists transposed in its op, kgen/attention_blocks.py `transposed_lists`). Not
traced (the call breaks the graph and runs eagerly; fullgraph=True refuses it with the
reason): a dropout whose (seed, offset) would be drawn from torch's CUDA generator (drawing it
advances the generator, which a traced graph cannot replay).

Imported by kgen/attention.py where torch is (`import kgen` needs no torch), so that
torch.compile never traces the ops' definition.
"""
from __future__ import annotations

import torch

from . import attention as dense
from . import attention_blocks
from . import attention_grad as grad  # (attributes read at call time: it may be importing)
from .attention_grad_mods import bias_gradient, call_mods
from .torch_library import function_op

__all__ = ["BACKWARD_SCHEMA", "FORWARD_SCHEMA", "NOT_TRACED", "traced"]

# the tensors and the options after q, k, v, as both ops take them (`traced`'s `options`);
# dropout_rng is the (seed, offset) as int64 bits ([] without a dropout)
TENSORS = "Tensor? attn_mask, Tensor[] vectors"
OPTIONS = ("float scale, bool causal, str? score_mod, str? mask_mod, str[] scalar_names, "
           "float[] scalar_values, str[] vector_names, float dropout_p, SymInt[] dropout_rng")
# a block mask's lists (counts, indices, then the full pair if any; [] for none) and its
# BLOCK_SIZE, as the call gave them (the backward's op transposes them)
BLOCKS = "Tensor[] block_lists, int[] block_size"
FORWARD_SCHEMA = (f"(Tensor Q, Tensor K, Tensor V, {TENSORS}, {OPTIONS}, {BLOCKS}) "
                  "-> (Tensor, Tensor)")
BACKWARD_SCHEMA = (f"(Tensor dO, Tensor Q, Tensor K, Tensor V, Tensor O, Tensor lse, {TENSORS}, "
                   f"{OPTIONS}, {BLOCKS}, bool bias_grad, bool deterministic) "
                   "-> (Tensor, Tensor, Tensor, Tensor)")
# why a call runs eagerly under torch.compile (a graph break; fullgraph=True shows it)
NOT_TRACED = ("kgen.attention does not trace a dropout without dropout_rng (drawing the seed "
              "and offset advances torch's CUDA generator): pass dropout_rng=(seed, offset) to "
              "trace a dropout")


def traced(q, k, v, attn_mask, is_causal, scale, enable_gqa, score_mod, mask_mod, scalars,
           vectors, dropout_p, dropout_rng, return_lse, return_rng, deterministic, block_mask):
    """kgen.attention's call under torch.compile (dynamo reads this function's code): the
    eager call's checks, then the forward op, or with grad the Function of the two ops."""
    if dropout_p and dropout_rng is None:
        return _UNTRACED(q, k, v, attn_mask, is_causal=is_causal, scale=scale,
                         enable_gqa=enable_gqa, score_mod=score_mod, mask_mod=mask_mod,
                         scalars=scalars, vectors=vectors, dropout_p=dropout_p,
                         dropout_rng=dropout_rng, return_lse=return_lse,
                         return_rng=return_rng, deterministic=deterministic,
                         block_mask=block_mask)
    dense._check_heads(q, k, enable_gqa)
    sig = dense.signature(q, k, v, is_causal=is_causal, score_mod=score_mod,
                          mask_mod=mask_mod, scalars=scalars, attn_mask=attn_mask,
                          vectors=vectors, dropout_p=dropout_p)
    tensors = []
    for name, index in sig.vectors:  # checked as the eager call checks them, by shape
        t = vectors[name] if isinstance(vectors[name], torch.Tensor) else torch.as_tensor(
            vectors[name])
        dense.check_vector(name, index, t, q, k)
        tensors.append(t)
    rng = dense._rng(q.device, dropout_rng) if sig.dropout else None
    options = (dense.default_scale(q, scale), bool(is_causal), score_mod, mask_mod,
               list(sig.scalars), [float(scalars[name]) for name in sig.scalars],
               [name for name, _ in sig.vectors], float(dropout_p),
               [dense._signed(value) for value in rng] if rng else [])
    blocks = _block_lists(block_mask, q, k)
    if grad.wants_grad(q, k, v, attn_mask):
        out, lse = _with_grad(q, k, v, attn_mask, tensors, enable_gqa, options, deterministic,
                              block_mask, blocks)
    else:
        out, lse = _FORWARD(q, k, v, attn_mask, tensors, *options, *blocks)
    result = (out,) + ((lse,) if return_lse else ()) + ((rng,) if return_rng else ())
    return result if len(result) > 1 else out


def _block_lists(block_mask, q, k) -> tuple[list, list]:
    """The forward op's block_lists and block_size of a call's block_mask, checked as the eager
    call checks them (its BLOCK_SIZE splits into kgen's tiles: any rulebook tile takes the
    multiples of 64 by 32 its smallest does; the lists' shapes); ([], []) without one."""
    if block_mask is None:
        return [], []
    size = attention_blocks.block_size(block_mask)
    attention_blocks.tile_for(size, (attention_blocks.TILE_M[0], attention_blocks.TILE_N[0]))
    return attention_blocks.checked_lists(block_mask, q, k), list(size)


def _with_grad(q, k, v, attn_mask, vectors, enable_gqa, options, deterministic, block_mask,
               blocks):
    """O and lse of a traced call recorded by autograd: the eager backward's checks
    (kgen/attention_grad.py `_refuse`, call_mods, check_bias_grad, check_block_mask; the block
    mask's BLOCK_SIZE against the backward's tile in the backward op), then TracedFunction."""
    call = _call_options(attn_mask, vectors, *options[2:])
    grad._refuse(q, k, v, {"enable_gqa": enable_gqa, **call})
    bias_grad = attn_mask is not None and attn_mask.requires_grad
    grad.check_bias_grad(q, call_mods(q, k, v, call, bias_grad))
    if deterministic is None:
        deterministic = torch.are_deterministic_algorithms_enabled()
    if block_mask is not None:
        grad.check_block_mask(q, k, block_mask, bool(deterministic), bias_grad)
    lists, size = blocks
    return TracedFunction.apply(q, k, v, attn_mask, options, bias_grad, bool(deterministic),
                                size, len(vectors), *vectors, *lists)


def _call_options(attn_mask, vectors, score_mod, mask_mod, scalar_names, scalar_values,
                  vector_names, dropout_p, dropout_rng) -> dict:
    """kgen.attention's keyword options from the ops' arguments (after scale and causal)."""
    options = {"attn_mask": attn_mask, "score_mod": score_mod, "mask_mod": mask_mod,
               "scalars": dict(zip(scalar_names, scalar_values)) or None,
               "vectors": dict(zip(vector_names, vectors)) or None}
    if dropout_p:  # the (seed, offset) back from their int64 bits
        options.update(dropout_p=dropout_p,
                       dropout_rng=tuple(value % 2**64 for value in dropout_rng))
    return options


def _forward(Q, K, V, attn_mask, vectors, scale, causal, score_mod, mask_mod, scalar_names,
             scalar_values, vector_names, dropout_p, dropout_rng, block_lists, block_size):
    """The forward op: kgen.attention's eager call (O and lse, allocated by torch's caching
    allocator, the program launched on the current stream); a block mask as kgen's BlockLists
    of the lists and BLOCK_SIZE given."""
    block_mask = (attention_blocks.BlockLists(*block_lists, block_size=tuple(block_size))
                  if block_lists else None)
    return dense.attention(Q, K, V, is_causal=causal, scale=scale, enable_gqa=True,
                           return_lse=True, block_mask=block_mask, **_call_options(
                               attn_mask, vectors, score_mod, mask_mod, scalar_names,
                               scalar_values, vector_names, dropout_p, dropout_rng))


def _forward_fake(Q, K, V, *arguments):
    """O [B, H, S, D_v] in q's dtype and lse [B, H, S] f32, contiguous (as the program's)."""
    return (Q.new_empty((*Q.shape[:3], V.shape[-1])),
            Q.new_empty(tuple(Q.shape[:3]), dtype=torch.float32))


def _backward(dO, Q, K, V, O, lse, attn_mask, vectors, scale, causal, score_mod, mask_mod,
              scalar_names, scalar_values, vector_names, dropout_p, dropout_rng, block_lists,
              block_size, bias_grad, deterministic):
    """The backward op: dQ, dK, dV by the eager backward's sequence (`_gradients`), of the
    forward op's Q, K, V (aligned as the forward aligns them), O and lse, with the forward's
    block mask (its BLOCK_SIZE checked against the backward's tile); and attn_mask's gradient
    in its shape where `bias_grad`, else an empty tensor."""
    q, k, v = dense._aligned(Q), dense._aligned(K), dense._aligned(V)
    options = _call_options(attn_mask, vectors, score_mod, mask_mod, scalar_names,
                            scalar_values, vector_names, dropout_p, dropout_rng)
    if block_lists:
        options["block_mask"] = attention_blocks.BlockLists(*block_lists,
                                                            block_size=tuple(block_size))
        grad.check_block_tile(q, k, v, causal, call_mods(q, k, v, options, bias_grad),
                              tuple(block_size))
    found = grad._gradients(dO, q, k, v, O, lse, scale, causal, K.shape[1] != Q.shape[1],
                       deterministic, call_mods(q, k, v, options, bias_grad), options)
    dbias = bias_gradient(found["dBiasT"], attn_mask) if bias_grad else Q.new_empty(0)
    return found["dQ"], found["dK"], found["dV"], dbias


def _backward_fake(dO, Q, K, V, O, lse, attn_mask, vectors, *options):
    """dQ, dK, dV in Q's, K's and V's shapes; attn_mask's gradient in its own (bias_grad, the
    second last option) or empty: by bias_gradient itself on an empty dBiasT [B, H, T, S], so
    its strides are the real op's (a transposed view, not contiguous)."""
    bias_grad = options[-2]
    dbias_t = Q.new_empty((Q.shape[0], Q.shape[1], K.shape[2], Q.shape[2]))
    return (*grad.gradients_fake(dO, Q, K, V),
            bias_gradient(dbias_t, attn_mask) if bias_grad else Q.new_empty(0))


_FORWARD = function_op(_forward, FORWARD_SCHEMA, _forward_fake, name="attention_fwd")
_BACKWARD = function_op(_backward, BACKWARD_SCHEMA, _backward_fake, name="attention_bwd")
# kgen.attention with torch.compile disabled: a graph break, the call eager
_UNTRACED = torch.compiler.disable(dense.attention, reason=NOT_TRACED)


class TracedFunction(torch.autograd.Function):
    """The forward op and the backward op as one differentiable call: q, k, v get their
    gradients, and attn_mask its own where `bias_grad`; the vectors get none."""

    @staticmethod
    def forward(ctx, q, k, v, attn_mask, options, bias_grad, deterministic, block_size, count,
                *tensors):
        vectors, lists = list(tensors[:count]), list(tensors[count:])  # then a block mask's
        out, lse = _FORWARD(q, k, v, attn_mask, vectors, *options, lists, block_size)
        ctx.save_for_backward(q, k, v, out, lse, attn_mask, *tensors)
        ctx.options, ctx.flags = options, (bias_grad, deterministic)
        ctx.count, ctx.block_size = count, block_size
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, grad_out, grad_lse):
        q, k, v, out, lse, attn_mask, *tensors = ctx.saved_tensors
        vectors, lists = tensors[:ctx.count], tensors[ctx.count:]
        dq, dk, dv, dbias = _BACKWARD(grad_out, q, k, v, out, lse, attn_mask, vectors,
                                      *ctx.options, lists, ctx.block_size, *ctx.flags)
        return (dq, dk, dv, dbias if ctx.flags[0] else None, None, None, None, None, None,
                *(None for _ in tensors))
