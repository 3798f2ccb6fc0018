"""The sm_90a backward's wgmma descriptors (templates/sm90/loop_bwd.cu.j2) on every path (D 64
and 128, the D 256 split layout and D 192's in wgmma pieces, GQA, deterministic, each way of adding dQ, a staged bias):
each gemm builds its operands' descriptors once from the slot (smem_descriptor, descriptor_mn)
and each k step's is descriptor_at of those, one add (the .cu asserts the shared memory stays
inside the descriptors' address field); without GQA the warpgroup index is broadcast from lane 0
so the descriptors live in uniform registers (sm90/loop_dag.py uniform_warpgroup). And the DAG
loop's .cu defines only the exp helpers its statements take (kgen/targets/common/loop_dag.py
SCALED_EXP), the forward's all of them."""
from __future__ import annotations

import dataclasses
import re

import pytest

from kgen import ir
from kgen.api import build_verified
from kgen.targets.common import loop_dag as common_dag
from kgen.targets.sm90.loop_dag import emit, uniform_warpgroup

from tests import loop_kernels as lk
from tests.targets import test_loop_dag_compile as dag_compile
from tests.targets import test_loop_dag_split as split

SM90A = ir.Arch.SM90A
# the wgmma helpers of the skeleton and how many shared-memory descriptors each takes
WGMMAS = {"wgmma_ss": 2, "wgmma_rs": 1, "wgmma_ss_mn_n": 2, "wgmma_ss_kmn_n": 2}
SCALED_HELPERS = ("exp_diff_scaled", "exp_scaled_diff")


def _kernel(source: str) -> str:
    """The main kernel's text: of the .cu's kernels (a sequence's .cu holds several, each with
    its helpers above it) the one whose body issues the gemms."""
    entry = 'extern "C" __global__'
    kernels = [entry + part.split("\n}\n", 1)[0] for part in source.split(entry)[1:]]
    (main,) = [k for k in kernels if "for (int ks = 0;" in k]
    return main


def _calls(text: str, name: str) -> list[str]:
    """The argument lists of every call of `name` (`name` then digits: the n-suffixed ones, and
    the split layout's pieces: `_of96<1>` after them)."""
    out = []
    for m in re.finditer(rf"\b{name}\d*(?:_of\d+<\d+>)?\(", text):
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[i], 0)
            i += 1
        out.append(text[m.end():i - 1])
    return out


def _gqa():
    from tests.test_backward_gqa import gqa_text, plan_of

    return plan_of(gqa_text(), SM90A, tile=False)


def _deterministic():
    from tests.test_backward_gqa import TEXT, deterministic_text, plan_of

    return plan_of(deterministic_text(TEXT), SM90A, tile=False)


def _bias():
    from tests.targets.test_loop_dag_bias import GRAD, main

    plan, source = main(128, True, GRAD)
    return dataclasses.make_dataclass("Built", ["plan", "source"])(plan, source)


BUILDS = {
    "d64": lambda: dag_compile.built(64, "none", SM90A),
    "d128_causal": lambda: dag_compile.built(128, "top_left", SM90A),
    "d128_tensor": lambda: dag_compile.built(128, "bottom_right", SM90A, adds="tensor"),
    "d64_rows": lambda: dag_compile.built(64, "top_left", SM90A, adds="rows"),
    "d128_atomics": lambda: dag_compile.built(128, "none", SM90A, adds="atomics"),
    "d256_split": lambda: split.built(256, "top_left", SM90A),
    "d192_split_pieces": lambda: split.built(192, "none", SM90A),
    "gqa": _gqa,
    "deterministic": _deterministic,
    "bias_staged": _bias,
}


