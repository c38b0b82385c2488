"""The micro-batch of a model traced as CUDA runs it, by hand (planner/micro.py, policy.micro_batch_rule)."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.planner.micro import largest_fitting, steady_micro
from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes, ModelFacts
from autotune.planner.policy import load_policy
from autotune.profiles import load_profile
from support import ROOT

GIB = 2 ** 30
H100 = load_profile(str(ROOT / "bench" / "gpu_truth" / "h100" / "h100-profile.json"))  # 81079 MiB free


def facts(per_sample_gib=1.5, checkpointed=None):
    line = LinearBytes(points=((1, per_sample_gib * GIB), (64, 64 * per_sample_gib * GIB)), interpolate=True)
    ck = None if checkpointed is None else LinearBytes(
        points=((1, checkpointed * GIB), (64, 64 * checkpointed * GIB)), interpolate=True)
    return ModelFacts(source="hand-made", num_parameters=100_000_000, trainable_parameters=100_000_000,
                      largest_layer_parameters=1_000_000,
                      activations=ActivationModel(half=line, half_checkpointed=ck, source=CUDA_TRACED))


CFG = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "training.global_batch_size": 256})


def test_the_largest_micro_batch_that_fits_with_the_global_batch_held():
    """Usable 81079 MiB x 0.85 - 600 MiB of CUDA context = 66.72 GiB; states 16 B x 1e8 = 1.49 GiB,
    activations 1.5 GiB a sample: 1.49 + 1.5 m <= 66.72 -> m <= 43. No divisor of 256 in 39..43;
    43 x 6 = 258 is within 3 % of 256: micro 43, accumulation 6."""
    p = plan(H100, CFG, facts=facts(), deepspeed_installed=False)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.batch.global_batch_size) == (43, 6, 258)
    assert p.memory.gradient_checkpointing is False
    assert "policy micro_batch_rule: fit" in p.reasons["micro_batch_size"]
    assert p.memory.estimate.total_gib == pytest.approx(1.4901 + 64.5, abs=0.01)  # the allocated peak


def test_the_band_stays_a_policy_choice():
    """micro_batch_rule: band -> the >= 80 GB band's 64, halved to what fits: 64 needs 97.5 GiB, 32 needs 49.5."""
    band = load_policy().model_copy(update={"micro_batch_rule": "band"})
    p = plan(H100, CFG, facts=facts(), policy=band, deepspeed_installed=False)
    assert p.batch.micro_batch_size == 32 and "policy micro_batch_rule: band" in p.reasons["micro_batch_size"]


def test_checkpointing_only_when_without_it_a_step_would_be_slow():
    """5 GiB a sample without checkpointing fits 13 (< 16: a slow step); 0.5 GiB with it fits 130, capped at 256 / 1:
    checkpointing wins. At 1.5 GiB without, 43 fits: no checkpointing, however far checkpointing would go."""
    slow = plan(H100, CFG, facts=facts(5.0, checkpointed=0.5), deepspeed_installed=False)
    assert slow.memory.gradient_checkpointing is True and slow.batch.micro_batch_size == 128  # 130 -> 128 divides 256
    fast = plan(H100, CFG, facts=facts(1.5, checkpointed=0.2), deepspeed_installed=False)
    assert fast.memory.gradient_checkpointing is False and fast.batch.micro_batch_size == 43


def test_the_arithmetic():
    assert largest_fitting(100, lambda m: m <= 43) == 43 and largest_fitting(100, lambda m: False) == 0
    assert largest_fitting(1, lambda m: True) == 1
    assert steady_micro(65, 256, 1) == 64  # a divisor within 0.9 of the largest: exact
    assert steady_micro(43, 256, 1) == 43  # 43 x 6 = 258, within 3 %
    assert steady_micro(176, 256, 1) == 131  # nothing in 159..176 keeps 256 within 3 %: 131 x 2 = 262
    # 7 x 5 x 3 = 105 (5 % off), 6 x 6 x 3 = 108, 5 x 7 x 3 = 105, 4 x 8 x 3 = 96 (4 %), 3 x 11 x 3 = 99 (1 %)
    assert steady_micro(7, 100, 3) == 3
