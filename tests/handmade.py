"""Kernels for the runtime tests: IR built here, plans from kgen.lower, and a deliberately naive
CUDA implementation written against the plan's params struct (one thread per output element,
a plain loop over K). It is independent of kgen's emitter, so the runtime (NVRTC, the cache,
argument checks, launches, the reference check) is tested on its own.
"""
from __future__ import annotations

from kgen import ir
from kgen.plan import FieldKind, KernelPlan

P, T, V, S = ir.Param, ir.ParamKind.TENSOR, ir.ParamKind.VECTOR, ir.ParamKind.SCALAR
OUT = ir.Role.OUT


def gemm(name: str, a: str, b: str, stmts: tuple, *, tile=(128, 128, 32), warps=(2, 2),
         stages=3) -> ir.Gemm:
    return ir.Gemm(name, ir.OperandRef(a), ir.OperandRef(b), ir.DType.F32, ir.TileShape(*tile),
                   ir.WarpGrid(*warps), ir.StageCount(stages), ir.Epilogue(tuple(stmts)))


def bias_relu_kernel(dtype: ir.DType = ir.DType.F16, *, name: str = "bias_relu",
                     tile=(128, 128, 32), warps=(2, 2), stages=3,
                     arch: ir.Arch = ir.Arch.SM80) -> ir.Kernel:
    """D = relu(alpha * acc + beta * C + bias[col]); P = acc (f32), a second output."""
    value = ir.Call(ir.Op.RELU, (
        ir.Call(ir.Op.ADD, (
            ir.Call(ir.Op.ADD, (
                ir.Call(ir.Op.MUL, (ir.ScalarLoad("alpha"), ir.Acc())),
                ir.Call(ir.Op.MUL, (ir.ScalarLoad("beta"), ir.TensorLoad("C"))),
            )),
            ir.VectorLoad("bias", ir.Axis.COL),
        )),
    ))
    params = (
        P("A", T, dtype, ("M", "K"), ir.Layout.ROW),
        P("B", T, dtype, ("K", "N"), ir.Layout.COL),
        P("C", T, dtype, ("M", "N"), ir.Layout.ROW),
        P("D", T, dtype, ("M", "N"), ir.Layout.ROW, OUT),
        P("Pre", T, ir.DType.F32, ("M", "N"), ir.Layout.ROW, OUT),
        P("bias", V, ir.DType.F32, ("N",)),
        P("alpha", S, ir.DType.F32, default=1.5),
        P("beta", S, ir.DType.F32, default=None),
    )
    stmts = (ir.Store("D", value), ir.Store("Pre", ir.Acc()))
    return ir.Kernel(name, arch, params, (gemm("mma0", "A", "B", stmts, tile=tile, warps=warps,
                                               stages=stages),))


def rowscale_gelu_kernel(dtype: ir.DType = ir.DType.BF16) -> ir.Kernel:
    """D = gelu(acc * scale[row]) with a [M] vector."""
    value = ir.Call(ir.Op.GELU, (ir.Call(ir.Op.MUL, (ir.Acc(), ir.VectorLoad("scale",
                                                                            ir.Axis.ROW))),))
    params = (
        P("A", T, dtype, ("M", "K"), ir.Layout.ROW),
        P("B", T, dtype, ("K", "N"), ir.Layout.COL),
        P("D", T, dtype, ("M", "N"), ir.Layout.ROW, OUT),
        P("scale", V, ir.DType.F32, ("M",)),
    )
    return ir.Kernel("rowscale_gelu", ir.Arch.SM80, params,
                     (gemm("mma0", "A", "B", (ir.Store("D", value),)),))


def plan_of(kernel: ir.Kernel, arch: ir.Arch | None = None) -> KernelPlan:
    from kgen.lower import lower

    return lower(kernel, arch)


# ---------------------------------------------------------------------------------------------
# The naive CUDA kernel

_LOAD = {ir.DType.F16: "__half2float({})", ir.DType.BF16: "__bfloat162float({})",
         ir.DType.F32: "({})"}
