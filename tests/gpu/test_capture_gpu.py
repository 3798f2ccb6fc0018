"""On a GPU: every kernel captures into `torch.cuda.graph` (which captures on a stream of its
own), through `kgen.load` and through the torch op (its KernelOp, and for the schedules with
workspaces the registered torch.ops op too), and a replay with new inputs matches the
float64 reference with the outputs poisoned first. Covers every example on each target it
plans for, split-K (the builder's at M = 1, and written), stream-K, both reduction modes,
clusters, chains and batches: the workspaces are stream-ordered, so nothing a call does breaks
a capture."""
from __future__ import annotations

import dataclasses
import itertools
from pathlib import Path

import numpy as np
import pytest

from kgen import ir

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
GOLDEN = ROOT / "tests" / "golden"
PAIRS = sorted(tuple(p.name.split(".")[:2]) for p in GOLDEN.glob("*.cu"))
# (KS, NS: the block-scale example's ceil(K / 128) and ceil(N / 128), checked at the launch)
SIZES = {"M": 1000, "N": 520, "K": 136, "L": 3, "KS": 2, "NS": 5}
_names = itertools.count()


def _hopper(arch: str) -> None:
    if arch == "sm_90a" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("sm_90a code runs on compute capability 9.0 only")


def _kernel_of(example: str, arch: str) -> ir.Kernel:
    from kgen.api import build_file

    return build_file(EXAMPLES / f"{example}.kg", arch).kernel


def capture_and_replay(kernel: ir.Kernel, arch: str | None, sizes: dict, via: str,
                       seed: int = 0) -> None:
    import kgen
    from kgen.harness.arrays import TorchArrays
    from kgen.harness.inputs import make_inputs, pick_scalars, shape_of, symbolic_dims
    from kgen.reference import checking_dtype, compare, evaluate

    sizes = {d: sizes[d] for d in symbolic_dims(kernel)}
    loaded = kgen.load(kernel, arch)
    arrays = TorchArrays(0)
    rng = np.random.default_rng(seed)
    host = make_inputs(kernel, sizes, rng)
    scalars = pick_scalars(kernel, None, rng)
    inputs = {name: arrays.upload(value, kernel.param(name)) for name, value in host.items()}
    outputs = [p for p in kernel.params if p.role is ir.Role.OUT]
    if via in ("op", "torch.ops"):  # the KernelOp (eager: the kernel itself), the registered op
        op = kgen.torch_op(loaded, name=f"capture_{kernel.name}_{next(_names)}")
        op = op if via == "op" else op.op
        order = [p.name for p in kernel.params if p.role is ir.Role.IN]
        args = [inputs[name] if name in inputs else scalars[name] for name in order]

        def call():
            result = op(*args)
            return dict(zip([p.name for p in outputs],
                            result if isinstance(result, tuple) else (result,)))
    else:
        given = {p.name: arrays.empty(shape_of(p, sizes), p) for p in outputs}

        def call():
            loaded(**inputs, **scalars, **given)
            return given

    call()  # first call of the signature: compile, check and bind outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        results = call()
    fresh = make_inputs(kernel, sizes, np.random.default_rng(seed + 1))
    for name, value in fresh.items():
        inputs[name].copy_(arrays.upload(value, kernel.param(name)))
    for value in results.values():
        value.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    batches = sizes.get("L")
    reference = evaluate(kernel, fresh, scalars,
                         batches=batches if any(p.batch for p in kernel.params) else None)
    checked = 0
    for param in outputs:
        if param.name not in reference:
            continue
        got = arrays.download(results[param.name], param)
        ref = reference[param.name]
        result = compare(got.reshape(np.shape(ref)), ref, checking_dtype(kernel, param.name))
        assert result.ok, (param.name, result)
        checked += 1
    assert checked, "no output was checked"


@pytest.mark.parametrize("via", ["load", "op"])
@pytest.mark.parametrize("example, arch", PAIRS, ids=[f"{e}-{a}" for e, a in PAIRS])
def test_every_example_captures(example, arch, via):
    _hopper(arch)
    kernel = _kernel_of(example, arch)
    if kernel.loop is not None or kernel.epilogue is not None:
        pytest.skip(f"{example} is a tile program, sized by B, H, S, T: its capture is "
                    "tests/gpu/test_programs_gpu.py's")
    if not kernel.gemms:
        pytest.skip(f"{example} plans storage only: it has no kernel to launch")
    capture_and_replay(kernel, arch, SIZES, via)


