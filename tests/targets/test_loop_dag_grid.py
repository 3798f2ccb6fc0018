"""The warp grid of the DAG loop's mma.sync skeleton (plan.loop_dag.DagGrid; the rulebook's
kgen/targets/dag_mma_rules.py dag_warp_grid, its plan option warp_grid): the rulebook's default
(the warp rows, the .cu unchanged), its refusals with why, and the emitted index math run on the
CPU: the constants and a warp's places as the .cu spells them, evaluated for every warp, lane
and fragment element, must cover each score tile, accumulator and loop-row tile once, at the
places the MMAs and the ldmatrix loads give (a fragment's origin plus the m16n8k16 C layout:
row lane / 4 (+ 8), columns 2 (lane % 4) (+ 1)), and a staged element must land where the
score tile's element is."""
from __future__ import annotations

import re

import pytest

from kgen import ir
from kgen.targets import dag_mma_rules
from kgen.targets.common.loop_dag import grid_shapes
from tests.attention_mods_cases import MOD_FIELDS

from .test_loop_dag_compile import built


def _grid(d: int, mask: str = "none", arch=ir.Arch.SM80, tile: str | None = None):
    with dag_mma_rules.warp_grid(True):
        return built(d, mask, arch, tile=tile)


def _constants(source: str) -> dict[str, int]:
    """Every `constexpr int` of the kernel's configuration namespace, evaluated in order."""
    env: dict[str, int] = {}
    config = source[source.index("namespace "):source.index("}  // namespace")]
    for line in config.split("\n"):
        found = re.match(r"\s*(?:\[\[maybe_unused\]\] )?constexpr int (.*?);", line)
        if found:
            for item in found.group(1).split(", "):
                name, value = item.split(" = ")
                env[name] = _eval(value, env)
    return env


def _eval(expr: str, env: dict) -> int:
    """A C++ int expression of non-negative values (/ truncates as //)."""
    return eval(expr.replace("/", "//"), {}, dict(env))  # noqa: S307 (the .cu's own text)


def _places(shape: dict, env: dict, jn: int, extra=None):
    """(warp, lane, j, e) -> (row, col) of `shape`, every warp and lane."""
    out = {}
    for warp in range(env["kWarps"]):
        for lane in range(32):
            here = dict(env, warp=warp, lane=lane, quad_col=2 * (lane % 4))
            for name, value in extra(here) if extra else ():
                here[name] = _eval(value, here)
            for j in range(jn):
                for e in range(4):
                    at = dict(here, j=j, e=e, i=e >> 1)
                    out[warp, lane, j, e] = (_eval(shape["row"], at), _eval(shape["col"], at))
    return out


def _once(places: dict, rows: int, cols: int) -> None:
    seen = sorted(places.values())
    assert seen == [(r, c) for r in range(rows) for c in range(cols)], "each element once"