_STORE = {ir.DType.F16: "__float2half_rn({})", ir.DType.BF16: "__float2bfloat16_rn({})",
          ir.DType.F32: "({})"}
_BINARY = {ir.Op.ADD: "+", ir.Op.SUB: "-", ir.Op.MUL: "*", ir.Op.DIV: "/"}
_CALLS = {
    ir.Op.NEG: "(-{0})", ir.Op.MIN: "fminf({0}, {1})", ir.Op.MAX: "fmaxf({0}, {1})",
    ir.Op.ABS: "fabsf({0})", ir.Op.EXP: "expf({0})", ir.Op.LOG: "logf({0})",
    ir.Op.SQRT: "sqrtf({0})", ir.Op.RSQRT: "rsqrtf({0})", ir.Op.TANH: "tanhf({0})",
    ir.Op.SIGMOID: "(1.0f / (1.0f + expf(-({0}))))", ir.Op.RELU: "fmaxf({0}, 0.0f)",
    ir.Op.GELU: "(0.5f * ({0}) * (1.0f + erff(({0}) * 0.70710678118654752f)))",
    ir.Op.SILU: "(({0}) / (1.0f + expf(-({0}))))",
    ir.Op.LT: "(({0}) < ({1}) ? 1.0f : 0.0f)", ir.Op.GT: "(({0}) > ({1}) ? 1.0f : 0.0f)",
    ir.Op.WHERE: "(({0}) != 0.0f ? ({1}) : ({2}))",
}


def _index(param: ir.Param, row: str, col: str) -> str:
    if param.kind is not T:
        raise NotImplementedError("the naive kernel indexes 2-D tensors only")
    if param.layout is ir.Layout.ROW:
        return f"(long long)({row}) * p.ld_{param.name} + ({col})"
    return f"(long long)({col}) * p.ld_{param.name} + ({row})"


def _expr(node, kernel: ir.Kernel) -> str:
    if isinstance(node, ir.Acc):
        return "acc"
    if isinstance(node, ir.Const):
        return f"{float(node.value)!r}f"
    if isinstance(node, ir.ScalarLoad):
        return f"p.{node.name}"
    if isinstance(node, ir.LocalRef):
        return f"v_{node.name}"
    if isinstance(node, ir.TensorLoad):
        param = kernel.param(node.name)
        return _LOAD[param.dtype].format(f"p.{node.name}[{_index(param, 'row', 'col')}]")
    if isinstance(node, ir.VectorLoad):
        param = kernel.param(node.name)
        at = "row" if node.axis is ir.Axis.ROW else "col"
        return _LOAD[param.dtype].format(f"p.{node.name}[{at}]")
    if isinstance(node, ir.Call):
        args = [_expr(a, kernel) for a in node.args]
        if node.op in _BINARY:
            return f"({args[0]} {_BINARY[node.op]} {args[1]})"
        return _CALLS[node.op].format(*args)
    if isinstance(node, ir.Cast):
        inner = _expr(node.arg, kernel)
        return _LOAD[node.dtype].format(_STORE[node.dtype].format(inner))
    raise NotImplementedError(f"the naive kernel does not do {node!r}")


