"""Back-to-back gemms (issue 5): each chain rule's located message, the storage map of both
residencies, the register repacking of accumulators as A fragments, and bank-conflict-free
writes and ldmatrix reads of the shared intermediate tile."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import lower, swizzle
from kgen.lower.fragments import LDMATRIX
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import EXAMPLES, from_template

TEXT = """\
kernel b2b {
  target sm_80
  tensor A : f16[M, 576] row
  tensor B0 : f16[576, N0x] col
  tensor B1 : B1TYPE[K1x, 128] col
  tensor D1 : f16[M, 128] row out
  vector bias0 : f32[N0x]
  gemm g0 = A @ B0 {
    tile G0TILE warps G0WARPS stages S0x
    epilogue { g0 = relu(acc + bias0[col]) }
  }
  gemm g1 = g0 @ B1 {
    tile G1TILE warps G1WARPS stages 2
    KEEP
    epilogue { D1 = EPI }
  }
}
"""
DEFAULTS = dict(N0x="64", K1x="64", S0x="3", B1TYPE="f16", G0TILE="128x64x32", G0WARPS="4x1",
                G1TILE="128x128x32", G1WARPS="4x1", KEEP="keep registers", EPI="relu(acc)")


def kernel(**changes) -> ir.Kernel:
    return from_template(TEXT, DEFAULTS, **changes)


def error(**changes) -> tuple[int, str]:
    with pytest.raises(KgenError) as info:
        lower(kernel(**changes))
    return info.value.loc.line, info.value.message


def test_the_default_chain_lowers():
    plan = lower(kernel())
    g0, g1 = plan.gemms
    assert g0.chain is None and g1.chain.residency is ir.Residency.REGISTERS
    assert g1.a is None and g1.chain.k == 64 and g1.chain.k_steps == 4
    assert plan.grid({"M": 1000}) == (8, 1, 1)  # one CTA per (tile M, tile N1)


@pytest.mark.parametrize("changes,line,message", [
    (dict(G1TILE="64x128x32", G1WARPS="2x1", G0WARPS="2x1"), 13,
     "CTA tile M must be the same in every stage (g0 128, g1 64): a CTA keeps the same rows "
     "through the chain"),
    (dict(N0x="64", G0TILE="128x32x32"), 9,
     "CTA tile N of g0 (32) must equal its N (64): a stage that feeds g1 computes its whole "
     "output row in one CTA"),
    (dict(G1WARPS="2x2", G0WARPS="2x2"), 9,
     "keep registers needs every warp to own whole rows: warps of g0 must be Nx1, got 2x2 "
     "(or keep g0 in smem)"),
    (dict(G1WARPS="2x2"), 13,
     "keep registers needs every warp to own whole rows: warps of g1 must be Nx1, got 2x2 "
     "(or keep g0 in smem)"),
    (dict(G1WARPS="8x1"), 13,
     "every stage of a chain runs on the same warps: g0 has 4 (4x1), g1 has 8 (8x1)"),
    (dict(G1TILE="128x128x128"), 13, "tile K of g1 (128) must divide its K, the N of g0 (64)"),
    (dict(EPI="acc", KEEP="keep smem", G1TILE="128x128x64", G1WARPS="2x2", G0WARPS="4x2",
          G0TILE="128x96x32"), 9,
     "CTA tile N of g0 (96) must equal its N (64): a stage that feeds g1 computes its whole "
     "output row in one CTA"),
])
def test_each_chain_rule_has_a_located_message(changes, line, message):
    assert error(**changes) == (line, message)


def test_symbolic_n0_is_refused():
    line, message = error(N0x="N0", K1x="N0")
    assert line == 9 and message.startswith("the N of g0 (N0) must be a fixed size")


def test_mixed_operand_dtypes_are_refused():
    with pytest.raises(KgenError) as info:
        k = kernel()
        a, b0, b1, *rest = k.params
        b0 = ir.Param("B0", b0.kind, ir.DType.BF16, b0.shape, b0.layout)
        a = ir.Param("A", a.kind, ir.DType.BF16, a.shape, a.layout)
        lower(ir.Kernel(k.name, k.target, (a, b0, b1, *rest), k.gemms))
    assert info.value.message == "every stage of a chain must use one operand dtype (g0 bf16, g1 f16)"


def test_reductions_in_a_chain_are_refused():
    k = kernel()
    rowsum = ir.Param("r", ir.ParamKind.VECTOR, ir.DType.F32, ("M",), role=ir.Role.OUT)
    g1 = k.gemms[1]
    stmts = g1.epilogue.stmts + (ir.Store("r", ir.Reduce(ir.ReduceOp.SUM, ir.Axis.ROW, ir.Acc())),)
    g1 = ir.Gemm(g1.name, g1.a, g1.b, g1.acc_dtype, g1.tile, g1.warps, g1.stages,
                 ir.Epilogue(stmts), g1.keep)
    with pytest.raises(KgenError, match="reductions in a kernel of chained gemms"):
        lower(ir.Kernel(k.name, k.target, k.params + (rowsum,), (k.gemms[0], g1)))


def test_keep_defaults_to_registers_when_warps_own_rows_else_smem():
    assert lower(kernel(KEEP="")).gemms[1].chain.residency is ir.Residency.REGISTERS
    plan = lower(kernel(KEEP="", G1WARPS="2x2", G0WARPS="2x2"))
    assert plan.gemms[1].chain.residency is ir.Residency.SMEM


# -- storage ------------------------------------------------------------------------------------


def _buffers(plan):
    return {b.name: b for b in plan.storage.buffers}


def _live(plan, b):
    return plan.storage.live_text(b)


def test_storage_map_registers():
    plan = lower(kernel(), persistent=False)
    assert not plan.schedule.scheduler.persistent
    bufs = _buffers(plan)
    assert sorted(bufs) == ["g0_a_smem", "g0_b_smem", "g1_b_smem"]  # no intermediate buffer
    assert plan.storage.phases == ("g0.mainloop", "g0.epilogue", "g1.mainloop", "g1.epilogue")
    assert _live(plan, bufs["g0_a_smem"]) == _live(plan, bufs["g0_b_smem"]) == "g0.mainloop"
    assert _live(plan, bufs["g1_b_smem"]) == "g1.mainloop"
    # g1's stages reuse g0's dead stages: the total is g0's pipeline alone
    assert bufs["g1_b_smem"].shares_bytes(bufs["g0_a_smem"])
    assert plan.smem_bytes == bufs["g0_a_smem"].bytes + bufs["g0_b_smem"].bytes


def test_storage_map_registers_persistent():
    """The persistent kernel prefetches the next tile's g0 stages during g1: they live to the
    end and no longer share bytes with g1's stages."""
    plan = lower(kernel())
    assert plan.schedule.scheduler.persistent
    bufs = _buffers(plan)
    assert _live(plan, bufs["g0_a_smem"]) == _live(plan, bufs["g0_b_smem"]) \
        == "g0.mainloop..g1.epilogue"
    assert "next tile's first stages" in bufs["g0_a_smem"].role
    for x in bufs.values():
        for y in bufs.values():
            assert x is y or not (x.co_live(y) and x.shares_bytes(y)), (x.name, y.name)
    assert plan.smem_bytes == sum(b.bytes for b in bufs.values())


