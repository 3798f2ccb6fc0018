"""`split stream`: stream-K on sm_90a's cooperative kernel. Parsing, the located refusals, the
plan (grid, workspace, what kgen inspect says), the tuner's list, and the emitted code compiled
by NVRTC without spills (the GPU tests run it: tests/gpu/test_stream_k_gpu.py)."""
from __future__ import annotations

import dataclasses

import pytest

from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.plan import FieldKind, KernelKind, Mma
from kgen.verify import verify

SOURCE = """kernel s {{
  target {arch}
  {schedule}
  tensor A : f16[{batch}M, K] row
  tensor B : f16[{batch}K, N] {b}
  tensor C : f16[{batch}M, N] row
  tensor D : f16[{batch}M, N] row out
  vector r : f32[M] out
  gemm g0 = A @ B accumulate f32 {{
    tile {tile}  warps 2x4  stages {stages}  {split}
    epilogue {{ {epilogue} }}
  }}
}}
"""


def source(split="split stream", epilogue="D = relu(acc + C)", arch="sm_90a", schedule="",
           tile="128x128x64", stages=5, batch="", b="col") -> str:
    text = SOURCE.format(split=split, epilogue=epilogue, arch=arch, schedule=schedule,
                         tile=tile, stages=stages, batch=batch, b=b)
    text = text if "rowsum" in epilogue else text.replace("vector r : f32[M] out", "")
    return text if "C" in epilogue else text.replace(f"tensor C : f16[{batch}M, N] row", "")


def build_source(**kw):
    from kgen.api import build

    module = parse(source(**kw), "s.kg")
    verify(module)
    return build(module.kernels[0])


def plan(**kw):
    module = parse(source(**kw), "s.kg")
    verify(module)
    return lower(module.kernels[0])


def test_split_stream_parses():
    module = parse(source(), "s.kg")
    split = module.kernels[0].gemms[0].split
    assert split.stream and split.count == 1
    assert (split.loc.line, split.loc.col) == (10, 43)


def test_a_name_other_than_stream_is_refused_where_it_stands():
    with pytest.raises(KgenError) as err:
        parse(source(split="split streamk"), "s.kg")
    assert (err.value.loc.line, err.value.loc.col) == (10, 49)
    assert "split takes a count of parts or 'stream'" in str(err.value)


@pytest.mark.parametrize("change, reason", [
    (dict(arch="sm_80"), "split stream needs target sm_90a"),
    (dict(schedule="schedule pingpong"), "split stream runs on the cooperative schedule"),
    (dict(split="split stream  cluster 2x1"), "split stream runs without a cluster"),
    (dict(epilogue="D = acc\n r = rowsum(acc)"), "split stream with epilogue reductions"),
])
def test_what_stream_k_cannot_run_is_refused_at_the_split(change, reason):
    with pytest.raises(KgenError) as err:
        plan(**change)
    assert reason in str(err.value)
    assert err.value.loc.line == 10 and err.value.loc.col == 43


@pytest.mark.parametrize("split, quoted", [
    ("split stream", "split stream runs on the cooperative warp-specialized kernel only"),
    ("cluster 2x1", "cluster 2x1 runs on the warp-specialized kernel only"),
])
def test_a_ring_over_budget_is_refused_at_the_stages_line(split, quoted):
    # 128x256 on 5 stages needs more than sm_90a's shared memory; the other kernels' refusal
    # quotes the cooperative kernel's, and points where a budget refusal points
    with pytest.raises(KgenError) as err:
        plan(split=split, tile="128x256x64", epilogue="D = acc")
    assert quoted in str(err.value) and "shared memory over budget" in str(err.value)
    line = source(split=split, tile="128x256x64").splitlines()[9]
    assert (err.value.loc.line, err.value.loc.col) == (10, line.index("stages") + 1)


