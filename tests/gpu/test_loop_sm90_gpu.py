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
    (256, None, None, {}, 1000, 4097, True),  # head dim 256: 128x80, O [64, 256] per consumer
    (256, None, None, {}, 257, 1000, False),
    (256, (128, 64), 2, {}, 1000, 1000, True),  # a block of 64 (the rulebook's is 80)
    (192, None, None, {}, 1000, 4097, False),  # head dim 192: 128x80 too
    # FlashAttention-3's shapes: blocks that are not a power of two, three consumer warpgroups
    (64, (192, 112), 2, {}, 1000, 4097, False),  # three consumers, 7 k16 steps of P
    (64, (192, 112), 2, {}, 385, 1000, True),
    (64, (128, 192), 2, {}, 1000, 4097, True),
    (128, (128, 160), 2, {}, 1000, 4097, True),
    (128, (128, 160), 2, {}, 257, 1000, False),
    (128, (128, 144), 2, {}, 17, 200, False),  # one block, partly past the loop's end
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


def test_three_consumer_warpgroups_take_turns_in_a_cycle():
    """192 rows written: three consumers, cyclic ping-pong."""
    torch = _needs()
    built = build_verified(lk.attention(64, causal=True, gqa=True, arch=SM90A, tile=(192, 64),
                                        stages=2), SM90A)
    assert built.plan.wgmma.consumers == 3 and built.plan.wgmma.pingpong
    assert built.plan.wgmma.consumer_registers == 160
    run = load_built(built)
    for s, t in ((1000, 4097), (17, 200), (385, 385)):
        q, k, v = _inputs(torch, 2, 4, 2, s, t, 64, seed=s)
        _check(run, q, k, v, 64, True)


# ---------------------------------------------------------------------------------------------
# Masks whose dead blocks are skipped (plan.bounds): the producer loads and the consumers take
# only the blocks [first, end) of each tile of rows (tiles launched longest first), the middle
# blocks inside the mask with its predicates folded to 1; rows (and whole tiles) that keep no
# column end with O = 0 and lse = -inf exactly

from tests.targets.test_loop_sm90 import (BOTTOM_RIGHT, CAUSAL, TOP_WINDOW, WINDOW,  # noqa: E402
                                          masked)

_KEEPS = {  # the masks in float64, as the .kg programs write them (w: the scalar)
    CAUSAL: lambda row, col, s, t, w: col <= row,
    BOTTOM_RIGHT: lambda row, col, s, t, w: col <= row + t - s,
    WINDOW: lambda row, col, s, t, w: (col <= row + t - s) & (col > row + t - s - w),
    TOP_WINDOW: lambda row, col, s, t, w: (col <= row) & (col > row - w),
}


def masked_reference(q, k, v, scale, mask, w):
    """O and lse in float64 under `mask` (a key of _KEEPS), as the program's body reads."""
    torch = pytest.importorskip("torch")
    group = q.shape[1] // k.shape[1]
    k = k.double().repeat_interleave(group, dim=1)
    v = v.double().repeat_interleave(group, dim=1)
    x = scale * (q.double() @ k.transpose(-1, -2))
    s, t = x.shape[-2:]
    row = torch.arange(s, device=x.device, dtype=torch.float64)[:, None]
    col = torch.arange(t, device=x.device, dtype=torch.float64)[None, :]
    keep = _KEEPS[mask](row, col, s, t, w)
    x = torch.where(keep, x, -math.inf)
    m = x.amax(-1)
    m_use = torch.where(m == -math.inf, 0.0, m)
    p = torch.exp(x - m_use[..., None])
    l_sum = p.sum(-1)
    o = torch.where(l_sum[..., None] == 0, 0.0, (p @ v) / l_sum[..., None])
    lse = torch.where(l_sum == 0, -math.inf, m + torch.log(l_sum))
    return o, lse, keep.any(-1)


