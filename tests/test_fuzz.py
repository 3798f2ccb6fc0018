"""Fuzzing `kgen compile` and `kgen inspect`, in process, through the CLI's own code path.

Three sources of inputs:
  * grammar-aware generation (hypothesis): mostly valid kernels built from strategies, with
    hostile names (C++ keywords, CUDA and C library names, macros, the generated code's own
    identifiers, unicode, `D; system(x)`, `x/*`), dtypes, tiles (0, negative, 2**63, huge),
    numbers (nan, inf, 1e999, ...) and expressions of random depth;
  * tile programs (loop kernels, row kernels), generated the same way and run through parse,
    verify and the NumPy reference: a located KgenError or outputs of the declared shapes;
  * mutation of every examples/*.kg: deleted, duplicated or inserted tokens, random bytes, huge
    numbers, deep nesting, identifiers renamed to unicode, keywords and macros.

The property, for every input and every command:
  * exit 0, and for `compile` a .cu that is ASCII, whose every user-given name (any string in
    the parsed IR) passes `check_identifier`, and whose identifiers are either kgen's own words
    or contain one of those names: no other user text reaches the C++; or
  * exit 2 with exactly one located message `file:line:col: error: ...` (then the source line
    and a caret), never a traceback; and
  * an answer within a time bound (a hypothesis deadline and a SIGALRM per command).
A capped subset of the accepted outputs (those using names that look dangerous first) is
compiled with NVRTC for its target, to show that what kgen accepts also compiles.

Fixed seed (`derandomize=True`). `KGEN_FUZZ_EXAMPLES=N` sets the number of inputs per
hypothesis test (default: a CI-sized run, well under three minutes on two cores).
"""
from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import re
import signal
from datetime import timedelta
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from click.testing import CliRunner  # noqa: E402
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from kgen.cli import cli  # noqa: E402
from kgen.errors import KgenError, SourceLoc  # noqa: E402
from kgen.parse import parse  # noqa: E402
from kgen.verify import check_identifier  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted((ROOT / "examples").glob("*.kg"))

SCALE = int(os.environ.get("KGEN_FUZZ_EXAMPLES", "0") or 0)
GENERATED = SCALE or 200  # generated kernels
MUTATED = SCALE or 100  # mutants of each example
NVRTC_CAP = max(SCALE // 20, 8) if SCALE else 8  # NVRTC compiles per test function
COMMAND_SECONDS = 10  # SIGALRM per command: a hang fails the test instead of the CI job
DEADLINE = timedelta(seconds=20)  # hypothesis' deadline per input (all commands, NVRTC)

FUZZ_SETTINGS = settings(
    derandomize=True,
    # No shrinking: one run of the property is slow enough that shrinking a failure could
    # take many minutes; the failing input is printed as generated.
    phases=(Phase.explicit, Phase.generate),
    database=None,
    deadline=DEADLINE,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.filter_too_much,
        HealthCheck.function_scoped_fixture,
    ],
)

FILE_NAME = "input.kg"
LOCATED = re.compile(r"^(?P<file>.+?):(?P<line>\d+):(?P<col>\d+): error: \S")
# Words kgen makes up: the epilogue's values (v1, v2_0, ...) and the source's hash.
GENERATED_VALUE = re.compile(r"v\d+(_\d+)?|[0-9a-f]{16,64}")
DOTTED = re.compile(r"[A-Za-z][A-Za-z0-9_]*(\.[A-Za-z][A-Za-z0-9_]*)+")
WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
NUMBER = re.compile(r"(?<![A-Za-z0-9_])\.?\d[\w.]*(?:[eE][+-]\d+[fFlL]?)?")


# ---------------------------------------------------------------------------------------------
# Running the CLI with a time bound


class Hang(Exception):
    """A command took longer than COMMAND_SECONDS."""


