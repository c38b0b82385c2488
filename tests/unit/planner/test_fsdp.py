"""FSDP2 as a planned engine (issue 36): its memory lines by hand and against a fake-process-group trace, the wrap
units, the choice among DDP, FSDP2 and ZeRO on the presets with its reasons, --fsdp, and its checkpoints in one
process (DCP read as data; DDP and single-process checkpoints continue under FSDP2 and back)."""

import json

import pytest
import torch

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.planner import plan, weigh
from autotune.planner.memory import STRATEGIES, fsdp_buffer_bytes, model_state_bytes
from autotune.planner.model_facts import builtin_facts
from autotune.profiles import load_profile

# -- the arithmetic, by hand --------------------------------------------------------------------------------------
# the built-in GPT at 24 layers x 2048 (tests/golden/big_model.yaml): a block is 12 d^2 + 13 d, the root the token
# and position embeddings (1000 x 2048, 511 x 2048) and the final norm (2 d)
BIG = apply_overrides(TrainConfig(), {"model.n_layer": 24, "model.n_embd": 2048, "model.n_head": 16,
                                      "data.seq_len": 256, "data.vocab_size": 1000})
D = 2048
UNIT, ROOT = 12 * D * D + 13 * D, 1000 * D + 511 * D + 2 * D
PSI = 24 * UNIT + ROOT


def test_fsdp_memory_lines_by_hand():
    facts = builtin_facts(BIG)
    assert (facts.num_parameters, facts.fsdp_unit, facts.fsdp_unit_parameters, facts.fsdp_root_parameters) == \
        (PSI, "Block", UNIT, ROOT)
    # sharded fp32 weights, gradients and AdamW's two moments: 16 bytes a parameter / world
    assert model_state_bytes("fsdp", PSI, 8).gpu_bytes == 16 * PSI / 8
    # gathered in bf16: the root (never resharded between forward and backward), the unit in use and the one
    # prefetched; the unit's bf16 gradients and their fp32 copy for the reduce-scatter
    assert fsdp_buffer_bytes(STRATEGIES["fsdp"], PSI, UNIT, ROOT, half=True) == 2 * (ROOT + 2 * UNIT) + 6 * UNIT
    # without resharding every unit's weights stay gathered until the backward, plus the unit being gathered
    assert fsdp_buffer_bytes(STRATEGIES["fsdp_no_reshard"], PSI, UNIT, ROOT, half=True) == 2 * (PSI + UNIT) + 6 * UNIT
    # fp32 (CPU processes): 4-byte weights gathered and reduced
    assert fsdp_buffer_bytes(STRATEGIES["fsdp"], PSI, UNIT, ROOT, half=False) == 4 * (ROOT + 2 * UNIT) + 8 * UNIT
    # CPUOffloadPolicy: the sharded state in host RAM, 8 ranks of a node
    off = model_state_bytes("fsdp_offload", PSI, 8, ranks_per_node=8)
    assert (off.gpu_bytes, off.host_bytes_per_node) == (0.0, 16 * PSI)
    # a model whose blocks are unknown is one unit: FSDP2 gathers all of it, and reduces all of it
    assert fsdp_buffer_bytes(STRATEGIES["fsdp"], PSI, 0, None, half=True) == 2 * PSI + 6 * PSI


def test_the_wrap_units_are_the_models_repeated_blocks():
    import torch.nn as nn
    from helpers import trace_models

    from autotune.measure.fsdp_trace import unit_sizes

    gpt = trace_models.small_gpt()
    assert unit_sizes(gpt) == ("Block", 12 * 128 * 128 + 13 * 128, 256 * 128 + 32 * 128 + 2 * 128)
    lm = trace_models.tied_lm()  # nn.TransformerEncoder's layers; the tied head counts once, in the root
    layer = sum(p.numel() for p in lm.blocks.layers[0].parameters())
    assert unit_sizes(lm) == ("TransformerEncoderLayer", layer, 500 * 64)

    class Named(nn.Module):  # a Hugging Face model names its blocks
        _no_split_modules = ["Inner"]

        def __init__(self):
            super().__init__()
            self.a, self.b = Inner(), nn.Linear(4, 4)

    class Inner(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 8)

    assert unit_sizes(Named()) == ("Inner", 40, 20)
    assert unit_sizes(trace_models.mlp()) == (None, 0, sum(p.numel() for p in trace_models.mlp().parameters()))


