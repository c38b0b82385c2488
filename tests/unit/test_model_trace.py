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