@contextlib.contextmanager
def time_limit(seconds: float):
    if not hasattr(signal, "setitimer"):  # no SIGALRM (Windows): hypothesis' deadline only
        yield
        return

    def on_alarm(signum, frame):
        raise Hang(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def invoke(*args: str):
    with time_limit(COMMAND_SECONDS):
        return CliRunner().invoke(cli, list(args))


# ---------------------------------------------------------------------------------------------
# What kgen writes by itself: every word of its templates, of the code that fills them (the
# lowering and emission passes, the IR and plan) and of the examples' emitted code. An
# identifier in a fuzzed .cu outside this vocabulary must come from a name the user gave (and
# the verifier accepted).

EMITTING = ["templates/**/*.j2", "kgen/emit.py", "kgen/targets/**/*.py", "kgen/lower/*.py",
            "kgen/ir.py", "kgen/enums.py", "kgen/plan.py", "kgen/__init__.py"]


def _words(text: str) -> set[str]:
    """Identifier-like words, numbers (1.5f, 0x1F, 128x128x32) left out."""
    return set(WORD.findall(NUMBER.sub(" ", text)))


@pytest.fixture(scope="module")
def vocabulary() -> frozenset[str]:
    words: set[str] = set()
    for path in (path for pattern in EMITTING for path in ROOT.glob(pattern)):
        if path.is_file():
            words |= _words(path.read_text(errors="replace"))
    from kgen.api import build_file

    for example in EXAMPLES:
        words |= _words(build_file(example).source)
    return frozenset(words)


def user_strings(node, found: set[str] | None = None) -> set[str]:
    """Every plain string held anywhere in the IR (names, dimensions, ...), locations aside."""
    found = set() if found is None else found
    stack = [node]
    while stack:
        item = stack.pop()
        if type(item) is str:
            found.add(item)
        elif isinstance(item, SourceLoc):
            continue
        elif isinstance(item, (tuple, list, frozenset, set)):
            stack.extend(item)
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif dataclasses.is_dataclass(item) and not isinstance(item, type):
            stack.extend(getattr(item, f.name) for f in dataclasses.fields(item))
    return found


# ---------------------------------------------------------------------------------------------
# The property


class Fuzzing:
    """Runs the commands on one input at a time and checks the property; counts outcomes."""

    def __init__(self, folder: Path, vocabulary: frozenset[str], cache) -> None:
        self.folder = folder
        self.vocabulary = vocabulary
        self.cache = cache
        # The names the generator uses unless it is being hostile, and the examples' names.
        self.plain = set(PLAIN_NAMES)
        for example in EXAMPLES:
            self.plain |= user_strings(parse(example.read_text(), example.name).kernels)
        self.compiled: list[str] = []  # digests of the sources NVRTC compiled
        self.accepted = 0
        self.rejected = 0

    def __repr__(self) -> str:  # hypothesis prints the arguments of a failing example
        return f"Fuzzing({self.accepted} accepted, {self.rejected} rejected)"

    def check(self, data: bytes, nvrtc: bool | None = None) -> None:
        """Run compile and inspect on `data` as a .kg file and check the property. `nvrtc`:
        compile an accepted output with NVRTC always (True), never (False) or within the cap."""
        path = self.folder / FILE_NAME
        out = self.folder / "input.cu"
        path.write_bytes(data)
        out.unlink(missing_ok=True)
        header = self.folder / "input.h"
        header.unlink(missing_ok=True)

        args = ["compile", str(path), "-o", str(out)]
        if _has_option("compile", "--header"):
            args += ["--header", str(header)]
        compiled = invoke(*args)
        ok = self._answer(compiled, path, data, "compile")
        if ok:
            self.accepted += 1
            source = out.read_text()
            texts = [source] + ([header.read_text()] if header.exists() else [])
            names = self._check_source(texts, data)
            if nvrtc or (nvrtc is None and self._pick_for_nvrtc(source, names)):
                self._nvrtc(source, data)
        else:
            self.rejected += 1
            assert not out.exists(), "compile failed but wrote its output"

        inspect_args = ["inspect", str(path)]
        if int(hashlib.sha256(data).hexdigest(), 16) % 2:
            inspect_args.append("--json")
        inspected = invoke(*inspect_args)
        command = " ".join(inspect_args[:1] + inspect_args[2:])
        inspect_ok = self._answer(inspected, path, data, command)
        if inspect_ok and "--json" in inspect_args:
            assert json.loads(inspected.stdout)["kernels"]
        if ok and not inspect_ok:
            # compile takes one kernel; inspect shows every kernel of the file, so it may only
            # fail where the file holds several. One kernel: both agree.
            assert len(self._module(data).kernels) > 1, (
                f"compile accepted but inspect refused:\n{inspected.stderr}"
            )

    def _answer(self, result, path: Path, data: bytes, command: str) -> bool:
        shown = _show(data)
        if isinstance(result.exception, Hang):
            pytest.fail(f"kgen {command} hung on:\n{shown}")
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            import traceback

            trace = "".join(traceback.format_exception(*result.exc_info))
            pytest.fail(f"kgen {command} raised on:\n{shown}\n{trace}")
        output = result.stdout + result.stderr
        assert "Traceback" not in output, f"{command}: traceback for:\n{shown}\n{output}"
        if result.exit_code == 0:
            return True
        assert result.exit_code == 2, (
            f"kgen {command} exited {result.exit_code} on:\n{shown}\n{output}"
        )
        lines = result.stderr.rstrip("\n").split("\n")
        match = LOCATED.match(lines[0])
        assert match, f"kgen {command}: not a located message:\n{result.stderr}\nfor:\n{shown}"
        assert match["file"] == str(path)
        assert int(match["line"]) >= 1 and int(match["col"]) >= 1, lines[0]
        assert len(lines) in (1, 3), f"one message, its line and a caret:\n{result.stderr}"
        if len(lines) == 3:
            assert set(lines[2].strip()) <= {"^", "~"} and "^" in lines[2], result.stderr
        return False

    def _module(self, data: bytes):
        return parse(data.decode("utf-8-sig"), FILE_NAME)

    def _check_source(self, texts: list[str], data: bytes) -> set[str]:
        module = self._module(data)
        names = user_strings(module.kernels)
        for name in sorted(names):
            if "." in name and DOTTED.fullmatch(name):  # a gemm's phase: `g0.mainloop`
                continue
            try:
                check_identifier(name, SourceLoc(FILE_NAME, 1, 1, 1, 1), "name")
            except KgenError as err:
                pytest.fail(f"accepted an unsafe name {name!r} ({err.message}) in:\n{_show(data)}")
        lowered = [n.lower() for n in names]
        allowed = self.vocabulary | _words(FILE_NAME)
        for text in texts:
            assert text.isascii(), f"non-ASCII text in the output for:\n{_show(data)}"
            for word in sorted(_words(text) - allowed):
                if GENERATED_VALUE.fullmatch(word):
                    continue
                assert any(n in word.lower() for n in lowered), (
                    f"the output holds {word!r}, which is neither kgen's nor a checked user "
                    f"name ({sorted(names)}), for:\n{_show(data)}"
                )
        return names

    def _pick_for_nvrtc(self, source: str, names: set[str]) -> bool:
        if len(self.compiled) >= NVRTC_CAP:
            return False
        digest = hashlib.sha256(source.encode()).hexdigest()
        if digest in self.compiled:
            return False
        # Unusual names that are also words of kgen's own code or of CUDA's come first; then
        # about one accepted output in four, up to half the cap.
        risky = any(n not in self.plain and (n in self.vocabulary or n in HOSTILE_NAMES)
                    for n in names)
        return risky or (int(digest, 16) % 4 == 0 and len(self.compiled) < NVRTC_CAP // 2)

    def _nvrtc(self, source: str, data: bytes) -> None:
        from kgen.errors import KgenRuntimeError
        from kgen.runtime.nvrtc import compile_cubin

        chosen = self._module(data).kernels[0]
        self.compiled.append(hashlib.sha256(source.encode()).hexdigest())
        try:
            # for the kernel's own target: a .cu planned for sm_90a stops at its #error on sm_80
            result = compile_cubin(source, chosen.name, chosen.target.value, cache=self.cache)
        except KgenRuntimeError as err:
            pytest.fail(f"kgen accepted this input but NVRTC refused its output:\n{_show(data)}"
                        f"\n{err}")
        assert result.cubin[:4] == b"\x7fELF"


def _show(data: bytes) -> str:
    text = data.decode("utf-8", errors="backslashreplace")
    return text if len(text) < 4000 else text[:2000] + "\n...\n" + text[-1000:]


_OPTIONS: dict[tuple[str, str], bool] = {}


def _has_option(command: str, option: str) -> bool:
    key = (command, option)
    if key not in _OPTIONS:
        params = cli.commands[command].params
        _OPTIONS[key] = any(option in getattr(p, "opts", ()) for p in params)
    return _OPTIONS[key]


@pytest.fixture(scope="module")
def fuzzing(tmp_path_factory, vocabulary):
    from kgen.runtime.cache import CompileCache

    folder = tmp_path_factory.mktemp("fuzz")
    return Fuzzing(folder, vocabulary, CompileCache(folder / "cache", enabled=True))


# ---------------------------------------------------------------------------------------------
# Hostile pieces

CPP_NAMES = [
    "int", "float", "class", "asm", "auto", "return", "template", "typename", "operator", "new",
    "delete", "this", "union", "struct", "namespace", "using", "goto", "register", "volatile",
    "__global__", "__device__", "__shared__", "__launch_bounds__", "__CUDACC__",
    "__CUDACC_RTC__", "_Bool", "__half", "NULL", "EOF", "INFINITY", "NAN", "assert", "printf",
    "main", "std", "threadIdx", "blockIdx", "warpSize", "dim3", "half", "half2", "float2",
    "nv_bfloat16", "size_t", "uint32_t", "cudaSuccess", "cudaStream_t", "cudaMalloc",
    "CUDART_VERSION", "CUDA_VERSION", "CUresult", "hypotf", "erfcf", "fdividef", "rint", "nanf",
    "expf", "fmaxf", "make_float2", "atomicAdd", "memcpy", "malloc", "exit", "abort", "clock",
]
KGEN_OWN_NAMES = [
    "SharedStorage", "kTileM", "kTileN", "kTileK", "kStages", "kThreads", "kWarpsM", "kFragN",
    "kGroupM", "kSmemBytes", "ALayout", "BLayout", "smem_address", "cp_async_16",
    "cp_async_commit", "cp_async_wait", "ldmatrix_x4", "ldmatrix_x4_trans", "mma_16816",
    "mma_step", "load_a_stage", "load_b_stage", "smem_raw", "smem", "a_smem", "b_smem",
    "a_frag", "b_frag", "acc_frag", "tid", "lane", "warp_id", "warp_m", "warp_n", "tiles_m",
    "tiles_n", "tile_m", "m0", "n0", "k_tiles", "kt", "slot", "a_base", "b_base", "row", "col",
    "p", "params", "v1", "v2", "v1_0", "acc_0", "acc_1", "ld_A", "ld_D", "mma0_epilogue",
    "gemm_params", "gemm_kgen", "gemm_launch", "gemm_can_implement", "KGEN_GEMM_PARAMS_DEFINED",
    "M_", "N_", "K_", "attribute_set", "err", "stream",
]
UNICODE_NAMES = ["données", "Ω", "ℌx", "ﬁle", "x\u200b", "ａ", "日本", "é", "Ａ1", "x\u0301"]
INJECTIONS = [
    "D; system(x)", "x/*", "x*/", "x//", "a\"b", "a'b", "x\\", "#define", "a b", "a.b",
    "a-b", "a::b", "a<b>", "a{", "a}", "${x}", "{{ x }}", "<% x %>", "x\ny", "x\x00",
]
LONG_NAMES = ["a" * 64, "b" * 65, "x_" * 40]
PLAIN_NAMES = ["M", "N", "K", "A", "B", "C", "D", "bias", "rscale", "alpha", "mma0", "t0", "t1",
               "t2", "gemm_k", "k", "fused_gemm", "my_kernel", "gemm_k2", "k2", "fused_gemm2",
               "my_kernel2"]
HOSTILE_NAMES = frozenset(CPP_NAMES + KGEN_OWN_NAMES + UNICODE_NAMES + INJECTIONS + LONG_NAMES)

NUMBERS = [
    "0", "1", "2", "0.5", "1.5", "-1", "-0.0", ".5", "1e-5", "1e999", "1e39", "-1e39",
    "3.4028235e38", "3.4028236e38", "1e-50", "1e-999", "nan", "inf", "-inf", "NaN", "Infinity",
    "9" * 400, "0x10", "1_000", "1.5f", "2**63",
]
SIZES = [
    "0", "-1", "-128", "1", "3", "8", "16", "32", "48", "64", "96", "128", "256", "512", "1024",
    "65536", "65537", "2147483647", "2147483648", str(2**63), str(2**64), "9" * 50, "1.5",
    "+64", "064", "1e3",
]
GOOD_CONFIGS = [
    ("128x128x32", "2x2", "3"),
    ("128x256x64", "2x4", "3"),
    ("64x64x32", "2x2", "2"),
    ("128x128x64", "2x2", "4"),
    ("64x128x32", "1x4", "3"),
    ("256x128x32", "4x2", "3"),
]
DTYPES = ["f16", "bf16", "f32"]
ODD_DTYPES = ["f64", "half", "int8", "fp16", "F16", "bf8", "tf32", "f16x2"]
FUNCTIONS = {
    "relu": 1, "gelu": 1, "gelu_tanh": 1, "silu": 1, "sigmoid": 1, "tanh": 1, "exp": 1,
    "log": 1, "sqrt": 1, "rsqrt": 1, "abs": 1, "hardswish": 1, "min": 2, "max": 2,
    "leaky_relu": 2, "clamp": 3, "where": 3,
}
ODD_FUNCTIONS = ["rowsum", "colmax", "reduce_sum", "erf", "pow", "system", "printf", "foo"]


def hostile_name() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(sorted(HOSTILE_NAMES)),
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,12}", fullmatch=True),
        st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1,
                max_size=6),
    )


