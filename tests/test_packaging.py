"""pyproject lists every package of kgen (a folder left out is missing from the wheel)."""
from __future__ import annotations

from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+

ROOT = Path(__file__).resolve().parents[1]


def test_every_package_is_listed():
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())
                 ["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts)
             for p in (ROOT / "kgen").rglob("__init__.py")}
    assert found <= listed, f"not in pyproject's packages: {sorted(found - listed)}"