# (head dim, tile, stages, schedule values, mask, w, S, T)
MASKED_CASES = [
    (128, None, None, {}, CAUSAL, 0, 4097, 4097),
    (128, None, None, {}, CAUSAL, 0, 1, 1),
    (128, None, None, {}, CAUSAL, 0, 17, 1000),
    (64, (64, 128), 2, {}, CAUSAL, 0, 1000, 1000),  # one consumer warpgroup
    (128, (128, 64), 3, {}, CAUSAL, 0, 1000, 4097),  # the diagonal over two blocks: edge runs
    (128, None, None, {}, BOTTOM_RIGHT, 0, 1000, 4097),
    (128, None, None, {}, BOTTOM_RIGHT, 0, 4097, 1000),  # S > T: the first 24 tiles are empty
    (128, None, None, {}, BOTTOM_RIGHT, 0, 1000, 17),
    (64, None, None, {}, BOTTOM_RIGHT, 0, 17, 1),
    (128, None, None, {}, BOTTOM_RIGHT, 0, 1, 4097),
    (128, None, None, {"issue_ahead": False, "pingpong": False}, BOTTOM_RIGHT, 0, 4097, 1000),
    (128, None, None, {}, WINDOW, 256, 4097, 4097),  # the ring starts past block 0
    (128, None, None, {}, WINDOW, 100, 1000, 4097),  # misaligned: edges on both sides
    (128, (128, 64), 3, {}, WINDOW, 300, 4097, 1000),
    (64, (64, 128), 1, {}, WINDOW, 1000, 1000, 1000),
    (64, None, None, {"issue_ahead": False, "pingpong": False}, WINDOW, 129, 1000, 4097),
    (128, None, None, {}, TOP_WINDOW, 1, 1000, 1000),  # the diagonal only: no block inside
    (128, None, None, {}, TOP_WINDOW, 300, 4097, 4097),
    (128, None, None, {}, TOP_WINDOW, 500, 1000, 17),  # rows past T + w keep nothing
    (64, (192, 112), 2, {}, CAUSAL, 0, 1000, 1000),  # the diagonal across blocks of 112
    (128, (128, 160), 2, {}, WINDOW, 300, 4097, 1000),
]


def _masked_id(case):
    d, tile, stages, schedule, mask, w, s, t = case
    name = {CAUSAL: "causal", BOTTOM_RIGHT: "bottom_right", WINDOW: "window",
            TOP_WINDOW: "top_window"}[mask]
    return (f"d{d}-{name}" + (f"{w}" if w else "") + (f"-{tile[0]}x{tile[1]}" if tile else "")
            + (f"-s{stages}" if stages else "")
            + "".join(f"-{k}={v}" for k, v in schedule.items()) + f"-S{s}-T{t}")


@pytest.mark.parametrize("case", MASKED_CASES, ids=_masked_id)
def test_masked_blocks_skipped_match_float64(case):
    torch = _needs()
    d, tile, stages, schedule, mask, w, s, t = case
    run = _load(masked(mask, d=d, tile=tile, stages=stages), **schedule)
    b, h, hkv = (2, 4, 2) if s * t <= 4_000_000 else (1, 4, 2)  # GQA: two query heads per KV
    q, k, v = _inputs(torch, b, h, hkv, s, t, d, seed=s + 3 * t + w)
    o = torch.full((b, h, s, d), math.nan, device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), math.nan, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    run(Q=q, K=k, V=v, O=o, lse=lse, scale=scale, w=float(w))
    torch.cuda.synchronize()
    ref_o, ref_lse, kept = masked_reference(q, k, v, scale, mask, w)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")
    empty = ~kept  # rows that keep no column: exactly as the reference says
    if empty.any():
        assert torch.equal(o[:, :, empty].float(), torch.zeros_like(o[:, :, empty].float()))
        assert torch.isneginf(lse[:, :, empty]).all()
    if mask in (BOTTOM_RIGHT, WINDOW) and s > t:
        assert empty[: s - t].all()  # whole tiles of rows visit no block


def test_three_consumers_skip_blocks_of_a_window():
    """192 rows written, three consumers in a cycle, the same visits for each (named
    barriers)."""
    torch = _needs()
    run = _load(masked(WINDOW, d=64, tile=(192, 64), stages=2))
    for s, t, w in ((1000, 4097, 200), (4097, 1000, 333), (17, 17, 5)):
        q, k, v = _inputs(torch, 2, 4, 2, s, t, 64, seed=s + w)
        o = torch.full((2, 4, s, 64), math.nan, device="cuda", dtype=torch.bfloat16)
        lse = torch.full((2, 4, s), math.nan, device="cuda", dtype=torch.float32)
        run(Q=q, K=k, V=v, O=o, lse=lse, scale=0.125, w=float(w))
        torch.cuda.synchronize()
        ref_o, ref_lse, _ = masked_reference(q, k, v, 0.125, WINDOW, w)
        _close(o, ref_o, 2e-2, "O")
        _close(lse, ref_lse, 1e-4, "lse")


# ---------------------------------------------------------------------------------------------
# The persistent scheduler (plan.wgmma.scheduler, a plan option): min(tiles, resident CTAs)
# CTAs each walk the tiles (row tile outermost, longest first under a causal mask), the K/V
# rings' count and Q's phase running across a CTA's tiles; `ctas` caps the grid below the
# device's resident CTAs (None: the device's), so a CTA walks many tiles, the rings wrapping at
# every alignment; tiles that visit no block still store O = 0 and lse = -inf

