"""The README's kernel is the example it names, and its commands start from a venv."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

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


# docs/python.md: its code blocks run in order in one namespace, the one that starts with
# GPU_BLOCK only where there is a GPU (and PyTorch)
PYTHON_DOC = ROOT / "docs" / "python.md"
GPU_BLOCK = "# On a machine with an NVIDIA GPU"


def python_blocks(path: Path) -> list[tuple[int, str]]:
    """(line of the block's first line, code) of each ```python block."""
    text = path.read_text()
    return [(text.count("\n", 0, m.start(1)), m.group(1))
            for m in re.finditer(r"^```python\n(.*?)^```", text, re.S | re.M)]


def run_blocks(blocks: list[tuple[int, str]], folder: Path, monkeypatch,
               doc: Path = PYTHON_DOC) -> dict:
    monkeypatch.chdir(folder)  # the blocks write files
    namespace: dict = {"__name__": "python_md"}
    for line, code in blocks:  # padded so that a traceback names the doc's own line
        exec(compile("\n" * line + code, str(doc), "exec"), namespace)
    return namespace


def test_python_doc_runs_without_a_gpu(tmp_path, monkeypatch):
    from kgen.parse import parse

    from tests.kernels import without_schedule_lines

    blocks = python_blocks(PYTHON_DOC)
    cpu = [b for b in blocks if not b[1].startswith(GPU_BLOCK)]
    assert len(blocks) == 4 and len(cpu) == 3
    namespace = run_blocks(cpu, tmp_path, monkeypatch)
    built = namespace["built"]
    assert (tmp_path / "gemm_bias_relu.cu").read_text() == built.source
    assert (tmp_path / "gemm_bias_relu.h").read_text() == built.header
    # the page's kernel is the README's example without its schedule lines
    example = (ROOT / "examples" / "gemm_bias_relu.kg").read_text()
    assert namespace["kernel"] == parse(without_schedule_lines(example), "x.kg").kernels[0]
    readme = (ROOT / "README.md").read_text()
    assert "(docs/python.md)" in readme


@pytest.mark.gpu
def test_python_doc_runs_on_a_gpu(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    blocks = python_blocks(PYTHON_DOC)
    assert blocks[-1][1].startswith(GPU_BLOCK)
    run_blocks(blocks, tmp_path, monkeypatch)


# docs/attention.md: the first block runs anywhere, the one that starts with TORCH_BLOCK where
# PyTorch is, the last (GPU_BLOCK) where there is a GPU
ATTENTION_DOC = ROOT / "docs" / "attention.md"
TORCH_BLOCK = "# With PyTorch (no GPU)"


def test_attention_doc_runs_without_pytorch(tmp_path, monkeypatch):
    blocks = python_blocks(ATTENTION_DOC)
    assert len(blocks) == 3
    assert blocks[1][1].startswith(TORCH_BLOCK) and blocks[2][1].startswith(GPU_BLOCK)
    namespace = run_blocks(blocks[:1], tmp_path, monkeypatch, ATTENTION_DOC)
    assert (tmp_path / "attention_softcap.cu").read_text() == namespace["built"].source
    assert "(docs/attention.md)" in (ROOT / "README.md").read_text()


def test_attention_doc_traces_with_pytorch(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    run_blocks(python_blocks(ATTENTION_DOC)[:2], tmp_path, monkeypatch, ATTENTION_DOC)


def test_attention_doc_says_where_a_mod_s_mistake_is():
    from kgen.attention import Signature, program
    from kgen.errors import KgenError

    text = ATTENTION_DOC.read_text()
    assert "`score_mod=\"score + nope\"` is a `KgenError` at `score_mod:1:9`" in text
    with pytest.raises(KgenError) as err:
        program(Signature("bf16", 128, 128, False, "score + nope", None, (), "sm_90a"))
    assert (err.value.loc.file, err.value.loc.line, err.value.loc.col) == ("score_mod", 1, 9)


@pytest.mark.gpu
def test_attention_doc_runs_on_a_gpu(tmp_path, monkeypatch):
    pytest.importorskip("torch")
    run_blocks(python_blocks(ATTENTION_DOC), tmp_path, monkeypatch, ATTENTION_DOC)
