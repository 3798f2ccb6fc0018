"""The DAG loop's plan (kgen/lower/loop_dag.py, kgen/plan/loop_dag.py) and rules
(kgen/targets/loop_rules.py, the DAG section): the attention backward's gemms, tiles and
statements in order; the rulebook's configuration per head dim and target, each refusal located;
the causal bounds (the range starts late: keys after every query of a block skip it) and the
proof that a zeroed block adds nothing; the forward keeps its own plan."""
from __future__ import annotations

import math
from pathlib import Path

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import loop_dag as ld
from kgen.plan import program as pp
from kgen.targets import loop_rules, target
from kgen.verify import verify

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "examples" / "attention_bwd.kg").read_text()
MASKED = "where(row <= col, exp(scale * acc - lse[col]), 0)"


def plan_of(text: str = TEXT, arch: ir.Arch | None = None):
    module = parse(text, "b.kg")
    assert verify(module) == []
    return lower(module.kernels[0], arch)


def variant(d: int = 128, mask: str = MASKED, tile: str | None = None) -> str:
    text = TEXT.replace("128]", f"{d}]").replace(MASKED, mask)
    return text.replace("    tile 128x32\n", f"    tile {tile}\n" if tile else "\n")


def test_the_backward_plan_in_order():
    plan = plan_of()
    assert isinstance(plan, ld.LoopDagPlan) and plan.kind == "loop_dag"
    assert (plan.rows_dim, plan.loop_dim, plan.tile_m, plan.block, plan.warps, plan.stages) == (
        "T", "S", 128, 32, 8, 2)
    assert [t.param for t in plan.resident] == ["K", "V"]
    assert [t.param for t in plan.streamed] == ["Q", "dO"]
    assert [(t.param, t.rows, t.cols) for t in plan.staged] == [("dst", 128, 32)]
    assert plan.vectors == ("lse", "D")  # staged per block: [stages][block] f32 each
    assert plan.smem_bytes == 2 * (2 * 128 * 128 + 2 * 2 * 32 * 128 + 128 * 32) + 4 * 2 * 2 * 32
    st, dv, dpt, dk, dq = plan.gemms
    assert (st.a, st.a_load, st.b, st.b_load, st.k, st.n) == (
        "k_res", ld.ALoad.SMEM, "q_ring", pp.FragmentLoad.N_MAJOR, 128, 32)
    assert (dv.a_load, dv.b, dv.b_load, dv.k, dv.n) == (
        ld.ALoad.REGISTERS, "do_ring", pp.FragmentLoad.K_MAJOR, 32, 128)
    assert (dq.a, dq.a_load, dq.b, dq.b_load, dq.k, dq.n, dq.n_warp) == (
        "t0_smem", ld.ALoad.SMEM_TRANSPOSED, "k_res", pp.FragmentLoad.K_MAJOR, 128, 128, 32)
    kinds = [type(s).__name__ for s in plan.body.statements]
    # the value dk multiplies is staged for dq right after it is handed on (its f32 tile dies
    # before dk's MMAs)
    assert kinds == ["DagStep", "Compute", "HandTile", "DagStep", "DagStep", "Compute",
                     "HandTile", "StageTile", "DagStep", "DagStep"]
    assert [type(s).__name__ for s in dq.epilogue.statements] == ["Compute", "AddTile"]
    assert plan.zeroed == ("dQ",)
    assert "sm_80 has mma.sync" in plan.mma.why


def test_sm90a_with_a_written_tile_the_wgmma_skeleton_does_not_take_runs_mma_sync():
    plan = plan_of(arch=ir.Arch.SM90A)  # the example's `tile 128x32`
    assert isinstance(plan, ld.LoopDagPlan) and plan.wgmma is None
    assert plan.mma.value == "mma.sync.m16n8k16"
    assert "the wgmma skeleton does not take this loop: the source's lines" in plan.mma.why


@pytest.mark.parametrize("arch, d, tile", [
    (ir.Arch.SM80, 64, "128x64"), (ir.Arch.SM80, 128, "128x64")])
