"""Batches: a leading batch dimension on tensors and vectors, with any batch stride.

The front end (the DSL's 3-D tensors and 2-D vectors, its located refusals), the plan (fields,
alignments, grid, workspace), the emitted code (at_batch, the grid's batch axis, rank-3 tensor
maps), the Python launcher (batch strides, broadcast, the narrow choice), the NumPy reference,
and the .cu's own host checks built with nvcc: all without a GPU (tests/gpu/test_batches_gpu.py
runs the kernels)."""
from __future__ import annotations

import dataclasses
import functools
import shutil
from pathlib import Path

import numpy as np
import pytest

from kgen import api, ir
from kgen.errors import ArgumentError, KgenError
from kgen.parse import parse
from kgen.plan import FieldKind
from kgen.reference import evaluate
from kgen.runtime import tma
from kgen.runtime.launch import bind_arguments
from kgen.runtime.outputs import output_shapes
from kgen.verify import verify

from tests.kernels import batched_chain, run_host_probe

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
BASE = 0x7F00_0000_0000  # each argument at its own 1 MiB-aligned fake address


def kernel_text(params: list[str], body: str = "D = acc", *, extra: str = "",
                settings: str = "tile 128x256x64 warps 2x4 stages 3",
                gemms: str | None = None) -> str:
    lines = ["kernel k {", "  target sm_80", *(f"  {line}" for line in extra.splitlines()),
             *(f"  {p}" for p in params)]
    lines += (gemms or f"  gemm g = A @ B accumulate f32 {{\n    {settings}\n"
              f"    epilogue {{ {body} }}\n  }}").splitlines()
    lines.append("}")
    return "\n".join(lines) + "\n"


BATCHED = ["tensor A : f16[L, M, K] row", "tensor B : f16[L, K, N] col",
           "tensor D : f16[L, M, N] row out"]


def error_of(source: str) -> str:
    with pytest.raises(KgenError) as info:
        verify(parse(source, "t.kg"))
    rendered = info.value.render(source)
    assert "Traceback" not in rendered
    return rendered.split("\n")[0]


# ---- front end ----------------------------------------------------------------------------


def test_a_leading_dimension_is_the_batch():
    module = parse(kernel_text([*BATCHED, "vector bias : f32[L, N]", "vector v : f32[N]"],
                               "D = acc + bias[col] + v[col]"), "t.kg")
    verify(module)
    k = module.kernels[0]
    a, b, d, bias, v = (k.param(n) for n in ("A", "B", "D", "bias", "v"))
    assert (a.batch, a.shape, a.full_shape) == ("L", ("M", "K"), ("L", "M", "K"))
    assert (b.batch, b.shape, b.layout) == ("L", ("K", "N"), ir.Layout.COL)
    assert (bias.batch, bias.shape) == ("L", ("N",))
    assert (v.batch, v.shape) == (None, ("N",))  # shared by every batch
    total = parse(kernel_text([*BATCHED, "scalar total : f32[L] out"],
                              "D = acc; total = reduce_sum(acc)"), "t.kg")
    verify(total)
    t = total.kernels[0].param("total")
    assert (t.kind, t.batch, t.shape) == (ir.ParamKind.SCALAR, "L", ())


def test_a_fixed_batch_count():
    module = parse(kernel_text(["tensor A : f16[3, M, K] row", "tensor B : f16[K, N] col",
                                "tensor D : f16[3, M, N] row out"]), "t.kg")
    verify(module)
    assert module.kernels[0].param("A").batch == 3


