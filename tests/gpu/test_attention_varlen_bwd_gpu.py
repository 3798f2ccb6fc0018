"""On a GPU: kgen.attention_varlen trains (its backward over packed sequences, issue 52). The
gradients of q, k and v against float64 torch autograd of attention computed sequence by
sequence, at ragged lengths (1, 17, 1000, 4097) packed in one batch, causal (bottom-right per
sequence) and not, MHA and GQA, both targets; query and key lengths that differ (rows that see
no key: zero gradient) and sequences without keys or queries; deterministic mode bit-identical.
Every buffer the backward allocates (its outputs, D, the f32 dQ accumulator) is poisoned with
NaN, so an element no kernel writes shows."""
from __future__ import annotations

import math

import pytest

import kgen
from tests.gpu.attention_checks import (close_grads, cuda_torch, skip_unless_runs,
                                        varlen_reference)

pytestmark = pytest.mark.gpu

LENGTHS = (1, 17, 1000, 4097)


def reference_grads(q, k, v, do, cu_q, cu_k, scale, causal):
    """dq, dk, dv by float64 autograd of the per-sequence reference (a row that sees no key has
    O = 0 and no gradient)."""
    q64, k64, v64 = (x.detach().double().requires_grad_() for x in (q, k, v))
    out, _ = varlen_reference(q64, k64, v64, cu_q, cu_k, scale, causal)
    out.backward(do.double())
    return q64.grad, k64.grad, v64.grad


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty and torch.empty_like of floating dtypes filled with NaN (the backward's
    outputs and workspace: what no kernel writes stays NaN)."""
    torch = cuda_torch()
    empty, empty_like = torch.empty, torch.empty_like

    def nan(t):
        return t.fill_(math.nan) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty", lambda *a, **kw: nan(empty(*a, **kw)))
    monkeypatch.setattr(torch, "empty_like", lambda *a, **kw: nan(empty_like(*a, **kw)))
    return torch


def _case(torch, lengths_q, lengths_k, h, hkv, d, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    cu_q = [0, *torch.tensor(lengths_q).cumsum(0).tolist()]
    cu_k = [0, *torch.tensor(lengths_k).cumsum(0).tolist()]
    q = torch.randn(cu_q[-1], h, d, device="cuda", generator=gen).bfloat16()
    k, v = (torch.randn(cu_k[-1], hkv, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    do = torch.randn(cu_q[-1], h, d, device="cuda", generator=gen).bfloat16()
    return q, k, v, do, cu_q, cu_k


def _grads(torch, q, k, v, do, cu_q, cu_k, causal, arch, deterministic=False, wait=True):
    i32 = dict(dtype=torch.int32, device="cuda")
    q, k, v = (x.detach().clone().requires_grad_() for x in (q, k, v))
    o = kgen.attention_varlen(q, k, v, torch.tensor(cu_q, **i32), torch.tensor(cu_k, **i32),
                              max(cu_q[i + 1] - cu_q[i] for i in range(len(cu_q) - 1)),
                              max(cu_k[i + 1] - cu_k[i] for i in range(len(cu_k) - 1)),
                              is_causal=causal, scale=0.1, arch=arch,
                              deterministic=deterministic)
    o.backward(do)
    if wait:
        torch.cuda.synchronize()
    return q.grad, k.grad, v.grad


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_ragged_lengths_against_float64_autograd(poisoned, arch, causal, heads):
    torch = poisoned
    skip_unless_runs(arch)
    h, hkv = heads
    q, k, v, do, cu_q, cu_k = _case(torch, LENGTHS, LENGTHS, h, hkv, 128, seed=h + causal)
    want = reference_grads(q, k, v, do, cu_q, cu_k, 0.1, causal)
    got = _grads(torch, q, k, v, do, cu_q, cu_k, causal, arch)
    close_grads(got, want, 2e-2)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_unlike_lengths_and_empty_sequences(poisoned, arch):
    """Queries and keys of unlike lengths under bottom-right causal (queries that see no key
    get a zero gradient), a sequence without keys (its queries' gradient zero) and one without
    queries (its keys' gradient zero)."""
    torch = poisoned
    skip_unless_runs(arch)
    lengths_q, lengths_k = (300, 0, 70, 129, 5), (100, 40, 0, 500, 5)
    q, k, v, do, cu_q, cu_k = _case(torch, lengths_q, lengths_k, 4, 2, 64, seed=5)
    want = reference_grads(q, k, v, do, cu_q, cu_k, 0.1, True)
    got = _grads(torch, q, k, v, do, cu_q, cu_k, True, arch)
    close_grads(got, want, 2e-2)
    assert torch.count_nonzero(got[0][cu_q[2]:cu_q[3]]) == 0  # 70 queries, no key
    assert torch.count_nonzero(got[1][cu_k[1]:cu_k[2]]) == 0  # 40 keys, no query
    assert torch.count_nonzero(got[0][:200]) == 0  # queries 0..199 of 300 see none of 100 keys
    assert torch.count_nonzero(got[0][200:300]) > 0


def test_deterministic_is_bit_identical(poisoned):
    torch = poisoned
    arch = "sm_90a" if torch.cuda.get_device_capability() == (9, 0) else "sm_80"
    q, k, v, do, cu_q, cu_k = _case(torch, LENGTHS, LENGTHS, 4, 4, 128, seed=11)
    first = _grads(torch, q, k, v, do, cu_q, cu_k, True, arch, deterministic=True)
    second = _grads(torch, q, k, v, do, cu_q, cu_k, True, arch, deterministic=True)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    want = reference_grads(q, k, v, do, cu_q, cu_k, 0.1, True)
    close_grads(first, want, 2e-2)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_deterministic_with_the_longest_sequence_first(poisoned, arch, causal, heads):
    """The semaphores of a (batch, head) lie at the longest sequence's stride of blocks: with a
    long sequence before short ones, strides taken per sequence overlapped (sequence 1's
    semaphores were sequence 0's: the adds waited on values other tiles wrote, and hung)."""
    torch = poisoned
    skip_unless_runs(arch)
    h, hkv = heads
    lengths = (1000, 300, 17, 1, 512)
    q, k, v, do, cu_q, cu_k = _case(torch, lengths, lengths, h, hkv, 128, seed=13 + causal)
    runs = [_finished(torch, _grads(torch, q, k, v, do, cu_q, cu_k, causal, arch,
                                    deterministic=True, wait=False)) for _ in range(2)]
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    close_grads(runs[0], reference_grads(q, k, v, do, cu_q, cu_k, 0.1, causal), 2e-2)


def _finished(torch, grads, seconds=60.0):
    """`grads`, once the stream has run them: a deadlock fails the test rather than hanging
    the run (the device is not usable after it)."""
    import time

    done = torch.cuda.Event()
    done.record()
    deadline = time.monotonic() + seconds
    while not done.query():
        if time.monotonic() > deadline:
            pytest.fail(f"the deterministic backward did not finish in {seconds:.0f} s")
        time.sleep(0.01)
    return grads
