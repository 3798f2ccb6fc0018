"""The runtime reads the plan only: no module of kgen/runtime imports the IR, the front end or
the passes, and none reads `plan.kernel` (the IR kernel the plan was lowered from)."""
from __future__ import annotations

import ast
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[2] / "kgen" / "runtime"
FORBIDDEN = ("kgen.ir", "kgen.parse", "kgen.verify", "kgen.lower", "kgen.harness")
# tma.py takes the copy engine's box and dtype names from the schedule, the one table the
# emitter also reads, until that table moves out of kgen.lower (issue 14's redesign).
ALLOWED = {("tma.py", "kgen.lower")}


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative to kgen.runtime
                parts = ["kgen", "runtime"][: 2 - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return names


def test_runtime_imports_no_ir_front_end_passes_or_harness():
    bad = []
    for path in sorted(RUNTIME.glob("*.py")):
        for name in _imports(path):
            for forbidden in FORBIDDEN:
                if (name == forbidden or name.startswith(forbidden + ".")) \
                        and (path.name, forbidden) not in ALLOWED:
                    bad.append(f"{path.name} imports {name}")
    assert not bad, bad


def test_runtime_never_reads_plan_kernel():
    bad = [f"{path.name}:{node.lineno}"
           for path in sorted(RUNTIME.glob("*.py"))
           for node in ast.walk(ast.parse(path.read_text()))
           if isinstance(node, ast.Attribute) and node.attr == "kernel"
           and isinstance(node.value, (ast.Name, ast.Attribute))
           and (getattr(node.value, "id", None) or getattr(node.value, "attr", None)) == "plan"]
    assert not bad, bad
