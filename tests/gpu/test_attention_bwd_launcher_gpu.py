"""On a GPU: the attention backward's own launcher (the .cu built by nvcc into a shared library,
called through ctypes with the params struct kgen's runtime packs): dQ, poisoned with NaN, is
zeroed by the launcher before the main kernel adds into it, call after call; dK and dV equal
the runtime's bit for bit, dQ to the order of its atomic adds. The sm_80 build (mma.sync) and,
on a Hopper GPU, the sm_90a build (the wgmma skeleton: the launcher encodes the copy engine's
maps, dQ's f32 one for its tensor reduce-adds among them)."""
from __future__ import annotations

import ctypes
import math
import shutil
import subprocess
from pathlib import Path

import pytest

from kgen.api import build_file, load_built
from kgen.runtime.launch import params_struct
from kgen.runtime.program import bind_program

pytestmark = pytest.mark.gpu

PROGRAM = Path(__file__).resolve().parents[2] / "examples" / "attention_bwd.kg"
WRAPPER = """#include "k.cu"
// The launcher on the default stream, then a synchronize: its error, or the kernels'
extern "C" int launch_attention_bwd(const void* params) {
  cudaError_t error = attention_bwd_launch(*static_cast<const attention_bwd_params*>(params), nullptr);
  if (error == cudaSuccess) error = cudaDeviceSynchronize();
  return static_cast<int>(error);
}
"""


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_the_nvcc_launcher_zeroes_dq_and_matches_the_runtime(tmp_path, arch):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    if shutil.which("nvcc") is None:
        pytest.skip("needs nvcc")
    from tests.gpu.attention_bwd_checks import reference

    if arch == "sm_90a":
        if torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("sm_90a code runs on compute capability 9.0 only")
        from kgen import ir
        from kgen.api import build_verified
        from kgen.parse import parse

        module = parse(PROGRAM.read_text().replace("    tile 128x32\n", ""), "attention_bwd.kg")
        built = build_verified(module.kernels[0], ir.Arch.SM90A)
        assert built.plan.wgmma is not None and built.plan.wgmma.add_map is not None
    else:
        built = build_file(PROGRAM)
    (tmp_path / "k.cu").write_text(built.source)
    (tmp_path / "wrap.cu").write_text(WRAPPER)
    major, minor = torch.cuda.get_device_capability()
    library = tmp_path / "libbwd.so"
    target = "sm_90a" if arch == "sm_90a" else f"sm_{major}{minor}"
    build = subprocess.run(["nvcc", "-std=c++17", f"-arch={target}", "-shared",
                            "-Xcompiler", "-fPIC", "-o", str(library), str(tmp_path / "wrap.cu")],
                           capture_output=True, text=True, cwd=tmp_path)
    assert build.returncode == 0, build.stderr
    launch = ctypes.CDLL(str(library)).launch_attention_bwd
    launch.argtypes, launch.restype = [ctypes.c_void_p], ctypes.c_int

    b, h, s, t, d = 2, 3, 1000, 777, 128
    gen = torch.Generator(device="cuda").manual_seed(7)
    q, do = (torch.randn(b, h, s, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    k, v = (torch.randn(b, h, t, d, device="cuda", generator=gen).bfloat16() for _ in range(2))
    scale = 1.0 / math.sqrt(d)
    _, _, _, lse, dd = reference(q, k, v, do, scale, "top_left")
    inputs = dict(Q=q, K=k, V=v, dO=do, lse=lse.float(), D=dd.float())

    kernel = load_built(built)
    dq, dk, dv = kernel(**inputs, scale=scale)
    torch.cuda.synchronize()

    outputs = dict(dQ=torch.full_like(dq, math.nan), dK=torch.full_like(dk, math.nan),
                   dV=torch.full_like(dv, math.nan))
    bound = bind_program(built.plan, {**inputs, **outputs})
    values = dict(zip([f.name for f in built.plan.fields], bound.values))
    values["scale"] = scale
    params = params_struct(built.plan)(**values)
    for _ in range(2):  # the second call adds into the first's dQ: zeroed again first
        assert launch(ctypes.addressof(params)) == 0
        assert not torch.isnan(outputs["dQ"]).any()
        assert torch.equal(outputs["dK"], dk) and torch.equal(outputs["dV"], dv)
        error = (outputs["dQ"] - dq).abs().max().item()
        assert error <= 1e-5 * dq.abs().max().item(), error
