"""Where kgen may load cache files that hold code: a directory only this user can write.

Lark's parser-table cache is a pickle and Jinja's template bytecode cache is marshalled code:
loading either runs what the file says. So such a file is loaded only from a directory that
belongs to the current user and that no one else can write (then no one else can create,
replace or rename a file in it), and only when the file too is ours and writable by no one else.
Anywhere else the caller builds in memory and writes nothing. `KGEN_CACHE=0` turns these caches
off as it does the cubin cache.
"""
from __future__ import annotations

import os
import stat

__all__ = ["cache_root", "enabled", "is_private", "private_dir"]


def cache_root() -> str:
    """`$KGEN_CACHE_DIR`, default `~/.cache/kgen`."""
    default = os.path.join(os.path.expanduser("~"), ".cache", "kgen")
    return os.environ.get("KGEN_CACHE_DIR") or default


def enabled() -> bool:
    """False when `KGEN_CACHE` turns caches off (0, false, no, off)."""
    return os.environ.get("KGEN_CACHE", "1").strip().lower() not in ("0", "false", "no", "off")


def is_private(path: str, directory: bool) -> bool:
    """True if `path` is a directory (or a regular file) owned by this user and writable by no
    one else. Links are followed: what counts is the directory or file they reach."""
    if not hasattr(os, "getuid"):  # no POSIX owner and mode to check: never trust
        return False
    try:
        info = os.stat(path)
    except OSError:
        return False
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    return kind_ok and info.st_uid == os.getuid() and not others_write


def private_dir(*parts: str) -> str | None:
    """The cache folder `cache_root()/parts...`, made (mode 0700) if missing, or None when caches
    are off, it cannot be made, or it is not private (see is_private)."""
    if not enabled():
        return None
    folder = os.path.join(cache_root(), *parts)
    try:
        os.makedirs(folder, mode=0o700, exist_ok=True)
    except OSError:
        return None
    return folder if is_private(folder, directory=True) else None
