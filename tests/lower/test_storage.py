"""Placement by lifetime: no two live buffers overlap, alignment holds, reuse happens."""
from __future__ import annotations

import itertools
import random

from kgen.lower import lower, storage

from tests.kernels import gemm_kernel


def _overlap(a, b):
    return a.offset < b.offset + b.bytes and b.offset < a.offset + a.bytes


def _live_together(a, b):
    return a.live[0] <= b.live[1] and b.live[0] <= a.live[1]


def test_random_requests_never_overlap_while_live():
    rng = random.Random(7)
    for _ in range(200):
        reqs = []
        for i in range(rng.randint(1, 8)):
            first = rng.randint(0, 4)
            reqs.append(storage.Request(f"b{i}", rng.randint(1, 5000), rng.choice([8, 16, 128, 1024]),
                                        (first, first + rng.randint(0, 3)), "test"))
        placed = storage.place(reqs)
        for b in placed:
            assert b.offset % b.align == 0
        for a, b in itertools.combinations(placed, 2):
            assert not (_live_together(a, b) and _overlap(a, b)), (a, b)


def test_disjoint_lifetimes_share_bytes():
    reqs = [storage.Request("x", 4096, 128, (0, 0), "x"), storage.Request("y", 2048, 128, (1, 1), "y"),
            storage.Request("z", 100, 8, (0, 1), "z")]
    x, y, z = storage.place(reqs)
    assert x.offset == 0 and y.offset == 0  # reused
    assert z.offset == 4096


def test_gemm_plan_storage():
    plan = lower(gemm_kernel(tile=(128, 128, 64), warps=(2, 2), stages=3))
    a, b = plan.storage.buffers
    assert (a.name, a.offset, a.bytes) == ("a_smem", 0, 49152)
    assert (b.name, b.offset, b.bytes) == ("b_smem", 49152, 49152)
    assert plan.smem_bytes == 98304 and plan.storage.limit_bytes == 163 * 1024


# -- the packer against declared layouts ----------------------------------------------------

import dataclasses  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

from kgen import ir  # noqa: E402
from kgen.errors import KgenError  # noqa: E402
from kgen.lower import unions  # noqa: E402
from kgen.parse import parse, parse_file  # noqa: E402
from kgen.verify import verify  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent.parent
ATTENTION = ROOT / "examples" / "attention_bwd_seed_storage.kg"
SEED_PROLOGUE_BYTES = 52480  # sizeof(SharedStoragePrologue), 64x64 blocks, kMaxK 64, f16, sm_80
SEED_NO_PROLOGUE_BYTES = 27904  # sizeof(SharedStorageNoPrologue), same sizes


def _valid(s) -> None:
    for b in s.buffers:
        assert b.offset % b.align == 0, b
        assert b.end <= s.total_bytes, b
    for x, y in itertools.combinations(s.buffers, 2):
        assert not (x.shares_bytes(y) and x.co_live(y)), (x, y)


def _buffers_of(decl: ir.StorageDecl) -> list[ir.SmemBuffer]:
    out, stack = {}, list(decl.persistent) + ([decl.root] if decl.root else []) + list(decl.packed)
    while stack:
        m = stack.pop(0)
        if isinstance(m, ir.SmemBuffer):
            out.setdefault(m.name, m)
        elif isinstance(m, (ir.Struct, ir.Union)):
            stack[:0] = m.members
    return list(out.values())


def packed_variant(k: ir.Kernel) -> ir.Kernel:
    """The same buffers and lifetimes with no layout declared: the packer places them all."""
    decl = ir.StorageDecl(packed=tuple(_buffers_of(k.storage)), loc=k.storage.loc)
    return dataclasses.replace(k, storage=decl)


def _rename_phases(node, names: dict[str, str]):
    if isinstance(node, ir.LiveRange):
        return dataclasses.replace(node, first=names.get(node.first, node.first),
                                   last=names.get(node.last, node.last))
    if isinstance(node, ir.SmemBuffer):
        return dataclasses.replace(node, live=tuple(_rename_phases(r, names) for r in node.live))
    if isinstance(node, (ir.Struct, ir.Union)):
        return dataclasses.replace(node, members=tuple(_rename_phases(m, names)
                                                       for m in node.members))
    return node


