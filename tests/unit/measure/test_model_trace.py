"""A user's model measured under fake tensors: counts, tied weights, activations vs the real step."""

import pytest
import torch
from helpers import trace_models
from torch.distributed._tools.mem_tracker import MemTracker

from autotune.errors import UserError
from autotune.measure.trace import count_parameters, trace


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
    ("helpers.trace_models:mlp", "[64]", lambda b: torch.randn(b, 64)),
    ("helpers.trace_models:cnn", "[3,32,32]", lambda b: torch.randn(b, 3, 32, 32)),
    ("helpers.trace_models:tied_lm", "int[32]<500", lambda b: torch.randint(0, 500, (b, 32))),
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
    facts = trace("helpers.trace_models:data_dependent", "[8]")
    assert facts.num_parameters == 8 * 8 + 8 and facts.activations is None
    assert "could not be traced" in facts.unknown_reason


@pytest.mark.parametrize("spec, message", [
    ("helpers.trace_models:broken", "failed while building"),
    ("helpers.trace_models:nothing_here", "has no function"),
    ("no_such_module_xyz:f", "cannot import"),
])
def test_bad_factories_are_user_errors_naming_the_field(spec, message):
    with pytest.raises(UserError, match=f"training.model: .*{message}"):
        trace(spec, None)


def test_large_micro_batches_follow_the_activations_not_the_gradient_temporaries():
    """Found on the first GPU run: traced at 1..64 rows, where the step's peak falls late in
    backward among weight-gradient temporaries, a line predicted 33 MiB at 16,384 rows against
    794 MiB real. The trace now follows the forward peak and adds points until activations
    dominate. Expected by hand: 24 saved [b, 512] fp32 tensors = 48 KiB per row."""
    facts = trace("helpers.trace_models:deep_mlp", "[512]")
    assert [b for b, _ in facts.activations.fp32.points][-1] > 64  # it traced beyond the first points
    for micro in (1024, 4096):
        torch.manual_seed(0)
        real = real_activation_peak(trace_models.deep_mlp(), torch.randn(micro, 512))
        predicted = facts.activations.bytes(micro, half=False, checkpointing=False)
        assert real >= micro * 24 * 512 * 4  # the hand count is a floor of the real peak
        assert 0.99 * real <= predicted <= 1.10 * real, (micro, predicted, real)


def test_the_line_is_the_largest_of_its_moments():
    from autotune.planner.model_facts import LinearBytes

    # overall peak flat (gradient temporaries), forward peak steep: beyond the points the steep one wins
    lin = LinearBytes(points=((32, 100.0), (64, 110.0)), series=(((32, 100.0), (64, 110.0)), ((32, 32.0), (64, 64.0))))
    assert lin.at(64) == 110.0
    assert lin.at(128) == 130.0  # max(110 + 10/32 x 64 = 130, 128): the flat line still leads here
    assert lin.at(1024) == 1024.0  # max(110 + 0.3125*960 = 410, 1024)
    assert LinearBytes(points=((1, 5.0), (2, 7.0))).at(4) == 11.0  # no series: as before


@pytest.mark.parametrize("preset, precision, margin, source", [
    ("cpu-only", "auto", 1.1, "traced"),                  # policy.traced_activation_margin (the CPU trace)
    ("4xL4", "auto", 1.0, "traced as CUDA runs it"),      # bf16 on a GPU: whole steps as CUDA runs them, no margin
    # fp32 on a GPU: cuDNN workspaces (traced_activation_margin_gpu_fp32)
    ("4xL4", "fp32", 4.5, "traced as CUDA runs it"),
])
def test_gpu_plans_trace_as_cuda_runs_and_keep_only_the_fp32_margin(preset, precision, margin, source, tmp_path,
                                                                  monkeypatch):
    from autotune.config import TrainConfig
    from autotune.measure import model_facts
    from autotune.profiles import load_profile

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    cfg = TrainConfig.model_validate({"training": {"entrypoint": "examples/plain_train.py",
                                                   "model": "examples.plain_train:make_model",
                                                   "sample_input": "[16]", "mixed_precision": precision}})
    facts = model_facts(cfg, hw=load_profile(preset))
    assert (facts.activations.margin, facts.activations.source) == (margin, source)
    lin = facts.activations.fp32 or facts.activations.half
    half = facts.activations.half is not None
    assert facts.activations.bytes(8, half=half, checkpointing=False) == pytest.approx(lin.at(8) * margin)


