"""Tile programs' lowering (kgen/lower/program.py): the plan's statements, its numbers (tiles,
ring slots, shared-memory offsets, swizzles, fragment loads), the rulebook's choices and
refusals, and the rank rules (a per-element value where a per-row one is needed)."""
from __future__ import annotations

import dataclasses
import itertools
import math

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.errors import KgenError, SourceLoc
from kgen.lower import lower
from kgen.lower.program import smem_tile
from kgen.plan import program as pp
from kgen.plan.program import Rank
from kgen.targets import target
from kgen.targets import loop_rules

from tests import loop_kernels as lk


def kinds(section):
    return [type(s).__name__ for s in section.statements]


def test_attention_plan_numbers():
    plan = lower(lk.attention(128, causal=True))
    assert isinstance(plan, pp.LoopPlan)
    # 4 warps of 32 rows (two m16 tiles sharing each B fragment); a block of 32 keeps them in
    # ptxas' 255 registers at head dim 128
    assert (plan.tile_m, plan.block, plan.warps, plan.stages) == (128, 32, 4, 2)
    assert plan.threads == 128 and plan.rows_dim == "S" and plan.loop_dim == "T"
    assert plan.min_ctas.value == "2"
    # Q once; per slot a [32, 128] K block (rows along T) and a [32, 128] V block
    assert (plan.a_tile.offset, plan.a_tile.bytes) == (0, 128 * 128 * 2)
    assert (plan.b_tile.offset, plan.b_tile.rows, plan.b_tile.cols, plan.b_tile.slots) == (
        32768, 32, 128, 2)
    assert (plan.c_tile.offset, plan.c_tile.bytes) == (32768 + 16384, 16384)
    assert plan.smem_bytes == 65536
    assert all(t.chunks == 16 and t.swizzle_mask == 7 and t.swizzle_shift == 0
               for t in (plan.a_tile, plan.b_tile, plan.c_tile))
    # K^T from K's row-major rows: [n][k] (ldmatrix); V row-major: [k][n] (ldmatrix.trans)
    assert plan.gemm0.b_load is pp.FragmentLoad.N_MAJOR and plan.b_tile.rows_along_loop
    assert plan.gemm1.b_load is pp.FragmentLoad.K_MAJOR and plan.c_tile.rows_along_loop
    assert (plan.gemm0.k_steps, plan.gemm0.n8_tiles) == (8, 4)
    assert (plan.gemm1.k_steps, plan.gemm1.n8_tiles) == (2, 16)
    assert plan.carries == (("m", -math.inf), ("l", 0.0))
    assert plan.mma.value == "mma.sync.m16n8k16"
    assert plan.kv_param is None and plan.heads_param == "Q" and plan.batch_param == "Q"


def test_attention_body_is_the_statements_in_order():
    plan = lower(lk.attention(64, causal=True))
    assert kinds(plan.body) == ["GemmStep", "Compute", "HandOn", "Compute", "UpdateCarry",
                                "Rescale", "UpdateCarry", "GemmStep"]
    assert [s.gemm.name for s in plan.body.statements if isinstance(s, pp.GemmStep)] == [
        "s", "o"]
    updates = [s for s in plan.body.statements if isinstance(s, pp.UpdateCarry)]
    assert [u.carry for u in updates] == ["l", "m"]
    values = plan.body.values
    reductions = [v for v in values if isinstance(v.kind, pp.RowReduction)]
    assert [r.kind.op for r in reductions] == [ir.ReduceOp.MAX, ir.ReduceOp.SUM]
    assert all(r.rank is Rank.ROW and values[r.kind.arg].rank is Rank.TILE for r in reductions)
    # the rescale factor and the carries' new values are per row; the handed value per element
    rescale = next(s for s in plan.body.statements if isinstance(s, pp.Rescale))
    hand = next(s for s in plan.body.statements if isinstance(s, pp.HandOn))
    assert values[rescale.value].rank is Rank.ROW
    assert values[hand.value].rank is Rank.TILE and hand.dtype is ir.DType.BF16
    # every value is computed once, after its arguments
    computed = [i for s in plan.body.statements if isinstance(s, pp.Compute) for i in s.values]
    assert len(computed) == len(set(computed))
    for i in computed:
        kind = values[i].kind
        args = getattr(kind, "args", ()) or ((kind.arg,) if hasattr(kind, "arg") else ())
        assert all(a < i for a in args)
    assert kinds(plan.epilogue) == ["Compute", "StoreTile", "Compute", "StoreRow"]


