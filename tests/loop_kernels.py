"""Tile programs built directly as IR (the front end's parser is another branch): flash attention
forward with its variants, the looped MLP chain, the row kernel D = rowsum(dO * O). The three
kernels of the tile-programs contract, and the variants the back end's tests need."""
from __future__ import annotations

import math

from kgen import ir
from kgen.ir import Axis, DType, Layout, Op, ParamKind, ReduceOp, Role

BF16 = DType.BF16


def ref(name: str) -> ir.LocalRef:
    return ir.LocalRef(name)


def call(op: Op, *args) -> ir.Call:
    return ir.Call(op, tuple(a if not isinstance(a, (int, float)) else ir.Const(float(a))
                             for a in args))


def tensor(name, dtype, shape, *, batch="B", heads="H", role=Role.IN, layout=Layout.ROW):
    return ir.Param(name, ParamKind.TENSOR, dtype, tuple(shape), layout, role, batch=batch,
                    heads=heads)


def vector(name, dtype, length, *, batch="B", heads="H", role=Role.IN):
    return ir.Param(name, ParamKind.VECTOR, dtype, (length,), Layout.ROW, role, batch=batch,
                    heads=heads)


def scalar(name, default, positive: bool = False):
    return ir.Param(name, ParamKind.SCALAR, DType.F32, (), default=default, positive=positive)