def test_the_cuda_trace_keeps_what_cuda_keeps_for_attention_dropout_and_autocast():
    """One attention layer, by hand: under the CUDA trace attention keeps O(s) (not the b*h*s^2 matrix the CPU
    math path keeps), dropout keeps a one-byte mask, and pow runs in fp32 as on CUDA."""
    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.measure.cuda_trace import PeakTracker, cuda_kernels

    b, h, s, d = 2, 4, 512, 16
    with FakeTensorMode():
        q = torch.randn(b, h, s, d, requires_grad=True)
        with cuda_kernels():
            tr = PeakTracker()
            with tr:
                out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
            kept = tr.current
            with tr, torch.autocast("cpu", dtype=torch.bfloat16):
                cubed = torch.pow(q.bfloat16(), 3.0)
            drop = PeakTracker()
            with drop:
                dropped = F.dropout(q, 0.5, training=True)
        plain = PeakTracker()
        with plain:
            math_out = F.scaled_dot_product_attention(q, q, q, dropout_p=0.1)
    assert kept < b * h * s * s * 4 / 4  # O(s): output and log-sum-exp, far below one s x s matrix
    assert plain.peak >= b * h * s * s * 4  # the CPU math path holds the s x s matrix
    assert cubed.dtype == torch.float32  # CUDA's autocast runs pow in fp32
    assert drop.current == q.numel() * 4 + q.numel() * 1 + 0  # the output (fp32) and a one-byte mask
    assert F.dropout.__name__ == "dropout" and out.shape == math_out.shape == dropped.shape


def test_the_cuda_trace_runs_cross_entropy_on_bf16_logits_as_cuda_does():
    """CUDA's autocast has no policy for cross_entropy_loss: log_softmax keeps the logits' bf16, nll_loss takes an
    fp32 copy, and the step peaks at 10 bytes an element (bf16 log-probs 2 + that copy 4 + nll's fp32 gradient 4).
    The CPU's autocast casts the logits to fp32 first and peaks at 12 (BERT's MLM head: +7.5 % on the H100)."""
    import contextlib

    import torch.nn.functional as F
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.measure.cuda_trace import PeakTracker, cuda_kernels

    n, v = 64, 1000

    def peak_per_element(cuda: bool) -> float:
        with FakeTensorMode(), (cuda_kernels() if cuda else contextlib.nullcontext()):
            logits = torch.randn(n, v, dtype=torch.bfloat16, requires_grad=True)
            tr = PeakTracker()
            with tr:
                with torch.autocast("cpu", dtype=torch.bfloat16):
                    loss = F.cross_entropy(logits, torch.randint(0, v, (n,)))
                loss.backward()
        return tr.peak / (n * v)

    assert peak_per_element(cuda=True) == pytest.approx(10, abs=0.05)
    assert peak_per_element(cuda=False) == pytest.approx(12, abs=0.05)


def test_a_model_whose_checkpointing_switch_raises_is_traced_without_it(tmp_path):
    facts = trace("helpers.trace_models:ckpt_raises", "[64]")
    assert facts.activations is not None and facts.activations.fp32 is not None  # not thrown away
    assert facts.activations.fp32_checkpointed is None and not facts.checkpointing_supported
    assert "checkpointing unsupported" in facts.source


def test_the_trace_cache_answers_a_second_plan_without_tracing(tmp_path, monkeypatch):
    from autotune.config import TrainConfig
    from autotune.measure import model_facts
    from autotune.measure.cache import TRACE_CACHE as _TRACE_CACHE
    from autotune.profiles import load_profile
    from autotune.rundir.layout import cache_dir

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    cfg = TrainConfig.model_validate({"training": {"entrypoint": "examples/plain_train.py",
                                                   "model": "examples.plain_train:make_model", "sample_input": "[16]"}})
    _TRACE_CACHE.clear()  # this process's own memo: the disk is what is tested
    first = model_facts(cfg, hw=load_profile("4xL4"))
    assert len(list(cache_dir().glob("*.json"))) == 1
    _TRACE_CACHE.clear()
    monkeypatch.setattr("autotune.measure.trace.trace", lambda *a, **k: (_ for _ in ()).throw(AssertionError("traced")))
    assert model_facts(cfg, hw=load_profile("4xL4")) == first  # from disk, no trace
    other = TrainConfig.model_validate({"training": {"entrypoint": "examples/plain_train.py",
                                                     "model": "examples.plain_train:make_model",
                                                     "sample_input": "[32]"}})
    with pytest.raises(AssertionError, match="traced"):  # another sample spec is another key
        model_facts(other, hw=load_profile("4xL4"))


