"""Diagnostics: how kgen words a problem, and the checks whose messages the front end shares.

- Message phrasing: `quote`, `shown`, `number_text`, `shape_text`, `or_list`, `at_line`,
  `arity_message`, and `did_you_mean` suggestions from the names in scope.
- Locations: `loc_of` (a node's SourceLoc, whatever the node is) and `first_located`.
- Value checks that return the problem in words (`dim_problem`, `setting_problem`,
  `f32_problem`) or raise it located (`checked_int`).
- Identifier safety (`check_identifier`, `RESERVED_IDENTIFIERS`): DSL names become C++
  identifiers in the emitted source only through this check, so the parser, the verifier and the
  storage lowering refuse the same names with the same messages.

The error and warning types themselves (`KgenError`, `KgenWarning`, `SourceLoc`) live in
kgen/errors.py, which renders them.
"""
from __future__ import annotations

import difflib
import math
import re

from .enums import FUNCTIONS, Arch, DType
from .errors import NOWHERE, KgenError, SourceLoc
from .language import F32_MAX, MAX_DIM, MAX_SETTING, REDUCTIONS

# ---------------------------------------------------------------------------------------------
# Message phrasing


def shown(value: object) -> str:
    """repr() for a message: short, on one line, and safe for absurd values (huge ints)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit integer"
    try:
        text = ascii(value) if isinstance(value, str) else repr(value)
    except (ValueError, RecursionError):  # e.g. a dataclass holding a 5000-digit int
        return f"a {type(value).__name__}"
    return text if len(text) <= 60 else text[:45] + "..." + text[-10:]


def quote(name: object) -> str:
    """`'name'` for messages; non-printable text is escaped so a message stays on one line."""
    if not isinstance(name, str):
        return shown(name)
    return f"'{name}'" if name.isprintable() else ascii(name)


def at_line(loc: SourceLoc) -> str:
    """' at line N', or '' for IR built in Python."""
    return f" at line {loc.line}" if loc.line > 0 else ""


def or_list(words: list[str]) -> str:
    """'a', 'a or b', 'a, b or c'."""
    return words[0] if len(words) == 1 else ", ".join(words[:-1]) + " or " + words[-1]


def did_you_mean(name: str, candidates) -> str:
    close = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"; did you mean '{close[0]}'?" if close else ""


def shape_text(shape: tuple) -> str:
    return "[" + ", ".join(d if isinstance(d, str) else number_text(d) for d in shape) + "]"


def arity_message(name: str, arity: int, got: int) -> str:
    noun = "argument" if arity == 1 else "arguments"
    return f"{name} takes {arity} {noun}, got {got}"


def number_text(value: object) -> str:
    """A number (or the text of one) for a message, shortened if it is absurdly long."""
    if isinstance(value, float):
        text = repr(value) if math.isfinite(value) else str(value)
    elif isinstance(value, int) and value.bit_length() > 128:
        return f"a {value.bit_length()}-bit integer"
    elif isinstance(value, (int, str)):
        text = str(value)
    else:
        return shown(value)
    return text if len(text) <= 40 else text[:20] + "..." + text[-8:]


DTYPE_NAMES = or_list([d.dsl_name for d in DType if d.is_float])  # u64: scalars, said there
ARCH_NAMES = or_list([a.value for a in Arch])


# ---------------------------------------------------------------------------------------------
# Locations


def loc_of(node: object, fallback: SourceLoc = NOWHERE) -> SourceLoc:
    """The node's `loc`, or `fallback` when it has none (IR built in Python may hold anything)."""
    loc = getattr(node, "loc", None)
    return loc if isinstance(loc, SourceLoc) else fallback


def first_located(*locs: SourceLoc) -> SourceLoc:
    """The first location that points into a file."""
    return next((loc for loc in locs if loc.line > 0), locs[-1])


# ---------------------------------------------------------------------------------------------
# Values: what is wrong with a number, in words


def dim_problem(dim: object) -> str | None:
    """Why a fixed dimension is not acceptable, or None."""
    if isinstance(dim, bool) or not isinstance(dim, int) or dim <= 0:
        return f"dimension must be a positive integer, got {number_text(dim)}"
    if dim > MAX_DIM:
        return f"dimension must be at most {MAX_DIM}, got {number_text(dim)}"
    return None