def test_persistent_grid_is_capped_by_the_resident_slots():
    plan = lower(kernel())
    assert plan.grid({"M": 128 * 1000}) == (1000, 1, 1)  # no device info: one CTA per tile
    assert plan.grid({"M": 128 * 1000}, persistent_ctas=264) == (264, 1, 1)
    assert plan.grid({"M": 1000}, persistent_ctas=264) == (8, 1, 1)
    assert lower(kernel(), persistent=False).grid({"M": 128 * 1000}, 264) == (1000, 1, 1)


def test_only_register_chains_persist():
    smem = lower(kernel(KEEP="keep smem", G0WARPS="2x2", G1WARPS="2x2"))
    assert not smem.schedule.scheduler.persistent


def test_persistent_source_loops_and_waits_exactly():
    from kgen.api import build
    from kgen.emit import emit

    src = build(kernel(), source_name="t.kg").source
    order = ["__device__ __forceinline__ void load_first_stages(", "const int tiles = tiles_m",
             "g0_cfg::load_first_stages(p, smem, load_m * g0_cfg::kTileM, M, blockIdx.x < tiles",
             "for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {",
             "// ---- g1 = g0 @ B1", "load_first_stages(p, smem, load_m * g0_cfg::kTileM, M, "
             "next_tile < tiles", "mma_step(acc, g1_a_frag[0]", "cudaDevAttrMultiProcessorCount"]
    positions = [src.index(s) for s in order]
    assert positions == sorted(positions)
    # g1 (stages 2, 2 k tiles): B1 tile 0, B1 tile 1 at k tile 0, then g0's 2 prefetched
    # groups (stages 3) behind the last B1 load; g0 keeps its own kStages - 2
    assert "cp_async_wait<0>();  // k tile 0's group" in src
    assert "cp_async_wait<2>();  // k tile 1's group" in src
    assert src.index("cp_async_wait<0>();  // k tile 0") < src.index("load_b_stage(b_smem + 1 *") \
        < src.index("load_first_stages(p, smem, load_m * g0_cfg::kTileM, M, next_tile")
    plain = emit(lower(kernel(), persistent=False), source_name="t.kg", source_hash="",
                 command="t")
    assert "gridDim.x" not in plain and "load_first_stages" not in plain
    assert "cp_async_wait<kStages - 2>();" in plain

    plan = lower(kernel(KEEP="keep smem", G0WARPS="2x2", G1WARPS="2x2"))
    bufs = _buffers(plan)
    inter = bufs["g0_smem"]
    assert sorted(bufs) == ["g0_a_smem", "g0_b_smem", "g0_smem", "g1_b_smem"]
    assert inter.bytes == 128 * 64 * 2 and inter.swizzle == plan.gemms[1].a.smem.swizzle
    assert _live(plan, inter) == "g0.epilogue..g1.mainloop"
    # the intermediate and g1's stages live together; both sit over g0's dead stages
    assert inter.co_live(bufs["g1_b_smem"]) and not inter.shares_bytes(bufs["g1_b_smem"])
    assert inter.shares_bytes(bufs["g0_a_smem"]) or inter.shares_bytes(bufs["g0_b_smem"])
    g0_bytes = bufs["g0_a_smem"].bytes + bufs["g0_b_smem"].bytes
    assert plan.smem_bytes == max(g0_bytes, inter.bytes + bufs["g1_b_smem"].bytes)
    for i, x in enumerate(plan.storage.buffers):
        for y in plan.storage.buffers[i + 1:]:
            assert not (x.co_live(y) and x.shares_bytes(y)), (x.name, y.name)