def a_number() -> st.SearchStrategy[str]:
    return st.one_of(
        st.sampled_from(NUMBERS),
        st.floats(allow_nan=False, allow_infinity=False, width=32).map(lambda x: repr(abs(x))),
        st.integers(0, 2**70).map(str),
    )


def a_size() -> st.SearchStrategy[str]:
    return st.one_of(st.sampled_from(SIZES), st.integers(-(2**70), 2**70).map(str))


class Chooser:
    """Draws the plain choice, or with probability `hostility` percent a hostile one."""

    def __init__(self, draw, hostility: int):
        self.draw = draw
        self.hostility = hostility

    def hostile(self) -> bool:
        return self.hostility > 0 and self.draw(st.integers(0, 99)) < self.hostility

    def __call__(self, plain, hostile: st.SearchStrategy):
        return self.draw(hostile) if self.hostile() else plain

    def name(self, plain: str) -> str:
        return self(plain, hostile_name())

    def dtype(self, plain: str) -> str:
        return self(plain, st.sampled_from(DTYPES + ODD_DTYPES))

    def number(self) -> str:
        plain = self.draw(st.sampled_from(["0", "1", "2", "0.5", "1.5", "0.25", "3", "0.1"]))
        return self(plain, a_number())


# ---------------------------------------------------------------------------------------------
# Grammar-aware generation


