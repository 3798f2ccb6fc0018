"""On a GPU: kgen.attention_varlen against float64 attention computed here per sequence, at
ragged lengths (1, 17, 1000, 4097) packed in one batch, causal (bottom-right per sequence) and
not, both targets, GQA; query and key lengths that differ (rows that see no key: O = 0,
lse = -inf) and an empty sequence; rows past the last sequence never written; the example's
kernel through the program runtime with dense-batch sizes equal to the packed ones."""
from __future__ import annotations

import math

import pytest

import kgen
from tests.gpu.attention_checks import close, cuda_torch, skip_unless_runs, varlen_reference

pytestmark = pytest.mark.gpu

LENGTHS = (1, 17, 1000, 4097)


def _packed(torch, lengths_q, lengths_k, h, hkv, d, seed, dtype=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    dtype = dtype or torch.bfloat16
    cu_q = [0, *torch.tensor(lengths_q).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(lengths_k).cumsum(0).tolist()]
    q = torch.randn(cu_q[-1], h, d, device="cuda", generator=gen).to(dtype)
    k = torch.randn(cu_k[-1], hkv, d, device="cuda", generator=gen).to(dtype)
    v = torch.randn(cu_k[-1], hkv, d, device="cuda", generator=gen).to(dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_ragged_lengths_against_float64(arch, causal, heads):
    torch = cuda_torch()
    skip_unless_runs(arch)
    h, hkv = heads
    q, k, v, cu_q, cu_k = _packed(torch, LENGTHS, LENGTHS, h, hkv, 128, seed=h + causal)
    ref_o, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, 0.1, causal)
    i32 = dict(dtype=torch.int32, device="cuda")
    o, lse = kgen.attention_varlen(q, k, v, torch.tensor(cu_q, **i32), torch.tensor(cu_k, **i32),
                                   max(LENGTHS), max(LENGTHS), is_causal=causal, scale=0.1,
                                   return_lse=True, arch=arch)
    torch.cuda.synchronize()
    assert o.shape == q.shape and lse.shape == (h, q.shape[0])
    close(o, ref_o, 2e-2, "O")
    close(lse, ref_lse, 1e-3, "lse")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_rows_that_see_no_key_and_an_empty_sequence(arch):
    """Bottom-right causal with more queries than keys: a sequence's first S - T rows see no
    key (O = 0, lse = -inf); a sequence of no keys masks its rows in full; one of no rows."""
    torch = cuda_torch()
    skip_unless_runs(arch)
    lengths_q, lengths_k = (300, 17, 0, 129, 1000), (100, 0, 64, 129, 4097)
    q, k, v, cu_q, cu_k = _packed(torch, lengths_q, lengths_k, 4, 2, 64, seed=3)
    ref_o, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, 0.125, True)
    i32 = dict(dtype=torch.int32, device="cuda")
    o, lse = kgen.attention_varlen(q, k, v, torch.tensor(cu_q, **i32), torch.tensor(cu_k, **i32),
                                   1000, 4097, is_causal=True, return_lse=True, arch=arch)
    torch.cuda.synchronize()
    assert (lse[:, :200] == -math.inf).all() and (o[:200] == 0).all()  # 300 queries, 100 keys
    assert (lse[:, 300:317] == -math.inf).all() and (o[300:317] == 0).all()  # no key at all
    close(o, ref_o, 2e-2, "O")
    close(lse, ref_lse, 1e-3, "lse")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_rows_past_the_last_sequence_are_never_written(arch):
    """The offsets cover a prefix of Q and of the outputs: the rest keeps its sentinel."""
    torch = cuda_torch()
    skip_unless_runs(arch)
    from kgen import attention as dense
    from kgen import attention_varlen as varlen

    q, k, v, cu_q, cu_k = _packed(torch, (1, 17, 1000), (1, 17, 1000), 4, 4, 128, seed=5)
    rows = q.shape[0] + 300
    qx = torch.cat([q, q[:300]])  # 300 more rows than the sequences hold
    out = torch.full((rows, 4, 128), float("nan"), dtype=q.dtype, device="cuda")
    lse = torch.full((4, rows), 7.0, device="cuda")
    sig = dense.Signature("bf16", 128, 128, True, None, None, (), arch)
    kernel = varlen._compiled(sig, torch.cuda.current_device())
    i32 = dict(dtype=torch.int32, device="cuda")
    kernel(sizes={"S": 1000, "T": 1000}, Q=qx.transpose(0, 1), K=k.transpose(0, 1),
           V=v.transpose(0, 1), O=out.transpose(0, 1), lse=lse,
           cu_seqlens_q=torch.tensor(cu_q, **i32), cu_seqlens_k=torch.tensor(cu_k, **i32),
           scale=0.1)
    torch.cuda.synchronize()
    total = cu_q[-1]
    assert torch.isnan(out[total:]).all() and (lse[:, total:] == 7.0).all()
    ref_o, ref_lse = varlen_reference(q, k, v, cu_q, cu_k, 0.1, True)
    close(out[:total], ref_o, 2e-2, "O")
    close(lse[:, :total], ref_lse, 1e-3, "lse")
