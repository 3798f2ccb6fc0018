"""The import rule: frontend -> ir -> passes -> plan -> targets -> codegen, with the runtime
reading the plan only. Each module of kgen is parsed (not imported) and every kgen module it
imports, at any depth of the file, is checked against the table below."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "kgen"

FRONTEND = ("kgen.parse", "kgen.verify", "kgen.syntax", "kgen.diagnostics", "kgen.frontend")
PASSES = ("kgen.lower",)
AFTER_PLAN = ("kgen.emit", "kgen.targets", "kgen.runtime", "kgen.harness", "kgen.tune",
              "kgen.report", "kgen.plot", "kgen.api", "kgen.cli")
# module prefix -> the kgen modules it must not import (a prefix matches itself and below it)
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "kgen.enums": ("kgen.",),
    "kgen.ir": FRONTEND + PASSES + ("kgen.plan",) + AFTER_PLAN,
    "kgen.parse": PASSES + ("kgen.plan",) + AFTER_PLAN,
    # verify may ask a target what it can do (dtypes, shared memory), nothing past that
    "kgen.verify": PASSES + ("kgen.plan",) + tuple(m for m in AFTER_PLAN if m != "kgen.targets")
    + ("kgen.targets.common", "kgen.targets.sm80", "kgen.targets.sm90"),
    "kgen.diagnostics": PASSES + ("kgen.plan",) + AFTER_PLAN,
    "kgen.plan": ("kgen.ir",) + FRONTEND + PASSES + AFTER_PLAN,
    # the passes may ask a target what it can do and which schedules it allows, not emit
    "kgen.lower": ("kgen.emit", "kgen.runtime", "kgen.harness", "kgen.report", "kgen.api",
                   "kgen.cli", "kgen.targets.common", "kgen.targets.sm80.gemm",
                   "kgen.targets.sm80.chain", "kgen.targets.sm80.epilogue",
                   "kgen.targets.sm90.chain"),
    "kgen.targets": ("kgen.ir",) + FRONTEND + PASSES + ("kgen.runtime", "kgen.harness",
                                                       "kgen.report", "kgen.api", "kgen.cli"),
    "kgen.emit": ("kgen.ir",) + FRONTEND + PASSES + ("kgen.runtime", "kgen.harness",
                                                    "kgen.report", "kgen.api", "kgen.cli"),
    "kgen.runtime": ("kgen.ir",) + FRONTEND + PASSES + ("kgen.emit", "kgen.harness",
                                                       "kgen.report", "kgen.api", "kgen.cli"),
    # the harness runs and times a kernel; the tuner above it uses it, never the reverse
    "kgen.harness": ("kgen.tune", "kgen.report", "kgen.plot", "kgen.api", "kgen.cli"),
    # the tuner sits under the API and the command line (kgen.load and kgen run use it)
    "kgen.tune": ("kgen.report", "kgen.api", "kgen.cli"),
    "kgen.plot": ("kgen.ir",) + FRONTEND + PASSES + ("kgen.emit", "kgen.runtime", "kgen.tune",
                                                     "kgen.api", "kgen.cli"),
}


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path) -> set[str]:
    """Every kgen module the file imports, absolute or relative, at any depth."""
    name = _module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "kgen"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "kgen":
                continue
            found.add(module)
            # `from kgen import ir` / `from . import chain` import modules by name
            found |= {f"{module}.{a.name}" for a in node.names
                      if (PACKAGE.parent / Path(*f"{module}.{a.name}".split("."))).with_suffix(".py").exists()
                      or (PACKAGE.parent / Path(*f"{module}.{a.name}".split("."))).is_dir()}
    return found


def _matches(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix.rstrip(".") + ".") or (
        prefix.endswith(".") and module.startswith(prefix))


MODULES = sorted(PACKAGE.rglob("*.py"))


@pytest.mark.parametrize("path", MODULES, ids=lambda p: _module_name(p))
def test_module_respects_the_layers(path):
    name = _module_name(path)
    broken = []
    for owner, forbidden in FORBIDDEN.items():
        if not _matches(name, owner):
            continue
        for imported in sorted(_imports(path)):
            if imported != name and any(_matches(imported, f) for f in forbidden):
                broken.append(imported)
    assert not broken, f"{name} imports {', '.join(sorted(set(broken)))} against the layers"


def test_no_module_over_700_lines():
    long = {_module_name(p): n for p in MODULES if (n := len(p.read_text().splitlines())) > 700}
    assert not long, f"modules over 700 lines: {long}"


def test_plan_holds_no_ir_kernel():
    from kgen.plan import KernelPlan

    assert "kernel" not in KernelPlan.__dataclass_fields__
