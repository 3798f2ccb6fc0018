"""The attention backward's DAG loop (examples/attention_bwd.kg) compiled by NVRTC on the CPU
for sm_80 and sm_90a, head dims 64 and 128, no mask and causal (top-left and bottom-right),
bf16 and f16: 0 spills and no stack at the rulebook's configuration (on sm_90a the wgmma
skeleton, templates/sm90/loop_bwd.cu.j2; its PTX checked; the mma.sync skeleton there with a
written tile 128x32); the emitted .cu in the skeleton's fixed order, deterministic, with its
zeroing kernel and launcher."""
from __future__ import annotations

from pathlib import Path

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.parse import parse
from kgen.verify import verify

ROOT = Path(__file__).resolve().parents[2]
TEXT = (ROOT / "examples" / "attention_bwd.kg").read_text()
MASKED = "where(row <= col, exp(scale * acc - lse[col]), 0)"
MASKS = {"none": "exp(scale * acc - lse[col])", "top_left": MASKED,
         "bottom_right": "where(row <= col + T - S, exp(scale * acc - lse[col]), 0)"}


def built(d: int, mask: str, arch: ir.Arch, dtype: str = "bf16", tile: str | None = None,
          adds: str | None = None):
    """The rulebook's configuration (on sm_90a the wgmma skeleton), or the written `tile`;
    `adds` "warp" / "tensor" / "rows" / "atomics": the wgmma skeleton's plan option, dQ by the
    copy engine's tensor reduce-add from the producer's add warp / from a thread of each
    warpgroup / its bulk reduce-add per staged row / f32 atomics (None: as the rulebook takes
    it, the add warp)."""
    text = (TEXT.replace("128]", f"{d}]").replace(MASKED, MASKS[mask])
            .replace("bf16[", f"{dtype}[")
            .replace("    tile 128x32\n", f"    tile {tile}\n" if tile else "\n"))
    module = parse(text, "attention_bwd.kg")
    assert verify(module) == []
    b = build_verified(module.kernels[0], arch)
    if adds is not None:
        import dataclasses

        from kgen.targets.sm90.loop_dag import emit
        from kgen.targets.sm90.loop_dag_schedule import with_adds

        plan = with_adds(b.plan, adds)
        b = dataclasses.replace(b, plan=plan, source=emit(
            plan, source_name="attention_bwd.kg", source_hash="0", command="test"))
    return b


