"""kgen/attention_grad.py's signature and program text (the GPU runs: tests/gpu/
test_attention_grad_gpu.py): a value head dim unlike the query's (D_v != D, BackwardSignature.d_v)
declares dO, O, V and dV at D_v and the rest at D; the plain signature keeps its name (and so its
cached builds and emitted bytes); a pair the target's rulebook refuses is one message naming both
head dims; the emitted sequence (dot, main, dq) builds with NVRTC without spills."""
from __future__ import annotations

import re

import pytest

from kgen.attention_grad import BackwardSignature, backward_module, backward_text
from kgen.attention_grad_mods import Mods
from kgen.errors import KgenError, KgenRuntimeError


def test_the_value_dim_defaults_to_the_query_s_and_keeps_the_plain_names():
    """The names as before d_v (digests of the fields without it): the plain backward's
    builds and bytes are unchanged."""
    assert BackwardSignature("bf16", 128, True, "sm_90a") == BackwardSignature(
        "bf16", 128, True, "sm_90a", d_v=128)
    assert BackwardSignature("bf16", 128, True, "sm_90a").name == "attention_bwd_128_6e907904cde1"
    assert BackwardSignature("f16", 64, False, "sm_80", gqa=True).name == \
        "attention_bwd_64_ccfef3b4a67a"
    softcap = Mods(score_mod="cap * tanh(score / cap)", scalars=("cap",))
    assert BackwardSignature("bf16", 128, True, "sm_90a", mods=softcap).name == \
        "attention_bwd_128_971b1a7ebfc7"
    other = BackwardSignature("bf16", 128, True, "sm_90a", d_v=64)
    assert re.fullmatch(r"attention_bwd_128_64_[0-9a-f]{12}", other.name)
    assert other.name != BackwardSignature("bf16", 128, True, "sm_90a", d_v=96).name


def test_the_text_declares_dO_O_V_dV_at_the_value_dim():
    text = backward_text(BackwardSignature("bf16", 192, True, "sm_80", gqa=True, d_v=128))
    dims = dict(re.findall(r"tensor (\w+) : \w+\[[^\]]*, (\d+)\]", text))
    assert {name: int(n) for name, n in dims.items()} == {
        "dO": 128, "O": 128, "Q": 192, "K": 192, "V": 128, "dQacc": 192, "dK": 192, "dV": 128,
        "dQ": 192}
    assert text.count("tensor dO : bf16[B, H, S, 128] row") == 2  # the dot kernel's and main's
    assert "tensor V : bf16[B, HKV, T, 128] row" in text
    assert backward_module(BackwardSignature("bf16", 192, True, "sm_80", d_v=128))


def test_a_value_dim_unlike_the_query_s_is_no_longer_refused_by_the_call():
    torch = pytest.importorskip("torch")
    from kgen.attention_grad import _refuse
    from kgen.errors import ArgumentError

    q = torch.zeros(1, 2, 8, 64, dtype=torch.bfloat16)
    v = torch.zeros(1, 2, 8, 32, dtype=torch.bfloat16)
    _refuse(q, q, v, {})
    with pytest.raises(ArgumentError, match="GQA takes enable_gqa=True"):
        _refuse(q, q[:, :1], v[:, :1], {})


def test_head_dim_192_runs_the_wgmma_split_layout_on_sm_90a():
    """192 / 128 (and 192 alone) on sm_90a: the wgmma skeleton's split layout, its warpgroups'
    halves of 96 columns in wgmma pieces of 32 (dag_wgmma_rules.DAG_WGMMA_SPLIT_PIECE), and
    `kgen inspect`'s mma row says so."""
    from kgen.api import build_verified

    for d_v in (128, 192):
        module = backward_module(BackwardSignature("bf16", 192, True, "sm_90a", d_v=d_v))
        main = next(k for k in module.kernels if k.name.endswith("_main"))
        plan = build_verified(main, "sm_90a").plan
        assert plan.wgmma is not None and plan.wgmma.split is not None
        assert "each warpgroup's 96 columns as 3 wgmma.m64n32k16 pieces" in plan.mma.value
        assert "the wgmma skeleton does not take this loop" not in plan.mma.why


