"""The attention mods' plan choices in both loop skeletons (no GPU): the body's tanh by the
hardware's instruction (plan.tanh, said in the .cu and by `kgen inspect`), never in a kernel
without tanh or in the kernel's epilogue."""
from __future__ import annotations

import dataclasses
import re

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.plan import program as pp
from kgen.report_program import program_summary

from tests import loop_kernels as lk

ARCHS = [ir.Arch.SM80, ir.Arch.SM90A]


def _kernel_body(source: str) -> str:
    """The .cu from the kernel's entry on (the helpers above it define tanh_approx)."""
    return source[source.index('extern "C" __global__'):]


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_softcap_body_takes_the_hardware_tanh_and_says_why(arch):
    built = build_verified(lk.attention(128, softcap=30.0, causal=True, arch=arch), arch)
    assert built.plan.tanh.value == pp.TANH_APPROX
    assert "2^-10.99" in built.plan.tanh.why
    source = built.source
    assert "asm(\"tanh.approx.f32 %0, %1;\"" in source
    assert "// tanh in the loop's body: tanh.approx.f32 (" in source
    body = _kernel_body(source)
    assert "tanh_approx(" in body and "tanhf(" not in body
    summary = program_summary(built.plan)
    assert summary["tanh"]["value"] == "tanh.approx.f32"


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_a_kernel_without_tanh_keeps_every_byte(arch):
    built = build_verified(lk.attention(128, alibi=True, arch=arch), arch)
    assert built.plan.tanh.value == "none"
    assert "tanh" not in built.source
    assert program_summary(built.plan)["tanh"]["value"] == "none"


def test_the_kernels_epilogue_keeps_tanhf():
    """tanh after the loop runs once per tile of rows: full precision there."""
    kernel = lk.attention(64, softcap=30.0, arch=ir.Arch.SM80)
    o_store = kernel.epilogue.stmts[0]
    tanh_o = ir.Store("O", ir.Call(ir.Op.TANH, (o_store.value,)))
    kernel = dataclasses.replace(
        kernel, epilogue=ir.Epilogue((tanh_o,) + kernel.epilogue.stmts[1:]))
    body = _kernel_body(build_verified(kernel, ir.Arch.SM80).source)
    assert re.search(r"tanhf\(", body) and "tanh_approx(" in body


def _bias_attention(d: int = 128, causal: bool = True):
    from kgen import attention as kattention

    s = kattention.Signature("bf16", d, d, causal, None, None, (), "sm_90a", True)
    return kattention.program(s)


def test_sm90a_stages_a_tensor_read_at_row_col_by_the_copy_engine():
    built = build_verified(_bias_attention(), ir.Arch.SM90A)
    w = built.plan.wgmma
    assert w.staged_tile is not None and w.staged_tile.param == "Bias"
    assert (w.staged_tile.rows, w.staged_tile.boxes, w.staged_tile.slots) == (128, 2, 2)
    assert w.staged_tile.offset == w.v_tile.offset + w.v_tile.bytes
    assert w.barrier_offset == w.staged_tile.offset + w.staged_tile.bytes
    assert built.plan.smem_bytes <= 227 * 1024
    assert [m.param for m in w.maps] == ["Q", "K", "V", "Bias", "O"]
    source = built.source
    assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in source
    assert "mbarrier_expect_tx(t_full + 8 * slot, k_t_smem_slot_bytes)" in source
    assert "if (lane == 0) mbarrier_arrive(t_empty + 8 * slot);" in source
    assert "g_Bias" not in source  # no global load of the bias left
    summary = program_summary(built.plan)
    assert summary["skeleton"]["staging"]["value"].startswith("Bias's [128, 128] tile")
    assert "t_smem" in [b["name"] for b in summary["buffers"]]


def test_staging_refused_where_the_block_is_no_box_multiple_says_why():
    """Head dim 256 runs blocks of 80 columns: the bias stays a global load, and the plan says
    why."""
    plan = build_verified(_bias_attention(256), ir.Arch.SM90A).plan
    assert plan.block == 80 and plan.wgmma.staged_tile is None
    assert plan.wgmma.staging.value == "Bias read per element from global memory"
    assert "not a multiple of the copy engine's 64-column boxes" in plan.wgmma.staging.why


