"""On a GPU: kgen.attention trains with the forward's mods (kgen/attention_grad_mods.py): for
each case of tests/attention_mods_cases.py (softcap and ALiBi differentiated by kgen, a window,
causal bottom-right, document masks, an additive bias with its gradient, a bool mask, a bias of
one row per key), dQ, dK, dV (and the bias's gradient) against float64 autograd of a reference
attention with the same terms, at ragged lengths (1, 17, 1000, 4097; queries that keep no key
included), on the sm_90a target (the wgmma skeleton on a Hopper GPU) and the sm_80 one (the
mma.sync skeleton). Document masks (sorted, unsorted, repeating and scattered ids: the backward
scans each tile of keys' id range and skips the query blocks outside) also at head dim 128 and in
deterministic mode (every block visited there; two runs, the same bits)."""
from __future__ import annotations

import math

import pytest

from tests.attention_mods_cases import BIAS_LAYOUT_CASES, CASES, inputs_of, reference_attention
from tests.gpu.attention_checks import close, close_grads, cuda_torch

pytestmark = pytest.mark.gpu

LENGTHS = [(1, 1), (17, 17), (17, 1000), (1000, 17), (1000, 4097), (4097, 4097)]


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("s, t", LENGTHS, ids=[f"S{s}-T{t}" for s, t in LENGTHS])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_gradients_of_each_mod_match_float64_autograd(case, s, t, arch, monkeypatch):
    _check(case, s, t, arch, monkeypatch, 64)


BIAS_CASES = [c for c in CASES if c.bias_grad]


@pytest.mark.parametrize("s, t", [(1000, 1000), (1000, 17), (304, 4097)],
                         ids=["S1000-T1000", "S1000-T17", "S304-T4097"])
@pytest.mark.parametrize("case", BIAS_CASES, ids=[c.name for c in BIAS_CASES])
def test_the_bias_gradient_at_head_dim_128(case, s, t, monkeypatch):
    """Head dim 128 on the sm_90a skeleton: the staged bias's ring of one slot (two do not fit
    the shared memory there), dBiasT stored from the staged dS^T slot, and on a causal mask
    the skipped blocks' zeros."""
    _check(case, s, t, "device", monkeypatch, 128)


LAYOUT_LENGTHS = [(1000, 1000), (1000, 17), (304, 4097), (64, 8)]


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("s, t", LAYOUT_LENGTHS, ids=[f"S{s}-T{t}" for s, t in LAYOUT_LENGTHS])
@pytest.mark.parametrize("case", BIAS_LAYOUT_CASES, ids=[c.name for c in BIAS_LAYOUT_CASES])
def test_the_bias_gradient_of_broadcast_masks(case, s, t, d, arch, monkeypatch):
    """attn_mask [S, T] (causal) and [B, 1, 1, T] with their gradients: on an H200 the sm_90a
    backward reads the mask column-major (no transposed copy; its rows padded where T is
    ragged, the [B, 1, 1, T] one copied per query), staged by the copy engine, ldmatrix .trans;
    the sm_80 one its transposed copy."""
    _check(case, s, t, arch, monkeypatch, d)


DOCUMENT_CASES = [c for c in CASES if c.name.startswith("document")]
DOCUMENT_LENGTHS = [(1000, 1000), (304, 4097), (4097, 1000)]


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("s, t", DOCUMENT_LENGTHS, ids=[f"S{s}-T{t}" for s, t in
                                                        DOCUMENT_LENGTHS])
@pytest.mark.parametrize("case", DOCUMENT_CASES, ids=[c.name for c in DOCUMENT_CASES])
def test_document_masks_at_head_dim_128(case, s, t, arch, monkeypatch):
    """The backward's equality bound at D 128 (the sm_90a skeleton's plain layout, its fast
    body inside one document)."""
    _check(case, s, t, arch, monkeypatch, 128)


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("case", DOCUMENT_CASES, ids=[c.name for c in DOCUMENT_CASES])
def test_document_masks_in_deterministic_mode_give_the_same_bits(case, arch, monkeypatch):
    """Deterministic mode takes no equality (kgen/lower/loop_dag.py DETERMINISTIC_EQUALITY_WHY):
    every block visited, dQ's adds ordered; right and bit-identical run to run."""
    torch = cuda_torch()
    runs = [_check(case, 1000, 1000, arch, monkeypatch, 64, deterministic=True)
            for _ in range(2)]
    for first, second in zip(*runs):
        assert torch.equal(first, second)


GQA_LENGTHS = [(17, 1000), (1000, 1000), (1000, 4097)]


