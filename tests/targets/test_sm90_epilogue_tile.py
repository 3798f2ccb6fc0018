"""The epilogue tile on the sm_90a warp-specialized GEMM (Staging, no GPU): where a
consumer's whole tile of staging does not fit beside the ring, the staging holds two 64x64
boxes per consumer and the epilogue writes and stores them one by one. When the plan takes it
(and when the whole tile's staging instead), C's boxes staged in its buffers, the storage, the emitted loop, `kgen inspect`, the builder's stage order, and NVRTC
compiles without spills. The GPU tests: tests/gpu/test_epilogue_tile_gpu.py."""
from __future__ import annotations

import pytest

from kgen.api import build
from kgen.parse import parse
from kgen.plan import KernelKind, StorePath

SOURCE = """\
kernel k {{
  target sm_90a
  {schedule}
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor C : f16[M, N] {d}
  tensor D : f16[M, N] {d} out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  gemm g = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = {epilogue} }}
  }}
}}
"""
S3 = "tile 128x256x64  warps 2x4  stages 3"
S4 = "tile 128x256x64  warps 2x4  stages 4"
PINGPONG = "tile 128x128x64  warps 2x4  stages 6"


def _source(lines=S4, schedule="", epilogue="relu(alpha * acc + bias[col])", d="row"):
    """The kernel's text, without the parameters its epilogue does not read (refused)."""
    text = SOURCE.format(lines=lines, schedule=schedule, epilogue=epilogue, d=d)
    for name, line in (("C", f"  tensor C : f16[M, N] {d}\n"), ("bias", "  vector bias : f32[N]\n"),
                       ("alpha", "  scalar alpha : f32 = 1.5\n")):
        if name not in epilogue:
            text = text.replace(line, "")
    return text


def _built(**kwargs):
    return build(parse(_source(**kwargs), "k.kg").kernels[0])


def test_four_stages_of_128x256_take_the_epilogue_tile():
    built = _built()
    g = built.plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA and g.pipeline.stages == 4 and g.staging.boxes == 2
    assert "box by box" in g.staging.why
    sizes = {b.name: b.bytes for b in built.plan.storage.buffers}
    assert sizes["g_d_staging"] == 2 * 2 * 64 * 64 * 2  # two consumers, two boxes each
    assert built.plan.smem_bytes <= 232448
    src = built.source
    assert "constexpr int kStagesD = 2;" in src
    assert "constexpr unsigned kStagingBytes = kStagesD * kStagingBoxBytes;" in src
    assert "if (b == 0) bulk_wait_read(); else bulk_wait_read_pending<kStagesD - 1>();" in src
    assert 'cp.async.bulk.wait_group.read %0;\\n" ::"n"(kPending)' in src
    # each box is stored as soon as it is written, from its buffer
    assert "const unsigned buffer = staging + b % kStagesD * kStagingBoxBytes;" in src
    assert "tma_store_box(&maps.D, buffer, n0 + box * 64, m0 + row0 + i * 64);" in src
    assert "for (int jj = 4 * box; jj < 4 * box + 4; ++jj) {" in src


def test_three_stages_keep_the_whole_tile():
    built = _built(lines=S3)
    g = built.plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA and g.staging.boxes == 0
    assert "whole tile" in g.staging.why
    assert "kStagesD" not in built.source and "bulk_wait_read_pending" not in built.source


@pytest.mark.parametrize("lines, schedule", [("tile 128x128x64  warps 2x4  stages 6", ""),
                                             ("tile 128x192x64  warps 2x4  stages 4", "")])
def test_no_epilogue_tile_where_the_whole_tile_fits_or_is_no_larger(lines, schedule):
    """128x128 cooperative: a consumer's tile is two boxes, no more than the epilogue tile's;
    128x192 on 4 stages: the whole tile's staging fits."""
    g = _built(lines=lines, schedule=schedule).plan.schedule.gemms[0]
    assert g.output.path is StorePath.TMA and g.staging.boxes == 0


def test_pingpong_takes_it_on_six_stages():
    built = _built(lines=PINGPONG, schedule="schedule pingpong")
    s = built.plan.schedule
    assert s.scheduler.kind is KernelKind.PINGPONG
    assert s.gemms[0].staging.boxes == 2


def test_c_is_staged_box_by_box_in_the_epilogue_tile():
    full = "relu(alpha * acc + C + bias[col])"
    whole = _built(lines=S3, epilogue=full).plan.schedule.gemms[0]
    assert whole.staged.param == "C" and whole.staging.boxes == 0
    built = _built(lines=S4, epilogue=full)
    tiled = built.plan.schedule.gemms[0]
    assert tiled.staged.param == "C" and tiled.staging.boxes == 2
    assert "C's 64x64 boxes into the epilogue tile's buffers" in tiled.staged.why
    src = built.source
    # the first two boxes during the mainloop, each later one once its buffer's box has left
    assert "for (int b = 0; b < kStagesD; ++b) load_staged_box(b);" in src
    assert "bulk_wait_read();\n                load_staged_box(b + kStagesD);" in src
    assert ("mbarrier_wait(input_full + 8 * (kStagesD * consumer + b % kStagesD), "
            "input_phase >> (b % kStagesD) & 1);") in src
    assert "mbarrier_wait(input_full + 8 * consumer, input_phase);" not in src
    assert "for (int d = 0; d < 2 * kStagesD; ++d) mbarrier_init(input_full + 8 * d, 1);" in src
    assert "bulk_wait_read_pending" not in src  # C's landing frees the buffer


def test_inspect_shows_the_epilogue_tile():
    rows = {label: (value, why) for label, value, why in
            _built().plan.schedule.describe()}
    assert rows["g epilogue tile"][0] == "64x64, 2 staging boxes per consumer"
    rows = {label: value for label, value, _ in _built(lines=S3).plan.schedule.describe()}
    assert rows["g epilogue tile"] == "the consumer's whole tile"


def test_the_builder_takes_four_stages_with_or_without_c():
    bare = _built(lines="").plan.schedule.gemms[0]
    assert (bare.pipeline.stages, bare.staging.boxes) == (4, 2)
    with_c = _built(lines="", epilogue="alpha * acc + C").plan.schedule.gemms[0]
    assert (with_c.pipeline.stages, with_c.staging.boxes, with_c.staged.param) == (4, 2, "C")


def test_c_boxes_past_the_buffers_are_prefetched_into_l2_when_c_is_larger_than_l2():
    source = _built(lines="", epilogue="alpha * acc + C").source
    line = next(x for x in source.splitlines() if "// its other boxes into L2" in x)
    assert "static_cast<long long>(p.M) * p.N * sizeof(*p.C) >= (64ll << 20)" in line
    assert "prefetch_staged_box(b);" in source
    assert "cp.async.bulk.prefetch.tensor.2d.L2.global.tile" in source
    assert "prefetch_staged_box" not in _built(lines="").source


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["row", "col", "pingpong", "global_c"])
def test_nvrtc_compiles_without_spills(variant):
    pytest.importorskip("cuda.bindings")
    from kgen.runtime.nvrtc import compile_cubin

    kwargs = {"row": {}, "col": dict(d="col"),
              "pingpong": dict(lines=PINGPONG, schedule="schedule pingpong"),
              "global_c": dict(epilogue="relu(alpha * acc + C + bias[col])")}[variant]
    built = _built(**kwargs)
    assert built.plan.schedule.gemms[0].staging.boxes == 2
    result = compile_cubin(built.source, built.plan.name, "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log
    assert result.stack_bytes == 0, result.log
