"""Who zeroes a sequence's `out accumulate` buffers (kgen/sequence_zeroing.py): the attention
backward's D row kernel, launched just before the main kernel, zeroes dQacc's rows beside its
own (the main kernel launched without its own zeroing: three launches), by default and with
GQA, for sm_80 and sm_90a; the main kernel's own `_zero` launch where the decision says why not
(deterministic mode, no row kernel just before it, a row kernel over other rows). The row
kernel's plan and .cu, the sequence's .cu launcher, the runtime's SequencePlan and the call
without zeroing, and `kgen inspect`."""
from __future__ import annotations

import json
import types

import pytest
from click.testing import CliRunner

from kgen.attention_grad import BackwardSignature, backward_module, backward_text
from kgen.cli import cli
from kgen.parse import parse
from kgen.sequence import build_sequence, sequence_plan, sequence_zeroing
from kgen.verify import verify
from kgen.verify.sequence import resolve


def _built(arch="sm_90a", **options):
    module = backward_module(BackwardSignature("bf16", 64, True, arch, **options))
    return build_sequence(module, module.sequences[0], arch)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("gqa", [False, True])
def test_the_row_kernel_before_the_main_kernel_zeroes_dqacc(arch, gqa):
    built = _built(arch, gqa=gqa)
    dot, main, dq = built.kernels
    (zeroing,) = built.zeroing
    assert (zeroing.adder, zeroing.buffers, zeroing.by) == (main.plan.name, ("dQacc",),
                                                            dot.plan.name)
    assert zeroing.folded and "one launch fewer" in zeroing.why
    plan = dot.plan
    assert plan.zeroes == ("dQacc",) and plan.zeroes_for == main.plan.name
    assert plan.param("dQacc") == main.plan.param("dQacc")
    names = [f.name for f in plan.fields]
    assert names[names.index("dQacc"):] == ["dQacc", "dQacc_ld", "dQacc_bs", "dQacc_hs", "rows",
                                            "loop_len", "heads", "group", "batches"]
    kernel = dot.source[dot.source.index(f"{plan.name}(const {plan.name}_params p) {{"):]
    kernel = kernel[:kernel.index("\n}\n")]
    assert "float* g_dQacc = p.dQacc + batch * p.dQacc_bs + head * p.dQacc_hs;" in kernel
    assert ("for (int c = lane; c < 64 / 4; c += 32)\n    *reinterpret_cast<float4*>(g_dQacc + "
            "warp_row * p.dQacc_ld + c * 4) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);") in kernel
    assert kernel.index("store_one(g_D + row") < kernel.index("g_dQacc + warp_row")
    assert "float* dQacc;  // tensor dQacc (f32, out)" in dot.header
    # the main kernel's own .cu is unchanged: alone, its _launch still zeroes first
    assert main.source.count(f"{main.plan.name}_zero<<<") == 1
    launcher = built.source[built.source.index(f"cudaError_t {built.name}_launch("):]
    assert f"error = {main.plan.name}_launch_zeroed(args_{main.plan.name}(p, w, workspace)" \
        in launcher
    assert f"{main.plan.name}_zero" not in launcher
    plan = sequence_plan(built.info, built.zeroing)
    assert plan.zeroed_by_caller == (main.plan.name,)
    assert plan.launches[0] == (dot.plan.name, ("dO", "O", "D", "dQacc"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_deterministic_mode_keeps_the_main_kernel_s_own_zeroing(arch):
    built = _built(arch, deterministic=True)
    dot, main, _ = built.kernels
    (zeroing,) = built.zeroing
    assert not zeroing.folded and zeroing.by is None
    assert "deterministic mode's semaphores" in zeroing.why
    assert dot.plan.zeroes == () and dot.plan.param("dQacc") is None
    launcher = built.source[built.source.index(f"cudaError_t {built.name}_launch("):]
    assert f"error = {main.plan.name}_launch(args_{main.plan.name}(p, w, workspace)" in launcher
    assert sequence_plan(built.info, built.zeroing).zeroed_by_caller == ()


def _sequence(text: str, launches: str):
    """The backward's kernels with another sequence (and kernel `pre`, where given)."""
    base = backward_text(BackwardSignature("bf16", 64, False, "sm_80"))
    name = BackwardSignature("bf16", 64, False, "sm_80").name
    module = parse(base[:base.index("sequence ")] + text + launches.replace("NAME", name),
                   "s.kg")
    assert verify(module) == []
    return module


def test_no_row_kernel_just_before_the_adder_keeps_its_own_zeroing():
    module = _sequence("", "sequence s {\n  workspace dQacc\n  launch NAME_main\n"
                           "  launch NAME_dq\n}\n")
    info = resolve(module, module.sequences[0])
    (zeroing,) = sequence_zeroing(info)
    assert not zeroing.folded and zeroing.why.endswith("no row kernel is launched just before it")


def test_a_row_kernel_over_other_rows_does_not_zero_dqacc():
    pre = ("kernel pre {\n  target sm_80\n  tensor K : bf16[B, H, T, 64] row\n"
           "  vector KS : f32[B, H, T] out\n  epilogue { KS = rowsum(cast<f32>(K) * K) }\n}\n")
    module = _sequence(pre, "sequence s {\n  workspace D, dQacc\n  launch NAME_dot\n"
                            "  launch pre\n  launch NAME_main\n  launch NAME_dq\n}\n")
    info = resolve(module, module.sequences[0])
    (zeroing,) = sequence_zeroing(info)
    assert not zeroing.folded
    assert zeroing.why.endswith("dQacc's rows, heads and batch are not pre's")
    built = build_sequence(module, module.sequences[0])
    assert all(not b.plan.zeroes for b in built.kernels if hasattr(b.plan, "zeroes"))


def test_kgen_inspect_shows_the_zeroing_and_why(tmp_path):
    program = tmp_path / "bwd.kg"
    program.write_text(backward_text(BackwardSignature("bf16", 64, True, "sm_80")))
    runner = CliRunner()
    result = runner.invoke(cli, ["inspect", str(program), "--json"])
    assert result.exit_code == 0, result.output
    (seq,) = json.loads(result.output)["sequences"]
    dot, main, _ = seq["launches"]
    (zeroing,) = seq["zeroing"]
    assert {k: zeroing[k] for k in ("adder", "buffers", "by", "folded")} == {
        "adder": main, "buffers": ["dQacc"], "by": dot, "folded": True}
    assert zeroing["why"].startswith(f"{dot}, the row kernel launched just before {main}")
    text = runner.invoke(cli, ["inspect", str(program)], terminal_width=300)
    assert f"zeroing of dQacc by {dot}: {dot}, the row kernel" in text.output


def test_a_program_called_without_its_zeroing_launches_the_kernel_alone():
    """CompiledProgram.zeroed_by_caller, on a stand-in of a loaded program (no GPU): the copy's
    launches leave out `<name>_zero`; the program itself keeps it; deterministic refused."""
    from kgen.errors import KgenRuntimeError
    from kgen.runtime.program import CompiledProgram

    def program(deterministic: bool):
        built = _built("sm_80", deterministic=deterministic)
        p = CompiledProgram.__new__(CompiledProgram)
        p.plan = built.kernels[1].plan
        p.device_id = 0
        p._function, p._zero_function = "main", "zero"
        return p

    bound = types.SimpleNamespace(values={"loop_len": 5, "heads": 2, "batches": 1},
                                  grid=(1, 2, 1))
    full = program(False)
    alone = full.zeroed_by_caller()
    assert [launch[0] for launch in full.program_launches(bound)] == ["zero", "main"]
    assert [launch[0] for launch in alone.program_launches(bound)] == ["main"]
    with pytest.raises(KgenRuntimeError, match="semaphores itself"):
        program(True).zeroed_by_caller()
