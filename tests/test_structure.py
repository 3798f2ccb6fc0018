"""The structure rules of docs/architecture.md, checked on the source (parsed, never imported):
no module of kgen over 700 lines; no C++ statement in a Python string of the layers that emit
code (the C++ lives in templates/, and Python hands the templates values); the targets share
code through kgen/targets/common only, and each renders only its own and the common templates.
(The layers' import order is tests/test_layers.py's.)"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.test_layers import _imports

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "kgen"
TEMPLATES = ROOT / "templates"
TARGETS = PACKAGE / "targets"
# where the emitted code is decided and printed: no C++ statement in their Python strings
EMITTING = (TARGETS, PACKAGE / "lower", PACKAGE / "plan", PACKAGE / "emit.py")
MAX_LINES = 700


def _modules(*roots: Path) -> list[Path]:
    return sorted(p for root in roots for p in ([root] if root.is_file() else root.rglob("*.py")))


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


@pytest.mark.parametrize("path", _modules(PACKAGE), ids=_rel)
def test_no_module_is_over_700_lines(path):
    lines = len(path.read_text().splitlines())
    assert lines <= MAX_LINES, f"{_rel(path)} has {lines} lines (at most {MAX_LINES}): split it"


# ---- C++ in Python strings ----------------------------------------------------------------

# A line of C++ code: a pragma, a barrier, inline assembly, a shuffle, a C for loop, a branch or
# loop head, a closing brace, a block opened after a head, a return, a call, a declaration, an
# assignment (each statement ending in `;`, perhaps with a // comment after it).
_END = r";\s*(//.*)?$"
CPP_LINE = [re.compile(p) for p in (
    r"#\s*pragma\b",
    r"\b__syncthreads\s*\(",
    r"\basm\s+volatile\b",
    r"\b__shfl_\w+\s*\(",
    r"\bfor\s*\([^;]*;[^;]*;",
    r"^\s*(if|for|while|switch)\s*\(.*\)\s*(\{|\w.*;)\s*(//.*)?$",
    r"^\s*\}\s*(else\b.*)?;?\s*$",
    r"\)\s*(const\s*)?\{\s*(//.*)?$",
    r"^\s*return\b[^.]*" + _END,
    r"^\s*[A-Za-z_][\w:.]*(<[^;()]*>)?\s*\(.*\)" + _END,
    r"^\s*(const\s+|static\s+|constexpr\s+|__shared__\s+|unsigned\s+|long\s+)*"
    r"[A-Za-z_][\w:<>]*[\s*&]+[A-Za-z_]\w*(\[[^\]]*\])*(\s*,\s*[A-Za-z_]\w*)*\s*(=[^=].*)?" + _END,
    r"^\s*[*A-Za-z_][\w.:\[\]()<>*+ -]*[\w\])]\s*[-+*/|&^]?=\s*[^=].*" + _END,
)]


def cpp_lines(text: str) -> list[str]:
    """The lines of `text` that read as C++ code."""
    return [line for line in text.split("\n") if any(p.search(line) for p in CPP_LINE)]


def _strings(tree: ast.AST):
    """(line, text) of every string literal that is not a docstring; an f-string's text with
    `{}` where its values go (adjacent literals are one string to the parser)."""
    docstrings = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                docstrings.add(id(first.value))
    parts = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            parts |= {id(v) for v in node.values}
            yield node.lineno, "".join(v.value if isinstance(v, ast.Constant) else "{}"
                                       for v in node.values)
    for node in ast.walk(tree):
        if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in docstrings | parts):
            yield node.lineno, node.value


def test_no_cpp_statement_in_a_python_string():
    """C++ lives in templates/ (or a fixed helper template): Python hands the templates
    numbers, names and small dataclasses, never statements. (The epilogue renderer,
    kgen/targets/common/epilogue_cpp.py, builds each DAG node's expression; its statements
    are templates/common/epilogue_statements.inc.j2's.)"""
    found = []
    for path in _modules(*EMITTING):
        for line, text in _strings(ast.parse(path.read_text(), str(path))):
            found += [f"{_rel(path)}:{line}: {code.strip()}" for code in cpp_lines(text)]
    assert not found, "C++ in Python strings (move it into a template):\n" + "\n".join(found)


@pytest.mark.parametrize("code", [
    "#pragma unroll",
    "__syncthreads();",
    'asm volatile("bar.sync 1, 256;");',
    "v = __shfl_xor_sync(0xffffffffu, v, offset)",
    "for (int i = 0; i < kFragM; ++i) {",
    "if (col < N) {",
    "if (!both) red0_1 = ReduceSum::identity();",
    "}",
    "} else {  // the other half",
    "__device__ __forceinline__ void f(int x) {",
    "return cudaSuccess;",
    "cp_async_wait<kStages - 2>();",
    "tma_load_box({}, &maps.{}, full + 8 * s, {});  // a box",
    "const int row = m0 + lane / 4;",
    "float red0_part[kFragM][2];",
    "long long sk_begin, sk_end, sk_stop;",
    "const float v1 = p.alpha;",
    "q.workspace += batch * floats;",
    "*reinterpret_cast<float2*>(part + col) = make_float2(acc[0], acc[1]);",
    "p.E[(col + 0) * p.ld_E + row] = v3_0;",
])
def test_the_cpp_check_finds_statements(code):
    assert cpp_lines(f"// a comment\n{code}\n") == [code]


@pytest.mark.parametrize("prose", [
    "Each B's shared tile holds all of its k tiles (the first gemm's stages hold A only);",
    "MN-major (A is column-major): 128-byte rows along M, read transposed (imm-trans-a); ",
    "the copy engine's box: 64 rows x 64 columns; each thread loads its elements",
    "m0 + warp_m * kWarpTileM + i * 16 + lane / 4",
    "static_cast<long long>(tiles_m) * tiles_n",
    "const __grid_constant__ {}_params all_batches",
    "`tile 128x128x64` forces a slower kernel; delete it",
])
def test_the_cpp_check_passes_prose_and_expressions(prose):
    assert cpp_lines(prose) == []


# ---- the targets' imports and templates ---------------------------------------------------

ARCHES = ("sm80", "sm90")


@pytest.mark.parametrize("arch", ARCHES + ("common",))
def test_targets_share_code_through_common_only(arch):
    """sm80 never imports sm90, nor sm90 sm80: what both use is in kgen/targets/common, which
    imports neither."""
    others = [a for a in ARCHES if a != arch]
    found = [f"{_rel(path)} imports {module}"
             for path in _modules(TARGETS / arch)
             for module in sorted(_imports(path))
             if any(re.match(rf"kgen\.targets\.{other}(\.|$)", module) for other in others)]
    assert not found, "\n".join(found)


def _template_names(path: Path) -> list[tuple[int, str]]:
    """The template names a module mentions ("sm90/gemm.cu.j2"): what it renders."""
    return [(line, text) for line, text in _strings(ast.parse(path.read_text(), str(path)))
            if re.fullmatch(r"[\w/.]+\.j2", text)]


@pytest.mark.parametrize("arch", ARCHES + ("common",))
def test_targets_render_their_own_and_common_templates(arch):
    """A target's emitter prints templates/<its arch>/ and templates/common/ only; every
    template it names exists."""
    allowed = {arch, "common"}
    for path in _modules(TARGETS / arch):
        for line, name in _template_names(path):
            assert name.split("/")[0] in allowed, f"{_rel(path)}:{line} renders {name}"
            assert (TEMPLATES / name).is_file(), f"{_rel(path)}:{line}: no template {name}"


@pytest.mark.parametrize("arch", ARCHES + ("common",))
def test_templates_include_their_own_and_common_templates(arch):
    """templates/<arch>/ includes and imports its own and the common templates only, and
    templates/common/ no arch's."""
    allowed = {arch, "common"}
    for path in sorted((TEMPLATES / arch).glob("*.j2")):
        for name in re.findall(r'<%-?\s*(?:include|import|from|extends)\s+"([^"]+)"',
                               path.read_text()):
            assert name.split("/")[0] in allowed, f"templates/{arch}/{path.name} uses {name}"
            assert (TEMPLATES / name).is_file(), f"templates/{arch}/{path.name}: no {name}"


# ---- The Schedule: components, each with its own why, not flat flags ----------------------

SCHEDULE = PACKAGE / "plan" / "schedule.py"
# the records of how a schedule was chosen, beside its components (they decide nothing)
SCHEDULE_RECORDS = {"gemms", "tensor_maps", "rejected", "chosen", "untaken"}


def _schedule_classes() -> dict[str, ast.ClassDef]:
    tree = ast.parse(SCHEDULE.read_text(), str(SCHEDULE))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def _fields(cls: ast.ClassDef) -> dict[str, str]:
    """A dataclass's fields: name -> its annotation's source text."""
    return {node.target.id: ast.unparse(node.annotation) for node in cls.body
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)}


