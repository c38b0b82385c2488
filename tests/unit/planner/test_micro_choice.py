"""The micro-batch of a model traced as CUDA runs it, by hand (planner/micro.py, policy.micro_batch_rule)."""

import pytest
from helpers.support import (
    ROOT,
    site_margin,  # noqa: F401 - the fixture pytestmark names
)

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.planner.micro import largest_fitting, steady_micro
from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes, ModelFacts
from autotune.planner.policy import load_policy
from autotune.profiles import load_profile

# Derived by hand for a budget of free x 0.85 less the CUDA context and NCCL, no allocator share: a site's margin
# the policy still takes (the default's evidence headroom: test_headroom.py).
pytestmark = pytest.mark.usefixtures("site_margin")


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
    assert p.reasons["micro_batch_size"] == (
        "the largest micro-batch whose estimate fits with DDP (66.0 GiB, traced as CUDA runs it), up to global / "
        "world = 256, with the global batch within 3% of its target (policy micro_batch_rule: fit; the VRAM band is "
        "for models autotune cannot trace)")
    assert p.memory.estimate.total_gib == pytest.approx(1.4901 + 64.5, abs=0.01)  # the allocated peak


def test_the_band_stays_a_policy_choice():
    """micro_batch_rule: band -> the >= 80 GB band's 64, halved to what fits: 64 needs 97.5 GiB, 32 needs 49.5."""
    band = load_policy().model_copy(update={"micro_batch_rule": "band"})
    p = plan(H100, CFG, facts=facts(), policy=band, deepspeed_installed=False)
    assert p.batch.micro_batch_size == 32 and p.reasons["micro_batch_size"] == (
        "85.0 GB free per GPU is in the >= 80 GB band: micro-batch 64 (policy micro_batch_rule: band); 32 is the "
        "largest that fits with DDP (49.5 GiB estimated)")


def test_checkpointing_only_when_without_it_a_step_would_be_slow():
    """5 GiB a sample without checkpointing fits 13 (< 16: a slow step); 0.5 GiB with it fits 130, capped at 256 / 1:
    checkpointing wins. At 1.5 GiB without, 43 fits: no checkpointing, however far checkpointing would go."""
    slow = plan(H100, CFG, facts=facts(5.0, checkpointed=0.5), deepspeed_installed=False)
    assert slow.memory.gradient_checkpointing is True and slow.batch.micro_batch_size == 128  # 130 -> 128 divides 256
    assert slow.memory.estimate.total_gib == pytest.approx(1.4901 + 0.5 * 128, abs=0.01)  # at 128, checkpointed
    # exactly 16 without checkpointing (1.49 + 4 x 16 = 65.49 <= 66.72 < 1.49 + 4 x 17) is fast enough: no checkpointing
    edge = plan(H100, CFG, facts=facts(4.0, checkpointed=0.5), deepspeed_installed=False)
    assert edge.memory.gradient_checkpointing is False and edge.batch.micro_batch_size == 16
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


def test_the_arithmetic_at_its_edges():
    """Each case by hand:
    - 1 fits but 2 does not: 1 (not 0);
    - (10, 99, 1): 9 divides 99 and is 0.9 of 10: exact beats 10 x 10 = 100 (1 % off);
    - (10, 88, 1): no divisor in 9..10 (8 is below 0.9 x 10): 10 x 9 = 90, 2.3 % off;
    - (6, 36, 4): 6 x 4 = 24 does not divide 36; 6 x 2 x 4 = 48, 5 x 2 x 4 = 40, 4 x 2 x 4 = 32 are too far;
      3 x 3 x 4 = 36;
    - (2, 3, 1): 2 x 2 = 4 is 33 % off; 1 x 3 = 3;
    - (100, 101, 1): 101 is prime; 100 x 1 = 100, 1 % off (accumulation 1 is allowed);
    - (97, 100, 1): 97 x 1 = 97 is exactly 3 % off: allowed, the tolerance includes its bound."""
    assert largest_fitting(10, lambda m: m <= 1) == 1
    assert steady_micro(10, 99, 1) == 9
    assert steady_micro(10, 88, 1) == 10
    assert steady_micro(6, 36, 4) == 3
    assert steady_micro(2, 3, 1) == 1
    assert steady_micro(100, 101, 1) == 100
    assert steady_micro(97, 100, 1) == 97


