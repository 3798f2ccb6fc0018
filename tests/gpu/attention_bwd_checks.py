"""What the GPU tests of the attention backward's main kernel share (examples/attention_bwd.kg,
the DAG loop; tests/gpu/test_attention_bwd*_gpu.py): the program's text for a head dim, mask,
dtype, target, tile, GQA and deterministic mode; its build (with the sm_90a plan options
`adds` and `schedule`), loaded once per process; the float64 autograd reference; and the check
of one call: dQ, dK and dV poisoned (NaN) first, then against the reference."""
from __future__ import annotations

import dataclasses
import math
from pathlib import Path

from kgen import ir
from kgen.api import build_verified, load_built
from kgen.parse import parse
from kgen.verify import verify
from tests.gpu.attention_checks import close_grads, cuda_torch

PROGRAM = Path(__file__).resolve().parents[2] / "examples" / "attention_bwd.kg"
MASKED = "where(row <= col, exp(scale * acc - lse[col]), 0)"
MASKS = {
    "none": "exp(scale * acc - lse[col])",
    "top_left": MASKED,  # key <= query
    "bottom_right": "where(row <= col + T - S, exp(scale * acc - lse[col]), 0)",
}


def kernel_text(d: int, mask: str, dtype: str = "bf16", arch: str = "sm_80",
                tile: str | None = None, gqa: bool = False, deterministic: bool = False) -> str:
    """The example for head dim `d`, `mask` (of MASKS), `dtype`, `arch` and `tile` (None: the
    rulebook's for the head dim); `gqa`: K, V, dK, dV of HKV heads; `deterministic`: its
    `reductions deterministic` line."""
    text = PROGRAM.read_text()
    assert MASKED in text and "target sm_80" in text
    text = (text.replace(MASKED, MASKS[mask]).replace("128]", f"{d}]")
            .replace("bf16[", f"{dtype}[").replace("target sm_80", f"target {arch}")
            .replace("0.08838834764", repr(1.0 / math.sqrt(d)))
            .replace("    tile 128x32\n", f"    tile {tile}\n" if tile else ""))
    if gqa:
        for name in ("K", "V", "dK", "dV"):
            text = text.replace(f"tensor {name} : {dtype}[B, H,",
                                f"tensor {name} : {dtype}[B, HKV,")
    if deterministic:
        text = text.replace("kernel attention_bwd {\n",
                            "kernel attention_bwd {\n  reductions deterministic\n")
    return text


def built_for(d, mask, dtype="bf16", arch="sm_80", tile=None, adds=None, schedule=(),
              gqa=False, deterministic=False, grid=None):
    """kernel_text's program built for `arch`. `grid` True / False: the mma.sync skeleton's
    warp grid where the rulebook allows it / the warp rows (the plan option
    dag_mma_rules.warp_grid); None: as the rulebook takes it. `adds` "warp" / "tensor" /
    "rows" / "atomics": the sm_90a wgmma skeleton with dQ added by the copy engine's tensor
    reduce-add from the producer's add warp / from a thread of each warpgroup / its bulk
    reduce-add per staged row / f32 atomics (the plan option loop_dag_schedule.with_adds);
    None: as the rulebook takes it (the add warp). `schedule`: (name, value) pairs of
    loop_dag_schedule.with_schedule's plan options."""
    module = parse(kernel_text(d, mask, dtype, arch, tile, gqa, deterministic), "bwd.kg")
    assert verify(module) == []
    if grid is None:
        built = build_verified(module.kernels[0], ir.Arch(arch))
    else:
        from kgen.targets import dag_mma_rules

        with dag_mma_rules.warp_grid(grid):
            built = build_verified(module.kernels[0], ir.Arch(arch))
    assert built.plan.gqa == gqa and (built.plan.deterministic is not None) == deterministic
    plan = built.plan
    if adds is not None:
        from kgen.targets.sm90.loop_dag_schedule import with_adds

        plan = with_adds(plan, adds)
    if schedule:
        from kgen.targets.sm90.loop_dag_schedule import with_schedule

        plan = with_schedule(plan, **dict(schedule))
    if plan is built.plan:
        return built
    from kgen.targets.sm90.loop_dag import emit

    return dataclasses.replace(built, plan=plan, source=emit(
        plan, source_name="bwd.kg", source_hash="0", command="test"))


_LOADED: dict = {}


def load(d, mask, dtype="bf16", arch="sm_80", tile=None, adds=None, schedule=(), gqa=False,
         deterministic=False, grid=None):
    """built_for's kernel loaded (once per process and arguments)."""
    key = (d, mask, dtype, arch, tile, adds, schedule, gqa, deterministic, grid)
    if key not in _LOADED:
        _LOADED[key] = load_built(built_for(*key))
    return _LOADED[key]


def reference(q, k, v, do, scale, mask):
    """float64 autograd of attention, K and V shared by each group of q's heads (GQA: dK, dV
    summed over it; MHA: groups of one); a row that sees no key gives O = 0, lse = -inf and no
    gradient. Returns dQ, dK, dV, lse, D."""
    torch = cuda_torch()
    group = q.shape[1] // k.shape[1]
    q, k, v = (x.double().requires_grad_() for x in (q, k, v))
    kr, vr = (x.repeat_interleave(group, 1) for x in (k, v))
    s_len, t_len = q.shape[-2], k.shape[-2]
    x = (q @ kr.transpose(-1, -2)) * scale
    query = torch.arange(s_len, device=q.device)[:, None]
    key = torch.arange(t_len, device=q.device)[None, :]
    if mask == "top_left":
        x = torch.where(key <= query, x, -math.inf)
    elif mask == "bottom_right":
        x = torch.where(key <= query + t_len - s_len, x, -math.inf)
    m = x.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), 0.0, m)
    e = torch.exp(x - m)
    total = e.sum(-1, keepdim=True)
    o = (e / torch.where(total == 0, 1.0, total)) @ vr
    o.backward(do.double())
    with torch.no_grad():
        lse = torch.where(total == 0, -math.inf, m + torch.log(total)).squeeze(-1)
        dd = (do.double() * o).sum(-1)
    return q.grad, k.grad, v.grad, lse, dd


def check_backward(kernel, q, k, v, do, mask, repeat=1):
    """`repeat` calls of the main kernel `kernel` on q, k, v, dO (lse and D from `reference`,
    scale 1 / sqrt(head dim)), dQ (f32), dK and dV (the inputs' dtype) poisoned with NaN before
    each, every output against float64 autograd (2e-2 of the reference's magnitude for bf16,
    1e-2 for f16): each call's (dQ, dK, dV)."""
    torch = cuda_torch()
    b, heads, s, d = q.shape
    kv_heads, t = k.shape[1], k.shape[2]
    scale = 1.0 / math.sqrt(d)
    dq_ref, dk_ref, dv_ref, lse, dd = reference(q, k, v, do, scale, mask)
    tol = 2e-2 if q.dtype == torch.bfloat16 else 1e-2
    runs = []
    for _ in range(repeat):
        dq = torch.full((b, heads, s, d), math.nan, device=q.device, dtype=torch.float32)
        dk, dv = (torch.full((b, kv_heads, t, d), math.nan, device=q.device, dtype=q.dtype)
                  for _ in range(2))
        kernel(Q=q, K=k, V=v, dO=do, lse=lse.float(), D=dd.float(), dQ=dq, dK=dk, dV=dv,
               scale=scale)
        torch.cuda.synchronize()
        close_grads((dq, dk, dv), (dq_ref, dk_ref, dv_ref), tol)
        runs.append((dq, dk, dv))
    return runs