@pytest.mark.slow
@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_compiles_without_spills(arch, d, mask, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    b = built(d, mask, arch, dtype)
    result = compile_cubin(b.source, b.plan.name, arch.value)
    resources = result.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    if b.plan.wgmma is not None:  # the sm_90a wgmma skeleton compiles without a warning
        assert "warning" not in result.log.lower(), result.log


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("adds", ["tensor", "rows", "atomics"])
def test_sm90a_add_options_compile_without_spills(d, mask, dtype, adds):
    from kgen.runtime.nvrtc import compile_cubin

    b = built(d, mask, ir.Arch.SM90A, dtype, adds=adds)
    result = compile_cubin(b.source, b.plan.name, "sm_90a")
    assert "warning" not in result.log.lower(), result.log
    resources = result.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
        resources


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_the_sm80_plan_built_for_hopper_compiles_without_spills(d, mask, dtype):
    """The GPU compiles the sm_80 plan for its own arch: on an H100/H200, sm_90a (the
    mma.sync skeleton there, e.g. bench/attention_bwd.py's `kgen_mma_sync` column)."""
    from kgen.runtime.nvrtc import compile_cubin

    b = built(d, mask, ir.Arch.SM80, dtype)
    resources = compile_cubin(b.source, b.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_the_sm80_plan_s_warp_grid_compiles_without_spills(arch, d, mask, dtype):
    """The warp grid (dag_mma_rules.warp_grid; tests/targets/test_loop_dag_grid.py) built for
    sm_80 and for the Hopper GPU's own arch: 0 spills, no stack (NVRTC 13.5: 226-255
    registers)."""
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.targets import dag_mma_rules

    with dag_mma_rules.warp_grid(True):
        b = built(d, mask, ir.Arch.SM80, dtype)
    assert b.plan.grid is not None
    resources = compile_cubin(b.source, b.plan.name, arch).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources


@pytest.mark.parametrize("d, compact", [(64, False), (128, True)])
@pytest.mark.parametrize("mask", list(MASKS))
def test_the_sm80_rulebook_tile_and_its_body(d, compact, mask):
    """128x64 at both head dims (at 128 FlashAttention-2's tile: 64 queries x 128 keys, 8
    warps); at 128 the compact body (dag_mma_rules.dag_compact_body): one loop over the blocks,
    the fast body and the checked one its branches, the score gemms' k16 steps one at a time;
    at 64 three loops (the checked blocks, the fast ones, the checked ones), unrolled."""
    b = built(d, mask, ir.Arch.SM80)
    assert b.plan.config.value.startswith("tile 128x64 warps 8 stages 2")
    one_at_a_time = b.source.count("#pragma unroll 1  // the compact body")
    assert one_at_a_time == (2 * 2 if compact else 0)  # two score gemms, two bodies
    loops = b.source.count("for (int block = ")
    if compact:
        assert loops == 1 and "// The compact body, about 320 registers a thread" in b.source
        assert b.source.count("if (block >= fast_begin && block < fast_end) {") == (mask != "none")
        assert b.source.count("if (block < blocks - 1) {") == (mask == "none")
    else:
        assert loops == (3 if mask != "none" else 1) and "compact body" not in b.source
        assert ("if (blocks > 0) {" in b.source) == (mask == "none")


def test_dag_compact_body_by_the_estimate():
    from kgen.targets import dag_mma_rules

    assert dag_mma_rules.dag_compact_body(dag_mma_rules.DAG_COMPACT_REGISTERS) == (False, "")
    compact, why = dag_mma_rules.dag_compact_body(dag_mma_rules.DAG_COMPACT_REGISTERS + 64)
    assert compact and "320 registers" in why and "dag_mma_rules" in why


@pytest.mark.slow
@pytest.mark.parametrize("d", [64, 128])
def test_sm90a_mma_sync_skeleton_compiles_without_spills(d):
    """A written tile 128x32 keeps sm_90a on the mma.sync skeleton."""
    from kgen.runtime.nvrtc import compile_cubin

    b = built(d, "top_left", ir.Arch.SM90A, tile="128x32")
    assert b.plan.wgmma is None
    resources = compile_cubin(b.source, b.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
        resources


@pytest.mark.parametrize("d", [64, 128])
def test_sm90a_ptx_holds_the_wgmma_skeleton(d):
    """The sm_90a build's PTX: wgmma SS (the score gemms, n = the block), RS (the accumulating
    gemms, n = d), SS with both transposed (the loop-row gemm, n = d / 2), the copy engine's
    rank-4 loads, mbarriers, setmaxnreg, the copy engine's tensor reduce-adds into dQ by the add
    warp (the plan options: by a thread of each warpgroup, its bulk reduce-add per row, f32
    atomics); no mma.sync."""
    from kgen.runtime.nvrtc import compile_ptx

    b = built(d, "top_left", ir.Arch.SM90A)
    assert b.plan.wgmma is not None
    ptx = compile_ptx(b.source, b.plan.name, "sm_90a")
    assert ptx.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16") >= 2 * (d // 16)
    assert f"wgmma.mma_async.sync.aligned.m64n{d}k16.f32.bf16.bf16" in ptx
    assert f"wgmma.mma_async.sync.aligned.m64n{d // 2}k16.f32.bf16.bf16" in ptx
    assert "p, 1, 1, 1, 1;" in ptx  # the loop-row gemm: A and B transposed (MN-major)
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes" in ptx
    assert "setmaxnreg.inc.sync.aligned.u32 232" in ptx and "mbarrier.try_wait" in ptx
    assert "setmaxnreg.dec.sync.aligned.u32 40" in ptx  # the producer stages lse and D too
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in ptx
    # dQ's adds: a tensor reduce-add per box of a warpgroup's share, by the add warp
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group" in ptx
    assert "cp.async.bulk.wait_group.read 0" in ptx and "bar.arrive" in ptx
    assert "cp.reduce.async.bulk.global" not in ptx
    tensor = compile_ptx(built(d, "top_left", ir.Arch.SM90A, adds="tensor").source,
                         b.plan.name, "sm_90a")
    assert "cp.reduce.async.bulk.tensor.4d.global.shared::cta.add.tile.bulk_group" in tensor
    assert "bar.arrive" not in tensor
    assert "red.global.add.f32" not in ptx and "atom.global.add.f32" not in ptx
    assert "mma.sync" not in ptx
    rows = compile_ptx(built(d, "top_left", ir.Arch.SM90A, adds="rows").source, b.plan.name,
                       "sm_90a")
    assert "cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32" in rows
    assert "cp.reduce.async.bulk.tensor" not in rows
    atomics = compile_ptx(built(d, "top_left", ir.Arch.SM90A, adds="atomics").source,
                          b.plan.name, "sm_90a")
    assert "red.global.add.f32" in atomics or "atom.global.add.f32" in atomics
    assert "cp.reduce.async.bulk" not in atomics


def test_sm90a_emission_is_deterministic_and_in_the_fixed_order():
    first = built(128, "top_left", ir.Arch.SM90A).source
    assert first == built(128, "top_left", ir.Arch.SM90A).source
    marks = ["// Configuration", "struct alignas(64) TensorMaps", "struct attention_bwd_params",
             "struct SharedStorage", "__device__ __forceinline__ void wgmma_ss_mn_n64",
             "attention_bwd(const __grid_constant__ attention_bwd_params p",
             "attention_bwd_zero(const attention_bwd_params p)",
             "static cudaError_t attention_bwd_tensor_maps", "cudaError_t attention_bwd_launch"]
    places = [first.index(m) for m in marks]
    assert places == sorted(places)
    launcher = first[first.index("cudaError_t attention_bwd_launch_zeroed("):]
    assert "attention_bwd<<<grid, kThreads, kSmemBytes, stream>>>(p, maps)" in launcher
    # the launcher zeroes dQ, then launches the kernel (_launch_zeroed: a sequence's row kernel
    # may have zeroed dQ instead)
    launcher = first[first.index("cudaError_t attention_bwd_launch("):]
    assert launcher.index("attention_bwd_zero<<<") < launcher.index(
        "return attention_bwd_launch_zeroed(p, stream);")
    assert "unsigned long long dQ[16];  // dQ (f32, the adds)" in first
    assert "else if (tid / 32 == kAddWarp) {" in first
    assert "named_barrier_arrive(kAddStaged, kAddThreads);" in first
    assert "tma_reduce_add_4d(maps.dQ, stage + (c * kAddBoxes + box) * kAddBoxBytes" in first
    assert "CU_TENSOR_MAP_DATA_TYPE_FLOAT32" in first and "box[4] = {32, 64, 1, 1}" in first
    tensor = built(128, "top_left", ir.Arch.SM90A, adds="tensor").source
    assert "tma_reduce_add_4d(maps.dQ, stage + box * kAddBoxBytes, lr_col0 + box * 32, kv0," in tensor
    assert "kAddWarp" not in tensor
    rows = built(128, "top_left", ir.Arch.SM90A, adds="rows").source
    assert "bulk_reduce_add_f32(g_dQ + static_cast<long long>(kv0 + warp * 16 + lane)" in rows
    assert "FLOAT32" not in rows
    atomics = built(128, "top_left", ir.Arch.SM90A, adds="atomics").source
    assert "atomicAdd(g_dQ + row * p.dQ_ld + col" in atomics


def test_emission_is_deterministic_and_in_the_fixed_order():
    first = built(128, "top_left", ir.Arch.SM80).source
    assert first == built(128, "top_left", ir.Arch.SM80).source
    marks = ["// Configuration", "struct attention_bwd_params",
             "struct alignas(128) SharedStorage", "__device__ __forceinline__ void ldsm_a_km",
             "attention_bwd(const attention_bwd_params p)",
             "attention_bwd_zero(const attention_bwd_params p)", "cudaError_t attention_bwd_launch"]
    places = [first.index(m) for m in marks]
    assert places == sorted(places)
    launcher = first[first.index("cudaError_t attention_bwd_launch("):]
    # the launcher zeroes dQ before the main kernel, even when there are no key rows (the
    # rows == 0 return is _launch_zeroed's)
    assert launcher.index("attention_bwd_zero<<<") < launcher.index(
        "return attention_bwd_launch_zeroed(p, stream);")
    alone = first[first.index("cudaError_t attention_bwd_launch_zeroed("):]
    assert "attention_bwd_zero<<<" not in alone[:alone.index("\n}\n")]
    assert "if (p.rows == 0" in alone[:alone.index("\n}\n")]
    assert "atomicAdd(g_dQ + row * p.dQ_ld + col" in first


def _loops(source: str) -> list[str]:
    """The block loops' bodies of the main kernel, in order (each up to the next loop)."""
    kernel = source[source.index("attention_bwd(const attention_bwd_params p)"):
                    source.index("attention_bwd_zero(const attention_bwd_params p)")]
    starts = [i for i in range(len(kernel)) if kernel.startswith("for (int block", i)]
    starts.append(kernel.index("// The kernel's epilogue, once"))
    return [kernel[a:b] for a, b in zip(starts, starts[1:])]


@pytest.mark.parametrize("d", [64, 128])
def test_the_fast_body_has_no_checks_and_reads_staged_vectors(d):
    """Causal: the blocks before the fast run and after it take the checked body (the loop's end,
    the mask's predicate unless inside it); the fast run neither. lse and D come from shared
    memory, staged with Q and dO by cp.async. Head dim 64: three loops; 128: the compact body,
    one loop, the fast body its first branch and the checked one its second."""
    source = built(d, "top_left", ir.Arch.SM80).source
    if d == 64:
        before, fast, after = _loops(source)
    else:
        (loop,) = _loops(source)
        assert loop.startswith("for (int block = first_block; block < end_block; ++block) {\n"
                               "    if (block >= fast_begin && block < fast_end) {\n")
        fast, before = loop.split("\n    } else {\n")
        after = before
    for checked in (before, after):
        assert "const bool interior = block >= inside_begin && block < inside_end;" in checked
        assert "col < loop_len ? " in checked and "if (row < loop_len) atomicAdd(" in checked
    assert "constexpr bool interior = true;" in fast
    assert "col < loop_len" not in fast and "row < loop_len" not in fast
    assert "atomicAdd(g_dQ + row * p.dQ_ld + col" in fast
    for body in (before, fast, after):
        assert ("exp_diff(v5[j][e], s_lse[col - kv0])" in body
                and "s_D[col - kv0]" in body)
        assert "g_lse" not in body and "g_D" not in body
    assert source.count("cp_async_4(smem_address(&smem.vec_") == 2
    assert "float vec_lse[kStages][kBlock];" in source and "float vec_D[kStages][kBlock];" in source


def test_without_a_mask_the_last_block_alone_is_checked():
    source = built(64, "none", ir.Arch.SM80).source
    (loop,) = _loops(source)
    fast = loop[:loop.index("// The last block")]
    assert "for (int block = 0; block < blocks - 1; ++block)" in fast
    assert "col < loop_len" not in fast and "interior" not in fast
    last = source[source.index("// The last block: positions past the loop's end"):]
    assert "if (row < loop_len) atomicAdd(" in last and "col < loop_len ? " in last


def built_value_dim(d: int, d_v: int, arch: ir.Arch, mask: str = "top_left"):
    """The example at D_qk `d` and D_v `d_v` (V, dO, dV at d_v), the rulebook's configuration."""
    text = TEXT.replace("128]", f"{d}]").replace(MASKED, MASKS[mask]).replace(
        "    tile 128x32\n", "\n")
    for name, dims in (("V", "T"), ("dO", "S"), ("dV", "T")):
        text = text.replace(f"{name} : bf16[B, H, {dims}, {d}]",
                            f"{name} : bf16[B, H, {dims}, {d_v}]")
    module = parse(text, "attention_bwd.kg")
    assert verify(module) == []
    return build_verified(module.kernels[0], arch)


@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A], ids=lambda a: a.value)
def test_accumulators_of_two_widths_are_declared_and_stored_each_at_its_own(arch):
    """D 128, D_v 64: dv's accumulator [kNAcc64N8][4], dk's [kNAcc128N8][4], and the kernel's
    epilogue a part per N, each storing its own output at its columns; on sm_90a wgmma_rs at
    both N (an overload by the accumulator's extent)."""
    source = built_value_dim(128, 64, arch).source
    assert "constexpr int kNAcc64 = 64;  // dv's columns" in source
    assert "constexpr int kNAcc128 = 128;  // dk's columns" in source
    assert "float acc_g1[kNAcc64N8][4];  // dv" in source
    assert "float acc_g3[kNAcc128N8][4];  // dk" in source
    assert "kNAccN8" not in source and "kNAcc " not in source
    dv_part = source.index("// on dv's [")
    dk_part = source.index("// on dk's [")
    # (sm_90a: each staged in the ring of its columns for the copy engine, test_loop_dag_tail)
    dv_store, dk_store = (
        ("stage_fragments<kNAcc64N8>(smem_address(smem.do_ring)",
         "stage_fragments<kNAcc128N8>(smem_address(smem.q_ring)") if arch is ir.Arch.SM90A
        else ("store_warp_rows<1, kNAcc64N8>(g_dV", "store_warp_rows<1, kNAcc128N8>(g_dK"))
    assert dv_part < source.index(dv_store) < dk_part < source.index(dk_store)
    if arch is ir.Arch.SM90A:
        assert "void wgmma_rs(float (&acc)[8][4], const unsigned (&a)[4]," in source
        assert "void wgmma_rs(float (&acc)[16][4], const unsigned (&a)[4]," in source
    plain = built(128, "top_left", arch).source
    assert "constexpr int kNAcc = 128;  // the accumulators' columns" in plain
    assert "// on dv's [" not in plain


VALUE_DIMS = [(ir.Arch.SM80, 128, 64), (ir.Arch.SM80, 64, 128), (ir.Arch.SM80, 192, 128),
              (ir.Arch.SM90A, 128, 64), (ir.Arch.SM90A, 64, 128)]


@pytest.mark.slow
@pytest.mark.parametrize("arch, d, d_v", VALUE_DIMS,
                         ids=[f"{a.value}-{d}-{v}" for a, d, v in VALUE_DIMS])
@pytest.mark.parametrize("mask", ["none", "top_left"])
def test_value_dims_compile_without_spills(arch, d, d_v, mask):
    """NVRTC 13.5: 0 spills at D 128 / D_v 64 and 64 / 128 on both skeletons (sm_90a's wgmma),
    192 / 128 on sm_80's mma.sync (sm_90a refuses it: tests/lower/test_loop_dag.py), and the
    sm_80 plan built for Hopper (the GPU compiles it for its own arch)."""
    from kgen.runtime.nvrtc import compile_cubin

    b = built_value_dim(d, d_v, arch, mask)
    builds = [arch.value] + (["sm_90a"] if arch is ir.Arch.SM80 else [])
    for build in builds:
        result = compile_cubin(b.source, b.plan.name, build)
        resources = result.resources()
        assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
            (build, resources)
        assert resources.get("stack_bytes", 0) == 0, (build, resources)
