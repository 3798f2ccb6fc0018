"""The epilogue's row and column vectors staged in shared memory on the sm_90a warp-specialized
GEMM (EpilogueVectors, STAGED, no GPU): each consumer thread loads its elements of the
tile's slice before the mainloop, writes them to its consumer's buffer before the epilogue,
and the fast entry point's epilogue reads them there. Where they stay in global memory, and
why; the storage plan and `kgen inspect`; NVRTC compiles every variant without spills. The GPU
tests: tests/gpu/test_staged_vectors_gpu.py."""
from __future__ import annotations


import pytest

from kgen.api import build
from kgen.emit import emit
from kgen.parse import parse
from kgen.plan import EpilogueVectors, KernelKind, StorePath, VectorHome

SOURCE = """\
kernel k {{
  target sm_90a
  {schedule}
  tensor A : f16[{batch}M, K] row
  tensor B : f16[{batch}K, N] col
  tensor D : f16[{batch}M, N] {d} out
  vector bias : f32[{batch}N]
  vector hb : f16[N]
  vector scale : bf16[{batch}M]
  scalar alpha : f32 = 1.0
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {epilogue} }}
  }}
}}
"""
EPILOGUE = "(alpha * acc + bias[col] + hb[col]) * scale[row]"
COOPERATIVE = "tile 128x256x64  warps 2x4  stages 3"
PINGPONG = "tile 128x128x64  warps 2x4  stages 5"


def _built(lines=COOPERATIVE, schedule="", epilogue=EPILOGUE, batch="", d="row"):
    text = SOURCE.format(lines=lines, schedule=schedule, epilogue=epilogue, batch=batch, d=d)
    return build(parse(text, "k.kg").kernels[0])


def test_cooperative_stages_every_vector_a_slice_per_consumer():
    built = _built()
    g = built.plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA
    assert g.vectors.held(VectorHome.STAGED) == ("bias", "hb", "scale")
    assert "no read waits on global memory" in g.vectors.why
    sizes = {b.name: (b.bytes, b.dtype.dsl_name if b.dtype else None)
             for b in built.plan.storage.buffers}
    # two consumers: 256 columns each (f32, f16), 64 rows each (bf16)
    assert sizes["g_vec_bias"] == (2 * 256 * 4, "f32")
    assert sizes["g_vec_hb"] == (2 * 256 * 2, "f16")
    assert sizes["g_vec_scale"] == (2 * 64 * 2, "bf16")
    src = built.source
    assert "load_pair<false>(sv_bias + (col - tile_col0), both)" in src
    assert "__bfloat162float(sv_scale[row - tile_row0])" in src
    assert "const float* sv_bias, const __half* sv_hb, const __nv_bfloat16* sv_scale, " \
           "int tile_col0, int tile_row0)" in src
    # one call site: the staging's walk (a tile the copy engine cannot store is copied out)
    assert src.count(", sv_bias, sv_hb, sv_scale, n0, m0 + row0)") == 1
    # the narrow entry point's epilogue still reads global memory
    assert "load_pair<kNarrow>(p.bias + col, both)" in src
    assert "held_scale[e] = p.scale[m0 + row0 + at];" in src
    assert "if (at < 64) sv_scale[at] = held_scale[e];" in src


def test_pingpong_holds_the_whole_tiles_rows():
    built = _built(PINGPONG, "schedule pingpong")
    assert built.plan.schedule.scheduler.kind is KernelKind.PINGPONG
    sizes = {b.name: b.bytes for b in built.plan.storage.buffers}
    assert sizes["g_vec_scale"] == 2 * 128 * 2 and sizes["g_vec_bias"] == 2 * 128 * 4
    assert "sv_scale[at] = held_scale[e];" in built.source


def test_batched_vectors_read_their_batch():
    src = _built(batch="L, ").source
    assert "held_bias[e] = p.bias[static_cast<long long>(batch) * p.batch_bias + n0 + at];" in src
    assert "held_hb[e] = p.hb[n0 + at];" in src  # shared by every batch


