"""The on-disk cache of compiled cubins, keyed by everything that changes NVRTC's output.

Layout under the cache root (`$KGEN_CACHE_DIR`, default `~/.cache/kgen`; `KGEN_CACHE=0` turns
it off):
    v1/<key[:2]>/<key>.cubin   the cubin, usable as is with cuobjdump
    v1/<key[:2]>/<key>.json    {"key", "cubin_sha256", "log", resources...}; written second
    failed/<name>-<hash>.cu    sources NVRTC rejected, kept for the user to read
Every file is written to a temporary name in its own folder and renamed over the final name, so
a reader sees a whole old file or a whole new one. Any entry whose JSON does not parse or whose
cubin does not hash to the recorded value is treated as a miss and rewritten. Processes racing on
one key write identical bytes, so the last rename wins harmlessly.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import cachedir

FORMAT = "v1"


class KgenCacheWarning(UserWarning):
    """The compile cache cannot be used (e.g. a read-only folder); kgen goes on without it."""


# Roots already warned about, so that a broken cache warns once per process, not per compile.
_warned_roots: set[str] = set()


def default_root() -> Path:
    env = os.environ.get("KGEN_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "kgen"


def cache_enabled_by_env() -> bool:
    return os.environ.get("KGEN_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


@functools.lru_cache(maxsize=1)
def kgen_source_hash() -> str:
    """sha256 over kgen's own sources (Python, templates, grammar), in a fixed order."""
    package = Path(__file__).resolve().parent.parent
    roots = [package]
    repo = package.parent
    for extra in ("templates", "grammar"):
        if (repo / extra).is_dir():
            roots.append(repo / extra)
    digest = hashlib.sha256()
    files: list[tuple[str, Path]] = []
    for root in roots:
        for path in root.rglob("*"):
            if not path.is_file() or "__pycache__" in path.parts:
                continue
            if root == package and path.suffix not in (".py", ".j2", ".lark"):
                continue
            files.append((f"{root.name}/{path.relative_to(root).as_posix()}", path))
    for name, path in sorted(files):
        digest.update(name.encode())
        digest.update(b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    return digest.hexdigest()


@dataclass(frozen=True, slots=True)
class CacheEntry:
    cubin: bytes
    meta: dict[str, Any]


class CompileCache:
    """A folder of cubins. `enabled=False`, or a folder that cannot be written, makes every
    lookup a miss and every store a no-op."""

    def __init__(self, root: Path | str | None = None, *, enabled: bool | None = None):
        self.root = Path(root) if root is not None else default_root()
        self.enabled = cache_enabled_by_env() if enabled is None else enabled

    # -- keys ------------------------------------------------------------------------------

    @staticmethod
    def key(*, source: str, arch: str, options: tuple[str, ...], nvrtc_version: str) -> str:
        from .. import __version__

        digest = hashlib.sha256()
        for part in (
            f"kgen {__version__}",
            kgen_source_hash(),
            arch,
            json.dumps(list(options)),
            f"nvrtc {nvrtc_version}",
            source,
        ):
            digest.update(part.encode())
            digest.update(b"\0")
        return digest.hexdigest()

    def _paths(self, key: str) -> tuple[Path, Path]:
        folder = self.root / FORMAT / key[:2]
        return folder / f"{key}.cubin", folder / f"{key}.json"

    # -- read ------------------------------------------------------------------------------

    def load(self, key: str) -> CacheEntry | None:
        if not self.enabled:
            return None
        cubin_path, meta_path = self._paths(key)
        # a cubin is code the driver loads: only from a folder and file no one else can write
        if not (cachedir.is_private(str(cubin_path.parent), directory=True)
                and cachedir.is_private(str(cubin_path), directory=False)):
            return None
        try:
            meta = json.loads(meta_path.read_text())
            cubin = cubin_path.read_bytes()
        except (OSError, ValueError):
            return None  # absent, unreadable or torn: a miss, rebuilt by the caller
        if not isinstance(meta, dict) or meta.get("key") != key:
            return None
        if meta.get("cubin_sha256") != hashlib.sha256(cubin).hexdigest():
            return None
        return CacheEntry(cubin, meta)

    # -- write -----------------------------------------------------------------------------

    def store(self, key: str, cubin: bytes, meta: dict[str, Any]) -> bool:
        """Write an entry; False (after one warning per folder) when the folder is unusable."""
        if not self.enabled:
            return False
        cubin_path, meta_path = self._paths(key)
        record = dict(meta, key=key, cubin_sha256=hashlib.sha256(cubin).hexdigest())
        try:
            cubin_path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            _atomic_write(cubin_path, cubin)
            _atomic_write(meta_path, json.dumps(record, indent=1, sort_keys=True).encode())
        except OSError as err:
            self._disable(err)
            return False
        return True

    def save_failed(self, name: str, source: str) -> Path:
        """Keep a source NVRTC rejected; under the cache root, else the temp folder."""
        tag = hashlib.sha256(source.encode()).hexdigest()[:16]
        for folder in (self.root / "failed", Path(tempfile.gettempdir()) / "kgen-failed"):
            path = folder / f"{name}-{tag}.cu"
            try:
                folder.mkdir(parents=True, exist_ok=True)
                _atomic_write(path, source.encode())
                return path
            except OSError:
                continue
        raise OSError(f"cannot save the failing source of {name} anywhere")

    def _disable(self, err: OSError) -> None:
        self.enabled = False
        root = str(self.root)
        if root not in _warned_roots:
            _warned_roots.add(root)
            warnings.warn(
                f"kgen: compile cache disabled, cannot write to {root}: {err.strerror or err}",
                KgenCacheWarning,
                stacklevel=3,
            )


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def default_cache() -> CompileCache:
    """A cache at the folder the environment names now (tests change it between calls)."""
    return CompileCache()