@pytest.mark.parametrize("params, body, expected", [
    (["tensor A : f16[L, M, K] row", "tensor B : f16[G, K, N] col",
      "tensor D : f16[L, M, N] row out"], "D = acc",
     "t.kg:4:3: error: tensor 'B' has the batch dimension G but 'A' at line 3 has L: every "
     "batched parameter of a kernel has the same batch dimension"),
    ([*BATCHED, "vector bias : f32[3, N]"], "D = acc + bias[col]",
     "t.kg:6:3: error: vector 'bias' has the batch dimension 3 but 'A' at line 3 has L: every "
     "batched parameter of a kernel has the same batch dimension"),
    (["tensor A : f16[M, M, K] row", "tensor B : f16[K, N] col",
      "tensor D : f16[M, M, N] row out"], "D = acc",
     "t.kg:3:3: error: 'M' is the batch dimension of 'A' but also a dimension of 'A' at line 3; "
     "a batch dimension needs a name of its own"),
    (["tensor A : f16[L, M, K] row", "tensor B : f16[K, N] col",
      "tensor D : f16[M, N] row out"], "D = acc",
     "t.kg:5:3: error: output 'D' has no batch dimension, so every batch would write it; "
     "declare it f16[L, M, N]"),
    ([*BATCHED, "vector s : f32[M] out"], "D = acc; s = rowsum(acc)",
     "t.kg:6:3: error: output 's' has no batch dimension, so every batch would write it; "
     "declare it f32[L, M]"),
    ([*BATCHED, "scalar total : f32 out"], "D = acc; total = reduce_sum(acc)",
     "t.kg:6:3: error: scalar output 'total' has no batch dimension, so every batch would write "
     "it; declare it 'scalar total : f32[L] out' (one value per batch)"),
    ([*BATCHED, "scalar alpha : f32[L]"], "D = alpha * acc",
     "t.kg:6:3: error: input scalar 'alpha' cannot have a batch dimension: every batch reads "
     "the same value (a per-batch input is a batched vector)"),
    ([*BATCHED, "scalar total : f32[L, M] out"], "D = acc; total = reduce_sum(acc)",
     "t.kg:6:3: error: scalar 'total' must have no shape, or one batch dimension [L] (one value "
     "per batch), got [L, M]"),
    (["tensor A : f16[L, M, K, K] row", "tensor B : f16[K, N] col",
      "tensor D : f16[M, N] row out"], "D = acc",
     "t.kg:3:3: error: tensor 'A' must have 2 dimensions [rows, cols], or 3 with a leading "
     "batch dimension [L, rows, cols] (two batch dimensions, [B, H, rows, cols], are for loop "
     "kernels and row kernels only), got [L, M, K, K]"),
])
def test_located_refusals(params, body, expected):
    assert error_of(kernel_text(params, body)) == expected


CHAIN_GEMMS = """\
  gemm g0 = A @ B0 accumulate f32 {
    tile 128x64x64 warps 8x1 stages 4
    keep B0 resident
    epilogue { g0 = relu(acc) }
  }
  gemm g1 = g0 @ B1 accumulate f32 {
    tile 128x128x32 warps 8x1 stages 3
    keep g0 in registers
    keep B1 resident
    epilogue { D1 = acc }
  }"""


def chain_source(a="f16[L, M, 576]", b0="f16[576, 64]", d1="f16[L, M, 128]") -> str:
    return kernel_text([f"tensor A : {a} row", f"tensor B0 : {b0} col",
                        "tensor B1 : f16[64, 128] col", f"tensor D1 : {d1} row out"],
                       gemms=CHAIN_GEMMS)


def test_a_resident_b_must_be_shared_by_every_batch():
    assert error_of(chain_source(b0="f16[L, 576, 64]")) == (
        "t.kg:9:5: error: keep B0 resident loads B0 once per CTA, for the tiles of every batch, "
        "but B0 has the batch dimension L; keep a B0 shared by every batch resident "
        "(f16[576, 64]), or drop 'keep B0 resident'")


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_a_batched_chain_walks_every_batch(arch):
    """A resident chain (persistent): each tile's scope names its batch's arguments `p`, the
    ring refills of the next tile read that tile's batch of A, and the grid covers L x tiles."""
    result = built_source(chain_source(), arch)
    source, plan = result.source, result.plan
    assert plan.schedule.scheduler.persistent and plan.schedule.resident
    assert "k(const __grid_constant__ k_params all_batches)" in source
    assert "const k_params& p = all_batches;" in source
    assert "const int tiles = tiles_m * tiles_n * p.L;" in source
    assert "const k_params p = at_batch(all_batches, batch);" in source
    assert "tile %= tiles_m * tiles_n;" in source  # tile_coords: the tile in its batch
    assert "(this_tile ? p.A : next_A)" in source
    assert "load_first_stages(at_batch(all_batches, blockIdx.x < tiles ? blockIdx.x / " \
           "(tiles_m * tiles_n) : 0)" in source
    assert "const int grid = tiles_m * tiles_n * batches < state->slots" in source
    assert plan.grid({"L": 3, "M": 1000}) == (3 * 8, 1, 1)