def test_storage_budget_names_the_chain_buffers():
    line, message = error(S0x="8", G0TILE="128x64x128")
    assert line == 9 and message.startswith("shared memory over budget: ")
    assert "g0_a_smem 262144 B (A stages of g0: 8 x 128x128 f16)" in message


# -- registers: accumulators are A fragments ---------------------------------------------------


def _acc_coord(lane, j, e):
    """(row, col) of accumulator register e of n8 tile j (m16n8, f32)."""
    return lane // 4 + 8 * (e // 2), j * 8 + (lane % 4) * 2 + e % 2


def _a_coord(lane, kk, r, h):
    """(row, k) of half h of A register r at k step kk (m16n8k16, row-major A)."""
    return lane // 4 + 8 * (r % 2), kk * 16 + 8 * (r // 2) + (lane % 4) * 2 + h


def test_accumulator_pairs_are_the_a_fragment_layout():
    """The emitted repacking, a[j / 2][(j % 2) * 2 + p] = pack(acc[j][2p], acc[j][2p + 1]),
    puts every accumulator where mma.m16n8k16 expects that (row, k) of A."""
    for lane in range(32):
        for j in range(8):
            for p in range(2):
                kk, r = j // 2, (j % 2) * 2 + p
                for h in range(2):
                    assert _acc_coord(lane, j, 2 * p + h) == _a_coord(lane, kk, r, h)