def test_a_measured_line_between_and_beyond_its_points():
    """Interpolated (a trace's points): flat below the first point, linear between neighbours, extended from the
    last two points above, never downward (a line that falls stays at its last value)."""
    bent = LinearBytes(points=((2, 100), (4, 300), (8, 400)), interpolate=True)
    assert [bent.at(m) for m in (1, 2, 3, 6, 8, 10)] == [100, 100, 200, 350, 400, 450]
    falling = LinearBytes(points=((1, 100), (2, 50)), interpolate=True)
    assert falling.at(4) == 50
    assert LinearBytes(points=((4, 70),), interpolate=True).at(9) == 70


def test_the_reason_names_the_rule_and_the_estimate():
    from autotune.planner.micro import traced_micro_reason

    assert traced_micro_reason("DDP", 63.16, 256) == (
        f"the largest micro-batch whose estimate fits with DDP (63.2 GiB, {CUDA_TRACED}), up to global / world = 256, "
        "with the global batch within 3% of its target (policy micro_batch_rule: fit; the VRAM band is for models "
        "autotune cannot trace)")
    assert traced_micro_reason("ZeRO-2", None, 8).startswith("the largest micro-batch whose estimate fits with ZeRO-2, "
                                                             "up to global / world = 8,")


def test_a_traced_model_that_fits_no_micro_batch_is_refused_with_its_need_at_one():
    """70 GiB of activations a sample (69 with checkpointing) on the H100 (66.72 GiB usable): states 1.49 GiB +
    one sample = 71.5 GiB, 70.5 with checkpointing: refused, each with its need at micro-batch 1."""
    from autotune.errors import PlanRefused

    with pytest.raises(PlanRefused) as e:
        plan(H100, CFG, facts=facts(70, checkpointed=69), deepspeed_installed=False)
    # FSDP2's CPU offload leaves the GPU the model gathered whole (its units unknown: 2 + 6 bytes a parameter)
    assert e.value.tried == ["DDP: 71.5 GiB needed > 66.7 GiB usable even at micro-batch 1",
                             "DDP + checkpointing: 70.5 GiB needed > 66.7 GiB usable even at micro-batch 1",
                             "FSDP2 + CPU offload: 70.7 GiB needed > 66.7 GiB usable even at micro-batch 1",
                             "FSDP2 + CPU offload + checkpointing: 69.7 GiB needed > 66.7 GiB usable even at "
                             "micro-batch 1"]


def test_what_a_config_declares_about_a_scripts_model():
    """training.num_parameters: every parameter trained, activations unknown; nothing: the model is unknown."""
    from autotune.planner.model_facts import declared_facts

    sized = declared_facts(apply_overrides(TrainConfig(), {"training.entrypoint": "t.py",
                                                           "training.num_parameters": 1_500_000}))
    assert (sized.source, sized.num_parameters, sized.trainable_parameters) == (
        "training.num_parameters = 1,500,000", 1_500_000, 1_500_000)
    assert sized.unknown_reason.startswith("activations unknown: give training.model")
    blank = declared_facts(apply_overrides(TrainConfig(), {"training.entrypoint": "t.py"}))
    assert (blank.source, blank.num_parameters) == ("unknown (your script's model is not described)", None)


def test_which_memory_a_gpu_is_planned_by():
    """A MIG GPU: its smallest slice; else the free memory; else the total; with the figure's name."""
    from autotune.planner.deciders import usable_mib

    gpu = H100.gpus.devices[0]
    assert usable_mib(gpu.model_copy(update={"mig_slices_mib": (9856, 4864)})) == (4864, "MIG slice")
    assert usable_mib(gpu) == (81079, "free")
    assert usable_mib(gpu.model_copy(update={"memory_free_mib": None})) == (gpu.memory_total_mib, "total")


def test_the_built_in_gpts_activations_are_the_formula_times_the_micro_batch():
    """No fixed part: the built-in workload's activations at micro-batch m are m x the formula's bytes for one
    sample, for each of the four numerics (fp32 or half, with or without checkpointing)."""
    from autotune.planner import memory
    from autotune.planner.model_facts import builtin_facts

    cfg = TrainConfig()
    m, d = cfg.model, cfg.data
    block = 2 * d.seq_len - 1
    acts = builtin_facts(cfg).activations
    for got, ckpt, half in ((acts.fp32, False, False), (acts.half, False, True), (acts.fp32_checkpointed, True, False),
                            (acts.half_checkpointed, True, True)):
        one = memory.activation_bytes(1, block, m.n_embd, m.n_head, m.n_layer, d.vocab_size, ckpt, half)
        assert (got.at(1), got.at(2), got.at(8)) == (one, 2 * one, 8 * one), (ckpt, half)