def test_a_batched_tiled_chain_reads_its_sizes_from_every_batch():
    gemms = CHAIN_GEMMS.replace("    keep B0 resident\n", "").replace(
        "    keep B1 resident\n", "").replace("keep g0 in registers", "keep g0 in smem").replace(
        "tile 128x64x64 warps 8x1 stages 4", "tile 64x64x32 warps 2x2 stages 4").replace(
        "tile 128x128x32 warps 8x1 stages 3", "tile 64x128x32 warps 2x2 stages 3")
    source = kernel_text(["tensor A : f16[L, M, 576] row", "tensor B0 : f16[L, 576, 64] col",
                          "tensor B1 : f16[64, 128] col", "tensor D1 : f16[L, M, 128] row out"],
                         gemms=gemms)
    result = built_source(source, "sm_80")
    assert not result.plan.schedule.scheduler.persistent
    assert "const int M = all_batches.M;" in result.source
    assert "const int batch = blockIdx.x / (tiles_m * tiles_n);" in result.source


def test_the_python_ir_checks_batches_too():
    module = parse(kernel_text(BATCHED), "t.kg")
    k = module.kernels[0]
    alpha = ir.Param("alpha", ir.ParamKind.SCALAR, ir.DType.F32, batch="L")
    bad = dataclasses.replace(k, params=(*k.params, alpha))
    with pytest.raises(KgenError, match="input scalar 'alpha' cannot have a batch dimension"):
        verify(ir.Module((bad,)))
    weird = dataclasses.replace(k.params[0], batch=1.5)
    with pytest.raises(KgenError, match="batch dimension of 'A' must be a name or a number"):
        verify(ir.Module((dataclasses.replace(k, params=(weird, *k.params[1:])),)))


# ---- plan -----------------------------------------------------------------------------------


@functools.cache
def built(name: str, arch: str):
    return api.build_file(EXAMPLES / f"{name}.kg", arch)


def built_source(source: str, arch: str, name: str = "k"):
    module = parse(source, "t.kg")
    verify(module)
    return api.build(module.kernels[0], arch, source_name="t.kg")


def test_fields_sizes_and_alignments():
    plan = built("batched_gemm_bias", "sm_80").plan
    strides = [(f.name, f.param) for f in plan.fields if f.kind is FieldKind.BATCH_STRIDE]
    assert strides == [("batch_A", "A"), ("batch_B", "B"), ("batch_D", "D"),
                       ("batch_bias", "bias")]
    assert all(f.ctype == "long long" for f in plan.fields if f.kind is FieldKind.BATCH_STRIDE)
    assert [f.dim for f in plan.fields if f.kind is FieldKind.SIZE] == ["L", "M", "K", "N"]
    multiples = {a.param: a.batch_multiple for a in plan.alignments}
    assert multiples == {"A": 8, "B": 8, "D": 2, "bias": 2}
    # sm_90a stores D by the copy engine: every batch's rows 16-byte aligned
    stored = built("batched_gemm_bias", "sm_90a").plan
    assert {a.param: a.batch_multiple for a in stored.alignments}["D"] == 8
    assert plan.batch == "L"
    shared = built("batched_reductions", "sm_80").plan
    assert [f.param for f in shared.fields if f.kind is FieldKind.BATCH_STRIDE] == [
        "A", "D", "row_max", "col_sum", "peak"]  # B is shared by every batch: no batch stride


