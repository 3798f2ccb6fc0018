"""Argument checks before a launch, on fake GPU arrays (no GPU needed): every misuse is an
ArgumentError that names the argument; good arguments become the params-struct values."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("kgen.lower")

from kgen import ir  # noqa: E402
from kgen.errors import ArgumentError, KgenRuntimeError  # noqa: E402
from kgen.runtime.launch import bind_arguments, params_struct  # noqa: E402
from kgen.runtime.nvrtc import compile_cubin  # noqa: E402
from kgen.runtime.tensors import as_device_array  # noqa: E402
from tests.handmade import (  # noqa: E402
    bias_relu_kernel,
    layout_asserts,
    naive_source,
    offsetof_compiles,
    plan_of,
)

BASE = 0x7F00_0000_0000
_next = [0]


class Fake:
    """A GPU array as CuPy would describe it: __cuda_array_interface__ only."""

    def __init__(self, shape, typestr="<f2", strides=None, ptr=None, byte_strides=None):
        if ptr is None:
            _next[0] += 1
            ptr = BASE + _next[0] * 0x100_0000
        itemsize = np.dtype(typestr).itemsize
        if strides is not None:
            byte_strides = tuple(s * itemsize for s in strides)
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False),
            "strides": byte_strides, "version": 3,
        }

    @property
    def ptr(self):
        return self.__cuda_array_interface__["data"][0]


M, N, K = 1000, 512, 64


def good_args(**changes):
    args = dict(
        A=Fake((M, K)),
        B=Fake((K, N), strides=(1, K)),  # column-major
        C=Fake((M, N)),
        D=Fake((M, N)),
        Pre=Fake((M, N), "<f4"),
        bias=Fake((N,), "<f4"),
        beta=0.5,
    )
    args.update(changes)
    return args


@pytest.fixture(scope="module")
def plan():
    return plan_of(bias_relu_kernel())


def bind(plan, device_id=None, device_of=None, sizes=None, **changes):
    return bind_arguments(plan, good_args(**changes), sizes=sizes, device_id=device_id,
                          device_of=device_of or (lambda ptr: None))


def test_good_arguments_fill_the_struct(plan):
    args = good_args()
    bound = bind_arguments(plan, args, device_of=lambda ptr: None)
    assert bound.sizes == {"M": M, "K": K, "N": N}
    assert bound.scalars == {"alpha": 1.5, "beta": 0.5}  # alpha from its default
    v = bound.values
    assert list(v) == [f.name for f in plan.fields]
    assert v["A"] == args["A"].ptr and v["bias"] == args["bias"].ptr
    assert (v["M"], v["N"], v["K"]) == (M, N, K)
    assert (v["ld_A"], v["ld_B"], v["ld_C"], v["ld_D"], v["ld_Pre"]) == (K, K, N, N, N)
    assert bound.grid == plan.grid(bound.sizes) == (8 * 4, 1, 1)
    struct = params_struct(plan)(**v)
    assert struct.alpha == 1.5 and struct.ld_B == K and struct.A == args["A"].ptr


def test_missing_and_unknown_arguments(plan):
    args = good_args()
    del args["C"]
    with pytest.raises(ArgumentError, match=r"missing argument C \(f16\[M, N\]\)"):
        bind_arguments(plan, args)
    with pytest.raises(ArgumentError, match="unknown argument 'E'; bias_relu takes A, B, C"):
        bind(plan, E=Fake((M, N)))


def test_wrong_dtype(plan):
    with pytest.raises(ArgumentError, match="^B must be f16 but is f32$"):
        bind(plan, B=Fake((K, N), "<f4", strides=(1, K)))
    with pytest.raises(ArgumentError, match="^bias must be f32 but is float64$"):
        bind(plan, bias=Fake((N,), "<f8"))


def test_symbolic_sizes_must_agree(plan):
    with pytest.raises(ArgumentError) as info:
        bind(plan, B=Fake((72, N), strides=(1, 72)))
    assert str(info.value) == "A is [1000, 64] and B is [72, 512]: K differs (64 vs 72)"
    with pytest.raises(ArgumentError, match=r"A is \[1000, 64\] and bias is \[500\]: N differs"
                                            r"|B is \[64, 512\] and bias is \[500\]: N differs"):
        bind(plan, bias=Fake((500,), "<f4"))
    with pytest.raises(ArgumentError, match=r"sizes gives K=32 and A is \[1000, 64\]: K differs"):
        bind(plan, sizes={"K": 32})


def test_rank_and_fixed_dims():
    kernel = bias_relu_kernel()
    fixed = dataclasses.replace(kernel, params=tuple(
        dataclasses.replace(p, shape=(512,)) if p.name == "bias" else p for p in kernel.params))
    plan = plan_of(fixed)
    assert bind(plan).sizes["N"] == 512
    with pytest.raises(ArgumentError, match=r"bias is \[256\], but its dimension 0 must be 512"):
        bind(plan, bias=Fake((256,), "<f4"))
    with pytest.raises(ArgumentError, match=r"bias must be 1-D \[N\] but is 2-D \[1, 512\]"):
        bind(plan_of(kernel), bias=Fake((1, N), "<f4"))


def test_layout_and_contiguity(plan):
    with pytest.raises(ArgumentError, match=r"^A must be row-major \(declared row\).*strides "
                                            r"\(1, 1000\).*A\.contiguous\(\)"):
        bind(plan, A=Fake((M, K), strides=(1, M)))
    with pytest.raises(ArgumentError, match=r"^B must be column-major.*B\.t\(\)\.contiguous"):
        bind(plan, B=Fake((K, N)))  # row-major given for a col param
    with pytest.raises(ArgumentError, match="^C must be row-major"):
        bind(plan, C=Fake((M, N), strides=(2 * N, 2)))  # every other column
    with pytest.raises(ArgumentError, match="^bias must be contiguous but has stride 2"):
        bind(plan, bias=Fake((N,), "<f4", strides=(2,)))
    with pytest.raises(ArgumentError, match="negative strides"):
        bind(plan, C=Fake((M, N), strides=(-N, 1)))
    with pytest.raises(ArgumentError, match="^D must be row-major"):
        bind(plan, D=Fake((M, N), strides=(0, 1)))  # a broadcast view: rows overlap


def test_padded_leading_dimension_is_fine(plan):
    bound = bind(plan, A=Fake((M, K), strides=(72, 1)), C=Fake((M, N), strides=(N + 8, 1)))
    assert bound.values["ld_A"] == 72 and bound.values["ld_C"] == N + 8


def test_alignment_picks_the_narrow_entry_point(plan):
    """A one-gemm kernel runs arguments that miss the fast entry point's rules in its narrow
    one, saying why; an element-misaligned address is still refused."""
    bound = bind(plan, A=Fake((M, K), strides=(70, 1)))
    assert bound.narrow == ("A's leading dimension 70 is not a multiple of 8: the mainloop "
                            "copies 16-byte chunks with cp.async")
    odd = Fake((M, K), ptr=BASE + 0x4000_0000 + 8)
    assert bind(plan, A=odd).narrow.startswith("A's address 0x")
    assert "is not 16-byte aligned: the mainloop copies" in bind(plan, A=odd).narrow
    assert bind(plan).narrow == ""
    with pytest.raises(ArgumentError, match="is not 2-byte aligned"):
        bind(plan, C=Fake((M, N), ptr=BASE + 0x5000_0001))


def test_a_chain_has_no_narrow_entry_point():
    from kgen.api import build_file

    chain = build_file(Path(__file__).resolve().parents[2] / "examples/b2b_gemm_rf.kg").plan
    assert chain.narrow_kernel is None
    args = dict(A=Fake((M, 576), strides=(580, 1)), B0=Fake((576, 64), strides=(1, 576)),
                B1=Fake((64, 128), strides=(1, 64)), D1=Fake((M, 128)),
                scale0=Fake((64,), "<f4"), bias0=Fake((64,), "<f4"))
    with pytest.raises(ArgumentError) as info:
        bind_arguments(chain, args, device_of=lambda ptr: None)
    assert str(info.value) == ("A's leading dimension 580 is not a multiple of 8: the mainloop "
                               "copies 16-byte chunks with cp.async")


def test_size_rules_and_limits(plan):
    odd_n = bind(plan, B=Fake((K, 511), strides=(1, K)), C=Fake((M, 511)), D=Fake((M, 511)),
                 Pre=Fake((M, 511), "<f4"), bias=Fake((511,), "<f4"))
    assert odd_n.narrow == ("C's leading dimension 511 is not a multiple of 2: the epilogue reads "
                            "and writes two adjacent columns at once")
    padded = bind(plan, B=Fake((K, 511), strides=(1, K)), C=Fake((M, 511), strides=(512, 1)),
                  D=Fake((M, 511), strides=(512, 1)), Pre=Fake((M, 511), "<f4", strides=(512, 1)),
                  bias=Fake((511,), "<f4"))
    assert padded.narrow.startswith("N = 511 is not a multiple of 2: the epilogue")
    big = 2**30
    with pytest.raises(ArgumentError, match=r"^M = 1073741824 is above 2\*\*30-1"):
        bind(plan, A=Fake((big, K)), C=Fake((big, N)), D=Fake((big, N)),
             Pre=Fake((big, N), "<f4"))


def test_device_must_match(plan):
    with pytest.raises(ArgumentError, match="^A is on cuda:1 but the kernel runs on cuda:0$"):
        bind(plan, device_id=0, device_of=lambda ptr: 1)
    assert bind(plan, device_id=0, device_of=lambda ptr: 0).grid[0] > 0


def test_scalars(plan):
    args = good_args()
    del args["beta"]
    with pytest.raises(ArgumentError, match=r"^missing scalar beta \(it has no default\)$"):
        bind_arguments(plan, args)
    assert bind(plan, alpha=np.float32(2.0), beta=3).scalars == {"alpha": 2.0, "beta": 3.0}
    with pytest.raises(ArgumentError, match="^alpha is a scalar; pass a number, got str$"):
        bind(plan, alpha="2")
    with pytest.raises(ArgumentError, match=r"^A is a tensor f16\[M, K\]; got the number 1.0$"):
        bind(plan, A=1.0)


def test_output_may_alias_an_input(plan):
    c = Fake((M, N))
    bound = bind(plan, C=c, D=c)
    assert bound.values["C"] == bound.values["D"]


def test_host_and_unknown_objects_are_refused(plan):
    with pytest.raises(ArgumentError, match="^A is a host \\(NumPy\\) array"):
        bind(plan, A=np.zeros((M, K), np.float16))
    with pytest.raises(ArgumentError, match="^A must be a GPU tensor"):
        bind(plan, A=[[1.0]])


def test_empty_output_binds_with_an_empty_grid(plan):
    bound = bind(plan, A=Fake((0, K)), C=Fake((0, N)), D=Fake((0, N)), Pre=Fake((0, N), "<f4"))
    assert bound.grid == (0, 1, 1)


def test_an_empty_array_binds_whatever_strides_it_reports(plan):
    """An array with no elements may report zero strides (the GPU harness's M = 0 inputs did):
    nothing is read through them, so they take the leading dimension a contiguous one has."""
    zero = dict(A=Fake((0, K), strides=(0, 0)), C=Fake((0, N), strides=(0, 0)),
                D=Fake((0, N), strides=(0, 0)), Pre=Fake((0, N), "<f4", strides=(0, 0)))
    bound = bind(plan, **zero)
    assert bound.grid == (0, 1, 1)
    b = bind(plan, B=Fake((K, 0), strides=(0, 0)), C=Fake((M, 0)), D=Fake((M, 0)),
             Pre=Fake((M, 0), "<f4"), bias=Fake((0,), "<f4"))
    assert b.grid == (0, 1, 1)
    with pytest.raises(ArgumentError, match="must be row-major"):  # one element is not empty
        bind(plan, A=Fake((M, K), strides=(0, 0)))


class DLPackOnly:
    """Exposes numpy's DLPack capsule, claiming a device type (to test the capsule reader)."""

    def __init__(self, array, device=(2, 0)):
        self.array = array
        self.device = device

    def __dlpack__(self, stream=None):
        return self.array.__dlpack__()

    def __dlpack_device__(self):
        return self.device


def test_dlpack_reader():
    host = np.zeros((6, 10), dtype=np.float16)[:, 1:9]  # a strided view
    view = as_device_array(DLPackOnly(host), "X")
    assert view.kind == "dlpack" and view.dtype is ir.DType.F16
    assert view.shape == (6, 8) and view.strides == (10, 1)
    assert view.ptr == host.__array_interface__["data"][0]
    assert view.device_id == 0
    with pytest.raises(ArgumentError, match="^X is on the CPU; pass a CUDA array$"):
        as_device_array(DLPackOnly(host, device=(1, 0)), "X")
    f32 = as_device_array(DLPackOnly(np.zeros(4, np.float32)), "Y")
    assert f32.dtype is ir.DType.F32 and f32.strides == (1,)


def test_cuda_array_interface_reader():
    view = as_device_array(Fake((3, 4), "<f4", strides=(1, 3)), "Z", device_of=lambda p: 5)
    assert view.strides == (1, 3) and view.dtype is ir.DType.F32 and view.device_id == 5
    contiguous = as_device_array(Fake((3, 4)), "Z", device_of=lambda p: None)
    assert contiguous.strides == (4, 1)


def test_struct_layout_matches_the_c_compiler(plan, cache_dir):
    """ctypes' layout of the params struct is what NVRTC lays out (offsets and size)."""
    if not offsetof_compiles():
        pytest.skip("this NVRTC has no __builtin_offsetof")
    source = naive_source(plan, bias_relu_kernel()) + layout_asserts(plan)
    assert compile_cubin(source, plan.name, "sm_80").cubin[:4] == b"\x7fELF"
    wrong = layout_asserts(plan).replace("== 8,", "== 12,", 1)
    with pytest.raises(KgenRuntimeError, match="static assertion failed"):
        compile_cubin(naive_source(plan, bias_relu_kernel()) + wrong, plan.name, "sm_80")


def test_sizes_that_would_overflow_32_bit_index_math(plan):
    """The largest size binds; a grid past gridDim.x's limit is refused before any launch."""
    top = 2**30 - 1
    assert bind(plan, A=Fake((top, K)), C=Fake((top, N)), D=Fake((top, N)),
                Pre=Fake((top, N), "<f4")).sizes["M"] == top
    big = 2**30 - 2  # even, for the epilogue's column pairs
    with pytest.raises(ArgumentError, match=r"^sizes M=1073741822, K=64, N=1073741822 make "
                                            r"\d+ CTAs; a launch takes at most 2\*\*31-1$"):
        bind(plan, A=Fake((big, K)), B=Fake((K, big), strides=(1, K)), C=Fake((big, big)),
             D=Fake((big, big)), Pre=Fake((big, big), "<f4"), bias=Fake((big,), "<f4"))


@pytest.mark.parametrize("value", [-1, 1.5, True, "64"])
def test_sizes_argument_is_checked(plan, value):
    with pytest.raises(ArgumentError, match=r"^sizes\['M'\] must be a non-negative int, got "):
        bind(plan, sizes={"M": value})


@pytest.mark.parametrize("typestr, shown", [("<i4", "int32"), ("|b1", "bool"), ("<f8", "float64"),
                                            ("<i2", "int16"), ("<u2", "uint16")])
def test_dtypes_kgen_does_not_take(plan, typestr, shown):
    with pytest.raises(ArgumentError, match=rf"^A must be f16 but is {shown}$"):
        bind(plan, A=Fake((M, K), typestr))


def test_run_sizes_are_checked_before_the_gpu():
    """`kgen run --size` past the limit is bad input (exit 2) on any machine."""
    from kgen.harness.inputs import resolve_sizes

    kernel = bias_relu_kernel()
    assert resolve_sizes(kernel, {"M": 2**30 - 1})["M"] == 2**30 - 1
    with pytest.raises(ArgumentError, match=r"^M = 1073741824 is above 2\*\*30-1"):
        resolve_sizes(kernel, {"M": 2**30})
    with pytest.raises(ArgumentError, match=r"^unknown size 'Q'; bias_relu's sizes are M, K, N"):
        resolve_sizes(kernel, {"Q": 4})


def test_cli_run_refuses_a_size_past_the_limit():
    from pathlib import Path

    from click.testing import CliRunner

    from kgen.cli import cli

    example = Path(__file__).resolve().parent.parent.parent / "examples" / "gemm.kg"
    result = CliRunner().invoke(cli, ["run", str(example), "--size", "M=1073741824"])
    assert result.exit_code == 2
    assert result.output.strip() == ("error: M = 1073741824 is above 2**30-1, the largest size "
                                     "kgen takes (the kernel's index math is 32-bit)")


def test_a_batched_kernel_binds_zero_batches_whatever_strides_they_report():
    """L = 0: every batched array is empty (the GPU run's inputs reported zero strides)."""
    from kgen.api import build_file

    p = build_file(Path(__file__).parents[2] / "examples" / "batched_reductions.kg").plan
    arrays = {"A": Fake((0, 64, 72), strides=(0, 0, 0)), "B": Fake((72, 64), strides=(1, 72))}
    for out in p.params:
        if out.role is ir.Role.OUT:
            shape = [0] + [64 for _ in out.shape]
            arrays[out.name] = Fake(shape, "<f2" if out.dtype.nbytes == 2 else "<f4",
                                    strides=tuple(0 for _ in shape))
    bound = bind_arguments(p, arrays, device_of=lambda ptr: None)
    assert bound.grid[0] == 0
