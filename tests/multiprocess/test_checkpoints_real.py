"""Verified checkpoints and automatic restarts (issue 11, promises 3 and 4), with real launches.

- kill -9 of one of two ranks under --max_restarts 1: torchrun restarts the group, the ranks
  continue from the newest good checkpoint, the run completes, the final weights equal an
  uninterrupted run's and metrics.jsonl has every step once;
- a damaged newest checkpoint: auto-resume falls back to the previous one and names the damaged
  one; an explicit damaged path is exit 2 naming the file, before any rank starts;
- a checkpoint without checksums (written before them) is refused unless --trust_checkpoint; trusted, with a
  rank-1 RNG file of the wrong content: every rank stops together with rank 1's message, exit 2, and rank 0
  never says "resumed".
"""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
import torch
from helpers.multiprocess import SMALL, metric_rows
from helpers.support import ROOT

LONG = (SMALL.replace("max_steps: 12", "max_steps: 120").replace("save_every_steps: 5, keep_last: 5",
                                                                "save_every_steps: 20, keep_last: 3")
        .replace("eval_every_steps: 6", "eval_every_steps: 1000"))


def _env():
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    return env


def _launch(*args, timeout=300):
    return subprocess.run([str(ROOT / "launch_distributed_training.sh"), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, env=_env(), cwd=ROOT)


def _steps(run):
    return [r["step"] for r in metric_rows(run) if "train/loss" in r]


def _weights(run, step):
    return torch.load(run / "checkpoints" / f"step-{step:08d}" / "model.pt", weights_only=True)


def test_a_killed_rank_is_restarted_and_the_run_matches_an_uninterrupted_one(tmp_path):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    ref = tmp_path / "ref"
    r = _launch("--config", cfg, "--run_dir", ref, "--nproc_per_node", 2)
    assert r.returncode == 0, r.stderr[-3000:]
    run = tmp_path / "run"
    out = open(tmp_path / "run.out", "w")
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                          "--nproc_per_node", "2", "--max_restarts", "1"], stdout=out, stderr=subprocess.STDOUT,
                         env=_env(), cwd=ROOT)
    deadline = time.monotonic() + 180
    while not ((run / "metrics.jsonl").exists() and max(_steps(run), default=0) >= 50):
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "run.out").read_text()[-3000:]
        time.sleep(0.05)
    ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
             if "autotune.train" in " ".join(c.cmdline()) and "torch.distributed.run" not in " ".join(c.cmdline())]
    rank1 = next(c for c in ranks if c.environ().get("RANK") == "1")
    killed_at = max(_steps(run))
    rank1.send_signal(signal.SIGKILL)
    assert p.wait(timeout=240) == 0, (tmp_path / "run.out").read_text()[-4000:]
    log = (tmp_path / "run.out").read_text()
    assert "restart 1: resuming from" in log
    resumed = int(log.split("restart 1: resuming from")[1].split("step-")[1][:8])
    assert 0 < killed_at - resumed <= 20 + 5  # repeated steps: at most the checkpoint interval (and the kill's lag)
    steps = _steps(run)
    assert steps == list(range(1, 121))  # every step once: the repeated ones were superseded
    superseded = [json.loads(x)["step"] for x in (run / "metrics.superseded.jsonl").read_text().splitlines()]
    assert superseded and min(superseded) == resumed + 1
    a, b = _weights(ref, 120), _weights(run, 120)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def _finished_run(runs, small_config, tmp_path, name="ddp"):
    """A copy of a shared reference run (SMALL, 2 processes, micro 16 x accumulation 1; checkpoints
    at steps 5, 10, 12), to damage or resume without touching the original."""
    import shutil

    run = tmp_path / "run"
    shutil.copytree(runs / name, run)
    return small_config, run