def test_sm90a_bias_staged_compiles_without_spills():
    from kgen.runtime.nvrtc import compile_cubin

    built = build_verified(_bias_attention(), ir.Arch.SM90A)
    resources = compile_cubin(built.source, built.plan.name, "sm_90a").resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_division_by_a_shared_divisor_is_by_its_reciprocal_and_says_so(arch):
    """softcap's score / cap: cap is uniform, so a times 1 / cap (plan.division); the kernel's
    epilogue's o / l: l is a row's, so o times 1 / l, in the plain kernel too."""
    built = build_verified(lk.attention(128, softcap=30.0, arch=arch), arch)
    assert built.plan.division.value == pp.RECIPROCAL
    source = built.source
    assert "// Division in the loop's body and the epilogue after it: a * (1 / b) (" in source
    assert " * (1.0f / p.cap);" in _kernel_body(source)
    assert program_summary(built.plan)["division"]["value"] == pp.RECIPROCAL
    plain = build_verified(lk.attention(128, arch=arch), arch)
    assert plain.plan.division.value == pp.RECIPROCAL
    tail = _kernel_body(plain.source).split("The kernel's epilogue")[1]
    assert "(1.0f / carry_l[i])" in tail and "/ carry_l" not in tail.replace("1.0f / carry_l", "")


def test_a_tile_divisor_keeps_the_division():
    """x / x-like divisors vary per element: no reciprocal to share."""
    from kgen import attention as kattention

    s = kattention.Signature("bf16", 64, 64, False, "score / (1 + col)", None, (), "sm_80")
    built = build_verified(kattention.program(s), ir.Arch.SM80)
    body = _kernel_body(built.source).split("The kernel's epilogue")[0]
    assert "1.0f /" not in body and "[j][e] / v" in body  # (the epilogue's o / l takes 1 / l)


def _document_attention(arch: str, causal: bool = True, mask: str = "qd[row] == kd[col]"):
    from kgen import attention as kattention

    s = kattention.Signature("bf16", 128, 128, causal, None, mask, (), arch, False,
                             (("kd", "col"), ("qd", "row")))
    return kattention.program(s)


@pytest.mark.parametrize("arch", ARCHS, ids=lambda a: a.value)
def test_a_document_mask_is_scanned_per_tile_and_folded_inside(arch):
    built = build_verified(_document_attention(arch.value), arch)
    bounds = built.plan.bounds
    assert bounds.skips and bounds.equalities == (pp.EqualBound("qd", "kd"),)
    assert len(bounds.bounds) == 1  # causal's col <= row
    assert "qd[row] == kd[col], its columns scanned per tile of rows" in bounds.why
    # the equality, the causal comparison and their product read 1 inside the mask
    assert len(bounds.fold) == 3
    source = built.source
    assert "__shared__ int scan[5];" in source and "__reduce_min_sync" in source
    assert "__device__ __forceinline__ int ordered_int(float x)" in source
    assert "interior ? 1.0f : ((row < rows ? g_qd[row]" in source
    summary = program_summary(built.plan)
    assert "qd[row] == kd[col] (scanned per tile)" in summary["loop_bounds"]["bounds"]


@pytest.mark.parametrize("mask", ["qd[row] == kd[col]", "kd[col] == qd[row]",
                                  "(kd[col] == qd[row]) * (col > row - 64)"])
def test_either_order_and_with_a_window(mask):
    plan = build_verified(_document_attention("sm_90a", False, mask), ir.Arch.SM90A).plan
    assert plan.bounds.equalities == (pp.EqualBound("qd", "kd"),)


def test_a_row_row_equality_is_no_bound():
    """qd[row] == kd[row] is one value per row: nothing to scan across the columns."""
    from kgen import attention as kattention

    s = kattention.Signature("bf16", 64, 64, False, None, "qd[row] == ke[row]", (), "sm_80",
                             False, (("ke", "row"), ("qd", "row")))
    plan = build_verified(kattention.program(s), ir.Arch.SM80).plan
    assert not plan.bounds.skips


def test_the_persistent_scheduler_refuses_an_equality_scan():
    from kgen.targets.sm90.loop_schedule import with_scheduler

    plan = build_verified(_document_attention("sm_90a"), ir.Arch.SM90A).plan
    with pytest.raises(AssertionError, match="every thread of the CTA"):
        with_scheduler(plan, True)


@pytest.mark.slow
def test_sm90a_document_masks_compile_without_spills():
    """(The sm_80 skeleton's document mask at D 128 spills: 28 B before the scan, 60 B with it,
    8 B causal; its rulebook's register estimate does not count the mask's runs.)"""
    from kgen.runtime.nvrtc import compile_cubin

    for causal in (False, True):
        built = build_verified(_document_attention("sm_90a", causal), ir.Arch.SM90A)
        resources = compile_cubin(built.source, built.plan.name, "sm_90a").resources()
        assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0


