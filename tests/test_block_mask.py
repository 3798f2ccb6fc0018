"""A block mask on the forward's loop (`blocks [MxN] by COUNTS, INDICES[, full FULL_COUNTS,
FULL_INDICES]`; docs/language.md, "Masked blocks skipped"): parsing, the located refusals, the
plan (kgen/lower/loop_bounds.py `listed`, the lists as parameters), both skeletons' walks
compiled by NVRTC with 0 spills, the reference against a brute-force FlexAttention meaning, and
the run-time checks of the lists (kgen/runtime/blocks.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from kgen.api import build_verified
from kgen.enums import DType
from kgen.errors import ArgumentError, KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.reference import evaluate
from kgen.runtime.program import bind_program
from kgen.runtime.tensors import DeviceArray, contiguous_strides
from kgen.verify import verify_kernel

# A boolean tensor mask (any predicate: not an index expression) whose blocks the lists skip
TEXT = """\
kernel attention_fwd_blocks {
  target sm_90a
  tensor Q : bf16[B, H, S, 128] row
  tensor K : bf16[B, HKV, T, 128] row
  tensor V : bf16[B, HKV, T, 128] row
  tensor O : bf16[B, H, S, 128] row out
  vector lse : f32[B, H, S] out
  vector allowed : f32[B, H, T]
  scalar scale : f32 = 0.08838834764

  loop kv over T {
    tile 128x64  warps 8  stages 2
    blocks 128x64 by kv_num_blocks, kv_indices, full full_kv_num_blocks, full_kv_indices
    carry m : f32[row] = -inf
    carry l : f32[row] = 0
    gemm s = Q @ K^T accumulate f32 {
      epilogue {
        x = where((allowed[col] != 0) * (col > row - 300), scale * acc, -inf)
        m_new = max(m, rowmax(x))
        m_use = where(m_new == -inf, 0, m_new)
        s = exp(x - m_use)
        r = exp(m - m_use)
        l = l * r + rowsum(s)
        o = o * r
        m = m_new
      }
    }
    gemm o += s @ V accumulate f32
  }
  epilogue {
    O = where(l == 0, 0, o / l)
    lse = where(l == 0, -inf, m + log(l))
  }
}
"""
LISTS = ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices")


def kernel_of(text: str = TEXT, file: str = "blocks.kg"):
    kernel = parse(text, file).kernels[0]
    verify_kernel(kernel)
    return kernel


def _error(text: str) -> KgenError:
    with pytest.raises(KgenError) as err:
        build_verified(kernel_of(text), "sm_90a")
    return err.value


def _line(text: str, needle: str) -> int:
    return next(i + 1 for i, line in enumerate(text.splitlines()) if needle in line)


# ---------------------------------------------------------------------------------------------
# Parsing and verification


def test_the_line_parses_with_and_without_sizes():
    blocks = kernel_of().loop.blocks
    assert (blocks.m, blocks.n) == (128, 64)
    assert blocks.names == LISTS
    text = TEXT.replace("    tile 128x64  warps 8  stages 2\n", "").replace(
        "blocks 128x64 by", "blocks by").replace(", full full_kv_num_blocks, full_kv_indices",
                                                 "")
    blocks = kernel_of(text).loop.blocks
    assert (blocks.m, blocks.n, blocks.full_counts) == (None, None, None)
    assert blocks.names == LISTS[:2]


@pytest.mark.parametrize("change, needle, message", [
    (("blocks 128x64 by", "blocks 128x128 by"), "blocks 128x128",
     "the block mask's blocks are 128x128 but loop 'kv' has tile 128x64"),
    (("blocks 128x64 by", "blocks 96x64 by"), "blocks 96x64", "blocks are tiles of rows: M"),
    (("blocks 128x64 by", "blocks 128x48 by"), "blocks 128x48", "N must be a loop's tile N"),
    (("full_kv_indices\n", "kv_indices\n"), "blocks 128x64",
     "duplicate name 'kv_indices'"),
    (("by kv_num_blocks,", "by allowed,"), "blocks 128x64", "duplicate name 'allowed'"),
    (("  scalar scale", "  packed S by cu_seqlens_q\n  scalar scale"), "blocks 128x64",
     "a block mask and packed sequences together are not supported"),
    (("    tile 128x64  warps 8  stages 2\n", "    warps 4\n"), "warps 4",
     "warps 4 cover 64 rows (16 each) but the block mask's blocks have 128"),
])
def test_misuse_is_a_located_error(change, needle, message):
    text = TEXT.replace(*change)
    with pytest.raises(KgenError) as err:
        kernel_of(text)
    assert message in err.value.message
    assert err.value.loc.file == "blocks.kg" and err.value.loc.line == _line(text, needle)


def test_a_malformed_line_is_a_syntax_error():
    with pytest.raises(KgenError):
        kernel_of(TEXT.replace("by kv_num_blocks, kv_indices,", "by kv_num_blocks,"))


def test_the_backward_loop_takes_a_block_mask():
    """The DAG loop (the backward's) takes the line too (tests/lower/test_loop_dag_blocks.py
    tests it in detail)."""
    from pathlib import Path

    text = Path("examples/attention_bwd.kg").read_text().replace(
        "  loop q over S {\n", "  loop q over S {\n    blocks by q_num_blocks, q_indices\n")
    kernel = parse(text, "bwd.kg").kernels[0]
    verify_kernel(kernel)
    assert lower(kernel).bounds.listed.names == ("q_num_blocks", "q_indices")


def test_kgen_attention_with_grad_checks_the_block_size_against_the_backwards_tile(
        monkeypatch):
    """Before the forward runs: a BLOCK_SIZE whose key block the backward's tile (sm_90a: 128
    keys by 64 queries, as the rulebook plans it) does not divide is refused by name."""
    torch = pytest.importorskip("torch")
    from kgen import attention as ka
    from kgen.attention_blocks import from_dense
    from kgen.attention_grad import BackwardSignature, attention_with_grad, backward_tile

    monkeypatch.setattr(ka, "_arch", lambda device: "sm_90a")  # no GPU to ask
    assert backward_tile(BackwardSignature("bf16", 64, True, "sm_90a", blocks=True)) == (128, 64)
    q = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(1, 2, 256, 64, dtype=torch.bfloat16)
    mask = from_dense(torch.ones(1, 1, 256, 256, dtype=torch.bool), (128, 64))
    with pytest.raises(ArgumentError, match=r"BLOCK_SIZE \(128, 64\) cannot be used by "
                       r"kgen.attention's backward: it runs in tiles of 128 keys by 64 queries"):
        attention_with_grad(q, k, k, is_causal=True, block_mask=mask, deterministic=False)


def test_kgen_attention_backward_checks_what_it_takes_beside_block_mask():
    torch = pytest.importorskip("torch")
    from kgen.attention_blocks import from_dense
    from kgen.attention_grad import check_block_mask

    q = torch.zeros(1, 2, 8, 64)
    mask = from_dense(torch.ones(1, 1, 8, 8, dtype=torch.bool), 128)
    check_block_mask(q, q, mask, False, False)
    check_block_mask(q, q[:, :1], mask, False, False)  # GQA: the lists per query head
    for k, deterministic, bias_grad, message in (
            (q[:, :1], True, False, "does not take block_mask in deterministic mode"),
            (q, True, False, "does not take block_mask in deterministic mode"),
            (q, False, True, "does not compute attn_mask's gradient with block_mask")):
        with pytest.raises(ArgumentError, match=message):
            check_block_mask(q, k, mask, deterministic, bias_grad)


# ---------------------------------------------------------------------------------------------
# The plan and the code


def test_the_plan_lists_the_blocks_and_takes_the_lists_as_parameters():
    plan = lower(kernel_of())
    listed = plan.bounds.listed
    assert listed is not None and listed.names == LISTS
    assert plan.bounds.bounds == () and plan.bounds.equalities == () and plan.bounds.skips
    assert len(listed.masks) == 1  # x = where(..., scale * acc, -inf)
    mask = plan.body.values[listed.masks[0]]
    assert mask.kind.op.name == "WHERE"
    assert "kv_num_blocks partial blocks per tile" in plan.bounds.why
    names = [p.name for p in plan.params]
    # the lists before the first scalar (a torch op's schema: tensors before defaults)
    assert names.index("full_kv_indices") < names.index("scale")
    assert [p.kind for p in plan.params if p.name in LISTS] == [
        "block_counts", "block_indices"] * 2
    fields = [f.name for f in plan.fields]
    for name in LISTS:
        assert {f"{name}_bs", f"{name}_hs"} <= set(fields)
    assert "kv_indices_ld" in fields and "kv_num_blocks_ld" not in fields
    assert plan.tile_m == 128 and plan.block == 64


def test_without_sizes_the_line_takes_the_rulebooks_tile():
    text = TEXT.replace("    tile 128x64  warps 8  stages 2\n", "").replace(
        "blocks 128x64 by", "blocks by")
    plan = lower(kernel_of(text))
    assert plan.bounds.listed is not None and plan.wgmma is not None
    assert (plan.tile_m, plan.block) == (128, 128)  # the sm_90a rulebook's first
    sized = lower(kernel_of(TEXT.replace("    tile 128x64  warps 8  stages 2\n", "")))
    assert (sized.tile_m, sized.block) == (128, 64)  # the line's sizes: the tile


def test_a_block_mask_without_full_lists_unmasks_nothing():
    text = TEXT.replace(", full full_kv_num_blocks, full_kv_indices", "")
    plan = lower(kernel_of(text))
    assert plan.bounds.listed.masks == () and plan.bounds.listed.full_counts is None
    source = build_verified(kernel_of(text), "sm_90a").source
    assert "const int list_full = 0;" in source
    assert "interior ?" not in source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_both_skeletons_walk_the_lists(arch):
    built = build_verified(kernel_of(TEXT.replace("target sm_90a", f"target {arch}")), arch)
    src = built.source
    assert (built.plan.wgmma is not None) == (arch == "sm_90a")
    assert "__device__ __forceinline__ int listed_block(" in src
    assert "const int visits = partial_visits + min(max(p.full_kv_num_blocks[" in src
    # partial blocks with the mask, full ones with the value kept; the last block of the loop
    # with bounds checks wherever the lists put it
    assert "constexpr bool interior = true;  // a full block" in src
    assert "constexpr bool interior = false;  // a partial block" in src
    assert "interior ? v" in src and "== blocks - 1" in src or "!= blocks - 1" in src
    assert 'return "p.kv_indices, a list of the block mask (int32), is null";' in src
    if arch == "sm_90a":  # the producer loads the blocks the consumers take
        producer = src.split("// The producer")[1].split("// A consumer warpgroup")[0]
        assert ("const int kv0 = listed_block(p.kv_indices, list_partial, p.full_kv_indices, "
                "list_full, partial_visits, visit, blocks) * kBlock;") in producer


def spill_free(built, arch):
    from kgen.runtime.nvrtc import compile_cubin

    resources = compile_cubin(built.source, built.plan.name, arch).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("full", [True, False], ids=["full", "partial"])
def test_nvrtc_compiles_both_skeletons_without_spills(arch, full):
    text = TEXT.replace("target sm_90a", f"target {arch}")
    if not full:
        text = text.replace(", full full_kv_num_blocks, full_kv_indices", "")
    spill_free(build_verified(kernel_of(text), arch), arch)


@pytest.mark.slow
def test_nvrtc_compiles_the_persistent_walk_without_spills():
    from kgen.targets.sm90.loop import emit_loop
    from kgen.targets.sm90.loop_schedule import with_scheduler

    built = build_verified(kernel_of(), "sm_90a")
    plan = with_scheduler(built.plan, True)
    source = emit_loop(plan, source_name="blocks.kg", source_hash="0" * 64, command="test")
    assert source.count("const int rows_tile = row0 / kTileM;") == 2  # producer, consumers

    class Built:
        pass

    one = Built()
    one.source, one.plan = source, plan
    spill_free(one, "sm_90a")


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("mask", ["causal", "mod", "none"])
def test_kgen_attention_programs_with_block_masks_compile_without_spills(arch, d, mask):
    from kgen import attention as ka

    sig = ka.Signature("bf16", d, d, mask == "causal", None,
                       "col > row - 100" if mask == "mod" else None, (), arch,
                       block_mask="full")
    spill_free(build_verified(ka.program(sig), arch), arch)


# ---------------------------------------------------------------------------------------------
# The reference: FlexAttention's meaning


def _lists(state: np.ndarray, value: int, rng=None):
    """Counts and indices of the blocks whose state is `value` (in a shuffled order when
    `rng`), the indices' unused entries garbage (never read)."""
    b, h, tiles, blocks = state.shape
    counts = np.zeros((b, h, tiles), np.int32)
    indices = np.full((b, h, tiles, blocks), 12345, np.int32)
    for i in np.ndindex(b, h, tiles):
        found = np.flatnonzero(state[i] == value)
        if rng is not None:
            found = rng.permutation(found)
        counts[i] = len(found)
        indices[i][:len(found)] = found
    return counts, indices


