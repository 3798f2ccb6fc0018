"""The kgen command: exit codes, one-line messages, deterministic compile, --check, inspect."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from kgen import cli as cli_module
from kgen import cli_outputs
from kgen.cli import cli
from kgen.errors import KgenError, SourceLoc

from tests.kernels import GEMM_TEXT

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.kg"))


def invoke(*args):
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def one_line(result):
    return [line for line in result.output.splitlines() if line.strip()]


def needs_pipeline():
    for module in ("kgen.parse", "kgen.verify", "kgen.lower", "kgen.emit"):
        pytest.importorskip(module)
    if not EXAMPLES:
        pytest.skip("no examples/*.kg yet")


@pytest.mark.parametrize("command", ["compile", "inspect", "run"])
def test_missing_file_is_one_line_exit_2(command, tmp_path):
    result = invoke(command, str(tmp_path / "nope.kg"))
    assert result.exit_code == 2
    assert one_line(result) == [f"error: {tmp_path / 'nope.kg'}: no such file"]
    assert "Traceback" not in result.output


def test_directory_is_bad_input(tmp_path):
    result = invoke("compile", str(tmp_path))
    assert result.exit_code == 2 and len(one_line(result)) == 1


@pytest.mark.parametrize("size", ["M=abc", "M", "M=1.5", "=4", "M=4,,N=2", "4x4"])
def test_malformed_size_is_one_line_exit_2(size, tmp_path):
    path = tmp_path / "k.kg"
    path.write_text("kernel k {}\n")
    result = invoke("run", str(path), "--size", size)
    assert result.exit_code == 2
    assert one_line(result) == [f"error: --size expects NAME=VALUE[,NAME=VALUE...], got {size!r}"]


def test_negative_size_is_refused_with_its_name():
    result = invoke("run", str(Path(__file__).resolve().parent.parent / "examples" / "gemm.kg"), "--size", "M=64,N=-4,K=8")
    assert result.exit_code == 2
    assert one_line(result) == ["error: size N must be a non-negative integer, got -4"]


@pytest.mark.parametrize("size", ["M=0", "N=0", "K=0", "M=0,N=0,K=0"])
def test_zero_size_is_taken(size, monkeypatch):
    """A zero size is no bad input: kgen run goes on to look for the GPU (a stand-in says
    there is none, so it ends there with exit 1, past the size checks)."""
    import kgen.runtime.device

    monkeypatch.setattr(kgen.runtime.device, "gpu_available", lambda: False)
    result = invoke("run", str(Path(__file__).resolve().parent.parent / "examples" / "gemm.kg"), "--size", size)
    assert result.exit_code == 1
    assert "no CUDA GPU is available" in result.output


def test_check_needs_output(tmp_path, monkeypatch):
    fake_build(monkeypatch)
    path = tmp_path / "k.kg"
    path.write_text("x")
    result = invoke("compile", str(path), "--check")
    assert result.exit_code == 2 and "--check needs -o" in result.output


# -- with a stand-in for the front end, so these run whatever the state of the pipeline ------


class FakeBuilt:
    def __init__(self, source):
        self.source = source
        self.header = "// header\nstruct k_params;\n"
        self.plan = None
        self.kernel = None


def fake_build(monkeypatch, source="// generated\nint x;\n", error=None):
    import kgen.api

    def build_file(path, arch=None, *, kernel=None, **paths):
        if error is not None:
            raise error
        return FakeBuilt(source + f"// arch {arch}\n")

    monkeypatch.setattr(kgen.api, "build_file", build_file)


def test_user_error_renders_the_source_line(tmp_path, monkeypatch):
    path = tmp_path / "bad.kg"
    path.write_text("kernel k {\n  tensor A : f17[M, K] row\n}\n")
    error = KgenError(SourceLoc(str(path), 2, 14, 2, 17), "unknown dtype 'f17'")
    fake_build(monkeypatch, error=error)
    result = invoke("compile", str(path))
    assert result.exit_code == 2
    assert result.output.splitlines() == [
        f"{path}:2:14: error: unknown dtype 'f17'",
        "    tensor A : f17[M, K] row",
        "               ^~~",
    ]


def test_runtime_error_exits_1(tmp_path, monkeypatch):
    from kgen.errors import KgenRuntimeError

    path = tmp_path / "k.kg"
    path.write_text("x")
    fake_build(monkeypatch, error=KgenRuntimeError("NVRTC said no"))
    result = invoke("compile", str(path))
    assert result.exit_code == 1 and one_line(result) == ["error: NVRTC said no"]


def test_compile_to_stdout_file_and_check(tmp_path, monkeypatch):
    fake_build(monkeypatch)
    path = tmp_path / "k.kg"
    path.write_text("x")
    out = tmp_path / "k.cu"
    result = invoke("compile", str(path))
    assert result.exit_code == 0 and result.output == "// generated\nint x;\n// arch None\n"
    assert invoke("compile", str(path), "-o", str(out)).exit_code == 0
    assert out.read_text() == result.output
    assert invoke("compile", str(path), "-o", str(out), "--check").exit_code == 0

    out.write_text(out.read_text().replace("int x;", "int y;"))
    stale = invoke("compile", str(path), "-o", str(out), "--check")
    assert stale.exit_code == 1
    lines = stale.output.splitlines()
    assert lines[0] == f"{out} is stale; regenerate it with kgen compile"
    assert "-int y;" in lines and "+int x;" in lines

    missing = invoke("compile", str(path), "-o", str(tmp_path / "none.cu"), "--check")
    assert missing.exit_code == 1 and "does not exist" in missing.output


def test_header_is_written_and_checked_with_the_cu(tmp_path, monkeypatch):
    fake_build(monkeypatch)
    path = tmp_path / "k.kg"
    path.write_text("x")
    out, header = tmp_path / "k.cu", tmp_path / "k.h"
    to_stdout = invoke("compile", str(path), "--header", str(header))
    assert to_stdout.exit_code == 0 and to_stdout.output.startswith("// generated\n")
    assert header.read_text() == "// header\nstruct k_params;\n"
    header.unlink()
    assert invoke("compile", str(path), "-o", str(out), "--header", str(header)).exit_code == 0
    assert header.read_text() == "// header\nstruct k_params;\n"
    fresh = invoke("compile", str(path), "-o", str(out), "--header", str(header), "--check")
    assert fresh.exit_code == 0 and fresh.output == ""

    header.write_text("// header\nstruct k_params { int edited; };\n")
    stale = invoke("compile", str(path), "-o", str(out), "--header", str(header), "--check")
    assert stale.exit_code == 1
    lines = stale.output.splitlines()
    assert lines[0] == f"{header} is stale; regenerate it with kgen compile"
    assert "+struct k_params;" in lines and str(out) not in stale.output
    # without --header only the .cu is compared
    assert invoke("compile", str(path), "-o", str(out), "--check").exit_code == 0

    out.write_text("int y;\n")
    header.unlink()
    both = invoke("compile", str(path), "-o", str(out), "--header", str(header), "--check")
    assert both.exit_code == 1
    assert f"{out} is stale" in both.output and f"{header} does not exist" in both.output


def test_header_and_output_must_differ(tmp_path, monkeypatch):
    fake_build(monkeypatch)
    path = tmp_path / "k.kg"
    path.write_text("x")
    out = tmp_path / "k.cu"
    result = invoke("compile", str(path), "-o", str(out), "--header", str(out))
    assert result.exit_code == 2
    assert one_line(result) == ["error: --header and -o name the same file"]
    assert not out.exists()


def test_check_diff_is_cut_at_20_lines(tmp_path, monkeypatch):
    fresh = "".join(f"line {i}\n" for i in range(100))
    fake_build(monkeypatch, source=fresh)
    path = tmp_path / "k.kg"
    path.write_text("x")
    out = tmp_path / "k.cu"
    out.write_text("".join(f"other {i}\n" for i in range(100)))
    result = invoke("compile", str(path), "-o", str(out), "--check")
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1 + cli_outputs.DIFF_LINES + 1 and lines[-1].endswith("more diff lines")


def test_parse_assignments():
    assert cli_module.parse_assignments("M=4096, N=128", "--size", int) == {"M": 4096, "N": 128}
    assert cli_module.parse_assignments("alpha=1.5", "--scalar", float) == {"alpha": 1.5}
    assert cli_module.parse_assignments(None, "--size", int) == {}


# -- the real pipeline on the examples -----------------------------------------------------


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_compile_examples_deterministic(example, tmp_path):
    needs_pipeline()
    first = invoke("compile", str(example))  # the .cu on stdout; warnings go to stderr
    assert first.exit_code == 0, first.output
    assert invoke("compile", str(example)).stdout == first.stdout
    assert f"from {example.name} " in first.stdout.splitlines()[0]
    assert str(example.parent) not in first.stdout  # no absolute paths in the artifact
    assert "kgen compile " + example.name in first.stdout
    out = tmp_path / (example.stem + ".cu")
    assert invoke("compile", str(example), "-o", str(out)).exit_code == 0
    # the same text, its "Regenerate with" line naming -o (an absolute path: by its base name)
    recorded = f"kgen compile {example.name}\n"
    assert out.read_text() == first.stdout.replace(recorded, f"{recorded[:-1]} -o {out.name}\n")
    assert invoke("compile", str(example), "-o", str(out), "--check").exit_code == 0
    header = tmp_path / (example.stem + ".h")
    assert invoke("compile", str(example), "-o", str(out), "--header", str(header)).exit_code == 0
    assert invoke("compile", str(example), "-o", str(out), "--header", str(header),
                  "--check").exit_code == 0
    include = "#include <cuda_bf16.h>"  # a line every kernel's .cu has
    text = out.read_text()
    assert text.count(include) == 1
    out.write_text(text.replace(include, include + "  // edited"))
    edited = invoke("compile", str(example), "-o", str(out), "--header", str(header), "--check")
    assert edited.exit_code == 1
    assert any(line.startswith(f"{out} is stale") for line in edited.stderr.splitlines())
    assert f"-{include}  // edited" in edited.output and f"+{include}\n" in edited.output
    from kgen.api import build_file, is_program_plan

    # a gemm example planned for Hopper is refused on sm_80 (its schedule or shared memory
    # needs sm_90a); a tile program targets sm_90a by choice and compiles for both
    fp8 = "f8e4m3" in example.read_text()  # sm_80 has no FP8 MMA (sm_89 and sm_90a have)
    hopper = fp8 or ("target sm_90a" in example.read_text()
                     and not is_program_plan(build_file(example).plan))
    for arch in ("sm_80", "sm_90a"):
        result = invoke("compile", str(example), "--arch", arch)
        if hopper and arch == "sm_80":  # planned for Hopper or FP8: refused, located
            why = ("schedule pingpong needs target sm_90a" if "schedule pingpong" in
                   example.read_text() else "FP8 operands need FP8 tensor cores, target sm_89"
                   if fp8 else "shared memory over budget")
            assert result.exit_code == 2 and why in result.output
        else:
            assert result.exit_code == 0, result.output


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_inspect_examples(example):
    needs_pipeline()
    result = invoke("inspect", str(example), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)  # warnings: on stderr, and in data["warnings"]
    (kernel,) = data["kernels"]
    assert {"name", "arch", "threads", "smem_bytes", "smem_limit", "buffers", "gemms",
            "params"} <= set(kernel)
    assert 0 <= kernel["smem_bytes"] <= kernel["smem_limit"]
    for buffer in kernel["buffers"]:
        assert {"name", "offset", "bytes", "align", "live", "swizzle"} <= set(buffer)
        assert buffer["offset"] % buffer["align"] == 0 and len(buffer["live"]) == 2
        assert buffer["offset"] + buffer["bytes"] <= kernel["smem_bytes"]
    if kernel.get("kind") == "rows":  # a row kernel: registers only, no gemm
        assert kernel["smem_bytes"] == 0 and kernel["gemms"] == kernel["buffers"] == []
    else:
        assert kernel["smem_bytes"] > 0 and kernel["buffers"]
        assert kernel["gemms"][0]["tile"] and kernel["gemms"][0]["stages"] >= 1
    table = invoke("inspect", str(example))
    assert table.exit_code == 0 and "storage" in table.output and "total" in table.output


def test_inspect_names_each_gemms_instruction():
    """The Hopper chain's gemms both run on wgmma (g0's A from shared memory, g1's from
    registers); an sm_80 gemm names mma.sync. The table shows the same words."""
    needs_pipeline()
    ex = Path(__file__).parent.parent / "examples"
    data = json.loads(invoke("inspect", str(ex / "b2b_gemm_rf_pingpong_sm90a.kg"),
                             "--json").output)
    assert [g["instruction"] for g in data["kernels"][0]["gemms"]] == [
        "wgmma m64n64k16, A from shared memory", "wgmma m64n128k16, A from registers"]
    data = json.loads(invoke("inspect", str(ex / "gemm.kg"), "--json").output)
    assert [g["instruction"] for g in data["kernels"][0]["gemms"]] == ["mma.sync m16n8k16"]
    assert "A from registers" in invoke("inspect", str(ex / "b2b_gemm_rf_sm90a.kg")).output


def test_inspect_names_how_each_output_leaves():
    """The ping-pong chain stores D1 through the copy engine, the plain Hopper chain with
    16-byte stores from registers; an earlier gemm of a chain feeds the next."""
    ex = Path(__file__).parent.parent / "examples"
    stores = {}
    for name in ("b2b_gemm_rf_pingpong_sm90a", "b2b_gemm_rf_sm90a", "gemm"):
        data = json.loads(invoke("inspect", str(ex / f"{name}.kg"), "--json").stdout)
        stores[name] = [g["store"] for g in data["kernels"][0]["gemms"]]
    assert stores == {
        "b2b_gemm_rf_pingpong_sm90a": ["feeds g1", "TMA, staged in smem"],
        "b2b_gemm_rf_sm90a": ["feeds g1", "16-byte stores"],
        "gemm": ["pair stores"]}
    table = invoke("inspect", str(ex / "b2b_gemm_rf_pingpong_sm90a.kg")).output
    assert "output: TMA, staged in smem" in table


def test_inspect_resources(cache_dir):
    needs_pipeline()
    result = invoke("inspect", str(EXAMPLES[0]), "--json", "--resources")
    assert result.exit_code == 0, result.output
    resources = json.loads(result.output)["kernels"][0]["resources"]
    assert resources["registers"] > 0 and resources["spill_stores"] == 0
    assert resources["arch"] == "sm_80"


@pytest.mark.slow
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_emitted_params_struct_matches_the_runtime(example, cache_dir):
    """The emitted `<kernel>_params` has the ctypes layout the runtime launches with."""
    needs_pipeline()
    from kgen.api import build_file
    from kgen.runtime.nvrtc import compile_cubin
    from tests.handmade import layout_asserts, offsetof_compiles

    if not offsetof_compiles():
        pytest.skip("this NVRTC has no __builtin_offsetof")
    built = build_file(example)
    source = built.source + "\n" + layout_asserts(built.plan)
    arch = built.plan.arch.value  # sm_80, or sm_90a for the Hopper examples (wgmma)
    assert compile_cubin(source, built.plan.name, arch).cubin[:4] == b"\x7fELF"


@pytest.mark.parametrize("example, sizes", [
    ("gemm.kg", "M=256,N=256,K=64"),
    ("attention_fwd.kg", "B=2,H=8,HKV=1,S=1000,T=1000"),
    ("mlp_loop.kg", "M=300,N0=1000"),
    ("attention_bwd_dot.kg", "B=2,H=8,S=1000"),
])
def test_run_without_gpu_exits_1(example, sizes):
    needs_pipeline()
    from kgen.runtime.device import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    result = invoke("run", str(EXAMPLES[0].parent / example), "--size", sizes, "--bench")
    assert result.exit_code == 1
    assert one_line(result) == ["error: no CUDA GPU is available: kgen run needs one "
                                "(kgen compile and kgen inspect do not)"]


@pytest.mark.parametrize("example", ["gemm.kg", "attention_fwd.kg", "attention_bwd_dot.kg"])
def test_run_unknown_size_or_scalar_is_bad_input(example):
    needs_pipeline()
    path = str(EXAMPLES[0].parent / example)
    result = invoke("run", path, "--size", "Q=4")
    assert result.exit_code == 2 and one_line(result)[0].startswith("error: unknown size 'Q'")
    result = invoke("run", path, "--scalar", "gamma=4")
    assert result.exit_code == 2 and one_line(result)[0].startswith("error: unknown scalar")
    result = invoke("run", path, "--size", ("M" if example == "gemm.kg" else "S") + "=-3")
    assert result.exit_code == 2 and "non-negative" in result.output


def test_python_m_kgen(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-m", "kgen", "compile", str(tmp_path / "x.kg")],
                            capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parent.parent,
                            env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve()
                                                                .parent.parent)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip() == f"error: {tmp_path / 'x.kg'}: no such file"


def test_regenerate_line_is_the_command_as_written(tmp_path, monkeypatch):
    """Relative paths as the user wrote them, -o and --header included; an absolute path by its
    base name only, so the output is the same on every machine."""
    gemm = next(p for p in EXAMPLES if p.name == "gemm.kg")
    (tmp_path / "src").mkdir()
    (tmp_path / "out").mkdir()
    (tmp_path / "src" / "gemm.kg").write_text(gemm.read_text())
    monkeypatch.chdir(tmp_path)
    result = invoke("compile", "src/gemm.kg", "-o", "out/gemm.cu", "--header", "out/gemm.h")
    assert result.exit_code == 0, result.output
    cu = (tmp_path / "out" / "gemm.cu").read_text().split("\n")
    h = (tmp_path / "out" / "gemm.h").read_text().split("\n")
    assert cu[1] == "// Regenerate with: kgen compile src/gemm.kg -o out/gemm.cu"
    assert h[1] == "// Regenerate with: kgen compile src/gemm.kg -o out/gemm.cu --header out/gemm.h"
    absolute = invoke("compile", str(tmp_path / "src" / "gemm.kg"), "--arch", "sm_90a",
                      "-o", str(tmp_path / "out" / "g.cu"))
    assert absolute.exit_code == 0, absolute.output
    text = (tmp_path / "out" / "g.cu").read_text()
    assert text.split("\n")[1] == "// Regenerate with: kgen compile gemm.kg --arch sm_90a -o g.cu"
    assert str(tmp_path) not in text


def test_inspect_with_sizes_shows_the_choice_the_sizes_call_for(tmp_path):
    """Without a GPU or a tune entry, `kgen inspect --size` plans what `kgen run` would: on
    sm_90a, 256x192 tiles where 128x256 and 128x192 ones leave the last wave part empty."""
    from tests.kernels import without_schedule_lines

    path = tmp_path / "bare.kg"
    gemm = Path(__file__).resolve().parent.parent / "examples" / "gemm.kg"
    path.write_text(without_schedule_lines(gemm.read_text()))
    result = CliRunner().invoke(cli, ["inspect", str(path), "--arch", "sm_90a", "--json",
                                      "--size", "M=6144,N=5120,K=3072", "--gpu", "NVIDIA H200"])
    assert result.exit_code == 0, result.output
    text = result.output
    assert "256x192x64" in text and "the runtime sizes: 256x192 tiles fill the waves" in text


# -- kgen compile --size: the configuration the runtime sizes call for ----------------------

BARE_ROW_B = (GEMM_TEXT.replace("kernel k", "kernel bare").replace("TARGET", "sm_90a")
              .replace("    LINES\n", "").replace("f16[K, N] col", "f16[K, N] row"))


def test_compile_size_plans_what_the_sizes_call_for(tmp_path):
    """B's rows of 10000 bytes split 128-byte lines: the sizes take 128x256 s4 on a cluster 2x1
    (kgen/targets/sm90/configs.py, line_split_rows); the recorded command regenerates it."""
    needs_pipeline()
    from kgen.api import build_file

    path = tmp_path / "bare.kg"
    path.write_text(BARE_ROW_B)
    out, plain = tmp_path / "bare.cu", tmp_path / "plain.cu"
    sized = invoke("compile", str(path), "--size", "M=3000,N=5000,K=2000", "-o", str(out))
    assert sized.exit_code == 0 and sized.output == ""
    text = out.read_text()
    assert "--size M=3000,N=5000,K=2000 -o" in text.splitlines()[1]
    assert "constexpr int kClusterM = 2;" in text and "kTileN = 256;" in text
    assert invoke("compile", str(path), "--size", "M=3000,N=5000,K=2000", "-o", str(out),
                  "--check").exit_code == 0
    assert invoke("compile", str(path), "-o", str(out), "--check").exit_code == 1
    assert invoke("compile", str(path), "-o", str(plain)).exit_code == 0
    assert "kClusterM" not in plain.read_text()  # no cluster
    # the Python API writes the same text
    built = build_file(path, output=out, sizes={"M": 3000, "N": 5000, "K": 2000})
    assert built.source == text
    summary = json.loads(invoke("compile", str(path), "--size", "M=3000,N=5000,K=2000",
                                "-o", str(out), "--json").stdout)
    assert summary["sizes"] == {"M": 3000, "N": 5000, "K": 2000}
    assert ["g cluster", "2x1"] in summary["schedule"]["lines"]


def test_compile_size_where_the_default_serves_changes_only_the_command(tmp_path):
    needs_pipeline()
    path = tmp_path / "bare.kg"
    path.write_text(BARE_ROW_B)
    sized = invoke("compile", str(path), "--size", "M=4096,N=4096,K=4096")
    plain = invoke("compile", str(path))
    assert sized.exit_code == plain.exit_code == 0
    differ = [(a, b) for a, b in zip(sized.output.splitlines(), plain.output.splitlines())
              if a != b]
    assert len(differ) == 1 and "--size M=4096,N=4096,K=4096" in differ[0][0]


@pytest.mark.parametrize("size, message", [
    ("M=3000,N=5000", "error: no size given for K: the schedule the sizes call for depends on "
                      "every runtime size of bare"),
    ("M=3000,N=5000,K=2000,Q=3", "error: unknown size 'Q'; bare's sizes are M, K, N"),
    ("M=3000,N=0,K=2000", "error: --size expects NAME=VALUE[,NAME=VALUE...], got "
                          "'M=3000,N=0,K=2000'"),
])
def test_compile_size_refusals_are_one_line_exit_2(size, message, tmp_path):
    needs_pipeline()
    path = tmp_path / "bare.kg"
    path.write_text(BARE_ROW_B)
    result = invoke("compile", str(path), "--size", size, "-o", str(tmp_path / "x.cu"))
    assert result.exit_code == 2 and one_line(result) == [message]
    assert not (tmp_path / "x.cu").exists()


def test_compile_size_on_a_kernel_that_writes_its_lines_warns(tmp_path):
    """A line the user writes wins: --size changes nothing, and says so (an error under
    --werror)."""
    needs_pipeline()
    path = tmp_path / "bare.kg"
    path.write_text(BARE_ROW_B.replace("epilogue", "tile 128x128x64 warps 2x4 stages 4\n    "
                                                   "epilogue"))
    warned = invoke("compile", str(path), "--size", "M=3000,N=5000,K=2000", "-o",
                    str(tmp_path / "x.cu"))
    assert warned.exit_code == 0
    assert one_line(warned) == ["warning: --size changes nothing here: the kernel writes its "
                                "schedule lines, and a line the user writes wins"]
    failed = invoke("compile", str(path), "--size", "M=3000,N=5000,K=2000", "--werror", "-o",
                    str(tmp_path / "y.cu"))
    assert failed.exit_code == 2 and "(--werror)" in failed.output
    assert not (tmp_path / "y.cu").exists()
    sm80 = invoke("compile", str(path), "--arch", "sm_80", "--size", "M=3000,N=5000,K=2000",
                  "-o", str(tmp_path / "z.cu"))
    assert "choose schedules on sm_90a only, not sm_80" in sm80.output
