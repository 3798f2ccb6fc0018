"""Declared storage: `phases { }` and `storage { }` parsed, laid out as C lays out nested
structs and unions, checked against lifetimes (both ways), aligned, and refused with a located
message naming both buffers and the phase where they overlap."""
from __future__ import annotations

import itertools

import pytest

from kgen import ir
from kgen.errors import KgenError
from kgen.lower import lower
from kgen.parse import parse
from kgen.verify import verify

GEMM = """
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  gemm mma0 = A @ B accumulate f32 {
    tile 128x128x32  warps 2x2  stages 3
    epilogue { D = acc }
  }
"""


def source_of(body: str, gemm: bool = True) -> str:
    return "kernel k {\n  target sm_80\n" + (GEMM if gemm else "") + body + "\n}\n"


def line_of(body: str, needle: str) -> int:
    """The line of the kernel's source where `needle` first appears."""
    text = source_of(body)
    return text[:text.index(needle)].count("\n") + 1


def kernel(body: str, *, gemm: bool = True) -> ir.Kernel:
    module = parse(source_of(body, gemm), "t.kg")
    verify(module)
    return module.kernels[0]


def plan(body: str, **kw):
    return lower(kernel(body, **kw)).storage


def error(body: str, **kw) -> KgenError:
    with pytest.raises(KgenError) as info:
        lower(kernel(body, **kw))
    return info.value


def offsets(storage) -> dict[str, int]:
    return {b.name: b.offset for b in storage.buffers}


def assert_valid(storage):
    """No two buffers that share bytes are live in the same phase; every offset is aligned."""
    for b in storage.buffers:
        assert b.offset % b.align == 0, b
        assert b.end <= storage.total_bytes
    for x, y in itertools.combinations(storage.buffers, 2):
        assert not (x.shares_bytes(y) and x.co_live(y)), (x, y)


# -- the syntax ------------------------------------------------------------------------------


def test_storage_block_parses_to_ir():
    body = """
  phases { pre, mma0.mainloop, mma0.epilogue, post }
  storage {
    persistent { di : f32[64] }
    union {
      struct { union { x : f16[64, 64] live(pre); y : f16[64, 64] live(post) }
               mm : pipeline(mma0) }
      struct { z : f16[128, 64] align(128) live(mma0.epilogue, pre..pre); x }
    }
  }"""
    k = kernel(body)
    assert [p.name for p in k.phases] == ["pre", "mma0.mainloop", "mma0.epilogue", "post"]
    decl = k.storage
    (di,) = decl.persistent
    assert di == ir.SmemBuffer("di", ir.DType.F32, (64,))
    part1, part2 = decl.root.members
    inner, stage = part1.members
    assert isinstance(inner, ir.Union)
    assert stage == ir.StageBuffers(ir.StageKind.PIPELINE, "mma0", "mm")
    z, x_again = part2.members
    assert z.align == 128 and z.shape == (128, 64)
    assert z.live == (ir.LiveRange("mma0.epilogue", "mma0.epilogue"), ir.LiveRange("pre", "pre"))
    assert x_again == ir.BufferRef("x")
    assert z.loc.line == line_of(body, "z :") and z.loc.col == 16


def test_epilogue_stage_reference_is_not_an_epilogue_body():
    """`epilogue(g)` in a storage block must not switch the lexer into epilogue statements."""
    k = kernel("storage { union { epilogue(mma0) struct { a : f16[8] } } }")
    first, second = k.storage.root.members
    assert first == ir.StageBuffers(ir.StageKind.EPILOGUE, "mma0")
    assert isinstance(second, ir.Struct)


