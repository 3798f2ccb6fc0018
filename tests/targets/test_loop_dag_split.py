"""The attention backward at head dim 256 on sm_90a: the wgmma skeleton's split layout
(kgen/targets/dag_wgmma_rules.py, DAG_WGMMA_SPLIT; FlashAttention-3's head dim 256 backward):
64 keys a CTA, the two consumer warpgroups splitting dK, dV along D and S^T, dP^T along the
block's queries, P^T and dS^T staged. The rulebook's choice and why (the plan values, `kgen
inspect`), D 192 and 192 / 128 with the halves of 96 columns in wgmma pieces of 32 (D 160
refused with the rule's reason), D 64 and 128 unchanged (the plain layout), the plan options
the split does not take, and NVRTC's build: 0 spills, no stack, no warning (every mask, bf16
and f16, GQA, deterministic, the mods' terms; D 192 causal and not, 192 / 128, GQA,
deterministic)."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.targets import dag_wgmma_rules
from tests.targets.test_loop_dag_compile import MASKS, built


def test_d256_takes_the_split_layout():
    plan = built(256, "top_left", ir.Arch.SM90A).plan
    w = plan.wgmma
    assert w is not None and w.split is not None
    assert (plan.tile_m, plan.block, plan.stages, w.consumers) == (64, 64, 2, 2)
    assert "32 of a score tile's columns" in w.split.value and "N / 2" in w.split.value
    assert "FlashAttention-3's split" in w.split.why
    assert w.score_n == 32
    # the score gemms' warpgroup columns, the accumulators' and the loop-row gemm's halves
    n_warp = {g.name: g.n_warp for g in plan.gemms}
    assert n_warp == {"st": 32, "dv": 128, "dpt": 32, "dk": 128, "dq": 128}
    # P^T (handed to dV only) has a staged tile of its own; dK reads dS^T's (the loop-row one)
    assert [t.name for t in w.handed] == ["h0_smem"]
    assert dict(w.a_tiles) == {1: "h0_smem", 3: "t0_smem"}
    assert all(t.offset % 1024 == 0 for t in w.tiles)
    # dQ by f32 atomics (the rulebook's, DAG_WGMMA_SPLIT_ADDS): a staging of its own would not
    # fit beside the tiles (the plan option "slots" stages it in the streamed slots:
    # tests/targets/test_loop_dag_split_adds.py)
    assert "tiles leave no room" in w.adds.why
    if dag_wgmma_rules.DAG_WGMMA_SPLIT_ADDS == "atomics":
        assert w.add_offset is None and w.add_map is None and "atomics" in w.adds.value
    else:  # (flipped: the add warp's adds from the streamed slots)
        assert w.add_slots and w.add_offset is None
    tiles, total = dag_wgmma_rules.dag_wgmma_split_smem_bytes(
        __import__("kgen.targets.loop_rules", fromlist=["DagShape"]).DagShape(
            (256, 256), (256, 256), 1, 2, 256, 2, (256,), 2, 1))
    assert tiles == 229376 and plan.smem_bytes == total <= 232448
    assert "each warpgroup half of N" in plan.registers.why
    # its schedule (measured): each score gemm at its statement, dK's wgmma after dQ's, dV's
    # after a consumer barrier of its own (two a block)
    assert not w.issue_ahead and w.defer_accumulating and not w.defer_all
    from kgen.targets.sm90.loop_dag import _waits

    waits = _waits(plan)
    assert waits["issue_with"] == {4: [plan.gemm("dk")]} and waits["deferred"] == {3}
    assert _barriers(_fast_body(built(256, "top_left", ir.Arch.SM90A).source)) == 2


def _barriers(body: str) -> int:
    """The consumers' barriers in `body` (the loop-row gemm's, with the add warp's adds, is the
    named barrier the add warp arrives on)."""
    return body.count("consumer_barrier();") + body.count("named_barrier_sync(kAddFree, ")


def _fast_body(source: str) -> str:
    start = source.index("if (block >= fast_begin")
    return source[start:source.index("} else {", start)]


def _emitted(plan):
    import dataclasses

    from kgen.targets.sm90.loop_dag import emit

    b = built(256, "none", ir.Arch.SM90A)
    return dataclasses.replace(b, plan=plan, source=emit(plan, source_name="attention_bwd.kg",
                                                         source_hash="0", command="test"))


@pytest.mark.parametrize("mask", list(MASKS))
def test_the_defer_all_option_takes_one_barrier_a_block_and_compiles(mask):
    """The plan option defer_all (not GPU-run yet): dV's and dK's wgmmas issued after dQ's,
    behind the loop-row gemm's barrier, dP^T with S^T."""
    from kgen.targets.sm90.loop_dag import _waits
    from kgen.targets.sm90.loop_dag_schedule import with_schedule

    plan = with_schedule(built(256, mask, ir.Arch.SM90A).plan, defer_all=True, issue_ahead=True)
    assert plan.wgmma.defer_all and "every accumulating gemm issued after" in \
        plan.wgmma.overlap.value
    waits = _waits(plan)
    assert waits["issue_with"] == {0: [plan.gemm("dpt")], 4: [plan.gemm("dv"), plan.gemm("dk")]}
    assert waits["deferred"] == {1, 3} and waits["depth"][4] == 2
    b = _emitted(plan)
    assert _barriers(_fast_body(b.source)) == 1
    _compiles(b)
    with pytest.raises(ValueError, match="defer_all is the split layout's"):
        with_schedule(built(128, mask, ir.Arch.SM90A).plan, defer_all=True)


