"""On a GPU: the attention backward's sequence zeroes dQ's f32 accumulator before the main
kernel adds into it (kgen/sequence_zeroing.py), whoever zeroes it: D's row kernel launched just
before the main kernel (by default, GQA too: three launches), or the main kernel's own
`_zero` launch (deterministic mode, whose semaphores it zeroes with it). The workspace is
poisoned with NaN and the sequence launched twice (the second launch finds the first one's
sums in the accumulator), by kgen's runtime and by the .cu's own launcher built with nvcc; dQ,
dK and dV against float64."""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")


def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def _built(gqa: bool, deterministic: bool):
    from kgen.attention import _arch
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.sequence import build_sequence

    sig = BackwardSignature("bf16", 64, True, _arch(torch.device("cuda")), gqa=gqa,
                            deterministic=deterministic)
    module = backward_module(sig)
    built = build_sequence(module, module.sequences[0], sig.arch)
    (zeroing,) = built.zeroing
    assert zeroing.folded is not deterministic, zeroing.why
    return built


def _problem(h: int, hkv: int, s: int = 77, t: int = 130, d: int = 64):
    """Inputs (b 1) and float64 dQ, dK, dV of causal (top-left) attention, K and V of `hkv`
    heads (each serving h / hkv query heads)."""
    gen = torch.Generator(device="cuda").manual_seed(5)
    q, do = (torch.randn(1, h, s, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(1, hkv, t, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    scale = 1 / math.sqrt(d)
    q64, do64 = q.double(), do.double()
    k64, v64 = (x.double().repeat_interleave(h // hkv, 1) for x in (k, v))
    scores = (q64 @ k64.transpose(-1, -2)) * scale
    keep = torch.arange(t, device="cuda")[None, :] <= torch.arange(s, device="cuda")[:, None]
    scores = scores.masked_fill(~keep, -math.inf)
    lse = torch.logsumexp(scores, -1)
    p = torch.exp(scores - lse[..., None])
    o = (p @ v64).bfloat16()
    dp = do64 @ v64.transpose(-1, -2)
    ds = p * (dp - (do64 * o.double()).sum(-1, keepdim=True))
    group = h // hkv
    dk = (ds.transpose(-1, -2) @ q64 * scale).unflatten(1, (hkv, group)).sum(2)
    dv = (p.transpose(-1, -2) @ do64).unflatten(1, (hkv, group)).sum(2)
    inputs = {"dO": do, "O": o, "Q": q, "K": k, "V": v, "lse": lse.float(), "scale": scale}
    return inputs, {"dQ": ds @ k64 * scale, "dK": dk, "dV": dv}


def _check(found: dict, ref: dict) -> None:
    for name, r in ref.items():
        x = found[name].double()
        assert torch.isfinite(x).all(), f"{name}: not finite"
        err = float((x - r).abs().max() / max(1.0, float(r.abs().max())))
        assert err < 3e-2, f"{name}: max error {err:.3g}"


@pytest.mark.parametrize("gqa, deterministic", [(False, False), (True, False), (False, True)])
def test_the_runtime_zeroes_dqacc_before_the_adds(gqa, deterministic):
    _cuda()
    from kgen.sequence import load_built_sequence

    seq = load_built_sequence(_built(gqa, deterministic))
    h, hkv = (4, 2) if gqa else (2, 2)
    inputs, ref = _problem(h, hkv)
    s, t, d = 77, 130, 64

    def poisoned(*shape, dtype=torch.float32):
        return torch.full(shape, float("nan"), dtype=dtype, device="cuda")

    values = dict(inputs, D=poisoned(1, h, s), dQacc=poisoned(1, h, s, d),
                  dQ=poisoned(1, h, s, d, dtype=torch.bfloat16),
                  dK=poisoned(1, hkv, t, d, dtype=torch.bfloat16),
                  dV=poisoned(1, hkv, t, d, dtype=torch.bfloat16))
    raw = torch.cuda.current_stream().cuda_stream
    for _ in range(2):  # the second launch finds dQacc holding the first one's sums
        seq._launch(raw, values)
        torch.cuda.synchronize()
        _check(values, ref)


def _wrapper(built) -> str:
    """C++ that fills the sequence's params struct from an array of 64-bit values (pointers
    and strides in the struct's order), the scale and the sizes, then launches the sequence
    twice on a workspace poisoned with NaN (0xff bytes)."""
    from kgen.sequence_cpp import launcher_values

    values = launcher_values(built.info, built.plans, built.zeroing)
    lines, index = [], 0
    for m in values["members"]:
        if m["ctype"] == "float":
            lines.append(f"  p.{m['name']} = scale;")
            continue
        lines.append(f"  p.{m['name']} = ({m['ctype']})v[{index}];")
        index += 1
    sizes = "\n".join(f"  p.sizes.{d} = sizes[{i}];" for i, d in enumerate(values["dims"]))
    name = built.name
    return (f'#include "seq.cu"\n'
            f'extern "C" int run(const long long* v, float scale, const int* sizes) {{\n'
            f"  {name}_params p{{}};\n" + "\n".join(lines) + "\n" + sizes + "\n"
            f"  const size_t bytes = {name}_workspace_bytes(p);\n"
            "  void* workspace = nullptr;\n"
            "  cudaError_t error = cudaMalloc(&workspace, bytes > 0 ? bytes : 1);\n"
            "  if (error == cudaSuccess) error = cudaMemset(workspace, 0xff, bytes);\n"
            "  for (int i = 0; i < 2 && error == cudaSuccess; ++i) {\n"
            f"    error = {name}_launch(p, workspace, nullptr);\n"
            "    if (error == cudaSuccess) error = cudaDeviceSynchronize();\n"
            "  }\n"
            "  cudaFree(workspace);\n"
            "  return static_cast<int>(error);\n"
            "}\n")


@pytest.mark.parametrize("deterministic", [False, True])
def test_the_nvcc_launcher_zeroes_dqacc_before_the_adds(tmp_path, deterministic):
    _cuda()
    from kgen.sequence_cpp import launcher_values

    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    built = _built(False, deterministic)
    (tmp_path / "seq.cu").write_text(built.source)
    (tmp_path / "wrap.cu").write_text(_wrapper(built))
    major, minor = torch.cuda.get_device_capability()
    target = "sm_90a" if built.arch.value == "sm_90a" else f"sm_{major}{minor}"
    done = subprocess.run(["nvcc", "-std=c++17", f"-arch={target}", "-shared",
                           "-Xcompiler", "-fPIC", "wrap.cu", "-o", "libseq.so"],
                          cwd=tmp_path, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    run = ctypes.CDLL(str(tmp_path / "libseq.so")).run
    run.argtypes, run.restype = [ctypes.c_void_p, ctypes.c_float, ctypes.c_void_p], ctypes.c_int
    h, s, t, d = 2, 77, 130, 64
    inputs, ref = _problem(h, h)
    outputs = {"dK": torch.full((1, h, t, d), float("nan"), device="cuda").bfloat16(),
               "dV": torch.full((1, h, t, d), float("nan"), device="cuda").bfloat16(),
               "dQ": torch.full((1, h, s, d), float("nan"), device="cuda").bfloat16()}
    given = dict(inputs, **outputs)
    words = []  # the struct's members but the scale, in order: addresses and strides
    for m in launcher_values(built.info, built.plans, built.zeroing)["members"]:
        if m["ctype"] == "float":
            continue
        name = m["name"]
        if name in given:
            words.append(given[name].data_ptr())
            continue
        base, suffix = name[:name.rindex("_")], name[name.rindex("_"):]
        axis = {"_bs": 0, "_hs": 1, "_ld": 2}[suffix]
        words.append(given[base].stride(axis))
    torch.cuda.synchronize()
    array = (ctypes.c_longlong * len(words))(*words)
    sizes = (ctypes.c_int * 4)(1, h, s, t)
    assert [d for d in built.info.dims] == ["B", "H", "S", "T"]
    error = run(array, inputs["scale"], sizes)
    assert error == 0, f"cudaError {error}"
    _check(outputs, ref)
