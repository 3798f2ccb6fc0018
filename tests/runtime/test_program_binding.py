"""The argument check of tile programs (kgen/runtime/program.py, `bind_program`), on the CPU with
stand-in device arrays: 4-D [B, H, S, D] tensors and 3-D vectors at any strides with a unit
last stride, GQA (H a multiple of HKV), sizes read from the arguments, outputs left out (their
shapes), the params struct's values and the grid."""
from __future__ import annotations

import pytest

from kgen import ir
from kgen.enums import DType
from kgen.errors import ArgumentError, KgenRuntimeError
from kgen.lower import lower
from kgen.runtime.calls import struct_format
from kgen.runtime.program import bind_program
from kgen.runtime.tensors import DeviceArray, contiguous_strides

from tests import loop_kernels as lk

BASE = 1 << 20


def arr(shape, dtype=DType.BF16, strides=None, ptr=BASE):
    return DeviceArray(ptr, tuple(shape), tuple(strides or contiguous_strides(shape)), dtype, 0)


def attention_args(b=2, h=8, hkv=2, s=100, t=50, d=64):
    return dict(Q=arr((b, h, s, d)), K=arr((b, hkv, t, d)), V=arr((b, hkv, t, d)),
                O=arr((b, h, s, d)), lse=arr((b, h, s), DType.F32))


def values(plan, bound):
    return dict(zip([f.name for f in plan.fields], bound.values))


def test_attention_values_and_grid():
    plan = lower(lk.attention(64, gqa=True))
    bound = bind_program(plan, attention_args(), None)
    v = values(plan, bound)
    assert bound.grid == (1, 8, 2) and bound.sizes == {"S": 100, "T": 50}
    assert (v["rows"], v["loop_len"], v["heads"], v["group"]) == (100, 50, 8, 4)
    assert (v["Q_ld"], v["Q_hs"], v["Q_bs"]) == (64, 6400, 51200)
    assert (v["K_ld"], v["K_hs"], v["K_bs"]) == (64, 3200, 6400)
    assert (v["lse_hs"], v["lse_bs"]) == (100, 800)
    assert v["scale"] == pytest.approx(0.125)
    assert struct_format(plan).size == 19 * 8 + 4 + 5 * 4  # pointers, strides; scale; sizes


def test_any_strides_with_a_unit_last_stride():
    plan = lower(lk.attention(64))
    args = attention_args(hkv=8)
    # Q as a view of [B, S, H, D] (the layout of a packed QKV): strides (S*H*D, D, H*D, 1)
    args["Q"] = arr((2, 8, 100, 64), strides=(100 * 8 * 64, 64, 8 * 64, 1))
    v = values(plan, bind_program(plan, args, None))
    assert (v["Q_ld"], v["Q_hs"]) == (512, 64)
    args["Q"] = arr((2, 8, 100, 64), strides=(100 * 8 * 128, 128, 8 * 128, 2))
    with pytest.raises(ArgumentError, match="unit stride"):
        bind_program(plan, args, None)


def test_gqa_heads_must_divide():
    plan = lower(lk.attention(64, gqa=True))
    with pytest.raises(KgenRuntimeError, match="multiple of the KV heads"):
        bind_program(plan, attention_args(h=6, hkv=4), None)


@pytest.mark.parametrize("change, message", [
    (lambda a: a.update(Q=arr((2, 8, 100, 64), DType.F16)), "must be bf16"),
    (lambda a: a.update(Q=arr((8, 100, 64))), "must have 4 dims"),
    (lambda a: a.update(V=arr((2, 2, 51, 64))), "T = 51"),
    (lambda a: a.update(K=arr((2, 2, 50, 128))), r"must be \[B, HKV, T, 64\]"),
    (lambda a: a.update(O=arr((3, 8, 100, 64))), "B = 3"),
    (lambda a: a.pop("K"), "missing argument 'K'"),
    (lambda a: a.update(Q=arr((2, 8, 100, 64), ptr=BASE + 8)), "16-byte aligned"),
    (lambda a: a.update(Q=arr((2, 8, 100, 64), strides=(8 * 100 * 68, 100 * 68, 68, 1))),
     "multiples of 16 bytes"),
    (lambda a: a.update(bogus=1), "unknown argument 'bogus'"),
])
def test_bad_arguments_are_named(change, message):
    plan = lower(lk.attention(64, gqa=True))
    args = attention_args()
    change(args)
    with pytest.raises((ArgumentError, KgenRuntimeError), match=message):
        bind_program(plan, args, None)


def test_outputs_left_out_get_their_shapes():
    plan = lower(lk.attention(64, gqa=True))
    args = attention_args()
    del args["O"], args["lse"]
    bound = bind_program(plan, args, None)
    assert bound.missing == {"O": (2, 8, 100, 64), "lse": (2, 8, 100)}
    v = values(plan, bound)
    assert (v["O"], v["O_ld"], v["O_hs"], v["O_bs"]) == (0, 64, 6400, 51200)


def test_a_loop_streamed_along_its_columns_needs_multiples_of_8():
    plan = lower(lk.mlp(w_layout=ir.Layout.ROW))
    args = dict(X=arr((17, 256)), W0=arr((256, 1001)), W1=arr((1001, 128)), Y=arr((17, 128)),
                b0=arr((1001,), DType.F32))
    with pytest.raises(KgenRuntimeError, match="multiple of 8"):
        bind_program(plan, args, None)
    args.update(W0=arr((256, 1000)), W1=arr((1000, 128)), b0=arr((1000,), DType.F32))
    bound = bind_program(plan, args, None)
    assert bound.grid == (1, 1, 1) and bound.sizes == {"M": 17, "N0": 1000}


def test_column_major_operands_read_their_column_stride():
    plan = lower(lk.mlp())
    w0 = arr((256, 1000), strides=(1, 256))
    w1 = arr((1000, 128), strides=(1, 1000))
    args = dict(X=arr((17, 256)), W0=w0, W1=w1, Y=arr((17, 128)), b0=arr((1000,), DType.F32))
    v = values(plan, bind_program(plan, args, None))
    assert (v["W0_ld"], v["W1_ld"]) == (256, 1000)


def test_row_kernel_grid():
    plan = lower(lk.rowdot(128))
    args = dict(dO=arr((2, 3, 4097, 128)), O=arr((2, 3, 4097, 128)),
                D=arr((2, 3, 4097), DType.F32))
    bound = bind_program(plan, args, None)
    assert bound.grid == (1025, 3, 2)
