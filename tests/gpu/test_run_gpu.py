"""On a GPU: every example checked against the reference at several sizes (ragged ones too),
the runtime on its own (a naive hand-written kernel), the Python API on torch tensors,
argument misuse on real tensors, and the benchmark path."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from kgen import ir
from kgen.errors import ArgumentError

pytestmark = pytest.mark.gpu

EXAMPLES = sorted((Path(__file__).resolve().parent.parent.parent / "examples").glob("*.kg"))
SIZES = [(256, 256, 64), (1000, 1000, 1000), (1000, 1000, 40), (4096 + 128, 2048, 256)]


def sizes_of(mnk):
    return dict(zip("MNK", mnk))


def handmade(kernel, **naive):
    from kgen.runtime.launch import CompiledKernel
    from kgen.runtime.nvrtc import compile_cubin, default_arch
    from tests.handmade import naive_source, plan_of

    plan = plan_of(kernel)
    source = naive_source(plan, kernel, **naive)
    result = compile_cubin(source, plan.name, default_arch())
    return plan, source, CompiledKernel(plan, result.cubin, source=source, compiled=result)


def failure_text(report):
    return json.dumps(report.as_dict()["checks"], indent=1)


# -- the examples, through the whole pipeline -----------------------------------------------


@pytest.mark.parametrize("mnk", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_example_matches_reference(example, mnk):
    from kgen.api import build_file
    from kgen.harness.inputs import symbolic_dims
    from kgen.harness.run import run

    built = build_file(example)
    # only the sizes the kernel has: the b2b examples fix every dimension but M
    sizes = {d: v for d, v in sizes_of(mnk).items() if d in symbolic_dims(built.kernel)}
    if built.kernel.packed:  # their offsets vectors: refused by name, the line shown
        from kgen.errors import KgenError

        with pytest.raises(KgenError, match="does not make packed sequences' inputs yet"):
            run(built.kernel, built.plan, built.source, sizes, check=True)
        return
    report = run(built.kernel, built.plan, built.source, sizes, check=True)
    assert report.checks, "no output was checked"
    assert report.ok, failure_text(report)


# -- the runtime alone, with a naive kernel -------------------------------------------------


@pytest.mark.parametrize("use_torch", [True, False], ids=["torch", "devicebuffer"])
@pytest.mark.parametrize("mnk", [(256, 256, 64), (1000, 998, 40), (777, 130, 264)],
                         ids=lambda s: "x".join(map(str, s)))
def test_naive_kernel_passes_the_check(mnk, use_torch):
    from kgen.harness.arrays import torch_usable
    from kgen.harness.run import run
    from tests.handmade import bias_relu_kernel

    if use_torch and not torch_usable():
        pytest.skip("no torch")
    kernel = bias_relu_kernel()
    plan, source, compiled = handmade(kernel)
    report = run(kernel, plan, source, sizes_of(mnk), compiled=compiled,
                 use_torch=use_torch)
    assert report.backend == ("torch" if use_torch else "kgen")
    assert [c.name for c in report.checks] == ["D", "Pre"]
    assert report.ok, failure_text(report)


def test_large_shared_memory_needs_the_attribute():
    """147 KB of dynamic shared memory: only launchable after the opt-in attribute."""
    from kgen.harness.run import run
    from tests.handmade import bias_relu_kernel

    kernel = bias_relu_kernel(tile=(128, 256, 64), warps=(2, 4))
    plan, source, compiled = handmade(kernel)
    assert plan.smem_bytes > 48 * 1024
    report = run(kernel, plan, source, sizes_of((300, 512, 64)), compiled=compiled)
    assert report.ok, failure_text(report)


def test_check_catches_an_unwritten_row():
    from kgen.harness.run import run
    from tests.handmade import rowscale_gelu_kernel

    kernel = rowscale_gelu_kernel()
    plan, source, compiled = handmade(kernel, skip_last_row=True)
    for mnk in [(200, 256, 64), (2000, 256, 64)]:  # all rows checked; a subset of rows
        report = run(kernel, plan, source, sizes_of(mnk), compiled=compiled)
        (check,) = report.checks
        assert not report.ok and check.result.unwritten == mnk[1]


def test_check_catches_a_wrong_value():
    from kgen.harness.run import run
    from tests.handmade import rowscale_gelu_kernel

    kernel = rowscale_gelu_kernel()
    plan, source, _ = handmade(kernel)
    wrong = source.replace("0.70710678118654752f", "0.6f")  # a wrong erf argument
    from kgen.runtime.launch import CompiledKernel
    from kgen.runtime.nvrtc import compile_cubin, default_arch

    result = compile_cubin(wrong, plan.name, default_arch())
    compiled = CompiledKernel(plan, result.cubin, compiled=result)
    report = run(kernel, plan, wrong, sizes_of((256, 256, 64)), compiled=compiled)
    assert not report.ok and report.checks[0].result.bad > 0
    assert report.checks[0].result.unwritten == 0


def test_bench_reports_time_and_torch():
    from kgen.harness.arrays import torch_usable
    from kgen.harness.run import run
    from tests.handmade import bias_relu_kernel

    kernel = bias_relu_kernel()
    plan, source, compiled = handmade(kernel)
    report = run(kernel, plan, source, sizes_of((512, 512, 128)), compiled=compiled,
                 check=False, bench=True, iters=20)
    assert report.timing.median_ms > 0 and report.timing.iters == 20
    assert report.timing.rotate >= 2  # a few MB per set: rotated past L2
    assert report.tflops > 0 and report.gbps > 0
    assert report.flops == 2 * 512 * 512 * 128
    if torch_usable():
        assert report.torch_timing is not None and report.speedup > 0
    json.dumps(report.as_dict())


# -- the Python API --------------------------------------------------------------------------


def test_api_with_torch_tensors():
    torch = pytest.importorskip("torch")
    from tests.handmade import bias_relu_kernel

    plan, _, k = handmade(bias_relu_kernel())
    m, n, kk = 300, 260, 96
    gen = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(m, kk, device="cuda", generator=gen).half() / kk ** 0.5
    b = torch.randn(n, kk, device="cuda", generator=gen).half().t()  # column-major [K, N]
    c = torch.randn(m, n, device="cuda", generator=gen).half()
    bias = torch.randn(n, device="cuda", generator=gen)
    d = torch.full((m, n), float("nan"), device="cuda", dtype=torch.half)
    pre = torch.empty(m, n, device="cuda")
    k(A=a, B=b, C=c, D=d, Pre=pre, bias=bias, beta=0.25)  # alpha defaults to 1.5
    torch.cuda.synchronize()
    acc = a.float() @ b.float()
    want = torch.relu(1.5 * acc + 0.25 * c.float() + bias)
    torch.testing.assert_close(pre, acc, atol=1e-3, rtol=1e-3)
    torch.testing.assert_close(d.float(), want, atol=2e-3, rtol=4e-3)

    stream = torch.cuda.Stream()
    d2 = torch.zeros_like(d)
    with torch.cuda.stream(stream):
        k(stream=stream, A=a, B=b, C=c, D=d2, Pre=pre, bias=bias, beta=0.25)
    stream.synchronize()
    assert torch.equal(d2, d)


def test_api_load_example():
    torch = pytest.importorskip("torch")
    import kgen

    example = next((p for p in EXAMPLES if p.stem == "gemm_bias_relu"), None)
    if example is None:
        pytest.skip("no gemm_bias_relu example")
    k = kgen.load(example)
    m, n, kk = 512, 256, 128
    a = torch.randn(m, kk, device="cuda").half() / kk ** 0.5
    b = torch.randn(n, kk, device="cuda").half().t()
    c = torch.randn(m, n, device="cuda").half()
    bias = torch.randn(n, device="cuda")
    d = torch.empty(m, n, device="cuda", dtype=torch.half)
    k(A=a, B=b, C=c, D=d, bias=bias)  # alpha = 1.5, beta = 0.5 by default
    torch.cuda.synchronize()
    want = torch.relu(1.5 * (a.float() @ b.float()) + 0.5 * c.float() + bias)
    torch.testing.assert_close(d.float(), want, atol=2e-3, rtol=4e-3)


def test_misuse_on_real_tensors():
    torch = pytest.importorskip("torch")
    from tests.handmade import bias_relu_kernel

    _, _, k = handmade(bias_relu_kernel())
    m, n, kk = 64, 64, 64
    good = dict(
        A=torch.randn(m, kk, device="cuda").half(),
        B=torch.randn(n, kk, device="cuda").half().t(),
        C=torch.randn(m, n, device="cuda").half(),
        D=torch.empty(m, n, device="cuda").half(),
        Pre=torch.empty(m, n, device="cuda"),
        bias=torch.randn(n, device="cuda"),
        beta=1.0,
    )
    k.bind(**good)

    def refuse(pattern, **change):
        with pytest.raises(ArgumentError, match=pattern):
            k(**{**good, **change})

    refuse("^A must be f16 but is bf16$", A=good["A"].bfloat16())
    refuse("^A is on the CPU; pass a CUDA tensor$", A=good["A"].cpu())
    refuse("^B must be column-major", B=good["B"].contiguous())
    refuse("^A must be row-major", A=good["A"].t().contiguous().t())
    storage = torch.empty(m * kk + 8, device="cuda", dtype=torch.half)
    # an A one element into its storage runs the narrow entry point, saying why
    shifted = k.bind(**{**good, "A": storage[1:1 + m * kk].view(m, kk)})
    assert shifted.narrow.startswith("A's address") and "is not 16-byte aligned" in shifted.narrow
    refuse(r"^A is \[64, 64\] and B is \[32, 64\]: K differs \(64 vs 32\)",
           B=torch.randn(n, 32, device="cuda").half().t())
    refuse("^missing argument bias", bias=None)


def test_dlpack_and_cuda_array_interface_inputs():
    torch = pytest.importorskip("torch")
    from tests.handmade import bias_relu_kernel

    _, _, k = handmade(bias_relu_kernel())

    class DLPackOnly:
        def __init__(self, tensor):
            self.tensor = tensor

        def __dlpack__(self, stream=None):
            return self.tensor.__dlpack__()

        def __dlpack_device__(self):
            return self.tensor.__dlpack_device__()

    m = n = kk = 64
    a = torch.randn(m, kk, device="cuda").half()
    b = torch.randn(n, kk, device="cuda").half().t()
    c = torch.randn(m, n, device="cuda").half()
    bias = torch.randn(n, device="cuda")
    d = torch.empty(m, n, device="cuda").half()
    pre = torch.empty(m, n, device="cuda")
    k(A=DLPackOnly(a), B=DLPackOnly(b), C=c, D=d, Pre=pre, bias=bias, beta=0.0)
    torch.cuda.synchronize()
    torch.testing.assert_close(pre, a.float() @ b.float(), atol=1e-3, rtol=1e-3)

    cupy = pytest.importorskip("cupy")
    k(A=cupy.asarray(a), B=b, C=c, D=d, Pre=pre, bias=cupy.asarray(bias), beta=0.0)
    torch.cuda.synchronize()
    torch.testing.assert_close(pre, a.float() @ b.float(), atol=1e-3, rtol=1e-3)


def test_device_buffer_round_trip():
    import ml_dtypes

    from kgen.runtime.buffers import DeviceBuffer

    host = np.arange(12, dtype=np.float32).reshape(3, 4).astype(ml_dtypes.bfloat16)
    for layout in ir.Layout:
        buffer = DeviceBuffer.from_host(host, layout=layout)
        assert buffer.to_host().tolist() == host.tolist()
        buffer.fill_bytes(0xFF)
        from cuda.bindings import driver

        driver.cuCtxSynchronize()
        assert np.isnan(buffer.to_host().astype(np.float32)).all()
        buffer.close()


def test_cli_run_json():
    from click.testing import CliRunner

    from kgen.cli import cli

    if not EXAMPLES:
        pytest.skip("no examples")
    gemm = EXAMPLES[0].parent / "gemm.kg"  # (tile programs: tests/gpu/test_programs_gpu.py)
    result = CliRunner().invoke(cli, ["run", str(gemm), "--size", "M=256,N=256,K=64",
                                      "--json", "--bench", "--iters", "20"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output[result.output.index("{"):])
    assert data["ok"] is True and data["time_ms"] > 0


def test_params_struct_mismatch_is_caught_at_load():
    """A plan whose fields disagree with the cubin's parameter (the first pointer missing) is
    refused before any launch."""
    import dataclasses

    from kgen.errors import KgenRuntimeError
    from kgen.runtime.launch import CompiledKernel
    from tests.handmade import bias_relu_kernel

    kernel = bias_relu_kernel()
    plan, _, compiled = handmade(kernel)
    short = dataclasses.replace(plan, fields=plan.fields[1:])
    with pytest.raises(KgenRuntimeError, match="the emitter and plan.fields disagree"):
        CompiledKernel(short, compiled.cubin)