@pytest.mark.parametrize("name", list(BUILDS))
def test_each_k_step_s_descriptor_is_one_add_from_its_slot_s(name):
    b = BUILDS[name]()
    w = b.plan.wgmma
    assert w is not None
    assert (w.split is not None) == name.startswith(("d256_split", "d192_split"))
    assert bool(w.pieces) == (name == "d192_split_pieces")
    kernel = _kernel(b.source)
    seen = 0
    for helper, operands in WGMMAS.items():
        for args in _calls(kernel, helper):
            seen += 1
            assert args.count("descriptor_at(") == operands, (helper, args)
            assert "smem_descriptor(" not in args and "descriptor_mn(" not in args, args
    assert seen >= 5  # five gemms a block, each issued at least once
    # the descriptors themselves: built once per gemm and slot, outside its k loop
    builders = [line.strip() for line in kernel.splitlines()
                if "smem_descriptor(" in line or "descriptor_mn(" in line]
    assert builders and all(line.startswith("const unsigned long long ") for line in builders)
    steps = [line for line in kernel.splitlines() if "for (int ks = 0;" in line]
    assert len(steps) == len(builders)  # one line of descriptors per gemm issued
    # every operand is in the CTA's shared memory, whose addresses the descriptor's field holds
    assert "static_assert(kSmemBytes + 1024 <= (1 << 18)," in b.source
    assert b.plan.smem_bytes + 1024 <= 1 << 18
    # the warpgroup index broadcast (uniform descriptors) but with GQA (emitter's
    # uniform_warpgroup: measured spills, its why)
    broadcast = "const int warpgroup = __shfl_sync(0xffffffff, tid / kWarpgroupThreads, 0);"
    assert (broadcast in kernel) == (not b.plan.gqa) == uniform_warpgroup(b.plan)
    assert (name == "gqa") == b.plan.gqa


def test_descriptor_at_is_the_descriptor_of_the_address_below_the_window():
    """The two helpers of templates/sm90/wgmma_descriptor.inc.j2 as integers: the slot's
    descriptor plus a k step's bytes / 16 is the descriptor of the step's address while that
    address stays below 2^18 (the static_assert); past it the add would carry into the leading
    byte offset's field."""
    def smem_descriptor(address):
        return ((address & 0x3FFFF) >> 4) | (1 << 16) | ((1024 >> 4) << 32) | (1 << 62)

    def descriptor_at(desc, offset):
        return desc + (offset >> 4)

    for slot in range(0, 1 << 18, 1024):
        for offset in (32, 96, 2048 + 32, 16384 + 96, 7 * 2048):
            if slot + offset < 1 << 18:
                assert descriptor_at(smem_descriptor(slot), offset) == smem_descriptor(
                    slot + offset)
    last = (1 << 18) - 1024
    assert descriptor_at(smem_descriptor(last), 1024) != smem_descriptor(last + 1024)


def _defined(source: str) -> set[str]:
    return set(re.findall(r"__device__ __forceinline__ float (ex\w+)\(", source))


def _called(source: str) -> set[str]:
    return set(re.findall(r"\b(exp_\w+|ex2_approx)\(", _kernel(source)))


@pytest.mark.parametrize("arch, d", [(ir.Arch.SM80, 128), (SM90A, 64), (SM90A, 256)])
def test_the_backward_defines_no_exp_helper_it_never_calls(arch, d):
    """The DAG loop takes exp(a - b) fused but not its scaled forms (common/loop_dag.py
    SCALED_EXP): its .cu (mma.sync or wgmma skeleton) leaves their helpers out."""
    assert common_dag.SCALED_EXP is False
    b = (split.built(d, "top_left", arch) if d == 256 else
         dag_compile.built(d, "top_left", arch))
    assert (b.plan.wgmma is not None) == (arch is SM90A)
    assert "exp_diff(" in _kernel(b.source)  # P = exp(scale * acc - lse[col])
    assert not _defined(b.source) & set(SCALED_HELPERS)
    assert _called(b.source) <= _defined(b.source)


def test_the_backward_with_its_scaled_forms_would_define_them(monkeypatch):
    """SCALED_EXP's other value: the DAG loop's P taken as exp_diff_scaled, its helper defined
    (the value the skeletons read is the statements')."""
    b = dag_compile.built(64, "none", SM90A)
    monkeypatch.setattr(common_dag, "SCALED_EXP", True)
    source = emit(b.plan, source_name="attention_bwd.kg", source_hash="0", command="test")
    assert "exp_diff_scaled(acc_g0[j][e], p.scale, " in _kernel(source)
    assert set(SCALED_HELPERS) <= _defined(source) and _called(source) <= _defined(source)


@pytest.mark.parametrize("arch", [ir.Arch.SM80, SM90A], ids=lambda a: a.value)
def test_the_forward_keeps_every_exp_helper(arch):
    source = build_verified(lk.attention(64, arch=arch), arch).source
    assert set(SCALED_HELPERS) <= _defined(source)
