"""`split S`: the split-K schedule of a one-gemm kernel, and its refusals, located."""
from __future__ import annotations

import dataclasses

import pytest

from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import FieldKind, KernelKind
from kgen.verify import verify

SOURCE = """kernel s {{
  target {arch}
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  vector r : f32[M] out
  gemm g0 = A @ B accumulate f32 {{
    tile 128x128x64  warps 2x4  stages 3  {split}
    epilogue {{ {epilogue} }}
  }}
}}
"""


def source(split="split 4", epilogue="D = acc", arch="sm_80") -> str:
    text = SOURCE.format(split=split, epilogue=epilogue, arch=arch)
    # the row-sum output only where the epilogue writes it (the line numbers stay)
    return text if "rowsum" in epilogue else text.replace("vector r : f32[M] out", "")


def plan(split="split 4", epilogue="D = acc", arch="sm_80"):
    module = parse(source(split, epilogue, arch), "s.kg")
    verify(module)
    return lower(module.kernels[0])


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_split_plans_a_workspace_and_the_split_kernel(arch):
    """sm_80: the tiled kernel, a CTA per part; sm_90a (a 128-row tile on 8 warps): the
    cooperative kernel, a unit of the persistent walk per part."""
    p = plan(arch=arch)
    kind = KernelKind.TILED if arch == "sm_80" else KernelKind.COOPERATIVE
    assert p.schedule.scheduler.kind is kind and p.schedule.scheduler.split_k == 4
    assert p.split_kernel == "s_splitk"
    assert any(f.kind is FieldKind.WORKSPACE for f in p.fields)
    sizes = {"M": 100, "N": 300, "K": 1000}
    assert p.grid(sizes) == (1 * 3 * 4, 1, 1)
    assert p.workspace_floats(sizes) == 4 * 100 * 384
    assert p.split_grid(sizes) == (-(-100 * 150 // 256), 1, 1)
    assert p.grid(sizes, persistent_ctas=8) == ((1 * 3 * 4, 1, 1) if arch == "sm_80"
                                                 else (8, 1, 1))
    rows = {label: (value, why) for label, value, why in p.schedule.describe()}
    assert rows["split-K"][0] == ("4 CTAs per output tile" if arch == "sm_80"
                                  else "4 units of the persistent walk per output tile")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("deterministic", [False, True])
def test_split_with_reductions_plans_a_block_per_tile(arch, deterministic):
    """Epilogue reductions run in <kernel>_splitk, one block per output tile; the deterministic
    mode's slots follow the split-K partials in the workspace."""
    text = source("split 2", "D = acc\n r = rowsum(acc)", arch)
    if deterministic:
        text = text.replace("  target", "  reductions deterministic\n  target")
    module = parse(text, "s.kg")
    verify(module)
    p = lower(module.kernels[0])
    assert p.split_kernel == "s_splitk" and p.schedule.scheduler.split_k == 2
    assert p.deterministic is deterministic
    assert (p.init_kernel is None) is deterministic
    assert (p.finalize_kernel is not None) is deterministic
    sizes = {"M": 300, "N": 257, "K": 4104}
    assert p.split_grid(sizes) == (3 * 3, 1, 1)  # 128x128 tiles
    partials = 2 * 300 * 384
    slots = 3 * 300 if deterministic else 0  # a row reduction: tiles_n slots of M
    assert p.workspace_floats(sizes) == partials + slots


def test_split_1_is_the_plain_kernel():
    p = plan("split 1")
    assert p.schedule.scheduler.split_k == 1 and p.split_kernel is None
    assert not any(f.kind is FieldKind.WORKSPACE for f in p.fields)


@pytest.mark.parametrize("split, epilogue, message", [
    ("split 0", "D = acc", "split must be a positive integer, got 0"),
    ("split 65", "D = acc", "split must be at most 64 CTAs per output tile, got 65"),
])
def test_refusals_point_at_the_split_line(split, epilogue, message):
    with pytest.raises(KgenError) as err:
        plan(split, epilogue)
    assert message in err.value.message
    assert err.value.loc.line == 8


def test_schedule_pingpong_with_split_is_refused_at_the_split():
    text = source("split 2", "D = acc", "sm_90a").replace(
        "  target sm_90a\n", "  target sm_90a\n  schedule pingpong\n")
    module = parse(text, "s.kg")
    verify(module)
    with pytest.raises(KgenError) as err:
        lower(module.kernels[0])
    assert err.value.loc.line == 9
    assert "split 2 runs on the cooperative schedule" in err.value.message
    cooperative = parse(text.replace("schedule pingpong", "schedule cooperative"), "s.kg")
    verify(cooperative)
    assert lower(cooperative.kernels[0]).schedule.scheduler.kind is KernelKind.COOPERATIVE


def test_a_chain_takes_no_split():
    chain = """kernel c {
  target sm_80
  tensor A : f16[M, 64] row
  tensor B0 : f16[64, 64] col
  tensor B1 : f16[64, 64] col
  tensor D : f16[M, 64] row out
  gemm g0 = A @ B0 accumulate f32 {
    tile 128x64x64  warps 4x1  stages 2  split 2
    epilogue { g0 = acc }
  }
  gemm g1 = g0 @ B1 accumulate f32 {
    tile 128x64x32  warps 4x1  stages 2
    keep g0 in registers
    epilogue { D = acc }
  }
}
"""
    with pytest.raises(KgenError) as err:
        verify(parse(chain, "c.kg"))
    assert (err.value.loc.line, "split applies to a kernel of one gemm") == (
        8, err.value.message[:37])


def test_the_ir_field_is_checked():
    module = parse(source("", "D = acc", "sm_80"), "s.kg")
    k = module.kernels[0]
    gemm = dataclasses.replace(k.gemms[0], split=4)  # an int, not an ir.SplitK
    bad = dataclasses.replace(module, kernels=(dataclasses.replace(k, gemms=(gemm,)),))
    with pytest.raises(KgenError, match="split must be a kgen.ir.SplitK or None"):
        verify(bad)


# rowmax, colsum and a scalar absmax: an odd count of deterministic slots for the sizes below
ODD_SLOTS = {"rmax": ("M", "rowmax"), "csum": ("N", "colsum"), "gmax": (None, "reduce_absmax")}
ODD_SIZES = {"M": 150, "N": 129, "K": 1000, "L": 3}  # 64x128 tiles: 3 x 2 of them


def test_deterministic_slots_keep_the_next_batch_partials_aligned():
    """The slots follow the split-K partials; a batch's floats are rounded up to an even count,
    so the next batch's partials keep their 8-byte column pairs (float2 loads and stores)."""
    from kgen.api import build

    from tests.kernels import split_reductions_kernel

    p = build(split_reductions_kernel(deterministic=True, batched=True,
                                      reductions=ODD_SLOTS)).plan
    partials = 4 * 150 * 256
    slots = 2 * 150 + 3 * 129 + 3 * 2  # tiles_n x M, tiles_m x N, tiles_m x tiles_n: 693
    assert p.batch_workspace_floats(ODD_SIZES) == partials + slots + 1
    assert p.workspace_floats(ODD_SIZES) == 3 * (partials + slots + 1)
    assert p.split_grid(ODD_SIZES) == (3 * 3 * 2, 1, 1)  # a block per tile of every batch


@pytest.mark.slow
def test_the_cu_sizes_the_workspace_as_kgen_run_does(tmp_path):
    """<kernel>_workspace_bytes of the .cu (built with nvcc for the host) and the Python
    runtime's workspace_floats agree in both modes, with and without batches."""
    import shutil

    from kgen.api import build

    from tests.kernels import run_host_probe, split_reductions_kernel

    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc on PATH")
    includes, body, expected = [], [], {}
    for i, (deterministic, batched) in enumerate([(False, False), (True, False), (False, True),
                                                  (True, True)]):
        built = build(split_reductions_kernel(name=f"k{i}", deterministic=deterministic,
                                              batched=batched, reductions=ODD_SLOTS))
        (tmp_path / f"k{i}.cu").write_text(built.source)
        includes.append(f'#include "k{i}.cu"')
        body += ["{", f"  k{i}_params p{{}};", "  p.M = 150; p.N = 129; p.K = 1000;",
                 *(["  p.L = 3;"] if batched else []),
                 f'  std::printf("k{i}|%zu\\n", k{i}_workspace_bytes(p));', "}"]
        expected[f"k{i}"] = str(4 * built.plan.workspace_floats(ODD_SIZES))
    assert run_host_probe(tmp_path, includes, body, "sm_80") == expected
    assert expected["k3"] == str(4 * 3 * (4 * 150 * 256 + 694))


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_split_with_reductions_launches_in_order(deterministic):
    """The .cu's launcher: the identity first (atomic mode), then the split CTAs, then
    <kernel>_splitk with a block per output tile, then <kernel>_finalize (deterministic mode),
    which reads the slots <kernel>_splitk writes; the main kernel only writes partials."""
    from kgen.api import build

    from tests.kernels import split_reductions_kernel

    built = build(split_reductions_kernel(deterministic=deterministic, batched=True))
    src = built.source
    launcher = src[src.index("cudaError_t splitk_red_launch("):]
    empty = launcher.index("if (tiles_m == 0 || tiles_n == 0) {")
    launcher = launcher[launcher.index("\n  }\n", empty):]  # past the empty-grid answer
    order = [launcher.find(f"{kernel}<<<") for kernel in
             ("splitk_red_init", "splitk_red_narrow : splitk_red)", "splitk_red_splitk",
              "splitk_red_finalize")]
    if deterministic:
        assert order[0] == -1 and -1 < order[1] < order[2] < order[3]
    else:
        assert order[3] == -1 and -1 < order[0] < order[1] < order[2]
    assert "split_threads = p.L * static_cast<long long>(tiles_m) * tiles_n * 256;" in launcher
    body = src[src.index("void kernel_body("):src.index("splitk_red(const __grid_constant__")]
    assert "atomic(" not in body and "red0_part" not in body  # the reductions run later
    split = src[src.index("splitk_red_splitk(const"):]
    split = split[:split.index("\n}\n")]
    assert ("atomic(" in split) is not deterministic
    assert ("p.workspace[ws_offset" in split) is deterministic


@pytest.mark.parametrize("deterministic", [False, True], ids=["atomic", "deterministic"])
def test_inspect_says_where_the_reductions_run(deterministic):
    from kgen.api import build
    from kgen.report import output_paths

    from tests.kernels import split_reductions_kernel

    plan = build(split_reductions_kernel(deterministic=deterministic)).plan
    rows = {row["param"]: row for row in output_paths(plan)}
    assert rows["G"]["fast"].startswith("from splitk_red_splitk, once it has summed the split-K "
                                        "parts: element stores, one block per output tile")
    for name in ("rsum", "cmax", "amax"):
        fast = rows[name]["fast"]
        assert fast.startswith("in splitk_red_splitk, after the split-K parts are summed: one "
                               "block per output tile reduces it in a fixed order"), fast
        assert ("combined in a fixed order by splitk_red_finalize" in fast) is deterministic
        assert ("merges into the output with atomics" in fast) is not deterministic