@st.composite
def expressions(draw, leaves: list[str], depth: int, odd: bool):
    if depth <= 0 or draw(st.integers(0, 3)) == 0:
        return draw(st.sampled_from(leaves))
    kind = draw(st.integers(0, 9 if odd else 8))
    sub = expressions(leaves, depth - 1, odd)
    if kind <= 3:
        op = draw(st.sampled_from(["+", "-", "*", "/", "<", "<=", ">", ">=", "==", "!="]))
        left, right = draw(sub), draw(sub)
        if op in ("<", "<=", ">", ">=", "==", "!="):
            return f"({left} {op} {right})"
        return f"({left} {op} {right})" if draw(st.booleans()) else f"{left} {op} {right}"
    if kind <= 6:
        name = draw(st.sampled_from(sorted(FUNCTIONS)))
        arity = FUNCTIONS[name] if not odd or draw(st.integers(0, 9)) else draw(st.integers(0, 4))
        return f"{name}({', '.join(draw(sub) for _ in range(arity))})"
    if kind == 7:
        return f"-{draw(sub)}"
    if kind == 8:
        dtype = draw(st.sampled_from(["f16", "bf16", "f32"] + (ODD_DTYPES if odd else [])))
        return f"cast<{dtype}>({draw(sub)})"
    return f"{draw(st.sampled_from(ODD_FUNCTIONS))}({draw(sub)})"


@st.composite
def kernels(draw) -> str:
    """One kernel (sometimes two) in the .kg language. A hostility level drawn per kernel
    (mostly 0) sets how often each name, dtype, number or setting is a hostile one, so that
    most kernels are valid and reach the emitter while others probe the checks."""
    pick = Chooser(draw, draw(st.sampled_from([0, 0, 0, 0, 2, 5, 10, 30])))
    n = {d: pick.name(d) for d in ("M", "N", "K")}
    for d in list(n):
        if pick.hostile():
            n[d] = draw(a_size())  # a fixed dimension, maybe absurd
        elif draw(st.integers(0, 6)) == 0:
            n[d] = draw(st.sampled_from(["128", "256", "1024"]))
    names = {p: pick.name(p) for p in ("A", "B", "C", "D", "bias", "rscale", "alpha")}
    kernel_name = pick.name(draw(st.sampled_from(["gemm_k", "k", "fused_gemm", "my_kernel"])))
    gemm_name = pick.name("mma0")
    dt = draw(st.sampled_from(["f16", "bf16"]))
    target = pick(draw(st.sampled_from(["sm_80", "sm_80", "sm_86", "sm_89", "sm_90a"])),
                  st.sampled_from(["sm_70", "sm_100", "sm80", "SM_80", "sm_90"]))

    lines = [f"kernel {kernel_name} {{", f"  target {target}"]
    if draw(st.integers(0, 4)) == 0:
        lines.append(f"  compute {pick.dtype('f32')}")
    a_layout = draw(st.sampled_from(["row", "row", "col"]))
    b_layout = draw(st.sampled_from(["col", "col", "row"]))
    d_layout = draw(st.sampled_from(["row", "row", "row", "col"]))
    lines.append(f"  tensor {names['A']} : {pick.dtype(dt)}[{n['M']}, {n['K']}] {a_layout}")
    lines.append(f"  tensor {names['B']} : {pick.dtype(dt)}[{n['K']}, {n['N']}] {b_layout}")
    out_dt = draw(st.sampled_from([dt, "f32", "f16", "bf16"]))
    lines.append(f"  tensor {names['D']} : {pick.dtype(out_dt)}[{n['M']}, {n['N']}] "
                 f"{d_layout} out")
    leaves = ["acc", "acc", "acc", pick.number(), pick.number()]
    if draw(st.booleans()):
        c_layout = draw(st.sampled_from(["", " row", " col"]))
        lines.append(f"  tensor {names['C']} : {pick.dtype(dt)}[{n['M']}, {n['N']}]{c_layout}")
        leaves.append(names["C"])
    if draw(st.booleans()):
        lines.append(f"  vector {names['bias']} : {pick.dtype('f32')}[{n['N']}]")
        leaves.append(f"{names['bias']}[col]")
    if draw(st.booleans()):
        lines.append(f"  vector {names['rscale']} : {pick.dtype('f16')}[{n['M']}]")
        leaves.append(f"{names['rscale']}[row]")
    if draw(st.booleans()):
        default = f" = {pick.number()}" if draw(st.booleans()) else ""
        lines.append(f"  scalar {names['alpha']} : {pick.dtype('f32')}{default}")
        leaves.append(names["alpha"])

    tile, warps, stages = draw(st.sampled_from(GOOD_CONFIGS))
    if pick.hostile():
        tile = "x".join(draw(a_size()) for _ in range(draw(st.sampled_from([3, 3, 3, 2, 4]))))
    if pick.hostile():
        warps = "x".join(draw(a_size()) for _ in range(draw(st.sampled_from([2, 2, 2, 1, 3]))))
    if pick.hostile():
        stages = draw(a_size())
    accumulate = f" accumulate {pick.dtype('f32')}" if draw(st.booleans()) else ""
    lines.append(f"  gemm {gemm_name} = {names['A']} @ {names['B']}{accumulate} {{")
    settings_line = [f"tile {tile}", f"warps {warps}", f"stages {stages}"]
    if pick.hostile():
        settings_line = draw(st.permutations(settings_line))[: draw(st.integers(1, 3))]
    lines.append("    " + "  ".join(settings_line))
    lines.append("    epilogue {")
    depth = draw(st.sampled_from([1, 2, 3, 4, 6]))
    odd = pick.hostile()
    locals_: list[str] = []
    for i in range(draw(st.integers(0, 3))):
        local = pick.name(f"t{i}")
        lines.append(f"      {local} = {draw(expressions(leaves + locals_, depth, odd))}")
        locals_.append(local)
    lines.append(f"      {names['D']} = {draw(expressions(leaves + locals_, depth, odd))}")
    lines += ["    }", "  }", "}"]
    text = "\n".join(lines) + "\n"
    if pick.hostile():  # a second kernel
        text += text.replace(f"kernel {kernel_name} ", f"kernel {kernel_name}2 ", 1)
    return text


