"""A tuned configuration (kgen.targets.Config) as JSON and back, for the tune cache.

    {"schedule": "pingpong" | null, "why": "...",
     "gemms": [{"tile": [128, 256, 64], "warps": [2, 4], "stages": 4,
                "keep": "registers" | "smem" | null, "resident": false, "split": 1 | "stream",
                "cluster": [1, 1]}]}

`config_from_json` refuses anything else with ValueError (a cache file from another kgen, or
edited by hand, is then ignored by the reader rather than half-used).
"""
from __future__ import annotations

from typing import Any

from ..enums import Residency
from ..plan import KernelKind
from ..targets import Config, GemmConfig
from ..verify.gemms import CLUSTERS


def config_to_json(config: Config) -> dict[str, Any]:
    return {
        "schedule": config.schedule.value if config.schedule is not None else None,
        "why": config.why,
        "gemms": [{
            "tile": list(g.tile),
            "warps": list(g.warps),
            "stages": g.stages,
            "keep": g.keep.value if g.keep is not None else None,
            "resident": g.resident,
            "split": "stream" if g.stream else g.split,
            "cluster": list(g.cluster),
        } for g in config.gemms],
    }


def _ints(value: Any, count: int, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or len(value) != count or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise ValueError(f"{what} must be a list of {count} positive integers, got {value!r}")
    return tuple(value)


def _positive(value: Any, what: str) -> int:
    return _ints([value], 1, what)[0]


def _gemm_from_json(data: Any) -> GemmConfig:
    if not isinstance(data, dict):
        raise ValueError(f"a gemm's configuration must be an object, got {data!r}")
    keep = data.get("keep")
    if keep is not None and keep not in {r.value for r in Residency}:
        raise ValueError(f"keep must be null, 'registers' or 'smem', got {keep!r}")
    resident = data.get("resident", False)
    if not isinstance(resident, bool):
        raise ValueError(f"resident must be true or false, got {resident!r}")
    return GemmConfig(
        tile=_ints(data.get("tile"), 3, "tile"),
        warps=_ints(data.get("warps"), 2, "warps"),
        stages=_positive(data.get("stages"), "stages"),
        keep=Residency(keep) if keep is not None else None,
        resident=resident,
        split=1 if data.get("split") == "stream" else _positive(data.get("split", 1), "split"),
        stream=data.get("split") == "stream",
        cluster=_cluster(data.get("cluster", [1, 1])),
    )


def _cluster(value: Any) -> tuple[int, int]:
    shape = _ints(value, 2, "cluster")
    if shape not in CLUSTERS:
        raise ValueError(f"cluster must be one of {[list(c) for c in CLUSTERS]}, got {value!r}")
    return shape


def config_from_json(data: Any) -> Config:
    if not isinstance(data, dict):
        raise ValueError(f"a configuration must be an object, got {data!r}")
    schedule = data.get("schedule")
    kinds = {k.value: k for k in KernelKind}
    if schedule is not None and schedule not in kinds:
        raise ValueError(f"unknown schedule {schedule!r}")
    gemms = data.get("gemms")
    if not isinstance(gemms, list) or not gemms:
        raise ValueError("gemms must be a non-empty list")
    why = data.get("why", "")
    if not isinstance(why, str):
        raise ValueError(f"why must be a string, got {why!r}")
    return Config(tuple(_gemm_from_json(g) for g in gemms),
                  kinds[schedule] if schedule is not None else None, why)