def attention(head_dim: int = 128, *, causal: bool = False, alibi: bool = False,
              softcap: float | None = None, lse: bool = True, gqa: bool = False,
              shift: bool = False, dtype: DType = BF16, arch: ir.Arch = ir.Arch.SM80,
              tile: tuple[int, int] | None = None, stages: int | None = None,
              name: str = "attention_fwd", raw_max: bool = False,
              lazy: bool = False) -> ir.Kernel:
    """Flash attention forward as the contract writes it. `causal`: col <= row (top-left);
    `shift`: a scalar `shift` moves the diagonal (col + shift <= row: rows below shift are
    wholly masked); `alibi`: x - slope * (row - col); `softcap`: c * tanh(x / c); `raw_max`:
    the form kgen.attention writes for a positive scale (kgen.attention.Signature.raw_max):
    the scale declared `positive`, the maximum of the raw scores, exp(scale * (x - m)),
    lse = scale * m + log(l); `lazy`: kgen.attention's reference maximum (m moves only where a
    block's maximum passes it by more than kgen.attention.LAZY_MAX, r = where(m_new == m, 1,
    ...)), so kgen.attention's program for a positive scale is raw_max=True, lazy=True."""
    assert not (raw_max and (alibi or softcap is not None)), "a term after the scale"
    kv_heads = "HKV" if gqa else "H"
    params = [
        tensor("Q", dtype, ("S", head_dim)),
        tensor("K", dtype, ("T", head_dim), heads=kv_heads),
        tensor("V", dtype, ("T", head_dim), heads=kv_heads),
        tensor("O", dtype, ("S", head_dim), role=Role.OUT),
    ]
    if lse:
        params.append(vector("lse", DType.F32, "S", role=Role.OUT))
    params.append(scalar("scale", 1.0 / math.sqrt(head_dim), positive=raw_max))
    if alibi:
        params.append(scalar("slope", 0.0625))
    if softcap is not None:
        params.append(scalar("cap", softcap))
    if shift:
        params.append(scalar("shift", 0.0))

    scale = ir.ScalarLoad("scale")
    x = ir.Acc() if raw_max else call(Op.MUL, scale, ir.Acc())
    stmts: list = []

    def scaled(value):
        return call(Op.MUL, scale, value) if raw_max else value

    if softcap is not None:
        c = ir.ScalarLoad("cap")
        x = call(Op.MUL, c, call(Op.TANH, call(Op.DIV, x, c)))
    if alibi:
        x = call(Op.SUB, x, call(Op.MUL, ir.ScalarLoad("slope"),
                                 call(Op.SUB, ir.Position(Axis.ROW), ir.Position(Axis.COL))))
    if causal or shift:
        col = ir.Position(Axis.COL)
        if shift:
            col = call(Op.ADD, col, ir.ScalarLoad("shift"))
        x = call(Op.WHERE, call(Op.LE, col, ir.Position(Axis.ROW)), x, -math.inf)
    stmts.append(ir.Let("x", x))
    highest = call(Op.MAX, ref("m"), ir.Reduce(ReduceOp.MAX, Axis.ROW, ref("x")))
    if lazy:
        from kgen.attention import LAZY_MAX

        stmts.append(ir.Let("m_blk", highest))
        passes = call(Op.GT, scaled(call(Op.SUB, ref("m_blk"), ref("m"))), float(LAZY_MAX))
        highest = call(Op.WHERE, passes, ref("m_blk"), ref("m"))
    factor = call(Op.EXP, scaled(call(Op.SUB, ref("m"), ref("m_use"))))
    stmts += [
        ir.Let("m_new", highest),
        ir.Let("m_use", call(Op.WHERE, call(Op.EQ, ref("m_new"), -math.inf), 0.0, ref("m_new"))),
        ir.Store("s", call(Op.EXP, scaled(call(Op.SUB, ref("x"), ref("m_use"))))),
        ir.Let("r", call(Op.WHERE, call(Op.EQ, ref("m_new"), ref("m")), 1.0, factor)
               if lazy else factor),
        ir.Update("l", call(Op.ADD, call(Op.MUL, ref("l"), ref("r")),
                            ir.Reduce(ReduceOp.SUM, Axis.ROW, ref("s")))),
        ir.Update("o", call(Op.MUL, ref("o"), ref("r"))),
        ir.Update("m", ref("m_new")),
    ]
    g0 = ir.Gemm("s", ir.OperandRef("Q"), ir.OperandRef("K", transposed=True), DType.F32,
                 None, None, None, ir.Epilogue(tuple(stmts)))
    g1 = ir.Gemm("o", ir.OperandRef("s"), ir.OperandRef("V"), DType.F32, None, None, None,
                 ir.Epilogue(()), accumulate=True)
    loop = ir.Loop("kv", "T", (ir.Carry("m", DType.F32, -math.inf),
                               ir.Carry("l", DType.F32, 0.0)), (g0, g1),
                   tile=ir.BlockShape(*tile) if tile else None,
                   warps=ir.WarpGrid(tile[0] // 16, 1) if tile else None,
                   stages=ir.StageCount(stages) if stages else None)
    epilogue = [ir.Store("O", call(Op.WHERE, call(Op.EQ, ref("l"), 0.0), 0.0,
                                   call(Op.DIV, ref("o"), ref("l"))))]
    if lse:
        epilogue.append(ir.Store("lse", call(Op.WHERE, call(Op.EQ, ref("l"), 0.0), -math.inf,
                                             call(Op.ADD, scaled(ref("m")),
                                                  call(Op.LOG, ref("l"))))))
    return ir.Kernel(name, arch, tuple(params), (), loop=loop,
                     epilogue=ir.Epilogue(tuple(epilogue)))


def mlp(k0: int = 256, n1: int = 128, *, dtype: DType = BF16, arch: ir.Arch = ir.Arch.SM80,
        w_layout: Layout = Layout.COL, tile=None, stages=None) -> ir.Kernel:
    """Y = gelu(X @ W0 + b0) @ W1 with the hidden N0 streamed (the contract's mlp_loop)."""
    params = (
        tensor("X", dtype, ("M", k0), batch=None, heads=None),
        tensor("W0", dtype, (k0, "N0"), batch=None, heads=None, layout=w_layout),
        tensor("W1", dtype, ("N0", n1), batch=None, heads=None, layout=w_layout),
        tensor("Y", dtype, ("M", n1), batch=None, heads=None, role=Role.OUT),
        vector("b0", DType.F32, "N0", batch=None, heads=None),
    )
    h = call(Op.GELU, call(Op.ADD, ir.Acc(), ir.VectorLoad("b0", Axis.COL)))
    g0 = ir.Gemm("h", ir.OperandRef("X"), ir.OperandRef("W0"), DType.F32, None, None, None,
                 ir.Epilogue((ir.Store("h", h),)))
    g1 = ir.Gemm("y", ir.OperandRef("h"), ir.OperandRef("W1"), DType.F32, None, None, None,
                 ir.Epilogue(()), accumulate=True)
    loop = ir.Loop("j", "N0", (), (g0, g1), tile=ir.BlockShape(*tile) if tile else None,
                   stages=ir.StageCount(stages) if stages else None)
    return ir.Kernel("mlp_loop", arch, params, (), loop=loop,
                     epilogue=ir.Epilogue((ir.Store("Y", ref("y")),)))


def rowdot(cols: int = 128, *, dtype: DType = BF16, arch: ir.Arch = ir.Arch.SM80) -> ir.Kernel:
    """D = rowsum(cast<f32>(dO) * O): the attention backward's first kernel."""
    params = (
        tensor("dO", dtype, ("S", cols)),
        tensor("O", dtype, ("S", cols)),
        vector("D", DType.F32, "S", role=Role.OUT),
    )
    value = ir.Reduce(ReduceOp.SUM, Axis.ROW,
                      call(Op.MUL, ir.Cast(DType.F32, ir.TensorLoad("dO")), ir.TensorLoad("O")))
    return ir.Kernel("attention_bwd_dot", arch, params, (),
                     epilogue=ir.Epilogue((ir.Store("D", value),)))


def rmsnorm(cols: int = 128, *, dtype: DType = BF16, arch: ir.Arch = ir.Arch.SM80,
            heads: bool = True) -> ir.Kernel:
    """Y = X * rsqrt(rowsum(X * X) / cols + eps) * w[col], and the row's factor r: a row
    kernel with a tensor output, a row value broadcast over the row, a column vector."""
    lead = {} if heads else {"batch": None, "heads": None}
    params = (
        tensor("X", dtype, ("S", cols), **lead),
        vector("w", DType.F32, cols, batch=None, heads=None),
        tensor("Y", dtype, ("S", cols), role=Role.OUT, **lead),
        vector("r", DType.F32, "S", role=Role.OUT, **lead),
        scalar("eps", 1e-5),
    )
    x = ir.TensorLoad("X")
    stmts = (
        ir.Let("ms", call(Op.DIV, ir.Reduce(ReduceOp.SUM, Axis.ROW, call(Op.MUL, x, x)),
                          float(cols))),
        ir.Let("f", call(Op.RSQRT, call(Op.ADD, ref("ms"), ir.ScalarLoad("eps")))),
        ir.Store("Y", call(Op.MUL, call(Op.MUL, x, ref("f")), ir.VectorLoad("w", Axis.COL))),
        ir.Store("r", ref("f")),
    )
    return ir.Kernel("rmsnorm", arch, params, (), epilogue=ir.Epilogue(stmts))