def _flex(q, k, v, keep, state, scale, m, n, window=300):
    """FlexAttention's attention in float64: an element counts where its block is full, or
    partial and the mask keeps it; O = 0 and lse = -inf on rows that keep nothing."""
    b, h, s, _ = q.shape
    t = k.shape[2]
    out = np.zeros((b, h, s, v.shape[-1]))
    lse = np.zeros((b, h, s))
    rows, cols = np.arange(s)[:, None], np.arange(t)[None, :]
    for i in np.ndindex(b, h):
        x = scale * (q[i].astype(np.float64) @ k[i].astype(np.float64).T)
        st = np.repeat(np.repeat(state[i], m, 0)[:s], n, 1)[:, :t]
        masked = (keep[i][None, :] != 0) & (cols > rows - window)
        x = np.where((st == 2) | ((st == 1) & masked), x, -np.inf)
        mx = x.max(1, keepdims=True)
        mu = np.where(np.isinf(mx), 0, mx)
        p = np.exp(x - mu)
        total = p.sum(1, keepdims=True)
        out[i] = np.where(total == 0, 0, (p @ v[i]) / np.where(total == 0, 1, total))
        with np.errstate(divide="ignore"):
            lse[i] = np.where(total[:, 0] == 0, -np.inf, mu[:, 0] + np.log(total[:, 0]))
    return out, lse


