"""Rewrite the golden snapshots: `python3 tests/golden/update.py` from the repository root.

Each example is emitted, exactly as `kgen compile examples/NAME.kg [--arch sm_90a]
-o NAME.ARCH.cu --header NAME.ARCH.h` writes it (that command is each file's "Regenerate with"
line), for its own target and for sm_90a where the example plans for it, into
`tests/golden/NAME.ARCH.cu` and `tests/golden/NAME.ARCH.h`. `tests/test_golden.py` compares
every snapshot byte for byte; a commit that changes one names the change and why.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.golden.snapshots import GOLDEN_DIR, snapshots  # noqa: E402


def main() -> int:
    fresh = dict(snapshots())
    for old in GOLDEN_DIR.glob("*.cu"):
        if old.name not in fresh:
            old.unlink()
    for old in GOLDEN_DIR.glob("*.h"):
        if old.name not in fresh:
            old.unlink()
    changed = 0
    for name, text in fresh.items():
        path = GOLDEN_DIR / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed += 1
            print(f"wrote {path.relative_to(ROOT)}")
    print(f"{len(fresh)} snapshots, {changed} changed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
