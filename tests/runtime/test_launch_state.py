"""The Python launcher's state: what it caches is per device (device properties, the loaded
kernel) or per stream (the deterministic reductions' workspace), and safe to use from several
threads. CPU only: the GPU-facing pieces are replaced by stand-ins."""
from __future__ import annotations

import threading

import pytest

import kgen.runtime.buffers as buffers
import kgen.runtime.device as device
from kgen.runtime.launch import CompiledKernel


def test_device_info_follows_the_current_device(monkeypatch):
    asked = []
    current = iter([0, 1, 1])
    monkeypatch.setattr(device, "current_device_id", lambda: next(current))
    monkeypatch.setattr(device, "_device_info",
                        lambda device_id: asked.append(device_id) or device_id)
    infos = [device.device_info(), device.device_info(), device.device_info(),
             device.device_info(0)]
    assert infos == [0, 1, 1, 0]  # a switch to device 1 is seen, not the first answer cached
    assert asked == [0, 1, 1, 0]


class FakeBuffer:
    made: list["FakeBuffer"] = []

    def __init__(self, shape, dtype, device_id=None):
        self.shape = shape
        self.device_id = device_id
        self.filled = []  # (byte, stream) of each fill_bytes
        self.ptr = 0x1000 * (len(FakeBuffer.made) + 1)
        FakeBuffer.made.append(self)

    @classmethod
    def empty(cls, shape, dtype, **kwargs):
        return cls(tuple(shape), dtype, **kwargs)

    def fill_bytes(self, value, stream=0):
        self.filled.append((value, stream))


class FakeSchedule:
    stream_k = False


class FakePlan:
    schedule = FakeSchedule()

    def workspace_floats(self, sizes, persistent_ctas=None):
        return sizes["floats"] + (persistent_ctas or 0)


@pytest.fixture
def kernel(monkeypatch):
    FakeBuffer.made = []
    monkeypatch.setattr(buffers, "DeviceBuffer", FakeBuffer)
    k = object.__new__(CompiledKernel)
    k.plan = FakePlan()
    k.device_id = 3
    k._workspaces = {}
    k._retired = []
    k._lock = threading.Lock()
    k.persistent_ctas = None
    return k


def test_workspace_per_stream_on_the_kernels_device(kernel):
    a = kernel._workspace_pointer({"floats": 100}, stream=11)
    b = kernel._workspace_pointer({"floats": 100}, stream=22)
    assert a != b  # concurrent launches on two streams never share partials
    assert kernel._workspace_pointer({"floats": 50}, stream=11) == a
    assert all(buffer.device_id == 3 for buffer in FakeBuffer.made)


def test_a_grown_workspace_keeps_the_old_one_alive(kernel):
    first = kernel._workspace_pointer({"floats": 100}, stream=0)
    second = kernel._workspace_pointer({"floats": 101}, stream=0)
    assert second != first
    old, new = FakeBuffer.made
    assert kernel._retired == [old]  # an enqueued launch may still read it
    assert new.shape == (200,)  # doubled: what is kept stays below what is live


def test_workspace_from_many_threads(kernel):
    pointers = []

    def launch(i):
        pointers.append(kernel._workspace_pointer({"floats": 64}, stream=i % 4))

    threads = [threading.Thread(target=launch, args=(i,)) for i in range(32)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(set(pointers)) == 4 and len(FakeBuffer.made) == 4


def test_a_driver_older_than_nvrtc_is_refused_with_the_fix():
    from kgen.runtime.device import driver_refusal

    assert driver_refusal((13, 0), (13, 5)) is None
    assert driver_refusal((12, 8), (12, 6)) is None
    why = driver_refusal((12, 4), (13, 0))
    assert "supports CUDA 12.4" in why and "NVRTC 13.0" in why and "nvidia-cuda-nvrtc<13" in why


def test_a_stream_k_workspace_starts_zero_on_its_stream(kernel):
    """Stream-K's flags must read zero at the first launch (each launch leaves them so): a
    new or grown workspace is cleared on the launch's stream, sized for the persistent grid."""
    kernel.plan.schedule = type("S", (), {"stream_k": True})()
    kernel.persistent_ctas = 132
    kernel._workspace_pointer({"floats": 100}, stream=7)
    kernel._workspace_pointer({"floats": 300}, stream=7)
    first, grown = FakeBuffer.made
    assert first.shape == (232,) and first.filled == [(0, 7)]
    assert grown.shape == (464,) and grown.filled == [(0, 7)]