def test_the_rulebook_tile_per_head_dim(arch, d, tile):
    plan = plan_of(variant(d), arch)
    assert plan.config.value.startswith(f"tile {tile} warps 8 stages 2")
    assert int(plan.registers.value) <= loop_rules.dag_register_budget(target(arch))


@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("tile", [None, "128x64"])
def test_sm90a_picks_the_wgmma_skeleton(d, tile):
    """FlashAttention-3's structure: 2 consumer warpgroups of 64 keys, blocks of 64 queries;
    K, V once and Q, dO in 2-slot rings by the copy engine; dS^T staged in 2 slots."""
    plan = plan_of(variant(d, tile=tile), ir.Arch.SM90A)
    w = plan.wgmma
    assert w is not None and plan.mma.value == w.mma.value and "wgmma" in plan.mma.why
    assert (plan.tile_m, plan.block, plan.stages, plan.threads) == (128, 64, 2, 384)
    assert plan.config.value == "tile 128x64 warps 8 stages 2"
    assert [(t.name, t.param, t.rows, t.boxes, t.slots) for t in w.tiles] == [
        ("k_res", "K", 128, d // 64, 1), ("v_res", "V", 128, d // 64, 1),
        ("q_ring", "Q", 64, d // 64, 2), ("do_ring", "dO", 64, d // 64, 2),
        ("t0_smem", "dst", 128, 1, 2)]
    assert [(m.param, m.box_rows) for m in w.maps] == [("K", 128), ("V", 128), ("Q", 64),
                                                        ("dO", 64), ("dK", 64), ("dV", 64)]
    assert w.tail_stores == (("dK", "q_ring"), ("dV", "do_ring"))  # the epilogue's stores
    offsets = [t.offset for t in w.tiles]
    assert offsets == sorted(offsets) and all(o % 1024 == 0 for o in offsets)
    # dQ's adds by the copy engine's tensor reduce-add; the rows' bulk adds and atomics plan
    # options; after the tiles: lse and D staged by the producer (2 slots of the block each),
    # then the adds' staging (1024-byte aligned)
    assert w.vectors == ("lse", "D") and w.vector_offset == sum(t.bytes for t in w.tiles)
    assert w.add_offset == w.vector_offset + 2 * 2 * 4 * plan.block
    assert "tensor reduce-add" in w.adds.value and w.add_map is not None
    assert "measured on an H200" in w.adds.why
    assert w.barrier_offset == w.add_offset + 2 * plan.block * (d // 2) * 4
    assert plan.smem_bytes == w.smem_bytes == w.barrier_offset + 128
    assert plan.smem_bytes <= target(ir.Arch.SM90A).smem_limit
    assert int(plan.registers.value) <= loop_rules.CONSUMER_REGISTERS
    # the accumulating gemms overlap the next gemm where the registers allow (N 64)
    assert w.wait_accumulating == (d > loop_rules.DAG_WGMMA_OVERLAP_N)
    st, dv, dpt, dk, dq = plan.gemms
    assert (dq.kind, dq.k, dq.n, dq.n_warp) == (ld.GemmKind.LOOP_ROW, 128, d, d // 2)


def test_sm90a_wgmma_refusals_keep_mma_sync_and_say_why():
    shape = loop_rules.DagShape((128, 128), (128, 128), 1, 2, 128, 2, (128,))
    sm90 = target(ir.Arch.SM90A)
    assert loop_rules.dag_wgmma_refusal(shape, ir.DType.BF16, sm90, (None,) * 4) is None
    assert "has no wgmma" in loop_rules.dag_wgmma_refusal(shape, ir.DType.BF16,
                                                          target(ir.Arch.SM80), (None,) * 4)
    assert "the source's lines" in loop_rules.dag_wgmma_refusal(
        shape, ir.DType.BF16, sm90, (128, 32, None, None))
    assert "16-bit" in loop_rules.dag_wgmma_refusal(shape, ir.DType.F32, sm90, (None,) * 4)
    # N 256 and 192: the split layout (dag_wgmma_rules.DAG_WGMMA_SPLIT; 192's halves in wgmma
    # pieces of 32: DAG_WGMMA_SPLIT_PIECE); N 224 refused by its rule (halves of 112 columns)
    wide = loop_rules.DagShape((256, 256), (256, 256), 1, 2, 256, 2, (256,), handed=1)
    assert loop_rules.dag_wgmma_refusal(wide, ir.DType.BF16, sm90, (None,) * 4) is None
    pieced = loop_rules.DagShape((192, 192), (192, 192), 1, 2, 192, 2, (192,), handed=1)
    assert loop_rules.dag_wgmma_refusal(pieced, ir.DType.BF16, sm90, (None,) * 4) is None
    odd = loop_rules.DagShape((224, 224), (224, 224), 1, 2, 224, 2, (224,), handed=1)
    assert ("N 224 split over 2 warpgroups: a half of 112 columns is neither whole 64-column "
            "boxes" in loop_rules.dag_wgmma_refusal(odd, ir.DType.BF16, sm90, (None,) * 4))
    # a head dim the wgmma skeleton does not take runs mma.sync, its why in the plan
    plan = plan_of(variant(96), ir.Arch.SM90A)
    assert plan.wgmma is None and "columns must be one of (64, 128)" in plan.mma.why


def test_a_written_tile_over_the_registers_is_refused_at_the_loop():
    with pytest.raises(KgenError, match=r"b\.kg:18:3: error: loop 'q': tile 128x128 with 2 "
                                        r"accumulators of N 128 needs about 480 registers"):
        plan_of(variant(128, tile="128x128"))


def test_a_head_dim_registers_cannot_hold_is_refused():
    with pytest.raises(KgenError, match=r"b\.kg:18:3: error: loop 'q': .*accumulators of N 256 "
                                        "needs about"):
        plan_of(variant(256))


def test_rules_refuse_warps_that_cannot_share_the_loop_row_tile():
    shape = loop_rules.DagShape((128, 128), (128, 128), 1, 2, 64, 2, (64,))
    config = loop_rules.LoopConfig(64, 128, 2, 16)  # 4 warps, 8 m16 tiles of the block
    why = loop_rules.dag_refusal(config, shape, ir.DType.BF16, target(ir.Arch.SM80))
    assert why is not None and "cannot share a loop-row gemm's [128, 64] tile" in why
    assert loop_rules.dag_loop_row_split(loop_rules.LoopConfig(128, 64, 2, 16), 128) == (4, 64)


def test_causal_top_left_skips_the_blocks_before_the_tile_s_first_key():
    bounds = plan_of().bounds
    assert bounds.skips
    # inside the mask its predicate `row <= col` reads 1 (the fast body's constexpr interior)
    (folded,) = bounds.fold
    assert plan_of().body.values[folded].kind.op is ir.Op.LE
    (b,) = bounds.bounds
    # row <= col: col >= row, a lower bound (the range starts late)
    assert (b.upper, b.strict, b.slope, b.offset) == (False, False, 1, ())


def test_causal_bottom_right_bound_reads_both_sizes():
    (b,) = plan_of(variant(mask="where(row <= col + T - S, exp(scale * acc - lse[col]), "
                                     "0)")).bounds.bounds
    assert not b.upper and b.slope == 1
    assert {(t.term, t.coef) for t in b.offset} == {(pp.Term.ROWS, -1.0),
                                                   (pp.Term.LOOP_LEN, 1.0)}


def test_no_mask_runs_every_block():
    bounds = plan_of(variant(mask="exp(scale * acc - lse[col])")).bounds
    assert not bounds.skips and "every block runs" in bounds.why


def test_a_mask_whose_zero_does_not_zero_the_block_skips_nothing():
    """dst = pt * ... + 1 is not 0 where pt is: a block masked in full still adds to dk."""
    text = variant().replace("dst = pt * (acc - D[col])", "dst = pt * (acc - D[col]) + 1")
    bounds = plan_of(text).bounds
    assert not bounds.skips
    assert "a value a gemm multiplies is not 0" in bounds.why


def test_the_forward_keeps_its_own_plan():
    plan = plan_of((ROOT / "examples" / "attention_fwd.kg").read_text())
    assert isinstance(plan, pp.LoopPlan)


def test_carries_are_refused_at_the_carry():
    text = variant().replace("    gemm st = K", "    carry m : f32[row] = -inf\n    gemm st = K")
    module = parse(text, "b.kg")
    verify(module)
    with pytest.raises(KgenError, match=r"b\.kg:20:5: error: loop 'q': a loop of more gemms "
                                        "than the forward's carries no row state yet"):
        lower(module.kernels[0])


def test_zero_grid_covers_the_loop():
    from kgen.targets.common.loop_dag import ZERO_ROWS, zero_grid

    assert zero_grid(1, 3, 2) == (1, 3, 2)
    assert zero_grid(4097, 1, 1) == (math.ceil(4097 / ZERO_ROWS), 1, 1)
    assert zero_grid(0, 1, 1)[0] == 0


def test_inspect_shows_the_skeleton_chosen_and_why():
    from kgen.report_loop_dag import summary

    s = summary(plan_of(variant(128), ir.Arch.SM90A))
    assert s["skeleton"] == "wgmma" and s["threads"] == 384
    assert "wgmma" in s["mma"]["value"] and "rulebook allows it" in s["mma"]["why"]
    assert s["wgmma"]["roles"]["value"].startswith("1 producer warpgroup + 2 consumer")
    assert "bulk" in s["wgmma"]["adds"]["value"]
    assert [b["name"] for b in s["buffers"]] == ["k_res", "v_res", "q_ring", "do_ring",
                                                 "t0_smem"]
    assert s["body"][0].startswith("gemm st (score) = wgmma")
    kept = summary(plan_of(arch=ir.Arch.SM90A))  # the example's written tile 128x32
    assert kept["skeleton"] == "mma.sync" and kept["wgmma"] is None
    assert "the wgmma skeleton does not take this loop" in kept["mma"]["why"]


@pytest.mark.parametrize("d", [64, 128])
def test_the_add_warp_lays_out_its_staging_and_the_other_adds_are_options(d):
    """dQ's adds by the copy engine's tensor reduce-add, issued by the producer warpgroup's add
    warp (the rulebook's choice): each warpgroup's [64, d / 2] f32 staged as boxes of [64][32]
    after the tiles and the vectors, 1024-byte aligned, the mbarriers after it, dQ's f32 map
    after the loads' maps; with_adds takes them to the tensor reduce-add by a thread of each
    warpgroup (the same staging), to a bulk add per staged row (rows padded by 32 bytes), to
    f32 atomics (no staging) and back."""
    from kgen.targets.sm90.loop_dag_schedule import add_mode, with_adds

    plan = plan_of(variant(d), ir.Arch.SM90A)
    w = plan.wgmma
    assert add_mode(w) == "warp" and w.add_warp and "add warp" in w.adds.value
    assert w.adds.value.startswith("tensor reduce-add")
    assert w.add_map == pp.LoopTensorMap("dQ", ir.DType.F32, 64, d // 64, False)
    assert w.tensor_maps == w.maps + (w.add_map,) and plan.adders == 1
    assert w.add_offset % 1024 == 0 and w.add_offset >= w.vector_offset + 2 * 2 * 4 * 64
    assert w.barrier_offset == w.add_offset + 2 * 64 * (d // 2) * 4
    assert plan.smem_bytes == w.barrier_offset + 128 <= target(ir.Arch.SM90A).smem_limit
    tensor = with_adds(plan, "tensor")
    t = tensor.wgmma
    assert add_mode(t) == "tensor" and not t.add_warp and tensor.adders == 2
    assert (t.add_offset, t.add_map, t.barrier_offset) == (w.add_offset, w.add_map,
                                                           w.barrier_offset)
    rows = with_adds(tensor, "rows")
    r = rows.wgmma
    assert add_mode(r) == "rows" and r.adds.value.startswith("bulk") and r.add_map is None
    assert r.add_row_bytes == 4 * d // 2 + 32 and r.add_row_bytes % 16 == 0
    assert r.add_offset == w.vector_offset + 2 * 2 * 4 * 64 and rows.adders == 8
    assert r.barrier_offset == r.add_offset + 2 * 64 * r.add_row_bytes
    atomics = with_adds(rows, "atomics")
    assert atomics.wgmma.add_offset is None and atomics.wgmma.adds.value.startswith("f32 atomics")
    assert atomics.wgmma.barrier_offset == r.add_offset
    assert atomics.smem_bytes == atomics.wgmma.barrier_offset + 128
    back = with_adds(atomics, "warp")
    assert (back.smem_bytes, back.wgmma.barrier_offset, back.wgmma.add_offset,
            back.wgmma.add_map, back.wgmma.add_warp) == (
        plan.smem_bytes, w.barrier_offset, w.add_offset, w.add_map, True)


def test_deterministic_adds_are_the_add_warps():
    """Deterministic mode: the add warp alone waits on the semaphores, one per (batch, head,
    block); the tensor reduce-add by a thread of each warpgroup is not built with them (refused
    as an option), the rows' bulk adds are (a semaphore per warp)."""
    from kgen.targets.sm90.loop_dag_schedule import add_mode, with_adds

    text = variant(128).replace("kernel attention_bwd {\n",
                                "kernel attention_bwd {\n  reductions deterministic\n")
    plan = plan_of(text, ir.Arch.SM90A)
    assert plan.deterministic is not None and add_mode(plan.wgmma) == "warp"
    assert plan.adders == 1
    assert with_adds(plan, "rows").adders == 8
    with pytest.raises(ValueError, match="deterministic"):
        with_adds(plan, "tensor")


# ---------------------------------------------------------------------------------------------
# A document mask: the equality of a row and a column vector, scanned per tile of keys

DOC = "where(kd[row] == qd[col], exp(scale * acc - lse[col]), 0)"


def document(mask: str = DOC, arch: str = "sm_80", heads: str = "H",
             kv_vectors: bool = False) -> str:
    """examples/attention_bwd.kg with `mask`, the ids kd [B, H, T] (or the KV heads') and qd."""
    kv = heads != "H"
    text = variant(mask=mask).replace("target sm_80", f"target {arch}")
    text = text.replace("  vector D : f32[B, H, S]",
                        f"  vector kd : f32[B, {heads if kv_vectors else 'H'}, T]\n"
                        f"  vector qd : f32[B, {heads if kv_vectors else 'H'}, S]\n"
                        "  vector D : f32[B, H, S]")
    if kv:
        for name in ("K", "V", "dK", "dV"):
            text = text.replace(f"tensor {name} : bf16[B, H, T", f"tensor {name} : bf16[B, "
                                f"{heads}, T")
    return text


@pytest.mark.parametrize("arch", [None, ir.Arch.SM90A], ids=["sm_80", "sm_90a"])
def test_a_document_mask_is_an_equality_bound_folded_inside(arch):
    plan = plan_of(document(), arch)
    bounds = plan.bounds
    assert bounds.skips and bounds.bounds == ()
    assert bounds.equalities == (pp.EqualBound("kd", "qd"),)
    (folded,) = bounds.fold  # the equality reads 1 in a block inside the mask
    assert plan.body.values[folded].kind.op is ir.Op.EQ
    assert "kd[row] == qd[col], its columns scanned per tile of rows" in bounds.why
    if arch is not None:
        w = plan.wgmma
        assert w.fast_body and w.lpt_l2_bytes is None  # ids, not the tile's index, rank it
        assert "a document mask" in w.lpt_why


@pytest.mark.parametrize("mask", [
    "where((row <= col) * (qd[col] == kd[row]), exp(scale * acc - lse[col]), 0)",
    "where(row <= col, where(kd[row] == qd[col], exp(scale * acc - lse[col]), 0), 0)"])
def test_a_causal_document_mask_keeps_both_bounds(mask):
    plan = plan_of(document(mask, "sm_90a"))
    (b,) = plan.bounds.bounds
    assert not b.upper and b.slope == 1
    assert plan.bounds.equalities == (pp.EqualBound("kd", "qd"),)
    assert plan.wgmma.lpt_l2_bytes is not None  # the linear bound ranks the tiles


def test_deterministic_mode_takes_no_equality_and_says_why():
    from kgen.lower.loop_dag import DETERMINISTIC_EQUALITY_WHY

    for arch in ("sm_80", "sm_90a"):
        text = document(arch=arch).replace("kernel attention_bwd {\n",
                                           "kernel attention_bwd {\n  reductions deterministic\n")
        bounds = plan_of(text).bounds
        assert not bounds.skips and bounds.fold == ()
        assert bounds.why.startswith("every block runs: ")
        assert DETERMINISTIC_EQUALITY_WHY in bounds.why
        # a causal term's linear bound stays
        causal = text.replace(DOC, "where((row <= col) * (kd[row] == qd[col]), "
                                   "exp(scale * acc - lse[col]), 0)")
        bounds = plan_of(causal).bounds
        assert len(bounds.bounds) == 1 and bounds.equalities == ()
        assert DETERMINISTIC_EQUALITY_WHY in bounds.why


def test_gqa_takes_no_equality_and_says_why():
    from kgen.lower.loop_dag import GQA_EQUALITY_WHY

    for kv_vectors in (False, True):
        bounds = plan_of(document(heads="HKV", kv_vectors=kv_vectors)).bounds
        assert not bounds.skips and GQA_EQUALITY_WHY in bounds.why


@pytest.mark.parametrize("arch", [None, ir.Arch.SM90A], ids=["sm_80", "sm_90a"])
def test_packed_sequences_take_the_equality(arch):
    text = (ROOT / "examples" / "attention_bwd_varlen.kg").read_text().replace(
        "  vector D : f32[B, H, S]",
        "  vector kd : f32[B, H, T]\n  vector qd : f32[B, H, S]\n  vector D : f32[B, H, S]")
    text = text.replace("where(row <= col + T - S, ",
                        "where((row <= col + T - S) * (kd[row] == qd[col]), ")
    plan = plan_of(text, arch)
    assert plan.packed and len(plan.bounds.bounds) == 1
    assert plan.bounds.equalities == (pp.EqualBound("kd", "qd"),)


def value_dim(d: int, d_v: int) -> str:
    """The backward at D_qk `d` and D_v `d_v`: V, dO, dV at d_v, Q, K, dK, dQ at d."""
    text = variant(d)
    for name, dims in (("V", "T"), ("dO", "S"), ("dV", "T")):
        text = text.replace(f"{name} : bf16[B, H, {dims}, {d}]",
                            f"{name} : bf16[B, H, {dims}, {d_v}]")
    return text


@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("d, d_v", [(128, 64), (64, 128)])
def test_accumulators_of_two_widths_plan_a_tail_each(arch, d, d_v):
    """D_v != D: dv's accumulating gemm at N D_v, dk's at D; the kernel's epilogue a tail per N
    (dV's store on dv's, dK's on dk's), in the accumulators' order; the registers counted at
    each N; the wgmma skeleton on sm_90a (every operand 64 or 128 columns)."""
    plan = plan_of(value_dim(d, d_v), arch)
    st, dv, dpt, dk, dq = plan.gemms
    assert (dv.n, dk.n, dq.n, dpt.k, st.k) == (d_v, d, d, d_v, d)
    assert plan.n_acc is None
    assert [(t.n, t.accumulators) for t in plan.tails] == [(d_v, ("dv",)), (d, ("dk",))]
    stores = [[s.param for s in t.section.statements if isinstance(s, pp.StoreTile)]
              for t in plan.tails]
    assert stores == [["dV"], ["dK"]]
    assert f"N {d_v} and {d}" in plan.registers.why
    assert (plan.wgmma is not None) == (arch is ir.Arch.SM90A)
    same = plan_of(variant(d), arch)
    assert same.n_acc == d and [(t.n, t.accumulators) for t in same.tails] == [
        (d, ("dv", "dk"))]
    from kgen.report_loop_dag import summary  # `kgen inspect`: a heading per N

    lines = summary(plan)["epilogue"]
    assert lines[0] == f"on dv's [T, {d_v}]:" and f"on dk's [T, {d}]:" in lines
    assert not any(line.startswith("on ") for line in summary(same)["epilogue"])


def test_rules_count_each_accumulator_at_its_width():
    """DagShape.acc_ns: the registers the accumulators hold are each at its N; the wgmma
    skeleton takes 128/64 (every operand whole boxes), 192/128 and 256/128 (the split layout,
    each accumulator halved at its own N; D 192's halves of 96 columns in wgmma pieces of 32),
    and refuses 160/128 (a half of 80 columns: no whole pieces)."""
    config = loop_rules.LoopConfig(128, 64, 2, 16)
    equal = loop_rules.DagShape((128, 128), (128, 128), 1, 2, 128, 2, (128,))
    mixed = loop_rules.DagShape((128, 64), (128, 64), 1, 2, 128, 2, (128,), acc_ns=(64, 128))
    assert mixed.widths == (64, 128) and equal.widths == (128, 128)
    assert mixed.widths_text == "N 64 and 128" and equal.widths_text == "N 128"
    assert (loop_rules.dag_registers(config, equal) - loop_rules.dag_registers(config, mixed)
            == 64 // 2)
    assert (loop_rules.dag_wgmma_registers(equal) - loop_rules.dag_wgmma_registers(mixed)
            == 64 // 2)
    sm90 = target(ir.Arch.SM90A)
    assert loop_rules.dag_wgmma_refusal(mixed, ir.DType.BF16, sm90, (None,) * 4) is None
    deepseek = loop_rules.DagShape((192, 128), (192, 128), 1, 2, 192, 2, (192,),
                                   acc_ns=(128, 192), handed=1)
    assert loop_rules.dag_wgmma_refusal(deepseek, ir.DType.BF16, sm90, (None,) * 4) is None
    wide = loop_rules.DagShape((256, 128), (256, 128), 1, 2, 256, 2, (256,), acc_ns=(128, 256),
                               handed=1)
    assert loop_rules.dag_wgmma_refusal(wide, ir.DType.BF16, sm90, (None,) * 4) is None
    odd = loop_rules.DagShape((160, 128), (160, 128), 1, 2, 160, 2, (160,), acc_ns=(128, 160),
                              handed=1)
    assert "a half of 80 columns is neither whole 64-column boxes" in \
        loop_rules.dag_wgmma_refusal(odd, ir.DType.BF16, sm90, (None,) * 4)


def test_d192_with_a_narrower_value_dim_runs_the_wgmma_split_layout_on_sm90a():
    """192/128 (DeepSeek's): the mma.sync skeleton takes it on sm_80 (about 272 registers, the
    budget 320); on sm_90a the wgmma skeleton's split layout, dV's warpgroup half one box of 64
    columns, dK's and dQ's halves of 96 in wgmma pieces of 32, which the mma row says."""
    plan = plan_of(value_dim(192, 128), ir.Arch.SM80)
    assert [t.n for t in plan.tails] == [128, 192] and plan.registers.value == "272"
    assert plan.wgmma is None
    plan = plan_of(value_dim(192, 128), ir.Arch.SM90A)
    assert [t.n for t in plan.tails] == [128, 192]
    w = plan.wgmma
    assert w is not None and w.split is not None
    assert {g.name: g.n_warp for g in plan.gemms if g.kind is not ld.GemmKind.SCORE} == {
        "dv": 64, "dk": 96, "dq": 96}
    assert w.piece(plan.gemm("dv").index) is None and w.piece(plan.gemm("dk").index) == 32
    assert "dk and dq: each warpgroup's 96 columns as 3 wgmma.m64n32k16 pieces" in plan.mma.value
