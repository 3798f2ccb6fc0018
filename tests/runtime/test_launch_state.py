"""The Python launcher's state: what it caches is per device (device properties), and the
driver it needs. CPU only: the GPU-facing pieces are replaced by stand-ins. The workspaces are
per launch now (tests/runtime/test_calls.py)."""
from __future__ import annotations



import kgen.runtime.device as device


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


def test_a_driver_older_than_nvrtc_is_refused_with_the_fix():
    from kgen.runtime.device import driver_refusal

    assert driver_refusal((13, 0), (13, 5)) is None
    assert driver_refusal((12, 8), (12, 6)) is None
    why = driver_refusal((12, 4), (13, 0))
    assert "supports CUDA 12.4" in why and "NVRTC 13.0" in why and "nvidia-cuda-nvrtc<13" in why
