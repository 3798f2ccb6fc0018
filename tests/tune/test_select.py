"""Using a tune cache entry without a GPU: the plan `kgen run` builds takes the tuned
configuration (its lines say so), `describe` says which schedule ran, and a TunedKernel picks
the variant of each call's size bucket, building each once."""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from kgen.api import build
from kgen.enums import Arch
from kgen.targets import Config, GemmConfig
from kgen.tune import cache, select

from .helpers import example_text, kernel_of

GPU = "NVIDIA H200"
SIZES = {"M": 4096, "N": 4096, "K": 4096}
TUNED = Config((GemmConfig((64, 128, 64), (2, 2), 3),), why="tuned by a test")


def store(kernel, sizes, config=TUNED, arch=Arch.SM80):
    key = cache.tune_key(kernel, arch, GPU, sizes)
    entry = cache.TuneEntry(key=key, config=config, label=config.label,
                            lines=(("mma0 tile", "x".join(map(str, config.gemms[0].tile))),),
                            time_ms=0.25, tflops=550.0, sizes=tuple(sorted(sizes.items())),
                            candidates=12, date="2026-11-30T10:00:00+00:00")
    assert cache.store(entry)
    return entry


def test_run_builds_the_tuned_configuration(tune_cache):
    kernel = kernel_of(example_text("gemm"))
    stored = store(kernel, SIZES)
    # the same bucket, with rows of whole lines (N = 62 x 64)
    entry = select.lookup(kernel, Arch.SM80, GPU, {"M": 3000, "N": 3968, "K": 4096})
    assert entry == stored
    built = build(kernel, None, config=entry.config)  # what kgen run does with the entry
    assert built.plan.gemms[0].tile == (64, 128, 64)
    assert select.tuned(built.plan)
    assert all(c.why.startswith(select.WHY_TUNED) for c in built.plan.schedule.chosen)
    note = select.describe(built.plan, entry)
    assert note.startswith("schedule: tuned by kgen tune on 2026-11-30")
    assert "64x128x64 w2x2 s3" in note and "M=4096" in note and GPU in note


def test_other_buckets_and_gpus_build_the_builders_choice(tune_cache):
    kernel = kernel_of(example_text("gemm"))
    store(kernel, SIZES)
    assert select.lookup(kernel, Arch.SM80, GPU, {"M": 8192, "N": 4096, "K": 4096}) is None
    assert select.lookup(kernel, Arch.SM80, "NVIDIA A100", SIZES) is None
    # the same bucket, but D's rows (N = 4000 values) are not whole 128-byte lines
    assert select.lookup(kernel, Arch.SM80, GPU, {"M": 4096, "N": 4000, "K": 4096}) is None
    assert select.lookup(kernel, Arch.SM90A, GPU, SIZES) is None
    plain = build(kernel, None)
    assert not select.tuned(plain.plan)
    assert select.describe(plain.plan, None).startswith("schedule: kgen's builder filled mma0 tile")
    written = build(kernel_of(example_text("gemm", stripped=False)), None)
    assert select.describe(written.plan, None) == "schedule: as the source writes it"


def test_an_entry_that_no_longer_plans_is_named(tune_cache):
    kernel = kernel_of(example_text("gemm"))
    huge = Config((GemmConfig((256, 256, 128), (2, 4), 8),), why="from an older kgen")
    entry = store(kernel, SIZES, huge)
    built = build(kernel, None, config=entry.config)
    assert not select.tuned(built.plan)
    note = select.describe(built.plan, entry)
    assert note.startswith("schedule: the kgen tune entry (256x256x128 w2x4 s8) was not used:")


def test_sizes_come_from_the_arguments_shapes():
    plan = build(kernel_of(example_text("gemm")), None).plan
    args = {"A": np.zeros((300, 64)), "B": np.zeros((64, 96)), "D": None}
    assert select.sizes_of(plan, args, None) == {"M": 300, "K": 64, "N": 96}
    assert select.sizes_of(plan, {"A": np.zeros((300, 64))}, None) is None
    assert select.sizes_of(plan, {"A": np.zeros((300, 64))}, {"N": 8}) == \
        {"M": 300, "K": 64, "N": 8}


class FakeCompiled:
    def __init__(self, plan, name):
        self.plan, self.name, self.device_id = plan, name, 0
        self.calls = []

    def bind(self, sizes=None, **args):
        return SimpleNamespace(sizes=select.sizes_of(self.plan, args, sizes), by=self.name)

    def launch(self, bound, stream=0):
        self.calls.append(("launch", bound.by))


def test_a_tuned_kernel_runs_each_buckets_variant(tune_cache):
    kernel = kernel_of(example_text("gemm"))
    store(kernel, SIZES)
    default_plan = build(kernel, None).plan
    default = FakeCompiled(default_plan, "default")
    made = []

    def make(config):
        made.append(config)
        return FakeCompiled(build(kernel, None, config=config).plan, f"tuned {len(made)}")

    k = select.TunedKernel(kernel, Arch.SM80, GPU, default, make)
    big = {"A": np.zeros((4000, 4096)), "B": np.zeros((4096, 3008))}  # rows of whole lines
    small = {"A": np.zeros((64, 64)), "B": np.zeros((64, 64))}
    # a call's variant (kgen.runtime.calls keeps it per argument signature)
    assert k._for(big, None).name == "tuned 1"
    assert k._for(big, None).name == "tuned 1"  # built once per bucket
    assert k._for(small, None).name == "default"
    assert made == [TUNED]
    assert k.variant(SIZES).plan.gemms[0].tile == (64, 128, 64)
    assert select.tuned(k.variant(SIZES).plan)
    bound = k.bind(**big)
    assert bound.by == "tuned 1"
    k.launch(bound)
    assert k.variant(SIZES).calls[-1] == ("launch", "tuned 1")
    assert k.plan is default_plan and k.name == "default"  # the rest is the default's
    assert "1 size buckets" in repr(k) or "2 size buckets" in repr(k)