# -- smem: the intermediate tile ----------------------------------------------------------------


SMEM_PLANS = [
    ("2x2", lower(kernel(KEEP="keep smem", G0WARPS="2x2", G1WARPS="2x2"))),
    ("4x1", lower(kernel(KEEP="keep smem"))),
    ("bf16-64", lower(kernel(KEEP="keep smem", G0WARPS="2x2", G1WARPS="1x4",
                             G0TILE="128x64x32", G1TILE="128x128x32"))),
]


@pytest.mark.parametrize("label,plan", SMEM_PLANS, ids=[p[0] for p in SMEM_PLANS])
def test_intermediate_tile_is_a_conflict_free_bijection(label, plan):
    g0, g1 = plan.gemms
    tile = g1.a.smem
    eb = tile.dtype.nbytes
    assert swizzle.is_bijection(tile)
    fmap = LDMATRIX[("a", True)]
    warps_m, warps_n = g1.warps
    for warp in range(warps_m * warps_n):
        off = warp // warps_n * g1.warp_tile[0]
        for kk in range(g1.chain.k_steps):
            for f in range(g1.warp_tile[0] // 16):
                addrs = [tile.offset(*fmap.coord(lane, off, f, kk)) * eb for lane in range(32)]
                assert swizzle.max_bank_conflict(addrs, 16) == 1, (warp, kk, f)
    # g0's epilogue writes 4-byte pairs: rows lane/4 (+8), columns 2 * (lane % 4) of tile j
    for warp in range(g0.warps[0] * g0.warps[1]):
        wm, wn = warp // g0.warps[1], warp % g0.warps[1]
        for i in range(g0.frags[0]):
            for j in range(g0.frags[1]):
                for half in (0, 8):
                    addrs = [tile.offset(wm * g0.warp_tile[0] + i * 16 + lane // 4 + half,
                                         wn * g0.warp_tile[1] + j * 8 + (lane % 4) * 2) * eb
                             for lane in range(32)]
                    assert swizzle.max_bank_conflict(addrs, 4) == 1, (warp, i, j)


@pytest.mark.parametrize("label,plan", SMEM_PLANS, ids=[p[0] for p in SMEM_PLANS])
def test_intermediate_fragment_offsets_are_proved(label, plan):
    g1 = plan.gemms[1]
    tile = g1.a.smem
    fmap = LDMATRIX[("a", True)]
    threads = plan.schedule.warps.threads
    for t in range(threads):
        off = (t // 32) // g1.warps[1] * g1.warp_tile[0]
        base = tile.offset(*fmap.coord(t % 32, off, 0, 0))
        for kk, row in enumerate(g1.a.frag_steps):
            for f, (x, y) in enumerate(row):
                assert (base ^ x) + y == tile.offset(*fmap.coord(t % 32, off, f, kk))


# -- emission -----------------------------------------------------------------------------------


B2B_EXAMPLES = [p for p in EXAMPLES if p.stem.startswith("b2b")]


def test_there_are_b2b_examples_of_both_residencies_and_dtypes():
    assert {p.stem for p in B2B_EXAMPLES} >= {"b2b_gemm_rf", "b2b_gemm_smem", "b2b_gemm_rf_bf16",
                                              "b2b_gemm_smem_bf16"}


def test_chain_of_three_compiles_without_spills(tmp_path, monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    from kgen.api import build
    from kgen.runtime.nvrtc import compile_cubin
    from tests.gpu.test_b2b_gpu import CHAIN3

    module = parse(CHAIN3, "b2b3.kg")
    verify(module)
    built = build(module.kernels[0], source_name="b2b3.kg")
    assert [b.name for b in built.plan.storage.buffers] == [
        "g0_a_smem", "g0_b_smem", "g0_smem", "g1_b_smem", "g1_smem", "g2_b_smem"]
    assert "// ---- g2 = g1 @ B2" in built.source
    result = compile_cubin(built.source, built.plan.name, "sm_80")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_register_chain_source_reads_in_stage_order():
    from kgen.api import build

    src = build(kernel(), source_name="t.kg").source
    order = ["// ---- g0 = A @ B0", "Epilogue of g0 into registers", "// ---- g1 = g0 @ B1",
             "mma_step(acc, g1_a_frag[3], b_frag[1]);", "g1_epilogue(p, row, col"]
    positions = [src.index(s) for s in order]
    assert positions == sorted(positions)


# ---------------------------------------------------------------------------------------------
# keep B resident: both B operands loaded once per persistent CTA, a ring of A stages across tiles

RESIDENT = dict(S0x="4 keep B0 resident", KEEP="keep registers keep B1 resident",
                G0TILE="128x64x64")


def test_resident_plan_holds_all_of_each_b_and_a_ring_of_a():
    plan = lower(kernel(**RESIDENT))
    assert plan.schedule.scheduler.persistent and plan.schedule.resident
    bufs = _buffers(plan)
    assert sorted(bufs) == ["g0_a_smem", "g0_b_smem", "g1_b_smem"]
    assert bufs["g0_b_smem"].bytes == 576 * 64 * 2  # all 9 k tiles of B0
    assert bufs["g1_b_smem"].bytes == 64 * 128 * 2  # both k tiles of B1
    assert bufs["g0_a_smem"].bytes == 4 * 128 * 64 * 2  # the user's 4 stages, A only
    assert "resident" in bufs["g0_b_smem"].role and "ring" in bufs["g0_a_smem"].role
    last = len(plan.storage.phases) - 1
    for b in bufs.values():  # nothing is reused: every buffer lives through every phase
        assert b.live in ((0, last), (plan.storage.phases.index("g0.mainloop"), last)), b
        for other in bufs.values():
            assert b is other or not b.shares_bytes(other)
    assert plan.smem_bytes == sum(b.bytes for b in bufs.values())


def test_resident_source_loads_b_once_and_refills_the_ring_across_tiles():
    from kgen.api import build

    src = build(kernel(**RESIDENT), source_name="t.kg").source
    order = ["// Resident: all of B0, B1, loaded once", "g0_cfg::load_b_stage(g0_b + kt *",
             "g1_cfg::load_b_stage(g1_b + kt *", "g0_cfg::load_first_stages(p, smem",
             "int ring = 0;", "for (int tile = blockIdx.x; tile < tiles; tile += gridDim.x) {",
             "const int load_m0 = this_tile ? m0 : next_m0;", "ring = (ring + k_tiles) % kStages;",
             "// ---- g1 = g0 @ B1", "mma_step(acc, g1_a_frag[0], b_frag[0]);"]
    positions = [src.index(s) for s in order]
    assert positions == sorted(positions)
    body = src[src.index("for (int tile = blockIdx.x"):src.index("// Host launcher")]
    assert "load_b_stage" not in body  # B is never reloaded inside the tile loop
    g1 = body[body.index("// ---- g1 = g0 @ B1"):body.index("cp_async_wait<0>();  // the last tile")]
    assert "cp_async" not in g1 and "__syncthreads" not in g1  # g1 waits on nothing
    assert "// kStages: none; B1 is resident" in src


@pytest.mark.parametrize("changes, line, message", [
    (dict(S0x="4 keep A resident"), 9, "keep A resident: the B operand of gemm 'g0' is 'B0'"),
    (dict(S0x="4 keep B0 resident"), 12, "gemm 'g1' must keep B1 resident too"),
    (dict(S0x="4 keep B0 resident", KEEP="keep smem keep B1 resident", G0WARPS="2x2",
          G1WARPS="2x2"), 9, "keep B0 resident needs the persistent kernel"),
    (dict(RESIDENT, G0TILE="128x64x128", S0x="6 keep B0 resident"), 9,
     "shared memory over budget"),
    ({**RESIDENT, "[64, 128] col": "[64, 160] col", "f16[M, 128] row out": "f16[M, 160] row out"},
     14, "needs the CTA tile N of gemm 'g1' (128) to cover all of its N (160)"),
])
def test_resident_rules_have_located_messages(changes, line, message):
    with pytest.raises(KgenError) as info:
        lower(kernel(**changes))  # the parser refuses `keep A resident` already
    assert info.value.loc.line == line and message in info.value.message, info.value.render()


def test_resident_needs_the_persistent_kernel_when_turned_off():
    with pytest.raises(KgenError, match="needs the persistent kernel"):
        lower(kernel(**RESIDENT), persistent=False)


def test_resident_examples_compile_without_spills_or_warnings():
    from kgen.api import build, read_module
    from kgen.runtime import nvrtc

    for path in EXAMPLES:
        if not path.stem.startswith("b2b_gemm_rf"):
            continue
        name = path.stem
        k = read_module(path)[0].kernels[0]
        assert all(g.resident for g in k.gemms)
        plan = lower(k)
        assert plan.schedule.resident and plan.smem_bytes <= plan.storage.limit_bytes
        src = build(k, source_name=f"{name}.kg").source
        result = nvrtc.compile_cubin(src, name, k.target.value)  # sm_80, or sm_90a (wgmma)
        assert result.spill_stores == 0 and "warning" not in result.log.lower(), result.log
        assert plan.schedule.wgmma == (k.target is ir.Arch.SM90A)


def test_resident_chain_stores_16_byte_chunks_and_streams_a_with_evict_first():
    from kgen.api import build

    plan = lower(kernel(**RESIDENT))
    assert plan.schedule.wide_stores
    (d1,) = [a for a in plan.alignments if a.param == "D1"]
    assert (d1.ptr_bytes, d1.ld_multiple) == (16, 8)  # the chunks need 16-byte rows
    src = build(kernel(**RESIDENT), source_name="t.kg").source
    assert "__device__ __forceinline__ unsigned g1_epilogue(" in src
    assert "const uint4 chunk = quad_transpose(pairs, lane);" in src
    assert "*reinterpret_cast<uint4*>(p.D1 + row * p.ld_D1 + col) = chunk;" in src
    a_loader = src[src.index("void load_a_stage("):src.index("struct BLayout")]
    assert "cp_async_16_evict_first(" in a_loader  # A is read once
    b_loader = src[src.index("void load_b_stage("):]
    b_loader = b_loader[:b_loader.index("\n}\n")]
    assert "evict_first" not in b_loader  # B stays for the kernel's life
    # without keep B resident, the pairs are stored as before
    assert not lower(kernel()).schedule.wide_stores
    assert "quad_transpose" not in build(kernel(), source_name="t.kg").source


@pytest.mark.parametrize("changes", [
    # two outputs: the pairs are stored one by one
    {"EPI": "relu(acc); D1b = acc",
     "tensor D1 : f16[M, 128] row out": "tensor D1 : f16[M, 128] row out\n  tensor D1b : f16[M, 128] row out"},
    # an f32 output: 8 bytes per pair already
    {"tensor D1 : f16[M, 128] row out": "tensor D1 : f32[M, 128] row out"},
], ids=["two outputs", "f32 output"])
def test_wide_stores_need_one_row_major_16_bit_output(changes):
    plan = lower(kernel(**RESIDENT, **changes))
    assert plan.schedule.resident and not plan.schedule.wide_stores


def test_wide_stores_check_columns_only_where_tiles_overhang_n():
    from kgen.api import build
    from kgen.runtime import nvrtc

    exact = build(kernel(**RESIDENT), source_name="t.kg").source
    assert "if (live) *reinterpret_cast<uint4*>" in exact and "col < N" not in exact
    over = kernel(**dict(RESIDENT, G0WARPS="8x1", G1WARPS="8x1", G1TILE="128x256x32",
                         S0x="3 keep B0 resident"),
                  **{"[64, 128] col": "[64, 160] col",  # 160 columns in a tile of 256
                     "f16[M, 128] row out": "f16[M, 160] row out"})
    plan = lower(over)
    assert plan.schedule.wide_stores and plan.gemms[1].n_dim % plan.gemms[1].tile[1]
    src = build(over, source_name="t.kg").source
    assert "if (live && col < N) *reinterpret_cast<uint4*>" in src and "if (col < N)\n" in src
    result = nvrtc.compile_cubin(src, "b2b", "sm_80")
    assert result.spill_stores == 0 and "warning" not in result.log.lower(), result.log


def test_sm90a_resident_chain_multiplies_g0_with_wgmma():
    """Planned for sm_90a, a resident chain's g0 reads A and B0 from shared memory through
    wgmma descriptors (no ldmatrix), fenced after cp.async and waited before the slot refill."""
    from kgen.api import build

    k = kernel(**dict(RESIDENT, G0WARPS="8x1", G1WARPS="8x1"))
    assert not lower(k).schedule.wgmma  # sm_80: mma.sync
    plan = lower(k, ir.Arch.SM90A)
    assert plan.schedule.wgmma
    src = build(k, ir.Arch.SM90A, source_name="t.kg").source
    g0 = src[src.index("// ---- g0 = A @ B0"):src.index("// ---- g1 = g0 @ B1")]
    assert "ldmatrix" not in g0 and not re.search(r"\bmma_step\(", g0)
    order = ["fence_proxy_async();", "__syncthreads();", "wgmma_fence();",
             "wgmma_step(acc, smem_descriptor(a_stage", "wgmma_commit();", "wgmma_wait<0>();",
             "cp_async_wait<kStages - 2>();"]
    loop = g0[g0.index("for (int kt = 0; kt < k_tiles; ++kt)"):]
    positions = [loop.index(s) for s in order[2:]]
    assert positions == sorted(positions)
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16" in src
    assert "(1ull << 62)" in src  # the 128-byte swizzle in the descriptor
    # 4 warps in M make one warpgroup of 32 rows per warp: mma.sync stays
    assert not lower(kernel(**RESIDENT), ir.Arch.SM90A).schedule.wgmma


def test_sm90a_resident_chain_multiplies_g1_with_wgmma_from_registers():
    """With g1's tile K 64 (B1 as 128-byte rows), g1 follows g0 onto wgmma: A from g0's
    register fragments, B1 through descriptors, one commit group waited on before the epilogue.
    With 32-element k tiles (64-byte rows) too, through 64-byte swizzle descriptors; on sm_80 it
    stays on ldmatrix + mma.sync."""
    from kgen.api import build
    from kgen.runtime import nvrtc

    k = kernel(**dict(RESIDENT, G0WARPS="8x1", G1WARPS="8x1", G1TILE="128x128x64"))
    plan = lower(k, ir.Arch.SM90A)
    assert plan.schedule.wgmma and plan.schedule.wgmma_chain == ("g1",)
    assert lower(k).schedule.wgmma_chain == ()  # sm_80
    narrow = kernel(**dict(RESIDENT, G0WARPS="8x1", G1WARPS="8x1"))  # tile K 32
    assert lower(narrow, ir.Arch.SM90A).schedule.wgmma_chain == ("g1",)
    narrow_src = build(narrow, ir.Arch.SM90A, source_name="t.kg").source
    assert "wgmma_step_rs(acc, g1_a_frag[1][0], smem_descriptor_64(b_smem + 32));" in narrow_src
    assert "wgmma_step_rs(acc, g1_a_frag[2][0], smem_descriptor_64(b_smem + 1 * kBStageBytes));" \
        in narrow_src
    src = build(k, ir.Arch.SM90A, source_name="t.kg").source
    g1 = src[src.index("// ---- g1 = g0 @ B1"):src.index("// Epilogue", src.index("// ---- g1 = g0 @ B1"))]
    assert "ldmatrix_x4" not in g1 and not re.search(r"\bmma_step\(", g1)
    steps = [f"wgmma_step_rs(acc, g1_a_frag[{s}][0], smem_descriptor(b_smem{f' + {32 * s}' if s else ''}));"
             for s in range(4)]
    order = ["wgmma_fence();", *steps, "wgmma_commit();", "wgmma_wait<0>();"]
    positions = [g1.index(s) for s in order]
    assert positions == sorted(positions)
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in src
    assert "{%64, %65, %66, %67}, %68, accumulate, 1, 1, 0;" in src  # A from four registers
    result = nvrtc.compile_cubin(src, "b2b", "sm_90a")
    assert result.spill_stores == 0 and "warning" not in result.log.lower(), result.log