@pytest.mark.parametrize("body,message", [
    ("storage { union { a : f16[M] } }", "buffer 'a' has dimension 'M'; shared-memory buffers "
                                         "have fixed sizes"),
    ("storage { union { a : f16[4] live(x) live(y) } }", "buffer 'a' has two live options"),
    ("storage { union { a : f16[4] align(2048) } }", "align must be at most 1024"),
    ("storage { union { a : i8[4] } }", "unknown dtype 'i8'"),
    ("storage { union { a : f16[4] } union { b : f16[4] } persistent { c : f16[4] } }",
     "persistent { ... } must come first in storage"),
    ("storage { } storage { }", "storage given twice"),
    ("phases { a } phases { b }", "phases given twice"),
    ("storage { union { a_smem : f16[4] } }", "buffer name 'a_smem' is reserved"),
])
def test_syntax_mistakes_are_located(body, message):
    with pytest.raises(KgenError, match=message.replace("(", r"\(").replace(")", r"\)")
                       .replace("{", r"\{").replace("}", r"\}").replace(".", r"\.")):
        kernel(body)


# -- layout ----------------------------------------------------------------------------------


def test_struct_is_sequential_union_shares_offset_and_sizes_round_up():
    s = plan("""
  phases { a, b, mma0.mainloop, mma0.epilogue }
  storage {
    persistent { pp : f32[3] }
    union {
      struct { x : f16[10] live(a); y : f32[8] live(a) }
      struct { z : f16[1000] live(b) }
    }
  }""")
    o = offsets(s)
    # pp is 12 bytes, padded to the union's 16-byte alignment; x is 20 bytes, y follows at 16*2.
    assert o["pp"] == 0 and o["x"] == 16 and o["y"] == 48 and o["z"] == 16
    assert s.declared_bytes == 16 + 2000
    assert_valid(s)


def test_alignment_of_declared_and_stage_buffers():
    s = plan("""
  storage {
    union {
      struct { small : f16[3] live(mma0.epilogue); big : f16[64] align(1024) live(mma0.epilogue) }
      struct { tiny : f32[1] live(mma0.mainloop); pipeline(mma0) }
    }
  }""")
    o = offsets(s)
    assert o["small"] == 0 and o["big"] == 1024
    # The swizzled operand stages keep their 128-byte alignment inside a struct.
    assert o["tiny"] == 0 and o["a_smem"] == 128 and o["b_smem"] == 128 + 24576
    assert all(b.offset % b.align == 0 for b in s.buffers)
    assert s.total_bytes % 1024 == 0  # the arena is as aligned as its strictest buffer
    assert_valid(s)


@pytest.mark.parametrize("align,message", [
    (3, "align must be a power of two from 2"),
    (1, "align must be a power of two from 2"),
])
def test_bad_alignment_is_refused(align, message):
    e = error(f"storage {{ union {{ a : f16[4] align({align}) }} }}")
    assert message in e.message and e.loc.line > 0


def test_buffer_mentioned_twice_must_land_at_one_offset():
    ok = plan("""
  phases { a, b, c, mma0.mainloop, mma0.epilogue }
  storage { union {
    struct { t : f16[64] live(a..c); u : f16[8] live(a) }
    struct { t; v : f16[8] live(b) }
  } }""")
    assert offsets(ok)["t"] == 0 and offsets(ok)["v"] == 128
    body = """
  phases { a, b, c, mma0.mainloop, mma0.epilogue }
  storage { union {
    struct { t : f16[64] live(a..c); u : f16[8] live(a) }
    struct { v : f16[8] live(b); t }
  } }"""
    e = error(body)
    first = line_of(body, "t : f16")
    assert "buffer 't' lands at byte 16 here but at byte 0 where it is first mentioned at " \
           f"line {first}" in e.message
    assert (e.loc.line, e.loc.col) == (first + 1, 34)


def test_lowering_buffers_can_be_placed_by_name():
    s = plan("storage { persistent { a_smem } union { b_smem; x : f16[64] live(mma0.epilogue) } }")
    o = offsets(s)
    assert o["a_smem"] == 0 and o["b_smem"] == 24576 and o["x"] == 24576
    assert all(b.declared for b in s.buffers)


# -- lifetimes -------------------------------------------------------------------------------


