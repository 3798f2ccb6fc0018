"""`kgen tune --write`: the winning lines go into the .kg text, every other byte kept; the
re-parsed file plans to the tuned kernel; --all-lines rewrites the written lines."""
from __future__ import annotations

import dataclasses

import pytest

from kgen.enums import Arch
from kgen.errors import KgenRuntimeError
from kgen.lower import lower
from kgen.plan import LineChoice
from kgen.tune.space import emit_source, search_space
from kgen.tune.write import checked, write_lines

from .helpers import SIZES, example_text, kernel_of

COMMENTED = """\
# a header comment { with a brace }
kernel gemm_bf16 {   # the kernel
  target sm_80       # keep me
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor D : bf16[M, N] row out

  gemm mma0 = A @ B accumulate f32 {   # a gemm comment
    # keep this line too
    epilogue { D = acc }   # and this
  }
}
"""


def code(text: str) -> str:
    """The text without its comment lines."""
    return "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))


def removed(before: str, after: str) -> list[str]:
    """Lines of `before` missing from `after` (as a multiset)."""
    rest = after.splitlines()
    gone = []
    for line in before.splitlines():
        if line in rest:
            rest.remove(line)
        else:
            gone.append(line)
    return gone


@pytest.mark.parametrize("arch", [Arch.SM80, Arch.SM90A])
def test_every_candidate_written_plans_to_itself(arch):
    text = COMMENTED.replace("sm_80", arch.value)
    kernel = kernel_of(text)
    space = search_space(kernel, arch, SIZES, limit=50)
    assert len(space.candidates) > 5
    for candidate in space.candidates:
        new = write_lines(text, kernel, candidate.lines)
        assert removed(text, new) == []  # only additions: every comment and line kept
        checked(new, "t.kg", kernel.name, arch, candidate.source, "<tune>", "")
        rewritten = kernel_of(new)
        assert [c.line for c in lower(rewritten, arch).schedule.chosen] == []  # complete now


def test_the_lines_land_after_the_brace_and_the_target_line():
    kernel = kernel_of(COMMENTED)
    lines = (LineChoice("schedule", "pingpong"), LineChoice("mma0 tile", "128x128x64"),
             LineChoice("mma0 warps", "2x4"), LineChoice("mma0 stages", "5"),
             LineChoice("mma0 split", "split 2"))
    new = write_lines(COMMENTED, kernel, lines)
    assert new.splitlines()[2:4] == ["  target sm_80       # keep me", "  schedule pingpong"]
    at = new.splitlines().index("  gemm mma0 = A @ B accumulate f32 {   # a gemm comment")
    assert new.splitlines()[at + 1] == "    tile 128x128x64  warps 2x4  stages 5  split 2"
    assert new.splitlines()[at + 2] == "    # keep this line too"


def test_a_one_line_kernel_gets_inline_lines():
    text = ("kernel k { target sm_80 tensor A : f16[M, K] row tensor B : f16[K, N] col "
            "tensor D : f16[M, N] row out gemm g = A @ B { epilogue { D = acc } } }")
    kernel = kernel_of(text)
    candidate = search_space(kernel, Arch.SM90A, SIZES).candidates[0]
    new = write_lines(text, kernel, candidate.lines)
    assert "\n" not in new
    checked(new, "t.kg", "k", Arch.SM90A, candidate.source, "<tune>", "")


def test_crlf_and_bom_are_kept():
    text = "\ufeff" + COMMENTED.replace("\n", "\r\n")
    kernel = kernel_of(text.removeprefix("\ufeff"))
    candidate = search_space(kernel, Arch.SM80, SIZES).candidates[2]
    new = write_lines(text, kernel, candidate.lines)
    assert new.startswith("\ufeff")
    assert new.count("\r\n") == new.count("\n") == COMMENTED.count("\n") + 1
    checked(new.removeprefix("\ufeff"), "t.kg", kernel.name, Arch.SM80, candidate.source,
            "<tune>", "")


def test_chain_lines_keep_and_resident_on_their_own_lines():
    text = example_text("b2b_gemm_rf_pingpong_sm90a")
    kernel = kernel_of(text)
    space = search_space(kernel, Arch.SM90A, {"M": 81920})
    resident = next(c for c in space.candidates if c.label.count("resident") == 2)
    new = write_lines(text, kernel, resident.lines)
    assert "    keep B0 resident" in new.splitlines()
    assert "    keep g0 in registers" in new.splitlines()
    assert removed(text, new) == []
    checked(new, "t.kg", kernel.name, Arch.SM90A, resident.source, "<tune>", "")


def test_all_lines_rewrites_and_deletes_the_written_lines():
    text = example_text("b2b_gemm_rf_pingpong_sm90a", stripped=False)
    kernel = kernel_of(text)
    space = search_space(kernel, Arch.SM90A, {"M": 81920}, all_lines=True)
    smem = next(c for c in space.candidates if "smem" in c.label)  # no resident, no schedule
    new = write_lines(text, kernel, smem.lines, replace=True)
    assert "schedule pingpong" not in code(new) and "resident" not in code(new)
    assert "keep g0 in smem" in code(new) and "keep g0 in registers" not in code(new)
    assert [line for line in text.splitlines() if line.lstrip().startswith("#")] == \
        [line for line in new.splitlines() if line.lstrip().startswith("#")]
    checked(new, "t.kg", kernel.name, Arch.SM90A, smem.source, "<tune>", "")
    # and back: the pingpong winner restores a schedule line in place
    again = kernel_of(new)
    pingpong = next(c for c in space.candidates
                    if c.plan.schedule.scheduler.kind.value == "pingpong")
    restored = write_lines(new, again, pingpong.lines, replace=True)
    checked(restored, "t.kg", kernel.name, Arch.SM90A, pingpong.source, "<tune>", "")


def test_deleting_keeps_a_comment_on_the_same_line():
    text = example_text("splitk_gelu", stripped=False).replace(
        "stages 4  split 4", "stages 4  split 4  # tuned once")
    kernel = kernel_of(text)
    space = search_space(kernel, Arch.SM80, SIZES, all_lines=True)
    plain = next(c for c in space.candidates if c.plan.schedule.scheduler.split_k == 1)
    new = write_lines(text, kernel, plain.lines, replace=True)
    assert "split" not in code(new).replace("splitk", "")
    assert "# tuned once" in new
    checked(new, "t.kg", kernel.name, Arch.SM80, plain.source, "<tune>", "")


def test_without_replace_a_written_line_is_refused():
    text = example_text("gemm", stripped=False)
    kernel = kernel_of(text)
    with pytest.raises(ValueError):
        write_lines(text, kernel, (LineChoice("mma0 tile", "64x64x32"),))


def test_the_check_refuses_text_that_plans_otherwise():
    kernel = kernel_of(COMMENTED)
    space = search_space(kernel, Arch.SM80, SIZES)
    first, second = space.candidates[0], space.candidates[1]
    new = write_lines(COMMENTED, kernel, first.lines)
    with pytest.raises(KgenRuntimeError, match="does not plan to the tuned kernel"):
        checked(new, "t.kg", kernel.name, Arch.SM80, second.source, "<tune>", "")
    assert emit_source(lower(dataclasses.replace(kernel_of(new)), Arch.SM80)) == first.source
