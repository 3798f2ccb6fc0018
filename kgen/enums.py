"""The shared vocabulary of every layer: element types, layouts, targets, epilogue ops, axes.

The IR (`kgen.ir`), the plan (`kgen.plan`), the targets and the runtime all speak these enums;
`kgen.ir` re-exports them, so `ir.DType` and `enums.DType` are the same class. Nothing here
refers to a kernel.
"""
from __future__ import annotations

import enum
import typing


class DType(enum.Enum):
    """Element types. Value: (DSL name, bytes, C++ type)."""

    F16 = ("f16", 2, "__half")
    BF16 = ("bf16", 2, "__nv_bfloat16")
    F32 = ("f32", 4, "float")
    # 8-bit floats (OCP FP8): sign, 4 exponent bits, 3 mantissa bits (no infinity, max 448) and
    # sign, 5 exponent, 2 mantissa (IEEE-like, max 57344); tensor operands of wgmma only
    F8E4M3 = ("f8e4m3", 1, "__nv_fp8_e4m3")
    F8E5M2 = ("f8e5m2", 1, "__nv_fp8_e5m2")
    # Scalars of tile programs only: a random stream's seed and offset (`random(seed, offset)`),
    # never a value of an expression
    U64 = ("u64", 8, "unsigned long long")

    @property
    def dsl_name(self) -> str:
        return self.value[0]

    @property
    def nbytes(self) -> int:
        return self.value[1]

    @property
    def cpp(self) -> str:
        return self.value[2]

    @property
    def fp8(self) -> bool:
        return self in FP8

    @classmethod
    def from_name(cls, name: str) -> "DType | None":
        return next((d for d in cls if d.dsl_name == name), None)

    @property
    def is_float(self) -> bool:
        return self is not DType.U64


FP8 = frozenset({DType.F8E4M3, DType.F8E5M2})


class Layout(enum.Enum):
    """Storage order of a 2-D tensor: ROW means the last index is contiguous."""

    ROW = "row"
    COL = "col"


class Role(enum.Enum):
    IN = "in"
    OUT = "out"


class Arch(enum.Enum):
    """Compilation targets. Value: the DSL/NVRTC name."""

    SM80 = "sm_80"
    SM86 = "sm_86"
    SM89 = "sm_89"
    SM90A = "sm_90a"

    @classmethod
    def from_name(cls, name: str) -> "Arch | None":
        return next((a for a in cls if a.value == name), None)


# A dimension is a fixed extent or the name of a runtime size such as "M".
Dim = typing.Union[int, str]


class ParamKind(enum.Enum):
    TENSOR = "tensor"  # 2-D, shape [rows, cols]
    VECTOR = "vector"  # 1-D, shape [length]
    SCALAR = "scalar"  # 0-D, passed by value


class Op(enum.Enum):
    """Element-wise operations. Value: (DSL spelling, arity)."""

    # arithmetic
    ADD = ("+", 2)
    SUB = ("-", 2)
    MUL = ("*", 2)
    DIV = ("/", 2)
    NEG = ("neg", 1)  # unary minus
    MIN = ("min", 2)
    MAX = ("max", 2)
    ABS = ("abs", 1)
    # transcendental
    EXP = ("exp", 1)
    LOG = ("log", 1)
    SQRT = ("sqrt", 1)
    RSQRT = ("rsqrt", 1)
    TANH = ("tanh", 1)
    SIGMOID = ("sigmoid", 1)
    # activations
    RELU = ("relu", 1)
    LEAKY_RELU = ("leaky_relu", 2)  # leaky_relu(x, slope)
    CLAMP = ("clamp", 3)  # clamp(x, lo, hi)
    GELU = ("gelu", 1)  # exact, erf-based
    GELU_TANH = ("gelu_tanh", 1)
    SILU = ("silu", 1)
    HARDSWISH = ("hardswish", 1)
    # comparisons (1.0 for true, 0.0 for false) and selection
    LT = ("<", 2)
    LE = ("<=", 2)
    GT = (">", 2)
    GE = (">=", 2)
    EQ = ("==", 2)
    NE = ("!=", 2)
    WHERE = ("where", 3)  # where(cond, a, b): a where cond != 0

    @property
    def spelling(self) -> str:
        return self.value[0]

    @property
    def arity(self) -> int:
        return self.value[1]


# Ops callable by name in the DSL, e.g. relu(x), min(a, b).
FUNCTIONS: dict[str, Op] = {op.spelling: op for op in Op if op.spelling.isidentifier()}
del FUNCTIONS["neg"]


class Axis(enum.Enum):
    """Which output coordinate indexes a broadcast vector, or which axis a reduction removes."""

    ROW = "row"  # v[row]: one value per output row (column broadcast); rowsum -> vector[M]
    COL = "col"  # v[col]: one value per output column (row broadcast); colsum -> vector[N]
    ALL = "all"  # reduction to a scalar
    # Tile programs only: the (batch, query head) instance a CTA computes, as a value
    # (`head`) or a vector's index (`slopes[head]`: one value per query head)
    BATCH = "batch"
    HEAD = "head"


class ReduceOp(enum.Enum):
    SUM = "sum"
    MAX = "max"
    MIN = "min"
    ABSMAX = "absmax"


class Residency(enum.Enum):
    """Where a chained gemm's intermediate lives (back-to-back fusion)."""

    REGISTERS = "registers"
    SMEM = "smem"
