"""The host API that the emitted .cu defines and the emitted .h declares: the `<name>_params`
struct and the signatures of `<name>_can_implement` and `<name>_launch`.

Both files print them from the same values (the struct through one template fragment,
templates/common/params_struct.inc.j2), so they cannot drift apart. The struct sits under the guard
macro `KGEN_<NAME>_PARAMS_DEFINED`, so a translation unit may include the header and the .cu.
"""
from __future__ import annotations

from ... import __version__
from ...enums import ParamKind
from ...plan import FieldKind, KernelPlan
from . import batch
from .operands import dim_expr, narrow_checks
from .render import render


def _field_comment(plan: KernelPlan, kind: FieldKind, param: str | None, dim: str | None) -> str:
    if kind is FieldKind.POINTER:
        p = plan.param(param or "")
        assert p is not None
        shape = ", ".join(str(d) for d in p.full_shape)
        layout = f" {p.layout.value}" if p.kind is ParamKind.TENSOR else ""
        return f"{p.kind.value} {p.dtype.dsl_name}[{shape}]{layout} {p.role.value}"
    if kind is FieldKind.SIZE:
        return f"runtime size {dim}"
    if kind is FieldKind.WORKSPACE and plan.schedule.stream_k:
        return ("device scratch for stream-K's partial sums and flags (zeroed once before the "
                "first launch; each launch leaves it so)")
    if kind is FieldKind.WORKSPACE:
        return "device scratch for the CTAs' partial reductions (deterministic mode)"
    if kind is FieldKind.BATCH_STRIDE:
        return f"elements between consecutive batches of {param} (0: one for every batch)"
    if kind is FieldKind.LEADING_DIM:
        return f"elements between consecutive rows/columns of {param}"
    p = plan.param(param or "")
    default = "" if p is None or p.default is None else f", default {p.default}"
    return f"scalar{default}"


def fields(plan: KernelPlan) -> list[dict]:
    return [
        dict(decl=f"{f.ctype} {f.name};", comment=_field_comment(plan, f.kind, f.param, f.dim))
        for f in plan.fields
    ]


def template_values(plan: KernelPlan) -> dict:
    """What the params-struct fragment and the host functions need, for either file."""
    name = plan.name
    return dict(
        fields=fields(plan),
        params_guard=f"KGEN_{name.upper()}_PARAMS_DEFINED",
        can_implement_signature=f"const char* {name}_can_implement(const {name}_params& p)",
        launch_signature=f"cudaError_t {name}_launch(const {name}_params& p, cudaStream_t stream)",
        workspace_signature=f"size_t {name}_workspace_bytes(const {name}_params& p)",
        workspace_body=workspace_body(plan),
        narrow_checks=narrow_checks(plan),
        narrow_kernel=plan.narrow_kernel,
        cluster=plan.schedule.cluster_size > 1,  # the fast entry point runs in clusters
    )


def workspace_body(plan: KernelPlan) -> list[str]:
    """C++ statements of <name>_workspace_bytes: the float partials deterministic reductions
    keep per CTA (none in the atomic mode), or the split-K parts; every batch's."""
    if plan.schedule.stream_k:
        return stream_workspace_body(plan)
    setup, floats = batch.workspace_lines(plan, "size_t", f"{plan.name}_kgen")
    if not floats:
        return ["(void)p;", "return 0;"]
    batches = (f"static_cast<size_t>({batch.batch_count(plan)}) * "
               if batch.batched(plan) else "")
    note = ""
    if plan.split_kernel is not None:
        note = "  // split-K partials" + (", then the reductions' slots" if plan.deterministic
                                          else "")
    return setup + [f"return sizeof(float) * {batches}{floats};{note}"]


def stream_units(plan: KernelPlan) -> str:
    """Stream-K: the host's count of the walk's steps (each tile's k tiles, one when K = 0, in
    every batch), over tiles_m and tiles_n (and batches) in scope."""
    ns, k = f"{plan.name}_kgen", dim_expr(plan.gemms[0].k_dim)
    tiles = batch.grid_count(plan, "static_cast<long long>(tiles_m) * tiles_n")
    return f"({tiles} * ({k} > 0 ? ({k} + {ns}::kTileK - 1) / {ns}::kTileK : 1))"


def stream_workspace_body(plan: KernelPlan) -> list[str]:
    """Stream-K: a slot of a tile's f32 sums and the flags per CTA of the launch's grid (the
    current device's resident CTAs, at most one per step of the walk). The flags must be zero
    before the first launch (cudaMemset once); each launch leaves them zero."""
    ns = f"{plan.name}_kgen"
    g = plan.gemms[0]
    lines = [f"const {ns}::DeviceState* state = nullptr;",
             f"if ({ns}::current_device(state) != cudaSuccess) return 0;",
             f"const long long tiles_m = ({dim_expr(g.m_dim)} + {ns}::kTileM - 1) / {ns}::kTileM;",
             f"const long long tiles_n = ({dim_expr(g.n_dim)} + {ns}::kTileN - 1) / {ns}::kTileN;"]
    if batch.batched(plan):
        lines.append(f"const long long batches = {batch.batch_count(plan)};")
    return lines + [
        f"const long long units = {stream_units(plan)};",
        "const long long ctas = units < state->slots ? units : state->slots;",
        f"return sizeof(float) * static_cast<size_t>(ctas) * ({ns}::kTileM * {ns}::kTileN + "
        f"{plan.STREAM_FLAGS});  // stream-K: each CTA's slot, then its flags (zeroed once)"]


def header_file_lines(plan: KernelPlan, source_name: str, source_hash: str,
                      command: str, header_name: str | None = None) -> list[str]:
    return [
        f"{plan.name}.h: generated by kgen {__version__} from {source_name} "
        f"(sha256 {source_hash}). Do not edit.",
        f"Regenerate with: {command} --header {header_name or plan.name + '.h'}",
        f"The host API of {plan.name}.cu: build that file with nvcc, then call it from any C++.",
    ]


def emit_header(plan: KernelPlan, *, source_name: str, source_hash: str, command: str,
                header_name: str | None = None) -> str:
    """The .h text: include guard, the params struct, the two host function declarations."""
    return render(
        "common/kernel_header.h.j2",
        header=header_file_lines(plan, source_name, source_hash, command, header_name),
        name=plan.name,
        include_guard=f"KGEN_{plan.name.upper()}_H",
        **template_values(plan),
    )
