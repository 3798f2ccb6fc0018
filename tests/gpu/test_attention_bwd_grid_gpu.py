"""On a GPU: the attention backward's mma.sync skeleton in its warp grid (FlashAttention-2's
sm_80 layout, plan.loop_dag.DagGrid; the plan option kgen/targets/dag_mma_rules.py warp_grid,
the rulebook's default the warp rows until measured) against float64 torch autograd, every
output poisoned (NaN) first: the main kernel (examples/attention_bwd.kg) at ragged S and T of
1, 17, 1000 (and 4097), no mask and causal (top-left, bottom-right), head dims 64 and 128, bf16
and f16 (kgen's runtime compiles the sm_80 plan for the device: sm_90a on an H100 / H200, as
bench/attention_bwd.py's kgen_mma_grid), a written tile 128x32 (also the sm_90a target's plan
with it: the mma.sync skeleton there); GQA and deterministic mode (two runs, the same bits);
and through kgen.attention / kgen.attention_varlen (their backward's programs planned with the
grid allowed) each of the forward's mods (tests/attention_mods_cases.py: softcap, ALiBi, a
window, document masks, a bias with its gradient, dropout; the ones the rulebook refuses the
grid, softcap and at head dim 128 the bias gradient, run the warp rows) and packed sequences.
The CPU side (the grid's index math, its refusals): tests/targets/test_loop_dag_grid.py."""
from __future__ import annotations

import pytest

from tests.attention_mods_cases import CASES
from tests.gpu.attention_bwd_checks import MASKS, check_backward, load
from tests.gpu.attention_checks import close_grads, cuda_torch, skip_unless_runs
from tests.gpu.test_attention_varlen_bwd_gpu import poisoned  # noqa: F401 (a fixture)

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (17, 17), (1, 17), (17, 1000), (1000, 17), (1000, 1000), (1000, 4097)]


def run_case(d, s, t, mask, dtype="bf16", arch="sm_80", tile=None, heads=3, kv_heads=None,
             deterministic=False, repeat=1, b=2):
    """The grid's build (asserted), checked `repeat` times: its (dQ, dK, dV) per call."""
    torch = cuda_torch()
    kernel = load(d, mask, dtype, arch, tile, gqa=kv_heads is not None,
                  deterministic=deterministic, grid=True)
    assert kernel.plan.grid is not None, kernel.plan.layout.why
    tdtype = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    gen = torch.Generator(device="cuda").manual_seed(1000 * s + t + d)
    q, do = (torch.randn(b, heads, s, d, device="cuda", generator=gen).to(tdtype)
             for _ in range(2))
    k, v = (torch.randn(b, kv_heads or heads, t, d, device="cuda", generator=gen).to(tdtype)
            for _ in range(2))
    return check_backward(kernel, q, k, v, do, mask, repeat)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_the_grid_matches_float64_autograd(d, mask, shape):
    run_case(d, *shape, mask)


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", ["none", "bottom_right"])
def test_the_grid_f16_and_a_written_tile(d, mask):
    run_case(d, 1000, 17, mask, dtype="f16")
    run_case(d, 17, 1000, mask, tile="128x32")


@pytest.mark.parametrize("mask", ["none", "top_left"])
def test_the_sm90a_plan_s_mma_sync_skeleton_on_the_grid(mask):
    """The sm_90a target with a written tile 128x32 (the wgmma skeleton does not take it: the
    mma.sync skeleton, here in its warp grid)."""
    skip_unless_runs("sm_90a")
    for d in (64, 128):
        run_case(d, 1000, 17, mask, arch="sm_90a", tile="128x32")


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("ratio", [(4, 2), (8, 1)], ids=["h4-hkv2", "mqa"])
def test_the_grid_with_gqa(mask, ratio):
    run_case(128, 1000, 17, mask, heads=ratio[0], kv_heads=ratio[1])
    run_case(64, 17, 1000, mask, heads=ratio[0], kv_heads=ratio[1])


@pytest.mark.parametrize("mask", ["none", "bottom_right"])
def test_the_grid_in_deterministic_mode_gives_the_same_bits(mask):
    torch = cuda_torch()
    runs = run_case(128, 1000, 1000, mask, deterministic=True, repeat=2)
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.fixture
def grid_backward(monkeypatch):
    """kgen.attention's and kgen.attention_varlen's backward planned with the warp grid (their
    loaded programs emptied for the test, so each is planned anew, and restored after)."""
    from kgen import attention_grad, attention_varlen
    from kgen.targets import dag_mma_rules

    monkeypatch.setattr(dag_mma_rules, "DAG_WARP_GRID", True)
    monkeypatch.setattr(attention_grad, "_LOADED", {})
    monkeypatch.setattr(attention_varlen, "_LOADED", {})


MOD_LENGTHS = [(17, 1000), (1000, 17), (1000, 1000)]


@pytest.mark.parametrize("s, t", MOD_LENGTHS, ids=[f"S{s}-T{t}" for s, t in MOD_LENGTHS])
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_each_mod_s_gradients_on_the_grid(grid_backward, case, s, t, monkeypatch):
    """The mods' backward on the sm_80 plan (the mma.sync skeleton) in the warp grid, head dims
    64 and 128 (test_attention_grad_mods_gpu's check)."""
    from tests.gpu.test_attention_grad_mods_gpu import _check

    for d in (64, 128):
        _check(case, s, t, "sm_80", monkeypatch, d)


def test_dropout_s_mask_on_the_grid_is_the_forward_s(grid_backward, monkeypatch):
    """The Philox groups of the grid's fragments are the warp rows' (a warp's columns whole n16
    pairs): the backward regenerates the forward's dropout mask bit for bit."""
    from tests.gpu.test_attention_grad_mods_gpu import (
        test_the_backward_regenerates_the_forward_s_dropout_mask_bit_for_bit as bit_for_bit)

    bit_for_bit("sm_80", monkeypatch)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("heads", [(4, 4), (8, 2)], ids=["mha", "gqa"])
def test_packed_sequences_on_the_grid(grid_backward, poisoned, causal, heads):  # noqa: F811
    """kgen.attention_varlen's backward (sm_80 plan) at ragged lengths 1, 17, 1000, 4097; its
    outputs and workspace poisoned (NaN) first."""
    from tests.gpu import test_attention_varlen_bwd_gpu as varlen

    torch = poisoned
    h, hkv = heads
    for d in (64, 128):
        q, k, v, do, cu_q, cu_k = varlen._case(torch, varlen.LENGTHS, varlen.LENGTHS, h, hkv, d,
                                               seed=h + causal + d)
        want = varlen.reference_grads(q, k, v, do, cu_q, cu_k, 0.1, causal)
        got = varlen._grads(torch, q, k, v, do, cu_q, cu_k, causal, "sm_80")
        close_grads(got, want, 2e-2)
