"""The emitters' layout: Hopper code only in sm_90 files, one-way imports, an explicit dispatch
table chosen by the plan, templates that include no other architecture's pieces."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from kgen import emit, ir

ROOT = Path(__file__).resolve().parents[2]
TARGETS = ROOT / "kgen" / "targets"
TEMPLATES = ROOT / "templates"

# Hopper instructions and concepts (sm_90a): none may appear in a file named for sm_80.
HOPPER = re.compile(r"wgmma|cp\.async\.bulk|bulk_|mbarrier|setmaxnreg|CUtensorMap|"
                    r"cuTensorMapEncode|TensorMap|fence\.proxy|fence_proxy|elect\.sync|"
                    r"warpgroup|pingpong|tma_", re.IGNORECASE)



def _sm80_files():
    return sorted(list((TARGETS / "sm80").glob("*.py")) + list((TEMPLATES / "sm80").glob("*.j2")))


@pytest.mark.parametrize("path", _sm80_files(), ids=lambda p: p.name)
def test_no_hopper_code_in_sm80_files(path):
    hits = [f"{i}: {line.strip()}" for i, line in enumerate(path.read_text().split("\n"), 1)
            if HOPPER.search(line)]
    assert not hits, f"{path.relative_to(ROOT)} holds sm_90a code:\n" + "\n".join(hits)


def _imports(path: Path) -> set[str]:
    """Absolute names of the modules that `path` imports."""
    package = ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")
            base = parts[: len(parts) - node.level + 1] if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            out.add(module)
            out |= {f"{module}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize("path", sorted(TARGETS.rglob("*.py")) + [ROOT / "kgen" / "emit.py"],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_emitters_read_the_plan_not_the_ir(path):
    rel = str(path.relative_to(ROOT))
    bad = {m for m in _imports(path)
           if re.match(r"kgen\.(ir|lower|parse|verify)(\.|$)", m)}
    assert not bad, f"{rel} imports {sorted(bad)}"
    reads = path.read_text().count("plan.kernel")
    assert not reads, f"{rel} reads the IR through plan.kernel"


def test_targets_do_not_import_each_other():
    """sm80 and sm90 share code through kgen/targets/common only; common imports neither."""
    for path in sorted((TARGETS / "common").glob("*.py")):
        assert not {m for m in _imports(path) if re.match(r"kgen\.targets\.sm\d+", m)}, path
    for path in sorted((TARGETS / "sm80").glob("*.py")):
        assert not {m for m in _imports(path) if m.startswith("kgen.targets.sm90")}, path
    for path in sorted((TARGETS / "sm90").glob("*.py")):
        assert not {m for m in _imports(path) if m.startswith("kgen.targets.sm80")}, path


@pytest.mark.parametrize("arch", ["sm80", "sm90"])
def test_templates_include_only_their_arch_and_common(arch):
    other = {"sm80": "sm90", "sm90": "sm80"}[arch]
    for path in sorted((TEMPLATES / arch).glob("*.j2")):
        assert f'"{other}/' not in path.read_text(), f"{path.name} includes {other} pieces"
    for path in sorted((TEMPLATES / "common").glob("*.j2")):
        assert not re.search(r'"sm\d+/', path.read_text()), f"common/{path.name} includes arch code"


def test_modules_stay_small():
    for path in sorted(TARGETS.rglob("*.py")):
        assert len(path.read_text().split("\n")) <= 700, path


def test_dispatch_is_a_table_chosen_by_the_plan():
    from kgen.lower import lower
    from kgen.parse import parse_file

    assert set(emit.EMITTERS) == {("sm80", "gemm"), ("sm80", "chain"), ("sm90", "chain"),
                                  ("sm90", "gemm")}
    rf = lower(parse_file(ROOT / "examples" / "b2b_gemm_rf_pingpong_sm90a.kg").kernels[0])
    assert rf.schedule.wgmma and emit.family(rf) == "sm90" and emit.kind(rf) == "chain"
    smem = lower(parse_file(ROOT / "examples" / "b2b_gemm_smem.kg").kernels[0])
    assert not smem.schedule.wgmma and emit.family(smem) == "sm80" and emit.kind(smem) == "chain"
    gemm = lower(parse_file(ROOT / "examples" / "gemm.kg").kernels[0])
    assert (emit.family(gemm), emit.kind(gemm)) == ("sm80", "gemm")
    hopper = lower(parse_file(ROOT / "examples" / "gemm.kg").kernels[0], ir.Arch.SM90A)
    assert (emit.family(hopper), emit.kind(hopper)) == ("sm90", "gemm")


def test_ldmatrix_rows_in_cpp_match_the_proved_maps():
    """The C++ row and column of each thread's ldmatrix address equal the Python maps that the
    lowering proves its offset tables with, for every lane, warp offset, fragment and k step."""
    from kgen.lower.fragments import LDMATRIX
    from kgen.targets.common.operands import LDMATRIX_ROW_COL

    assert set(LDMATRIX_ROW_COL) == set(LDMATRIX)
    for key, (row, col) in LDMATRIX_ROW_COL.items():
        as_python = [compile(e.replace("/", "//"), "<cpp>", "eval") for e in (row, col)]
        for lane in range(32):
            for warp_off in (0, 16, 32, 64):
                for f in range(4):
                    for kk in range(4):
                        env = dict(lane=lane, warp_off=warp_off, f=f, kk=kk)
                        got = tuple(eval(c, {}, env) for c in as_python)
                        assert got == LDMATRIX[key].coord(lane, warp_off, f, kk), (key, env)


def test_every_emitter_named_in_the_tables_exists():
    """The tables name their emitters as text, imported on first use: each must resolve."""
    for where in list(emit.EMITTERS.values()) + list(emit.PROGRAM_EMITTERS.values()) + [
            "common.loop:emit_header", "common.host_api:emit_header"]:
        assert callable(emit._emitter(where)), where
