"""FlexAttention's spelling of kgen.attention's mods, for the benches that time Flex beside kgen:
the forward's (bench/mods.py, `bench/attention.py --mods`) and the backward's
(kgen/harness/attention_bwd_mods.py, `bench/attention_bwd.py --mods`). One home for the
score_mod and mask_mod closures, the BlockMask of the masks and the compiled flex_attention.

A mod's tensors (`extra`) are the caller's: ALiBi's slopes [H], a document mask's ids [B, S]
(the same ids for queries and keys), an additive bias [1, H, S, T]. The masks are FlexAttention
mask_mods (True keeps), made into one BlockMask outside any timing.
"""
from __future__ import annotations

SOFTCAP = 30.0
# The mods FlexAttention spells; a mod it cannot express is named in the benches with the reason
MODS = ("plain", "softcap", "alibi", "window", "document", "bias")

_COMPILED = None


def score_mod(mod: str, extra=None, cap: float = SOFTCAP):
    """The score_mod of `mod` (None for a mod of masks only): softcap `cap * tanh(x / cap)`,
    ALiBi `x - slopes[h] * (i - j)`, the bias `x + bias[0, h, i, j]`."""
    import torch

    if mod == "softcap":
        return lambda x, b, h, i, j: cap * torch.tanh(x / cap)
    if mod == "alibi":
        return lambda x, b, h, i, j: x - extra[h] * (i - j)
    if mod == "bias":
        return lambda x, b, h, i, j: x + extra[0, h, i, j]
    return None


def mask_mods(mod: str, causal: bool, extra=None, window: int = 1024) -> list:
    """The mask_mods of `mod` under `causal` (top-left, `j <= i`): the window keeps
    `i - window < j < i + window` (one-sided under the causal mask), the document mask
    `ids[b, i] == ids[b, j]`."""
    masks = [lambda b, h, i, j: j <= i] if causal else []
    if mod == "window":
        masks.append(lambda b, h, i, j: (j > i - window) & (j < i + window))
    if mod == "document":
        masks.append(lambda b, h, i, j: extra[b, i] == extra[b, j])
    return masks


def block_mask(masks: list, mod: str, batch: int, s: int, t: int, device="cuda"):
    """The BlockMask of `masks` (None without one): per batch for the document mask (its ids
    differ by batch), shared by batch and heads otherwise."""
    from torch.nn.attention.flex_attention import and_masks, create_block_mask

    if not masks:
        return None
    mask = and_masks(*masks) if len(masks) > 1 else masks[0]
    return create_block_mask(mask, batch if mod == "document" else None, None, s, t,
                             device=device)


def compiled():
    """torch.compile(flex_attention), once per process. One compiled graph per mod and mask:
    past dynamo's default limit of 8 recompiles, flex_attention would run its eager (unfused)
    path and the benches would time that."""
    global _COMPILED
    if _COMPILED is None:
        import torch
        from torch.nn.attention.flex_attention import flex_attention

        torch._dynamo.config.recompile_limit = 64
        # the benches time the backward by torch.autograd.grad(retain_graph=True) of a saved
        # graph; a compiled backward with donated buffers refuses that (seen with ALiBi's
        # captured slopes: "compiled with non-empty donated buffers")
        torch._functorch.config.donated_buffer = False
        _COMPILED = torch.compile(flex_attention)
    return _COMPILED