@pytest.mark.parametrize("d", [64, 128])
def test_d64_and_d128_keep_the_plain_layout(d):
    plan = built(d, "top_left", ir.Arch.SM90A).plan
    assert plan.wgmma.split is None and plan.wgmma.handed == () and plan.tile_m == 128
    assert plan.wgmma.score_n == 64


def test_d192_takes_the_split_layout_in_pieces_of_32_columns():
    """D 192: the split layout; a warpgroup's half of 96 columns starts inside a 64-column box,
    so dV, dK and dQ issue it as three wgmma.m64n32k16 pieces (dag_wgmma_rules.
    DAG_WGMMA_SPLIT_PIECE), each B read MN-major from 0 or 64 bytes into a box; the score gemms
    stay one m64n32 each; the mma row and `kgen inspect` say why."""
    b = built(192, "top_left", ir.Arch.SM90A)
    plan, w = b.plan, b.plan.wgmma
    assert w is not None and w.split is not None and plan.tile_m == 64
    n_warp = {g.name: g.n_warp for g in plan.gemms}
    assert n_warp == {"st": 32, "dv": 96, "dpt": 32, "dk": 96, "dq": 96}
    assert dict(w.pieces) == {1: 32, 3: 32, 4: 32} and w.piece(0) is None
    assert "dv and dk and dq: each warpgroup's 96 columns as 3 wgmma.m64n32k16 pieces" in \
        plan.mma.value
    assert "a warpgroup's half of N 192 (96 columns) is not whole 64-column boxes" in w.mma.why
    # every piece's B descriptor at its column's box and 0 or 64 bytes into it (the fast body's;
    # the checked body issues the same): built once a gemm, a k step's one add from them
    src, body = b.source, _fast_body(b.source)
    piece = ("descriptor_mn(column_address({0}, {1} + 0, {2}), {2}), descriptor_mn(column_address("
             "{0}, {1} + 32, {2}), {2}), descriptor_mn(column_address({0}, {1} + 64, {2}), {2})}};")
    assert body.count("b_desc[3] = {" + piece.format("b_slot", "consumer * 96", 8192)) == 2
    assert body.count("b_desc[3] = {" + piece.format("lr_b", "lr_col0", 8192)) == 1
    assert "return base + (col / 64) * box_bytes + (col % 64) * 2;" in src
    for name in ("kmn", "mn"):
        assert src.count(f"template <int kPiece>\n__device__ __forceinline__ void "
                         f"wgmma_ss_{name}_n32_of96(float (&acc)[12][4]") == 1
        assert "acc[kPiece * 4 + 3][3]" in src
    for gemm, acc, a_step in (("kmn", "acc_g1", "(ks / 4) * 8192 + (ks % 4) * 32"),
                              ("mn", "acc_g4", "ks * 16 * 128"),
                              ("kmn", "acc_g3", "(ks / 4) * 8192 + (ks % 4) * 32")):
        for p in range(3):
            call = re.sub(r"\s+", " ", f"wgmma_ss_{gemm}_n32_of96<{p}>({acc}, descriptor_at("
                          f"a_desc, {a_step}), descriptor_at(b_desc[{p}], ks * 16 * 128)")
            assert call in re.sub(r"\s+", " ", body), call
    # dQ by f32 atomics (the rulebook's; its add warp's staging would fit: the option "warp")
    assert "the split layout's warpgroup shares" in w.adds.why
    assert ("atomics" in w.adds.value) == (dag_wgmma_rules.DAG_WGMMA_SPLIT_ADDS == "atomics")
    from kgen.report_loop_dag import summary

    assert "m64n32k16 pieces" in summary(plan)["wgmma"]["mma"]["value"]