def test_fsdp_lines_against_a_fake_process_group_trace():
    """The planner's FSDP2 estimate (the sharded state and gathered units by arithmetic, plus FSDP2's own line
    traced at 4 ranks) against FSDP2 stepped under a fake process group (torch's FSDPMemTracker): the traced peak
    itself at the traced world, the no-reshard variant from the same line within 10 % (its arithmetic keeps every
    unit gathered at the peak), and at 8 ranks low by at most the gradients not yet made at the peak, 4 bytes a
    parameter x (1/4 - 1/8), as measure.fsdp_trace says."""
    from helpers import trace_models
    from torch._subclasses.fake_tensor import FakeTensorMode

    from autotune.measure.fsdp_trace import fsdp_lines, traced_peaks
    from autotune.measure.trace import _call, _loss

    args = (trace_models.small_gpt, trace_models.small_gpt_batch, _call, _loss)
    with FakeTensorMode(allow_non_fake_inputs=True):
        line, _ = fsdp_lines(*args, half=True, checkpointing=None, world=4, points=(16,))
        measured = {(w, r): traced_peaks(*args, half=True, world=w, reshard_after_forward=r, points=(16,))
                    for w, r in ((4, True), (4, False), (8, True))}

    def estimate(world, strategy, num, unit, root):
        s = STRATEGIES[strategy]
        return (model_state_bytes(s, num, world).gpu_bytes + fsdp_buffer_bytes(s, num, unit, root, True)
                + line.at(16))

    peaks, num, unit, root = measured[(4, True)]
    assert estimate(4, "fsdp", num, unit, root) == pytest.approx(peaks[0][1], rel=1e-6)
    peak = measured[(4, False)][0][0][1]
    assert peak * 0.9 <= estimate(4, "fsdp_no_reshard", num, unit, root) <= peak * 1.1
    peak = measured[(8, True)][0][0][1]
    assert peak - 4 * num * (1 / 4 - 1 / 8) <= estimate(8, "fsdp", num, unit, root) <= peak


# -- the choice among DDP, FSDP2 and ZeRO --------------------------------------------------------------------------

def _weighed(hw, cfg, facts, deepspeed):
    p, weighing = weigh(hw, cfg, facts=facts, deepspeed_installed=deepspeed)
    return p, {rw.label: rw for rw in weighing.rows}


def _recorded_gpt2(params=None):
    from helpers.gpu_truth import recorded_facts

    cfg, facts = recorded_facts("gpt2_small")
    if params:  # a 1.5B model with GPT-2 small's activations: 30 blocks of 50M, a 300M root
        facts = facts.model_copy(update={"num_parameters": params, "trainable_parameters": params,
                                         "fsdp_unit": "GPT2Block", "fsdp_unit_parameters": 50_000_000,
                                         "fsdp_root_parameters": 300_000_000})
    return cfg, facts


