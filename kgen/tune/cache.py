"""The tune cache: the winning configuration of `kgen tune`, per kernel, arch, GPU and size
bucket, as small JSON files under `cache_root()/tune/<kernel hash>/`.

    <arch>.<gpu>.<bucket>.json      e.g. sm_80.NVIDIA-H200.K4096-M4096-N4096.json

- The kernel hash covers the kernel's IR without source locations (comments, blank lines and the
  file's name do not change it; any other edit does) and kgen's version.
- The size bucket rounds each runtime size up to a power of two: M=3000 and M=4096 share an
  entry, M=4097 does not. A schedule that wins at one size is near the best across its bucket;
  across a factor of two the best tile and split-K depth change.
- The rows part: each runtime size that is a tensor's row length (its contiguous extent: K for
  a row-major [M, K]) and not a multiple of ROW_ALIGN values, with the largest power of two
  that divides it. Rows that split 32-byte sectors or 128-byte lines change the best schedule
  (at 5000x3000x1000 the tiles that serve K = 1024 ran 0.61-0.73x torch.matmul, a cluster 2x1
  0.97-0.98x; docs/tuning.md), so K=1000 and K=1024 do not share an entry. Sizes whose rows
  are whole lines have no rows part: their file names are as before it.
- Files are read and written only in a folder private to this user (kgen.cachedir's rules) and
  never when `KGEN_CACHE=0`; writes are atomic. An entry that does not decode, or whose key is not
  the one asked for, is ignored.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from .. import __version__, ir
from ..cachedir import cache_root, enabled, is_private, private_dir
from ..targets import Config
from .codec import config_from_json, config_to_json

FOLDER = "tune"


def kernel_hash(kernel: ir.Kernel) -> str:
    """16 hex digits naming the kernel as planned: its IR without locations, and kgen's
    version (a newer kgen may plan the same configuration differently)."""
    text = f"kgen {__version__}\n{ir.canonical_text(kernel)}"
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def power_of_two_at_least(n: int) -> int:
    p = 1
    while p < n:
        p *= 2
    return p


def size_bucket(sizes: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Each runtime size rounded up to a power of two, by name."""
    return tuple((name, power_of_two_at_least(int(sizes[name]))) for name in sorted(sizes))


def bucket_text(bucket: tuple[tuple[str, int], ...]) -> str:
    return "-".join(f"{name}{value}" for name, value in bucket) or "fixed"


ROW_ALIGN = 64  # values: 64 16-bit values are one 128-byte L2 line


def row_dims(kernel: ir.Kernel) -> frozenset[str]:
    """The runtime sizes that are some tensor's row length: its contiguous extent (the
    columns of a row-major matrix, the rows of a column-major one)."""
    dims = (p.shape[1] if p.layout is ir.Layout.ROW else p.shape[0]
            for p in kernel.params if p.kind is ir.ParamKind.TENSOR)
    return frozenset(d for d in dims if isinstance(d, str))


def row_alignment(kernel: ir.Kernel, sizes: Mapping[str, int]) -> tuple[tuple[str, int], ...]:
    """Each of `sizes` that is a row length (row_dims) and not a multiple of ROW_ALIGN, with
    the largest power of two that divides it, by name."""
    values = ((name, int(sizes[name])) for name in sorted(row_dims(kernel) & set(sizes)))
    return tuple((name, value & -value) for name, value in values if value % ROW_ALIGN)


def rows_text(rows: tuple[tuple[str, int], ...]) -> str:
    """'.rows-K8': K a multiple of 8 values and no more (empty where every row is whole
    lines)."""
    return ".rows" + "".join(f"-{name}{value}" for name, value in rows) if rows else ""


Bucket = tuple[tuple[str, int], ...]


def size_key(kernel: ir.Kernel, sizes: Mapping[str, int]) -> tuple[Bucket, Bucket]:
    """The part of the key that `sizes` give: their bucket and their rows."""
    return size_bucket(sizes), row_alignment(kernel, sizes)


def sizes_text(kernel: ir.Kernel, sizes: Mapping[str, int]) -> str:
    """The bucket and rows part of the key of `sizes`, as in the entry's file name."""
    bucket, rows = size_key(kernel, sizes)
    return bucket_text(bucket) + rows_text(rows)


def gpu_slug(name: str) -> str:
    """A GPU name as a file-name part: `NVIDIA H100 80GB HBM3` -> `NVIDIA-H100-80GB-HBM3`."""
    return re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-") or "gpu"