def test_a_half_of_no_whole_pieces_keeps_mma_sync_with_the_rule_s_reason():
    """D 160: a warpgroup's half of 80 columns is neither whole boxes nor whole pieces of 32:
    the mma.sync skeleton takes the loop, its mma row saying why."""
    plan = built(160, "none", ir.Arch.SM90A).plan
    assert plan.wgmma is None
    assert ("the wgmma skeleton does not take this loop: N 160 split over 2 warpgroups: a half "
            "of 80 columns is neither whole 64-column boxes") in plan.mma.why


def test_a_row_reduction_with_the_split_is_refused():
    """A reduction over a row's columns: each warpgroup holds half of them (not combined)."""
    from kgen.api import build_verified
    from kgen.parse import parse
    from kgen.verify import verify

    text = built.__globals__["TEXT"].replace("128]", "256]").replace("    tile 128x32\n", "\n")
    old = "epilogue { pt = where(row <= col, exp(scale * acc - lse[col]), 0) }"
    assert old in text
    text = text.replace(old, "epilogue { m = rowmax(acc); pt = where(row <= col, "
                        "exp(scale * acc - lse[col]), 0) + 0 * m }")
    module = parse(text, "attention_bwd.kg")
    assert verify(module) == []
    with pytest.raises(KgenError, match="a row reduction with the accumulators split"):
        build_verified(module.kernels[0], ir.Arch.SM90A)
    # the plain layout takes it (each warpgroup holds whole rows)
    plain = parse(text.replace("256]", "128]"), "attention_bwd.kg")
    assert build_verified(plain.kernels[0], ir.Arch.SM90A).plan.wgmma.split is None


def test_the_split_takes_atomic_adds_or_the_add_warp_s():
    from kgen.targets.sm90.loop_dag_schedule import with_adds

    plan = with_adds(built(256, "none", ir.Arch.SM90A).plan, "atomics")
    assert with_adds(plan, "atomics") is plan
    for mode in ("rows", "tensor"):
        with pytest.raises(ValueError, match="the split layout adds by f32 atomics or the add"):
            with_adds(plan, mode)


def test_inspect_shows_the_split():
    from kgen.report_loop_dag import print_summary, summary
    from rich.console import Console

    s = summary(built(256, "none", ir.Arch.SM90A).plan)
    assert s["wgmma"]["split"]["value"].startswith("64 rows a CTA")
    assert any(b["name"] == "h0_smem" and "split" in b["role"] for b in s["buffers"])
    console = Console(width=200, record=True)
    print_summary(console, s)
    assert "split: 64 rows a CTA" in console.export_text()
    plain = summary(built(128, "none", ir.Arch.SM90A).plan)
    assert plain["wgmma"]["split"] is None


def _compiles(b):
    from kgen.runtime.nvrtc import compile_cubin

    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    resources = result.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    assert "warning" not in result.log.lower(), result.log
    return result


@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_d256_compiles_without_spills(mask, dtype):
    b = built(256, mask, ir.Arch.SM90A, dtype)
    assert b.plan.wgmma.split is not None
    _compiles(b)