@pytest.mark.parametrize("lines, why", [
    ("tile 128x128x64  warps 2x4  stages 5  split 4", "<kernel>_splitk"),
    ("tile 128x128x64  warps 2x4  stages 5  split stream", "stream-K"),
])
def test_split_and_stream_read_global_memory(lines, why):
    g = _built(lines).plan.schedule.gemms[0]
    assert g.vectors.held(VectorHome.STAGED) == () and why in g.vectors.why


def test_vectors_that_do_not_fit_stay_in_global_memory():
    """Ping-pong 128x128 with 5 stages: the ring and the staging leave no room for the four
    vectors' buffers (with 4 stages they fit)."""
    text = SOURCE.format(lines="tile 128x128x64  warps 2x4  stages 5",
                         schedule="schedule pingpong", epilogue=EPILOGUE + " + shift[row]",
                         batch="", d="row").replace(
        "vector hb : f16[N]", "vector hb : f16[N]\n  vector shift : f32[M]")
    g = build(parse(text, "k.kg").kernels[0]).plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA and g.vectors.held(VectorHome.STAGED) == ()
    assert "do not fit" in g.vectors.why
    four = build(parse(text.replace("stages 5", "stages 4"), "k.kg").kernels[0])
    vectors = four.plan.schedule.gemms[0].vectors
    assert vectors.held(VectorHome.STAGED) == ("bias", "hb", "scale", "shift")


def test_a_vector_read_along_both_axes_stays_in_global_memory():
    text = SOURCE.format(lines=COOPERATIVE, schedule="", batch="", d="row",
                         epilogue="acc + hb[col]").replace(
        "vector hb : f16[N]", "vector hb : f16[N]\n  vector sq : f32[N]").replace(
        "D = acc + hb[col]", "D = acc + hb[col] + sq[col] * sq[row]")
    built = build(parse(text.replace("tensor A : f16[M, K]", "tensor A : f16[N, K]")
                        .replace("tensor D : f16[M, N]", "tensor D : f16[N, N]"), "k.kg")
                  .kernels[0])
    assert built.plan.schedule.gemms[0].vectors.held(VectorHome.STAGED) == ("hb",)
    assert "p.sq[row]" in built.source


def test_inspect_says_where_the_vectors_are_read():
    rows = {label: (value, why) for label, value, why in _built().plan.schedule.describe()}
    value, why = rows["g epilogue vectors"]
    assert value == "bias, hb, scale" and "registers" not in value and "mainloop" in why


def test_the_schedule_value_off_reads_global_memory():
    """The variant bench/prototypes/batched_probe.py times: the same plan, staged_vectors ()."""
    plan = _built().plan
    off = plan.with_gemm_schedule(vectors=EpilogueVectors())
    src = emit(off, source_name="k.kg", source_hash="", command="test")
    assert "sv_bias" not in src and "held_bias" not in src
    assert "load_pair<false>(p.bias + col, both)" in src


def test_an_epilogue_without_vectors_is_unchanged():
    g = _built(epilogue="alpha * acc").plan.schedule.gemms[0]
    assert g.vectors.held(VectorHome.STAGED) == () and g.vectors.why == ""


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["cooperative", "pingpong", "batched", "col", "n64",
                                     "n192", "cluster"])
def test_nvrtc_compiles_without_spills(variant):
    pytest.importorskip("cuda.bindings")
    from kgen.runtime.nvrtc import compile_cubin

    kwargs = {"cooperative": {}, "pingpong": dict(lines=PINGPONG, schedule="schedule pingpong"),
              "batched": dict(batch="L, "), "col": dict(d="col"),
              "n64": dict(lines="tile 128x64x64  warps 2x4  stages 8"),
              "n192": dict(lines="tile 128x192x64  warps 2x4  stages 4"),
              "cluster": dict(lines=COOPERATIVE + "  cluster 2x1")}[variant]
    built = _built(**kwargs)
    assert built.plan.schedule.gemms[0].vectors.held(VectorHome.STAGED)
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
    assert result.stack_bytes == 0, result.log