def _gemm(text_arch="sm_90a", lines="") -> ir.Kernel:
    from kgen.parse import parse
    from kgen.verify import verify

    module = parse(f"""kernel g {{
  target {text_arch}
  tensor A : bf16[M, K] row
  tensor B : bf16[K, N] col
  tensor D : bf16[M, N] row out
  gemm mma0 = A @ B accumulate f32 {{
    {lines}
    epilogue {{ D = acc }}
  }}
}}
""", "g.kg")
    verify(module)
    return module.kernels[0]


@pytest.mark.parametrize("via", ["load", "op", "torch.ops"])
def test_the_builders_split_k_at_decode_sizes_captures(via):
    """The case that failed: a .kg with no schedule lines at M = 1, where the builder takes
    split-K (a workspace per call)."""
    _hopper("sm_90a")
    from kgen.api import build

    kernel = _gemm()
    sized = build(kernel, "sm_90a", config=_sized(kernel, {"M": 1, "N": 4096, "K": 4096}))
    assert sized.plan.schedule.scheduler.split_k > 1 or sized.plan.schedule.scheduler.stream_k
    capture_and_replay(kernel, "sm_90a", {"M": 1, "N": 4096, "K": 4096}, via)


def _sized(kernel, sizes):
    from kgen.api import sized_config

    return sized_config(kernel, "sm_90a", sizes)


@pytest.mark.parametrize("via", ["load", "op", "torch.ops"])
@pytest.mark.parametrize("case", ["stream-K", "cluster 2x1", "deterministic", "atomic",
                                  "batched deterministic"])
def test_schedules_with_workspaces_and_clusters_capture(case, via):
    _hopper("sm_90a")
    from tests.kernels import gemm_kernel, split_reductions_kernel

    sizes = {"M": 1000, "N": 1000, "K": 4104, "L": 3}
    if case == "stream-K":
        base = gemm_kernel(arch=ir.Arch.SM90A, tile=(128, 128, 64), warps=(2, 4), stages=5)
        g = dataclasses.replace(base.gemms[0], split=ir.SplitK(1, stream=True))
        kernel = dataclasses.replace(base, gemms=(g,), schedule=None)
    elif case == "cluster 2x1":
        base = gemm_kernel(arch=ir.Arch.SM90A, tile=(128, 256, 64), warps=(2, 4), stages=3)
        g = dataclasses.replace(base.gemms[0], cluster=ir.ClusterShape(2, 1))
        kernel = dataclasses.replace(base, gemms=(g,))
    else:
        kernel = split_reductions_kernel(arch="sm_90a", deterministic=case != "atomic",
                                         batched=case.startswith("batched"))
    capture_and_replay(kernel, "sm_90a", sizes, via)


@pytest.mark.parametrize("example", ["splitk_gelu", "splitk_reductions"])
def test_workspaces_without_torch_tensors(example):
    """kgen's own buffers: the workspace comes from cuMemAllocAsync on the launch's stream and
    is freed after the launches are enqueued; called twice, both results match."""
    import kgen
    from kgen.harness.arrays import BufferArrays, sync
    from kgen.harness.inputs import make_inputs, pick_scalars, shape_of, symbolic_dims
    from kgen.reference import checking_dtype, compare, evaluate

    kernel = _kernel_of(example, "sm_80")
    sizes = {d: SIZES[d] for d in symbolic_dims(kernel)}
    loaded = kgen.load(kernel)
    assert loaded.plan.split_kernel
    arrays = BufferArrays(0)
    for seed in (5, 6):
        rng = np.random.default_rng(seed)
        host = make_inputs(kernel, sizes, rng)
        scalars = pick_scalars(kernel, None, rng)
        inputs = {name: arrays.upload(value, kernel.param(name)) for name, value in host.items()}
        outputs = {p.name: arrays.empty(shape_of(p, sizes), p) for p in kernel.params
                   if p.role is ir.Role.OUT}
        loaded(**inputs, **scalars, **outputs)
        sync(0, "the split-K kernel")
        reference = evaluate(kernel, host, scalars)
        for name, ref in reference.items():
            got = arrays.download(outputs[name], kernel.param(name))
            result = compare(got.reshape(np.shape(ref)), ref, checking_dtype(kernel, name))
            assert result.ok, (name, result)
