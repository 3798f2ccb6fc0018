"""The parser-table cache is a pickle: it is loaded only from a folder no one else can write.

A planted cache file whose unpickling makes a folder stands in for an attacker's code: with the
cache in a folder that others can write, or in a file that others can write, it must not run,
and the parser must still work. In a private folder the tables are cached as before.
"""
from __future__ import annotations

import os
import pickle
import stat

import pytest

from kgen import cachedir
from kgen import parse as parse_module

pytestmark = pytest.mark.skipif(not hasattr(os, "getuid"), reason="POSIX owners and modes")

KERNEL = """kernel k {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  gemm g = A @ B { tile 128x128x32 warps 2x2 stages 3 epilogue { D = acc } }
}
"""


class _Payload:
    """Unpickling this makes the folder `marker`: proof that the file was loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def _plant(folder, marker) -> str:
    """A cache file as Lark reads it (a hash line, then pickles) at the name kgen will look up."""
    path = os.path.join(folder, parse_module.parser_cache_name())
    with open(path, "wb") as f:
        f.write(b"0" * 64 + b"\n" + pickle.dumps(_Payload(str(marker))))
    return path


def _parses(parser) -> None:
    assert parser.parse(KERNEL).data == "start"


@pytest.mark.parametrize("mode", [0o777, 0o775, 0o757, 0o1777], ids=oct)
def test_a_cache_folder_others_can_write_is_not_loaded(tmp_path, monkeypatch, mode):
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(mode)
    monkeypatch.setenv("KGEN_CACHE_DIR", str(folder))
    marker = tmp_path / "pwned"
    _plant(folder, marker)
    _parses(parse_module.build_parser())
    assert not marker.exists(), f"a pickle in a folder of mode {mode:o} was loaded"


def test_a_cache_file_others_can_write_is_not_loaded(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    folder.mkdir(mode=0o700)
    monkeypatch.setenv("KGEN_CACHE_DIR", str(folder))
    marker = tmp_path / "pwned"
    path = _plant(folder, marker)
    os.chmod(path, 0o666)
    _parses(parse_module.build_parser())
    assert not marker.exists()
    assert os.path.getsize(path) < 200, "the unsafe file is left alone, not rewritten"


def test_a_private_folder_caches_the_tables(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KGEN_CACHE_DIR", str(folder))
    _parses(parse_module.build_parser())
    assert stat.S_IMODE(folder.stat().st_mode) & 0o077 == 0, "made private"
    path = folder / parse_module.parser_cache_name()
    assert path.is_file(), "the tables were saved"
    _parses(parse_module.build_parser())  # and load again


def test_kgen_cache_0_writes_no_tables(tmp_path, monkeypatch):
    folder = tmp_path / "cache"
    monkeypatch.setenv("KGEN_CACHE_DIR", str(folder))
    monkeypatch.setenv("KGEN_CACHE", "0")
    _parses(parse_module.build_parser())
    assert not folder.exists()


def test_is_private(tmp_path):
    folder = tmp_path / "d"
    folder.mkdir(mode=0o700)
    file = folder / "f"
    file.write_bytes(b"")
    file.chmod(0o600)
    assert cachedir.is_private(str(folder), directory=True)
    assert cachedir.is_private(str(file), directory=False)
    assert not cachedir.is_private(str(file), directory=True)
    assert not cachedir.is_private(str(folder / "missing"), directory=False)
    file.chmod(0o620)
    assert not cachedir.is_private(str(file), directory=False)
    folder.chmod(0o770)
    assert not cachedir.is_private(str(folder), directory=True)
