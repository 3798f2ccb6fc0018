"""sm_90a's loop skeleton (templates/sm90/loop.cu.j2): the rulebook's wgmma section chooses it
(or refuses it, with why, and the mma.sync skeleton runs), the plan holds its schedule
(plan.wgmma), the .cu and `kgen inspect` say which skeleton and why, and NVRTC compiles it
with 0 spills and no wgmma serialization across head dims, masks, GQA, f16 and configurations."""
from __future__ import annotations

import json

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.report_program import program_summary
from kgen.targets import loop_rules, target
from kgen.targets.loop_rules import LoopConfig

from tests import loop_kernels as lk

SM90A = ir.Arch.SM90A


def _built(kernel):
    return build_verified(kernel, SM90A)


def test_attention_runs_the_wgmma_skeleton_and_says_so():
    built = _built(lk.attention(128, causal=True, gqa=True, arch=SM90A))
    plan = built.plan
    assert plan.wgmma is not None and plan.wgmma.consumers == 2
    assert plan.threads == 384 and plan.config.value == "tile 128x128 warps 8 stages 2"
    assert plan.mma.value.startswith("wgmma.m64n128k16 (SS")
    assert [m.param for m in plan.wgmma.maps] == ["Q", "K", "V"]
    assert [m.kv for m in plan.wgmma.maps] == [False, True, True]
    assert plan.smem_bytes == loop_rules.wgmma_smem_bytes(LoopConfig(128, 128, 2), 128, 128)
    source = built.source
    assert "// Skeleton: sm_90a, warp-specialized wgmma" in source
    assert "__CUDA_ARCH__ != 900" in source  # the wgmma gate of the arch guard
    assert "setmaxnreg_dec<kProducerRegisters>" in source and "tma_load_box_4d" in source
    assert "__grid_constant__ attention_fwd_cfg::TensorMaps maps" in source
    summary = program_summary(plan)
    json.dumps(summary)  # the --json schema
    assert summary["skeleton"]["value"] == "sm_90a warp-specialized wgmma"
    assert [b["name"] for b in summary["buffers"]] == ["q_smem", "k_smem", "v_smem", "barriers"]


def test_exp_is_exp2_of_the_scaled_argument_and_nothing_else_changes():
    source = _built(lk.attention(64, arch=SM90A)).source
    assert "exp2f((" in source and ") * kLog2e)" in source
    assert "expf(" not in source.replace("exp2f(", "")
    assert "logf(" in source  # the user's log stays log


@pytest.mark.parametrize("kernel, reason", [
    (lambda: lk.mlp(arch=SM90A), "columns along the loop"),  # W1 column-major
    (lambda: lk.attention(128, tile=(64, 32), stages=3, arch=SM90A), "the block must be"),
    (lambda: lk.attention(256, causal=True, arch=SM90A), "needs 327808 B of shared memory"),
])
def test_a_refused_program_runs_mma_sync_and_says_why(kernel, reason):
    built = _built(kernel())
    assert built.plan.wgmma is None
    assert built.plan.mma.value == "mma.sync.m16n8k16"
    assert "refuses its wgmma skeleton" in built.plan.mma.why and reason in built.plan.mma.why
    assert "// Skeleton: sm_90a" not in built.source


def test_sm80_programs_never_take_the_wgmma_skeleton():
    assert _built(lk.attention(128, arch=SM90A)).plan.wgmma is not None
    assert build_verified(lk.attention(128), ir.Arch.SM80).plan.wgmma is None


def test_rulebook_refusals():
    tgt = target(SM90A)
    ok = LoopConfig(128, 128, 2)
    assert loop_rules.wgmma_refusal(ok, 128, 128, ir.DType.BF16, tgt, True, True) is None
    assert "K-major" in loop_rules.wgmma_refusal(ok, 128, 128, ir.DType.BF16, tgt, False, True)
    assert "multiples of 64" in loop_rules.wgmma_refusal(ok, 96, 128, ir.DType.BF16, tgt,
                                                          True, True)
    assert "shared memory" in loop_rules.wgmma_refusal(LoopConfig(128, 128, 2), 256, 256,
                                                       ir.DType.BF16, tgt, True, True)
    assert "no wgmma" in loop_rules.wgmma_refusal(ok, 128, 128, ir.DType.BF16,
                                                  target(ir.Arch.SM80), True, True)
    # the written lines are kept: 64 rows is one consumer warpgroup
    config, why = loop_rules.wgmma_default(64, 64, ir.DType.BF16, tgt, True, True, tile_m=64)
    assert config == LoopConfig(64, 128, 2) and "wgmma" in why


COMPILED = {
    "d64": lambda: lk.attention(64, arch=SM90A),
    "d128_causal_gqa": lambda: lk.attention(128, causal=True, gqa=True, arch=SM90A),
    "d128_alibi_softcap": lambda: lk.attention(128, alibi=True, softcap=30.0, arch=SM90A),
    "d64_shift_f16": lambda: lk.attention(64, shift=True, dtype=ir.DType.F16, arch=SM90A),
    "d128_128x64_s3": lambda: lk.attention(128, tile=(128, 64), stages=3, arch=SM90A),
    "d64_64x128_s1": lambda: lk.attention(64, tile=(64, 128), stages=1, arch=SM90A),
}


@pytest.mark.slow
@pytest.mark.parametrize("which", list(COMPILED))
def test_nvrtc_compiles_without_spills_or_wgmma_serialization(which):
    from kgen.runtime.nvrtc import compile_cubin

    built = _built(COMPILED[which]())
    assert built.plan.wgmma is not None
    compiled = compile_cubin(built.source, built.plan.name, SM90A.value)
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    assert resources["registers"] >= 128, resources  # the body, not the compute_90 pass's trap
    assert "serialized" not in compiled.log, compiled.log


@pytest.mark.slow
@pytest.mark.parametrize("ahead", [True, False], ids=["issue_ahead", "in_order"])
def test_both_overlaps_compile_without_spills_or_serialization(ahead):
    """The overlap is a plan value: the skeleton renders either (the rulebook picks ahead)."""
    import dataclasses

    from kgen.runtime.nvrtc import compile_cubin
    from kgen.targets.sm90.loop import emit_loop

    plan = _built(lk.attention(128, causal=True, gqa=True, arch=SM90A)).plan
    assert plan.wgmma.issue_ahead
    assert plan.wgmma.pingpong  # two consumers, overlapped: they take turns
    plan = dataclasses.replace(plan, wgmma=dataclasses.replace(plan.wgmma, issue_ahead=ahead,
                                                               pingpong=ahead))
    source = emit_loop(plan, source_name="t.kg", source_hash="0", command="kgen compile t.kg")
    assert ("wgmma_wait<1>()" in source) is ahead
    assert ("named_barrier_sync(2 + consumer" in source) is ahead
    compiled = compile_cubin(source, plan.name, SM90A.value)
    assert compiled.resources().get("spill_stores", 0) == 0
    assert "serialized" not in compiled.log and "C7517" not in compiled.log, compiled.log