def test_a_carry_read_after_its_update_is_the_new_value():
    """`m` before and after `m = m_new` are different values, never shared."""
    plan = lower(lk.attention(64))
    carry = next(v.id for v in plan.body.values if v.kind == pp.CarryValue("m"))
    update = next(s for s in plan.body.statements
                  if isinstance(s, pp.UpdateCarry) and s.carry == "m")
    assert update.value != carry


@pytest.mark.parametrize("layout, b_load, c_load, b_along, c_along", [
    (ir.Layout.COL, pp.FragmentLoad.N_MAJOR, pp.FragmentLoad.N_MAJOR, True, False),
    (ir.Layout.ROW, pp.FragmentLoad.K_MAJOR, pp.FragmentLoad.K_MAJOR, False, True),
])
def test_mlp_operand_layouts(layout, b_load, c_load, b_along, c_along):
    plan = lower(lk.mlp(w_layout=layout))
    assert plan.gemm0.b_load is b_load and plan.b_tile.rows_along_loop is b_along
    assert plan.gemm1.b_load is c_load and plan.c_tile.rows_along_loop is c_along
    # a tile along the loop's columns is [fixed rows][block]
    tile = plan.b_tile if not b_along else plan.c_tile
    assert tile.cols == plan.block
    assert plan.heads_param is None and plan.batch_param is None
    assert kinds(plan.body) == ["GemmStep", "Compute", "HandOn", "GemmStep"]
    assert plan.smem_bytes == loop_rules.smem_bytes(
        loop_rules.LoopConfig(plan.tile_m, plan.block, plan.stages), 256, 128, ir.DType.BF16)


def test_written_schedule_is_kept():
    plan = lower(lk.attention(64, tile=(64, 32), stages=3))
    assert (plan.tile_m, plan.block, plan.warps, plan.stages) == (64, 32, 4, 3)
    assert plan.b_tile.chunks == 8 and plan.b_tile.rows == 32
    assert plan.config.why.startswith("the source's lines")


def test_warps_own_32_rows_where_the_registers_allow():
    # the rulebook's default: 4 warps of two m16 tiles each, sharing every B fragment
    plan = lower(lk.attention(64))
    assert (plan.tile_m, plan.block, plan.warps) == (128, 64, 4)
    assert plan.config.value == "tile 128x64 warps 4 stages 2"
    source = build_verified(lk.attention(64), ir.Arch.SM80).source
    assert "constexpr int kWarpRows = 32;" in source and "constexpr int kMTiles = 2;" in source
    # a written tile with its warps (16 rows each) is kept
    plan = lower(lk.attention(64, tile=(128, 64), stages=2))
    assert (plan.tile_m, plan.warps) == (128, 8)
    assert "constexpr int kMTiles = 1;" in build_verified(
        lk.attention(64, tile=(128, 64), stages=2), ir.Arch.SM80).source
    # a long score chain (softcap, ALiBi and a mask: 13 values per element) falls back to 16
    plan = lower(lk.attention(128, gqa=True, softcap=50.0, alibi=True, causal=True))
    assert (plan.warps, plan.block) == (8, 64)