@st.composite
def chained_kernels(draw) -> str:
    """Two gemms back to back: the first one's epilogue result is the second one's A operand,
    kept in registers or shared memory."""
    pick = Chooser(draw, draw(st.sampled_from([0, 0, 0, 2, 5, 10, 30])))
    m = pick.name("M")
    k0 = draw(st.sampled_from(["K", "576", "64"]))
    n0 = pick(draw(st.sampled_from(["64", "64", "128", "32"])), a_size())
    n1 = pick(draw(st.sampled_from(["N", "128", "256"])), a_size())
    names = {p: pick.name(p) for p in ("A", "B0", "B1", "C1", "D1", "bias0", "g0", "g1")}
    dt = draw(st.sampled_from(["f16", "bf16"]))
    tile_m = pick(draw(st.sampled_from(["64", "128"])), a_size())
    warps0 = draw(st.sampled_from(["4x1", "4x1", "2x2"]))
    warps1 = pick(warps0, st.sampled_from(["2x2", "4x1", "2x4", "2x1"]))
    keep = draw(st.sampled_from(["", f"keep {names['g0']} in smem", "keep registers",
                                 "keep smem", f"keep {names['g0']} in registers"]))
    leaves0 = ["acc", "acc", pick.number(), f"{names['bias0']}[col]"]
    leaves1 = ["acc", "acc", pick.number(), names["C1"]]
    depth = draw(st.sampled_from([1, 2, 3]))
    odd = pick.hostile()
    text = f"""kernel {pick.name("chain")} {{
  target {pick(draw(st.sampled_from(["sm_80", "sm_90a"])), st.sampled_from(["sm_70", "sm80"]))}
  tensor {names['A']} : {pick.dtype(dt)}[{m}, {k0}] row
  tensor {names['B0']} : {pick.dtype(dt)}[{k0}, {n0}] col
  tensor {names['B1']} : {pick.dtype(dt)}[{n0}, {n1}] {draw(st.sampled_from(["col", "row"]))}
  tensor {names['C1']} : {pick.dtype(dt)}[{m}, {n1}] row
  tensor {names['D1']} : {pick.dtype(dt)}[{m}, {n1}] row out
  vector {names['bias0']} : f32[{n0}]
  gemm {names['g0']} = {names['A']} @ {names['B0']} {{
    tile {tile_m}x{n0}x32  warps {warps0}  stages 3
    epilogue {{ {names['g0']} = {draw(expressions(leaves0, depth, odd))} }}
  }}
  gemm {names['g1']} = {names['g0']} @ {names['B1']} {{
    tile {tile_m}x{draw(st.sampled_from(["128", "256", "64"]))}x32  warps {warps1}  stages 3
    {keep}
    epilogue {{ {names['D1']} = {draw(expressions(leaves1, depth, odd))} }}
  }}
}}
"""
    return text


@pytest.mark.slow
@settings(FUZZ_SETTINGS, max_examples=GENERATED)
@given(text=st.one_of(kernels(), kernels(), kernels(), chained_kernels()))
def test_generated_kernels(fuzzing, text):
    fuzzing.check(text.encode("utf-8", errors="surrogatepass"))


def test_generation_reaches_both_outcomes(fuzzing):
    """The generator is mostly valid: it must reach the emitter, not only the parser."""
    if fuzzing.accepted + fuzzing.rejected < GENERATED:
        pytest.skip("runs after test_generated_kernels")
    assert fuzzing.accepted >= GENERATED // 10, (fuzzing.accepted, fuzzing.rejected)
    assert fuzzing.rejected >= GENERATED // 10, (fuzzing.accepted, fuzzing.rejected)
    assert len(fuzzing.compiled) >= min(NVRTC_CAP, 3), "NVRTC compiled too few accepted outputs"


# ---------------------------------------------------------------------------------------------
# Tile programs: loop kernels and row kernels, through parse, verify and the NumPy reference

