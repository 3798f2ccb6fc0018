"""FP8 block scales (`scale A by SA 1x128`, `scale B by SB 128x128`): the clause, verify's
located errors, the reference (the float64 product of the dequantized operands), the plan (a k
tile promoted alone, the schedules that cannot refused at their line), the launch's shape
checks, and the emitted kernel (slow: NVRTC without spills)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.verify import verify

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "gemm_fp8_blockwise.kg"

TEXT = """\
kernel f {
  target sm_90a
  tensor A : ADT[M, K] row
  tensor B : f8e4m3[K, N] col
  tensor SA : f32[SASHAPE] col
  tensor SB : SBDT[NS, KS] row
  tensor D : bf16[M, N] row out
  gemm g = A @ B accumulate f32 {
    LINES
    scale A by SA ABLOCK
    scale B by SB 128x128
    epilogue { D = acc }
  }
}
"""


def text(adt="f8e4m3", sa_shape="M, KS", sb_dtype="f32", a_block="1x128", lines=""):
    return (TEXT.replace("ADT", adt).replace("SASHAPE", sa_shape).replace("SBDT", sb_dtype)
            .replace("ABLOCK", a_block).replace("LINES", lines))


def refusal(source: str) -> KgenError:
    with pytest.raises(KgenError) as info:
        verify(parse(source, "f.kg"))
    return info.value


def line_of(source: str, needle: str) -> int:
    return next(i for i, line in enumerate(source.splitlines(), 1) if needle in line)


def built(source: str):
    from kgen.api import build

    return build(parse(source, "f.kg").kernels[0], source_name="f.kg")


# -- the clause and verify ------------------------------------------------------------------------


def test_the_clause_parses_into_block_scales_with_their_lines():
    g = parse(text(), "f.kg").kernels[0].gemms[0]
    assert [(s.operand, s.param, s.block) for s in g.scales] == [("A", "SA", (1, 128)),
                                                                ("B", "SB", (128, 128))]
    assert g.scales[0].loc.line == line_of(text(), "scale A") and g.scales[0].param_loc.col == 16


def test_the_example_verifies():
    verify(parse(EXAMPLE.read_text(), str(EXAMPLE)))


def test_a_16_bit_operand_takes_no_block_scale():
    source = text(adt="bf16").replace("f8e4m3[K, N]", "bf16[K, N]")
    err = refusal(source)
    assert "block scales dequantize FP8 operands" in str(err) and "'A' is bf16" in str(err)
    assert err.loc.line == line_of(source, "scale A")


@pytest.mark.parametrize("block, which", [("128x128", "A"), ("1x64", "A")])
def test_a_granularity_other_than_the_recipe_is_refused(block, which):
    source = text(a_block=block)
    err = refusal(source)
    assert f"scale A by SA {block}: A takes 1x128 blocks" in str(err)
    assert err.loc.line == line_of(source, "scale A")


def test_b_takes_128x128_blocks():
    source = text().replace("scale B by SB 128x128", "scale B by SB 1x128")
    err = refusal(source)
    assert "B takes 128x128 blocks" in str(err)


@pytest.mark.parametrize("shape, needle", [
    ("M, K", "dimension 1: ceil(K / 128), a size of its own, not K"),
    ("N, KS", "dimension 0: M (A's rows), not N"),
])
def test_a_scale_tensor_of_the_wrong_shape_is_refused_at_its_name(shape, needle):
    source = text(sa_shape=shape)
    err = refusal(source)
    assert needle in str(err)
    assert (err.loc.line, err.loc.col) == (line_of(source, "scale A"), 16)


def test_scales_are_f32():
    err = refusal(text(sb_dtype="bf16"))
    assert "'SB' at line 6 is bf16; block scales are f32" in str(err)


def test_fixed_sizes_must_give_the_block_counts():
    source = text(sa_shape="M, 3").replace("[M, K] row", "[M, 384] row").replace(
        "[K, N] col", "[384, N] col").replace("[NS, KS]", "[NS, 3]")
    verify(parse(source, "f.kg"))  # 384 / 128 = 3 blocks
    err = refusal(source.replace("f32[M, 3]", "f32[M, 4]"))
    assert "dimension 1: 3, not 4" in str(err)


@pytest.mark.parametrize("change, needle", [
    (("scale A by SA", "scale C by SA"), "gemm 'g' multiplies 'A' and 'B'"),
    (("scale A by SA", "scale A by SX"), "no parameter 'SX'"),
    (("tensor SA : f32[M, KS] col", "vector SA : f32[M]"), "must be an input tensor"),
    (("scale B by SB 128x128", "scale A by SB 1x128"), "scale A given twice in gemm 'g'"),
])
def test_clause_mistakes_are_located(change, needle):
    source = text().replace(*change)
    err = refusal(source)
    assert needle in str(err)
    assert err.loc is not None and err.loc.line > 0


# -- the reference ---------------------------------------------------------------------------------


def test_reference_is_the_product_of_the_dequantized_operands():
    from kgen.api import build_file
    from kgen.harness.inputs import make_inputs, resolve_sizes
    from kgen.reference import evaluate, round_to

    kernel = build_file(EXAMPLE).kernel
    sizes = resolve_sizes(kernel, dict(M=37, N=200, K=300))
    assert (sizes["KS"], sizes["NS"]) == (3, 2)
    inputs = make_inputs(kernel, sizes, np.random.default_rng(5))
    a, b = inputs["A"].astype(np.float64), inputs["B"].astype(np.float64)
    sa, sb = inputs["SA"].astype(np.float64), inputs["SB"].astype(np.float64)
    want = np.zeros((37, 200))
    for kb in range(3):  # block by block, as the kernel promotes them
        ks = slice(128 * kb, 128 * (kb + 1))
        for nb in range(2):
            ns = slice(128 * nb, 128 * (nb + 1))
            want[:, ns] += (a[:, ks] @ b[ks, ns]) * sa[:, kb:kb + 1] * sb[nb, kb]
    got = evaluate(kernel, inputs)["D"]
    assert np.array_equal(got.astype(np.float64), round_to(want, ir.DType.BF16))


# -- the plan ----------------------------------------------------------------------------------------


def test_the_builder_plans_a_promoted_tile():
    plan = built(text()).plan
    g, gs = plan.gemms[0], plan.schedule.gemms[0]
    assert g.tile[:2] == (128, 192) and gs.promotion.k_tiles == 1
    assert gs.promotion.scales == ("A by SA 1x128 (col)", "B by SB 128x128 (row)")
    assert [(s.operand, s.param, s.layout) for s in g.scales] == [
        ("A", "SA", ir.Layout.COL), ("B", "SB", ir.Layout.ROW)]
    assert [(r.dim, r.of) for r in plan.block_dims] == [("KS", "K"), ("NS", "N")]
    rows = {r[0]: r for r in gs.promotion.describe("g")}
    assert "scale loads say who" in rows["g block scales"][2]
    assert rows["g scale loads"][1] == "consumers' __ldg"
    assert "k tile two before" in rows["g scale loads"][2] and "993" in rows["g scale loads"][2]


@pytest.mark.parametrize("lines, needle, where", [
    ("tile 128x256x128  warps 2x4  stages 4", "holds 128, more than 96", "tile"),
    ("tile 128x176x128  warps 2x4  stages 4", "tile N 176 is not one the scales", "tile"),
    ("tile 128x128x128  warps 2x4  stages 5  split 4", "split-K and stream-K are not built",
     "split"),
])
def test_schedules_that_cannot_apply_the_scales_are_refused_at_their_line(lines, needle, where):
    source = text(lines=lines)
    with pytest.raises(KgenError) as info:
        built(source)
    assert needle in str(info.value)
    assert info.value.loc.line == line_of(source, where)


def test_the_launch_checks_the_block_counts():
    from kgen.errors import ArgumentError
    from kgen.runtime.launch import bind_arguments

    from tests.test_fp8 import _array

    plan = built(text()).plan

    def args(ks, ns, k=384, n=256):
        return dict(A=_array((64, k), ir.DType.F8E4M3, strides=(k, 1)),
                    B=_array((k, n), ir.DType.F8E4M3, strides=(1, k)),
                    SA=_array((64, ks), ir.DType.F32, strides=(1, 64)),
                    SB=_array((ns, ks), ir.DType.F32, strides=(ks, 1)),
                    D=_array((64, n), ir.DType.BF16, strides=(n, 1)))

    bound = bind_arguments(plan, args(3, 2), device_of=lambda ptr: None)
    assert (bound.sizes["KS"], bound.sizes["NS"]) == (3, 2)
    with pytest.raises(ArgumentError, match=r"KS = 2 but K = 384: SA holds one scale per 128 "
                                            r"of K, so KS must be ceil\(K / 128\) = 3"):
        bind_arguments(plan, args(2, 2), device_of=lambda ptr: None)
    with pytest.raises(ArgumentError, match=r"NS = 1 but N = 256"):
        bind_arguments(plan, args(3, 1), device_of=lambda ptr: None)


def test_the_launcher_checks_the_block_counts_too():
    source = built(text()).source
    assert 'if (p.KS != (p.K + 127) / 128) return "KS must be ceil(K / 128)' in source
    assert 'if (p.NS != (p.N + 127) / 128) return "NS must be ceil(N / 128)' in source


def one_set(b):
    """The built kernel's plan with one period set (the plan option), re-emitted."""
    from kgen.emit import emit
    from kgen.plan import PeriodSets
    from kgen.targets.sm90.promotion import with_period_sets

    plan = with_period_sets(b.plan, PeriodSets.ONE)
    return plan, emit(plan, source_name="f.kg", source_hash="0", command="test")