@pytest.mark.parametrize("arch", ["device", "sm_80"])
@pytest.mark.parametrize("s, t", GQA_LENGTHS, ids=[f"S{s}-T{t}" for s, t in GQA_LENGTHS])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_the_gradients_of_each_mod_with_gqa_match_float64_autograd(case, s, t, arch,
                                                                   monkeypatch):
    """GQA 4:2 (a CTA per KV head walking its group: `head` in the mods the visit's query head,
    ALiBi's slope and the dropout's Philox key, attn_mask's gradient stored per visit; dK and
    dV summed over the group), D 64 and 128 at S 1000."""
    for d in ((64, 128) if (s, t) == (1000, 1000) else (64,)):
        _check(case, s, t, arch, monkeypatch, d, heads=(4, 2))


def _check(case, s, t, arch, monkeypatch, d, deterministic=None, heads=None):
    """Checks one case's O and gradients against float64 autograd; returns dQ, dK, dV.
    `heads`: (query heads, KV heads) for GQA."""
    torch = cuda_torch()
    import kgen
    from kgen import attention as forward

    if arch == "sm_80":  # the mma.sync skeleton, forward and backward
        monkeypatch.setattr(forward, "_arch", lambda device: "sm_80")
    b, h = (1, 2) if max(s, t) < 4097 else (1, 1)
    h, kv = heads or (h, h)
    gen = torch.Generator().manual_seed(11)
    q, k, v, do = (torch.randn(b, n_heads, n, d, generator=gen).cuda().bfloat16()
                   for n, n_heads in ((s, h), (t, kv), (t, kv), (s, h)))
    vectors, bias = inputs_of(case, torch, gen, b, h, s, t)
    vectors = {name: x.cuda() for name, x in vectors.items()}
    if bias is not None:
        bias = bias.cuda() if bias.dtype == torch.bool else bias.cuda().bfloat16()
    leaves = [x.clone().requires_grad_() for x in (q, k, v)]
    bias_leaf = bias.clone().requires_grad_() if case.bias_grad else bias
    options = dict(case.options, vectors=vectors or None, enable_gqa=kv != h)
    if deterministic is not None:
        options["deterministic"] = deterministic
    if case.bias_grad and s % 8:
        from kgen.errors import ArgumentError

        with pytest.raises(ArgumentError, match="a multiple of 8"):
            kgen.attention(*leaves, bias_leaf, **options)
        return
    out = kgen.attention(*leaves, bias_leaf, **options)
    out.backward(do)
    torch.cuda.synchronize()

    ref = [x.double().requires_grad_() for x in (q, k, v)]
    ref_bias = (bias.double().requires_grad_() if case.bias_grad else
                bias if bias is None or bias.dtype == torch.bool else bias.double())
    ref_out, _ = reference_attention(torch, case, *ref, ref_bias,
                                     {n: x.double() for n, x in vectors.items()},
                                     1 / math.sqrt(d))
    ref_out.backward(do.double())
    close(out.detach(), ref_out.detach(), 2e-2, "O")
    close_grads([x.grad for x in leaves], [x.grad for x in ref], 3e-2)
    if case.bias_grad:
        assert bias_leaf.grad.shape == bias.shape
        close(bias_leaf.grad, ref_bias.grad, 3e-2, "dBias")
    return [x.grad for x in leaves]


@pytest.mark.parametrize("arch", ["device", "sm_80"])
def test_the_backward_regenerates_the_forward_s_dropout_mask_bit_for_bit(arch, monkeypatch):
    """V = I: O = the dropped probabilities over the row sums, 0 exactly where the forward's
    mask drops; dO = I: dV = the backward's dropped probabilities transposed, 0 exactly where
    the mask it regenerates (random_t, 16 bits each, a Philox call per eight elements shared
    by two lanes) drops. The two patterns are one, and the reference's (kgen/reference_tiles.py
    random_uniform)."""
    torch = cuda_torch()
    import numpy as np

    import kgen
    from kgen import attention as forward
    from kgen.reference_tiles import random_uniform

    if arch == "sm_80":
        monkeypatch.setattr(forward, "_arch", lambda device: "sm_80")
    b, h, n, p = 2, 2, 128, 0.3
    seed, offset = 0x9E37_79B9_7F4A_7C15, 2**33 + 40
    gen = torch.Generator().manual_seed(5)
    q, k = ((0.5 * torch.randn(b, h, n, n, generator=gen)).cuda().bfloat16() for _ in range(2))
    eye = torch.eye(n).expand(b, h, n, n).contiguous().cuda().bfloat16()
    v = eye.clone().requires_grad_()
    out = kgen.attention(q, k, v, dropout_p=p, dropout_rng=(seed, offset))
    out.backward(eye)
    torch.cuda.synchronize()
    forward_kept = (out.detach() != 0).cpu()
    backward_kept = (v.grad.transpose(-1, -2) != 0).cpu()
    want = torch.from_numpy(np.stack([np.stack([
        random_uniform(seed, offset, i, j, h, np.arange(n), np.arange(n)) >= np.float32(p)
        for j in range(h)]) for i in range(b)]))
    assert torch.equal(forward_kept, want)
    assert torch.equal(backward_kept, want)
    assert 0.6 < want.float().mean().item() < 0.8