TILE_GENERATED = SCALE or 120  # generated tile programs
TILE_OUTCOMES = {"accepted": 0, "rejected": 0}
LOOP_SCHEDULES = ["", "tile 128x64", "tile 64x32  warps 4  stages 2", "tile 128x128  warps 8",
                  "warps 4x1", "stages 3"]
ODD_LOOP_SCHEDULES = ["tile 96x64", "warps 2x2", "stages 9", "tile 128x64x32", "warps 4",
                      "tile 64x256"]


@st.composite
def tile_programs(draw) -> str:
    """A loop kernel (attention-like with K^T and row carries, or an MLP-like chain) or a row
    kernel, mostly valid: the row values (carries, row, v[row], scalars, row reductions) and
    the tile values (acc, col, v[col], tensors) are drawn where each is needed, and a hostility
    level mixes them up, with hostile names, dtypes and schedule lines."""
    pick = Chooser(draw, draw(st.sampled_from([0, 0, 0, 2, 5, 10, 30])))
    odd = pick.hostile()
    depth = draw(st.sampled_from([1, 2, 3]))
    dt = draw(st.sampled_from(["f16", "bf16"]))
    heads = draw(st.sampled_from(["", "B, H, ", "B, "]))
    kv_heads = {"B, H, ": draw(st.sampled_from(["B, H, ", "B, HKV, "])), "": "", "B, ": "B, "}
    kv_heads = kv_heads[heads]
    target = pick(draw(st.sampled_from(["sm_80", "sm_90a"])), st.sampled_from(["sm_70", "sm80"]))
    names = {p: pick.name(p) for p in ("Q", "K", "V", "O", "lse", "scale", "m", "l", "s", "o",
                                       "slope", "bias")}
    row_leaves = [names["m"], names["l"], "row", f"{names['slope']}[row]", names["scale"],
                  "-inf", "0", "1.5", f"rowmax({names['s']})"]
    tile_leaves = ["acc", "col", f"{names['bias']}[col]", "acc"]

    def row_expr() -> str:
        leaves = row_leaves if not odd else row_leaves + tile_leaves
        expr = draw(expressions(leaves[:-1], depth, odd))
        if draw(st.booleans()):
            tile = draw(expressions(tile_leaves + row_leaves[:-1], depth, odd))
            reduce = draw(st.sampled_from(["rowsum", "rowmax", "rowmin", "rowabsmax"]
                                          + (["colsum", "reduce_max"] if odd else [])))
            expr = f"{expr} + {reduce}({tile})"
        return expr

    if draw(st.integers(0, 3)) == 0:  # a row kernel
        x, y, z, d = (pick.name(n) for n in ("X", "Y", "Z", "D"))
        cols = draw(st.sampled_from(["N", "64", "128"]))
        leaves = [x, y, "row", "col", "1.5", "-inf", f"{names['slope']}[row]"]
        lines = [
            f"kernel {pick.name('rows')} {{", f"  target {target}",
            f"  tensor {x} : {pick.dtype(dt)}[{heads}S, {cols}] row",
            f"  tensor {y} : {pick.dtype(dt)}[{heads}S, {cols}] row",
            f"  tensor {z} : {pick.dtype('f32')}[{heads}S, {cols}] row out",
            f"  vector {d} : f32[{heads}S] out",
            f"  vector {names['slope']} : f32[{heads}S]",
            "  epilogue {",
            f"    t = rowmax({draw(expressions(leaves, depth, odd))})",
            f"    {z} = {draw(expressions(leaves + ['t'], depth, odd))}",
            f"    {d} = rowsum({draw(expressions(leaves + ['t'], depth, odd))}) + t",
            "  }", "}",
        ]
        return "\n".join(lines) + "\n"

    attention = draw(st.booleans())
    k0 = pick(draw(st.sampled_from(["64", "128", "32"])), st.sampled_from(["K", "100", "512"]))
    n1 = pick(draw(st.sampled_from(["64", "128", "16"])), st.sampled_from(["N1", "24", "272"]))
    schedule = pick(draw(st.sampled_from(LOOP_SCHEDULES)), st.sampled_from(ODD_LOOP_SCHEDULES))
    b_operand = f"{names['K']}^T" if attention else names["K"]
    k_shape = f"T, {k0}" if attention else f"{k0}, T"
    lines = [
        f"kernel {pick.name('loop_k')} {{", f"  target {target}",
        f"  tensor {names['Q']} : {pick.dtype(dt)}[{heads}S, {k0}] row",
        f"  tensor {names['K']} : {pick.dtype(dt)}[{kv_heads}{k_shape}] row",
        f"  tensor {names['V']} : {pick.dtype(dt)}[{kv_heads}T, {n1}] row",
        f"  tensor {names['O']} : {pick.dtype('f32')}[{heads}S, {n1}] row out",
        f"  vector {names['lse']} : f32[{heads}S] out",
        f"  vector {names['slope']} : f32[{heads}S]",
        f"  vector {names['bias']} : f32[T]",
        f"  scalar {names['scale']} : f32 = {pick.number()}",
        f"  loop {pick.name('kv')} over T {{",
        f"    {schedule}",
        f"    carry {names['m']} : f32[row] = {draw(st.sampled_from(['-inf', '0', 'inf', '1.5']))}",
        f"    carry {names['l']} : f32[row] = {draw(st.sampled_from(['0', '1', '-inf']))}",
        f"    gemm {names['s']} = {names['Q']} @ {b_operand} accumulate f32 {{",
        "      epilogue {",
        f"        x = {draw(expressions(tile_leaves + row_leaves[:-1], depth, odd))}",
        f"        {names['s']} = {draw(expressions(['x'] + tile_leaves, depth, odd))}",
    ]
    tile_leaves.append("x")
    for _ in range(draw(st.integers(0, 3))):
        target_name = draw(st.sampled_from([names["m"], names["l"], names["o"]]))
        if target_name == names["o"]:
            lines.append(f"        {names['o']} {draw(st.sampled_from(['*=', '= o *']))} "
                         f"{row_expr()}".replace("= o *", f"= {names['o']} *"))
        else:
            lines.append(f"        {target_name} = {row_expr()}")
    after_tile = [names["o"], names["l"], "row", "col", "1"]
    after_row = [names["m"], names["l"], "row", "-inf"]
    lines += [
        "      }", "    }",
        f"    gemm {names['o']} += {names['s']} @ {names['V']} accumulate f32",
        "  }",
        "  epilogue {",
        f"    {names['O']} = {draw(expressions(after_tile, depth, odd))}",
        f"    {names['lse']} = {draw(expressions(after_row, depth, odd))}",
        "  }", "}",
    ]
    return "\n".join(lines) + "\n"


