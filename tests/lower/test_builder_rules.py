"""The targets' rulebooks (kgen/targets/<arch>/rules.py): the builder asks them before lowering,
fills the first configuration they allow and lowers it without catching its errors; a
configuration they allow, a direct lowering plans, and one they refuse, it refuses with the
same words at the same place."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import builder, lower, slow_path
from kgen.targets import target
from kgen.targets import rules

from tests.kernels import EXAMPLES, GEMM_TEXT as GEMM, b2b_chain_text
from tests.lower.test_builder import bare, gemm
from kgen.parse import parse
from kgen.verify import verify


def _kernel(text: str) -> ir.Kernel:
    module = parse(text, "t.kg")
    verify(module)
    return module.kernels[0]


def _direct(kernel: ir.Kernel, arch: ir.Arch) -> tuple | None:
    """A complete kernel lowered directly (no builder): None where it plans, else where and why
    the lowering refuses it."""
    assert builder.complete(kernel)
    try:
        lower(kernel, arch)
    except KgenError as err:
        return err.loc, err.message
    return None


# Kernels whose listed configurations (the tuner's wide list: more of them refused) the
# rulebook and a direct lowering must judge alike: one gemm in both layouts of B and with an
# epilogue, on each target's budget; chains of each residency, on sm_80 and sm_90a
SAMPLES = [
    (gemm(), ir.Arch.SM80), (gemm(), ir.Arch.SM86), (gemm(), ir.Arch.SM90A),
    (_kernel(GEMM.replace("TARGET", "sm_90a").replace("LINES", "").replace(" col", " row")),
     ir.Arch.SM90A),
    (_kernel(b2b_chain_text("f16", 576, 64, 128)), ir.Arch.SM90A),
    (_kernel(b2b_chain_text("f16", 256, 128, 256)), ir.Arch.SM90A),
    (_kernel(b2b_chain_text("bf16", 576, 64, 128)), ir.Arch.SM80),
] + [(bare(p), arch) for p in EXAMPLES[:12] for arch in (ir.Arch.SM86, ir.Arch.SM90A)]


@pytest.mark.parametrize("kernel, arch", [s for s in SAMPLES if s[0].gemms],
                         ids=lambda v: getattr(v, "name", getattr(v, "value", "")))
def test_the_rulebook_and_a_direct_lowering_agree(kernel, arch):
    tgt = target(arch)
    verdicts = []
    for _, filled, _ in builder.listed(kernel, tgt, wide=True)[:24]:
        said = builder.refusal(filled, tgt)
        assert said == _direct(filled, arch)
        verdicts.append(said is None)
    assert any(verdicts)


def test_the_sample_has_configurations_the_rulebook_refuses():
    """The agreement above is not only over configurations that plan."""
    refused = sum(builder.refusal(filled, target(arch)) is not None
                  for kernel, arch in SAMPLES if kernel.gemms
                  for _, filled, _ in builder.listed(kernel, target(arch), wide=True)[:24])
    assert refused >= 20


def test_each_target_has_its_rulebook():
    for arch in ir.Arch:
        book = rules.rulebook(target(arch))
        assert callable(book.refusal) and callable(book.request_refusal)


def test_a_line_only_sm90a_runs_is_refused_by_the_sm80_rulebook_at_its_line():
    kernel = gemm("split stream", "sm_90a")
    filled = builder.fill(kernel, builder.listed(kernel, target(ir.Arch.SM90A))[0][0])[0]
    loc, message = builder.refusal(filled, target(ir.Arch.SM80))
    assert message.startswith("split stream needs target sm_90a")
    assert loc == filled.gemms[0].split.loc
    assert builder.refusal(filled, target(ir.Arch.SM90A)) is None


def test_build_lowers_what_the_rulebook_allows_and_does_not_catch(monkeypatch):
    """A rulebook that allowed everything would let the first listed configuration (128x256x64
    on 3 stages: over sm_86's 99 KB) reach the lowering, whose budget error then propagates;
    the real rulebook refuses it and the builder takes the next one."""
    kernel = gemm()
    plan = lower(kernel, ir.Arch.SM86)
    assert plan.schedule.untaken and "over budget" in plan.schedule.untaken[0][1]
    assert plan.gemms[0].tile != (128, 256, 64)
    calls = []

    def allow(facts):
        calls.append(facts)
        return None

    monkeypatch.setattr(rules.rulebook(target(ir.Arch.SM86)), "refusal", allow)
    with pytest.raises(KgenError) as info:
        lower(kernel, ir.Arch.SM86)
    assert info.value.message.startswith("shared memory over budget")
    assert len(calls) == 1  # asked once, then lowered: no second configuration was tried


def test_every_refused_configuration_is_recorded_with_the_rulebooks_reason():
    kernel = gemm()
    tgt = target(ir.Arch.SM86)
    choice = builder.choose(kernel, tgt)
    tries = builder.listed(kernel, tgt)
    refused = [(cfg.label, builder.refusal(filled, tgt)[1]) for cfg, filled, _ in
               tries[:len(choice.filled.untaken)]]
    assert list(choice.filled.untaken) == refused
    assert builder.refusal(choice.kernel, tgt) is None


def test_a_written_line_the_rulebook_refuses_is_located_at_it():
    with pytest.raises(KgenError) as info:
        lower(gemm("stages 12"))
    assert info.value.loc.line == 7
    assert info.value.message.startswith("stages must be between 2 and 8, got 12")


def test_the_slow_path_check_asks_the_rulebook_and_lowers_only_what_it_allows():
    kernel = gemm("warps 4x1", "sm_90a")
    tgt = target(ir.Arch.SM90A)
    lowered = []

    def lower_one(k):
        lowered.append(k)
        return lower(k, ir.Arch.SM90A)

    free = builder.free(kernel)
    assert builder.tried(free, tgt, lower_one) is not None
    assert lowered == [builder.choose(free, tgt).kernel]  # the builder's choice, filled in
    # a kernel every configuration of which the rulebook refuses is not lowered at all
    stuck = gemm("tile 128x128x24", "sm_90a")
    assert builder.tried(stuck, tgt, lower_one) is None and len(lowered) == 1
    assert slow_path.check(kernel, tgt, lower(kernel, ir.Arch.SM90A),
                           lambda k: lower(k, ir.Arch.SM90A)) is not None
