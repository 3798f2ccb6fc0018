"""Chains of any shape that fits (issue 17): a source N of 16 mod 32 gives the chained gemm a
k tile of one k16 step, whose fragments alternate buffers by the chain's step; an output of
fewer than 16 columns gives B1 stages of fewer 16-byte chunks than the CTA has threads, which
only the first threads copy. No schedule lines: the builder plans each, on both targets."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.verify import verify

from tests.kernels import B2B_CHAIN, b2b_chain_text, gemm_kernel

ARCHS = (ir.Arch.SM80, ir.Arch.SM90A)


def chain(k0: int, n0: int, n1: int, dtype: str = "f16") -> ir.Kernel:
    module = parse(B2B_CHAIN.format(t=dtype, k0=k0, n0=n0, n1=n1), "chain.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("k0", [32, 576])
@pytest.mark.parametrize("n0", range(16, 257, 16))
def test_every_source_n_plans_without_schedule_lines(k0, n0, arch):
    for n1 in (8, 40, 128, 320):
        plan = lower(chain(k0, n0, n1), arch)  # raised KgenError for 144 of these before
        g0, g1 = plan.gemms
        assert g0.tile[1] == n0  # g0 covers its whole N: the intermediate stays on chip
        assert g1.tile[2] in (16, 32, 64) and n0 % g1.tile[2] == 0
        # the tile covers N1, or 256 of it; or on sm_90a's ping-pong chain a column block of it
        # (KernelPlan.column_blocks: a B1 too large to stay resident as one tile)
        blocks = plan.column_blocks
        assert g1.tile[1] >= min(n1, 256) or blocks > 1 and g1.tile[1] * blocks >= n1


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_a_source_n_of_16_mod_32_chains_by_single_step_k_tiles(arch):
    assert lower(chain(576, 48, 128), arch).gemms[1].tile[2] == 16


def test_single_step_k_tiles_alternate_fragment_buffers_by_the_chain_step():
    from kgen.emit import emit

    text = b2b_chain_text("f16", 576, 48, 128, target="sm_80",
                          g0=("tile 64x48x64 warps 4x1 stages 3",),
                          g1=("tile 64x128x16 warps 4x1 stages 2", "keep g0 in registers"))
    module = parse(text, "chain.kg")
    verify(module)
    plan = lower(module.kernels[0])
    assert plan.gemms[1].chain.k_steps == 3 and plan.gemms[1].tile[2] == 16
    source = emit(plan, source_name="chain.kg", source_hash="", command="test")
    # B1 streamed: step s multiplies buffer s % 2, loaded while step s - 1 multiplied the other
    steps = re.findall(r"mma_step\(acc, g1_a_frag\[(\d)\], b_frag\[(\d)\]\)", source)
    assert [(int(a), int(b)) for a, b in steps] == [(0, 0), (1, 1), (2, 0)], steps


def test_a_streamed_gemm_still_needs_two_k_steps_per_tile():
    with pytest.raises(KgenError) as err:
        lower(gemm_kernel(tile=(128, 128, 16)))
    assert "tile K must be a multiple of 32, got 16" in err.value.message


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_a_narrow_b_tile_is_copied_by_the_first_threads(arch):
    from kgen.emit import emit

    plan = lower(chain(576, 80, 8), arch)
    g1 = plan.gemms[1]
    threads = g1.warps[0] * g1.warps[1] * 32
    chunks = g1.b.smem.stage_elems * 2 // 16
    assert chunks < threads and g1.b.copy_threads == chunks
    assert g1.b.copies_per_thread == 1 and len(g1.b.copy_steps) == 1
    source = emit(plan, source_name="chain.kg", source_hash="", command="test")
    assert f"if (tid < {chunks}) {{  // one chunk each" in source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("k0, n0, n1, dtype", [
    (576, 48, 128, "f16"), (576, 80, 8, "bf16"), (32, 48, 8, "f16"), (1000, 48, 64, "bf16"),
    (576, 16, 8, "f16"),
])
def test_new_chain_shapes_compile_without_spills(k0, n0, n1, dtype, arch, tmp_path,
                                                 monkeypatch):
    pytest.importorskip("cuda.bindings")
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    from kgen.api import build, compile_source

    built = build(chain(k0, n0, n1, dtype), arch, source_name="chain.kg")
    result = compile_source(built.source, built.plan.name, arch)
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