def setting_problem(value: object, what: str) -> str | None:
    """Why a tile size, warp count or stage count is not acceptable, or None."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return f"{what} must be a positive integer, got {number_text(value)}"
    if value > MAX_SETTING:
        return f"{what} must be at most {MAX_SETTING}, got {number_text(value)}"
    return None


def f32_problem(value: object, what: str) -> str | None:
    """Why a constant or scalar default is not a finite f32 number, or None."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"{what} must be a number, got {shown(value)}"
    # An int is compared as an int: float() of a huge one would raise.
    if (isinstance(value, float) and not math.isfinite(value)) or abs(value) > F32_MAX:
        return f"{what} must be a finite f32 number, got {number_text(value)}"
    return None


def checked_int(text: str, what: str, limit: int, loc: SourceLoc) -> int:
    """A tile size, warp count, stage count or fixed dimension as written: 1..limit."""
    digits = text.removeprefix("+")
    if not re.fullmatch(r"[0-9]+", digits) or not digits.strip("0"):
        raise KgenError(loc, f"{what} must be a positive integer, got {number_text(text)}")
    # Compare lengths first: Python refuses to convert strings of thousands of digits.
    if len(digits.lstrip("0")) > len(str(limit)) or int(digits) > limit:
        raise KgenError(loc, f"{what} must be at most {limit}, got {number_text(text)}")
    return int(digits)


# ---------------------------------------------------------------------------------------------
# Identifier safety

MAX_IDENTIFIER_LENGTH = 64

_CPP_KEYWORDS = frozenset(
    """
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t
    char16_t char32_t class compl concept const consteval constexpr constinit const_cast
    continue co_await co_return co_yield decltype default delete do double dynamic_cast else
    enum explicit export extern false final float for friend goto if import inline int long
    module mutable namespace new noexcept not not_eq nullptr operator or or_eq override
    private protected public register reinterpret_cast requires restrict return short signed
    sizeof static static_assert static_cast struct switch template this thread_local throw
    true try typedef typeid typename union unsigned using virtual void volatile wchar_t while
    xor xor_eq
    """.split()
)

_VECTOR_TYPES = frozenset(
    f"{base}{width}"
    for base in (
        "char uchar short ushort int uint long ulong longlong ulonglong float double".split()
    )
    for width in (1, 2, 3, 4)
)

# CUDA built-in variables and types, the C library and math functions a kernel may call, and
# common macros: a parameter with one of these names would shadow or be rewritten by them.
_CUDA_NAMES = _VECTOR_TYPES | frozenset(
    """
    threadIdx blockIdx blockDim gridDim warpSize clusterIdx clusterDim dim3 clock clock64
    half half2 nv_bfloat16 nv_bfloat162 bfloat16 float16 cudaStream_t cudaError_t cudaSuccess
    size_t ptrdiff_t intptr_t uintptr_t int8_t int16_t int32_t int64_t uint8_t uint16_t
    uint32_t uint64_t std cuda nvcuda wmma cooperative_groups cg main errno
    printf malloc free assert memcpy memset NULL EOF INFINITY NAN
    min max abs fabs fabsf exp expf exp2 exp2f log logf log2 log2f sqrt sqrtf rsqrt rsqrtf
    tanh tanhf erf erff pow powf fma fmaf fmin fminf fmax fmaxf floor floorf ceil ceilf
    round roundf sin sinf cos cosf tan tanf
    atomicAdd atomicSub atomicMax atomicMin atomicExch atomicCAS atomicAnd atomicOr atomicXor
    """.split()
) | frozenset(
    # The rest of what NVRTC declares at global scope (the CUDA math API has C linkage, so a
    # kernel of the same name cannot compile) and its header macros. Found by compiling each
    # identifier of the CUDA headers as a kernel name (tests/test_fuzz.py).
    """
    acos acosf acosh acoshf asin asinf asinh asinhf atan atan2 atan2f atanf atanh atanhf cbrt
    cbrtf copysign copysignf cosh coshf cospi cospif cyl_bessel_i0 cyl_bessel_i0f cyl_bessel_i1
    cyl_bessel_i1f erfc erfcf erfcinv erfcinvf erfcx erfcxf erfinv erfinvf exp10 exp10f expm1
    expm1f fdim fdimf fdivide fdividef fmod fmodf frexp frexpf hypot hypotf ilogb ilogbf j0 j0f
    j1 j1f jn jnf labs ldexp ldexpf lgamma lgammaf llabs llmax llmin llrint llrintf llround
    llroundf log10 log10f log1p log1pf logb logbf lrint lrintf lround lroundf modf modff nan
    nanf nearbyint nearbyintf nextafter nextafterf norm norm3d norm3df norm4d norm4df normcdf
    normcdff normcdfinv normcdfinvf normf rcbrt rcbrtf remainder remainderf remquo remquof
    rhypot rhypotf rint rintf rnorm rnorm3d rnorm3df rnorm4d rnorm4df rnormf scalbln scalblnf
    scalbn scalbnf sincos sincosf sincospi sincospif sinh sinhf sinpi sinpif tgamma tgammaf
    trunc truncf ullmax ullmin umax umin y0 y0f y1 y1f yn ynf
    clock_t libraryPropertyType nv_half nv_half2 MAJOR_VERSION MINOR_VERSION PATCH_LEVEL WARP_SZ
    """.split()
)

