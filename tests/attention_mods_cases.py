"""The forward's mods the backward takes, each as kgen.attention's options and as the same terms
written in torch (float64 autograd of a reference attention): shared by the CPU test of the
backward's program (tests/test_attention_grad_mods.py, the NumPy reference) and the GPU test
(tests/gpu/test_attention_grad_mods_gpu.py, the kernels)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable


@dataclass(frozen=True)
class Case:
    name: str
    options: dict  # kgen.attention's keyword options, but vectors and attn_mask
    # torch: score(torch, s, row, col, vectors, scalars) -> s'; mask(row, col, vectors,
    # scalars) -> bool (row, col: float64 [S, 1] and [1, T])
    score: Callable | None = None
    mask: Callable | None = None
    vectors: Callable | None = None  # (torch, gen, b, h, s, t) -> {name: tensor}
    bias: str = ""  # "", "full" (attn_mask [B, H, S, T]), "heads" ([1, H, S, T]),
    # "cols" ([B, 1, 1, T], no grad), "bool" ([S, T] bool)
    bias_grad: bool = False
    extra: dict = field(default_factory=dict)


def _doc_ids(torch, gen, n, docs):
    cuts = torch.sort(torch.randint(0, max(n, 1), (docs - 1,), generator=gen)).values
    return torch.bucketize(torch.arange(n), cuts, right=True).double()


CASES = [
    Case("softcap", {"score_mod": "cap * tanh(score / cap)", "scalars": {"cap": 2.0},
                     "is_causal": True},
         score=lambda torch, s, r, c, v, k: k["cap"] * torch.tanh(s / k["cap"])),
    Case("alibi", {"score_mod": "score - slopes[head] * (row - col)", "is_causal": True},
         score=lambda torch, s, r, c, v, k: s - v["slopes"][None, :, None, None] * (r - c),
         vectors=lambda torch, gen, b, h, s, t: {
             "slopes": torch.rand(h, generator=gen).double() * 0.3}),
    Case("window", {"mask_mod": "col > row - window", "scalars": {"window": 37.0},
                    "is_causal": True},
         mask=lambda r, c, v, k: c > r - k["window"]),
    Case("causal_bottom_right", {"mask_mod": "col <= row + T - S"},
         mask=lambda r, c, v, k: c <= r + k["T"] - k["S"]),
    Case("document", {"mask_mod": "qd[row] == kd[col]"},
         mask=lambda r, c, v, k: v["qd"][:, None, :, None] == v["kd"][:, None, None, :],
         vectors=lambda torch, gen, b, h, s, t: {
             "qd": torch.stack([_doc_ids(torch, gen, s, 3) for _ in range(b)]),
             # one more document among the keys: some queries keep no key
             "kd": torch.stack([_doc_ids(torch, gen, t, 4) for _ in range(b)])}),
    # a score_mod of -inf: the first queries keep no key (lse -inf), through the mod alone
    Case("score_mod_inf", {"score_mod": "where(col <= row - 3, score, -inf)"},
         score=lambda torch, s, r, c, v, k: torch.where(c <= r - 3, s, float("-inf"))),
    Case("bias_grad", {"is_causal": True}, bias="heads", bias_grad=True),
    Case("bias_full_grad", {}, bias="full", bias_grad=True),
    Case("bias_bool", {}, bias="bool"),
    Case("bias_cols", {"score_mod": "score * 0.5 + 1"}, bias="cols",
         score=lambda torch, s, r, c, v, k: s * 0.5 + 1),
]

def inputs_of(case: Case, torch, gen, b, h, s, t):
    """The case's vectors and attn_mask (float64 on the CPU; the caller moves and casts)."""
    vectors = case.vectors(torch, gen, b, h, s, t) if case.vectors else {}
    bias = None
    if case.bias == "full":
        bias = torch.randn(b, h, s, t, generator=gen).double()
    elif case.bias == "heads":
        bias = torch.randn(1, h, s, t, generator=gen).double()
    elif case.bias == "cols":
        bias = torch.randn(b, 1, 1, t, generator=gen).double()
    elif case.bias == "bool":
        bias = torch.rand(s, t, generator=gen) > 0.3
        bias[: min(2, s)] = False  # rows that keep no key
    return vectors, bias


def reference_attention(torch, case: Case, q, k, v, bias, vectors: dict[str, Any],
                        scale: float):
    """Float64 attention with the case's terms (autograd records it): O and the log-sum-exp;
    a query that keeps no key gives O = 0, lse = -inf (kgen's convention)."""
    s_len, t_len = q.shape[2], k.shape[2]
    scores = (q @ k.transpose(-1, -2)) * scale
    if bias is not None and bias.dtype == torch.bool:
        scores = scores.masked_fill(~bias, float("-inf"))
    elif bias is not None:
        scores = scores + bias
    row = torch.arange(s_len, dtype=torch.float64, device=q.device)[:, None]
    col = torch.arange(t_len, dtype=torch.float64, device=q.device)[None, :]
    scalars = dict(case.options.get("scalars", {}), S=s_len, T=t_len)
    if case.score is not None:
        scores = case.score(torch, scores, row, col, vectors, scalars)
    keep = torch.ones(scores.shape, dtype=torch.bool, device=q.device)
    if case.options.get("is_causal"):
        keep = keep & (col <= row)
    if case.mask is not None:
        keep = keep & case.mask(row, col, vectors, scalars)
    x = scores.masked_fill(~keep, float("-inf"))
    m = x.amax(-1, keepdim=True).detach()
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    p = torch.exp(x - m)
    total = p.sum(-1, keepdim=True)
    empty = total == 0
    out = torch.where(empty, torch.zeros_like(p), p / torch.where(empty, 1.0, total)) @ v
    lse = torch.where(empty, float("-inf"), m + torch.log(torch.where(empty, 1.0, total)))
    return out, lse[..., 0]