def _backward_main(d=256, **options):
    from kgen.api import build_verified
    from kgen.attention_grad import BackwardSignature, backward_text
    from kgen.attention_grad_mods import Mods
    from kgen.parse import parse
    from kgen.verify import verify

    mods = options.pop("mods", {})
    causal = options.pop("causal", True)
    text = backward_text(BackwardSignature("bf16", d, causal, "sm_90a", mods=Mods(**mods),
                                           **options))
    module = parse(text, "bwd.kg")
    assert verify(module) == []
    (main,) = [k for k in module.kernels if k.name.endswith("_main")]
    return build_verified(main, ir.Arch.SM90A)


@pytest.mark.parametrize("options", [
    dict(gqa=True), dict(deterministic=True),
    dict(mods=dict(score_mod="cap * tanh(score / cap)", scalars=("cap",))),
    dict(mods=dict(mask_mod="col > row - window", scalars=("window",))),
    dict(mods=dict(dropout=True)),
    dict(mods=dict(bias="tensor", bias_grad=True)),
], ids=["gqa", "deterministic", "softcap", "window", "dropout", "bias_grad"])
def test_kgen_attention_s_d256_backwards_compile_without_spills(options):
    """kgen.attention's backward programs at D 256 (kgen/attention_grad.py): the split layout
    with GQA, deterministic adds and the forward's mods; the bias read and its gradient stored
    per element (the staged ring and the staged store take a warpgroup's rows, not its
    columns: DAG_WGMMA_SPLIT_NOT_STAGED_WHY)."""
    b = _backward_main(**options)
    w = b.plan.wgmma
    assert w is not None and w.split is not None
    if options.get("mods", {}).get("bias"):
        assert w.bias is None and w.staging.why.endswith(
            dag_wgmma_rules.DAG_WGMMA_SPLIT_NOT_STAGED_WHY)
        assert w.store_param is None
        assert w.tile_store.why == dag_wgmma_rules.DAG_WGMMA_SPLIT_NOT_STAGED_WHY
        assert not w.issue_ahead  # (its stores from registers beside two score tiles spill)
    _compiles(b)


@pytest.mark.parametrize("options", [
    dict(causal=False), dict(causal=True), dict(causal=False, d_v=128), dict(causal=True, d_v=128),
    dict(gqa=True), dict(deterministic=True),
], ids=["full", "causal", "full-dv128", "causal-dv128", "gqa", "deterministic"])
def test_kgen_attention_s_d192_backwards_compile_without_spills(options):
    """kgen.attention's backward at D 192 and 192 / 128 (DeepSeek's): the split layout in pieces
    (dV's at D_v 128 one m64n64 wgmma a warpgroup, whole boxes), a tail's first column each
    where the accumulators' N differ; NVRTC 13.5: 0 spills, no stack, no warning."""
    b = _backward_main(192, **options)
    w = b.plan.wgmma
    assert w is not None and w.split is not None
    if options.get("d_v") == 128:
        assert dict(w.pieces) == {3: 32, 4: 32}  # dK and dQ; dV's half is one box
        assert [t.n for t in b.plan.tails] == [128, 192]
        assert "const int acc_col0_128 = consumer * (kNAcc128 / kConsumers);" in b.source
        assert "store_fragments<kNAcc192N8>(g_dK, p.dK_ld, out, row_base, rows, " \
               "acc_col0_192 + quad_col);" in b.source
    _compiles(b)


@pytest.mark.parametrize("d, d_v", [(256, 128), (128, 256)])
def test_the_split_layout_takes_accumulators_of_two_n(d, d_v):
    """256 / 128 and 128 / 256: the split layout, each accumulator halved at its own N (whole
    boxes: no pieces), the epilogue a tail per N from its own first column; 0 spills."""
    b = _backward_main(d, d_v=d_v)
    w = b.plan.wgmma
    assert w is not None and w.split is not None and w.pieces == ()
    assert [t.n for t in b.plan.tails] == [d_v, d]  # (the accumulators' order: dv, dk)
    assert {g.name: g.n_warp for g in b.plan.gemms} == {
        "st": 32, "dv": d_v // 2, "dpt": 32, "dk": d // 2, "dq": d // 2}
    for n in (d, d_v):
        assert f"const int acc_col0_{n} = consumer * (kNAcc{n} / kConsumers);" in b.source
    _compiles(b)