@pytest.mark.slow
@pytest.mark.parametrize("which", ["bias", "document"])
def test_the_staged_and_scanned_cu_build_with_plain_nvcc_without_warnings(which, tmp_path):
    """The host launcher too: the staged tile's tensor map, the scan's shared words."""
    import shutil
    import subprocess

    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc on PATH")
    for arch in ARCHS:
        kernel = _bias_attention() if which == "bias" else _document_attention(arch.value)
        built = build_verified(kernel, arch)
        source = tmp_path / f"{which}.{arch.value}.cu"
        source.write_text(built.source)
        done = subprocess.run([nvcc, "-std=c++17", f"-arch={arch.value}", "-Xcompiler",
                               "-Wall,-Wextra", "-c", str(source), "-o",
                               str(source.with_suffix(".o"))], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        assert "warning" not in done.stderr, done.stderr


# ---------------------------------------------------------------------------------------------
# random(seed, offset): one Philox call per group of eight elements, drawn by its first reader

def _dropout_forward(arch: str, d: int = 128, causal: bool = True):
    from kgen import attention as dense

    sig = dense.Signature("bf16", d, d, causal, None, None, (), arch, False, (), True)
    return build_verified(dense.program(sig), arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_dropout_draws_a_philox_call_per_group_in_its_reader_s_loop(arch):
    """The draw, at a group's first element (i, j and e even: its rows r, r + 8 and columns
    c, c + 1, c + 8, c + 9 are the thread's fragments i & 1, j & 1, e & 1), then its reader, in
    one loop; each body the skeleton copies draws once (kgen/targets/common/loop.py CRandom)."""
    source = _kernel_body(_dropout_forward(arch).source)
    draw = ("        if (((i | j | e) & 1) == 0) v17_words = philox_group(p.seed, p.offset, "
            "batch, head, p.heads, row, col);\n"
            "        v17[j][e] = philox_value(v17_words, i & 1, j & 1, e & 1);\n")
    bodies = source.count(draw)
    assert bodies >= 2 and source.count("philox_group(") == bodies
    assert "philox_uniform(" not in source
    assert source.count("v19[j][e] = v17[j][e] >= p.dropout_p ? 1.0f : 0.0f;") == bodies
    for at in re.finditer(re.escape(draw), source):  # the reader follows in the same loop
        assert "v19[j][e] = v17" in source[at.end():source.index("\n    }\n", at.end())]


ROW_SUM_OF_RANDOM = """kernel rowsum_random {
  target sm_80
  tensor Q : bf16[B, H, S, 64] row
  tensor K : bf16[B, H, T, 64] row
  tensor V : bf16[B, H, T, 64] row
  tensor O : bf16[B, H, S, 64] row out
  vector U : f32[B, H, S] out
  scalar seed : u64
  scalar offset : u64
  loop kv over T {
    carry u : f32[row] = 0
    gemm s = Q @ K^T accumulate f32 {
      epilogue {
        u = u + rowsum(random(seed, offset))
        s = acc
      }
    }
    gemm o += s @ V accumulate f32
  }
  epilogue {
    O = o
    U = u
  }
}
"""


def test_a_random_read_by_no_tile_value_is_drawn_in_a_loop_of_its_own():
    """rowsum(random(seed, offset)): the reduction's loop reads the values a "random"
    statement drew before it; NVRTC builds it without spills."""
    from kgen.parse import parse
    from kgen.runtime.nvrtc import compile_cubin

    kernel = parse(ROW_SUM_OF_RANDOM, "r.kg").kernels[0]
    built = build_verified(kernel, "sm_80")
    body = _kernel_body(built.source)
    declared = body.index("uint4 v")
    loop = body.index("philox_group(p.seed", declared)
    assert body.index("red_add(", loop) > body.index("\n    }\n", loop)  # after the draw's loop
    result = compile_cubin(built.source, built.plan.name, "sm_80")
    assert (result.spill_stores, result.spill_loads) == (0, 0)


@pytest.mark.slow
def test_dropout_s_forward_makes_half_the_philox_calls():
    """PTX of the forward with dropout at D 128, causal (NVRTC 13.5): 584 mul.hi on sm_90a
    (1160 with 24 bits an element, a call per four), 222 on sm_80 (438); no spills."""
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    for arch, most in (("sm_90a", 640), ("sm_80", 240)):
        built = _dropout_forward(arch)
        ptx = compile_ptx(built.source, built.plan.name, arch)
        assert ptx.count("mul.hi.u32") <= most, (arch, ptx.count("mul.hi.u32"))
        result = compile_cubin(built.source, built.plan.name, arch)
        assert (result.spill_stores, result.spill_loads) == (0, 0), arch