@dataclass(frozen=True, slots=True)
class TuneKey:
    kernel: str  # the kernel's name (shown; the hash identifies it)
    kernel_hash: str
    arch: str  # the plan's arch: sm_80, sm_90a
    gpu: str  # the device's name, as the driver gives it
    bucket: tuple[tuple[str, int], ...]
    rows: tuple[tuple[str, int], ...] = ()  # row_alignment: row lengths that are not whole lines

    @property
    def file_name(self) -> str:
        return (f"{self.arch}.{gpu_slug(self.gpu)}.{bucket_text(self.bucket)}"
                f"{rows_text(self.rows)}.json")

    def as_dict(self) -> dict[str, Any]:
        return {"kernel": self.kernel, "kernel_hash": self.kernel_hash, "arch": self.arch,
                "gpu": self.gpu, "bucket": dict(self.bucket), "rows": dict(self.rows)}


def tune_key(kernel: ir.Kernel, arch: ir.Arch, gpu: str, sizes: Mapping[str, int]) -> TuneKey:
    """The key of `kernel` planned for `arch`, timed on `gpu` at `sizes` (its runtime sizes)."""
    return TuneKey(kernel.name, kernel_hash(kernel), arch.value, gpu, *size_key(kernel, sizes))


@dataclass(frozen=True, slots=True)
class TuneEntry:
    """What `kgen tune` found: the winning configuration and how fast it ran."""

    key: TuneKey
    config: Config
    label: str
    lines: tuple[tuple[str, str], ...]  # the schedule lines it fills: ("mma0 tile", "128x256x64")
    time_ms: float
    tflops: float | None
    sizes: tuple[tuple[str, int], ...]  # the sizes it was timed at
    candidates: int  # how many candidates were timed
    date: str  # ISO 8601, UTC

    def as_dict(self) -> dict[str, Any]:
        return {"kgen": __version__, "key": self.key.as_dict(),
                "config": config_to_json(self.config), "label": self.label,
                "lines": [list(line) for line in self.lines], "time_ms": self.time_ms,
                "tflops": self.tflops, "sizes": dict(self.sizes),
                "candidates": self.candidates, "date": self.date}

    @staticmethod
    def from_dict(data: Any) -> "TuneEntry":
        """Raises ValueError (or KeyError, TypeError) on anything malformed."""
        key = data["key"]
        bucket, rows = key["bucket"], key.get("rows", {})
        if not isinstance(bucket, dict) or not isinstance(rows, dict):
            raise ValueError("bucket and rows must be objects")
        time_ms = data["time_ms"]
        if not isinstance(time_ms, (int, float)) or time_ms <= 0:
            raise ValueError("time_ms must be a positive number")
        return TuneEntry(
            key=TuneKey(str(key["kernel"]), str(key["kernel_hash"]), str(key["arch"]),
                        str(key["gpu"]),
                        tuple((str(n), int(v)) for n, v in sorted(bucket.items())),
                        tuple((str(n), int(v)) for n, v in sorted(rows.items()))),
            config=config_from_json(data["config"]),
            label=str(data["label"]),
            lines=tuple((str(line), str(value)) for line, value in data["lines"]),
            time_ms=float(time_ms),
            tflops=float(data["tflops"]) if data.get("tflops") is not None else None,
            sizes=tuple((str(n), int(v)) for n, v in sorted(data["sizes"].items())),
            candidates=int(data["candidates"]),
            date=str(data["date"]),
        )


def now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat()


def _folder(kernel_hash_: str) -> str:
    return os.path.join(cache_root(), FOLDER, kernel_hash_)


def store(entry: TuneEntry) -> str | None:
    """Write the entry; its path, or None when caches are off or the folder is not private."""
    folder = private_dir(FOLDER, entry.key.kernel_hash)
    if folder is None:
        return None
    path = os.path.join(folder, entry.key.file_name)
    tmp = f"{path}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as handle:
            json.dump(entry.as_dict(), handle, indent=2)
            handle.write("\n")
        os.replace(tmp, path)
    except OSError:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None
    return path


def _readable(path: str) -> bool:
    return enabled() and is_private(os.path.dirname(path), directory=True) \
        and is_private(path, directory=False)


def lookup(key: TuneKey) -> TuneEntry | None:
    """The entry stored under `key`, or None (none, caches off, not private, malformed)."""
    path = os.path.join(_folder(key.kernel_hash), key.file_name)
    if not _readable(path):
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            entry = TuneEntry.from_dict(json.load(handle))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return entry if entry.key == key else None


def any_entries(kernel: ir.Kernel, arch: ir.Arch, gpu: str) -> bool:
    """True if some size bucket of this kernel, arch and GPU has an entry."""
    folder = _folder(kernel_hash(kernel))
    if not enabled() or not is_private(folder, directory=True):
        return False
    prefix = f"{arch.value}.{gpu_slug(gpu)}."
    try:
        return any(name.startswith(prefix) and name.endswith(".json")
                   for name in os.listdir(folder))
    except OSError:
        return False