def test_rulebook_rows_per_warp():
    tgt = target(ir.Arch.SM80)
    config, _ = loop_rules.default(128, 128, ir.DType.BF16, tgt)
    assert (config.warp_rows, config.block, config.warps) == (32, 32, 4)
    config, _ = loop_rules.default(128, 128, ir.DType.BF16, tgt, tile_values=13)
    assert (config.warp_rows, config.block, config.warps) == (16, 64, 8)
    config, _ = loop_rules.default(64, 64, ir.DType.BF16, tgt, warps=8)
    assert (config.warp_rows, config.tile_m) == (16, 128)
    assert "rows a warp" in loop_rules.refusal(loop_rules.LoopConfig(128, 64, 2, 48), 64, 64,
                                               ir.DType.BF16, tgt)
    assert "32 rows a warp needs about" in loop_rules.refusal(
        loop_rules.LoopConfig(128, 64, 2, 32), 128, 128, ir.DType.BF16, tgt)
    assert loop_rules.min_ctas_per_sm(loop_rules.LoopConfig(128, 32, 2, 32), 128)[0] == 2


def test_rulebook_one_slot_each_at_head_dim_256():
    # two slots of 64 do not fit beside 128 rows of D 256: 64 rows in 4 warps, one slot each of
    # K and V (copied and waited apart), two CTAs an SM; the why says so
    tgt = target(ir.Arch.SM80)
    config, why = loop_rules.default(256, 256, ir.DType.BF16, tgt, tile_values=7)
    assert (config.tile_m, config.block, config.stages, config.warps) == (64, 64, 1, 4)
    assert "one slot each" in why
    assert loop_rules.min_ctas_per_sm(config, 256)[0] == 2
    # a long score chain (13 values per element) is past the budget there: two slots of 32
    config, why = loop_rules.default(256, 256, ir.DType.BF16, tgt, tile_values=13)
    assert (config.tile_m, config.block, config.stages, config.warps) == (128, 32, 2, 8)
    assert "one slot" not in why
    # the skeleton: the first block's K before the loop, V waited apart before the second gemm
    source = build_verified(lk.attention(256, causal=True), ir.Arch.SM80).source
    assert "load_b_smem(smem, g_K, p.K_ld, first_block, loop_len);" in source
    assert source.count("load_c_smem(smem, g_V, p.V_ld, block, loop_len);") == 4  # per run
    assert "cp_async_wait<kStages - 1>" not in source


def test_a_schedule_past_shared_memory_is_refused_where_written():
    loc = SourceLoc("mlp.kg", 9, 3, 9, 20)
    kernel = lk.mlp(256, 256, tile=(128, 128), stages=3)
    kernel = dataclasses.replace(kernel, loop=dataclasses.replace(kernel.loop, loc=loc))
    with pytest.raises(KgenError, match="shared memory") as err:
        lower(kernel)
    assert err.value.loc == loc


@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A, ir.Arch.SM86])
@pytest.mark.parametrize("k0, n1", list(itertools.product((16, 64, 128, 256), (16, 64, 128, 256))))
def test_rulebook_has_a_legal_default(arch, k0, n1):
    config, why = loop_rules.default(k0, n1, ir.DType.BF16, target(arch))
    assert loop_rules.refusal(config, k0, n1, ir.DType.BF16, target(arch)) is None
    assert loop_rules.smem_bytes(config, k0, n1, ir.DType.BF16) <= target(arch).smem_limit
    assert "rulebook" in why


def test_rulebook_refusals_say_why():
    tgt = target(ir.Arch.SM80)
    assert "rows per CTA" in loop_rules.refusal(loop_rules.LoopConfig(32, 64, 2), 64, 64,
                                                ir.DType.BF16, tgt)
    assert "block" in loop_rules.refusal(loop_rules.LoopConfig(64, 16, 2), 64, 64,
                                         ir.DType.BF16, tgt)
    assert "1 to 3" in loop_rules.refusal(loop_rules.LoopConfig(64, 64, 4), 64, 64,
                                          ir.DType.BF16, tgt)
    assert "registers" in loop_rules.refusal(loop_rules.LoopConfig(64, 128, 1), 64, 256,
                                             ir.DType.BF16, tgt)