def test_a_micro_batch_you_set_is_weighed_against_what_auto_would_really_choose():
    """The override records the micro-batch auto would have planned, found by the same weighing, not the band's
    starting point: 43 for the traced model (not global / world = 256), 32 under the band rule (not the band's 64,
    which does not fit). With --force and nothing fitting, auto would plan 1."""
    p = plan(H100, apply_overrides(CFG, {"training.batch_size_per_gpu": 16}), facts=facts(), deepspeed_installed=False)
    assert (p.batch.micro_batch_size, p.overrides["micro_batch_size"].auto) == (16, 43)
    assert p.reasons["micro_batch_size"] == (
        "you set 16 (auto would choose 43: the largest micro-batch whose estimate fits with DDP (66.0 GiB, traced as "
        "CUDA runs it), up to global / world = 256, with the global batch within 3% of its target (policy "
        "micro_batch_rule: fit; the VRAM band is for models autotune cannot trace))")
    band = load_policy().model_copy(update={"micro_batch_rule": "band"})
    p = plan(H100, apply_overrides(CFG, {"training.batch_size_per_gpu": 16}), facts=facts(), policy=band,
             deepspeed_installed=False)
    assert p.overrides["micro_batch_size"].auto == 32 and p.reasons["micro_batch_size"] == (
        "you set 16 (auto would choose 32: 85.0 GB free per GPU is in the >= 80 GB band: micro-batch 64 (policy "
        "micro_batch_rule: band); 32 is the largest that fits with DDP (49.5 GiB estimated))")
    p = plan(H100, apply_overrides(CFG, {"training.batch_size_per_gpu": 4}), facts=facts(100.0), force=True,
             deepspeed_installed=False)
    assert p.batch.micro_batch_size == 4 and p.overrides["micro_batch_size"].auto == 1
    assert p.reasons["micro_batch_size"] == ("you set 4 (auto would choose 1: the largest micro-batch that fits, but "
                                             "no micro-batch fits by the estimate)")


def test_a_global_batch_of_one_is_one_sample_a_step_and_checkpointing_says_why_it_is_off():
    """Up to global / world = 1: micro-batch 1 even where more would fit; checkpointing off, with why."""
    p = plan(H100, apply_overrides(CFG, {"training.global_batch_size": 1}), facts=facts(1.5, checkpointed=0.2),
             deepspeed_installed=False)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.batch.global_batch_size) == (1, 1, 1)
    assert p.reasons["micro_batch_size"].startswith(
        "the largest micro-batch whose estimate fits with DDP (3.0 GiB, traced as CUDA runs it), up to global / "
        "world = 1, ")
    four = plan(load_profile("4xA100-80GB"), apply_overrides(CFG, {"training.global_batch_size": 6}),
                facts=facts(1.5), deepspeed_installed=False)  # 6 // 4 processes = 1, though 6 / 4 rounds to 2
    assert four.batch.micro_batch_size == 1
    assert p.memory.gradient_checkpointing is False
    assert p.reasons["gradient_checkpointing"] == (
        "off unless it is the only way to a fast micro-batch (it costs 30-70 % a step)")


def test_within_the_models_own_error_one_engine_takes_the_fewest_accumulation_steps_outside_it_the_prediction():
    """Issue 55: ViT-base on the H100 was planned 87 x 3 where 256 x 1 fitted. Where one engine's micro-batches are
    predicted within the model's own error (StepTime.tie) of each other the larger micro-batch with fewer accumulation
    steps wins (never slower: each micro-step repeats the same fixed costs); a prediction outside the error decides."""
    from autotune.planner.choice import fewest_steps
    from autotune.planner.step_time import StepTime

    def t(rate, tie=0.058):
        return StepTime(0.1, 0.01, 0.0, 0.11, rate, tie=tie)

    tied = [(87, 3, t(1000.0)), (128, 2, t(980.0)), (256, 1, t(960.0))]
    assert fewest_steps(tied)[:2] == (256, 1)
    apart = [(87, 3, t(1000.0)), (256, 1, t(900.0))]  # 10 % slower: outside a 5.8 % error
    assert fewest_steps(apart)[:2] == (87, 3)
    assert fewest_steps([(87, 3, t(1000.0, tie=0.0)), (256, 1, t(996.0, tie=0.0))])[:2] == (256, 1)  # TIE, 0.5 %
    assert fewest_steps([]) is None
