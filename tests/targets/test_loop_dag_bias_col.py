"""The sm_90a backward's column-major bias (kgen/attention_grad_mods.py `bias_layout`: BiasT
declared `col`, the forward's attn_mask seen transposed): staged by the copy engine as its memory
lies (kgen/targets/sm90/loop_dag_schedule.py `_bias`: boxes of [block][64 keys]), the tensor map
in its memory's order, each consumer warp's share read by ldmatrix .trans
(templates/sm90/loop_staged_tile.inc.j2 `load_staged_trans`). The emitted reader's addresses are
checked on the CPU: its C++ compiled by the host compiler, each lane's ldmatrix address recorded,
then ldmatrix's (and .trans's) delivery emulated over the copy engine's 128-byte swizzle; the
row-major reader (run on an H200) through the same model first."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from kgen.attention_grad import BackwardSignature, backward_module, backward_text
from kgen.attention_grad_mods import Mods, bias_layout
from kgen.sequence import build_sequence

GXX = shutil.which("g++") or shutil.which("c++")
BIAS = Mods(bias="tensor")
GRAD = Mods(bias="tensor", bias_grad=True)


def _built(d: int, causal: bool = False, mods: Mods = BIAS, layout: str | None = None,
           arch: str = "sm_90a"):
    """The main kernel's plan and the sequence's source; `layout` rewrites BiasT's declared
    layout (the program as kgen.attention writes it for `arch` when None)."""
    from kgen.parse import parse
    from kgen.verify import verify

    sig = BackwardSignature("bf16", d, causal, arch, mods=mods)
    module = backward_module(sig)
    if layout is not None:
        declared = f"tensor BiasT : bf16[B, H, T, S] {bias_layout(sig)}"
        text = backward_text(sig)
        assert declared in text
        module = parse(text.replace(declared, f"tensor BiasT : bf16[B, H, T, S] {layout}"),
                       "bwd.kg")
        verify(module)
    built = build_sequence(module, module.sequences[0], arch)
    (plan,) = [p for p in built.plans if p.name.endswith("_main")]
    return plan, built.source


@pytest.mark.parametrize("arch, options, layout", [
    ("sm_90a", dict(d=64), "col"), ("sm_90a", dict(d=128), "col"),
    ("sm_90a", dict(d=128, d_v=64), "col"), ("sm_80", dict(d=64), "row"),
    ("sm_90a", dict(d=64, gqa=True), "row"),  # GQA: read per element (not staged)
    ("sm_90a", dict(d=256), "row"),  # the split layout: likewise
    ("sm_90a", dict(d=32), "row")])  # the mma.sync skeleton
def test_the_layout_is_decided_per_target(arch, options, layout):
    d = options.pop("d")
    sig = BackwardSignature("bf16", d, False, arch, mods=BIAS, **options)
    assert bias_layout(sig) == layout
    assert f"tensor BiasT : bf16[B, H, T, S] {layout}" in backward_text(sig)


def test_the_gradient_s_store_stays_row_major():
    # the gradient's tile store stays row-major either way
    assert "tensor dBiasT : bf16[B, H, T, S] row out" in backward_text(
        BackwardSignature("bf16", 64, False, "sm_90a", mods=GRAD))


@pytest.mark.parametrize("d, slots", [(64, 2), (128, 1)])
def test_a_column_major_bias_is_staged_as_its_memory_lies(d, slots):
    plan, source = _built(d)
    w = plan.wgmma
    # the slot: boxes of [block][64 keys], as many bytes as the row-major [128][64] boxes
    assert (w.bias.param, w.bias.rows, w.bias.boxes, w.bias.slots) == ("BiasT", 64, 2, slots)
    assert w.bias.slot_bytes == 128 * 64 * 2
    (bias_map,) = [m for m in w.maps if m.param == "BiasT"]
    assert (bias_map.box_rows, bias_map.boxes) == (64, 2)
    assert w.staging.value.startswith("BiasT's [128, 64] tile per block by the copy engine "
                                      "(column-major: boxes of [64][64] rows, read by "
                                      "ldmatrix .trans)")
    assert "no transposed copy" in w.staging.why
    assert "load_staged_trans(staged, smem_address(smem.t_smem)" in source
    assert "load_staged(" not in source and "g_BiasT[" not in source
    # the producer's boxes at (keys row0 + 64 box, queries kv0); the map in memory order
    assert "row0 + box * 64, kv0, BiasT_head, BiasT_batch);" in source
    assert "const cuuint64_t dims[4] = {rows, cols,  // column-major: its memory" in source


def test_kgen_inspect_shows_the_staged_column_major_bias(tmp_path):
    import json

    from click.testing import CliRunner

    from kgen.cli import cli

    path = tmp_path / "bwd.kg"
    text = backward_text(BackwardSignature("bf16", 64, True, "sm_90a", mods=GRAD))
    start = text.index("kernel ", 1)  # the main kernel
    path.write_text(text[start:text.index("kernel ", start + 1)])
    result = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert result.exit_code == 0, result.output
    (kernel,) = json.loads(result.output)["kernels"]
    w = kernel["wgmma"]
    assert "(column-major: boxes of [64][64] rows, read by ldmatrix .trans)" in \
        w["staging"]["value"]
    assert {"param": "BiasT", "box": [64, 64], "boxes": 2} in w["tensor_maps"]
    table = CliRunner().invoke(cli, ["inspect", str(path)])
    assert "ldmatrix .trans" in table.output


def test_the_per_element_read_honours_the_layout():
    """Where the bias is read per element (the mma.sync skeleton; sm_90a's with GQA), a
    column-major BiasT's element (row, col) lies at col * ld + row."""
    _, source = _built(64, arch="sm_80", layout="col")
    assert "g_BiasT[col * p.BiasT_ld + row]" in source
    _, source = _built(64, arch="sm_80")
    assert "g_BiasT[row * p.BiasT_ld + col]" in source


@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
def test_the_forward_loop_reads_a_column_major_bias_per_element(arch):
    """The verifier takes a column-major tensor at (row, col) in a loop's score gemm (the
    forward's too); the forward's sm_90a staging refuses it (its copy engine boxes take rows of
    columns), so both skeletons read it per element at col * ld + row."""
    from kgen.api import build_verified
    from kgen.attention import Signature, program_text
    from kgen.parse import parse
    from kgen.verify import verify

    text = program_text(Signature("bf16", 64, 64, False, None, None, (), arch, True))
    assert "tensor Bias : bf16[B, H, S, T] row" in text
    module = parse(text.replace("bf16[B, H, S, T] row", "bf16[B, H, S, T] col"), "fwd.kg")
    verify(module)
    built = build_verified(module.kernels[0], arch)
    assert "g_Bias[col * p.Bias_ld + row]" in built.source
    if arch == "sm_90a":
        assert built.plan.wgmma.staging.why == ("not staged: Bias is column-major: the copy "
                                                "engine's boxes take rows of columns")


# ---------------------------------------------------------------------------------------------
# The readers' addresses, emulated


def _reader(source: str, name: str) -> str:
    """The emitted reader `name` as host C++: its constants, and each ldmatrix replaced by a
    record of this lane's address (the call's index in order)."""
    consts = [re.search(rf"constexpr [a-z ]+{c} = [^;]+;", source).group(0)
              for c in ("kTileM", "kBlock", "kBlockN8", "k_t_smem_box_bytes")]
    head = source.index(f"__device__ __forceinline__ void {name}(")
    body = source[head:source.index("\n}\n", head) + 3]
    body = body.replace("__device__ __forceinline__ ", "")
    asm = re.compile(r'asm volatile\("(ldmatrix[^ "]*)[^"]*"\s*:[^:]*:\s*"r"\(address\)\);')
    (instruction,) = asm.findall(body)
    trans = name.endswith("_trans")
    assert instruction == f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16"
    body = asm.sub("record(address);", body).replace("#pragma unroll\n", "")
    return "\n".join(["#include <cstdio>", *consts, "static unsigned calls[64]; static int n_calls;",
                      "static void record(unsigned address) { calls[n_calls++] = address; }",
                      body])


def _addresses(tmp_path, source: str, name: str) -> dict:
    """{(warp_row0, lane): [address of each ldmatrix call]} from the compiled reader."""
    main = ("int main() {\n"
            "  for (int w0 = 0; w0 < kTileM; w0 += 16)\n"
            "    for (int lane = 0; lane < 32; ++lane) {\n"
            "      unsigned out[kBlockN8][2];\n"
            "      n_calls = 0;\n"
            f"      {name}(out, 0, w0, lane);\n"
            "      std::printf(\"%d %d\", w0, lane);\n"
            "      for (int i = 0; i < n_calls; ++i) std::printf(\" %u\", calls[i]);\n"
            "      std::printf(\"\\n\");\n"
            "    }\n}\n")
    cpp = tmp_path / f"{name}.cpp"
    cpp.write_text(_reader(source, name) + main)
    exe = tmp_path / name
    subprocess.run([GXX, "-std=c++17", "-O0", "-o", str(exe), str(cpp)], check=True)
    found = {}
    for line in subprocess.run([str(exe)], check=True, capture_output=True,
                               text=True).stdout.splitlines():
        w0, lane, *calls = (int(x) for x in line.split())
        found[(w0, lane)] = calls
    return found


def _swizzled(outer: int, inner: int) -> int:
    """The byte offset in a box (1024-byte aligned, 128-byte rows) where the copy engine's
    128-byte swizzle puts the 16-bit element at row `outer`, column `inner` (0..63): 16-byte
    chunk k of row r at chunk k ^ (r % 8)."""
    byte = 2 * inner
    return outer * 128 + (((byte // 16) ^ (outer % 8)) * 16) + byte % 16


def _slot(tile_m: int, block: int, box_bytes: int, col: bool) -> dict:
    """{byte offset in the slot: (row, col) of the tile} as the copy engine lays it: row-major
    boxes of [tile_m rows][64 cols]; column-major ones of [block cols][64 rows]."""
    at = {}
    for r in range(tile_m):
        for c in range(block):
            if col:
                at[(r // 64) * box_bytes + _swizzled(c, r % 64)] = (r, c)
            else:
                at[(c // 64) * box_bytes + _swizzled(r, c % 64)] = (r, c)
    return at


def _delivered(addresses: dict, w0: int, at: dict, trans: bool) -> dict:
    """{(lane, register i of call q): (element low, element high)}: ldmatrix.x4 (.trans) of the
    warp's recorded addresses. Matrix i's row rr is lane 8i + rr's 16 bytes; thread t receives
    row t / 4, columns 2 (t % 4), + 1 of each matrix (of its transpose with .trans)."""
    calls = len(addresses[(w0, 0)])
    got = {}
    for q in range(calls):
        for i in range(4):
            rows = [addresses[(w0, 8 * i + rr)][q] for rr in range(8)]
            for t in range(32):
                if trans:
                    pair = tuple(at[rows[2 * (t % 4) + e] + 2 * (t // 4)] for e in (0, 1))
                else:
                    pair = tuple(at[rows[t // 4] + 2 * (2 * (t % 4) + e)] for e in (0, 1))
                got[(t, q, i)] = pair
    return got


@pytest.mark.skipif(GXX is None, reason="needs a C++ compiler on PATH")
@pytest.mark.parametrize("layout", ["row", "col"])
def test_each_thread_receives_its_accumulator_fragment(tmp_path, layout):
    """Every lane of every warp (rows w0 .. w0 + 15 of the tile) receives, in out[j][h], the
    pair at row w0 + 8h + lane / 4, columns 8j + 2 (lane % 4) and + 1: the accumulator's
    fragment. The row-major reader (checked on the GPU) first: the model's own check."""
    plan, source = _built(64, layout=layout)
    w = plan.wgmma
    name = "load_staged_trans" if layout == "col" else "load_staged"
    addresses = _addresses(tmp_path, source, name)
    tile_m, block = 128, w.score_n
    at = _slot(tile_m, block, w.bias.box_bytes, layout == "col")
    assert len(at) == tile_m * block and max(at) < w.bias.slot_bytes
    for w0 in range(0, tile_m, 16):
        got = _delivered(addresses, w0, at, layout == "col")
        for lane in range(32):
            for j in range(block // 8):
                for h in range(2):
                    q, i = j // 2, 2 * (j % 2) + h  # out[2q][0], [2q][1], [2q + 1][0], [2q + 1][1]
                    row, col = w0 + 8 * h + lane // 4, 8 * j + 2 * (lane % 4)
                    assert got[(lane, q, i)] == ((row, col), (row, col + 1)), (w0, lane, j, h)


def test_the_runtime_maps_a_column_major_bias_in_its_memory_s_order(monkeypatch):
    """kgen.attention's view (attn_mask [S, T] seen transposed, its rows padded from 45 to 48
    keys, shared by every batch and head) binds as BiasT [T, S] column-major (ld 48, the head
    and batch strides 0), and kgen/runtime/program.py `encode_maps` maps it in its memory's
    order: dims (T, S, 1, 1), the row pitch 96 bytes, boxes of [64 queries][64 keys]; zeros
    past T and S by the extents."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("cuda.bindings")
    from kgen.attention_grad_mods import bias_t
    from kgen.enums import DType
    from kgen.runtime import tma
    from kgen.runtime.program import bind_program, encode_maps
    from kgen.runtime.tensors import DeviceArray

    plan, _ = _built(64)
    b, h, s, t, d = 2, 4, 37, 45, 64
    q, k = torch.zeros(b, h, s, d), torch.zeros(b, h, t, d)
    view = bias_t(torch.randn(s, t).bfloat16(), q.bfloat16(), k.bfloat16(), "col")
    assert view.stride() == (0, 0, 1, 48)
    rows = torch.zeros(b, h, s)
    like = {"Q": q, "K": k, "V": k, "dO": q, "lse": rows, "D": rows, "BiasT": view,
            "dQacc": q, "dK": k, "dV": k}
    args = {name: DeviceArray(1 << 20, tuple(x.shape), tuple(x.stride()),
                              DType.F32 if name in ("lse", "D", "dQacc") else DType.BF16, 0)
            for name, x in like.items()}
    bound = bind_program(plan, dict(args, scale=0.125))
    values = dict(zip([f.name for f in plan.fields], bound.values))
    assert (values["BiasT_ld"], values["BiasT_hs"], values["BiasT_bs"]) == (48, 0, 0)
    calls = []
    monkeypatch.setattr(tma, "encode_tiled", lambda dtype, address, dims, pitches, box, l2: (
        calls.append((dims, pitches, box)) or bytes(tma.MAP_BYTES)))
    encode_maps(plan, values, bound.sizes)
    found = dict(zip([m.param for m in plan.wgmma.tensor_maps], calls))
    assert found["BiasT"] == ([45, 37, 1, 1], [96, 96 * 37, 96 * 37], [64, 64, 1, 1])
    assert found["Q"][0] == [64, 37, 4, 2]  # row-major: (columns, rows, heads, batches)