def tile_inputs(kernel, rng, sizes: dict[str, int]) -> dict:
    """Random inputs for every input parameter, named dimensions taken from `sizes` (a heads
    dimension other than the rows' divides it)."""
    import ml_dtypes
    import numpy as np

    from kgen import ir

    arrays = {}
    for p in kernel.params:
        if p.role is not ir.Role.IN or p.kind is ir.ParamKind.SCALAR:
            continue
        shape = tuple(d if isinstance(d, int) else sizes.setdefault(d, 3) for d in p.full_shape)
        dtype = {ir.DType.F16: np.float16, ir.DType.BF16: ml_dtypes.bfloat16,
                 ir.DType.F32: np.float32}[p.dtype]
        arrays[p.name] = rng.standard_normal(shape).astype(dtype)
    return arrays


@settings(FUZZ_SETTINGS, max_examples=TILE_GENERATED)
@given(text=tile_programs(), length=st.sampled_from([0, 1, 17, 40]),
       keys=st.sampled_from([0, 1, 17, 70]), block=st.sampled_from([16, 32, 64]))
def test_generated_tile_programs(text, length, keys, block):
    """parse -> verify -> the NumPy reference: a KgenError (located) or outputs of the declared
    shapes, never another exception."""
    import numpy as np

    from kgen.reference import evaluate
    from kgen.verify import verify

    try:
        module = parse(text, FILE_NAME)
        verify(module)
    except KgenError as error:
        assert error.loc.line >= 1 and error.loc.file == FILE_NAME, error
        TILE_OUTCOMES["rejected"] += 1
        return
    TILE_OUTCOMES["accepted"] += 1
    kernel = module.kernels[0]
    sizes = {"B": 2, "H": 2, "HKV": 1, "S": length, "T": keys, "N": 16}
    with time_limit(COMMAND_SECONDS):
        outputs = evaluate(kernel, tile_inputs(kernel, np.random.default_rng(0), sizes),
                           block=block)
    for p in kernel.params:
        if p.role.value == "out":
            want = tuple(d if isinstance(d, int) else sizes[d] for d in p.full_shape)
            assert outputs[p.name].shape == want, (p.name, outputs[p.name].shape, want)


def test_tile_generation_reaches_both_outcomes():
    """The tile-program generator must reach the reference, not only the checks."""
    if sum(TILE_OUTCOMES.values()) < TILE_GENERATED:
        pytest.skip("runs after test_generated_tile_programs")
    assert TILE_OUTCOMES["accepted"] >= TILE_GENERATED // 5, TILE_OUTCOMES  # ~1/3 today
    assert TILE_OUTCOMES["rejected"] >= TILE_GENERATED // 10, TILE_OUTCOMES


# ---------------------------------------------------------------------------------------------
# Mutation of the examples

TOKEN = re.compile(r"\s+|#[^\n]*|[^\W\d]\w*|\d[\w.]*|.", re.S)
INSERTS = [
    "{", "}", "[", "]", "(", ")", "<", ">", "=", ";", ":", ",", "@", "+", "-", "*", "/", "#",
    ".", "x", "\n", " ", "acc", "row", "col", "keep", "out", "in", "epilogue", "tile", "warps",
    "stages", "gemm", "kernel", "tensor", "vector", "scalar", "target", "compute", "cast<f16>(",
    "max(", "rowsum(", "where(", "\x00", "\t", "\r", "\ufeff", "é", "→", "\\", "\"", "'",
    "//", "/*", "*/", "1e999", "nan", "0x0", "smem", "registers", "storage",
]
DEEP = [
    lambda x, n: "(" * n + x + ")" * n,
    lambda x, n: "-" * n + x,
    lambda x, n: "relu(" * n + x + ")" * n,
    lambda x, n: " + ".join([x] * n),
    lambda x, n: " * ".join(f"({x} - {i})" for i in range(n)),
]


def _user_names(text: str) -> list[str]:
    try:
        module = parse(text, FILE_NAME)
    except KgenError:
        return []
    return sorted(user_strings(module.kernels))