@pytest.mark.parametrize("preset, params, deepspeed, chosen", [
    # GPT-2 small is compute-bound on NVLink: every engine within the model's own error on the H100 (5.8 %), the
    # policy's order settles it
    ("8xH100-80GB", None, True, "ZeRO-2"),
    ("8xH100-80GB", None, False, "DDP"),
    # two nodes over TCP, accumulation 4: DDP all-reduces once a step behind the last backward; FSDP2 gathers and
    # reduce-scatters its one unit (GPT-2's units are not counted here) every micro-step, none of it hidden
    ("2x4xL4", None, False, "DDP"),
    # ZeRO-1's one reduction a step and ZeRO-2's per micro-step within the L4's conservative error: ZeRO-2 first
    ("2x4xL4", None, True, "ZeRO-2"),
    # 1.5B parameters on 40 GB: DDP's 16 bytes a parameter leave micro-batch 8, FSDP2 and ZeRO reach 16; all within
    # the model's error of each other: the policy's order
    ("8xA100-40GB", 1_500_000_000, True, "ZeRO-2"),
    ("8xA100-40GB", 1_500_000_000, False, "DDP"),
    ("8xH100-80GB", 1_500_000_000, True, "ZeRO-2"),
])
def test_the_engine_is_chosen_by_time_among_ddp_fsdp2_and_zero(preset, params, deepspeed, chosen):
    cfg, facts = _recorded_gpt2(params)
    p, rows = _weighed(load_profile(preset), cfg, facts, deepspeed)
    assert p.memory.estimate.strategy == chosen
    assert p.engine.backend == {"D": "ddp", "Z": "deepspeed", "F": "fsdp", "H": "fsdp"}[chosen[0]]
    assert p.engine.dp_replicate == (2 if chosen.startswith("HSDP") else 1)
    assert {"FSDP2", "FSDP2 without resharding after forward", "FSDP2 + CPU offload"} <= set(rows)
    from autotune.planner.choice import contenders, tie_of

    band = tie_of(tuple(rows.values()))  # the model's own error on this GPU's evidence
    best = max(rw.time.samples_per_s for rw in rows.values() if rw.time is not None and rw.why_not is None)
    assert rows[chosen].time.samples_per_s >= best * (1 - band)  # the fastest, or tied with it
    weighed = max(rw.time.samples_per_s for rw in contenders(tuple(rows.values()))
                  if rw.time is not None and rw.why_not is None)
    tie = rows[chosen].time.samples_per_s < weighed  # within the model's error of the fastest weighed: a tie
    assert p.reasons["backend"].startswith((f"within {band:.1%} of the most samples/s at the global batch (the "
                                            "model's own error), a tie settled by the preference order: " if tie else
                                            "the most samples/s at the global batch: ")
                                           + f"{chosen} at micro-batch {p.batch.micro_batch_size}: ")
    if p.engine.backend == "fsdp":
        assert p.engine.fsdp_unit == facts.fsdp_unit and p.engine.reshard_after_forward is False
        assert p.reasons["reshard_after_forward"].startswith("every unit's bf16 weights stay gathered")


def test_fsdp_is_forced_with_its_flag_and_refused_in_fp16():
    from autotune.prepare import plan_for

    p, _, ds = plan_for(TrainConfig(), {"distributed.backend": "fsdp"}, "4xL4")
    assert (p.engine.backend, p.engine.fsdp_unit, ds) == ("fsdp", "Block", None)
    assert p.overrides["backend"].chosen == "fsdp" and p.memory.estimate.strategy.startswith("FSDP2")
    # T4s have no bf16: autotune offers no FSDP2 there, and refuses it when asked
    _, weighing = weigh(load_profile("4xT4"), TrainConfig(), deepspeed_installed=True)
    assert not [rw for rw in weighing.rows if rw.strategy.backend == "fsdp"]
    with pytest.raises(UserError, match="autotune runs FSDP2 in bf16 or fp32"):
        plan_for(TrainConfig(), {"distributed.backend": "fsdp"}, "4xT4")
    # on CPU processes FSDP2 runs only when asked for, in fp32 and its units in RAM
    cpu = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2}))
    assert cpu.engine.backend == "ddp"


