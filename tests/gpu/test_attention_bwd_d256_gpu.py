"""On a Hopper GPU: the attention backward at head dim 256, the sm_90a wgmma skeleton's split
layout (kgen/targets/dag_wgmma_rules.py, DAG_WGMMA_SPLIT: 64 keys a CTA, the two consumer
warpgroups splitting dK, dV along D and S^T, dP^T along the block's queries, P^T and dS^T
staged, dQ by f32 atomics). The main kernel (examples/attention_bwd.kg at D 256) against float64
autograd of a reference attention, outputs poisoned (NaN) first: ragged S and T from {1, 17,
1000, 4097}, no mask and causal (top-left, bottom-right; keys that see no query included),
bf16 and f16; GQA (2:1, MQA) and deterministic mode (two runs, the same bits); and
kgen.attention's backward with the forward's mods (softcap, ALiBi, a window, a document mask,
dropout, a bias and its gradient: tests/attention_mods_cases.py) at D 256. At D 192 the same
layout with its warpgroups' halves of 96 columns issued as wgmma.m64n32k16 pieces (dag_wgmma_rules.
DAG_WGMMA_SPLIT_PIECE): every mask at ragged S and T, f16, GQA, deterministic mode; 192 / 128
(DeepSeek's) in tests/gpu/test_attention_grad_value_dim_gpu.py."""
from __future__ import annotations

import pytest

from tests.gpu import test_attention_bwd_gqa_gpu as gqa
from tests.gpu.attention_bwd_checks import MASKS, load
from tests.gpu.attention_checks import skip_unless_runs
from tests.gpu.test_attention_bwd_gpu import run_case

pytestmark = pytest.mark.gpu

SHAPES = [(1, 1), (17, 17), (1, 17), (17, 1000), (1000, 17), (1000, 1000), (4097, 1000),
          (1000, 4097), (4097, 4097)]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_split_matches_float64_autograd(mask, shape):
    skip_unless_runs("sm_90a")
    assert load(256, mask, arch="sm_90a").plan.wgmma.split is not None
    run_case(256, *shape, mask, arch="sm_90a", b=1 if max(shape) > 1000 else 2, h=2)


@pytest.mark.parametrize("mask", ["none", "bottom_right"])
def test_split_f16(mask):
    skip_unless_runs("sm_90a")
    run_case(256, 1000, 4097, mask, dtype="f16", arch="sm_90a", b=1, h=1)
    run_case(256, 17, 1000, mask, dtype="f16", arch="sm_90a", b=1, h=2)


def test_split_other_batches_and_heads():
    skip_unless_runs("sm_90a")
    run_case(256, 333, 1000, "top_left", arch="sm_90a", b=3, h=5)
    run_case(256, 1000, 333, "none", arch="sm_90a", b=1, h=1)


def test_split_keys_that_see_no_query_give_zero_dk_dv():
    torch = pytest.importorskip("torch")
    skip_unless_runs("sm_90a")
    _, dk, dv = run_case(256, 17, 1000, "top_left", arch="sm_90a", b=1, h=1)
    assert torch.equal(dk[..., 17:, :].float(), torch.zeros_like(dk[..., 17:, :].float()))
    assert torch.equal(dv[..., 17:, :].float(), torch.zeros_like(dv[..., 17:, :].float()))


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", [(17, 1000), (1000, 17), (1000, 4097)],
                         ids=lambda st: f"s{st[0]}-t{st[1]}")
@pytest.mark.parametrize("ratio", [(4, 2), (4, 1)], ids=lambda r: f"h{r[0]}-hkv{r[1]}")
def test_split_gqa(mask, shape, ratio):
    skip_unless_runs("sm_90a")
    assert load(256, mask, arch="sm_90a", gqa=True).plan.wgmma.split is not None
    gqa.run_case(256, *shape, mask, *ratio, arch="sm_90a", b=1)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_split_deterministic_gives_the_same_bits(mask, grouped):
    torch = pytest.importorskip("torch")
    skip_unless_runs("sm_90a")
    heads, kv_heads = (4, 2) if grouped else (2, 2)
    runs = gqa.run_case(256, 1000, 1000, mask, heads, kv_heads, arch="sm_90a",
                        deterministic=True, b=1, repeat=2, gqa=grouped)
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("s, t", [(17, 1000), (1000, 1000)],
                         ids=["S17-T1000", "S1000-T1000"])
@pytest.mark.parametrize("case", __import__("tests.attention_mods_cases",
                                            fromlist=["CASES"]).CASES,
                         ids=lambda c: c.name)
def test_kgen_attention_s_mods_at_d256(case, s, t, monkeypatch):
    """kgen.attention's autograd at D 256 (the device's target: sm_90a on a Hopper GPU)."""
    from tests.gpu.test_attention_grad_mods_gpu import _check

    skip_unless_runs("sm_90a")
    _check(case, s, t, "device", monkeypatch, 256)


D192_SHAPES = [(1, 1), (17, 17), (17, 1000), (1000, 17), (1000, 4097), (4097, 1000)]


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", D192_SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_d192_pieces_match_float64_autograd(mask, shape):
    """D 192: the split layout, dV, dK and dQ in pieces of 32 columns (B read from 0 or 64 bytes
    into a box's rows)."""
    skip_unless_runs("sm_90a")
    w = load(192, mask, arch="sm_90a").plan.wgmma
    assert w.split is not None and w.pieces
    run_case(192, *shape, mask, arch="sm_90a", b=1 if max(shape) > 1000 else 2, h=2)


def test_d192_f16_and_other_batches_and_heads():
    skip_unless_runs("sm_90a")
    run_case(192, 1000, 333, "bottom_right", dtype="f16", arch="sm_90a", b=1, h=1)
    run_case(192, 333, 1000, "top_left", arch="sm_90a", b=3, h=5)


@pytest.mark.parametrize("mask", ["none", "top_left"])
def test_d192_gqa(mask):
    skip_unless_runs("sm_90a")
    gqa.run_case(192, 1000, 4097, mask, 4, 2, arch="sm_90a", b=1)
    gqa.run_case(192, 17, 1000, mask, 4, 1, arch="sm_90a", b=1)


@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
def test_d192_deterministic_gives_the_same_bits(grouped):
    torch = pytest.importorskip("torch")
    skip_unless_runs("sm_90a")
    heads, kv_heads = (4, 2) if grouped else (2, 2)
    runs = gqa.run_case(192, 1000, 1000, "top_left", heads, kv_heads, arch="sm_90a",
                        deterministic=True, b=1, repeat=2, gqa=grouped)
    for first, second in zip(*runs):
        assert torch.equal(first, second)