SEQUENCES = [("sm_80", 192, 128, {}), ("sm_80", 128, 64, {}), ("sm_80", 64, 128, {}),
             ("sm_90a", 128, 64, {}), ("sm_90a", 64, 128, {}), ("sm_90a", 192, 128, {}),
             ("sm_80", 192, 128, dict(gqa=True, deterministic=True)),
             ("sm_90a", 128, 64, dict(gqa=True, deterministic=True))]


@pytest.mark.slow
@pytest.mark.parametrize("arch, d, d_v, options", SEQUENCES,
                         ids=[f"{a}-{d}-{v}{'-gqa-det' if o else ''}" for a, d, v, o in SEQUENCES])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_the_backward_sequence_compiles_without_spills(arch, d, d_v, options, causal):
    """Each of the three kernels, NVRTC 13.5: 0 spills (the main kernel at 254-255 registers on
    sm_80 at 192 / 128, on the mma.sync skeleton; the sm_90a wgmma skeleton at 128 / 64, 64 / 128
    and 192 / 128, the last its split layout)."""
    from kgen.runtime.nvrtc import compile_cubin
    from kgen.sequence import build_sequence

    sig = BackwardSignature("bf16", d, causal, arch, d_v=d_v, **options)
    module = backward_module(sig)
    built = build_sequence(module, module.sequences[0], arch)
    assert [p.name.rsplit("_", 1)[1] for p in built.plans] == ["dot", "main", "dq"]
    for plan in built.plans:
        result = compile_cubin(built.source, plan.name, arch)
        assert (result.spill_stores, result.spill_loads) == (0, 0), (plan.name, result)
    main = built.plans[1]
    assert [(t.n, t.accumulators) for t in main.tails] == [(d_v, ("dv",)), (d, ("dk",))]
    assert (main.wgmma is not None) == (arch == "sm_90a")
    assert (main.wgmma is not None and main.wgmma.split is not None) == (arch == "sm_90a"
                                                                          and d == 192)


def test_a_mixing_kernel_epilogue_is_the_verifier_s_message():
    """(The backward's own epilogue stores each accumulator apart; a program mixing them is
    refused where it mixes.)"""
    text = backward_text(BackwardSignature("bf16", 128, False, "sm_80", d_v=64))
    from kgen.parse import parse
    from kgen.verify import verify

    with pytest.raises(KgenError, match=r"the store of 'dV' reads accumulators of different "
                                        r"widths \('dv' N 64 and 'dk' N 128\)"):
        verify(parse(text.replace("    dV = dv\n", "    dV = dv + dk\n"), "b.kg"))


def test_causal_gqa_runs_the_mha_program_on_repeated_k_and_v(monkeypatch):
    """kgen/attention_grad.py GQA_EXPANDED_CAUSAL: sm_90a's causal GQA backward takes the MHA
    program (a CTA per query head) on K and V repeated over the group at D 128 (and D 64 when
    deterministic); not without the mask, at D 64 otherwise, at other head dims, with a block
    mask or dropout, nor on sm_80; the rule's switch turns it off."""
    import kgen.attention_grad as grad

    sig = BackwardSignature("bf16", 128, True, "sm_90a", gqa=True)
    assert grad.gqa_expanded(sig)
    assert grad.gqa_expanded(BackwardSignature("bf16", 64, True, "sm_90a", gqa=True,
                                               deterministic=True))
    for other in (BackwardSignature("bf16", 128, False, "sm_90a", gqa=True),
                  BackwardSignature("bf16", 64, True, "sm_90a", gqa=True),  # measured slower
                  BackwardSignature("bf16", 256, True, "sm_90a", gqa=True),
                  BackwardSignature("bf16", 128, True, "sm_90a", gqa=True, d_v=64),
                  BackwardSignature("bf16", 128, True, "sm_90a"),
                  BackwardSignature("bf16", 128, True, "sm_80", gqa=True),
                  BackwardSignature("bf16", 128, True, "sm_90a", gqa=True, blocks=True),
                  BackwardSignature("bf16", 128, True, "sm_90a", gqa=True,
                                    mods=Mods(dropout=True))):
        assert not grad.gqa_expanded(other), other
    monkeypatch.setattr(grad, "GQA_EXPANDED_CAUSAL", False)
    assert not grad.gqa_expanded(sig)