def _persistent(kernel, ctas):
    from kgen.targets.sm90.loop_schedule import with_scheduler

    built = build_verified(kernel, SM90A)
    assert built.plan.wgmma is not None, built.plan.mma.why
    persistent = with_scheduler(built.plan, True).wgmma  # O from registers with it
    run = _load(kernel, scheduler=persistent.scheduler, maps=persistent.maps,
                pipeline=persistent.pipeline)
    assert run.plan.wgmma.persistent and run.persistent_ctas >= 1
    if ctas is not None:
        run.persistent_ctas = ctas
    return run


# (head dim, tile, mask, w, B, H, HKV, S, T, CTAs)
PERSISTENT_CASES = [
    (128, None, CAUSAL, 0, 2, 4, 2, 4097, 4097, None),  # 264 tiles: more than the CTAs
    (128, None, CAUSAL, 0, 2, 4, 2, 1000, 1000, 7),  # 64 tiles over 7 CTAs
    (64, None, CAUSAL, 0, 2, 4, 2, 1000, 4097, 5),
    (64, (64, 128), CAUSAL, 0, 2, 4, 2, 1000, 1000, 3),  # one consumer warpgroup
    (128, (128, 64), CAUSAL, 0, 1, 4, 1, 1000, 4097, 4),  # three slots, GQA 4:1
    (128, None, CAUSAL, 0, 2, 4, 2, 1, 1, None),  # 8 tiles: fewer than the CTAs
    (128, None, CAUSAL, 0, 2, 4, 2, 17, 17, 3),
    (128, None, None, 0, 2, 4, 2, 1000, 1000, 7),  # no mask: every tile visits every block
    (64, None, None, 0, 2, 4, 2, 17, 4097, 3),
    (128, None, None, 0, 2, 4, 2, 4097, 1, 11),
    (128, None, BOTTOM_RIGHT, 0, 2, 4, 2, 4097, 1000, 5),  # the first 24 row tiles empty
    (128, None, WINDOW, 256, 1, 4, 2, 4097, 4097, 6),
    (128, None, WINDOW, 100, 2, 4, 2, 1000, 4097, None),
    (64, None, WINDOW, 129, 2, 4, 2, 4097, 1000, 9),  # empty tiles between full ones
    (128, None, TOP_WINDOW, 500, 2, 4, 2, 1000, 17, 2),  # rows past T + w keep nothing
    (256, None, CAUSAL, 0, 2, 4, 2, 1000, 1000, 7),  # head dim 256
    (256, None, WINDOW, 129, 1, 4, 1, 4097, 1000, None),
    (256, None, CAUSAL, 0, 2, 4, 2, 1000, 4097, 5),
    (128, None, CAUSAL, 0, 3, 5, 5, 300, 300, 4),  # groups of pairs: the last one short
]


def _persistent_id(case):
    d, tile, mask, w, b, h, hkv, s, t, ctas = case
    name = {None: "full", CAUSAL: "causal", BOTTOM_RIGHT: "bottom_right", WINDOW: "window",
            TOP_WINDOW: "top_window"}[mask]
    return (f"d{d}-{name}" + (f"{w}" if w else "") + (f"-{tile[0]}x{tile[1]}" if tile else "")
            + f"-B{b}H{h}KV{hkv}-S{s}-T{t}-ctas{ctas or 'device'}")