def _methods(cls: ast.ClassDef) -> set[str]:
    return {node.name for node in cls.body if isinstance(node, ast.FunctionDef)}


@pytest.mark.parametrize("name", ["Schedule", "GemmSchedule"])
def test_the_schedule_has_no_flat_reasons(name):
    """A reason belongs to the component whose decision it explains (each component's `why`):
    Schedule and GemmSchedule hold components, never a `why_*` field beside a flat value."""
    flat = [field for field in _fields(_schedule_classes()[name]) if field.startswith("why")]
    assert not flat, (f"{name} has {', '.join(flat)}: put the decision and its why in a "
                      "component (kgen/plan/schedule.py; docs/architecture.md, The Schedule)")


@pytest.mark.parametrize("name", ["Schedule", "GemmSchedule"])
def test_every_schedule_field_is_a_component_that_describes_itself(name):
    """Each field of Schedule (but its records) and of GemmSchedule (but its name) is a
    component class of kgen/plan/schedule.py with a describe(): `kgen inspect` walks them."""
    classes = _schedule_classes()
    skip = SCHEDULE_RECORDS if name == "Schedule" else {"name"}
    for field, annotation in _fields(classes[name]).items():
        if field in skip:
            continue
        assert annotation in classes, f"{name}.{field}: {annotation} is not a component"
        assert "describe" in _methods(classes[annotation]), (
            f"{name}.{field}: {annotation} has no describe() for `kgen inspect`")