def seed_prologue() -> ir.Kernel:
    """The example's storage declaration alone: the seed's SharedStoragePrologue, without the
    kernel's own gemm (so without its phases' dots and its a_smem/b_smem)."""
    (k,) = parse_file(ATTENTION).kernels
    names = {p.name: p.name.replace(".", "_") for p in k.phases}
    decl = k.storage
    decl = dataclasses.replace(
        decl, persistent=tuple(_rename_phases(m, names) for m in decl.persistent),
        root=_rename_phases(decl.root, names))
    phases = tuple(dataclasses.replace(p, name=names[p.name]) for p in k.phases)
    return ir.Kernel("seed_prologue", ir.Arch.SM80, (), (), phases=phases, storage=decl)


SEED_NO_PROLOGUE = """
# SharedStorageNoPrologue of the same kernel, lifetimes as its comments give them.
kernel seed_no_prologue {
  target sm_80
  phases { qk, qk_bias, p_store, dv, dv_epilogue, dov, ds, db, ds_store, dq, dq_epilogue,
           dq_epilogue_last, dk, dk_epilogue, tail }
  storage {
    persistent { di : f32[64] }
    union {
      struct { mm_qk_k : f16[64, 64] live(qk); mm_qk_q : f16[64, 64] live(qk) }
      struct {
        union { bias : f16[64, 64] live(qk_bias); attn : f16[64, 72] live(p_store..ds) }
        zij : f16[64, 72] live(p_store..dv)
        union {
          mm_gradV : f16[64, 64] live(p_store..dv)
          gradV_epilogue : f32[32, 72] live(dv_epilogue)
        }
      }
      struct {
        union {
          struct { attn; mm_doivj : f16[2, 64, 64] live(dov) }
          gradB_epilogue : f32[32, 72] live(db)
        }
      }
      struct {
        tmpT : f16[64, 72] live(ds_store..dk_epilogue)
        tmp : f16[64, 72] live(ds_store..dk_epilogue)
        union {
          mm_gradQ : f16[64, 64] live(dq)
          gradQ_epilogue : f32[32, 72] live(dq_epilogue)
          gradQ_epilogue_lastIter : f32[32, 72] live(dq_epilogue_last)
        }
      }
      struct {
        tmpT
        tmp
        union { mm_gradK : f16[64, 64] live(dk); gradK_epilogue : f32[32, 72] live(dk_epilogue) }
      }
      struct {
        gradK_epilogue_final : f32[32, 72] live(tail)
        gradV_epilogue_final : f32[32, 72] live(tail)
      }
    }
  }
}
"""

GEMM_WITH_STAGING = """
kernel staged {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  gemm mma0 = A @ B accumulate f32 {
    tile 128x128x32  warps 2x2  stages 3
    epilogue { D = acc }
  }
  storage {
    persistent { bias_row : f32[128] }
    union {
      pipeline(mma0)
      struct {
        c_stage : f32[128, 132] live(mma0.epilogue)
        d_stage : f16[128, 136] live(mma0.epilogue)
      }
    }
  }
}
"""

B2B = """
# Two chained gemms' pipelines and the intermediate tile between them, as a B2B kernel has them.
kernel b2b {
  target sm_80
  phases { g0_main, g0_epi, g1_main, g1_epi }
  storage {
    union {
      struct { g0_a : f16[3, 128, 32] live(g0_main); g0_b : f16[3, 32, 64] live(g0_main) }
      struct {
        inter : f16[128, 72] live(g0_epi..g1_main)
        union {
          struct { g1_b : f16[3, 32, 128] live(g1_main) }
          d_stage : f32[128, 132] live(g1_epi)
        }
      }
    }
  }
}
"""


def _lowered(k: ir.Kernel):
    verify(ir.Module((k,)))
    return lower(k).storage


def _layouts():
    yield "seed_prologue", seed_prologue()
    yield "attention_example", parse_file(ATTENTION).kernels[0]
    for text in (SEED_NO_PROLOGUE, GEMM_WITH_STAGING, B2B):
        (k,) = parse(text, "t.kg").kernels
        yield k.name, k


LAYOUTS = list(_layouts())


@pytest.mark.parametrize("name,k", LAYOUTS, ids=[n for n, _ in LAYOUTS])
def test_packing_is_never_worse_than_the_declared_layout(name, k):
    declared = _lowered(k)
    packed = _lowered(packed_variant(k))
    _valid(declared)
    _valid(packed)
    assert {b.name for b in packed.buffers} == {b.name for b in declared.buffers}
    assert not any(b.declared for b in packed.buffers)
    assert packed.peak_bytes <= packed.total_bytes <= declared.total_bytes
    assert declared.packed_bytes <= declared.total_bytes  # what inspect reports beside it