def test_a_per_element_value_cannot_update_a_row_carry():
    kernel = lk.attention(64)
    g0 = kernel.loop.gemms[0]
    loc = SourceLoc("a.kg", 12, 9, 12, 30)
    stmts = tuple(ir.Update("l", ir.Acc(), loc) if isinstance(s, ir.Update) and s.name == "l"
                  else s for s in g0.epilogue.stmts)
    g0 = dataclasses.replace(g0, epilogue=ir.Epilogue(stmts))
    kernel = dataclasses.replace(kernel, loop=dataclasses.replace(
        kernel.loop, gemms=(g0, kernel.loop.gemms[1])))
    with pytest.raises(KgenError, match="needs a value per row") as err:
        lower(kernel)
    assert err.value.loc == loc


def test_the_accumulator_is_only_rescaled():
    kernel = lk.attention(64)
    g0 = kernel.loop.gemms[0]
    stmts = tuple(ir.Update("o", lk.call(ir.Op.ADD, lk.ref("o"), lk.ref("r")))
                  if isinstance(s, ir.Update) and s.name == "o" else s for s in g0.epilogue.stmts)
    g0 = dataclasses.replace(g0, epilogue=ir.Epilogue(stmts))
    kernel = dataclasses.replace(kernel, loop=dataclasses.replace(
        kernel.loop, gemms=(g0, kernel.loop.gemms[1])))
    with pytest.raises(KgenError, match="may only be rescaled"):
        lower(kernel)


def test_gqa_plan_marks_the_kv_parameters():
    plan = lower(lk.attention(64, gqa=True))
    assert {p.name for p in plan.params if p.kv} == {"K", "V"}
    assert plan.kv_param == "K" and plan.heads_param == "Q"


def test_row_kernel_plan():
    plan = lower(lk.rowdot(256))
    assert isinstance(plan, pp.RowsPlan)
    assert (plan.warps, plan.rows_per_cta, plan.chunks, plan.lane_chunks) == (4, 4, 32, 1)
    assert kinds(plan.body) == ["Compute", "StoreRow"]
    reduction = next(v for v in plan.body.values if isinstance(v.kind, pp.RowReduction))
    assert reduction.kind.op is ir.ReduceOp.SUM and reduction.rank is Rank.ROW
    assert lower(lk.rowdot(72)).lane_chunks == 1 and lower(lk.rowdot(264 * 2)).lane_chunks == 3


def test_row_kernel_columns_must_be_chunks():
    with pytest.raises(KgenError, match="multiple of 8"):
        lower(lk.rowdot(20))


# ---------------------------------------------------------------------------------------------
# The swizzle: conflict-free for the accesses the skeleton makes (the helpers' formula)


def _offset(tile: pp.SmemTile, row: int, chunk: int) -> int:
    return (row * tile.chunks + (chunk ^ ((row >> tile.swizzle_shift) & tile.swizzle_mask))) * 16


def _tiles():
    """Every tile shape a loop plans: rows tile_m, block or K0/N1; columns K0/N1 or block."""
    for rows, cols in itertools.product((16, 32, 64, 128, 256),
                                        (16, 32, 48, 64, 80, 96, 128, 160, 192, 224, 256)):
        yield smem_tile("t", "P", rows, cols, 1, ir.DType.BF16, 0, True)


def test_swizzle_is_a_bijection_and_conflict_free():
    for tile in _tiles():
        offsets = {_offset(tile, r, c) for r in range(tile.rows) for c in range(tile.chunks)}
        assert offsets == {16 * i for i in range(tile.rows * tile.chunks)}, tile
        # ldmatrix: 8 rows (a multiple of 8 on) at one chunk read 32 distinct banks
        for row0, chunk in itertools.product(range(0, tile.rows, 8), range(tile.chunks)):
            banks = {(_offset(tile, row0 + r, chunk) // 4 + w) % 32
                     for r in range(8) for w in range(4)}
            assert len(banks) == 32, (tile, row0, chunk)
        # cp.async: 8 consecutive threads' 16-byte chunks (row-major order) write 32 banks
        for start in range(0, tile.rows * tile.chunks, 8):
            banks = {(_offset(tile, c // tile.chunks, c % tile.chunks) // 4 + w) % 32
                     for c in range(start, start + 8) for w in range(4)}
            assert len(banks) == 32, (tile, start)