def test_damaged_checkpoints_fall_back_or_are_refused(runs, small_config, tmp_path):
    cfg, run = _finished_run(runs, small_config, tmp_path)  # checkpoints at steps 5, 10, 12
    newest = run / "checkpoints" / "step-00000012"
    data = bytearray((newest / "model.pt").read_bytes())
    data[1000:1064] = bytes(64)  # 64 zeroed bytes, size unchanged
    (newest / "model.pt").write_bytes(bytes(data))
    r = _launch("--config", cfg, "--run_dir", newest.parent.parent, "--nproc_per_node", 2, "--resume_from", newest)
    assert r.returncode == 2 and f"{newest} is damaged" in r.stderr and "model.pt: checksum differs" in r.stderr
    assert "Traceback" not in r.stderr and "autotune: ddp x2" not in r.stdout  # refused before any rank started
    r = _launch("--config", cfg, "--run_dir", run, "--nproc_per_node", 2, "--resume_from", "auto", "--max_steps", 14)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "warning: checkpoint step-00000012 is damaged and skipped" in r.stderr and "model.pt" in r.stderr
    assert "resumed at step 10 " in r.stdout
    assert _steps(run) == list(range(1, 15))  # 11 and 12 repeated once, recorded once


def test_a_rank_that_cannot_load_stops_every_rank(runs, small_config, tmp_path):
    """A checkpoint without checksums (trusted with --trust_checkpoint) whose rank-1 random state is a well-formed
    torch file of the wrong content: only loading can tell, on rank 1 alone, and every rank stops with its message."""
    cfg, run = _finished_run(runs, small_config, tmp_path)
    newest = run / "checkpoints" / "step-00000012"
    (newest / "checksums.json").unlink()  # as if written before checksums existed: only loading can tell
    torch.save({"not": "a random state"}, newest / "rng-rank1.pt")
    r = _launch("--config", cfg, "--run_dir", run, "--nproc_per_node", 2, "--resume_from", "auto", "--max_steps", 14)
    assert r.returncode == 2 and f"{newest / 'checksums.json'} is missing" in r.stderr  # refused unless trusted
    r = _launch("--config", cfg, "--run_dir", run, "--nproc_per_node", 2, "--resume_from", "auto", "--max_steps", 14,
                "--trust_checkpoint")
    assert r.returncode == 2, r.stdout[-2000:] + r.stderr[-3000:]
    assert "rank 1: " in r.stderr and f"{newest} is damaged or incompatible" in r.stderr
    assert "resumed at step" not in r.stdout  # no rank went on alone


def test_deepspeed_resume_applies_a_changed_learning_rate_and_records_it(runs, small_config, tmp_path):
    """Promise 6: a new learning rate on resume is the one the optimizer uses, said and recorded."""
    from autotune.plan import load_plan
    from autotune.runtime.optimizer import schedule_lambda

    _, run = _finished_run(runs, small_config, tmp_path, "ds")
    engine = ["--nproc_per_node", 2, "--deepspeed", "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1]
    cfg = tmp_path / "lr.yaml"
    cfg.write_text(SMALL.replace("learning_rate: 0.003", "learning_rate: 0.001"))
    r = _launch("--config", cfg, "--run_dir", run, *engine, "--resume_from", run / "checkpoints" / "step-00000010",
                "--max_steps", 14)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "learning_rate 0.003 -> 0.001" in r.stdout and "changed since" in r.stdout
    plan = load_plan(run / "plan.json")
    lrs = {json.loads(x)["step"]: json.loads(x)["train/lr"] for x in (run / "metrics.jsonl").read_text().splitlines()
           if "train/lr" in json.loads(x)}
    f = schedule_lambda(plan)
    for step in (11, 12, 13, 14):  # what DeepSpeed's optimizer ran with after each step
        assert lrs[step] == pytest.approx(0.001 * f(step), rel=1e-6)
    (entry,) = [json.loads(x) for x in (run / "resumes.jsonl").read_text().splitlines()]
    assert entry["step"] == 10 and entry["changed"]["learning_rate"] == {"checkpoint": 0.003, "now": 0.001}
