"""`schedule pingpong` (its rules in kgen/targets/sm90/schedules.py): the parse, each rule's
located message, the plan (threads, the producer's copies, the ring's mbarriers in the storage
map) and the shape of the emitted producer and consumers. Then the typed schedule of every
kind (plan.schedule), the targets' candidates with their reasons, and the selection
(kgen/lower/select.py)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build
from kgen.errors import KgenError
from kgen.lower import candidates, lower
from kgen.targets.sm90 import schedules as sm90_schedules
from kgen.parse import parse_file
from kgen.plan import CachePolicy, KernelKind, LoadPath, Mma, StorePath
from kgen.targets import Instruction, target

from tests.kernels import EXAMPLES, GEMM_EXAMPLES, from_template

TEXT = """\
kernel pp {
  target TARGET
  SCHEDULE
  tensor A : f16[M, 576] row
  tensor B0 : f16[576, 64] col
  tensor B1 : f16[64, 128] col
  tensor D1 : f16[M, 128] row out
  vector bias0 : f32[64]
  gemm g0 = A @ B0 {
    tile G0TILE warps G0WARPS stages STAGES
    RESIDENT0
    epilogue { g0 = relu(acc + bias0[col]) }
  }
  gemm g1 = g0 @ B1 {
    tile G1TILE warps G1WARPS stages 2
    KEEP
    RESIDENT1
    epilogue { D1 = relu(acc) }
  }
}
"""
DEFAULTS = dict(TARGET="sm_90a", SCHEDULE="schedule pingpong", G0TILE="64x64x64",
                G0WARPS="4x1", STAGES="12", RESIDENT0="keep B0 resident", G1TILE="64x128x32",
                G1WARPS="4x1", KEEP="keep registers", RESIDENT1="keep B1 resident")


def kernel(**changes) -> ir.Kernel:
    return from_template(TEXT, DEFAULTS, **changes)


def in_order(text: str, items: list[str]) -> bool:
    """Each item occurs in `text` after the one before it."""
    at = 0
    for item in items:
        at = text.find(item, at)
        if at < 0:
            return False
        at += len(item)
    return True


def test_schedule_parses_with_its_location():
    k = kernel()
    assert k.schedule is ir.Schedule.PINGPONG
    assert (k.schedule_loc.line, k.schedule_loc.col) == (3, 3)
    assert kernel(SCHEDULE="").schedule is None


@pytest.mark.parametrize("text, message", [
    ("schedule pingpang", "unknown schedule 'pingpang'; expected pingpong"),
    ("schedule pingpong schedule pingpong", "schedule given twice (first at line 3)"),
])
def test_schedule_syntax_errors_are_located(text, message):
    with pytest.raises(KgenError) as info:
        kernel(SCHEDULE=text)
    assert info.value.loc.line == 3 and message in info.value.message, info.value.render()


def test_pingpong_plan():
    plan = lower(kernel())
    s = plan.schedule
    assert s.scheduler.pingpong and s.wgmma and s.resident and s.scheduler.persistent
    assert s.warps.threads == sm90_schedules.threads() == 2 * 128 + 128
    g0 = plan.gemms[0]
    # a producer warpgroup copies every 64x64 A slot: 512 chunks of 16 bytes, 4 per thread
    assert g0.a.copies_per_thread == 64 * 64 * 2 // 16 // 128 == 4
    assert plan.gemms[0].b.copies_per_thread == 64 * 64 * 2 // 16 // 128  # B: a warpgroup's
    bufs = {b.name: b for b in plan.storage.buffers}
    bars = bufs["g0_ring_barriers"]
    # a full and an empty barrier per slot, then the consumers' turn barriers
    assert (bars.bytes, bars.align, bars.dtype) == ((2 * 12 + 2) * 8, 8, None)
    assert bars.live == (0, len(plan.storage.phases) - 1) and "mbarriers" in bars.role
    assert bufs["g0_a_smem"].bytes == 12 * 64 * 64 * 2 and bufs["g0_a_smem"].offset % 1024 == 0
    # D1 leaves through the copy engine: a 64x128 staging per consumer warpgroup, placed on a
    # 1024-byte boundary (the 128-byte swizzle's period), live through the kernel
    assert plan.schedule.tma_output is not None
    staging = bufs["g1_d_staging"]
    assert (staging.bytes, staging.align) == (2 * 64 * 128 * 2, 1024)
    assert staging.offset % 1024 == 0 and staging.live == bars.live
    assert "copy engine" in staging.role
    for b in bufs.values():  # every buffer lives through the kernel: nothing shares bytes
        assert all(b is o or not b.shares_bytes(o) for o in bufs.values())
    assert plan.smem_bytes == (12 * 8192 + 576 * 64 * 2 + 64 * 128 * 2 + 2 * 64 * 128 * 2
                               + 1024) <= 227 * 1024  # the barriers' 192 bytes, rounded up
    assert plan.grid({"M": 81920}, 132) == (132, 1, 1)  # 1280 tiles of 64 rows


@pytest.mark.parametrize("changes", [
    dict(G1TILE="64x32x32", N32=True),  # N 32: less than one 64-column box
    dict(KEEP_OUT="tensor D1 : f16[M, 128] col out"),  # a column-major output
    dict(EPI1="D1 = relu(acc) + C"),  # fine: still one row-major 16-bit store
])
def test_the_copy_engine_stores_only_what_its_boxes_fit(changes):
    text = TEXT
    if "N32" in changes:
        text = text.replace("f16[64, 128] col", "f16[64, 32] col").replace(
            "f16[M, 128] row out", "f16[M, 32] row out")
    if "KEEP_OUT" in changes:
        text = text.replace("tensor D1 : f16[M, 128] row out", changes["KEEP_OUT"])
    if "EPI1" in changes:
        text = text.replace("D1 = relu(acc)", changes["EPI1"]).replace(
            "  vector bias0", "  tensor C : f16[M, 128] row\n  vector bias0")
    rest = {k: v for k, v in changes.items() if k in DEFAULTS}
    plan = lower(from_template(text, DEFAULTS, **rest))
    assert plan.schedule.scheduler.pingpong
    fits = "EPI1" in changes
    assert (plan.schedule.tma_output is not None) is fits
    assert any(b.name == "g1_d_staging" for b in plan.storage.buffers) is fits


def test_a_ring_that_leaves_no_room_for_the_staging_stores_from_registers():
    """The staging goes first: 16 slots fit without it, and D1 leaves in 16-byte chunks."""
    plan = lower(kernel(STAGES="16"))
    assert plan.schedule.scheduler.pingpong and plan.schedule.tma_output is None
    last = plan.schedule.gemms[-1]
    assert last.output.path is StorePath.WIDE and "staging does not fit" in last.output.why
    assert not any(b.name == "g1_d_staging" for b in plan.storage.buffers)
    with pytest.raises(KgenError) as info:  # 20 slots do not fit even so
        lower(kernel(STAGES="20"))
    assert info.value.loc.line == 10 and "shared memory over budget" in info.value.message


@pytest.mark.parametrize("changes, line, message", [
    (dict(TARGET="sm_80"), 3, "schedule pingpong needs target sm_90a"),
    (dict(RESIDENT0="", RESIDENT1=""), 3, "its B resident ('keep B1 resident')"),
    (dict(RESIDENT1=""), 3, "its B resident ('keep B1 resident')"),
    (dict(KEEP="keep g0 in smem"), 3, "each after the first keeping the one before in "
     "registers"),
    (dict(G0TILE="128x64x64", G0WARPS="8x1", G1TILE="128x128x32", G1WARPS="8x1"), 10,
     "gemm 'g0' needs warps 4x1, not 8x1"),
    (dict(STAGES="1"), 10, "stages must be between 2 and 32"),
    (dict(G0TILE="64x64x32", STAGES="24"), 10, "runs gemm 'g0' on wgmma"),
    (dict(STAGES="20"), 10, "shared memory over budget"),
    (dict(STAGES="40"), 10, "stages must be between 2 and 32"),
])
def test_pingpong_rules_have_located_messages(changes, line, message):
    with pytest.raises(KgenError) as info:
        lower(kernel(**changes))
    assert info.value.loc.line == line and message in info.value.message, info.value.render()


def test_the_default_residency_is_registers():
    assert lower(kernel(KEEP="")).schedule.scheduler.pingpong


def test_without_a_producer_stages_stay_at_most_8():
    with pytest.raises(KgenError, match="stages must be between 2 and 8"):
        lower(kernel(SCHEDULE="", STAGES="16"), ir.Arch.SM90A)


def test_the_sm80_override_is_refused_at_the_schedule():
    with pytest.raises(KgenError) as info:
        lower(kernel(), ir.Arch.SM80)
    assert info.value.loc.line == 3 and "compiles for sm_80" in info.value.message


def test_pingpong_source_producer_and_consumers():
    result = build(kernel(), source_name="t.kg")
    src = result.source
    # its ring holds a tile's k tiles and two slots more: two wgmma groups in flight, each slot
    # freed once the next k tile's group is issued (tests/targets/test_sm90_in_flight.py)
    assert result.plan.schedule.gemms[0].overlap.wgmma_groups == 2
    assert "__launch_bounds__(384, 1)" in src
    assert "setmaxnreg_dec<kProducerRegisters>();" in src
    assert "setmaxnreg_inc<kConsumerRegisters>();" in src
    producer = src[src.index("void produce_ring("):]
    producer = producer[:producer.index("\n}\n")]
    # one producer thread issues each fill's box of A by the copy engine
    order = ["if (t != 0) return;",
             "for (int tile = blockIdx.x; tile < tiles_m * tiles_n; tile += gridDim.x)",
             "if (fill >= kStages) mbarrier_wait(empty_bar + 8 * slot, (fill / kStages - 1) & 1);",
             "mbarrier_expect_tx(full_bar + 8 * slot, kAStageBytes);",
             "tma_load_box(a_smem + slot * kAStageBytes, &maps.A, full_bar + 8 * slot, "
             "kt * kTileK, m0);"]
    assert in_order(producer, order)
    assert "cp_async" not in producer
    kernel_body = src[src.index("extern \"C\" __global__"):src.index("// Host launcher")]
    order = ["mbarrier_init(full_bar + 8 * s, 1);",
             "mbarrier_init(empty_bar + 8 * s, kWarpgroupThreads);", "fence_barrier_init();",
             "__syncthreads();",
             "if (tid >= 2 * kWarpgroupThreads) {", "produce_ring(p, maps, smem,",
             "tid - 2 * kWarpgroupThreads);", "return;",
             "g0_cfg::load_b_stage(", "consumer_barrier();",
             "for (int tile = blockIdx.x + warpgroup * gridDim.x; tile < tiles; "
             "tile += 2 * gridDim.x, local += 2) {",
             "int fill = local * k_tiles;", "mbarrier_wait(full_bar + 8 * slot, (fill / kStages) & 1);",
             "wgmma_commit();", "wgmma_wait<1>();",
             "if (kt > 0) mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));",
             "wgmma_wait<0>();",
             "if (k_tiles > 0) mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));",
             "// ---- g1 = g0 @ B1",
             # D1 through the copy engine: wait until the last tile's boxes were read, stage,
             # make the writes visible to the async proxy, then one thread stores the boxes
             "const unsigned staging = smem_address(smem.g1_d_staging()) + warpgroup * "
             "(kTileN / 64) * kStagingBoxBytes;",
             "if (tid % kWarpgroupThreads == 0) bulk_wait_read();", "warpgroup_barrier(warpgroup);",
             "g1_epilogue(p, m0 + r + 8 * h, n0 + c,",
             # four 8x8 pieces of the warp's rows per stmatrix
             "stmatrix_x4(staging + (piece_col / 64) * kStagingBoxBytes + "
             "staging_offset(piece_row, piece_col % 64), pairs);",
             "fence_proxy_async();", "warpgroup_barrier(warpgroup);",
             "if (tid % kWarpgroupThreads == 0) {",
             "tma_store_box(&maps.D1, staging + box * kStagingBoxBytes, n0 + box * 64, m0);",
             "bulk_commit();",
             "if (tid % kWarpgroupThreads == 0) bulk_wait_read();  // the copy engine has read "
             "this warpgroup's last staging"]
    assert in_order(kernel_body, order)
    assert "quad_transpose(pairs, lane)" not in kernel_body and "p.D1 +" not in kernel_body
    # with the output's stores hinted evict-first, A's ring copies carry no L2 policy
    assert "cp_async_16_evict_first" not in src and "cp_async_16(stage + base, from" in src
    assert ("pp(const __grid_constant__ pp_params p, const __grid_constant__ "
            "pp_kgen::TensorMaps maps)") in src
    assert ("struct alignas(64) TensorMaps {\n  unsigned long long A[16];  // loaded in 64x64 "
            "boxes\n  unsigned long long D1[16];  // stored in 64x64 boxes\n};") in src
    assert "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group.L2::cache_hint" in src
    # the launcher encodes D1's map (rows M, 128 columns, 64x64 boxes, 128-byte swizzle) and
    # passes it after the params
    host = src[src.index("// Host launcher"):]
    order = ["#include <cudaTypedefs.h>", "static cudaError_t pp_tensor_maps(const pp_params& p, "
             "pp_kgen::TensorMaps& maps) {", "cuTensorMapEncodeTiled",
             "reinterpret_cast<CUtensorMap*>(&maps.A)",
             "const cuuint64_t dims[2] = {static_cast<cuuint64_t>(128), "
             "static_cast<cuuint64_t>(p.M)};",
             "CU_TENSOR_MAP_DATA_TYPE_FLOAT16", "CU_TENSOR_MAP_SWIZZLE_128B",
             "if (tiles_m == 0 || tiles_n == 0) return cudaSuccess;",
             "const cudaError_t encoded = pp_tensor_maps(p, maps);",
             "pp<<<grid, pp_kgen::kThreads, pp_kgen::kSmemBytes, stream>>>(p, maps);"]
    assert in_order(src[:src.index("namespace")] + host, order)
    loop = kernel_body[kernel_body.index("int fill = local * k_tiles;"):]
    # two groups in flight: a slot goes back only once the group after its own is issued
    assert "mbarrier_arrive(empty_bar + 8 * slot);" not in loop
    assert loop.count("mbarrier_arrive(empty_bar + 8 * ((fill - 1) % kStages));") == 2
    assert "__syncthreads" not in loop and "cp_async" not in loop  # consumers wait on mbarriers
    assert "const int warp_m = math_warp / kWarpsN;" in loop
    assert re.search(r"bar\.sync 1, %0;.*\"n\"\(2 \* kWarpgroupThreads\)", src)
    assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in src
    assert "static_assert(kThreads == 2 * kWarpgroupThreads + kProducerThreads" in src
    assert "constexpr int kProducerThreads = 128;" in src


def test_pingpong_source_is_deterministic_and_compiles_without_spills():
    from kgen.runtime import nvrtc

    k = kernel()
    first = build(k, source_name="t.kg").source
    assert build(k, source_name="t.kg").source == first
    result = nvrtc.compile_cubin(first, "pp", "sm_90a")
    assert result.spill_stores == 0 and "warning" not in result.log.lower(), result.log


# -- the typed schedule (plan.schedule), its candidates and its selection -----------------------

KGEN = Path(__file__).resolve().parents[2] / "kgen"


def example(name: str, arch: ir.Arch | None = None):
    return lower(parse_file(next(e for e in EXAMPLES if e.stem == name)).kernels[0], arch)


def gemm_row(g) -> tuple:
    p = g.pipeline
    return (g.name, g.atom.instruction, p.a.load, p.a.cache, p.b.load, g.output.path)


@pytest.mark.parametrize("name", ["b2b_gemm_rf_pingpong_sm90a",
                                  "b2b_gemm_rf_pingpong_bf16_sm90a"])
def test_pingpong_examples_schedule(name):
    plan = example(name)
    s = plan.schedule
    assert s.scheduler.kind is KernelKind.PINGPONG
    assert [(r.name, r.warps, r.groups, r.registers) for r in s.warps.roles] == [
        ("producer", 4, 1, 40), ("consumer", 4, 2, 232)]
    assert s.warps.threads == 384
    assert [gemm_row(g) for g in s.gemms] == [
        ("g0", Mma.WGMMA_SS, LoadPath.TMA, CachePolicy.NORMAL, LoadPath.RESIDENT,
         StorePath.FEED),
        ("g1", Mma.WGMMA_RS, LoadPath.CHAINED_REGISTERS, CachePolicy.NORMAL, LoadPath.RESIDENT,
         StorePath.TMA)]
    dtype = ir.DType.BF16 if "bf16" in name else ir.DType.F16
    assert (s.tma_output.param, s.tma_output.dtype) == ("D1", dtype)
    # the producer's ring of A by the copy engine: 64x64 boxes (tile K x tile M)
    assert [(m.param, m.store, m.box) for m in s.tensor_maps] == [
        ("A", False, (64, 64)), ("D1", True, (64, 64))]
    assert not s.quad_stores and not s.mma_sync


def test_tiled_example_schedule():
    s = example("gemm").schedule
    assert s.scheduler.kind is KernelKind.TILED
    assert s.scheduler.raster.group_m == 8
    assert s.scheduler.min_blocks_per_sm == 1
    assert [gemm_row(g) for g in s.gemms] == [
        ("mma0", Mma.MMA_SYNC, LoadPath.CP_ASYNC, CachePolicy.NORMAL, LoadPath.CP_ASYNC,
         StorePath.PAIRS)]
    assert s.tma_output is None and s.mma_sync and not s.quad_stores
    assert [k for k, _ in s.rejected] == [
        KernelKind.PINGPONG, KernelKind.COOPERATIVE, KernelKind.PERSISTENT]


def test_resident_chain_schedules_per_target():
    """sm_80 runs the resident chain on mma.sync; sm_90a moves g0 to wgmma, and g1 where its
    own rules hold (b2b_gemm_rf's g1 reads 64-byte k tiles of B1: wgmma in the 64-byte
    swizzle)."""
    s80 = example("b2b_gemm_rf").schedule
    assert s80.scheduler.kind is KernelKind.PERSISTENT
    assert [gemm_row(g) for g in s80.gemms] == [
        ("g0", Mma.MMA_SYNC, LoadPath.CP_ASYNC_RING, CachePolicy.EVICT_FIRST, LoadPath.RESIDENT,
         StorePath.FEED),
        ("g1", Mma.MMA_SYNC, LoadPath.CHAINED_REGISTERS, CachePolicy.NORMAL, LoadPath.RESIDENT,
         StorePath.WIDE)]
    assert s80.quad_stores and s80.mma_sync
    s90 = example("b2b_gemm_rf", ir.Arch.SM90A).schedule
    assert [g.atom.instruction for g in s90.gemms] == [Mma.WGMMA_SS, Mma.WGMMA_RS]
    rf90 = example("b2b_gemm_rf_sm90a").schedule
    assert [g.atom.instruction for g in rf90.gemms] == [Mma.WGMMA_SS, Mma.WGMMA_RS]
    smem = example("b2b_gemm_smem").schedule
    assert smem.scheduler.kind is KernelKind.TILED
    assert [g.pipeline.a.load for g in smem.gemms] == [LoadPath.CP_ASYNC, LoadPath.CHAINED_SMEM]


@pytest.mark.parametrize("path", GEMM_EXAMPLES, ids=lambda p: p.stem)
def test_the_schedules_derived_flags(path):
    """The flags the emitters read are derived from the schedule alone; the plan keeps no
    copies of them."""
    for k in parse_file(path).kernels:
        plan = lower(k)
        s = plan.schedule
        last = s.gemms[-1].output.path
        assert s.scheduler.persistent is (s.scheduler.kind is not KernelKind.TILED)
        assert s.scheduler.pingpong is (s.scheduler.kind is KernelKind.PINGPONG)
        assert s.resident is any(g.pipeline.b.load is LoadPath.RESIDENT for g in s.gemms)
        assert s.wide_stores is (last in (StorePath.WIDE, StorePath.TMA))
        assert s.quad_stores is (last is StorePath.WIDE)
        assert (s.tma_output is not None) is (last is StorePath.TMA)  # only the last gemm's
        assert s.wgmma is (s.gemms[0].atom.instruction is Mma.WGMMA_SS)
        # later gemms: A in registers
        assert all(g.atom.instruction is not Mma.WGMMA_SS for g in s.gemms[1:])
        assert s.wgmma_chain == tuple(g.name for g in s.gemms
                                      if g.atom.instruction is Mma.WGMMA_RS)
        assert s.mma_sync is any(g.atom.instruction in (Mma.MMA_SYNC, Mma.MMA_SYNC_FP8)
                                 for g in s.gemms)
        assert s.warps.threads == sum(r.warps * r.groups * 32 for r in s.warps.roles)
        assert [g.name for g in s.gemms] == [g.name for g in plan.gemms]
        for flag in ("threads", "group_m", "min_blocks_per_sm", "persistent", "resident",
                     "wide_stores", "wgmma", "wgmma_chain", "pingpong", "tma_store"):
            assert not hasattr(plan, flag)  # read from plan.schedule, not copied onto the plan
        for row in s.describe():
            assert len(row) == 3 and all(isinstance(x, str) for x in row)


def test_candidates_list_every_schedule_with_its_reason():
    from tests.lower.test_chain import kernel as chain_kernel
    listed = candidates(chain_kernel(), ir.Arch.SM86)
    assert [(c.kind, c.legal) for c in listed] == [
        (KernelKind.PINGPONG, False), (KernelKind.COOPERATIVE, False),
        (KernelKind.PERSISTENT, True), (KernelKind.TILED, True)]
    assert listed[0].reason == "needs target sm_90a (wgmma, mbarrier waits, TMA)"
    gemm = parse_file(next(e for e in EXAMPLES if e.stem == "gemm")).kernels[0]
    single = candidates(gemm, ir.Arch.SM90A)
    assert [(c.kind, c.legal) for c in single] == [
        (KernelKind.PINGPONG, False), (KernelKind.COOPERATIVE, True),
        (KernelKind.PERSISTENT, False), (KernelKind.TILED, True)]
    assert single[0].reason == "taken only on request ('schedule pingpong')"
    assert "two chained gemms" in single[2].reason


def test_persistent_over_budget_is_refused_not_caught():
    """Stages that fit one CTA per tile but not beside the prefetched next tile: the persistent
    candidate is refused for its shared memory and the tiled one taken."""
    from tests.lower.test_chain import kernel as chain_kernel
    sm86 = lower(chain_kernel(S0x="6"), ir.Arch.SM86)
    assert sm86.schedule.scheduler.kind is KernelKind.PERSISTENT
    s = lower(chain_kernel(S0x="7"), ir.Arch.SM86).schedule
    assert s.scheduler.kind is KernelKind.TILED
    assert dict(s.rejected)[KernelKind.PERSISTENT] == (
        "shared memory over budget: 102400 bytes needed, 101376 allowed")


def test_targets_state_their_instructions():
    assert not target(ir.Arch.SM80).has(Instruction.WGMMA) and not target(ir.Arch.SM80).tma
    sm90 = target(ir.Arch.SM90A)
    assert sm90.tma and all(sm90.has(i) for i in Instruction)


def _python_files(*parts: str):
    for part in parts:
        path = KGEN / part
        yield from ([path] if path.suffix == ".py" else sorted(path.rglob("*.py")))


def test_selection_never_catches_kgen_errors():
    """No pass of kgen/lower and no schedule list decides by catching a KgenError. The builder
    (kgen/lower/builder.py) alone does: it tries configurations through the whole lowering,
    whose every pass may refuse one, and keeps each refusal for `kgen inspect`."""
    for path in _python_files("lower", "targets/common/schedules.py", "targets/sm80/schedules.py",
                              "targets/sm90/schedules.py"):
        if path.name == "builder.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler):
                names = {n.id if isinstance(n, ast.Name) else getattr(n, "attr", "")
                         for n in ast.walk(node.type)} if node.type else {"<bare>"}
                assert not names & {"KgenError", "Exception", "BaseException", "<bare>"}, (
                    f"{path.relative_to(KGEN)}:{node.lineno} catches {names}")


def test_targets_and_lowering_keep_their_layers():
    """The schedule lists read plan-level data only; lowering holds no C++ names of the
    copy engine (kgen/targets/sm90/tensor_map.py has them)."""
    for path in _python_files("targets/__init__.py", "targets/common/schedules.py",
                              "targets/sm80/schedules.py", "targets/sm90/schedules.py",
                              "targets/sm90/tensor_map.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                module = "." * node.level + (node.module or "")
                names = {a.name for a in node.names}
                layers = module.split(".")
                assert not any(m in layers for m in ("ir", "lower", "parse", "verify")), (
                    f"{path.name} imports {module}")
                assert not (module.strip(".") == "" and names & {"ir", "lower"}), path.name
    for path in _python_files("lower"):
        assert "CU_TENSOR_MAP" not in path.read_text(), path.name