def test_the_kernel_reads_the_scales_two_k_tiles_ahead():
    b = built(text())
    _, one = one_set(b)
    for source in (b.source, one):  # the rulebook's period halves, one period set
        assert "__ldg(p.SA + static_cast<long long>(kb) * p.ld_SA + r)" in source  # column-major
        assert "__ldg(p.SB + static_cast<long long>(n_block) * p.ld_SB + kb)" in source
        assert "if (kt + 2 < k_tiles) load_block_scales(p, kt + 2," in source
        # tile N 192 spans two of B's blocks: both scales, the n8 groups from j_split take the
        # next, a case of promote_columns per split a tile can have (16: B's block starts with
        # the tile)
        assert "const int j_split = min((128 - n0 % 128) / 8, kFragN);" in source
        assert "case 16:\n" in source
        assert "? scale_01 : scale_00" not in source.split("kernel_body")[1]  # no select per k tile
        assert "sb[1] = 128 * (n_block + 1) < N ? __ldg(p.SB + " in source
    assert "promote_columns<0, kFragN, 8>(acc[i], period_acc[i]" in one
    assert "promote_columns<kFragN / 2, kFragN / 2, 8>(acc[0], period_hi" in b.source


def test_a_tile_within_one_b_block_reads_one_b_scale():
    source = built(text(lines="tile 128x128x128  warps 2x4  stages 6")).source
    assert "j_split" not in source and "float (&sb)[1]" in source


