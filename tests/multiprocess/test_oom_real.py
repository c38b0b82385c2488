"""Out of memory on some ranks -> all back off together (issue 11, promise 8), on CPU with an
injected torch.OutOfMemoryError (AUTOTUNE_INJECT_OOM=rank:step:max_rows) in real DDP runs."""

import json
import os
import subprocess

import pytest
from helpers.multiprocess import SMALL, launch, losses
from helpers.support import ROOT


def test_oom_on_one_rank_backs_every_rank_off_and_retries_the_same_samples(runs, small_config, tmp_path):
    ref, run = runs / "ddp", tmp_path / "run"  # the shared reference: the same config and flags, no fault
    flags = ["--nproc_per_node", 2, "--batch_size", 16, "--grad_accum", 1]
    r = launch("--config", small_config, "--run_dir", run, *flags, env={"AUTOTUNE_INJECT_OOM": "1:5:8"})
    assert ("out of memory on rank 1 at step 5 with micro-batch 16: every rank retries the step with "
            "micro-batch 8 x accumulation 2 (global batch unchanged)") in r.stdout
    (entry,) = [json.loads(x) for x in (run / "backoff.jsonl").read_text().splitlines()]
    assert entry == {"step": 5, "ranks": [1], "micro_batch_size": 8, "gradient_accumulation_steps": 2,
                     "was_micro_batch_size": 16}
    a, b = losses(ref), losses(run)
    assert a.keys() == b.keys() == set(range(1, 13))
    for step in a:  # the same samples in every step, the failed one included: the same trajectory
        assert b[step] == pytest.approx(a[step], rel=1e-4), step


def test_deepspeed_zero2_backs_off_together_and_keeps_the_trajectory(runs, small_config, tmp_path):
    """The same under DeepSpeed ZeRO-2: DeepSpeed's accumulation doubles with the pieces, the losses follow
    the shared fault-free DeepSpeed run (same config and flags)."""
    ref, run = runs / "ds", tmp_path / "run"
    flags = ["--nproc_per_node", 2, "--deepspeed", "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1]
    r = launch("--config", small_config, "--run_dir", run, *flags, env={"AUTOTUNE_INJECT_OOM": "0:4:8"}, timeout=600)
    assert ("out of memory on rank 0 at step 4 with micro-batch 16: every rank retries the step with "
            "micro-batch 8 x accumulation 2 (global batch unchanged)") in r.stdout
    a, b = losses(ref), losses(run)
    assert a.keys() == b.keys() == set(range(1, 13))
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-4), step


def test_oom_at_micro_batch_one_is_a_clear_stop(tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(SMALL)
    env = {**os.environ, "AUTOTUNE_INJECT_OOM": "0:2:0"}
    env.pop("AUTOTUNE_PLAN", None)
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir",
                        str(tmp_path / "run"), "--single", "--batch_size", "4", "--grad_accum", "8"],
                       capture_output=True, text=True, timeout=300, env=env, cwd=ROOT)
    assert r.returncode == 2, r.stderr[-2000:]
    assert "out of memory on rank 0 at step 2 with micro-batch 1: nothing smaller to try" in r.stderr
    backs = [json.loads(x)["micro_batch_size"] for x in (tmp_path / "run" / "backoff.jsonl").read_text().splitlines()]
    assert backs == [2, 1]