def test_a_model_that_reads_values_in_its_constructor_is_built_for_real_then_measured():
    facts = trace("helpers.trace_models:reads_values", "[32]")
    assert facts.num_parameters == 32 * 64 + 64 + 64 * 4 + 4 and facts.activations is not None
    assert "built for real on the CPU" in facts.source


def test_an_initialiser_that_fails_under_fake_tensors_is_skipped(monkeypatch):
    """torch.nn.init.normal_ made to fail under fake tensors as ViT's initialisers do: the build skips it."""
    import torch.nn.init as init
    from torch._subclasses.fake_tensor import FakeTensor

    real = init.normal_

    def reads(tensor, *a, **k):
        if isinstance(tensor, FakeTensor):
            raise RuntimeError("aten._local_scalar_dense: data-dependent")
        return real(tensor, *a, **k)

    monkeypatch.setattr(init, "normal_", reads)
    facts = trace("helpers.trace_models:init_reads_values", "[32]")
    assert "initialisation skipped" in facts.source and facts.activations is not None
    assert init.normal_ is reads  # restored after the build


def test_a_model_too_big_to_build_for_real_is_refused_naming_the_way_out(monkeypatch):
    import autotune.measure.trace as tr

    monkeypatch.setattr(tr, "_free_ram", lambda: 1000)  # 1000 bytes free: a real build may take 250
    with pytest.raises(UserError, match="training.model: .*exceed a quarter of the free RAM.*training.num_parameters"):
        trace("helpers.trace_models:reads_values", "[32]")


def test_the_gpu_probe_is_cached_on_disk_like_the_trace(tmp_path, monkeypatch, capsys):
    """On a detected CUDA machine the plan is made from real steps on GPU 0 (autotune.measure.gpu_probe). A second plan
    of the same model on the same GPU model reads the probe's line from the cache directory: no GPU step runs."""
    from autotune.config import TrainConfig
    from autotune.measure import model_facts_probed
    from autotune.measure.cache import TRACE_CACHE as _TRACE_CACHE
    from autotune.measure.gpu_probe import PROBED, ProbePoint
    from autotune.planner.model_facts import CUDA_TRACED, ActivationModel, LinearBytes, ModelFacts
    from autotune.profiles import load_profile
    from autotune.rundir.layout import cache_dir

    monkeypatch.setenv("AUTOTUNE_CACHE_DIR", str(tmp_path))
    traced = ModelFacts(source="m", num_parameters=1_000_000, trainable_parameters=1_000_000,
                        activations=ActivationModel(half=LinearBytes.line(100 * 2**20, 50 * 2**20), source=CUDA_TRACED))
    monkeypatch.setattr("autotune.measure.facts.model_facts", lambda cfg, policy=None, hw=None: traced)
    runs = []

    def probe(model, sample, micros, **kw):
        runs.append(micros)  # peaks: the states (16 B x 1e6) + 40 MiB a sample + 90 MiB
        return [ProbePoint(m, 16_000_000 + 90 * 2**20 + m * 40 * 2**20) for m in micros]

    monkeypatch.setattr("autotune.measure.gpu_probe.probe", probe)
    hw = load_profile("4xA100-80GB").model_copy(update={"source": "detected"})
    cfg = TrainConfig.model_validate({"training": {"entrypoint": "t.py", "model": "t:m", "sample_input": "[16]"}})
    _TRACE_CACHE.clear()
    first = model_facts_probed(cfg, hw=hw)
    assert len(runs) == 1 and first.source.startswith(f"m; {PROBED} 0 at micro-batch")
    top = runs[0][1]  # the larger probed micro-batch: the line goes through it, the states taken off
    assert first.activations.half.at(top) == pytest.approx(90 * 2**20 + top * 40 * 2**20)
    assert len(list(cache_dir().glob("*.json"))) == 1
    _TRACE_CACHE.clear()
    assert model_facts_probed(cfg, hw=hw) == first and len(runs) == 1  # from disk: no GPU step
    assert "measured on this GPU model before" in capsys.readouterr().err
    other = hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": tuple(
        d.model_copy(update={"name": "NVIDIA H100 80GB HBM3"}) for d in hw.gpus.devices)})})
    model_facts_probed(cfg, hw=other)
    assert len(runs) == 2  # another GPU model is another key
