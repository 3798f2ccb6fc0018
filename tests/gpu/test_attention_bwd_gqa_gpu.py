"""On a GPU: the attention backward's GQA / MQA and deterministic mode (tests/test_backward_gqa.py
has the CPU side). The main kernel (examples/attention_bwd.kg with K, V, dK, dV of HKV heads,
and/or `reductions deterministic`) against float64 torch autograd of a reference attention whose
K and V are shared by the query heads of a group (dK, dV summed over it): ratios 2:1, 8:1 and
MQA, ragged S and T, no mask and causal (top-left, bottom-right), on the sm_80 build (mma.sync,
tile 128x32) and the sm_90a build (the wgmma skeleton; its dQ by tensor reduce-adds from the add
warp or from each warpgroup, by bulk reduce-adds per row or by atomics; the fast body, the
longest-first order and the staged vectors each on and off) on a Hopper GPU. Deterministic:
two runs give the same bits. kgen.attention trains with GQA and `deterministic=True`."""
from __future__ import annotations

import pytest

from tests.gpu.attention_bwd_checks import MASKS, check_backward, load, reference
from tests.gpu.attention_checks import close_grads, cuda_torch, skip_unless_runs

pytestmark = pytest.mark.gpu


def run_case(d, s, t, mask, heads, kv_heads, arch="sm_80", deterministic=False, adds=None,
             b=2, repeat=1, gqa=True, schedule=()):
    """`repeat` calls, each checked (attention_bwd_checks.check_backward): their dQ, dK, dV. The
    sm_80 build keeps the example's tile 128x32 (mma.sync); sm_90a takes the rulebook's wgmma
    skeleton (`schedule`: with_schedule's options, (name, value) pairs)."""
    torch = cuda_torch()
    kernel = load(d, mask, arch=arch, tile="128x32" if arch == "sm_80" else None, adds=adds,
                  schedule=schedule, gqa=gqa, deterministic=deterministic)
    gen = torch.Generator(device="cuda").manual_seed(1000 * s + t + d + heads)
    q, do = (torch.randn(b, heads, s, d, device="cuda", generator=gen).bfloat16()
             for _ in range(2))
    k, v = (torch.randn(b, kv_heads, t, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    return check_backward(kernel, q, k, v, do, mask, repeat)


RATIOS = [(4, 2), (8, 1), (16, 2)]  # 2:1, MQA, 8:1
SHAPES = [(1, 17), (17, 1000), (1000, 17), (1000, 4097), (4097, 1000)]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"h{r[0]}-hkv{r[1]}")
def test_gqa_sm80(mask, shape, ratio):
    run_case(128, *shape, mask, *ratio, b=1)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("ratio", RATIOS, ids=lambda r: f"h{r[0]}-hkv{r[1]}")
def test_gqa_sm90a_wgmma(mask, shape, ratio):
    skip_unless_runs("sm_90a")
    run_case(128, *shape, mask, *ratio, arch="sm_90a", b=1)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_gqa_head_dim_64_and_batches(arch):
    skip_unless_runs(arch)
    run_case(64, 333, 1000, "top_left", 6, 2, arch=arch, b=3)
    run_case(64, 1000, 333, "bottom_right", 3, 1, arch=arch, b=2)


@pytest.mark.parametrize("adds", ["tensor", "rows", "atomics"])
def test_gqa_sm90a_other_adds(adds):
    skip_unless_runs("sm_90a")
    run_case(128, 1000, 4097, "top_left", 8, 2, arch="sm_90a", adds=adds, b=1)


# The sm_90a schedule with GQA (dag_wgmma_rules: the fast body inside the mask, the longest
# tiles first under it, lse and D staged by the producer per visit's query head), each piece on
# and off through with_schedule, against the float64 reference at ragged lengths. Batches and KV
# heads > 1 so that the longest-first order maps tiles over several (batch, KV head) pairs.
GQA_SHAPES = [(1, 17), (17, 1000), (1000, 17), (1000, 1000), (1, 1)]


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["top_left", "bottom_right"])
@pytest.mark.parametrize("fast_body", [True, False], ids=["fast", "one-body"])
@pytest.mark.parametrize("lpt", [True, False], ids=["lpt", "grid-order"])
def test_gqa_sm90a_schedules(d, mask, fast_body, lpt):
    skip_unless_runs("sm_90a")
    schedule = (("fast_body", fast_body), ("lpt", lpt))
    for s, t in GQA_SHAPES:
        run_case(d, s, t, mask, 8, 2, arch="sm_90a", b=2, schedule=schedule)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("schedule", [
    (("stage_vectors", False),), (("fast_body", False), ("stage_vectors", False)),
    (("fast_body", False), ("lpt", False), ("stage_vectors", False))],
    ids=["vectors-loaded", "one-body-vectors-loaded", "all-off"])
