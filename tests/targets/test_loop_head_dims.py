"""Attention's head dims through the loop skeleton, compiled by NVRTC on the CPU for sm_80 and
sm_90a with 0 spills and no stack: D 64, 96, 128, 192, 256 and D_qk 192 / D_v 128 (kgen.attention's
programs, causal or not), and the windowed example; the rulebook's refusal of a configuration
past the register budget, located at the loop."""
from __future__ import annotations

import pytest

from kgen import attention as kattention
from kgen.api import build_file, build_verified
from kgen.errors import KgenError
from kgen.parse import parse

HEAD_DIMS = [(64, 64), (96, 96), (128, 128), (192, 192), (256, 256), (192, 128)]


def _resources(built, arch):
    from kgen.runtime.nvrtc import compile_cubin

    return compile_cubin(built.source, built.plan.name, arch).resources()


def _no_spills(resources):
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    assert resources["registers"] <= 255


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("d_qk, d_v", HEAD_DIMS, ids=lambda d: str(d))
def test_head_dims_compile_without_spills(d_qk, d_v, causal, arch):
    sig = kattention.Signature("bf16", d_qk, d_v, causal, None, None, (), arch)
    built = build_verified(kattention.program(sig), arch)
    _no_spills(_resources(built, arch))


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_window_example_compiles_without_spills(arch):
    _no_spills(_resources(build_file("examples/attention_fwd_window.kg", arch), arch))


@pytest.mark.parametrize("d_qk, d_v", HEAD_DIMS, ids=lambda d: str(d))
def test_head_dims_take_a_legal_configuration(d_qk, d_v):
    sig = kattention.Signature("bf16", d_qk, d_v, True, None, None, ())
    plan = build_verified(kattention.program(sig), "sm_80").plan
    assert (plan.gemm0.k, plan.gemm1.n) == (d_qk, d_v)
    assert plan.smem_bytes <= 163 * 1024
    # the register budget (kgen/targets/loop_rules.py): 32 rows a warp (4 warps) where a block
    # of 64 or 32 fits them, else 16 (8 warps) with a block of 64 and two ring slots; at D 256,
    # where two slots of 64 do not fit beside 128 rows, 64 rows (4 warps) and one slot each
    warps, block, stages = {(64, 64): (4, 64, 2), (96, 96): (4, 32, 2), (128, 128): (4, 32, 2),
                            (192, 192): (8, 64, 2), (256, 256): (4, 64, 1),
                            (192, 128): (8, 64, 2)}[d_qk, d_v]
    assert (plan.warps, plan.block, plan.stages) == (warps, block, stages)


def test_a_block_past_the_register_budget_is_refused_at_the_loop():
    text = kattention.program_text(
        kattention.Signature("bf16", 256, 256, False, None, None, ())).replace(
        "  loop kv over T {\n", "  loop kv over T {\n    tile 64x128  stages 1\n")
    kernel = parse(text, "d256.kg").kernels[0]
    with pytest.raises(KgenError) as err:
        build_verified(kernel, "sm_80")
    assert err.value.loc.file == "d256.kg" and err.value.loc.line == 9  # the loop
    assert ("block 128 with N1 256 at 16 rows a warp needs about 304 registers per thread"
            in err.value.message)
