"""Sequences (docs/language.md, section 16): the syntax to ir.Sequence, each misuse refused at
its place (parser, kgen/verify/sequence.py, the command line: one located message, exit 2), the
SequenceInfo the runtime and the emitter read, the emitted .cu and .h (NVRTC compiles of a
sequence of row kernels, of the forward loop kernel with a row kernel and of the attention
backward; byte-identical twice), `kgen inspect`, the runtime's pure parts (workspace layout,
output shapes, the launches), the NumPy reference of a sequence, and the attention backward kgen
writes (kgen/attention_grad.py): it verifies, and the reference evaluates it to float64
attention gradients. An `out accumulate` buffer is zeroed before the one kernel that adds into
it runs (by its own launch, or by the row kernel launched just before it:
tests/test_sequence_zeroing.py), never by the sequence: a second kernel adding into it is
refused."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from kgen import ir
from kgen.cli import cli
from kgen.errors import KgenError
from kgen.parse import parse
from kgen.verify import verify
from kgen.verify.sequence import resolve

ROOT = Path(__file__).resolve().parent.parent
ROWS = ROOT / "tests" / "programs" / "sequence_rows.kg"
FORWARD = ROOT / "tests" / "programs" / "sequence_forward.kg"
ADDERS = ROOT / "tests" / "programs" / "sequence_adders.kg"  # two kernels add into dQacc
TEXT = ROWS.read_text()


def module_of(text: str, file: str = "s.kg") -> ir.Module:
    module = parse(text, file)
    assert verify(module) == []
    return module


# ---------------------------------------------------------------------------------------------
# Syntax and meaning


def test_a_sequence_parses_to_its_launches_and_workspace():
    module = module_of(TEXT)
    (seq,) = module.sequences
    assert seq.name == "rows_chain"
    assert [launch.kernel for launch in seq.launches] == ["rows_dot", "rows_scale", "rows_sum"]
    assert [w.name for w in seq.workspace] == ["D"]
    assert (seq.workspace[0].loc.line, seq.workspace[0].loc.col) == (27, 13)
    assert (seq.launches[1].loc.line, seq.launches[1].loc.col) == (29, 10)
    assert [k.name for k in module.kernels] == ["rows_dot", "rows_scale", "rows_sum"]


def test_the_sequence_info_orders_parameters_outputs_and_workspace():
    module = module_of(TEXT)
    info = resolve(module, module.sequences[0])
    assert [b.name for b in info.params] == ["dO", "O", "Y", "M"]
    assert [b.name for b in info.outputs] == ["Y", "M"]  # Y is read again by rows_sum
    assert [b.name for b in info.workspace] == ["D"]
    assert info.dims == ("B", "H", "S")
    assert [k.name for k in info.kernels] == ["rows_dot", "rows_scale", "rows_sum"]
    assert not any(b.accumulate for b in info.buffers)


def _backward_module(arch: str = "sm_90a"):
    from kgen.attention_grad import BackwardSignature, backward_module

    return backward_module(BackwardSignature("bf16", 64, True, arch))


def test_an_accumulate_buffer_is_added_into_by_one_kernel():
    module = _backward_module()
    info = resolve(module, module.sequences[0])
    acc = info.buffer("dQacc")
    assert acc.workspace and acc.accumulate and acc.added_by == 1  # the main kernel
    assert [b.name for b in info.buffers if b.accumulate] == ["dQacc"]
    assert [b.name for b in info.workspace] == ["D", "dQacc"]
    assert [b.name for b in info.params if not b.written] == ["dO", "O", "Q", "K", "V", "lse",
                                                             "scale"]
    assert [b.name for b in info.outputs] == ["dK", "dV", "dQ"]


MISTAKES = [
    # the parser
    ("sequence rows_chain {", "sequence __s {",
     "s.kg:26:10: error: sequence name '__s' must not start with '_' or contain '__' (such "
     "names are reserved in C++)"),
    ("  workspace D\n", "  workspace D, D\n",
     "s.kg:27:16: error: workspace buffer 'D' is named twice (first at line 27)"),
    ("  workspace D\n", "  workspace D\n  workspace D\n",
     "s.kg:28:13: error: workspace buffer 'D' is named twice (first at line 27)"),
    ("  workspace D\n  launch rows_dot\n  launch rows_scale\n  launch rows_sum\n",
     "  workspace D\n",
     "s.kg:26:10: error: sequence 'rows_chain' launches no kernel; add e.g. 'launch my_kernel'"),
    # verify
    ("launch rows_scale", "launch rows_scal",
     "s.kg:29:10: error: no kernel named 'rows_scal' in this file; did you mean 'rows_scale'?"),
    ("launch rows_sum", "launch rows_scale",
     "s.kg:30:10: error: kernel 'rows_scale' is launched twice (first at line 29); a sequence "
     "launches each kernel once"),
    ("sequence rows_chain {", "sequence rows_sum {",
     "s.kg:26:1: error: sequence 'rows_sum' has the name of a kernel (defined at line 19); the "
     ".cu names both the same way: rename one"),
    ("workspace D", "workspace D, Q",
     "s.kg:27:16: error: workspace buffer 'Q' is no parameter of the launched kernels"),
    ("workspace D", "workspace D, M",
     "s.kg:27:16: error: workspace buffer 'M' is written and never read by a later kernel; it "
     "would be lost (make it a parameter of the sequence)"),
    ("workspace D", "workspace dO",
     "s.kg:27:13: error: workspace buffer 'dO' is read by kernel 'rows_dot' at line 5 before "
     "any kernel writes it; a workspace starts undefined (make it a parameter of the "
     "sequence)"),
    ("  vector D : f32[B, H, S]\n", "  vector D : f16[B, H, S]\n",
     "s.kg:14:3: error: 'D' of kernel 'rows_scale' is vector f16[B, H, S], but kernel "
     "'rows_dot' declares it vector f32[B, H, S] at line 7: one name is one buffer in sequence "
     "'rows_chain'"),
    ("  tensor Y : f32[B, H, S, 128] row\n", "  tensor Y : f32[B, H, S, 64] row\n",
     "s.kg:21:3: error: 'Y' of kernel 'rows_sum' is tensor f32[B, H, S, 64] row, but kernel "
     "'rows_scale' declares it tensor f32[B, H, S, 128] row at line 15: one name is one buffer "
     "in sequence 'rows_chain'"),
    ("  tensor Y : f32[B, H, S, 128] row\n", "  tensor Y : f32[B, H, S, 128] col\n",
     "s.kg:21:3: error: 'Y' of kernel 'rows_sum' is tensor f32[B, H, S, 128] col, but kernel "
     "'rows_scale' declares it tensor f32[B, H, S, 128] row at line 15: one name is one buffer "
     "in sequence 'rows_chain'"),
    ("  launch rows_dot\n  launch rows_scale\n", "  launch rows_scale\n  launch rows_dot\n",
     "s.kg:7:3: error: kernel 'rows_dot' writes 'D', which kernel 'rows_scale' reads before at "
     "line 14: a sequence's inputs are only read (write it under another name)"),
    ("kernel rows_sum {\n  target sm_80", "kernel rows_sum {\n  target sm_90a",
     "s.kg:30:10: error: kernel 'rows_sum' targets sm_90a, kernel 'rows_dot' sm_80: the kernels "
     "of a sequence share one target (its .cu is compiled for it)"),
]


@pytest.mark.parametrize("old, new, message", MISTAKES,
                         ids=[f"m{i}" for i in range(len(MISTAKES))])
def test_each_misuse_is_one_located_message(old, new, message):
    assert old in TEXT
    with pytest.raises(KgenError) as info:
        verify(parse(TEXT.replace(old, new, 1), "s.kg"))
    assert str(info.value) == message


TWO_ADDERS = ("a.kg:41:3: error: kernel 'bwd_b' adds into 'dQacc', which kernel 'bwd_a' already "
              "adds into at line 11: each kernel's launch zeroes its 'out accumulate' outputs, "
              "so the sums of kernel 'bwd_a' would be lost (add into another buffer and sum the "
              "two in a later kernel)")


def test_a_second_kernel_adding_into_a_buffer_is_refused_at_its_parameter():
    """Each kernel's launch zeroes its `out accumulate` outputs (the runtime's and the .cu's
    launcher alike), so a second kernel adding into a buffer would lose the first one's sums:
    refused at the second kernel's parameter. With one adder the same kernels are a sequence;
    a kernel writing the buffer without adding is refused by the older rule."""
    text = ADDERS.read_text()
    with pytest.raises(KgenError) as info:
        verify(parse(text, "a.kg"))
    assert str(info.value) == TWO_ADDERS
    one = parse(text.replace("  launch bwd_b\n", ""), "a.kg")
    assert verify(one) == []
    assert resolve(one, one.sequences[0]).buffer("dQacc").added_by == 0
    plain = text.replace("  launch bwd_b\n", "").replace(
        "  tensor dQacc : f32[B, H, S, 64] row\n  tensor dQ : bf16[B, H, S, 64] row out\n"
        "  epilogue { dQ = dQacc }",
        "  tensor dQ : bf16[B, H, S, 64] row\n  tensor dQacc : f32[B, H, S, 64] row out\n"
        "  epilogue { dQacc = dQ }")
    with pytest.raises(KgenError) as info:
        verify(parse(plain, "a.kg"))
    assert str(info.value) == (
        "a.kg:66:3: error: 'dQacc' is written by kernel 'bwd_a' at line 11 and by kernel "
        "'bwd_dq', one adding into it ('out accumulate' at line 11) and one not at line 66: the "
        "kernels that write a buffer all add into it, or none does")


def test_the_command_line_refuses_two_kernels_adding_into_one_buffer(tmp_path):
    bad = tmp_path / "a.kg"
    bad.write_text(ADDERS.read_text())
    runner = CliRunner()
    for command in (["compile", str(bad)], ["inspect", str(bad)]):
        result = runner.invoke(cli, command)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert result.output.splitlines()[0] == TWO_ADDERS.replace("a.kg", str(bad), 1)
    result = runner.invoke(cli, ["inspect", str(bad), "--json"])
    assert result.exit_code == 2, result.output
    error = json.loads(result.stdout)["error"]
    assert (error["file"], error["line"], error["col"]) == (str(bad), 41, 3)
    assert error["message"] == TWO_ADDERS.split(": error: ", 1)[1]


def test_a_workspace_needs_its_sizes_from_the_parameters():
    """IR built in Python (the row kernels' own checks left out): a workspace dimension that no
    parameter of the sequence has."""
    import dataclasses

    module = module_of(TEXT)

    def widened(kernel):
        params = tuple(dataclasses.replace(p, shape=("R",)) if p.name == "D" else p
                       for p in kernel.params)
        return dataclasses.replace(kernel, params=params)

    module = dataclasses.replace(module, kernels=tuple(widened(k) for k in module.kernels))
    with pytest.raises(KgenError) as info:
        resolve(module, module.sequences[0])
    assert str(info.value) == (
        "s.kg:27:13: error: workspace buffer 'D' has dimension 'R', which no parameter of the "
        "sequence has: the launcher sizes the workspace from the parameters")


def test_gemm_kernels_and_defaults_that_disagree_are_refused():
    gemm = (ROOT / "examples" / "gemm.kg").read_text()
    text = gemm + "sequence s {\n  launch " + parse(gemm).kernels[0].name + "\n}\n"
    with pytest.raises(KgenError, match="is a gemm kernel; a sequence launches tile programs"):
        verify(parse(text, "g.kg"))
    two = FORWARD.read_text().replace("  epilogue { D = rowsum(cast<f32>(dO) * O) }",
                                      "  scalar scale : f32 = 0.5\n"
                                      "  epilogue { D = scale * rowsum(cast<f32>(dO) * O) }")
    with pytest.raises(KgenError, match="scalar 'scale' defaults to 0.5 in kernel 'seq_dot' but "
                                        "to 0.125 in an earlier kernel"):
        verify(parse(two, "f.kg"))


def test_a_file_starts_with_a_kernel():
    with pytest.raises(KgenError, match="expected 'kernel'"):
        parse("sequence s { launch k }\n", "s.kg")


def test_the_command_line_gives_one_located_message_and_exit_2(tmp_path):
    bad = tmp_path / "bad.kg"
    bad.write_text(TEXT.replace("workspace D", "workspace D, Q"))
    for command in (["compile", str(bad)], ["inspect", str(bad)]):
        result = CliRunner().invoke(cli, command)
        assert result.exit_code == 2, result.output
        assert "Traceback" not in result.output
        assert result.output.splitlines()[0] == (
            f"{bad}:27:16: error: workspace buffer 'Q' is no parameter of the launched kernels")


# ---------------------------------------------------------------------------------------------
# The .cu, the .h, kgen compile and kgen inspect


def test_the_cu_holds_every_kernel_and_the_launcher_and_is_deterministic():
    from kgen.sequence import build_sequence_file

    built = build_sequence_file(ROWS)
    again = build_sequence_file(ROWS)
    assert built.source == again.source and built.header == again.header
    source = built.source
    for kernel in ("rows_dot", "rows_scale", "rows_sum"):
        assert f'extern "C" __global__ void __launch_bounds__({kernel}_cfg::kThreads)' in source
        assert f"error = {kernel}_launch(args_{kernel}(p, w, workspace), stream);" in source
    assert source.index("error = rows_dot_launch") < source.index("error = rows_scale_launch") \
        < source.index("error = rows_sum_launch")
    assert "size_t rows_chain_workspace_bytes(const rows_chain_params& p)" in source
    assert ("cudaError_t rows_chain_launch(const rows_chain_params& p, void* workspace, "
            "cudaStream_t stream)") in source
    # the workspace's D, contiguous: its strides from the sizes
    assert "k.D = reinterpret_cast<float*>(reinterpret_cast<unsigned long long>(workspace) + " \
           "w.D);" in source
    assert ("k.D_bs = static_cast<long long>(static_cast<long long>(p.sizes.H) * "
            "static_cast<long long>(p.sizes.S));") in source
    assert "cudaMemsetAsync" not in source
    assert "struct rows_chain_params" in built.header
    assert "cudaError_t rows_chain_launch(" in built.header


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_launcher_leaves_the_zeroing_to_the_row_kernel_before_the_adder(arch):
    """The backward's sequence: dQacc (workspace, `out accumulate`) is zeroed by D's row kernel,
    launched just before the main kernel (kgen/sequence_zeroing.py), and the main kernel is
    launched by its `_launch_zeroed` (no `<main>_zero`); its own `_launch` still zeroes first
    (the kernel alone). The sequence's launcher memsets nothing and asks no contiguity."""
    from kgen.sequence import build_sequence

    module = _backward_module(arch)
    built = build_sequence(module, module.sequences[0], arch)
    source, (dot, main, dq) = built.source, [k.name for k in built.info.kernels]
    assert "cudaMemset" not in source and "must be contiguous: the sequence" not in source
    for text in (source, built.header):  # the comment on NAME_launch, the Zeroing line
        assert "by its own launch or by the row kernel" in text
        assert f"// Zeroing: {dot}, the row kernel launched just before {main}, zeroes" in text
    launcher = source[source.index(f"cudaError_t {built.name}_launch("):]
    calls = [line.strip() for line in launcher.splitlines() if line.strip().startswith("error =")]
    assert calls == [f"error = {dot}_launch(args_{dot}(p, w, workspace), stream);",
                     f"error = {main}_launch_zeroed(args_{main}(p, w, workspace), stream);",
                     f"error = {dq}_launch(args_{dq}(p, w, workspace), stream);"]
    own = source[source.index(f"cudaError_t {main}_launch("):]
    assert own.index(f"{main}_zero<<<zero_grid, kZeroThreads, 0, stream>>>(p);") \
        < own.index(f"return {main}_launch_zeroed(p, stream);")
    row_kernel = source[source.index(f"{dot}(const {dot}_params p) {{"):]
    row_kernel = row_kernel[:row_kernel.index("\n}\n")]
    assert ("*reinterpret_cast<float4*>(g_dQacc + warp_row * p.dQacc_ld + c * 4) = "
            "make_float4(0.0f, 0.0f, 0.0f, 0.0f);") in row_kernel
    assert f"k.dQacc = reinterpret_cast<float*>(reinterpret_cast<unsigned long long>(" \
           "workspace) + w.dQacc);" in source[source.index(f"args_{dot}(\n"):]


@pytest.mark.parametrize("program, arch", [(ROWS, "sm_80"), (ROWS, "sm_90a"),
                                           (FORWARD, "sm_80"), (FORWARD, "sm_90a"),
                                           ("backward", "sm_80"), ("backward", "sm_90a")])
def test_nvrtc_compiles_the_whole_sequence(program, arch, cache_dir):
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.sequence import build_sequence, build_sequence_file

    if program == "backward":
        module = _backward_module(arch)
        built = build_sequence(module, module.sequences[0], arch)
    else:
        built = build_sequence_file(program, arch)
    if program == FORWARD:  # the loop kernel's rows and loop length, by their sizes' names
        assert "k.rows = static_cast<int>(p.sizes.S);\n  k.loop_len = static_cast<int>(p.sizes.T);" \
            in built.source
        assert "k.loop_len = static_cast<int>(0LL);" in built.source  # the row kernel's
    result = compile_cubin(built.source, built.name, arch)
    assert len(result.cubin) > 1000
    assert built.arch.value == arch


def test_kgen_compile_writes_the_sequence_and_checks_it(tmp_path):
    out, header = tmp_path / "seq.cu", tmp_path / "seq.h"
    runner = CliRunner()
    result = runner.invoke(cli, ["compile", str(ROWS), "-o", str(out), "--header", str(header)])
    assert result.exit_code == 0, result.output
    first = out.read_bytes()
    assert b"Sequence rows_chain, target sm_80: kernels rows_dot, rows_scale, rows_sum" in first
    result = runner.invoke(cli, ["compile", str(ROWS), "-o", str(out), "--header", str(header),
                                 "--check"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(cli, ["compile", str(ROWS), "-o", str(out)])
    assert out.read_bytes() == first
    out.write_text(first.decode().replace("kAlign = 256", "kAlign = 128"))
    result = runner.invoke(cli, ["compile", str(ROWS), "-o", str(out), "--check"])
    assert result.exit_code == 1 and "is stale" in result.output
    # one kernel of the file, by name, as before
    result = runner.invoke(cli, ["compile", str(ROWS), "--kernel", "rows_sum"])
    assert result.exit_code == 0 and "rows_chain" not in result.output
    result = runner.invoke(cli, ["compile", str(ROWS), "--size", "S=4"])
    assert result.exit_code == 2 and "--size plans one kernel" in result.output


def test_the_launcher_builds_with_nvcc_and_the_header(tmp_path):
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc on PATH")
    from kgen.sequence import build_sequence_file

    built = build_sequence_file(FORWARD)
    (tmp_path / "seq.cu").write_text(built.source)
    (tmp_path / "seq.h").write_text(built.header)
    (tmp_path / "main.cu").write_text(
        '#include "seq.h"\n'
        "int main() {\n"
        "  forward_dot_params p{};\n"
        "  p.sizes.B = 1; p.sizes.H = 1; p.sizes.S = 64; p.sizes.T = 64;\n"
        "  const size_t bytes = forward_dot_workspace_bytes(p);\n"
        "  return bytes == 64 * 64 * 2 && forward_dot_can_implement(p) != nullptr ? 0 : 1;\n"
        "}\n")
    for name in ("seq.cu", "main.cu"):
        done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_80", "-Xcompiler", "-Wall,-Wextra",
                               "-c", name], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        mine = [line for line in done.stderr.splitlines() if "forward_dot" in line]
        assert mine == [], done.stderr


def test_the_backward_launcher_builds_with_nvcc(tmp_path):
    """The backward's sequence (its main kernel zeroing dQacc itself): the .cu's host code
    builds, and its workspace is D then dQacc, each rounded up to 256 bytes."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        pytest.skip("needs nvcc on PATH")
    from kgen.sequence import build_sequence

    module = _backward_module("sm_80")
    built = build_sequence(module, module.sequences[0], "sm_80")
    (tmp_path / "seq.cu").write_text(built.source)
    (tmp_path / "seq.h").write_text(built.header)
    name = built.name
    (tmp_path / "main.cu").write_text(
        '#include "seq.h"\n'
        "int main() {\n"
        f"  {name}_params p{{}};\n"
        "  p.sizes.B = 1; p.sizes.H = 2; p.sizes.S = 33; p.sizes.T = 40;\n"
        f"  const size_t bytes = {name}_workspace_bytes(p);\n"
        "  return bytes == 512 + 2 * 33 * 64 * 4 ? 0 : 1;\n"
        "}\n")
    for file in ("seq.cu", "main.cu"):
        done = subprocess.run([nvcc, "-std=c++17", "-arch=sm_80", "-Xcompiler", "-Wall,-Wextra",
                               "-c", file], cwd=tmp_path, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        kernels = [k.name for k in built.info.kernels]  # the launcher's own lines only
        mine = [line for line in done.stderr.splitlines()
                if name in line and not any(k in line for k in kernels)]
        assert mine == [], done.stderr
    done = subprocess.run([nvcc, "-arch=sm_80", "seq.o", "main.o", "-o", "probe"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert subprocess.run([str(tmp_path / "probe")], cwd=tmp_path).returncode == 0


def test_kgen_inspect_lists_the_sequence_and_its_workspace():
    runner = CliRunner()
    result = runner.invoke(cli, ["inspect", str(ROWS), "--json"])
    assert result.exit_code == 0, result.output
    document = json.loads(result.output)
    assert [k["name"] for k in document["kernels"]] == ["rows_dot", "rows_scale", "rows_sum"]
    (seq,) = document["sequences"]
    assert seq["sequence"] == "rows_chain" and seq["arch"] == "sm_80"
    assert seq["launches"] == ["rows_dot", "rows_scale", "rows_sum"]
    assert seq["workspace"] == [{"name": "D", "kind": "vector", "dtype": "f32",
                                 "shape": ["B", "H", "S"], "added_by": None}]
    assert [(p["name"], p["written"]) for p in seq["params"]] == [
        ("dO", False), ("O", False), ("Y", True), ("M", True)]
    text = runner.invoke(cli, ["inspect", str(ROWS)])
    assert text.exit_code == 0
    assert "sequence rows_chain  sm_80  launches rows_dot -> rows_scale -> rows_sum" in text.output
    assert "workspace" in text.output
    alone = json.loads(runner.invoke(cli, ["inspect", str(ROWS), "--kernel", "rows_sum",
                                           "--json"]).output)
    assert "sequences" not in alone and [k["name"] for k in alone["kernels"]] == ["rows_sum"]
    named = json.loads(runner.invoke(cli, ["inspect", str(ROWS), "--kernel", "rows_chain",
                                           "--json"]).output)
    assert named["sequences"][0]["sequence"] == "rows_chain"


def test_kgen_inspect_names_the_kernel_that_adds_into_a_buffer(tmp_path):
    from kgen.attention_grad import BackwardSignature, backward_text

    program = tmp_path / "bwd.kg"
    program.write_text(backward_text(BackwardSignature("bf16", 64, True, "sm_80")))
    runner = CliRunner()
    result = runner.invoke(cli, ["inspect", str(program), "--json"])
    assert result.exit_code == 0, result.output
    (seq,) = json.loads(result.output)["sequences"]
    main = seq["launches"][1]
    assert [(b["name"], b["added_by"]) for b in seq["workspace"]] == [("D", None),
                                                                       ("dQacc", main)]
    assert all(b["added_by"] is None for b in seq["params"])
    text = runner.invoke(cli, ["inspect", str(program)], terminal_width=200)
    assert text.exit_code == 0
    assert "added into by" in text.output
    table = text.output[text.output.index("added into by"):]
    (row,) = [line for line in table.splitlines() if "dQacc" in line and "[" in line]
    assert "workspace" in row and main in row
    assert f"zeroing of dQacc by {seq['launches'][0]}:" in text.output


# ---------------------------------------------------------------------------------------------
# The runtime's pure parts


def test_the_workspace_layout_aligns_each_buffer():
    from kgen.runtime.sequence import output_shapes, workspace_layout
    from kgen.sequence import sequence_plan

    module = module_of(FORWARD.read_text())
    info = sequence_plan(resolve(module, module.sequences[0]))
    layout, total = workspace_layout(info, {"B": 2, "H": 3, "S": 17, "T": 5})
    ((buffer, offset, shape),) = layout
    assert (buffer.name, offset, shape) == ("O", 0, (2, 3, 17, 64))
    assert total == -(-2 * 3 * 17 * 64 * 2 // 256) * 256
    shapes = output_shapes(info, {"Q": (2, 3, 17, 64), "K": (2, 3, 5, 64), "V": (2, 3, 5, 64),
                                  "dO": (2, 3, 17, 64)})
    assert shapes == {"lse": (2, 3, 17), "D": (2, 3, 17)}


def test_the_sequence_op_schema():
    from kgen.sequence import sequence_plan
    from kgen.torch_library import sequence_schema

    module = module_of(FORWARD.read_text())
    info = sequence_plan(resolve(module, module.sequences[0]))
    assert sequence_schema(info) == ("(Tensor Q, Tensor K, Tensor V, float scale=0.125, "
                                     "Tensor dO) -> (Tensor, Tensor)")


# ---------------------------------------------------------------------------------------------
# The reference of a sequence, and the attention backward kgen writes


def test_the_reference_runs_the_kernels_in_order():
    from kgen.reference_sequence import evaluate_sequence

    module = module_of(TEXT)
    rng = np.random.default_rng(1)
    import ml_dtypes

    do = rng.standard_normal((2, 3, 5, 128)).astype(ml_dtypes.bfloat16)
    o = rng.standard_normal((2, 3, 5, 128)).astype(ml_dtypes.bfloat16)
    out = evaluate_sequence(module, module.sequences[0], {"dO": do, "O": o}, workspace=True)
    d = (do.astype(np.float64) * o.astype(np.float64)).sum(-1)
    y = d.astype(np.float32)[..., None] * do.astype(np.float64)
    np.testing.assert_allclose(out["D"], d, rtol=1e-5)
    np.testing.assert_allclose(out["Y"], y, rtol=1e-5)
    np.testing.assert_allclose(out["M"], y.sum(-1), rtol=1e-4, atol=1e-4)


def _attention_grads(q, k, v, do, scale, causal):
    """Float64 attention and its gradients, written out (S = softmax(scale Q K^T))."""
    s = np.einsum("bhsd,bhtd->bhst", q, k) * scale
    if causal:
        s = np.where(np.arange(k.shape[2])[None, :] <= np.arange(q.shape[2])[:, None], s,
                     -np.inf)
    m = s.max(-1, keepdims=True)
    p = np.exp(s - m)
    l = p.sum(-1, keepdims=True)
    p = p / l
    o = p @ v
    lse = (m + np.log(l))[..., 0]
    dv = np.einsum("bhst,bhsd->bhtd", p, do)
    dp = do @ v.transpose(0, 1, 3, 2)
    ds = p * (dp - (do * o).sum(-1, keepdims=True))
    return o, lse, ds @ k * scale, np.einsum("bhst,bhsd->bhtd", ds, q) * scale, dv


@pytest.mark.parametrize("causal", [False, True])
def test_the_backward_kgen_writes_evaluates_to_the_attention_gradients(causal):
    import ml_dtypes

    from kgen.attention_grad import BackwardSignature, backward_module, backward_text
    from kgen.reference_sequence import evaluate_sequence

    sig = BackwardSignature("bf16", 64, causal, "sm_90a")
    assert ("where(row <= col, " in backward_text(sig)) is causal
    module = backward_module(sig)
    rng = np.random.default_rng(2)
    bf16 = ml_dtypes.bfloat16
    b, h, s, t, d = 1, 2, 37, 45, 64
    q, k, v, do = (rng.standard_normal(shape).astype(bf16).astype(np.float64)
                   for shape in ((b, h, s, d), (b, h, t, d), (b, h, t, d), (b, h, s, d)))
    scale = 1 / np.sqrt(d)
    o, lse, dq, dk, dv = _attention_grads(q, k, v, do, scale, causal)
    out = evaluate_sequence(module, module.sequences[0],
                            {"Q": q.astype(bf16), "K": k.astype(bf16), "V": v.astype(bf16),
                             "dO": do.astype(bf16), "O": o.astype(bf16),
                             "lse": lse.astype(np.float32)}, {"scale": scale})
    for name, ref in (("dQ", dq), ("dK", dk), ("dV", dv)):
        got = out[name].astype(np.float64)
        assert got.shape == ref.shape
        assert np.abs(got - ref).max() <= 0.02 * max(1.0, np.abs(ref).max()), name


def test_the_backward_refuses_options_it_does_not_take():
    torch = pytest.importorskip("torch")
    from kgen.attention_grad import attention_with_grad
    from kgen.errors import ArgumentError

    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16, requires_grad=True)
    k = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    with pytest.raises(ArgumentError, match="GQA takes enable_gqa=True"):  # as the forward
        attention_with_grad(q, k[:, :1], k[:, :1])
    with pytest.raises(ArgumentError, match="block_mask must be a FlexAttention BlockMask"):
        attention_with_grad(q, k, k, block_mask=object(), deterministic=False)


def test_a_call_checks_its_arguments_and_launches_in_order():
    """CompiledSequence with stand-in programs (no GPU): the argument messages, then each
    kernel called in order with its own parameters on the one stream."""
    from kgen.enums import DType
    from kgen.errors import ArgumentError
    from kgen.runtime.sequence import CompiledSequence
    from kgen.runtime.tensors import DeviceArray, contiguous_strides
    from kgen.sequence import sequence_plan

    class Program:
        device_id = 0

        def __init__(self, name):
            self.name, self.calls = name, []

        def __call__(self, stream=None, **args):
            self.calls.append((stream, sorted(args)))

    module = module_of(TEXT)
    plan = sequence_plan(resolve(module, module.sequences[0]))
    programs = [Program(name) for name, _ in plan.launches]
    seq = CompiledSequence(plan, programs)

    def array(*shape):
        return DeviceArray(4096, shape, contiguous_strides(shape), DType.BF16, 0, kind="kgen")

    cases = [
        (dict(X=array(1)), "unknown argument 'X'; rows_chain takes dO, O, Y, M"),
        (dict(O=array(1, 2, 5, 128)), "rows_chain: missing argument 'dO'"),
        (dict(dO=array(2, 5, 128), O=array(1, 2, 5, 128)),
         "dO must have 4 dims ([B, H, S, 128]), got shape [2, 5, 128]"),
        (dict(dO=array(1, 2, 5, 64), O=array(1, 2, 5, 128)),
         "dO must be [B, H, S, 128], got shape [1, 2, 5, 64]"),
        (dict(dO=array(1, 2, 5, 128), O=array(1, 2, 6, 128)),
         "O has S = 6, but an earlier argument (or sizes) has S = 5"),
    ]
    for args, message in cases:
        with pytest.raises(ArgumentError) as info:
            seq(**args)
        assert str(info.value) == message
    values = {name: array(1, 2, 5, 128) for name in ("dO", "O", "D", "Y", "M")}
    seq._launch(7, values)
    assert [p.calls for p in programs] == [[(7, ["D", "O", "dO"])], [(7, ["D", "Y", "dO"])],
                                           [(7, ["M", "Y"])]]


def test_a_call_launches_only_the_kernels_whose_launches_zero_their_own_outputs():
    """The backward's plan with stand-in programs (no GPU): a launch is the three kernels in
    order on the stream, nothing before them (the sequence zeroes no buffer itself: D's row
    kernel takes dQacc and zeroes it, and the main kernel is called without its own zeroing)."""
    from kgen.runtime.sequence import CompiledSequence
    from kgen.runtime.tensors import DeviceArray, contiguous_strides
    from kgen.sequence import sequence_plan, sequence_zeroing

    calls = []

    class Program:
        device_id = 0

        def __init__(self, name, zeroes=True):
            self.name, self.zeroes = name, zeroes

        def zeroed_by_caller(self):
            return Program(self.name, zeroes=False)

        def __call__(self, stream=None, **args):
            calls.append((self.name, stream, sorted(args), self.zeroes))

    module = _backward_module("sm_80")
    info = resolve(module, module.sequences[0])
    plan = sequence_plan(info, sequence_zeroing(info))
    seq = CompiledSequence(plan, [Program(name) for name, _ in plan.launches])
    values = {b.name: DeviceArray(4096, (1, 2, 5, 64), contiguous_strides((1, 2, 5, 64)),
                                  b.dtype, 0, kind="kgen") for b in plan.buffers}
    values["scale"] = 0.125
    seq._launch(3, values)
    kernels = [k.name for k in module.kernels]
    assert [(name, stream) for name, stream, _, _ in calls] == [(k, 3) for k in kernels]
    assert [zeroes for *_, zeroes in calls] == [True, False, True]
    assert all("dQacc" in args for _, _, args, _ in calls)  # the row kernel zeroes it
