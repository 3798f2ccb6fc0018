"""On an H100/H200: the sm_90a loop skeleton (warp-specialized wgmma, templates/sm90/loop.cu.j2)
against float64 references, in what tests/gpu/test_loop_gpu.py does not vary: its schedule
values (one consumer warpgroup, 1 and 3 ring slots, blocks of 64, the in-order body without
overlap or ping-pong), loop lengths that exercise each peeled copy of the body (0, 1, 2 and
more blocks), the copy engine's rank-4 maps over strided views ([B, S, H, D] memory) and a
head stride of 0 (one K and V for every head)."""
from __future__ import annotations

import dataclasses
import math

import pytest

from kgen import ir
from kgen.api import build_verified, load_built

from tests import loop_kernels as lk
from tests.gpu.test_loop_gpu import _close, attention_reference

pytestmark = pytest.mark.gpu

SM90A = ir.Arch.SM90A


def _needs():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")
    return torch


def _load(kernel, **schedule):
    """The kernel on the wgmma skeleton, its schedule values replaced by `schedule`."""
    built = build_verified(kernel, SM90A)
    assert built.plan.wgmma is not None, built.plan.mma.why
    if schedule:
        from kgen.targets.sm90.loop import emit_loop

        plan = dataclasses.replace(built.plan,
                                   wgmma=dataclasses.replace(built.plan.wgmma, **schedule))
        source = emit_loop(plan, source_name="test", source_hash="0", command="test")
        built = dataclasses.replace(built, plan=plan, source=source)
    return load_built(built)


def _inputs(torch, b, h, hkv, s, t, d, seed, layout="bhsd"):
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def make(heads, rows):
        if layout == "bshd":  # [B, S, H, D] memory, seen as [B, H, S, D]
            return torch.randn(b, rows, heads, d, device="cuda", generator=gen).bfloat16() \
                .transpose(1, 2)
        return torch.randn(b, heads, rows, d, device="cuda", generator=gen).bfloat16()
    return make(h, s), make(hkv, t), make(hkv, t)


def _check(run, q, k, v, d, causal):
    torch = _needs()
    b, h, s, _ = q.shape
    o = torch.full((b, h, s, d), math.nan, device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), math.nan, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    run(Q=q, K=k, V=v, O=o, lse=lse, scale=scale)
    torch.cuda.synchronize()
    if k.shape[2] == 0:  # no key: l = 0 in every row, so O = 0 and lse = -inf as written
        assert torch.equal(o.float(), torch.zeros_like(o.float()))
        assert torch.isneginf(lse).all()
        return
    ref_o, ref_lse = attention_reference(q, k, v, scale, causal=causal)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")


# (head dim, tile, stages, schedule values, S, T, causal)
CASES = [
    (64, (64, 128), 2, {}, 300, 1000, True),  # one consumer warpgroup: no ping-pong
    (128, (128, 64), 3, {}, 1000, 4097, False),
    (128, (128, 128), 1, {}, 257, 1000, True),
    (64, None, None, {"issue_ahead": False, "pingpong": False}, 1000, 1000, True),
    (128, None, None, {"pingpong": False}, 1000, 200, False),
    (128, None, None, {}, 130, 200, True),  # two blocks: the first and the last, no middle
    (64, None, None, {}, 17, 128, False),  # one whole block
    (128, None, None, {}, 64, 0, False),  # no block: O = 0, lse = -inf
]


def _id(case):
    d, tile, stages, schedule, s, t, causal = case
    return (f"d{d}-{tile[0]}x{tile[1]}" if tile else f"d{d}") + (f"-s{stages}" if stages else "") \
        + "".join(f"-{k}={v}" for k, v in schedule.items()) + f"-S{s}-T{t}" \
        + ("-causal" if causal else "")


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_schedules_and_lengths_match_float64(case):
    torch = _needs()
    d, tile, stages, schedule, s, t, causal = case
    run = _load(lk.attention(d, causal=causal, gqa=True, arch=SM90A, tile=tile,
                             stages=stages), **schedule)
    q, k, v = _inputs(torch, 2, 4, 2, s, t, d, seed=s + t)
    _check(run, q, k, v, d, causal)


def test_strided_views_through_the_rank4_maps():
    """[B, S, H, D] memory seen as [B, H, S, D]: rows H * D apart, heads D apart."""
    torch = _needs()
    run = _load(lk.attention(128, causal=True, gqa=True, arch=SM90A))
    q, k, v = _inputs(torch, 2, 8, 2, 1000, 777, 128, seed=5, layout="bshd")
    assert q.stride(2) == 8 * 128 and q.stride(1) == 128
    _check(run, q, k, v, 128, True)


def test_a_head_stride_of_zero_reads_one_kv_head_for_every_head():
    torch = _needs()
    run = _load(lk.attention(64, arch=SM90A))
    q, k, v = _inputs(torch, 2, 4, 1, 300, 500, 64, seed=9)
    k, v = k.expand(2, 4, 500, 64), v.expand(2, 4, 500, 64)
    assert k.stride(1) == 0
    _check(run, q, k, v, 64, False)


def test_three_consumer_warpgroups_take_turns_in_a_cycle(monkeypatch):
    """192 rows (the rulebook's only, never written): three consumers, cyclic ping-pong."""
    from kgen.lower import program as lowering
    from kgen.targets import loop_rules

    torch = _needs()
    monkeypatch.setattr(lowering.loop_rules, "wgmma_default", lambda *args, **kwargs: (
        loop_rules.LoopConfig(192, 64, 2), "the test's"))
    built = build_verified(lk.attention(64, causal=True, gqa=True, arch=SM90A), SM90A)
    assert built.plan.wgmma.consumers == 3 and built.plan.wgmma.pingpong
    assert built.plan.wgmma.consumer_registers == 160
    run = load_built(built)
    for s, t in ((1000, 4097), (17, 200), (385, 385)):
        q, k, v = _inputs(torch, 2, 4, 2, s, t, 64, seed=s)
        _check(run, q, k, v, 64, True)