@pytest.mark.slow
def test_the_example_compiles_without_spills_or_serialized_wgmma(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.api import build_file
    from kgen.runtime.nvrtc import compile_cubin

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    b = build_file(EXAMPLE)
    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0 and result.stack_bytes == 0
    assert "serialized" not in result.log and "warning" not in result.log.lower(), result.log


def overlapped(turns, early, lines=""):
    """The example's plan (or a written schedule's) with the promotion overlap set, re-emitted."""
    from kgen.emit import emit
    from kgen.targets.sm90.promotion import with_promotion_overlap

    from kgen.api import build_file

    b = built(text(lines=lines)) if lines else build_file(EXAMPLE)
    plan = with_promotion_overlap(b.plan, turns, early)
    return plan, emit(plan, source_name="f.kg", source_hash="0", command="test")


def test_the_rulebook_keeps_the_measured_order_and_says_why():
    from kgen.api import build_file
    from kgen.plan import PeriodSets

    promotion = build_file(EXAMPLE).plan.schedule.gemms[0].promotion
    assert not promotion.turns and not promotion.early_release
    assert promotion.sets is PeriodSets.HALVES and "1105 TFLOP/s" in promotion.why_sets
    assert "options of one period set" in promotion.why_overlap
    rows = build_file(EXAMPLE).plan.schedule.gemms[0].describe()
    assert any(r[0] == "mma0 promotion overlap" and r[1] == "none" for r in rows)
    assert any(r[0] == "mma0 period sets" and r[1] == "halves" for r in rows)
    # one period set (a tile under 128 columns): the overlap options, timed and not taken
    narrow = built(text(lines="tile 128x64x128  warps 2x4  stages 8")).plan
    promotion = narrow.schedule.gemms[0].promotion
    assert promotion.sets is PeriodSets.ONE and "not timed on such tiles" in promotion.why_sets
    assert "neither is taken" in promotion.why_overlap


def test_turns_order_the_consumers_groups_and_balance_the_barriers():
    plan, source = overlapped(True, False)
    assert plan.schedule.gemms[0].promotion.turns
    loop = source.split("bool turned = false;")[1]
    # each k tile: wait for the turn after the full barrier, pass it after the commit
    assert loop.count("if (consumer == 1 || turned) turn_wait(consumer);") == 2  # even, odd
    assert loop.count("turn_pass(consumer);  // the other consumer's turn") == 2
    assert loop.index("turn_wait(consumer);") < loop.index("wgmma_fence();") \
        < loop.index("wgmma_commit();") < loop.index("turn_pass(consumer);")
    # consumer 1's pass after its last k tile is absorbed once the walk ends
    assert "if (consumer == 0 && turned) turn_wait(consumer);" in loop
    assert '"bar.sync %0, %1;\\n" ::"r"(4 + consumer)' in source
    assert '"bar.arrive %0, %1;\\n" ::"r"(5 - consumer)' in source
    # the slot release stays where it was
    assert "if (kt > 0 && releaser) release_slot<kNarrow>(empty + 8 * ((it - 1) % kStages));" in \
        source or "if (kt > 0 && tid % kWarpgroupThreads == 0) mbarrier_arrive(empty + 8 * ((it - 1)" \
        in source


def test_early_release_frees_the_slot_at_its_wait():
    plan, source = overlapped(False, True)
    assert "turn_wait" not in source
    body = source.split("wgmma_wait<0>();  // the k tile's sums")[1].split("load_block_scales(p, kt + 2")[0]
    assert "(empty + 8 * s);  // k tile kt's group is done: its slot may be refilled" in body
    assert "((it - 1) % kStages)" not in body
    after = source.split("if (kPingpong && tid % kWarpgroupThreads == 0) mbarrier_arrive(turn")[1]
    assert "((it - 1) % kStages)" not in after.split("// Epilogue")[0]  # no second release


def test_turns_need_the_cooperative_consumers():
    from kgen.targets.sm90.promotion import with_promotion_overlap

    b = built(text(lines="tile 64x64x128  warps 2x4  stages 8").replace(
        "  target sm_90a\n", "  target sm_90a\n  schedule pingpong\n"))
    promotion = b.plan.schedule.gemms[0].promotion
    assert not promotion.turns and "no turns" in promotion.why_overlap
    with pytest.raises(ValueError, match="cooperative"):
        with_promotion_overlap(b.plan, True, False)
    assert with_promotion_overlap(b.plan, False, True).schedule.gemms[0].promotion.early_release


@pytest.mark.slow
@pytest.mark.parametrize("lines", ["", "tile 128x128x128  warps 2x4  stages 6"],
                         ids=["builder", "128x128"])
@pytest.mark.parametrize("turns, early", [(True, False), (False, True), (True, True)])
def test_the_overlap_compiles_without_spills_or_serialized_wgmma(lines, turns, early, tmp_path,
                                                                  monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.runtime.nvrtc import compile_cubin

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    plan, source = overlapped(turns, early, lines)
    assert "wgmma.mma_async.sync.aligned.m64n" in source and ".f32.e4m3.e4m3 " in source
    for entry in (plan.name, plan.name + "_narrow"):
        result = compile_cubin(source, entry, "sm_90a")
        assert result.spill_stores == 0 and result.spill_loads == 0 and result.stack_bytes == 0
        assert "serialized" not in result.log and "warning" not in result.log.lower(), result.log