def test_union_of_buffers_never_live_together_is_accepted():
    s = plan("""
  phases { load, mma0.mainloop, mma0.epilogue, store }
  storage { union { x : f16[4096] live(load); pipeline(mma0); y : f32[4096] live(store) } }""")
    o = offsets(s)
    assert o["x"] == o["a_smem"] == o["y"] == 0
    assert s.total_bytes == 49152  # the union is as big as its biggest member
    assert_valid(s)


def test_union_of_buffers_live_together_is_refused_naming_both_and_the_phase():
    body = """
  phases { load, mma0.mainloop, mma0.epilogue, store }
  storage {
    union {
      x : f16[4096] live(load..mma0.mainloop)
      pipeline(mma0)
    }
  }"""
    e = error(body)
    assert e.message.startswith(f"'a_smem' and 'x' at line {line_of(body, 'x :')} share bytes "
                                "0..8192 but are both live in phase 'mma0.mainloop'")
    assert e.loc.line == line_of(body, "pipeline")  # the later of the two


def test_nested_overlap_is_found_through_structs():
    body = """
  phases { a, b, mma0.mainloop, mma0.epilogue }
  storage { union {
    struct { pa : f16[100] live(a); q : f16[100] live(b) }
    struct { r : f16[150] live(b) }
  } }"""
    e = error(body)
    # r covers bytes 0..300; pa is 0..200 (live a) and q 208..408 (live b): q and r clash in b.
    assert f"'r' and 'q' at line {line_of(body, 'q :')} share bytes 208..300 but are both live " \
           "in phase 'b'" in e.message


def test_loop_carried_lifetimes_are_two_ranges():
    """A buffer prefetched at the end of an iteration for the next one is live at both ends:
    it may share bytes with a buffer live only in between, not with one live at an end."""
    body = """
  phases {{ head, mma0.mainloop, mma0.epilogue, tail }}
  storage {{ union {{
    next : f16[64] live(head, tail)
    mid : f16[64] live({mid})
  }} }}"""
    s = plan(body.format(mid="mma0.epilogue"))
    assert offsets(s)["next"] == offsets(s)["mid"] == 0
    nxt = next(b for b in s.buffers if b.name == "next")
    assert nxt.live_ranges == ((0, 0), (3, 3)) and s.live_text(nxt) == "head, tail"
    e = error(body.format(mid="mma0.epilogue..tail"))
    assert "both live in phase 'tail'" in e.message


def test_persistent_buffers_never_share_bytes():
    s = plan("""
  storage { persistent { x : f16[64]; y : f16[64] } union { z : f16[64] } }""")
    o = offsets(s)
    assert o["x"] == 0 and o["y"] == 128 and o["z"] == 256
    assert_valid(s)


# -- phases ----------------------------------------------------------------------------------


@pytest.mark.parametrize("body,message", [
    ("phases { a, mma0.mainloop }", "phases must list every gemm phase to say where it falls; "
                                    "add mma0.epilogue"),
    ("phases { mma0.epilogue, mma0.mainloop }", "gemm phases must come in the order the kernel "
                                                "runs them"),
    ("phases { a, mma0.mainloop, a, mma0.epilogue }", "phase 'a' is listed twice"),
    ("phases { mma0.main, mma0.mainloop, mma0.epilogue }",
     "'mma0.main' is not a phase of a gemm of this kernel"),
    ("storage { union { x : f16[4] live(mma0.epilog) } }",
     "buffer 'x': unknown phase 'mma0.epilog'; did you mean 'mma0.epilogue'?"),
    ("phases { a, b, mma0.mainloop, mma0.epilogue } storage { union { x : f16[4] live(b..a) } }",
     "buffer 'x': phase 'a' comes before 'b'"),
])
def test_phase_mistakes_are_located(body, message):
    e = error(body)
    assert message in e.message and e.loc.line > 0


def test_without_phases_the_gemm_phases_are_used():
    s = plan("storage { union { x : f16[64] live(mma0.epilogue) } }")
    assert s.phases == ("mma0.mainloop", "mma0.epilogue")
    x = next(b for b in s.buffers if b.name == "x")
    assert x.live == (1, 1)
    # With no live(), a buffer is live in every phase.
    s = plan("storage { union { x : f16[64] } }")
    assert next(b for b in s.buffers if b.name == "x").live == (0, 1)


