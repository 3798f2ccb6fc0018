"""The tune cache: kernel hash, size bucket, key, entries on disk (private folders only, none
with KGEN_CACHE=0, malformed ones ignored)."""
from __future__ import annotations

import dataclasses
import json
import os

import pytest

from kgen.enums import Arch
from kgen.targets import Config, GemmConfig
from kgen.tune import cache

from .helpers import example_text, kernel_of


@pytest.fixture
def tune_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KGEN_CACHE", raising=False)
    return tmp_path / "cache" / "tune"


def entry_for(kernel, sizes, gpu="NVIDIA H200", time_ms=0.5):
    config = Config((GemmConfig((128, 128, 64), (2, 2), 4),), why="test")
    key = cache.tune_key(kernel, Arch.SM80, gpu, sizes)
    return cache.TuneEntry(key=key, config=config, label=config.label,
                           lines=(("mma0 tile", "128x128x64"),), time_ms=time_ms, tflops=123.0,
                           sizes=tuple(sorted(sizes.items())), candidates=7, date=cache.now())


def test_bucket_rounds_each_size_up_to_a_power_of_two():
    assert cache.size_bucket({"M": 3000, "N": 4096, "K": 4097}) == (
        ("K", 8192), ("M", 4096), ("N", 4096))
    assert cache.size_bucket({"M": 1}) == (("M", 1),)
    assert cache.bucket_text(cache.size_bucket({"N": 100, "M": 65})) == "M128-N128"
    assert cache.bucket_text(()) == "fixed"


def test_row_lengths_that_are_not_whole_lines_are_part_of_the_key():
    """K = 1000 and K = 1024 share a bucket but not an entry: the rows of a row-major [M, K]
    and a column-major [K, N] are K long, and a row of 1000 values splits sectors. M is no
    tensor's row length here; N is D's (row-major [M, N])."""
    kernel = kernel_of(example_text("gemm"))
    assert cache.row_dims(kernel) == {"K", "N"}
    assert cache.row_alignment(kernel, {"M": 4999, "N": 3000, "K": 1000}) == (("K", 8), ("N", 8))
    assert cache.row_alignment(kernel, {"M": 4999, "N": 4096, "K": 1024}) == ()
    assert cache.row_alignment(kernel, {"M": 5000, "N": 4096, "K": 2000}) == (("K", 16),)
    aligned = cache.tune_key(kernel, Arch.SM90A, "NVIDIA H100", {"M": 4096, "N": 4096, "K": 1024})
    split = cache.tune_key(kernel, Arch.SM90A, "NVIDIA H100", {"M": 4096, "N": 4096, "K": 1000})
    assert aligned.bucket == split.bucket and aligned != split
    assert aligned.file_name == "sm_90a.NVIDIA-H100.K1024-M4096-N4096.json"
    assert split.file_name == "sm_90a.NVIDIA-H100.K1024-M4096-N4096.rows-K8.json"
    assert cache.sizes_text(kernel, {"M": 4096, "N": 4104, "K": 1000}) == \
        "K1024-M4096-N8192.rows-K8-N8"


def test_an_entry_keeps_its_rows_and_one_without_them_still_loads(tune_dir):
    kernel = kernel_of(example_text("gemm"))
    entry = entry_for(kernel, {"M": 4096, "N": 4096, "K": 1000})
    assert entry.key.rows == (("K", 8),)
    assert cache.TuneEntry.from_dict(entry.as_dict()) == entry
    # a file from before the rows part: no "rows" in its key, read as whole lines
    before = entry_for(kernel, {"M": 4096, "N": 4096, "K": 1024}).as_dict()
    del before["key"]["rows"]
    assert cache.TuneEntry.from_dict(before).key.rows == ()


def test_kernel_hash_ignores_comments_and_layout_not_the_kernel():
    text = example_text("gemm")
    base = cache.kernel_hash(kernel_of(text))
    moved = "# another comment\n\n" + text.replace("  tensor A", "  # c\n    tensor A")
    assert cache.kernel_hash(kernel_of(moved, "other.kg")) == base
    assert cache.kernel_hash(kernel_of(text.replace("D = acc", "D = relu(acc)"))) != base
    assert cache.kernel_hash(kernel_of(text.replace("row out", "col out"))) != base
    assert len(base) == 16