def test_seed_numbers():
    """The seed's explicit union against kgen's packer, on the seed's own lifetimes."""
    seed = _lowered(seed_prologue())
    assert seed.declared_bytes == seed.total_bytes == SEED_PROLOGUE_BYTES
    packed = _lowered(packed_variant(seed_prologue()))
    # The busiest phases (P^T stored, dV) hold di, K_j, P^T, Z, dV's and dO.V^T's operands:
    # 256 + 8192 + 9216 + 9216 + 8192 + 16384 bytes; the packer reaches that bound.
    assert packed.peak_bytes == packed.total_bytes == 51456
    (k,) = parse(SEED_NO_PROLOGUE, "t.kg").kernels
    no_prologue = _lowered(k)
    assert no_prologue.declared_bytes == SEED_NO_PROLOGUE_BYTES
    assert _lowered(packed_variant(k)).total_bytes <= SEED_NO_PROLOGUE_BYTES


def test_attention_example_keeps_the_seed_layout_and_packs_its_gemm_around_it():
    (k,) = parse_file(ATTENTION).kernels
    s = _lowered(k)
    assert s.total_bytes == s.declared_bytes == SEED_PROLOGUE_BYTES
    by_name = {b.name: b for b in s.buffers}
    assert by_name["attn_shared_storage"].offset == by_name["tmp_shared_storage"].offset == 8448
    assert by_name["mm_qk_q"].live_ranges == ((0, 0), (13, 13))
    # The kernel's own operand stages are left to the packer: it finds room for them in bytes
    # the declared layout leaves free during qk.mainloop, so they cost nothing.
    assert not by_name["a_smem"].declared and not by_name["b_smem"].declared
    assert s.packed_bytes == 51456
    _valid(s)


