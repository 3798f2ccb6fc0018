"""NVRTC on the CPU: cubins for sm_80 and sm_90a, the ptxas report, failures, the cache."""
from __future__ import annotations

import pytest

from kgen.errors import KgenRuntimeError
from kgen.runtime.nvrtc import compile_cubin, nvrtc_version, parse_ptxas_report

SCALE = r"""
#include <cuda_fp16.h>
#include <cuda_bf16.h>
struct scale_params { const __half* x; __nv_bfloat16* y; int n; long long ld; float alpha; };
extern "C" __global__ void __launch_bounds__(128, 1)
scale(const __grid_constant__ scale_params p) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < p.n) p.y[i] = __float2bfloat16_rn(p.alpha * __half2float(p.x[i]));
}
"""

REPORT = """\
ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'helper_kernel' for 'sm_90a'
ptxas info    : Function properties for helper_kernel
ptxas         .     8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 392 bytes cmem[0]
ptxas info    : Compiling entry function 'main_kernel' for 'sm_90a'
ptxas info    : Function properties for main_kernel
ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 168 registers, used 1 barriers, 400 bytes cmem[0]
ptxas info    : Compile time = 22.1 ms
"""


def test_nvrtc_version_is_major_minor():
    major, minor = nvrtc_version().split(".")
    assert int(major) >= 12 and int(minor) >= 0


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_compile_for_arch(cache_dir, arch):
    result = compile_cubin(SCALE, "scale", arch)
    assert result.cubin[:4] == b"\x7fELF"
    assert not result.cached
    assert result.arch == arch and result.name == "scale"
    assert isinstance(result.registers, int) and 4 <= result.registers <= 64
    assert result.spill_stores == 0 and result.spill_loads == 0 and result.stack_bytes == 0
    assert f"for '{arch}'" in result.log
    assert "\x00" not in result.log

    again = compile_cubin(SCALE, "scale", arch)
    assert again.cached and again.cubin == result.cubin
    assert again.registers == result.registers
    assert again.seconds < result.seconds


def test_arch_and_options_change_the_cubin_key(cache_dir):
    first = compile_cubin(SCALE, "scale", "sm_80")
    other = compile_cubin(SCALE, "scale", "sm_80", extra_options={"max_register_count": 32})
    assert not other.cached
    assert compile_cubin(SCALE, "scale", "sm_90a").cubin != first.cubin


def test_parse_ptxas_report_picks_the_named_entry():
    assert parse_ptxas_report(REPORT, "main_kernel") == {
        "registers": 168, "stack_bytes": 0, "spill_stores": 0, "spill_loads": 0}
    helper = parse_ptxas_report(REPORT, "helper_kernel")
    assert helper == {"registers": 40, "stack_bytes": 8, "spill_stores": 4, "spill_loads": 12}
    assert parse_ptxas_report(REPORT) == helper  # no name: the first entry
    assert parse_ptxas_report("") == {}


def test_failure_carries_log_and_saved_source(cache_dir):
    bad = SCALE.replace("p.alpha", "p.alphaz")
    with pytest.raises(KgenRuntimeError) as info:
        compile_cubin(bad, "scale", "sm_80")
    message = str(info.value)
    assert 'has no member "alphaz"' in message
    assert "scale.cu(" in message  # NVRTC names the source after the kernel
    saved = message.rsplit("the source is saved at ", 1)[1].strip()
    assert saved.startswith(str(cache_dir / "failed"))
    with open(saved) as handle:
        assert handle.read() == bad


def test_bad_arch_is_refused(cache_dir):
    with pytest.raises(KgenRuntimeError, match="not an NVRTC arch"):
        compile_cubin(SCALE, "scale", "hopper")


def test_resources_reported_on_every_real_compile(cache_dir, monkeypatch):
    """NVRTC 13's own in-process cache drops ptxas' report on a repeat; kgen turns it off."""
    monkeypatch.setenv("KGEN_CACHE", "0")
    reports = [compile_cubin(SCALE, "scale", "sm_80") for _ in range(3)]
    assert all(not r.cached and r.registers for r in reports)
    assert len({r.registers for r in reports}) == 1


@pytest.mark.slow
@pytest.mark.parametrize("example, arch", [("gemm_bias_relu", "sm_90a"), ("gemm", "sm_80")])
def test_the_fast_entry_point_compiles_alone(cache_dir, example, arch):
    """FAST_ENTRY_ONLY leaves the narrow entry point out of an NVRTC compile (the runtime
    compiles it on the first launch that needs it); without it the module holds both."""
    from pathlib import Path

    from kgen.api import build_file
    from kgen.runtime.nvrtc import fast_entry_options

    built = build_file(Path(__file__).resolve().parents[2] / "examples" / f"{example}.kg", arch)
    plan = built.plan
    fast = compile_cubin(built.source, plan.name, arch,
                         extra_options=fast_entry_options(plan.narrow_kernel))
    assert parse_ptxas_report(fast.log, plan.name).get("registers")
    assert f"'{plan.narrow_kernel}'" not in fast.log
    whole = compile_cubin(built.source, plan.name, arch)
    assert parse_ptxas_report(whole.log, plan.narrow_kernel).get("registers")
    assert fast.cubin != whole.cubin
    assert fast_entry_options(None) == {}
