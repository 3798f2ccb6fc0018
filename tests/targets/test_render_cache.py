"""Jinja's bytecode cache holds marshalled code: kgen keeps it only in a folder that no one else
can write, and loads only files this user owns and no one else can write."""
from __future__ import annotations

import os
import stat

import jinja2
import pytest

from kgen.targets.common import render

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")


def test_no_bytecode_cache_in_a_folder_others_can_write(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    (shared / "templates").mkdir(parents=True)
    os.chmod(shared / "templates", 0o777)
    monkeypatch.setenv("KGEN_CACHE_DIR", str(shared))
    assert render._bytecode_cache() is None


def test_bytecode_cache_in_a_private_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "mine"))
    cache = render._bytecode_cache()
    assert cache is not None
    folder = tmp_path / "mine" / "templates"
    assert stat.S_IMODE(os.stat(folder).st_mode) & 0o077 == 0


def test_a_file_others_can_write_is_not_loaded(tmp_path, monkeypatch):
    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path / "mine"))
    cache = render._bytecode_cache()
    loaded = []
    monkeypatch.setattr(jinja2.FileSystemBytecodeCache, "load_bytecode",
                        lambda self, bucket: loaded.append(bucket.key))
    bucket = jinja2.bccache.Bucket(jinja2.Environment(), "k", "checksum")
    path = cache._get_cache_filename(bucket)
    with open(path, "wb") as f:  # a planted file
        f.write(b"j2" + b"\x00" * 64)
    os.chmod(path, 0o666)
    cache.load_bytecode(bucket)
    assert loaded == []  # others could have written it: never read
    os.chmod(path, 0o600)
    cache.load_bytecode(bucket)
    assert loaded == ["k"]
