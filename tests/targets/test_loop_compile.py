"""Tile programs compiled by NVRTC on the CPU for sm_80 and sm_90a with 0 spills and no stack:
flash attention forward (causal or not, ALiBi, softcap, head dims 64 and 128, LSE output, GQA,
f16), the looped MLP (N0 a runtime size; both operand layouts), the row kernel; the rulebook's
default and written configurations. Also the skeleton's fixed order and deterministic output."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.api import build_verified

from tests import loop_kernels as lk

ARCHS = [ir.Arch.SM80, ir.Arch.SM90A]

KERNELS = {
    "attention_d64": lambda a: lk.attention(64, arch=a),
    "attention_d128_causal": lambda a: lk.attention(128, causal=True, arch=a),
    "attention_d64_causal_no_lse": lambda a: lk.attention(64, causal=True, lse=False, arch=a),
    "attention_d128_alibi": lambda a: lk.attention(128, alibi=True, arch=a),
    "attention_d64_softcap": lambda a: lk.attention(64, softcap=30.0, arch=a),
    "attention_d128_gqa_softcap_alibi": lambda a: lk.attention(
        128, gqa=True, softcap=50.0, alibi=True, causal=True, arch=a),
    "attention_d128_f16_shift": lambda a: lk.attention(128, shift=True, dtype=ir.DType.F16,
                                                       arch=a),
    "attention_d128_64x32_s3": lambda a: lk.attention(128, tile=(64, 32), stages=3, arch=a),
    "attention_d64_128x128_s1": lambda a: lk.attention(64, tile=(128, 128), stages=1, arch=a),
    "mlp_col": lambda a: lk.mlp(arch=a),
    "mlp_row": lambda a: lk.mlp(w_layout=ir.Layout.ROW, arch=a),
    "mlp_k64_n256": lambda a: lk.mlp(64, 256, arch=a),
    "mlp_k128_n256": lambda a: lk.mlp(128, 256, arch=a),
    "mlp_k256_n256_row": lambda a: lk.mlp(256, 256, w_layout=ir.Layout.ROW, arch=a),
    "attention_d256_causal": lambda a: lk.attention(256, causal=True, arch=a),
    "attention_d64_64x128_s2": lambda a: lk.attention(64, tile=(64, 128), stages=2, arch=a),
    # one slot each of K and V (stages 1): the rulebook's D 256 (64 rows, 4 warps), written at
    # D 128 in 8 warps, and D 256's long score chain (its fall back to two slots of 32)
    "attention_d256": lambda a: lk.attention(256, arch=a),
    "attention_d128_128x64_s1": lambda a: lk.attention(128, tile=(128, 64), stages=1, arch=a),
    "attention_d256_gqa_softcap_alibi": lambda a: lk.attention(
        256, gqa=True, softcap=50.0, alibi=True, causal=True, arch=a),
    "rowdot_128": lambda a: lk.rowdot(128, arch=a),
    "rowdot_72_f16": lambda a: lk.rowdot(72, dtype=ir.DType.F16, arch=a),
}


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("which", list(KERNELS))
def test_compiles_without_spills(which, arch):
    from kgen.runtime.nvrtc import compile_cubin

    built = build_verified(KERNELS[which](arch), arch)
    resources = compile_cubin(built.source, built.plan.name, arch.value).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0, \
        resources
    assert resources.get("stack_bytes", 0) == 0, resources
    assert resources["registers"] <= 255


@pytest.mark.parametrize("which", ["attention_d128_gqa_softcap_alibi", "mlp_row", "rowdot_128"])
def test_emission_is_deterministic_and_in_the_fixed_order(which):
    first = build_verified(KERNELS[which](ir.Arch.SM80), ir.Arch.SM80).source
    again = build_verified(KERNELS[which](ir.Arch.SM80), ir.Arch.SM80).source
    assert first == again
    order = ["// Configuration", "// Parameters", "__launch_bounds__", "// Host API"]
    if which != "rowdot_128":
        order.insert(2, "// Shared storage")
    positions = [first.index(marker) for marker in order]
    assert positions == sorted(positions)
    assert "#ifndef __CUDACC_RTC__" in first  # the launcher is for nvcc builds only


def test_sm90a_plan_says_why_it_is_mma_sync():
    # W1 column-major: the rulebook refuses the wgmma skeleton (tests/targets/test_loop_sm90.py)
    built = build_verified(KERNELS["mlp_col"](ir.Arch.SM90A), ir.Arch.SM90A)
    assert built.plan.mma.value == "mma.sync.m16n8k16"
    assert "wgmma" in built.plan.mma.why
    assert "__CUDA_ARCH__ < 900" in built.source  # the sm_90a gate of the arch guard
    assert "MMA: mma.sync.m16n8k16 (sm_90a runs" in built.source


def test_masks_and_infinities_render_as_expressions():
    source = build_verified(KERNELS["attention_d128_gqa_softcap_alibi"](ir.Arch.SM80),
                            ir.Arch.SM80).source
    assert "static_cast<float>(col) <= static_cast<float>(row)" in source
    # the body's tanh is the hardware's (plan.tanh: tests/targets/test_loop_mods.py)
    assert "tanh_approx(" in source and "(-kInf)" in source
    assert re.search(r"kv_head \* p\.K_hs", source) and re.search(r"head \* p\.Q_hs", source)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["attention_d128_gqa_softcap_alibi", "mlp_row", "rowdot_128"])
def test_the_cu_builds_with_plain_nvcc_without_warnings(which, tmp_path):
    """The artifact, host launcher included, builds with nvcc alone."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc on PATH")
    for arch in ARCHS:
        built = build_verified(KERNELS[which](arch), arch)
        source = tmp_path / f"{built.plan.name}.{arch.value}.cu"
        source.write_text(built.source)
        done = subprocess.run([nvcc, "-std=c++17", f"-arch={arch.value}", "-Xcompiler",
                               "-Wall,-Wextra", "-c", str(source), "-o",
                               str(source.with_suffix(".o"))], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
@pytest.mark.parametrize("cols, heads", [(128, True), (72, False), (512, True)])
def test_row_kernel_with_tensor_output_compiles_without_spills(arch, cols, heads):
    from kgen.runtime.nvrtc import compile_cubin

    built = build_verified(lk.rmsnorm(cols, arch=arch, heads=heads), arch)
    resources = compile_cubin(built.source, built.plan.name, arch.value).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


@pytest.mark.slow
def test_a_cpp_consumer_links_against_the_header_and_launcher(tmp_path):
    """The .h declares the params struct and the launcher the .cu defines: a consumer that
    includes it builds and links with nvcc alone."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc on PATH")
    built = build_verified(KERNELS["attention_d128_gqa_softcap_alibi"](ir.Arch.SM80),
                           ir.Arch.SM80)
    (tmp_path / "attention_fwd.cu").write_text(built.source)
    (tmp_path / "attention_fwd.h").write_text(built.header)
    (tmp_path / "main.cu").write_text(
        '#include "attention_fwd.h"\n'
        "int main() {\n"
        "  attention_fwd_params p{};\n"
        "  p.rows = 0;  // nothing to run: the launcher returns before any launch\n"
        "  p.heads = 1;\n"
        "  p.group = 1;\n"
        "  p.batches = 1;\n"
        "  if (attention_fwd_can_implement(p) != nullptr) return 2;\n"
        "  return attention_fwd_launch(p, nullptr) == cudaSuccess ? 0 : 1;\n"
        "}\n")
    done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_80", str(tmp_path / "main.cu"),
                           str(tmp_path / "attention_fwd.cu"), "-o", str(tmp_path / "main")],
                          capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "main").exists()