def _random_tree(rng, window, depth, leaves):
    """A random declaration that is valid by construction: a union gives its members disjoint
    time windows, a struct lets them overlap."""
    t0, t1 = window
    roll = rng.random()
    if depth >= 3 or roll < 0.3 or t0 == t1 and roll < 0.65:
        name = f"b{len(leaves)}"
        a = rng.randint(t0, t1)
        z = rng.randint(a, t1)
        size = rng.choice([16, 256, 1024, 1600, 4096, 8192, 9216, 16384])
        align = rng.choice([16, 16, 16, 128, 1024])
        leaves[name] = (size, align, ((a, z),))
        return ir.SmemBuffer(name, ir.DType.F16, (size // 2,), align=align)
    count = rng.randint(2, 4)
    if roll < 0.65:
        def sub():
            a = rng.randint(t0, t1)
            return a, rng.randint(a, t1)
        return ir.Struct(tuple(_random_tree(rng, sub(), depth + 1, leaves) for _ in range(count)))
    count = min(count, t1 - t0 + 1)
    cuts = sorted(rng.sample(range(t0 + 1, t1 + 1), count - 1))
    bounds = [t0, *cuts, t1 + 1]
    return ir.Union(tuple(_random_tree(rng, (bounds[i], bounds[i + 1] - 1), depth + 1, leaves)
                          for i in range(count)))


def test_random_declared_layouts_never_beat_the_packer():
    rng = random.Random(2024)
    better = 0
    for trial in range(300):
        phases = rng.randint(2, 10)
        leaves: dict = {}
        root = ir.Struct((_random_tree(rng, (0, phases - 1), 0, leaves),))
        sized = {n: unions.Sized(n, size, align, ranges)
                 for n, (size, align, ranges) in leaves.items()}
        names = [f"p{i}" for i in range(phases)]
        declared = unions.run(ir.StorageDecl(root=root), sized, {}, [], names)
        declared_end = max(declared.offsets[n] + leaves[n][0] for n in leaves)
        requests = [storage.Request(n, size, align, ranges[0], "random")
                    for n, (size, align, ranges) in leaves.items()]
        packed = storage.pack(requests, phases=phases)
        end = max(b.end for b in packed)
        assert end <= declared_end, (trial, end, declared_end)
        better += end < declared_end
        # First fit in the declared layout's offset order is never worse, by construction.
        order = tuple(sorted(leaves, key=lambda n: declared.offsets[n]))
        assert max(b.end for b in storage.place(
            sorted(requests, key=lambda r: order.index(r.name)))) <= declared_end
        for b in packed:
            assert b.offset % b.align == 0
        for x, y in itertools.combinations(packed, 2):
            assert not (x.shares_bytes(y) and x.co_live(y)), (trial, x, y)
    assert better > 50  # the packer often beats a hand-written union, not just ties it


def test_packing_is_deterministic():
    k = packed_variant(seed_prologue())
    assert _lowered(k).buffers == _lowered(k).buffers


# -- the budget -------------------------------------------------------------------------------


def test_over_budget_lists_the_largest_buffers_user_buffers_included():
    text = """
kernel big {
  target sm_80
  tensor A : f16[M, K] row
  tensor B : f16[K, N] col
  tensor D : f16[M, N] row out
  gemm mma0 = A @ B accumulate f32 {
    tile 128x128x64  warps 2x2  stages 3
    epilogue { D = acc }
  }
  storage {
    lut : f32[16384]
    persistent { table : f32[8192] }
  }
}
"""
    (k,) = parse(text, "t.kg").kernels
    with pytest.raises(KgenError) as info:
        lower(k)
    e = info.value
    assert e.message.startswith("shared memory over budget: 196608 bytes needed, sm_80 allows "
                                "166912; largest buffers: lut 65536 B (user buffer f32[16384]), "
                                "a_smem 49152 B")
    assert "table 32768 B" in e.message
    assert "let buffers that are not live together share bytes" in e.message
    assert e.loc.line == 8  # the stages setting
    # The same buffers fit Hopper's 227 KB.
    assert lower(k, ir.Arch.SM90A).smem_bytes == 196608


def test_storage_only_over_budget_points_at_the_storage_block():
    (k,) = parse("kernel s {\n  target sm_86\n  storage { x : f32[30000] }\n}\n", "t.kg").kernels
    with pytest.raises(KgenError, match="120000 bytes needed, sm_86 allows 101376; largest "
                                        "buffers: x 120000 B") as info:
        lower(k)
    assert info.value.loc.line == 3


# -- the emitted static_asserts hold, and catch a bad layout ---------------------------------

NVCC = shutil.which("nvcc")


def _storage_sources():
    from kgen.api import build, build_file

    yield "attention", build_file(ATTENTION, "sm_80")
    (k,) = parse(GEMM_WITH_STAGING, "t.kg").kernels
    yield "staged", build(k, "sm_80")


def test_static_asserts_cover_every_buffer_and_co_live_pair():
    for _, built in _storage_sources():
        s = built.plan.storage
        src = built.source
        for b in s.buffers:
            assert f"static constexpr int {b.name}_offset = {b.offset};" in src
            assert f"SharedStorage::{b.name}_offset % {b.align} == 0" in src
        pairs = [(x, y) for x, y in itertools.combinations(s.buffers, 2) if x.co_live(y)]
        for x, y in pairs:
            assert f'"{x.name} and {y.name} are live together and must not overlap"' in src
        assert src.count("are live together and must not overlap") == len(pairs)
        assert f"static constexpr int total_bytes = {s.total_bytes};" in src


@pytest.mark.slow
def test_static_asserts_hold_under_nvrtc_and_fail_on_a_bad_offset(tmp_path, monkeypatch):
    pytest.importorskip("cuda.core")
    from kgen.errors import KgenRuntimeError
    from kgen.runtime.nvrtc import compile_cubin

    monkeypatch.setenv("KGEN_CACHE_DIR", str(tmp_path))
    for _, built in _storage_sources():
        result = compile_cubin(built.source, built.plan.name, "sm_80")
        assert result.cubin[:4] == b"\x7fELF"
    # Move zij onto P^T, with which it is live: the static_assert must stop the compile.
    _, built = next(_storage_sources())
    bad = built.source.replace("static constexpr int zij_offset = 17664;",
                               "static constexpr int zij_offset = 8448;")
    assert bad != built.source
    with pytest.raises(KgenRuntimeError, match="attn_shared_storage and zij are live together"):
        compile_cubin(bad, built.plan.name, "sm_80")


@pytest.mark.slow
@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_static_asserts_hold_under_nvcc(tmp_path):
    for name, built in _storage_sources():
        cu = tmp_path / f"{name}.cu"
        cu.write_text(built.source)
        proc = subprocess.run([NVCC, "-std=c++17", "-arch=sm_80", "-c", str(cu), "-o",
                               str(tmp_path / f"{name}.o")], capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