def test_kernel_hash_ignores_where_keep_resident_is_written():
    text = example_text("b2b_gemm_rf_pingpong_sm90a", stripped=False)
    moved = text.replace("    keep B0 resident\n", "\n\n    keep B0 resident\n")
    assert cache.kernel_hash(kernel_of(text)) == cache.kernel_hash(kernel_of(moved))


def test_gpu_names_become_file_name_parts():
    assert cache.gpu_slug("NVIDIA H100 80GB HBM3") == "NVIDIA-H100-80GB-HBM3"
    assert cache.gpu_slug("../../x") == "x"


def test_store_then_lookup_in_the_same_bucket(tune_dir):
    kernel = kernel_of(example_text("gemm"))
    entry = entry_for(kernel, {"M": 4096, "N": 4096, "K": 4096})
    path = cache.store(entry)
    assert path is not None and os.path.dirname(path) == str(tune_dir / entry.key.kernel_hash)
    assert os.path.basename(path) == "sm_80.NVIDIA-H200.K4096-M4096-N4096.json"
    assert oct(os.stat(os.path.dirname(path)).st_mode & 0o777) == "0o700"
    same_bucket = cache.tune_key(kernel, Arch.SM80, "NVIDIA H200", {"M": 3000, "N": 3840,
                                                                    "K": 2112})
    assert cache.lookup(same_bucket) == entry
    for other in (cache.tune_key(kernel, Arch.SM80, "NVIDIA H200", {"M": 4097, "N": 4096,
                                                                     "K": 4096}),
                  cache.tune_key(kernel, Arch.SM90A, "NVIDIA H200", dict(entry.sizes)),
                  cache.tune_key(kernel, Arch.SM80, "NVIDIA H100", dict(entry.sizes))):
        assert cache.lookup(other) is None
    assert cache.any_entries(kernel, Arch.SM80, "NVIDIA H200")
    assert not cache.any_entries(kernel, Arch.SM80, "NVIDIA A100")
    data = json.loads(open(path).read())
    assert data["config"]["gemms"][0]["tile"] == [128, 128, 64]
    assert data["key"]["bucket"] == {"K": 4096, "M": 4096, "N": 4096}


def test_cache_off_stores_and_finds_nothing(tune_dir, monkeypatch):
    kernel = kernel_of(example_text("gemm"))
    entry = entry_for(kernel, {"M": 64, "N": 64, "K": 64})
    assert cache.store(entry) is not None
    monkeypatch.setenv("KGEN_CACHE", "0")
    assert cache.lookup(entry.key) is None
    assert not cache.any_entries(kernel, Arch.SM80, "NVIDIA H200")
    assert cache.store(entry) is None


def test_a_folder_others_can_write_is_not_read(tune_dir):
    kernel = kernel_of(example_text("gemm"))
    entry = entry_for(kernel, {"M": 64, "N": 64, "K": 64})
    path = cache.store(entry)
    os.chmod(os.path.dirname(path), 0o777)
    try:
        assert cache.lookup(entry.key) is None
        assert not cache.any_entries(kernel, Arch.SM80, "NVIDIA H200")
    finally:
        os.chmod(os.path.dirname(path), 0o700)
    assert cache.lookup(entry.key) == entry


@pytest.mark.parametrize("damage", [
    lambda d: "not json",
    lambda d: json.dumps({**d, "config": {"gemms": []}}),
    lambda d: json.dumps({**d, "time_ms": -1}),
    lambda d: json.dumps({k: v for k, v in d.items() if k != "lines"}),
    lambda d: json.dumps({**d, "key": {**d["key"], "kernel_hash": "0" * 16}}),
])
def test_a_damaged_entry_is_ignored(tune_dir, damage):
    kernel = kernel_of(example_text("gemm"))
    entry = entry_for(kernel, {"M": 64, "N": 64, "K": 64})
    path = cache.store(entry)
    data = json.loads(open(path).read())
    with open(path, "w") as handle:
        handle.write(damage(data))
    assert cache.lookup(entry.key) is None


def test_entry_round_trips_through_its_dict():
    kernel = kernel_of(example_text("gemm"))
    entry = entry_for(kernel, {"M": 64, "N": 128, "K": 64})
    assert cache.TuneEntry.from_dict(json.loads(json.dumps(entry.as_dict()))) == entry
    assert dataclasses.replace(entry, tflops=None).as_dict()["tflops"] is None