def test_gqa_sm90a_vectors_loaded(d, mask, schedule):
    skip_unless_runs("sm_90a")
    for s, t in ((17, 1000), (1000, 17)):
        run_case(d, s, t, mask, 4, 2, arch="sm_90a", b=2, schedule=schedule)


def test_gqa_sm90a_longest_first_sections_of_one_pair():
    """S 4097 by a group of 8: a (batch, KV head) pair streams more than the longest-first
    order's L2 section (kLptL2Bytes), so each section holds one pair."""
    skip_unless_runs("sm_90a")
    for mask in ("top_left", "bottom_right"):
        run_case(128, 4097, 1000, mask, 16, 2, arch="sm_90a", b=2)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["top_left", "bottom_right"])
def test_gqa_sm90a_deterministic_fast_body_and_vectors(d, mask):
    """Deterministic GQA with the fast body and the staged vectors (the rulebook's at D 64, an
    option at D 128): the same bits run to run, and the float64 reference."""
    torch = cuda_torch()
    skip_unless_runs("sm_90a")
    schedule = (("fast_body", True), ("stage_vectors", True))
    for s, t in ((1000, 4097), (4097, 1000), (17, 1)):
        runs = run_case(d, s, t, mask, 4, 2, arch="sm_90a", deterministic=True, b=1,
                        repeat=3, schedule=schedule)
        for other in runs[1:]:
            for a, b, what in zip(runs[0], other, ("dQ", "dK", "dV")):
                assert torch.equal(a, b), f"{what} differs between runs (S {s}, T {t})"


DET = [("sm_80", None), ("sm_90a", None), ("sm_90a", "rows"), ("sm_90a", "atomics")]


@pytest.mark.parametrize("arch, adds", DET,
                         ids=["sm80", "sm90a-warp", "sm90a-rows", "sm90a-atomics"])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("gqa", [False, True], ids=["mha", "gqa"])
def test_deterministic_runs_give_the_same_bits(arch, adds, mask, gqa):
    torch = cuda_torch()
    skip_unless_runs(arch)
    heads, kv = (4, 2) if gqa else (3, 3)
    for s, t in ((1000, 4097), (4097, 1000), (17, 1)):
        runs = run_case(128, s, t, mask, heads, kv, arch=arch, deterministic=True, adds=adds,
                        b=1, repeat=3, gqa=gqa)
        for other in runs[1:]:
            for a, b, what in zip(runs[0], other, ("dQ", "dK", "dV")):
                assert torch.equal(a, b), f"{what} differs between runs (S {s}, T {t})"


# ---------------------------------------------------------------------------------------------
# kgen.attention trains with GQA, and deterministically on request


def _inputs(torch, seed, b, h, hkv, s, t, d):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q, do = (torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, hkv, t, d, device="cuda", generator=gen).bfloat16()
            for _ in range(2))
    return q, k, v, do


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("s, t", [(17, 17), (1000, 1000), (17, 1000), (1, 1)])
def test_kgen_attention_gqa_gradients(s, t, causal):
    torch = cuda_torch()
    import kgen

    q, k, v, do = _inputs(torch, s + t, 2, 8, 2, s, t, 64)
    q, k, v = (x.requires_grad_() for x in (q, k, v))
    out = kgen.attention(q, k, v, is_causal=causal, enable_gqa=True)
    out.backward(do)
    torch.cuda.synchronize()
    dq, dk, dv, _, _ = reference(q.detach(), k.detach(), v.detach(), do, 1 / 8,
                                 "top_left" if causal else "none")
    close_grads((q.grad, k.grad, v.grad), (dq, dk, dv), 3e-2)


@pytest.mark.parametrize("how", ["argument", "torch_flag"])
def test_kgen_attention_deterministic(how):
    torch = cuda_torch()
    import kgen

    q, k, v, do = _inputs(torch, 7, 1, 4, 2, 2000, 2000, 64)
    grads = []
    for _ in range(3):
        qq, kk, vv = (x.detach().clone().requires_grad_() for x in (q, k, v))
        if how == "argument":
            out = kgen.attention(qq, kk, vv, is_causal=True, enable_gqa=True,
                                 deterministic=True)
        else:
            previous = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(True, warn_only=True)
            try:
                out = kgen.attention(qq, kk, vv, is_causal=True, enable_gqa=True)
            finally:
                torch.use_deterministic_algorithms(previous)
        out.backward(do)
        grads.append((qq.grad, kk.grad, vv.grad))
    torch.cuda.synchronize()
    for other in grads[1:]:
        for a, b in zip(grads[0], other):
            assert torch.equal(a, b)
    dq, dk, dv, _, _ = reference(q, k, v, do, 1 / 8, "top_left")
    close_grads(grads[0], (dq, dk, dv), 3e-2)
