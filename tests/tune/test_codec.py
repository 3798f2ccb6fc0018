"""Config <-> JSON: every configuration the targets list round-trips; malformed JSON is
refused."""
from __future__ import annotations

import json

import pytest

from kgen.enums import Arch
from kgen.lower import builder
from kgen.targets import Config, GemmConfig, target
from kgen.tune.codec import config_from_json, config_to_json

from .helpers import SIZES, example_text, kernel_of


@pytest.mark.parametrize("name, arch", [
    ("gemm", Arch.SM80), ("gemm", Arch.SM90A), ("splitk_gelu", Arch.SM80),
    ("b2b_gemm_smem", Arch.SM80), ("b2b_gemm_smem", Arch.SM90A),
    ("b2b_gemm_rf_pingpong_sm90a", Arch.SM90A)])
def test_every_listed_config_round_trips(name, arch):
    kernel = kernel_of(example_text(name))
    configs = [c for c, _, _ in builder.listed(kernel, target(arch), sizes=SIZES, wide=True)]
    assert configs
    for config in configs:
        text = json.dumps(config_to_json(config))
        assert config_from_json(json.loads(text)) == config


def test_keep_resident_split_and_schedule_survive():
    from kgen.enums import Residency
    from kgen.plan import KernelKind

    config = Config((GemmConfig((64, 64, 64), (4, 1), 12, resident=True),
                     GemmConfig((64, 128, 64), (4, 1), 3, keep=Residency.SMEM, split=2)),
                    KernelKind.PINGPONG, "why")
    data = config_to_json(config)
    assert data["schedule"] == "pingpong" and data["gemms"][1]["keep"] == "smem"
    assert config_from_json(data) == config


@pytest.mark.parametrize("bad", [
    None, [], {"gemms": []}, {"gemms": [{"tile": [1, 2], "warps": [2, 2], "stages": 3}]},
    {"gemms": [{"tile": [128, 128, 32], "warps": [2, 2], "stages": 0}]},
    {"gemms": [{"tile": [128, 128, 32], "warps": [2, 2], "stages": True}]},
    {"gemms": [{"tile": [128, 128, 32], "warps": [2, 2], "stages": 3, "keep": "disk"}]},
    {"gemms": [{"tile": [128, 128, 32], "warps": [2, 2], "stages": 3}], "schedule": "fast"},
    {"gemms": [{"tile": [128, 128, 32], "warps": [2, 2], "stages": 3, "resident": "yes"}]},
])
def test_malformed_json_is_refused(bad):
    with pytest.raises(ValueError):
        config_from_json(bad)