def test_an_unbatched_plan_has_no_batch():
    plan = built("gemm_bias_relu", "sm_80").plan
    assert plan.batch is None and plan.batches({"M": 8}) == 1
    assert not any(f.kind is FieldKind.BATCH_STRIDE for f in plan.fields)
    assert all(a.batch_multiple == 1 for a in plan.alignments)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_grid_covers_every_batch(arch):
    plan = built("batched_gemm_bias", arch).plan
    sizes = {"L": 17, "M": 300, "N": 520, "K": 64}
    tiles = -(-300 // 128) * -(-520 // 256)
    assert plan.grid(sizes) == (17 * tiles, 1, 1)
    if plan.schedule.scheduler.persistent:
        assert plan.grid(sizes, persistent_ctas=132) == (min(17 * tiles, 132), 1, 1)


def test_the_workspace_holds_every_batch():
    plan = built("batched_reductions", "sm_80").plan
    sizes = {"L": 3, "M": 300, "N": 520, "K": 64}
    tiles_m, tiles_n = -(-300 // 128), -(-520 // 256)
    # row_max's slots x M, col_sum's x N, peak's one slot per tile
    one = tiles_n * 300 + tiles_m * 520 + tiles_m * tiles_n
    assert plan.batch_workspace_floats(sizes) == one
    assert plan.workspace_floats(sizes) == 3 * one
    assert plan.init_grid(sizes) == (-(-3 * 520 // plan.INIT_THREADS), 1, 1)


def splitk_source(arch: str = "sm_80") -> str:
    return kernel_text(["tensor A : f16[L, M, K] row", "tensor B : f16[K, N] col",
                        "tensor D : f16[L, M, N] row out", "vector bias : f32[L, N]"],
                       "D = gelu(acc + bias[col])",
                       settings="tile 64x128x64 warps 2x2 stages 4 split 4").replace(
                           "target sm_80", f"target {arch}")


def test_split_k_partials_per_batch():
    plan = built_source(splitk_source(), "sm_80").plan
    sizes = {"L": 5, "M": 100, "N": 150, "K": 4096}
    one = 4 * 100 * 256  # split x M x the tiles' columns
    assert plan.split_floats(sizes) == one and plan.workspace_floats(sizes) == 5 * one
    assert plan.split_grid(sizes) == (-(-5 * 100 * 75 // 256), 1, 1)
    assert plan.grid(sizes) == (5 * 2 * 2 * 4, 1, 1)


# ---- emitted code ---------------------------------------------------------------------------


def test_at_batch_advances_every_batched_pointer():
    source = built("batched_reductions", "sm_80").source
    assert "q.A += batch * p.batch_A;" in source
    assert "q.D += batch * p.batch_D;" in source
    assert "q.row_max += batch * p.batch_row_max;" in source
    assert "q.B +=" not in source  # shared
    # deterministic reductions: one batch's slots of workspace
    assert "q.workspace += batch * (tiles_n * M + tiles_m * N + tiles_m * tiles_n * 1);" in source
    assert "q.peak += batch * p.batch_peak;" in source  # one scalar per batch
    # the finalize kernel: one thread per element of the longest output, in every batch
    assert "batched_reductions_finalize(const __grid_constant__ batched_reductions_params " \
           "all_batches)" in source
    assert "thread >= all_batches.L * per_batch" in source
    assert "return sizeof(float) * static_cast<size_t>(p.L) * (tiles_n * M + tiles_m * N + " \
           "tiles_m * tiles_n * 1);" in source


def test_the_tiled_entry_points_take_their_batch():
    source = built("batched_gemm_bias", "sm_80").source
    assert source.count("kernel_body<false>(at_batch(p, blockIdx.x / ctas), "
                        "blockIdx.x % ctas);") == 1
    assert "<<<tiles_m * tiles_n * batches," in source
    assert "if (p.L > 1 && p.batch_D == 0) return" in source
    assert 'if (p.batch_A % 8 != 0) return "the batch stride of A must be a multiple of 8' \
        in source


def test_the_copy_engine_loads_and_stores_rank_3_boxes():
    source = built("batched_gemm_bias", "sm_90a").source
    assert "tma_load_box_3d(a_ring + s * kAStageBytes, &maps.A, full + 8 * s, kt * kTileK, " \
           "tile_m * kTileM, map_batch(p.batch_A, batch));" in source
    assert "tma_store_box_3d(&maps.D," in source
    assert "const int walk = tiles * p.L;" in source
    assert "copy_granule(p.A, p.ld_A | p.batch_A)" in source
    # the launcher's rank-3 maps; a broadcast argument is mapped with one batch
    assert "const bool broadcast = p.batch_B == 0;" in source
    assert "reinterpret_cast<CUtensorMap*>(&maps.B), CU_TENSOR_MAP_DATA_TYPE_FLOAT16, 3," in source
    shared = built("batched_reductions", "sm_90a").source
    assert "tma_load_box(b_ring" in shared and "tma_load_box_3d(a_ring" in shared


def test_split_k_helper_indexes_every_batch():
    source = built_source(splitk_source(), "sm_80").source
    assert "k_splitk(const __grid_constant__ k_params all_batches)" in source
    assert "const long long per_batch = M * pairs;" in source
    assert "q.workspace += batch * kSplitK * static_cast<long long>(p.M) * tiles_n * kTileN;" \
        in source
    assert "const long long split_threads = p.L * static_cast<long long>(p.M) * " \
           "((p.N + 1) / 2);" in source


def test_unbatched_code_has_no_batch():
    source = built("gemm_bias_relu", "sm_90a").source
    assert "at_batch" not in source and "batch_" not in source
    assert "const int walk" not in source and "_3d" not in source


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_batched_split_k_compiles_without_spills(arch):
    from kgen.runtime.nvrtc import compile_cubin

    result = built_source(splitk_source(arch), arch)
    compiled = compile_cubin(result.source, result.plan.name, arch)
    resources = compiled.resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0


# ---- the Python launcher --------------------------------------------------------------------


class Fake:
    """A device array as __cuda_array_interface__ describes it (never read); strides in
    elements."""

    def __init__(self, shape, strides, typestr, ptr):
        size = np.dtype(typestr).itemsize
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
            "strides": tuple(s * size for s in strides), "version": 3}


def batched_args(L=3, M=100, N=64, K=128, *, a_batch=None, b_batch=None, d_batch=None):
    return dict(
        A=Fake((L, M, K), (M * K if a_batch is None else a_batch, K, 1), "<f2", BASE + 2**20),
        B=Fake((L, K, N), (K * N if b_batch is None else b_batch, 1, K), "<f2", BASE + 2 * 2**20),
        D=Fake((L, M, N), (M * N if d_batch is None else d_batch, N, 1), "<f2", BASE + 3 * 2**20),
        bias=Fake((L, N), (N, 1), "<f4", BASE + 4 * 2**20))


def bind(plan, args):
    return bind_arguments(plan, args, device_of=lambda ptr: None)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_batch_strides_reach_the_params(arch):
    plan = built("batched_gemm_bias", arch).plan
    bound = bind(plan, batched_args(b_batch=0))  # B broadcast to every batch
    assert bound.values["batch_A"] == 100 * 128 and bound.values["batch_B"] == 0
    assert bound.values["batch_D"] == 100 * 64 and bound.values["batch_bias"] == 64
    assert bound.sizes["L"] == 3 and bound.narrow == ""
    # a batch stride that breaks the 16-byte rows of a later batch: the narrow entry point
    odd = bind(plan, batched_args(a_batch=100 * 128 + 4))
    how = ("the mainloop copies 16-byte chunks with cp.async" if arch == "sm_80" else
           "the copy engine (TMA) loads it, in rows of 16-byte multiples")
    assert odd.narrow == f"A's batch stride 12804 is not a multiple of 8: {how}"
    # a broadcast A (stride 0) with a column-major batch view of B whose batch stride is
    # smaller than a matrix (interleaved batches) still runs the fast entry point
    d_pairs = bind(plan, batched_args(d_batch=100 * 64 + 2))  # even: pairs, not 16-byte rows
    assert bool(d_pairs.narrow) is (arch == "sm_90a"), d_pairs.narrow
    interleaved = bind(plan, batched_args(a_batch=0, b_batch=8))
    assert interleaved.narrow == "" and interleaved.values["batch_B"] == 8


def test_bad_batched_arguments_are_refused():
    plan = built("batched_gemm_bias", "sm_80").plan
    with pytest.raises(ArgumentError, match="D is an output with batch stride 0"):
        bind(plan, batched_args(d_batch=0))
    one = batched_args(L=1, d_batch=0)  # one batch: its stride is never used
    assert bind(plan, one).values["batch_D"] == 0
    flat = batched_args()
    flat["A"] = Fake((100, 128), (128, 1), "<f2", BASE + 2**20)
    with pytest.raises(ArgumentError, match=r"A must be 3-D \[L, M, K\] but is 2-D"):
        bind(plan, flat)
    other = batched_args()
    other["bias"] = Fake((4, 64), (64, 1), "<f4", BASE + 4 * 2**20)
    with pytest.raises(ArgumentError, match="L differs"):
        bind(plan, other)
    negative = batched_args(a_batch=-1)
    with pytest.raises(ArgumentError, match="negative strides"):
        bind(plan, negative)


def test_the_tensor_maps_take_the_batch():
    plan = built("batched_gemm_bias", "sm_90a").plan
    bound = bind(plan, batched_args(b_batch=0))
    keys = tma.maps_args(plan, bound.values, bound.sizes)
    assert [k[7:] for k in keys] == [(3, 100 * 128), (3, 0), (3, 100 * 64)]
    assert all(tma.usable(k) for k in keys)
    odd = bind(plan, batched_args(a_batch=100 * 128 + 4))
    assert not tma.usable(tma.maps_args(plan, odd.values, odd.sizes)[0])


def test_outputs_are_allocated_per_batch():
    plan = built("batched_reductions", "sm_80").plan
    shapes = output_shapes(plan, {"L": 3, "M": 5, "N": 7})
    assert shapes == {"D": ((3, 5, 7), (35, 7, 1)), "row_max": ((3, 5), (5, 1)),
                      "col_sum": ((3, 7), (7, 1)), "peak": ((3,), (1,))}


def test_a_per_batch_scalar_binds_as_one_value_per_batch():
    plan = built("batched_reductions", "sm_80").plan
    L, M, N, K = 3, 100, 64, 128
    args = dict(A=Fake((L, M, K), (M * K, K, 1), "<f2", BASE + 2**20),
                B=Fake((K, N), (1, K), "<f2", BASE + 2 * 2**20),
                D=Fake((L, M, N), (M * N, N, 1), "<f2", BASE + 3 * 2**20),
                row_max=Fake((L, M), (M, 1), "<f4", BASE + 4 * 2**20),
                col_sum=Fake((L, N), (N, 1), "<f4", BASE + 5 * 2**20),
                peak=Fake((L,), (1,), "<f4", BASE + 6 * 2**20))
    bound = bind(plan, args)
    assert bound.values["batch_peak"] == 1 and bound.values["batch_row_max"] == M
    args["peak"] = Fake((L + 1,), (1,), "<f4", BASE + 6 * 2**20)
    with pytest.raises(ArgumentError, match="L differs"):
        bind(plan, args)


# ---- the NumPy reference --------------------------------------------------------------------


def test_the_reference_runs_each_batch_with_broadcast():
    module = parse(kernel_text([*BATCHED[:2], "tensor C : f16[M, N] row", BATCHED[2],
                                "vector bias : f32[L, N]", "vector r : f32[L, M] out",
                                "scalar alpha : f32 = 0.5"],
                               "D = alpha * acc + C + bias[col]; r = rowmax(acc)"), "t.kg")
    k = module.kernels[0]
    rng = np.random.default_rng(1)
    L, M, N, K = 3, 5, 6, 7
    a = rng.standard_normal((L, M, K)).astype(np.float16)
    b_one = rng.standard_normal((K, N)).astype(np.float16)
    b = np.broadcast_to(b_one, (L, K, N))  # batch stride 0
    c = rng.standard_normal((M, N)).astype(np.float16)
    bias = rng.standard_normal((L, N)).astype(np.float32)
    out = evaluate(k, {"A": a, "B": b, "C": c, "bias": bias}, {"alpha": 0.5})
    summed = parse(kernel_text([*BATCHED, "scalar total : f32[L] out"],
                               "D = acc; total = reduce_sum(acc)"), "t.kg").kernels[0]
    per_batch = evaluate(summed, {"A": a, "B": b})["total"]
    np.testing.assert_allclose(per_batch, np.einsum("lmk,kn->l", a.astype(np.float64),
                                                    b_one.astype(np.float64)), rtol=1e-6)
    assert per_batch.shape == (L,)
    acc = np.einsum("lmk,kn->lmn", a.astype(np.float64), b_one.astype(np.float64))
    want = (0.5 * acc + c.astype(np.float64) + bias[:, None, :]).astype(np.float16)
    assert out["D"].shape == (L, M, N)
    np.testing.assert_array_equal(out["D"], want)
    np.testing.assert_array_equal(out["r"], acc.max(axis=2).astype(np.float32))
    # each batch differs (the test would not see a batch mix-up otherwise)
    assert not np.array_equal(out["D"][0], out["D"][1])
    with pytest.raises(ValueError, match="bias has 2 batches, not 3"):
        evaluate(k, {"A": a, "B": b, "C": c, "bias": bias[:2]})


# ---- the .cu's own launcher, built with nvcc for the host -----------------------------------

NVCC = shutil.which("nvcc")

CASES = {  # name -> (L, batch strides of A, B, D in elements; None: one matrix after another)
    "plain": (3, None, None, None),
    "broadcast_b": (17, None, 0, None),
    "broadcast_a": (3, 0, None, None),
    "odd_a": (3, 100 * 128 + 4, None, None),
    "odd_d": (3, None, None, 100 * 64 + 1),
    "even_d": (3, None, None, 100 * 64 + 2),
    "shared_d": (3, None, None, 0),
    "one_shared_d": (1, None, None, 0),
}


def _probe(plan) -> list[str]:
    """C++ lines printing params_reason and narrow_reason of each case."""
    lines = []
    for name, (L, a, b, d) in CASES.items():
        values = {"L": L, "M": 100, "N": 64, "K": 128, "ld_A": 128, "ld_B": 128, "ld_D": 64,
                  "batch_A": 100 * 128 if a is None else a, "batch_B": 128 * 64 if b is None
                  else b, "batch_D": 100 * 64 if d is None else d, "batch_bias": 64,
                  "alpha": "1.0f"}
        lines.append("{")
        lines.append(f"  {plan.name}_params p{{}};")
        for i, f in enumerate(plan.fields):
            if f.kind is FieldKind.POINTER:
                lines.append(f"  p.{f.name} = reinterpret_cast<decltype(p.{f.name})>"
                             f"(0x{BASE + (i + 1) * 2**20:x}ull);")
            else:
                lines.append(f"  p.{f.name} = {values[f.name]};")
        lines.append(f"  const char* hard = {plan.name}_kgen::params_reason(p);")
        lines.append(f"  const char* narrow = {plan.name}_kgen::narrow_reason(p);")
        lines.append(f'  std::printf("{name}|%s|%s\\n", hard ? hard : "", narrow ? narrow : "");')
        lines.append("}")
    return lines


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="needs nvcc on PATH")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_cu_launcher_makes_the_same_choice(arch, tmp_path):
    result = built("batched_gemm_bias", arch)
    plan = result.plan
    (tmp_path / "k.cu").write_text(result.source)
    printed = run_host_probe(tmp_path, ['#include "k.cu"'], _probe(plan), arch)
    for name, (L, a, b, d) in CASES.items():
        hard, narrow = printed[name].split("|")
        try:
            python, python_hard = bind(plan, batched_args(L=L, a_batch=a, b_batch=b,
                                                          d_batch=d)).narrow, ""
        except ArgumentError as err:
            python, python_hard = "", str(err)
        assert bool(hard) == bool(python_hard), (name, hard, python_hard)
        if hard:
            continue
        assert bool(narrow) == bool(python), (name, narrow, python)
        if narrow:
            assert narrow.split(": ", 1)[1] == python.split(": ", 1)[1], (narrow, python)
    assert printed["shared_d"].split("|")[0] == ("the batch stride of output D must not be 0: "
                                                 "every batch writes its own")
    assert printed["odd_a"].split("|")[1].startswith("the batch stride of A must be a multiple")


def test_a_parameter_named_like_a_batch_stride_is_refused():
    source = kernel_text([*BATCHED, "vector batch_A : f32[N]"], "D = acc + batch_A[col]")
    with pytest.raises(KgenError) as info:
        built_source(source, "sm_80")
    assert info.value.render(source).split("\n")[0] == (
        "t.kg:3:3: error: the name 'batch_A' is used both for a parameter and a dimension, a "
        "leading dimension or a batch stride; rename one")


def _variant(name: str) -> tuple[ir.Kernel, str]:
    """Batched kernels the GPU tests run beside the examples: column-major operands and
    output (the tiled kernel on both targets), and `schedule pingpong` on sm_90a."""
    from kgen.parse import parse_file

    kernel = parse_file(EXAMPLES / "batched_gemm_bias.kg").kernels[0]
    if name.startswith("colmajor"):
        layouts = {"A": ir.Layout.COL, "B": ir.Layout.ROW, "D": ir.Layout.COL}
        params = tuple(dataclasses.replace(p, layout=layouts.get(p.name, p.layout))
                       for p in kernel.params)
        return dataclasses.replace(kernel, params=params), name.split("-")[1]
    g = dataclasses.replace(kernel.gemms[0], tile=ir.TileShape(128, 128, 64),
                            warps=ir.WarpGrid(2, 4), stages=ir.StageCount(5))
    return dataclasses.replace(kernel, gemms=(g,), schedule=ir.Schedule.PINGPONG), "sm_90a"


@pytest.mark.parametrize("name", ["colmajor-sm_80", "colmajor-sm_90a", "pingpong"])
def test_batched_variants_compile_without_spills(name):
    from kgen.runtime.nvrtc import compile_cubin

    kernel, arch = _variant(name)
    result = api.build(kernel, arch)
    if name == "pingpong":
        assert result.plan.schedule.scheduler.pingpong
    resources = compile_cubin(result.source, result.plan.name, arch).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0


def test_the_cli_says_where_and_exits_2(tmp_path):
    from click.testing import CliRunner

    from kgen.cli import cli

    bad = tmp_path / "bad.kg"
    bad.write_text(kernel_text(["tensor A : f16[L, M, K] row", "tensor B : f16[K, N] col",
                                "tensor D : f16[M, N] row out"]))
    result = CliRunner().invoke(cli, ["compile", str(bad)], catch_exceptions=False)
    assert result.exit_code == 2
    assert "bad.kg:5:3: error: output 'D' has no batch dimension" in result.output
    assert "Traceback" not in result.output
    good = CliRunner().invoke(cli, ["inspect", str(EXAMPLES / "batched_gemm_bias.kg"), "--json"],
                              catch_exceptions=False)
    assert good.exit_code == 0
    import json

    batch = json.loads(good.output)["kernels"][0]["batch"]
    assert batch["dim"] == "L" and batch["batched"] == ["A", "B", "D", "bias"]
    assert batch["grid"].startswith("L x the tiles of one batch")


B2B = sorted(p.stem for p in EXAMPLES.glob("b2b*.kg"))


@pytest.mark.parametrize("name", B2B)
def test_batched_chains_compile_without_spills(name):
    """The b2b examples with A and the output batched, as the GPU tests run them."""
    from kgen.runtime.nvrtc import compile_cubin

    kernel = batched_chain(name)
    verify(ir.Module((kernel,)))
    result = api.build(kernel)
    assert "at_batch" in result.source
    resources = compile_cubin(result.source, result.plan.name, kernel.target.value).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_a_chain_with_batched_weights_compiles_without_spills(arch):
    """Every operand batched, B streamed (persistent, not resident): the prefetch of the next
    tile's first stages takes the coordinates and arguments the tile's top computed (a
    division amid the last gemm's registers made ptxas spill on sm_80)."""
    from kgen.runtime.nvrtc import compile_cubin

    kernel = batched_chain("b2b_gemm_rf", ("A", "B0", "B1", "D1", "scale0", "bias0"),
                            drop_resident=True)
    result = api.build(kernel, arch)
    assert result.plan.schedule.scheduler.persistent and not result.plan.schedule.resident
    assert "q.B0 += batch * p.batch_B0;" in result.source
    assert "g0_cfg::load_first_stages(next_p, smem, next_m * g0_cfg::kTileM, M, " \
           "next_tile < tiles, tid);" in result.source
    resources = compile_cubin(result.source, result.plan.name, arch).resources()
    assert resources.get("spill_stores", 0) == 0 and resources.get("spill_loads", 0) == 0