def test_the_plan_is_the_cooperative_kernel_with_a_workspace():
    p = plan()
    s = p.schedule
    assert s.scheduler.kind is KernelKind.COOPERATIVE
    assert s.scheduler.stream_k
    assert s.scheduler.split_k == 1
    assert s.gemms[0].atom.instruction is Mma.WGMMA_SS
    assert p.split_kernel is None  # the fixup is in the kernel
    assert any(f.kind is FieldKind.WORKSPACE for f in p.fields)
    sizes = {"M": 1000, "N": 300, "K": 5000}
    steps = 8 * 3 * 79  # tiles x k tiles
    assert p.grid(sizes) == (steps, 1, 1)
    assert p.grid(sizes, persistent_ctas=132) == (132, 1, 1)
    assert p.workspace_floats(sizes, 132) == 132 * (128 * 128 + p.STREAM_FLAGS)
    # K = 0: a step per tile (each still runs its epilogue)
    assert p.grid({"M": 1000, "N": 300, "K": 0}, persistent_ctas=132) == (24, 1, 1)
    rows = dict((label, value) for label, value, _ in s.describe())
    assert rows["stream-K"].startswith("every persistent CTA an equal share")


def test_inspect_shows_stream_k(tmp_path):
    from click.testing import CliRunner

    from kgen.cli import cli

    path = tmp_path / "s.kg"
    path.write_text(source())
    result = CliRunner().invoke(cli, ["inspect", str(path)], terminal_width=200)
    assert result.exit_code == 0, result.output
    assert "stream-K" in result.output


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["staged C", "batched", "MN-major B", "128x256"])
def test_stream_k_compiles_without_spills(variant, tmp_path, monkeypatch):
    from kgen.runtime.nvrtc import compile_cubin, compile_ptx

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    kw = {"staged C": {}, "batched": dict(batch="L, "), "MN-major B": dict(b="row"),
          "128x256": dict(tile="128x256x64", stages=3)}[variant]
    built = build_source(**kw)
    s = built.plan.schedule
    assert s.scheduler.stream_k and s.scheduler.kind is KernelKind.COOPERATIVE
    src = built.source
    assert "stream_walk(" in src and "stream_wait(flags, share + 1, last" in src
    assert "s_workspace_bytes" in src and "stream-K needs p.workspace" in src
    if variant != "MN-major B":  # the staged C is loaded only where the epilogue runs
        assert "if (kt == k_tiles / 2 && k_first == 0) load_staged();" in src
    ptx = compile_ptx(src, "s", "sm_90a")
    assert "wgmma.mma_async" in ptx and "cp.async.bulk.tensor" in ptx
    assert "ld.acquire.gpu" in ptx and "st.release.gpu" in ptx
    result = compile_cubin(src, "s", "sm_90a")
    assert result.spill_stores == 0 and result.spill_loads == 0, result.log


def test_the_tuner_times_stream_k_where_the_last_wave_is_part_empty():
    from kgen.lower.builder import shapes
    from kgen.targets.sm90.configs import stream_configs

    module = parse(source(split="", epilogue="D = acc"), "s.kg")
    verify(module)
    (shape,) = shapes(module.kernels[0])
    few = stream_configs(shape, {"M": 3000, "N": 1000, "K": 8000})
    assert [c.gemms[0].tile for c in few] == [(128, 256, 64), (128, 192, 64)]
    assert all(c.gemms[0].stream and c.label.endswith("split stream") for c in few)
    assert stream_configs(shape, {"M": 8192, "N": 8192, "K": 8192}) == []  # many waves
    assert stream_configs(shape, {"M": 3000, "N": 1000, "K": 1024}) == []  # short K


def test_a_stream_config_round_trips_and_fills_the_split_line():
    from kgen.lower.builder import fill
    from kgen.targets import Config, GemmConfig
    from kgen.tune.codec import config_from_json, config_to_json

    config = Config((GemmConfig((128, 256, 64), (2, 4), 3, stream=True),))
    assert config_from_json(config_to_json(config)) == config
    module = parse(source(split=""), "s.kg")
    verify(module)
    free = module.kernels[0]
    free = dataclasses.replace(free, gemms=tuple(dataclasses.replace(g, tile=None, warps=None,
                                                                      stages=None)
                                                 for g in free.gemms))
    filled, chosen = fill(free, config)
    assert filled.gemms[0].split.stream
    assert ("g0 split", "split stream") in [(c.line, c.value) for c in chosen]
