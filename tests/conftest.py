"""Shared test setup.

GPU tests carry `@pytest.mark.gpu`; without a usable CUDA device they are skipped (not failed),
so `pytest` passes on a CPU-only machine and `pytest -m gpu` runs them where a GPU exists.
"""
from __future__ import annotations

import functools

import pytest


@functools.lru_cache(maxsize=1)
def cuda_device_usable() -> bool:
    try:
        from cuda.bindings import driver
    except Exception:
        return False
    try:
        (err,) = driver.cuInit(0)
        if err != driver.CUresult.CUDA_SUCCESS:
            return False
        err, count = driver.cuDeviceGetCount()
        return err == driver.CUresult.CUDA_SUCCESS and count > 0
    except Exception:
        return False


def pytest_collection_modifyitems(config, items):
    if cuda_device_usable():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none usable here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A fresh, private NVRTC cache for the test."""
    folder = tmp_path / "kgen-cache"
    monkeypatch.setenv("KGEN_CACHE_DIR", str(folder))
    monkeypatch.delenv("KGEN_CACHE", raising=False)
    return folder
