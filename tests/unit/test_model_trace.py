"""A user's model measured under fake tensors: counts, tied weights, activations vs the real step."""

import pytest
import torch
from torch.distributed._tools.mem_tracker import MemTracker

from autotune.errors import UserError
from autotune.model_trace import count_parameters, trace
import trace_models


def real_activation_peak(model, batch):
    """The same accounting on real tensors: peak of one forward+backward minus params and grads."""
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(batch).float().mean().backward()  # as a training step does: the output dies with the loss
    peak = {str(k).rsplit(".", 1)[-1]: v for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()}
    return peak["Total"] - peak.get("PARAM", 0) - peak.get("GRAD", 0)


def test_tied_weights_count_once_and_largest_layer_is_deepspeeds():
    m = trace_models.tied_lm()
    total, trainable, largest = count_parameters(m)
    by_hand = sum(p.numel() for p in {id(p): p for p in m.parameters()}.values())
    assert total == by_hand == trainable
    assert total < sum(p.numel() for _, p in m.named_parameters(remove_duplicate=False))  # the tie is real
    assert largest == 500 * 64  # the embedding (own parameters of one module)


def test_the_examples_model_is_counted_exactly():
    facts = trace("examples.plain_train:make_model", "[16]")
    assert facts.num_parameters == 16 * 64 + 64 + 64 * 4 + 4  # 1348, by hand
    assert facts.activations is not None and facts.activations.source == "traced"


def fresh_real_peak(factory, batch):
    torch.manual_seed(0)
    return real_activation_peak(getattr(trace_models, factory.split(":")[1])(), batch)


@pytest.mark.parametrize("factory, sample, make", [
    ("trace_models:mlp", "[64]", lambda b: torch.randn(b, 64)),
    ("trace_models:cnn", "[3,32,32]", lambda b: torch.randn(b, 3, 32, 32)),
    ("trace_models:tied_lm", "int[32]<500", lambda b: torch.randint(0, 500, (b, 32))),
])
def test_traced_activations_match_the_real_peak(factory, sample, make):
    """Within 10 % from micro-batch 16 up (where activations dominate); never below the real
    peak anywhere (small batches of attention models are over-estimated: BENCHMARKS.md)."""
    facts = trace(factory, sample)
    for micro in (1, 3, 4, 16, 24, 48, 64):
        real = fresh_real_peak(factory, make(micro))
        predicted = facts.activations.bytes(micro, half=False, checkpointing=False)
        assert predicted >= 0.99 * real, (factory, micro, predicted, real)
        if micro in (16, 64):
            assert predicted <= 1.10 * real, (factory, micro, predicted, real)


def test_untraceable_model_falls_back_to_model_states_and_says_why():
    facts = trace("trace_models:data_dependent", "[8]")
    assert facts.num_parameters == 8 * 8 + 8 and facts.activations is None
    assert "could not be traced" in facts.unknown_reason


@pytest.mark.parametrize("spec, message", [
    ("trace_models:broken", "failed while building"),
    ("trace_models:nothing_here", "has no function"),
    ("no_such_module_xyz:f", "cannot import"),
])
def test_bad_factories_are_user_errors_naming_the_field(spec, message):
    with pytest.raises(UserError, match=f"training.model: .*{message}"):
        trace(spec, None)


def deep_mlp():
    """8 x (Linear 512, LayerNorm, GELU): 2.1M parameters; its activations pass its gradients
    only above ~170 rows, far beyond the trace's first points (1..64)."""
    import torch.nn as nn

    layers = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def test_large_micro_batches_follow_the_activations_not_the_gradient_temporaries():
    """Found on the first GPU run: traced at 1..64 rows, where the step's peak falls late in
    backward among weight-gradient temporaries, a line predicted 33 MiB at 16,384 rows against
    794 MiB real. The trace now follows the forward peak and adds points until activations
    dominate. Expected by hand: 24 saved [b, 512] fp32 tensors = 48 KiB per row."""
    facts = trace("test_model_trace:deep_mlp", "[512]")
    assert [b for b, _ in facts.activations.fp32.points][-1] > 64  # it traced beyond the first points
    for micro in (1024, 4096):
        torch.manual_seed(0)
        real = real_activation_peak(deep_mlp(), torch.randn(micro, 512))
        predicted = facts.activations.bytes(micro, half=False, checkpointing=False)
        assert real >= micro * 24 * 512 * 4  # the hand count is a floor of the real peak
        assert 0.99 * real <= predicted <= 1.10 * real, (micro, predicted, real)


def test_the_line_is_the_largest_of_its_moments():
    from autotune.modelinfo import LinearBytes

    # overall peak flat (gradient temporaries), forward peak steep: beyond the points the steep one wins
    lin = LinearBytes(points=((32, 100.0), (64, 110.0)), series=(((32, 100.0), (64, 110.0)), ((32, 32.0), (64, 64.0))))
    assert lin.at(64) == 110.0
    assert lin.at(128) == 130.0  # max(110 + 10/32 x 64 = 130, 128): the flat line still leads here
    assert lin.at(1024) == 1024.0  # max(110 + 0.3125*960 = 410, 1024)
    assert LinearBytes(points=((1, 5.0), (2, 7.0))).at(4) == 11.0  # no series: as before


@pytest.mark.parametrize("preset, precision, margin", [
    ("cpu-only", "auto", 1.1),        # policy.traced_activation_margin
    ("4xL4", "auto", 1.7),            # a GPU plan traces bf16 autocast: traced_activation_margin_gpu_half
    ("4xL4", "fp32", 4.5),            # fp32 on a GPU: cuDNN workspaces (traced_activation_margin_gpu_fp32)
])
def test_gpu_plans_use_the_margins_measured_on_a_gpu(preset, precision, margin):
    from autotune.config import TrainConfig
    from autotune.profiles import load_profile
    from autotune.runs import model_facts

    cfg = TrainConfig.model_validate({"training": {"entrypoint": "examples/plain_train.py",
                                                   "model": "examples.plain_train:make_model",
                                                   "sample_input": "[16]", "mixed_precision": precision}})
    facts = model_facts(cfg, hw=load_profile(preset))
    assert facts.activations.margin == margin
    lin = facts.activations.fp32 or facts.activations.half
    half = facts.activations.half is not None
    assert facts.activations.bytes(8, half=half, checkpointing=False) == pytest.approx(lin.at(8) * margin)
