"""The policy's bands pinned at their edges, each expectation derived by hand from configs/policy.yaml (GB,
10^9 bytes), not from the code."""

import pytest
from helpers.profiles_util import make_profile

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.profiles import load_profile

CC80 = "8.0"


def one_gpu(free_mib, cc=CC80, ram_gib=64, n=1):
    return make_profile(gpus=[("GPU", free_mib + 500, free_mib, cc)] * n, ram_gib=ram_gib)


# -- policy bands: GB (10^9 bytes) as configs/policy.yaml states --------------------------------
# The smallest whole MiB at or above G GB is ceil(G * 10^9 / 2^20): 80 GB -> 76294 MiB,
# 40 -> 38147, 20 -> 19074, 14 -> 13352, 10 -> 9537, 6 -> 5723. One MiB less is the band below.
@pytest.mark.parametrize("free_mib, micro", [
    (76294, 64), (76293, 32),
    (38147, 32), (38146, 16),
    (19074, 16), (19073, 12),
    (13352, 12), (13351, 8),
    (9537, 8), (9536, 4),
    (5723, 4), (5722, 2),
])
def test_policy_band_edges_are_in_gb(free_mib, micro):
    p = plan(one_gpu(free_mib), TrainConfig())
    assert p.batch.micro_batch_size == micro, p.reasons["micro_batch_size"]


@pytest.mark.parametrize("preset, micro", [("4xA100-80GB", 64), ("8xH100-80GB", 64), ("8xA100-40GB", 32),
                                           ("4xL4", 16), ("4xT4", 12)])
def test_80_and_40_gb_cards_land_in_their_bands(preset, micro):
    big_target = apply_overrides(TrainConfig(), {"training.global_batch_size": 4096})  # no target reduction
    assert plan(load_profile(preset), big_target, deepspeed_installed=True).batch.micro_batch_size == micro
