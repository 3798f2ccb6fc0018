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
(DeepSeek's) in tests/gpu/test_attention_grad_value_dim_gpu.py. dQ added by the copy engine (the
plan options of dag_wgmma_rules.DAG_WGMMA_SPLIT_ADDS: "slots" at D 256, "warp" at D 192, and
the rulebook flipped for kgen.attention's mods and the D_v pairs), each against float64 autograd
with its outputs poisoned, deterministic mode bit-identical."""
from __future__ import annotations

import pytest

from tests.gpu import test_attention_bwd_gqa_gpu as gqa
from tests.gpu.attention_bwd_checks import MASKS, load
from tests.gpu.attention_checks import skip_unless_runs
from tests.gpu.test_attention_bwd_gpu import run_case
from tests.gpu.test_attention_varlen_bwd_gpu import poisoned  # noqa: F401 (the fixture)

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


# dQ by the copy engine (the plan options of dag_wgmma_rules.DAG_WGMMA_SPLIT_ADDS; the rulebook
# keeps the atomics until they are timed): "slots" at D 256 (each warpgroup's f32 share staged in
# its own boxes of the block's Q and dO ring slots, added by the add warp's tensor reduce-adds,
# which then release the slots), "warp" at D 192 (a staging of its own after the tiles).


def _mode(d, mask, adds, **options):
    from kgen.targets.sm90.loop_dag_schedule import add_mode

    w = load(d, mask, arch="sm_90a", adds=adds, **options).plan.wgmma
    assert w.split is not None and add_mode(w) == adds
    return w


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_split_slots_match_float64_autograd(mask, shape):
    skip_unless_runs("sm_90a")
    assert _mode(256, mask, "slots").add_slots
    run_case(256, *shape, mask, arch="sm_90a", b=1 if max(shape) > 1000 else 2, h=2,
             adds="slots")


@pytest.mark.parametrize("mask", ["none", "top_left"])
@pytest.mark.parametrize("schedule", [(("defer_all", True), ("issue_ahead", True)),
                                      (("defer_accumulating", False),),
                                      (("fast_body", False), ("stage_vectors", False))],
                         ids=["defer_all", "no_defer", "one_body"])
def test_split_slots_under_the_other_schedules(mask, schedule):
    """Every accumulating gemm issued after dQ's (dV's reads of dO in flight: the warpgroup
    waits before its first box), none deferred, one body with the vectors loaded."""
    skip_unless_runs("sm_90a")
    run_case(256, 1000, 4097, mask, arch="sm_90a", b=1, h=2, adds="slots", schedule=schedule)
    run_case(256, 4097, 1000, mask, arch="sm_90a", b=1, h=1, adds="slots", schedule=schedule)


def test_split_slots_f16_and_other_batches_and_heads():
    skip_unless_runs("sm_90a")
    run_case(256, 1000, 4097, "bottom_right", dtype="f16", arch="sm_90a", b=1, h=1,
             adds="slots")
    run_case(256, 333, 1000, "top_left", arch="sm_90a", b=3, h=5, adds="slots")


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("ratio", [(4, 2), (4, 1)], ids=lambda r: f"h{r[0]}-hkv{r[1]}")
def test_split_slots_gqa(mask, ratio):
    skip_unless_runs("sm_90a")
    assert _mode(256, mask, "slots", gqa=True).vector_offset is None
    gqa.run_case(256, 1000, 4097, mask, *ratio, arch="sm_90a", b=1, adds="slots")
    gqa.run_case(256, 17, 1000, mask, *ratio, arch="sm_90a", b=1, adds="slots")


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("grouped", [False, True], ids=["mha", "gqa"])
@pytest.mark.parametrize("d, adds", [(256, "slots"), (192, "warp")], ids=["d256", "d192"])
def test_split_copy_engine_deterministic_gives_the_same_bits(mask, grouped, d, adds):
    torch = pytest.importorskip("torch")
    skip_unless_runs("sm_90a")
    _mode(d, mask, adds, gqa=grouped, deterministic=True)
    heads, kv_heads = (4, 2) if grouped else (2, 2)
    runs = gqa.run_case(d, 1000, 1000, mask, heads, kv_heads, arch="sm_90a",
                        deterministic=True, b=1, repeat=2, gqa=grouped, adds=adds)
    for first, second in zip(*runs):
        assert torch.equal(first, second)


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("shape", D192_SHAPES, ids=lambda st: f"s{st[0]}-t{st[1]}")
def test_d192_warp_matches_float64_autograd(mask, shape):
    skip_unless_runs("sm_90a")
    assert _mode(192, mask, "warp").add_offset is not None
    run_case(192, *shape, mask, arch="sm_90a", b=1 if max(shape) > 1000 else 2, h=2,
             adds="warp")


def test_d192_warp_gqa():
    skip_unless_runs("sm_90a")
    gqa.run_case(192, 1000, 4097, "top_left", 4, 2, arch="sm_90a", b=1, adds="warp")
    gqa.run_case(192, 17, 1000, "none", 4, 1, arch="sm_90a", b=1, adds="warp")


@pytest.fixture
def copy_engine(monkeypatch):
    """The rulebook flipped to the copy engine's adds (DAG_WGMMA_SPLIT_ADDS), kgen.attention's
    backward ops built again."""
    from kgen import attention_grad
    from kgen.targets import dag_wgmma_rules

    monkeypatch.setattr(dag_wgmma_rules, "DAG_WGMMA_SPLIT_ADDS", "copy engine")
    monkeypatch.setattr(attention_grad, "_LOADED", {})


@pytest.mark.parametrize("case", __import__("tests.attention_mods_cases",
                                            fromlist=["CASES"]).CASES,
                         ids=lambda c: c.name)
def test_kgen_attention_s_mods_at_d256_with_slots(case, copy_engine, monkeypatch):
    """kgen.attention's autograd at D 256 with the rulebook flipped: its backward adds dQ from
    the streamed slots (the mods' terms, the bias and its gradient, dropout, GQA's cases)."""
    from tests.gpu.test_attention_grad_mods_gpu import _check

    skip_unless_runs("sm_90a")
    _check(case, 1000, 1000, "device", monkeypatch, 256)


@pytest.mark.parametrize("d, d_v", [(128, 256), (192, 128), (256, 128)])
@pytest.mark.parametrize("causal", [False, True])
def test_value_dims_with_the_copy_engine(d, d_v, causal, copy_engine, poisoned, monkeypatch):
    """The D_v pairs with the rulebook flipped: 128 / 256 and 192 / 128 add dQ by the add warp
    from a staging of their own, 256 / 128 keeps the atomics (neither fits)."""
    from tests.gpu.test_attention_grad_value_dim_gpu import _check

    skip_unless_runs("sm_90a")
    for s, t in ((17, 1000), (1000, 1000)):
        _check(poisoned, monkeypatch, "device", d, d_v, s, t, causal)
