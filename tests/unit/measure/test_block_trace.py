"""The trace of a model's repeated block, scaled to its depth: which models take it, which are traced whole and say
why, and that the scaled facts equal the whole trace (issue 54)."""

import pytest
import torch
import torch.nn as nn

from autotune.measure.block_trace import fsdp_scaled
from autotune.measure.repeated import MIN_DEPTH, find_repeat, reduced
from autotune.measure.trace import trace


class _Attn(nn.Module):
    def __init__(self, i: int, window):
        super().__init__()
        self.layer_idx, self.sliding_window = i, window
        self.q = nn.Linear(16, 16)


class _Layer(nn.Module):
    def __init__(self, i: int, window=None):
        super().__init__()
        self.attn = _Attn(i, window)

    def forward(self, x):
        return self.attn.q(x)


class _Stack(nn.Module):
    def __init__(self, layers):
        super().__init__()
        self.emb = nn.Linear(16, 16)
        self.layers = nn.ModuleList(layers)

    def forward(self, x):
        x = self.emb(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_identical_blocks_are_found_and_their_position_does_not_make_them_differ():
    rep = find_repeat(_Stack([_Layer(i) for i in range(8)]))  # layer_idx 0..7: the same block at another place
    assert rep.container is not None and rep.depth == 8 and rep.path == "layers" and rep.block == "_Layer"
    assert "scaled to 8" in rep.why


@pytest.mark.parametrize("layers, words", [
    ([_Layer(i, 4096 if i % 2 else None) for i in range(8)], "setting attn.sliding_window differs"),
    ([_Layer(i) for i in range(7)] + [nn.Linear(16, 16)], "no nn.ModuleList or nn.Sequential of one block class"),
])
def test_blocks_that_differ_are_traced_whole_and_say_why(layers, words):
    rep = find_repeat(_Stack(layers))
    assert rep.container is None and rep.why.startswith("traced whole") and words in rep.why, rep.why


def test_a_parameter_tied_across_blocks_or_to_the_rest_is_traced_whole():
    m = _Stack([_Layer(i) for i in range(8)])
    m.layers[3].attn.q.weight = m.layers[0].attn.q.weight
    assert "shared by blocks 0 and 3" in find_repeat(m).why
    m = _Stack([_Layer(i) for i in range(8)])
    m.emb.weight = m.layers[5].attn.q.weight
    assert "tied" in find_repeat(m).why and find_repeat(m).container is None


def test_widths_that_vary_are_traced_whole():
    from helpers.block_models import widening

    rep = find_repeat(widening())
    assert rep.container is None and "block 1's submodules, parameters or buffers differ" in rep.why


def test_fewer_blocks_run_the_same_block_objects_and_are_restored():
    m = _Stack([_Layer(i) for i in range(8)])
    rep = find_repeat(m)
    with reduced(rep, 3):
        assert len(m.layers) == 3 and m.layers[1] is rep.blocks[1] and m.layers[2] is rep.blocks[7]  # the real last
        assert m(torch.randn(2, 16)).shape == (2, 16)
    assert m.layers is rep.container and len(m.layers) == 8


def _points(line):
    return dict(line.points)


def _close(a: float, b: float, rel: float = 0.01) -> bool:
    return abs(a - b) <= rel * abs(b) + 2**14  # 1 %, and the allocator's rounding on tiny values


def test_scaled_facts_equal_the_whole_trace_with_12_blocks():
    """Activation peaks plain and checkpointed, FLOPs, bytes, kernels and the largest allocation per step of a 12-block
    decoder traced with 3, 4 and 5 of its blocks equal those of the whole trace."""
    spec, sample, modes = "helpers.block_models:tiny12", "helpers.block_models:batch", ("half",)
    scaled = trace(spec, sample, modes=modes, cuda=True)
    whole = trace(spec, sample, modes=modes, cuda=True, scale_blocks=False)
    assert "blocks (12 x _TinyBlock): traced with 3, 4 and 5 blocks, scaled to 12" in scaled.source
    assert "traced whole (block scaling off)" in whole.source
    assert scaled.num_parameters == whole.num_parameters
    for key in ("half", "half_checkpointed"):
        s, w = _points(getattr(scaled.activations, key)), _points(getattr(whole.activations, key))
        assert s.keys() == w.keys(), key
        assert all(_close(s[b], w[b]) for b in w), (key, s, w)
        for s, w in zip(getattr(scaled.work, key).points, getattr(whole.work, key).points, strict=True):
            for phase in ("forward", "backward", "optimizer"):
                ps, pw = getattr(s, phase), getattr(w, phase)
                assert _close(ps.flops, pw.flops, 0.001) and _close(ps.bytes, pw.bytes, 0.001), (key, phase)
                assert ps.kernels == pw.kernels, (key, phase)
            assert s.largest_allocation_bytes == w.largest_allocation_bytes


def test_fsdp2s_line_is_scaled_where_the_third_depth_agrees_and_traced_whole_where_not():
    """FSDP2's peak beyond the arithmetic, traced with 3 and 4 blocks, is extended to the depth when the trace with 5
    lies on the same line; else the caller traces it whole (``None`` and why)."""
    from autotune.measure.repeated import Repeat
    from autotune.planner.model_facts import LinearBytes

    def line(d, at1=None):
        return LinearBytes(points=((1, at1 if at1 is not None else -1e6 + d * 2e5), (16, 1e7 + d * 1e6)))

    rep = Repeat(why="", depth=32)
    lines, why = fsdp_scaled({3: (line(3), None), 4: (line(4), None), 5: (line(5), None)}, rep)
    assert why is None and lines[1] is None
    assert dict(lines[0].points) == {1: -1e6 + 32 * 2e5, 16: 1e7 + 32 * 1e6}
    lines, why = fsdp_scaled({3: (line(3), None), 4: (line(4), None), 5: (line(5, at1=5e5), None)}, rep)
    assert lines is None and "with 5 blocks at micro-batch 1" in why
    low = {d: (LinearBytes(points=((1, -3e6 + d * 2e5), (16, 1e7))), None) for d in (3, 4, 5)}
    lines, _ = fsdp_scaled(low, Repeat(why="", depth=6))
    assert dict(lines[0].points)[1] == 0.0  # floored only once scaled


@pytest.mark.parametrize("spec, blocks", [("helpers.block_models:tiny2", 2), ("helpers.block_models:tiny4", 4)])
def test_fewer_blocks_than_the_scaling_needs_are_traced_whole_and_say_so(spec, blocks):
    assert blocks < MIN_DEPTH
    facts = trace(spec, "helpers.block_models:batch", modes=("half",), cuda=True)
    assert f"blocks ({blocks} x _TinyBlock) has fewer than {MIN_DEPTH} blocks" in facts.source
    assert facts.activations.half is not None and facts.work.half is not None


def test_a_model_without_repeated_blocks_is_traced_whole_and_the_plan_says_so():
    from autotune.config import parse_config
    from autotune.planner.compose import plan
    from autotune.profiles import load_profile
    from autotune.safe_input import load_yaml

    facts = trace("helpers.trace_models:mlp", "[64]", modes=("half",), cuda=True)
    why = "traced whole: no nn.ModuleList or nn.Sequential of one block class (no repeated block)"
    assert why in facts.source and facts.activations.half is not None
    cfg = parse_config(load_yaml("training:\n  model: helpers.trace_models:mlp\n  sample_input: '[64]'\n"
                                 "  entrypoint: train.py\n", "test"))
    p = plan(load_profile("8xH100-80GB"), cfg, facts=facts)
    assert why in p.memory.estimate.model_source


@pytest.mark.parametrize("spec, sample, path, lines", [
    ("helpers.block_models:sequential_head", "helpers.block_models:sequential_head_batch", "blocks (8 x _TinyBlock)",
     ("half", "half_checkpointed")),
    ("helpers.block_models:encoder_lm", "helpers.block_models:batch", "encoder.layer (8 x _TinyBlock)", ("half",)),
])
def test_scaled_facts_equal_the_whole_trace_for_a_sequential_of_blocks_and_an_encoders_layers(spec, sample, path,
                                                                                               lines):
    """The layouts of the kept-back models (issue 55's audit): blocks in an ``nn.Sequential`` called whole under a
    head whose logits dominate (GPT-2, TinyLlama: a big vocabulary), and blocks in ``encoder.layer`` (BERT, ViT).
    Their peaks and FLOPs scaled from 3 and 4 blocks equal the whole trace's within 1 % (measured equal to the byte
    on the full-size shapes: bench/kept_shapes.py)."""
    scaled = trace(spec, sample, modes=("half",), cuda=True)
    whole = trace(spec, sample, modes=("half",), cuda=True, scale_blocks=False)
    assert f"{path}: traced with 3, 4 and 5 blocks, scaled to 8" in scaled.source, scaled.source
    for key in lines:
        s, w = _points(getattr(scaled.activations, key)), _points(getattr(whole.activations, key))
        assert s.keys() == w.keys() and all(_close(s[b], w[b]) for b in w), (key, s, w)
        for a, b in zip(getattr(scaled.work, key).points, getattr(whole.work, key).points, strict=True):
            fa = a.forward.flops + a.backward.flops + a.optimizer.flops
            fb = b.forward.flops + b.backward.flops + b.optimizer.flops
            assert _close(fa, fb, 0.001), (key, fa, fb)


def test_fewer_blocks_keep_the_real_last_block_so_a_block_special_by_its_position_is_traced():
    """A block may act on its position against the model's depth (``layer_idx == depth - 1``: the last one folds in a
    final norm), which no plain setting shows. The steps with fewer blocks run the real first and last blocks (and the
    first ones between), so the scaled facts still equal the whole trace."""
    m = _Stack([_Layer(i) for i in range(8)])
    rep = find_repeat(m)
    with reduced(rep, 3):
        assert list(m.layers) == [rep.blocks[0], rep.blocks[1], rep.blocks[7]] and m.layers[2] is rep.blocks[7]
    spec, sample = "helpers.block_models:last_aware", "helpers.block_models:batch"
    scaled = trace(spec, sample, modes=("half",), cuda=True)
    whole = trace(spec, sample, modes=("half",), cuda=True, scale_blocks=False)
    assert "scaled to 8" in scaled.source, scaled.source
    s, w = _points(scaled.activations.half), _points(whole.activations.half)
    assert s.keys() == w.keys() and all(_close(s[b], w[b]) for b in w), (s, w)
    for a, b in zip(scaled.work.half.points, whole.work.half.points, strict=True):
        assert _close(a.forward.flops, b.forward.flops, 0.001), (a.forward.flops, b.forward.flops)