@pytest.mark.parametrize("s, t, seed", [(1, 17, 0), (200, 300, 1), (257, 129, 2)])
def test_the_reference_is_flexattentions_meaning(s, t, seed):
    rng = np.random.default_rng(seed)
    b, h, d, m, n = 2, 2, 128, 128, 64
    q, k, v = (rng.standard_normal(shape).astype(np.float32)
               for shape in ((b, h, s, d), (b, h, t, d), (b, h, t, d)))
    keep = (rng.random((b, h, t)) < 0.6).astype(np.float32)
    state = rng.integers(0, 3, (b, h, -(-s // m), -(-t // n)))  # 0 skip, 1 partial, 2 full
    counts, indices = _lists(state, 1, rng)
    full_counts, full_indices = _lists(state, 2, rng)
    out = evaluate(kernel_of(), dict(Q=q, K=k, V=v, allowed=keep, kv_num_blocks=counts,
                                     kv_indices=indices, full_kv_num_blocks=full_counts,
                                     full_kv_indices=full_indices), {}, block=64)
    ref_o, ref_lse = _flex(q, k, v, keep, state, np.float32(0.08838834764), m, n)
    assert np.array_equal(np.isinf(out["lse"]), np.isinf(ref_lse))
    finite = ~np.isinf(ref_lse)
    assert np.abs(out["lse"][finite] - ref_lse[finite]).max(initial=0) < 1e-4
    assert np.abs(out["O"].astype(np.float64) - ref_o).max() < 2e-2  # bf16 P and O


def test_the_reference_skips_an_omitted_block_with_kept_elements():
    """A block listed in neither list is not visited: its elements count for nothing, even
    where the mask keeps them (FlexAttention's meaning); a block listed twice counts twice."""
    rng = np.random.default_rng(5)
    b, h, s, t, d = 1, 1, 64, 192, 128
    q, k, v = (rng.standard_normal(shape).astype(np.float32)
               for shape in ((b, h, s, d), (b, h, t, d), (b, h, t, d)))
    keep = np.ones((b, h, t), np.float32)
    inputs = dict(Q=q, K=k, V=v, allowed=keep, full_kv_num_blocks=np.zeros((1, 1, 1), np.int32),
                  full_kv_indices=np.zeros((1, 1, 1, 3), np.int32))
    one = evaluate(kernel_of(), dict(inputs, kv_num_blocks=np.array([[[1]]], np.int32),
                                     kv_indices=np.array([[[[1, 0, 2]]]], np.int32)), {},
                   block=64)
    state = np.array([[[[0, 1, 0]]]])
    ref_o, ref_lse = _flex(q, k, v, keep, state, np.float32(0.08838834764), 128, 64)
    assert np.abs(one["lse"] - ref_lse).max() < 1e-4
    twice = evaluate(kernel_of(), dict(inputs, kv_num_blocks=np.array([[[2]]], np.int32),
                                       kv_indices=np.array([[[[1, 1, 2]]]], np.int32)), {},
                     block=64)
    assert np.abs(twice["lse"] - (ref_lse + math.log(2))).max() < 1e-4


def test_the_reference_takes_the_mask_blocks_columns():
    with pytest.raises(ValueError, match="blocks have 64 columns"):
        evaluate(kernel_of(), {}, {}, block=128)


# ---------------------------------------------------------------------------------------------
# The run-time checks of the lists

BASE = 1 << 20


def arr(shape, dtype=DType.BF16, strides=None, name=""):
    return DeviceArray(BASE, tuple(shape), tuple(strides or contiguous_strides(shape)), dtype, 0,
                       dtype_name=name)


def i32(shape, strides=None):
    return arr(shape, None, strides, "int32")


def args(b=2, h=4, s=300, t=200, tiles=3, blocks=4, lists_b=2, lists_h=4):
    out = dict(Q=arr((b, h, s, 128)), K=arr((b, h, t, 128)), V=arr((b, h, t, 128)),
               O=arr((b, h, s, 128)), lse=arr((b, h, s), DType.F32),
               allowed=arr((b, h, t), DType.F32))
    for counts, indices in (LISTS[:2], LISTS[2:]):
        out[counts] = i32((lists_b, lists_h, tiles))
        out[indices] = i32((lists_b, lists_h, tiles, blocks))
    return out


def test_binding_the_lists():
    plan = lower(kernel_of())
    bound = bind_program(plan, args(), None)
    values = dict(zip([f.name for f in plan.fields], bound.values))
    assert (values["kv_indices_ld"], values["kv_indices_hs"], values["kv_indices_bs"]) == (
        4, 12, 48)
    assert (values["kv_num_blocks_hs"], values["kv_num_blocks_bs"]) == (3, 12)
    shared = bind_program(plan, args(lists_b=1, lists_h=1), None)
    values = dict(zip([f.name for f in plan.fields], shared.values))
    assert values["kv_indices_bs"] == 0 and values["kv_indices_hs"] == 0
    assert values["kv_indices_ld"] == 4


@pytest.mark.parametrize("change, match", [
    (dict(kv_indices=i32((2, 4, 3, 8))), r"kv_indices must be \[B, H, 3, 4\] \(a block mask of "
     r"128x64 blocks: S = 300 in tiles of 128 rows, T = 200 in blocks of 64\), got shape "
     r"\[2, 4, 3, 8\]; a block mask built at another block size does not fit"),
    (dict(kv_num_blocks=i32((2, 4, 2))), r"kv_num_blocks must be \[B, H, 3\]"),
    (dict(kv_num_blocks=i32((3, 4, 3))), "kv_num_blocks has B = 3, but the call has B = 2"),
    (dict(kv_num_blocks=arr((2, 4, 3), DType.F32)), "kv_num_blocks must be an int32 tensor"),
    (dict(kv_indices=i32((2, 4, 3))), "kv_indices must be an int32 tensor of 4 dims"),
    (dict(kv_indices=i32((2, 4, 3, 4), strides=(96, 24, 8, 2))), "unit stride"),
])
def test_binding_refuses_bad_lists_by_name(change, match):
    with pytest.raises(ArgumentError, match=match):
        bind_program(lower(kernel_of()), {**args(), **change}, None)


def test_a_list_left_out_is_refused():
    given = args()
    del given["full_kv_indices"]
    with pytest.raises(ArgumentError, match="missing argument 'full_kv_indices'"):
        bind_program(lower(kernel_of()), given, None)


def test_inspect_shows_the_lists():
    from kgen.report_program import program_summary

    report = program_summary(lower(kernel_of()))
    assert report["loop_bounds"]["skips"]
    assert report["loop_bounds"]["bounds"] == [
        "listed: kv_num_blocks, kv_indices, full_kv_num_blocks, full_kv_indices (block mask, "
        "read per tile)"]


def test_kgen_run_refuses_a_block_mask_at_its_line():
    from kgen.harness.run import run

    built = build_verified(kernel_of(), "sm_90a")
    with pytest.raises(KgenError) as err:
        run(built.kernel, built.plan, built.source)
    assert "kgen run does not make a block mask's lists yet" in err.value.message
    assert err.value.loc.line == _line(TEXT, "blocks 128x64")


def test_the_sm90_tile_order_says_the_lists_decide():
    plan = lower(kernel_of())
    assert plan.wgmma.tile_order.value == "in order"
    assert "block mask's lists" in plan.wgmma.tile_order.why


def test_a_list_past_int_offsets_is_refused():
    big = i32((2, 4, 3, 4), strides=(2**31, 2**28, 4, 1))
    with pytest.raises(ArgumentError, match="addresses a list by int offsets"):
        bind_program(lower(kernel_of()), {**args(), "kv_indices": big}, None)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_a_flex_block_at_head_dim_256_takes_a_written_tile_without_spills(causal):
    """sm_90a's rulebook tile at D 256 is 128x80; a 128 x 128 BlockMask takes 128x64, written
    on the line (kgen/attention_blocks.py: tile_for)."""
    from kgen import attention as ka

    sig = ka.Signature("bf16", 256, 256, causal, None, None, (), "sm_90a", block_mask="full",
                       blocks=(128, 64))
    built = build_verified(ka.program(sig), "sm_90a")
    assert built.plan.wgmma is not None and (built.plan.tile_m, built.plan.block) == (128, 64)
    spill_free(built, "sm_90a")