@st.composite
def mutants(draw, original: str) -> bytes:
    text = original
    for _ in range(draw(st.integers(1, 3))):
        tokens = TOKEN.findall(text) or [""]
        at = draw(st.integers(0, len(tokens) - 1))
        kind = draw(st.integers(0, 8))
        if kind == 0:  # delete a token
            del tokens[at]
        elif kind == 1:  # duplicate a token
            tokens.insert(at, tokens[at])
        elif kind == 2:  # insert a piece
            tokens.insert(at, draw(st.sampled_from(INSERTS)))
        elif kind == 3:  # replace a number with an absurd one
            numbers = [i for i, t in enumerate(tokens) if t[:1].isdigit()]
            if numbers:
                tokens[draw(st.sampled_from(numbers))] = draw(st.one_of(a_size(), a_number()))
        elif kind == 4:  # nest an expression deeply
            accs = [i for i, t in enumerate(tokens) if t == "acc"]
            if accs:
                wrap = draw(st.sampled_from(DEEP))
                depth = draw(st.sampled_from([2, 10, 50, 99, 100, 101, 300, 3000]))
                tokens[draw(st.sampled_from(accs))] = wrap("acc", depth)
        elif kind in (5, 6):  # rename a user name everywhere
            names = _user_names(text)
            if names:
                old = draw(st.sampled_from(names))
                new = draw(hostile_name())
                tokens = [new if t == old else t for t in tokens]
        elif kind == 7:  # swap a token for another of the file
            tokens[at] = draw(st.sampled_from(tokens))
        else:  # cut the file short
            tokens = tokens[: at + 1]
        text = "".join(tokens)
    data = text.encode("utf-8", errors="surrogatepass")
    if draw(st.integers(0, 5)) == 0:  # random bytes, maybe not UTF-8
        at = draw(st.integers(0, len(data)))
        data = data[:at] + draw(st.binary(min_size=1, max_size=8)) + data[at:]
    return data


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_mutated_examples(fuzzing, example):
    original = example.read_text()

    @settings(FUZZ_SETTINGS, max_examples=MUTATED)
    @given(data=mutants(original))
    def run(data):
        fuzzing.check(data)

    run()


# ---------------------------------------------------------------------------------------------
# Deterministic cases the fuzzer found or that must never regress


def kernel_text(name: str = "gemm_k", body: str = "D = acc", **swap: str) -> str:
    text = f"""kernel {name} {{
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  vector bias : f32[N]
  scalar alpha : f32 = 1.5
  gemm mma0 = A @ B {{
    tile 128x128x32 warps 2x2 stages 3
    epilogue {{
      {body}
    }}
  }}
}}
"""
    for old, new in swap.items():
        text = re.sub(rf"\b{old}\b", lambda match: new, text)
    return text


@pytest.mark.parametrize("name", KGEN_OWN_NAMES + CPP_NAMES, ids=lambda s: s)
def test_names_of_the_generated_code_and_of_cuda(fuzzing, name):
    """Each name, as kernel, gemm, tensor, dimension and scalar name: refused with a located
    message, or accepted with output that passes the property (NVRTC-compiled within the cap,
    risky names first)."""
    for text in (
        kernel_text(name),
        kernel_text(mma0=name),
        kernel_text(body=f"{name} = acc", D=name),
        kernel_text(K=name),
        kernel_text(body="D = alpha * acc", alpha=name),
    ):
        fuzzing.check(text.encode(), nvrtc=True if SCALE else None)


@pytest.fixture(scope="module")
def emitted_words() -> list[str]:
    from kgen.api import build_file

    words: set[str] = set()
    for example in EXAMPLES:
        words |= _words(build_file(example).source)
    return sorted(words)


@pytest.mark.slow
@pytest.mark.parametrize("role", ["kernel", "gemm"])
def test_words_of_the_emitted_code_as_names(fuzzing, emitted_words, role):
    """Every identifier of the examples' emitted code (a sample of them in CI) as the kernel's
    or the gemm's name, which live in the generated code's own scopes: refused, or accepted and
    compiled by NVRTC."""
    words = emitted_words if SCALE else emitted_words[:: max(len(emitted_words) // 8, 1)]
    for word in words:
        text = kernel_text(word) if role == "kernel" else kernel_text(mma0=word)
        fuzzing.check(text.encode(), nvrtc=True)


def test_exponential_sharing_is_refused_quickly(fuzzing):
    """Each local used twice by the next doubles the tree once locals are substituted: refused
    with a located message, not a hang."""
    chain = ["t0 = acc"] + [f"t{i} = t{i - 1} * t{i - 1}" for i in range(1, 60)] + ["D = t59"]
    fuzzing.check(kernel_text(body="\n      ".join(chain)).encode())


@pytest.mark.parametrize("depth", [99, 100, 101, 5000])
@pytest.mark.parametrize("wrap", range(len(DEEP)))
def test_deep_nesting(fuzzing, depth, wrap):
    fuzzing.check(kernel_text(body=f"D = {DEEP[wrap]('acc', depth)}").encode())


@pytest.mark.parametrize("number", ["3.4025001647762064e+38", "3.4028235e38", "3.4028236e38",
                                    "1e-45", "1e-46", "1.17549435e-38", "0.1", "16777217"])
def test_extreme_constants(fuzzing, number):
    """Constants near the ends of the float32 range: a located refusal, or a literal NVRTC
    takes (the shortest decimal that reads back as the same float32 must not overflow)."""
    fuzzing.check(kernel_text(body=f"D = {number} * acc + alpha").encode(), nvrtc=True)


def test_deep_locals(fuzzing):
    chain = ["t0 = acc"] + [f"t{i} = t{i - 1} + 1" for i in range(1, 3000)] + ["D = t2999"]
    fuzzing.check(kernel_text(body="\n      ".join(chain)).encode())


@pytest.mark.parametrize("data", [
    b"\xff\xfe\x00k", b"kernel k {\n  target sm_80\xff\n}\n", b"\x00" * 10, b"\xef\xbb\xbf",
    b"kernel \xc3\xa9 { target sm_80 }", b"kernel k { target sm_80 }\r\n", b"\r\r\r",
])
def test_bytes(fuzzing, data):
    fuzzing.check(data)


def test_file_names_do_not_reach_the_cpp(tmp_path):
    """The emitted header comment names the source file: a name with a new line, a backslash or
    a comment end must not turn into code."""
    for name in ["a\nint x;.kg", "b\\", "c*/d.kg", "é.kg", "d\\\n.kg", "e\r#define N 3.kg"]:
        try:
            path = tmp_path / name
            path.write_text(kernel_text())
        except (OSError, ValueError):
            continue
        result = invoke("compile", str(path))
        assert result.exit_code == 0, result.output
        source = result.stdout
        head = source[: source.index("#include")]
        for line in head.splitlines():
            assert line.startswith("// ") and not line.endswith("\\"), repr(line)
        assert source.isascii()