@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=_persistent_id)
def test_persistent_scheduler_matches_float64(case):
    torch = _needs()
    d, tile, mask, w, b, h, hkv, s, t, ctas = case
    stages = 3 if tile == (128, 64) else 2  # the case's three slots
    kernel = (lk.attention(d, gqa=True, arch=SM90A, tile=tile, stages=stages if tile else None)
              if mask is None else masked(mask, d=d, tile=tile, stages=stages))
    run = _persistent(kernel, ctas)
    q, k, v = _inputs(torch, b, h, hkv, s, t, d, seed=7 * s + t + w)
    o = torch.full((b, h, s, d), math.nan, device="cuda", dtype=torch.bfloat16)
    lse = torch.full((b, h, s), math.nan, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    args = dict(Q=q, K=k, V=v, O=o, lse=lse, scale=scale)
    if mask is not None:  # the masked programs take the scalar w (read by the windows only)
        args["w"] = float(w)
    tiles = -(-s // run.plan.tile_m) * h * b
    assert run.bind(**args).grid == (min(tiles, run.persistent_ctas), 1, 1)
    run(**args)
    torch.cuda.synchronize()
    if mask is None:
        ref_o, ref_lse = attention_reference(q, k, v, scale, causal=False)
        kept = None
    else:
        ref_o, ref_lse, kept = masked_reference(q, k, v, scale, mask, w)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")
    if kept is not None and (~kept).any():  # rows (and whole tiles) that keep no column
        empty = ~kept
        assert torch.equal(o[:, :, empty].float(), torch.zeros_like(o[:, :, empty].float()))
        assert torch.isneginf(lse[:, :, empty]).all()
    # a second launch on the same CTAs: the mbarriers start afresh, the outputs are the same
    o2, lse2 = torch.full_like(o, math.nan), torch.full_like(lse, math.nan)
    run(**dict(args, O=o2, lse=lse2))
    torch.cuda.synchronize()
    assert torch.equal(o2, o) and torch.equal(lse2, lse)


def test_persistent_three_consumers_take_turns_across_tiles(monkeypatch):
    """192 rows, three consumers in a cycle; a CTA walks many tiles of a window (empty ones
    among them): the named barriers' turns stay in step from one tile to the next."""
    from kgen.lower import program as lowering
    from kgen.targets import loop_rules

    torch = _needs()
    monkeypatch.setattr(lowering.loop_rules, "wgmma_default", lambda *args, **kwargs: (
        loop_rules.LoopConfig(192, 64, 2), "the test's"))
    run = _persistent(masked(WINDOW, d=64), 5)
    assert run.plan.wgmma.consumers == 3
    for s, t, w in ((1000, 4097, 200), (4097, 1000, 333), (17, 17, 5)):
        q, k, v = _inputs(torch, 2, 4, 2, s, t, 64, seed=s + w)
        o = torch.full((2, 4, s, 64), math.nan, device="cuda", dtype=torch.bfloat16)
        lse = torch.full((2, 4, s), math.nan, device="cuda", dtype=torch.float32)
        run(Q=q, K=k, V=v, O=o, lse=lse, scale=0.125, w=float(w))
        torch.cuda.synchronize()
        ref_o, ref_lse, _ = masked_reference(q, k, v, 0.125, WINDOW, w)
        _close(o, ref_o, 2e-2, "O")
        _close(lse, ref_lse, 1e-4, "lse")


# O through the copy engine (loop_schedule.with_o_store, a plan option): staged in Q's buffer,
# stored as [64][64] boxes of O's own map; (head dim, causal, B, H, KV heads, S, T, layout). O is
# a view of rows S of a buffer of S + 64 rows (or [B, S, H, D] memory): the rows past S stay
# as they were (the copy engine clips the boxes at the map's rows)
O_STORE_CASES = [
    (128, True, 2, 8, 2, 1000, 4097, "bhsd"),
    (64, False, 1, 4, 4, 17, 300, "bhsd"),
    (256, True, 2, 4, 1, 300, 1000, "bshd"),
    (128, False, 2, 4, 2, 129, 129, "bshd"),
]


@pytest.mark.parametrize("tma", [True, False], ids=["copy_engine", "registers"])
@pytest.mark.parametrize("case", O_STORE_CASES, ids=lambda c: "-".join(map(str, c)))
def test_o_by_the_copy_engine_matches_float64(case, tma):
    """The rulebook's O by the copy engine, and the plan option from registers."""
    from kgen.targets.sm90.loop_schedule import with_o_store

    torch = _needs()
    d, causal, b, h, hkv, s, t, layout = case
    kernel = lk.attention(d, causal=causal, gqa=True, arch=SM90A)
    wgmma = with_o_store(build_verified(kernel, SM90A).plan, tma).wgmma
    run = _load(kernel, maps=wgmma.maps, pipeline=wgmma.pipeline)
    assert ("tma_store_box_4d(maps.O" in run.source) == tma
    q, k, v = _inputs(torch, b, h, hkv, s, t, d, seed=s + t + d, layout=layout)
    if layout == "bshd":
        o = torch.full((b, s, h, d), math.nan, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        outside = None
    else:
        buffer = torch.full((b, h, s + 64, d), math.nan, device="cuda", dtype=torch.bfloat16)
        o, outside = buffer[:, :, :s], buffer[:, :, s:]
    lse = torch.full((b, h, s), math.nan, device="cuda", dtype=torch.float32)
    scale = 1.0 / math.sqrt(d)
    run(Q=q, K=k, V=v, O=o, lse=lse, scale=scale)
    torch.cuda.synchronize()
    ref_o, ref_lse = attention_reference(q, k, v, scale, causal=causal)
    _close(o, ref_o, 2e-2, "O")
    _close(lse, ref_lse, 1e-4, "lse")
    if outside is not None:
        assert torch.isnan(outside.float()).all()