def naive_source(plan: KernelPlan, kernel: ir.Kernel, *, skip_last_row: bool = False,
                 smem_bytes: int | None = None) -> str:
    """A correct (slow) CUDA implementation of a one-gemm plan, with the plan's params struct,
    grid and block (`kernel` is the IR it was lowered from). `skip_last_row` plants a bug: the
    last output row is never written."""
    g = kernel.gemms[0]
    gp = plan.gemms[0]
    tile_m, tile_n = gp.tile[0], gp.tile[1]
    a, b = kernel.param(g.a.name), kernel.param(g.b.name)
    m = gp.m_dim if isinstance(gp.m_dim, int) else f"p.{gp.m_dim}"
    n = gp.n_dim if isinstance(gp.n_dim, int) else f"p.{gp.n_dim}"
    k = gp.k_dim if isinstance(gp.k_dim, int) else f"p.{gp.k_dim}"
    smem = plan.smem_bytes if smem_bytes is None else smem_bytes
    members = []
    for f in plan.fields:
        members.append(f"  {f.ctype} {f.name};")
    body = []
    for stmt in g.epilogue.stmts:
        value = _expr(stmt.value, kernel)
        if isinstance(stmt, ir.Let):
            body.append(f"      const float v_{stmt.name} = {value};")
        else:
            out = kernel.param(stmt.target)
            at = _index(out, "row", "col")
            body.append(f"      p.{stmt.target}[{at}] = {_STORE[out.dtype].format(value)};")
    last = f"{m} - 1" if skip_last_row else f"{m}"
    # every entry point of the plan (the narrow one too: this kernel takes any alignment)
    entries = [plan.name] + ([plan.narrow_kernel] if plan.narrow_kernel else [])
    kernels = []
    for entry in entries:
        kernels += [
            f"extern \"C\" __global__ void __launch_bounds__({plan.schedule.warps.threads}, "
            f"{plan.schedule.scheduler.min_blocks_per_sm})",
            f"{entry}(const __grid_constant__ {plan.name}_params p) {{",
            "  extern __shared__ unsigned char smem[];",
            # Touch the last byte of the dynamic shared memory the launch must have granted.
            f"  if ({smem} > 0 && threadIdx.x == 0) smem[{max(smem - 1, 0)}] = 1;",
            f"  const int tiles_n = ({n} + {tile_n - 1}) / {tile_n};",
            "  const int tile_m = blockIdx.x / tiles_n;",
            "  const int tile_n = blockIdx.x % tiles_n;",
            f"  for (int e = threadIdx.x; e < {tile_m * tile_n}; e += blockDim.x) {{",
            f"    const int row = tile_m * {tile_m} + e / {tile_n};",
            f"    const int col = tile_n * {tile_n} + e % {tile_n};",
            f"    if (row < {last} && col < {n}) {{",
            "      float acc = 0.0f;",
            f"      for (int kk = 0; kk < {k}; ++kk) {{",
            "        acc += " + _LOAD[a.dtype].format(f"p.{a.name}[{_index(a, 'row', 'kk')}]")
            + " * " + _LOAD[b.dtype].format(f"p.{b.name}[{_index(b, 'kk', 'col')}]") + ";",
            "      }",
            *body,
            "    }",
            "  }",
            "}",
        ]
    return "\n".join([
        "#include <cuda_fp16.h>",
        "#include <cuda_bf16.h>",
        f"struct {plan.name}_params {{",
        *members,
        "};",
        *kernels,
        "",
    ])


def pointer_fields(plan: KernelPlan) -> list[str]:
    return [f.name for f in plan.fields if f.kind is FieldKind.POINTER]


def layout_asserts(plan: KernelPlan) -> str:
    """static_asserts that `<kernel>_params` has the ctypes layout the runtime packs."""
    import ctypes

    from kgen.runtime.launch import params_struct

    struct = params_struct(plan)
    name = f"{plan.name}_params"
    lines = [f"static_assert(sizeof({name}) == {ctypes.sizeof(struct)}, \"size\");"]
    lines += [f"static_assert(__builtin_offsetof({name}, {member}) == "
              f"{getattr(struct, member).offset}, \"{member}\");"
              for member, _ in struct._fields_]
    return "\n".join(lines) + "\n"


def offsetof_compiles() -> bool:
    """Whether this NVRTC knows __builtin_offsetof (13.5 does, 13.0 does not)."""
    from kgen.errors import KgenRuntimeError
    from kgen.runtime.nvrtc import compile_cubin

    probe = ("struct probe_params { int a; long long b; };\n"
             "static_assert(__builtin_offsetof(probe_params, b) == 8, \"b\");\n"
             "extern \"C\" __global__ void probe(const __grid_constant__ probe_params p) {}\n")
    try:
        compile_cubin(probe, "probe", "sm_80")
    except KgenRuntimeError:
        return False
    return True