def test_offload_is_the_seed_rules_last_resort():
    """One GPU without DeepSpeed: FSDP2's CPU offload is weighed (no install needed) but taken only where nothing
    fits without it."""
    from helpers.profiles_util import make_profile

    hw = make_profile(gpus=[("GPU", 18500, 18000, "8.0")], ram_gib=256, deepspeed=None)
    p = plan(hw, BIG, deepspeed_installed=False)  # 1.2B: DDP's 16 bytes a parameter (18.1 GiB) fit no 18 GB GPU
    assert (p.engine.backend, p.engine.offload_param) == ("fsdp", True)
    assert "FSDP2 + CPU offload" in p.memory.estimate.strategy
    assert p.reasons["offload_optimizer"].startswith("needed for memory: CPUOffloadPolicy")


# -- checkpoints in one process: FSDP2 <-> single, DCP read as data --------------------------------------------------

@pytest.fixture
def group(tmp_path):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _engine(backend, **over):
    from autotune.runtime.dist import DistContext
    from autotune.runtime.engine import make_engine
    from autotune.runtime.workload import build_model

    cfg = apply_overrides(TrainConfig(), {"training.max_steps": 10, "training.global_batch_size": 4,
                                          "distributed.backend": backend, **over})
    p = plan(load_profile("cpu-only"), cfg)
    torch.manual_seed(0)
    ctx = DistContext(0, 0, 1, torch.device("cpu"), backend == "fsdp")
    return make_engine(p, build_model(p.workload), ctx), ctx


def _step(engine):
    x = torch.randint(0, 10, (4, 15), generator=torch.Generator().manual_seed(7))
    engine.forward_backward((x, x), boundary=True)
    engine.step()


def _weights(engine):
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    return get_model_state_dict(engine.module, options=StateDictOptions(full_state_dict=True))


def test_fsdp_checkpoints_continue_under_single_and_back_and_refuse_code(group, tmp_path):
    from autotune.runtime.checkpoint_manager import CheckpointManager

    fsdp, ctx = _engine("fsdp")
    _step(fsdp)
    # a periodic (or preemption) save: the shards alone, no whole weights gathered on rank 0 (issue 43 item 10) ...
    saved = CheckpointManager(tmp_path / "a", ctx).save(fsdp, 1, consumed=1, last=False)
    files = {p.name for p in saved.rglob("*")}
    assert {"trainer.json", "fsdp", ".metadata"} <= files and not {"trainer.pt", "model.pt"} & files
    assert json.loads((saved / "meta.json").read_text())["backend"] == "fsdp"
    # ... the save after the last step, or every save with checkpoint.full_weights: every, adds model.pt
    assert (CheckpointManager(tmp_path / "z", ctx).save(fsdp, 1, consumed=1, last=True) / "model.pt").is_file()
    every, _ = _engine("fsdp", **{"checkpoint.full_weights": "every"})
    assert (CheckpointManager(tmp_path / "e", ctx).save(every, 1, consumed=1, last=False) / "model.pt").is_file()
    one, ctx1 = _engine("single")  # an FSDP2 checkpoint continues in one process: DCP gathers the shards
    CheckpointManager(tmp_path / "a", ctx1).load(one, saved)
    _step(fsdp)
    _step(one)
    a, b = _weights(fsdp), one.module.state_dict()
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    back = CheckpointManager(tmp_path / "b", ctx1).save(one, 2, consumed=2)  # ... and a single one under FSDP2
    again, _ = _engine("fsdp")
    CheckpointManager(tmp_path / "b", ctx).load(again, back)
    _step(again)
    _step(one)
    a, b = _weights(again), one.module.state_dict()
    assert all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)
    # DCP's metadata is a pickle: read as data, a class it does not name is refused, never built
    meta = saved / "fsdp" / ".metadata"
    meta.write_bytes(b"cos\nsystem\n(S'echo pwned'\ntR.")
    (saved / "checksums.json").unlink()
    with pytest.raises(UserError, match="damaged or incompatible") as e:
        CheckpointManager(tmp_path / "a", ctx).load(_engine("fsdp")[0], saved)
    assert "fsdp/.metadata holds os.system, which is not data" in str(e.value.problems)
