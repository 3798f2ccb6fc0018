"""bench/mods.py (bench/attention.py --mods) on the CPU: the summary's ratios from table()'s rows (the timing
itself needs a GPU)."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from bench import mods as bench  # noqa: E402


def _row(causal, kv, mod, kgen_ms, flex_ms):
    return {"d": 128, "s": 4096, "causal": causal, "kv_heads": kv, "mod": mod,
            "kgen_ms": kgen_ms, "flex_ms": flex_ms}


def test_mods_summary_divides_by_the_plain_kernel_of_the_same_setting(capsys):
    rows = [_row(False, 16, "plain", 2.0, 3.0), _row(False, 16, "softcap", 3.0, 6.0),
            _row(True, 16, "plain", 1.0, 2.0), _row(True, 16, "bias", 1.5, None)]
    bench.mods_summary(rows)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["causal", "heads", "mod", "kgen", "ms", "/", "plain", "Flex",
                                "ms", "Flex/kgen"]
    assert lines[2].split() == ["False", "16/16", "softcap", "3.000", "1.50", "6.000", "2.00"]
    assert lines[4].split() == ["True", "16/16", "bias", "1.500", "1.50", "-", "-"]


def test_the_mods_grid_names_every_mod_of_the_issue():
    assert bench.MODS == ("plain", "softcap", "alibi", "window", "document", "bias", "blocks")
    assert bench.WINDOW == 1024

