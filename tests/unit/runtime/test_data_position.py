"""Where the data stream is, counted in samples: the plan's steps agree with the stream, and a resume with the same
world size but another micro-batch x accumulation continues at the same sample (issue 26)."""

import torch
from torch.utils.data import TensorDataset

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.runtime.data import BatchStream


def samples(stream: BatchStream, n_micro: int) -> list[int]:
    out = []
    for i, (x,) in enumerate(stream):
        out += x.tolist()
        if i + 1 == n_micro:
            return out
    return out


def test_the_plans_steps_are_the_streams_with_an_uneven_sample_count():
    """num_samples 100, global 32 = micro 16 x 2 on one process, 2 epochs: 6 whole micro-batches an epoch (4 samples
    dropped), 3 steps an epoch, 6 in all; the stream is then exactly at the end of epoch 2 (not 2.67 epochs)."""
    cfg = apply_overrides(TrainConfig(), {"data.num_samples": 100, "training.global_batch_size": 32,
                                          "training.batch_size_per_gpu": 16, "training.epochs": 2})
    p = plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)
    assert (p.batch.micro_batch_size, p.batch.gradient_accumulation_steps, p.engine.world_size) == (16, 2, 1)
    assert (p.schedule.steps_per_epoch, p.schedule.total_steps) == (3, 6)
    stream = BatchStream(TensorDataset(torch.arange(100)), 16, 0, 1, seed=0)
    samples(stream, p.schedule.total_steps * p.batch.gradient_accumulation_steps)
    assert stream.consumed / stream.per_epoch == 2.0


def test_a_user_scripts_plan_counts_steps_only_when_its_data_is_described(tmp_path):
    script = tmp_path / "s.py"
    script.write_text("print(1)\n")
    mine = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"training.entrypoint": str(script)}),
                deepspeed_installed=False)
    assert (mine.schedule.steps_per_epoch, mine.schedule.total_steps) == (None, None)
    assert "not described" in mine.reasons["steps_per_epoch"]
    described = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {
        "training.entrypoint": str(script), "data.num_samples": 640}), deepspeed_installed=False)
    assert described.schedule.steps_per_epoch is not None


def test_a_user_scripts_printed_plan_says_its_steps_are_unknown(cli, tmp_path):
    """What `autotune plan` prints for a script whose data is not described: no figure of the built-in workload."""
    (tmp_path / "s.py").write_text("print(1)\n")
    (tmp_path / "c.yaml").write_text("training:\n  entrypoint: s.py\n")
    r = cli("autotune", "plan", "--config", str(tmp_path / "c.yaml"), "--hardware", "cpu-only", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    lines = {ln.split(":", 1)[0]: ln for ln in r.stdout.splitlines()
             if ln.startswith(("Steps per epoch", "Total steps"))}
    assert "unknown: your script's data is not described (set data.num_samples" in lines["Steps per epoch"]
    assert lines["Total steps"].split()[-1] == "unknown"


def test_a_resume_with_another_layout_continues_at_the_same_sample():
    """Saved at micro 16 x accumulation 2, resumed at 8 x 4, world size 1, 108 samples an epoch (6 whole
    micro-batches of 16, 13 of 8: each layout drops its own partial one). Wherever it was saved (inside epoch 1,
    at its end, in epochs 2 and 3), the resumed stream is in the same epoch at the same sample: it yields the
    rest of that epoch's permutation from there, none of it seen before, then the next epoch from its start."""
    data = TensorDataset(torch.arange(108))
    for steps_done in (2, 3, 5, 7):
        saving = BatchStream(data, 16, 0, 1, seed=3)
        seen = samples(saving, steps_done * 2)
        epoch, offset = divmod(saving.consumed, saving.per_epoch)
        resumed = BatchStream(data, 8, 0, 1, seed=3, start_micro_batch=saving.consumed, saved_micro=16)
        assert resumed.epoch == epoch
        saving.sampler.set_epoch(epoch)
        permutation = list(saving.sampler)
        rest = permutation[offset * 16:resumed.per_epoch * 8]  # what the resumed layout keeps of this epoch
        got = samples(resumed, len(rest) // 8 + 2)
        assert got[:len(rest)] == rest, steps_done
        assert not set(got[:len(rest)]) & set(seen[len(seen) - offset * 16:]), steps_done  # nothing twice
        saving.sampler.set_epoch(epoch + 1)
        assert got[len(rest):] == list(saving.sampler)[:16], steps_done  # then the next epoch from its start


def test_one_epoch_of_one_global_batch_is_one_step():
    """One epoch of exactly one global batch is one step (not rounded up to a minimum of two)."""
    from autotune.planner.deciders import steps

    assert steps(32, 16, 2, 1, 1, None) == (1, 1, 2)
    assert steps(31, 16, 2, 1, 1, None) == (0, 1, 1)  # one micro-batch an epoch: no whole step, yet one step runs
