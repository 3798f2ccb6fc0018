"""kgen/runtime/device.py without a GPU: which target a compute capability has, and whether a
GPU is newer than a plan's target in a way that matters (its own target has a faster path)."""
from __future__ import annotations

import pytest

from kgen.runtime.device import arch_for, can_run, capability, newer_target


def test_arch_names_and_capabilities():
    assert arch_for((9, 0)) == "sm_90a" and arch_for((8, 6)) == "sm_86"
    assert capability("sm_90a") == (9, 0) and capability("sm_80") == (8, 0)


@pytest.mark.parametrize("plan_arch, cc, own", [
    ("sm_80", (9, 0), "sm_90a"),  # an sm_80 file on an H100/H200: wgmma, TMA
    ("sm_86", (9, 0), "sm_90a"),
    ("sm_89", (9, 0), "sm_90a"),
    ("sm_90a", (9, 0), None),  # its own target
    ("sm_80", (8, 0), None),
    ("sm_80", (8, 6), None),  # newer, but sm_86 has nothing faster (less shared memory)
    ("sm_80", (8, 9), None),
    ("sm_80", (10, 0), None),  # a GPU kgen has no target for
])
def test_newer_target(plan_arch, cc, own):
    assert newer_target(plan_arch, cc) == own
    assert own is None or can_run(plan_arch, cc) is None  # it runs, only slower
