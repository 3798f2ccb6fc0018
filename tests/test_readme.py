"""The README's kernel is the example it names, and its commands start from a venv."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_readme_kernel_is_the_example():
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## A kernel"):]
    shown = re.search(r"```\n(kernel .*?)\n```", section, re.S).group(1)
    example = (ROOT / "examples" / "gemm_bias_relu.kg").read_text()
    code = "\n".join(line for line in example.splitlines() if not line.startswith("#"))
    assert shown.strip() == code.strip()


def test_readme_commands_start_from_a_venv():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if "pip install" in line]
    assert commands and all(c.startswith("python3 -m venv .venv && . .venv/bin/activate")
                            for c in commands)
    ci = (ROOT / ".ci" / "run").read_text()
    test_command = next(c for c in commands if "pytest" in c)
    assert test_command in ci