def _c_layout(places: dict, origin) -> None:
    """Each element at its fragment's origin plus the MMA's C layout."""
    for (warp, lane, j, e), (row, col) in places.items():
        r0, c0 = origin(warp, j)
        assert (row, col) == (r0 + lane // 4 + 8 * (e >> 1), c0 + 2 * (lane % 4) + (e & 1))


def test_the_rulebook_s_default_and_the_warp_rows():
    """A plan without the option takes DAG_WARP_GRID's layout; the warp rows say why and emit
    no grid (their .cu: the goldens')."""
    b = built(128, "top_left", ir.Arch.SM80)
    assert (b.plan.grid is not None) == dag_mma_rules.DAG_WARP_GRID
    with dag_mma_rules.warp_grid(False):
        b = built(128, "top_left", ir.Arch.SM80)
    assert b.plan.grid is None and b.plan.layout.value == "warp rows"
    assert "DAG_WARP_GRID off" in b.plan.layout.why
    assert "kScoreWM" not in b.source and "// Warps:" not in b.source
    assert all(g.m_tiles == 1 for g in b.plan.gemms)


@pytest.mark.parametrize("d", [64, 128])
def test_the_grid_plan_stages_every_handed_value(d):
    plan = _grid(d, "top_left").plan
    assert plan.grid is not None and plan.layout.value == "warp grid"
    assert "FlashAttention-2" in plan.layout.why
    kinds = {g.name: (g.a_load.value, g.a, g.m_tiles, g.n_warp) for g in plan.gemms}
    assert kinds == {"st": ("ldsm_a", "k_res", 2, 32), "dv": ("ldsm_a", "h0_smem", 2, d // 2),
                     "dpt": ("ldsm_a", "v_res", 2, 32), "dk": ("ldsm_a", "t0_smem", 2, d // 2),
                     "dq": ("ldsm_a_km", "t0_smem", 2, d // 4)}
    names = [type(s).__name__ for s in plan.body.statements]
    assert "HandTile" not in names and names.count("StageTile") == 2
    # P^T keeps its bytes to the block's end (DAG_GRID_OWN_BYTES): no barrier before dS^T's
    # writes; without, the two share bytes and dS^T's writes wait for P^T's readers
    buffers = {b.name: b for b in plan.storage.buffers}
    assert not buffers["h0_smem"].shares_bytes(buffers["t0_smem"]) and plan.fenced == ()
    with dag_mma_rules.warp_grid(False):
        rows = built(d, "top_left", ir.Arch.SM80).plan  # P^T's [128][64] bf16 more
    assert plan.smem_bytes == rows.smem_bytes + 128 * 64 * 2 <= 163 * 1024
    assert "shares bytes with a tile read earlier" not in _grid(d, "top_left").source
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dag_mma_rules, "DAG_GRID_OWN_BYTES", False)
        shared = _grid(d, "top_left").plan
    at = {b.name: b.offset for b in shared.storage.buffers}
    assert at["h0_smem"] == at["t0_smem"] and shared.fenced == ("t0_smem",)


@pytest.mark.parametrize("d, mask, tile", [(64, "none", None), (128, "top_left", None),
                                           (128, "bottom_right", "128x32")])
def test_the_emitted_index_math_covers_each_tile_once_at_the_mma_places(d, mask, tile):
    b = _grid(d, mask, tile=tile)
    plan, source = b.plan, b.source
    shapes = grid_shapes(plan)
    env = _constants(source)

    def coords(here):
        return shapes["coords"]
    env.update(row0=0, kv0=0)
    nt = env["kScoreNT"]
    # the score tiles: [kTileM, kBlock], fragment j at (s_row0 + 16 (j / NT), s_col0 + 8 (j % NT))
    places = _places(shapes["body"], env, env["kScoreFrags"], coords)
    _once(places, plan.tile_m, plan.block)

    def score_origin(warp, j):
        here = dict(env, warp=warp, lane=0)
        return (_eval("(warp / kScoreWN) * (16 * kScoreMT)", here) + 16 * (j // nt),
                _eval("(warp % kScoreWN) * (8 * kScoreNT)", here) + 8 * (j % nt))
    _c_layout(places, score_origin)
    score = next(g for g in plan.gemms if g.kind.value == "score")
    assert (f"(a[mt], smem.{score.a}[0], s_row0 + mt * 16, ks * 16)" in source
            and f"(b, smem.{score.b}[slot], s_col0 + np * 16, ks * 16)" in source
            and f"mma_16816(acc_g{score.index}[mt * {nt} + 2 * np + 1], a[mt], b[2], b[3])"
            in source)
    # a staged element (its row pair h = i, its column pair) where the score element is
    stage = {"row": shapes["body"]["stage_r"], "col": shapes["body"]["stage_c"] + " + (e & 1)"}
    staged = _places({"row": stage["row"].replace(" h", " i"), "col": stage["col"]}, env,
                     env["kScoreFrags"], coords)
    assert staged == places
    # the accumulators: [kTileM, N], fragment j at (acc_row0 + 16 (j / n8), acc_n0 + 8 (j % n8))
    for g in plan.gemms:
        if g.kind.value != "accumulating":
            continue
        tail = dict(shapes["tails"][g.n], jn=g.m_tiles * g.n8_tiles)
        places = _places(tail, env, tail["jn"], coords)
        _once(places, plan.tile_m, g.n)
        acc_n0 = shapes["starts"][g.name]["acc_n0"]
        _c_layout(places, lambda warp, j, g=g, acc_n0=acc_n0: (
            _eval("(warp / kAccWN) * (16 * kAccMT)", dict(env, warp=warp))
            + 16 * (j // g.n8_tiles), _eval(acc_n0, dict(env, warp=warp)) + 8 * (j % g.n8_tiles)))
        assert (g.m_tiles * g.n8_tiles == g.n // 8
                and f"store_warp_rows<kAccMT, {g.n8_tiles}>" in tail["store_tile"])
        assert (f"(a[mt], smem.{g.a}[0], acc_row0 + mt * 16, ks * 16)" in source
                and f"(b, smem.{g.b}[slot], acc_n0 + np * 16, ks * 16)" in source
                and f"mma_16816(acc_g{g.index}[mt * {g.n8_tiles} + 2 * np + 1], a[mt], b[2], "
                "b[3])" in source)
    # a loop-row tile: [kBlock, N], fragment j at (lr_m0 + 16 (j / n8), lr_col0 + 8 (j % n8))
    for g in plan.gemms:
        if g.kind.value != "loop_row":
            continue
        starts = shapes["starts"][g.name]
        def extra(here, s=starts):
            return [("lr_m0", s["lr_m0"]), ("lr_col0", s["lr_col0"]),
                    ("lr_row0", "kv0 + lr_m0 + lane / 4")]
        places = _places(shapes["loop_row"][g.name], env, g.m_tiles * g.n8_tiles, extra)
        _once(places, plan.block, g.n)
        _c_layout(places, lambda warp, j, g=g, s=starts: (
            _eval(s["lr_m0"], dict(env, warp=warp)) + 16 * (j // g.n8_tiles),
            _eval(s["lr_col0"], dict(env, warp=warp)) + 8 * (j % g.n8_tiles)))
        assert "const int lr_row0 = kv0 + lr_m0 + lane / 4;" in source
        assert (f"(a[mt], smem.{g.a}[0], lr_m0 + mt * 16, ks * 16)" in source
                and f"(b, smem.{g.b}[0], lr_col0 + np * 16, ks * 16)" in source
                and f"mma_16816(acc_g{g.index}[mt * {g.n8_tiles} + 2 * np + 1], a[mt], b[2], "
                "b[3])" in source)


def test_the_grid_is_refused_with_why_where_it_does_not_tile():
    refused = dag_mma_rules.dag_warp_grid(128, 64, 8, (96,), (96,), 0, 1, None, wanted=True)
    assert refused[0] is None and "the 2 x 4 grid needs m16 tiles" in refused[1]
    refused = dag_mma_rules.dag_warp_grid(128, 64, 8, (128,), (128,), 0, 1,
                                          "the row reduction in 'm': a row ...", wanted=True)
    assert refused[0] is None and refused[1].endswith("the row reduction in 'm': a row ...")
    refused = dag_mma_rules.dag_warp_grid(128, 64, 8, (128,), (128,), 2, 1, None, wanted=True)
    assert refused[0] is None and "shared memory" in refused[1]
    refused = dag_mma_rules.dag_warp_grid(64, 64, 4, (128,), (128,), 0, 1, None, wanted=True)
    assert refused[0] is None and "4 warps" in refused[1]
    chosen, why = dag_mma_rules.dag_warp_grid(128, 32, 8, (64,), (64,), 0, 1, None, wanted=True)
    assert chosen == ((4, 2), (4, 2), (2, 4)) and "4 x 2" in why


def test_a_refused_grid_falls_back_to_the_warp_rows():
    """Head dim 96: dQ's [64, 96] tile has no 2 x 4 grid of 16-column shares."""
    plan = _grid(96).plan
    assert plan.grid is None and "the 2 x 4 grid" in plan.layout.why


def test_the_wgmma_skeleton_keeps_its_own_layout():
    plan = _grid(128, "top_left", ir.Arch.SM90A).plan
    assert plan.wgmma is not None and plan.grid is None


def test_the_plan_option_restores_the_rulebook_default():
    default = dag_mma_rules.DAG_WARP_GRID
    with dag_mma_rules.warp_grid(not default):
        assert dag_mma_rules.DAG_WARP_GRID is not default
        with pytest.raises(ValueError):
            raise ValueError("inside")
    assert dag_mma_rules.DAG_WARP_GRID is default


MODS = MOD_FIELDS


def _backward(d: int, causal: bool = True, mod: str | None = None, gqa: bool = False,
              deterministic: bool = False, varlen: bool = False, blocks: bool = False):
    """kgen.attention's (or attention_varlen's) backward main kernel, planned with the grid
    allowed (sm_80): its source and plan."""
    from kgen import attention_varlen
    from kgen.api import build_verified
    from kgen.attention_grad import BackwardSignature, backward_module
    from kgen.attention_grad_mods import Mods

    sig = BackwardSignature("bf16", d, causal, "sm_80", gqa=gqa, deterministic=deterministic,
                            mods=Mods(**MODS[mod]) if mod else None, blocks=blocks)
    module = attention_varlen.backward_module(sig) if varlen else backward_module(sig)
    (main,) = [k for k in module.kernels if k.name.endswith("_main")]
    with dag_mma_rules.warp_grid(True):
        return build_verified(main, ir.Arch.SM80)


@pytest.mark.parametrize("mod, d, grid", [
    ("softcap", 64, False), ("softcap", 128, False), ("bias_grad", 128, False),
    ("bias_grad", 64, True), ("alibi", 128, True), ("document", 128, True),
    ("dropout", 128, True), ("bias", 128, True)])
def test_the_rulebook_refuses_the_grid_where_it_spilled(mod, d, grid):
    plan = _backward(d, mod=mod).plan
    assert (plan.grid is not None) == grid, plan.layout.why
    if not grid:
        assert plan.layout.why.endswith(dag_mma_rules.DAG_GRID_SPILLS_WHY)
        assert ("tanh" if mod == "softcap" else "the tile store of") in plan.layout.why


def test_a_block_mask_takes_the_grid_at_head_dim_64_only():
    assert _backward(64, False, blocks=True).plan.grid is not None
    why = _backward(128, False, blocks=True).plan.layout.why
    assert "a block mask's walk at N 128" in why


SPILL_CASES = [dict(mod=m, d=d) for m in ("alibi", "document", "dropout", "bias")
               for d in (64, 128)] + [
    dict(mod="bias_grad", d=64), dict(d=128, gqa=True), dict(d=64, gqa=True),
    dict(d=128, deterministic=True), dict(d=64, deterministic=True), dict(d=128, varlen=True),
    dict(d=64, varlen=True, causal=False), dict(d=64, blocks=True, causal=False)]


@pytest.mark.slow
@pytest.mark.parametrize("case", SPILL_CASES, ids=lambda c: "-".join(
    f"{k}{'' if v is True else v}" for k, v in c.items()))
def test_the_options_on_the_grid_compile_without_spills(case):
    """Every option the grid takes, as kgen.attention's backward plans it, sm_80 and sm_90a
    builds of the sm_80 plan: no spill, no stack (NVRTC)."""
    from kgen.runtime.nvrtc import compile_cubin

    b = _backward(**case)
    assert b.plan.grid is not None, b.plan.layout.why
    for arch in ("sm_80", "sm_90a"):
        resources = compile_cubin(b.source, b.plan.name, arch).resources()
        assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
            (arch, resources)


def test_the_grid_runs_the_compact_body_from_n_128():
    compact, why = dag_mma_rules.dag_compact_body(240, dag_mma_rules.DAG_GRID_COMPACT_N)
    assert compact and "the warp grid at N 128" in why and "DAG_GRID_COMPACT_N" in why
    assert dag_mma_rules.dag_compact_body(240, 64) == (False, "")
    assert dag_mma_rules.dag_compact_body(240) == (False, "")  # the warp rows: the estimate's
    source = _grid(128, "top_left", tile="128x32").source
    assert "// The compact body, the warp grid at N 128" in source


WRITTEN = [(128, "none", "128x32", None), (128, "top_left", "128x32", None),
           (64, "bottom_right", "128x32", None), (128, "top_left", None, 64),
           (64, "top_left", None, 128), (192, "top_left", None, 128)]


@pytest.mark.slow
@pytest.mark.parametrize("d, mask, tile, d_v", WRITTEN, ids=lambda v: str(v))
def test_written_tiles_and_value_dims_on_the_grid_compile_without_spills(d, mask, tile, d_v):
    """A written tile 128x32 (the examples' line; at head dim 128 its three loops spilled in the
    grid: the compact body, DAG_GRID_COMPACT_N) and a value head dim unlike the query's."""
    from kgen.runtime.nvrtc import compile_cubin

    from .test_loop_dag_compile import built_value_dim

    with dag_mma_rules.warp_grid(True):
        b = built(d, mask, ir.Arch.SM80, tile=tile) if d_v is None else built_value_dim(
            d, d_v, ir.Arch.SM80, mask)
    assert b.plan.grid is not None, b.plan.layout.why
    for arch in ("sm_80", "sm_90a"):
        resources = compile_cubin(b.source, b.plan.name, arch).resources()
        assert resources.get("spill_stores", 0) == 0 and resources.get("stack_bytes", 0) == 0, \
            (arch, resources)
