"""The attention backward's DAG loop (examples/attention_bwd.kg) compiled by NVRTC on the CPU
for sm_80 and sm_90a, head dims 64 and 128, no mask and causal (top-left and bottom-right),
bf16 and f16: 0 spills and no stack at the rulebook's configuration; the emitted .cu in the
skeleton's fixed order, deterministic, with its zeroing kernel and launcher."""
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


def built(d: int, mask: str, arch: ir.Arch, dtype: str = "bf16"):
    text = (TEXT.replace("128]", f"{d}]").replace(MASKED, MASKS[mask])
            .replace("bf16[", f"{dtype}[").replace("    tile 128x32\n", "\n"))
    module = parse(text, "attention_bwd.kg")
    assert verify(module) == []
    return build_verified(module.kernels[0], arch)


@pytest.mark.slow
@pytest.mark.parametrize("arch", [ir.Arch.SM80, ir.Arch.SM90A], ids=lambda a: a.value)
@pytest.mark.parametrize("d", [64, 128])
@pytest.mark.parametrize("mask", list(MASKS))
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_compiles_without_spills(arch, d, mask, dtype):
    from kgen.runtime.nvrtc import compile_cubin

    b = built(d, mask, arch, dtype)
    resources = compile_cubin(b.source, b.plan.name, arch.value).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources


def test_emission_is_deterministic_and_in_the_fixed_order():
    first = built(128, "top_left", ir.Arch.SM80).source
    assert first == built(128, "top_left", ir.Arch.SM80).source
    marks = ["// Configuration", "struct attention_bwd_params",
             "struct alignas(128) SharedStorage", "__device__ __forceinline__ void ldsm_a_km",
             "attention_bwd(const attention_bwd_params p)",
             "attention_bwd_zero(const attention_bwd_params p)", "cudaError_t attention_bwd_launch"]
    places = [first.index(m) for m in marks]
    assert places == sorted(places)
    launcher = first[first.index("cudaError_t attention_bwd_launch"):]
    # the launcher zeroes dQ before the main kernel, even when there are no key rows
    assert launcher.index("attention_bwd_zero<<<") < launcher.index("if (p.rows == 0")
    assert "atomicAdd(g_dQ + row * p.dQ_ld + col" in first


def _loops(source: str) -> list[str]:
    """The block loops' bodies of the main kernel, in order (each up to the next loop)."""
    kernel = source[source.index("attention_bwd(const attention_bwd_params p)"):
                    source.index("attention_bwd_zero(const attention_bwd_params p)")]
    starts = [i for i in range(len(kernel)) if kernel.startswith("for (int block", i)]
    starts.append(kernel.index("// The kernel's epilogue, once"))
    return [kernel[a:b] for a, b in zip(starts, starts[1:])]


def test_the_fast_body_has_no_checks_and_reads_staged_vectors():
    """Causal: the blocks before the fast run and after it take the checked body (the loop's end,
    the mask's predicate unless inside it); the fast run neither. lse and D come from shared
    memory, staged with Q and dO by cp.async."""
    source = built(128, "top_left", ir.Arch.SM80).source
    before, fast, after = _loops(source)
    for checked in (before, after):
        assert "const bool interior = block >= inside_begin && block < inside_end;" in checked
        assert "col < loop_len ? " in checked and "if (row < loop_len) atomicAdd(" in checked
    assert "constexpr bool interior = true;" in fast
    assert "col < loop_len" not in fast and "row < loop_len" not in fast
    assert "atomicAdd(g_dQ + row * p.dQ_ld + col" in fast
    for body in (before, fast, after):
        assert "exp_diff(v5[j][e], s_lse[col - kv0])" in body and "s_D[col - kv0]" in body
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