# -- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize("body,message", [
    ("storage { union { x : f16[4] x : f16[8] } }", "buffer 'x' is declared twice"),
    ("storage { union { x : f16[4] y } }", "unknown buffer 'y'"),
    ("storage { union { pipeline(mma1) } }", "pipeline(mma1) names no gemm of this kernel; did "
                                             "you mean 'mma0'?"),
    ("storage { union { total : f16[4] } }", "buffer name 'total' clashes in the emitted "
                                             "SharedStorage with 'total_bytes'"),
    ("storage { union { x : f16[4] x_bytes : f16[4] } }", "clashes in the emitted SharedStorage "
                                                          "with 'x_bytes'"),
])
def test_name_mistakes_are_located(body, message):
    e = error(body)
    assert message in e.message and e.loc.line > 0


def test_empty_epilogue_stage_takes_no_bytes():
    s = plan("storage { union { struct { epilogue(mma0); x : f16[8] } } }")
    assert offsets(s)["x"] == 0


# -- kernels without a gemm ------------------------------------------------------------------


def test_storage_only_kernel_plans_but_does_not_emit():
    from kgen.emit import emit

    k = kernel("""
  phases { a, b }
  storage { union { x : f16[64] live(a); y : f32[64] live(b) } }""", gemm=False)
    p = lower(k)
    assert p.gemms == () and p.smem_bytes == 256 and offsets(p.storage) == {"x": 0, "y": 0}
    with pytest.raises(KgenError, match="kernel 'k' has no gemm to emit; kgen inspect shows its "
                                        "storage plan") as info:
        emit(p, source_name="t.kg", source_hash="0", command="c")
    assert info.value.loc.line == 1
    # Gemm phase names mean nothing without the gemm.
    with pytest.raises(KgenError, match="'g.mainloop' is not a phase of a gemm of this kernel"):
        lower(kernel("phases { g.mainloop } storage { union { x : f16[4] } }", gemm=False))
    # Without a storage declaration, a kernel still needs a gemm.
    with pytest.raises(KgenError, match="kernel 'k' has no gemm"):
        kernel("", gemm=False)


def test_python_built_storage_is_verified():
    bad = ir.Kernel("k", ir.Arch.SM80, (), (), storage=ir.StorageDecl((ir.Const(1.0),)))
    with pytest.raises(KgenError, match="not a storage member"):
        verify(ir.Module((bad,)))
    bad = ir.Kernel("k", ir.Arch.SM80, (), (), storage="union {}")
    with pytest.raises(KgenError, match="kernel storage must be a kgen.ir.StorageDecl"):
        verify(ir.Module((bad,)))
    good = ir.Kernel("k", ir.Arch.SM80, (), (), phases=(ir.Phase("a"), ir.Phase("b")),
                     storage=ir.StorageDecl(root=ir.Union((
                         ir.SmemBuffer("x", ir.DType.F16, (8,), (ir.LiveRange("a", "a"),)),
                         ir.SmemBuffer("y", ir.DType.F16, (8,), (ir.LiveRange("b", "b"),))))))
    verify(ir.Module((good,)))
    assert lower(good).smem_bytes == 16


def test_epilogue_stage_places_the_reduction_scratch():
    source = """kernel r {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  vector colmax_d : f32[N] out
  gemm mma0 = A @ B accumulate f32 {
    tile 128x128x32  warps 2x2  stages 3
    epilogue { D = acc; colmax_d = colmax(acc) }
  }
  storage { union { pipeline(mma0); struct { lut : f32[64] live(mma0.epilogue); epilogue(mma0) } } }
}
"""
    module = parse(source, "t.kg")
    verify(module)
    s = lower(module.kernels[0]).storage
    scratch = [b for b in s.buffers if b.name.startswith("red")]
    assert scratch and all(b.declared for b in scratch)
    assert scratch[0].offset == 256  # after lut, in the bytes of the dead operand stages
    assert_valid(s)
