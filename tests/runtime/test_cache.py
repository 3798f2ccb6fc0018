"""The compile cache: keys, hits, corrupt entries rebuilt, unwritable folders, concurrency."""
from __future__ import annotations

import hashlib
import json
import multiprocessing
import os

import pytest

from kgen.runtime import cache as cache_module
from kgen.runtime.cache import CompileCache, KgenCacheWarning, kgen_source_hash
from kgen.runtime.nvrtc import compile_cubin
from tests.runtime.cache_workers import SOURCE, compile_worker, store_load_worker


def entry_paths(root, key):
    folder = root / cache_module.FORMAT / key[:2]
    return folder / f"{key}.cubin", folder / f"{key}.json"


def only_key(root):
    jsons = list((root / cache_module.FORMAT).rglob("*.json"))
    assert len(jsons) == 1
    return jsons[0].stem


def test_key_depends_on_every_input():
    base = dict(source="a", arch="sm_80", options=("x=1",), nvrtc_version="13.0")
    key = CompileCache.key(**base)
    assert key == CompileCache.key(**base)
    for change in (dict(source="b"), dict(arch="sm_90a"), dict(options=("x=2",)),
                   dict(nvrtc_version="13.5")):
        assert CompileCache.key(**{**base, **change}) != key
    assert len(kgen_source_hash()) == 64


def test_store_and_load_round_trip(tmp_path):
    cache = CompileCache(tmp_path, enabled=True)
    assert cache.load("ab" * 32) is None
    assert cache.store("ab" * 32, b"\x7fELFcubin", {"log": "hi", "registers": 3})
    entry = cache.load("ab" * 32)
    assert entry.cubin == b"\x7fELFcubin" and entry.meta["registers"] == 3
    assert entry.meta["cubin_sha256"] == hashlib.sha256(b"\x7fELFcubin").hexdigest()
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_hit_after_miss(cache_dir):
    first = compile_cubin(SOURCE, "add", "sm_80")
    second = compile_cubin(SOURCE, "add", "sm_80")
    assert not first.cached and second.cached and second.cubin == first.cubin
    key = only_key(cache_dir)
    cubin_path, meta_path = entry_paths(cache_dir, key)
    assert cubin_path.read_bytes() == first.cubin
    assert json.loads(meta_path.read_text())["registers"] == first.registers


@pytest.mark.parametrize("damage", ["truncate_cubin", "flip_cubin", "garbage_json",
                                    "empty_json", "missing_cubin"])
def test_corrupt_entry_is_rebuilt(cache_dir, damage):
    good = compile_cubin(SOURCE, "add", "sm_80")
    cubin_path, meta_path = entry_paths(cache_dir, only_key(cache_dir))
    if damage == "truncate_cubin":
        cubin_path.write_bytes(good.cubin[: len(good.cubin) // 2])
    elif damage == "flip_cubin":
        data = bytearray(good.cubin)
        data[100] ^= 0xFF
        cubin_path.write_bytes(bytes(data))
    elif damage == "garbage_json":
        meta_path.write_text("{not json")
    elif damage == "empty_json":
        meta_path.write_text("")
    else:
        cubin_path.unlink()
    rebuilt = compile_cubin(SOURCE, "add", "sm_80")
    assert not rebuilt.cached and rebuilt.cubin == good.cubin
    assert compile_cubin(SOURCE, "add", "sm_80").cached  # and the entry is whole again
    assert cubin_path.read_bytes() == good.cubin


def test_disabled_by_environment(cache_dir, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE", "0")
    assert not compile_cubin(SOURCE, "add", "sm_80").cached
    assert not compile_cubin(SOURCE, "add", "sm_80").cached
    assert not cache_dir.exists()


def test_unwritable_cache_dir_warns_once(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("KGEN_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(cache_module, "_warned_roots", set())
    with pytest.warns(KgenCacheWarning, match="compile cache disabled") as caught:
        result = compile_cubin(SOURCE, "add", "sm_80")
        compile_cubin(SOURCE, "add", "sm_80")
    assert result.cubin[:4] == b"\x7fELF" and not result.cached
    assert len([w for w in caught if issubclass(w.category, KgenCacheWarning)]) == 1


def test_read_only_cache_dir_warns(tmp_path, monkeypatch):
    root = tmp_path / "ro-cache"
    root.mkdir()
    monkeypatch.setenv("KGEN_CACHE_DIR", str(root))
    monkeypatch.setattr(cache_module, "_warned_roots", set())
    if os.geteuid() == 0:  # root writes through permissions: make the write fail instead
        def refuse(path, data):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(cache_module, "_atomic_write", refuse)
    else:
        root.chmod(0o555)
    try:
        with pytest.warns(KgenCacheWarning, match="Permission denied"):
            assert not compile_cubin(SOURCE, "add", "sm_80").cached
    finally:
        root.chmod(0o755)


def test_failed_source_saved_even_without_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    cache = CompileCache(blocker / "cache", enabled=True)
    path = cache.save_failed("k", "int x = ;")
    assert path.read_text() == "int x = ;" and "kgen-failed" in str(path)


# -- concurrency: separate processes (spawned, so the workers live in an importable module) ---


def _run_processes(target, args_list):
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    processes = [context.Process(target=target, args=(*args, queue)) for args in args_list]
    for process in processes:
        process.start()
    results = [queue.get(timeout=180) for _ in processes]
    for process in processes:
        process.join(timeout=60)
    return results


@pytest.mark.slow
def test_concurrent_compiles_share_one_entry(tmp_path):
    root = str(tmp_path / "shared")
    results = _run_processes(compile_worker, [(root,)] * 6)
    assert all(status == "ok" for status, _ in results), results
    assert len({digest for _, digest in results}) == 1
    entry = CompileCache(root, enabled=True).load(only_key(tmp_path / "shared"))
    assert hashlib.sha256(entry.cubin).hexdigest() == results[0][1]


@pytest.mark.slow
def test_concurrent_store_and_load_never_tear(tmp_path):
    root = str(tmp_path / "race")
    payload = os.urandom(256 * 1024)
    results = _run_processes(store_load_worker, [(root, "cd" * 32, payload, 40)] * 6)
    assert all(status == "ok" for status, _ in results), results
    assert sum(seen for _, seen in results) > 0


def test_no_cubin_is_loaded_from_a_folder_others_can_write(tmp_path):
    """A cubin is code the driver runs: a planted entry in a shared folder is a miss."""
    import os

    if not hasattr(os, "getuid"):
        return
    cache = CompileCache(tmp_path / "c", enabled=True)
    key = "ab" + "0" * 62
    assert cache.store(key, b"\x7fELF-cubin", {"log": ""})
    assert cache.load(key) is not None
    folder = tmp_path / "c"
    for path in [p for p in folder.rglob("*")] + [folder]:
        if path.is_dir():
            os.chmod(path, 0o777)
    assert cache.load(key) is None
