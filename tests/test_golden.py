"""Every example's emitted .cu and .h equal their snapshot in tests/golden/, byte for byte.

A refactor must leave them unchanged. An intended change is made by rewriting the snapshots
with `python3 tests/golden/update.py` and naming the change in the commit message."""
from __future__ import annotations

import difflib

import pytest

from tests.golden.snapshots import GOLDEN_DIR, snapshots

FRESH = dict(snapshots())


def test_every_snapshot_is_still_emitted():
    stored = {p.name for p in GOLDEN_DIR.iterdir() if p.suffix in (".cu", ".h")}
    assert stored == set(FRESH), (
        "snapshots and examples differ; run python3 tests/golden/update.py")


@pytest.mark.parametrize("name", sorted(FRESH))
def test_emission_matches_snapshot(name):
    path = GOLDEN_DIR / name
    assert path.exists(), f"no snapshot {name}; run python3 tests/golden/update.py"
    stored = path.read_text()
    fresh = FRESH[name]
    if stored != fresh:
        diff = "".join(list(difflib.unified_diff(
            stored.splitlines(True), fresh.splitlines(True), f"golden/{name}", "emitted"))[:80])
        pytest.fail(f"{name} changed; if intended, run python3 tests/golden/update.py and "
                    f"name the change in the commit\n{diff}")