def test_load_returns_the_plain_kernel_without_entries(tune_cache):
    kernel = kernel_of(example_text("gemm"))
    default = FakeCompiled(build(kernel, None).plan, "default")
    assert select.follow_cache(kernel, Arch.SM80, GPU, default, make=None) is default
    store(kernel, SIZES)
    followed = select.follow_cache(kernel, Arch.SM80, GPU, default, make=None)
    assert isinstance(followed, select.TunedKernel) and followed.default is default
    assert select.follow_cache(kernel, Arch.SM80, "NVIDIA A100", default, make=None) is default
    # on sm_90a the runtime sizes may change a kernel's schedule: it follows them, entry or not
    followed = select.follow_cache(kernel, Arch.SM90A, "NVIDIA A100", default, make=None)
    assert isinstance(followed, select.TunedKernel)
    written = kernel_of(example_text("gemm", stripped=False))
    assert select.follow_cache(written, Arch.SM90A, GPU, default, make=None) is default


def test_without_an_entry_each_bucket_runs_what_its_sizes_call_for(tune_cache):
    """sm_90a, no tune entry: a bucket whose sizes the 128x256 default serves runs the default;
    one it leaves SMs idle in runs builder.sized's configuration, built once."""
    kernel = kernel_of(example_text("gemm"))
    default = FakeCompiled(build(kernel, "sm_90a").plan, "default")
    made = []

    def make(config):
        made.append(config)
        return FakeCompiled(build(kernel, "sm_90a", config=config).plan, f"sized {len(made)}")

    k = select.follow_cache(kernel, Arch.SM90A, GPU, default, make)
    square = {"A": np.zeros((4096, 4096)), "B": np.zeros((4096, 4096))}
    skinny = {"A": np.zeros((128, 4096)), "B": np.zeros((4096, 4096))}
    assert k._for(square, None).name == "default"
    assert k._for(skinny, None).name == "sized 1" and k._for(skinny, None).name == "sized 1"
    assert [c.label for c in made] == ["pingpong: 64x64x64 w2x4 s12"]
    assert k.variant({"M": 128, "N": 4096, "K": 4096}).plan.gemms[0].tile == (64, 64, 64)
    # other sizes that come to the same configuration share its variant
    assert k._for(dict(A=np.zeros((128, 4096)), B=np.zeros((4096, 4000))), None).name == \
        "sized 1"
    assert len(made) == 1 and "1 variants built" in repr(k)


def test_kgen_load_follows_the_cache(tune_cache, monkeypatch):
    """kgen.load with stand-ins for the GPU: the plain kernel without an entry, a TunedKernel
    with one, whose variant for the bucket is built with the tuned configuration."""
    import kgen
    import kgen.runtime.device as device
    import kgen.runtime.launch as launch
    import kgen.runtime.nvrtc as nvrtc

    info = device.DeviceInfo(0, GPU, (9, 0), 132, 60 << 20, 232448, 1980000)
    result = nvrtc.CompileResult(b"\x7fELF", "", 128, 0, 0, 0, False, 0.1, "sm_90a", "gemm")
    monkeypatch.setattr(device, "device_info", lambda device_id=None: info)
    monkeypatch.setattr(nvrtc, "compile_cubin", lambda *args, **kwargs: result)
    monkeypatch.setattr(launch, "CompiledKernel",
                        lambda plan, cubin, **kwargs: SimpleNamespace(plan=plan, device_id=0))
    kernel = kernel_of(example_text("gemm"))
    plain = kgen.load(kernel)
    assert not isinstance(plain, select.TunedKernel) and not select.tuned(plain.plan)
    store(kernel, SIZES)
    followed = kgen.load(kernel)
    assert isinstance(followed, select.TunedKernel)
    assert select.tuned(followed.variant(SIZES).plan)
    assert followed.variant(SIZES).plan.gemms[0].tile == (64, 128, 64)
    assert followed.variant({"M": 64, "N": 64, "K": 64}) is followed.default
    assert not isinstance(kgen.load(kernel, tuned=False), select.TunedKernel)


def test_describe_names_a_programs_configuration():
    """`kgen run`'s first note for a tile program: the loop rulebook's choice (no tune entry
    is looked up for it), or that a row kernel has none."""
    from pathlib import Path

    from kgen.api import build_file
    from kgen.tune.select import describe

    examples = Path(__file__).resolve().parents[2] / "examples"
    plan = build_file(examples / "attention_fwd.kg").plan
    assert describe(plan, None) == f"configuration: {plan.config.value} ({plan.config.why})"
    assert "tile 128x64 warps 8 stages 2" in describe(plan, None)
    rows = build_file(examples / "attention_bwd_dot.kg").plan
    assert describe(rows, None).startswith("a row kernel")