# Prefixes of CUDA's own names (runtime API, enums, macros) and of the macros kgen emits.
_RESERVED_PREFIX = re.compile(r"cuda|CUDA|CU(?=[a-z_])|NV_|nv_|KGEN_|kgen_")
# kName is how the generated code spells its constants (kTileM, kStages, ...).
_CONSTANT_NAME = re.compile(r"k[A-Z]\w*")

# The DSL's own words: its keywords, functions and reductions.
_KGEN_KEYWORDS = (
    frozenset(
        """
        acc row col kernel tensor vector scalar gemm epilogue tile warps stages keep target
        compute reductions atomic deterministic accumulate in out cast where registers smem
        f16 bf16 f32 f8e4m3 f8e5m2 neg
        """.split()
    )
    | frozenset(FUNCTIONS)
    | frozenset(REDUCTIONS)
)

# Names the generated CUDA uses for its own variables. The emitter must not use a name that is
# not listed here for anything a DSL name could collide with.
_GENERATED_NAMES = frozenset(
    "p params smem tid lane warp_id row col M_ N_ K_ tile_m tile_n acc_frag a_smem b_smem "
    "SharedStorage ALayout BLayout smem_raw ReduceSum ReduceMax ReduceMin ReduceAbsMax".split()
)

RESERVED_IDENTIFIERS: frozenset[str] = (
    _CPP_KEYWORDS | _CUDA_NAMES | _KGEN_KEYWORDS | _GENERATED_NAMES
)

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def check_identifier(name: object, loc: SourceLoc, what: str) -> None:
    """Refuse a name that is unsafe as a C++ identifier in the generated code.

    `what` says what is being named ("kernel", "tensor", "gemm", "local", "dimension", ...).
    """
    if not isinstance(name, str):
        raise KgenError(loc, f"{what} name must be a string, got {type(name).__name__}")
    if name and not name.isascii():
        raise KgenError(
            loc,
            f"{what} name {quote(name)} is not ASCII; use only letters A-Z, a-z, digits and '_'",
        )
    if name.startswith("_") or "__" in name:
        raise KgenError(
            loc,
            f"{what} name {quote(name)} must not start with '_' or contain '__' "
            "(such names are reserved in C++)",
        )
    if not _IDENTIFIER.fullmatch(name):
        raise KgenError(
            loc,
            f"{what} name {quote(name)} must start with a letter and use only letters, "
            "digits and '_'",
        )
    if len(name) > MAX_IDENTIFIER_LENGTH:
        raise KgenError(
            loc,
            f"{what} name is {len(name)} characters long; at most {MAX_IDENTIFIER_LENGTH} "
            "are allowed",
        )
    if name in _CPP_KEYWORDS:
        raise KgenError(loc, f"{what} name '{name}' is a C++ keyword")
    if name in _KGEN_KEYWORDS:
        raise KgenError(loc, f"{what} name '{name}' is reserved (a kgen keyword or function)")
    if name in _GENERATED_NAMES or _CONSTANT_NAME.fullmatch(name):
        raise KgenError(loc, f"{what} name '{name}' is reserved (the generated code uses it)")
    if prefix := _RESERVED_PREFIX.match(name):
        raise KgenError(
            loc,
            f"{what} name '{name}' is reserved (names starting with '{prefix.group()}' belong "
            "to CUDA or kgen)",
        )
    if name in RESERVED_IDENTIFIERS:
        raise KgenError(loc, f"{what} name '{name}' is reserved (a CUDA or C library name)")


def loop_row_message(name: str, a: str, b: str) -> str:
    """The message for a loop-row tile (`gemm name = a^T @ b`) read anywhere but its own `+=`
    store: the parser's and the verifier's."""
    return (f"'{name}' is a loop-row tile (gemm {name} = {a}^T @ {b}): it lies at the loop's "
            f"rows, so only its own epilogue reads it, as acc, to add it into an 'out "
            f"accumulate' tensor ({name}'s epilogue: 'dQ += acc')")
