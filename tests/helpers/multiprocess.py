"""Helpers for the multi-process tests: the small config, launching, reading a run's records."""

import json
import os
import subprocess
from pathlib import Path

from helpers.support import ROOT

SMALL = """
model: {n_layer: 1, n_head: 2, n_embd: 32}
data: {seq_len: 6, num_samples: 2048, num_val_samples: 256}
training:
  probe: false  # no step timing on this CPU (one fixture run is timed: conftest.runs)
  global_batch_size: 32
  base_batch_size: 32
  learning_rate: 0.003
  warmup_steps: 3
  max_steps: 12
  log_every_steps: 1
  eval_every_steps: 6
checkpoint: {save_every_steps: 5, keep_last: 5}
"""


def launch(*args, env=None, timeout=300):
    full = {**os.environ, **(env or {})}
    full.pop("AUTOTUNE_PLAN", None)
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, env=full, cwd=ROOT)
    assert r.returncode == 0, f"launch failed ({r.returncode}):\n{r.stdout[-3000:]}\n{r.stderr[-5000:]}"
    return r


def plan_json(path):
    """A run's plan.json, validated as the typed plan, in the flat form `plan --json` prints."""
    from autotune.plan import load_plan, public_dict

    return public_dict(load_plan(path))


def metric_rows(run_dir):
    """metrics.jsonl's entries; a last line rank 0 is still writing is left out (tests that poll a
    running job read it mid-write: a half-written line once failed the kill test)."""
    lines = (run_dir / "metrics.jsonl").read_text().splitlines(keepends=True)
    return [json.loads(x) for x in lines if x.endswith("\n")]


def losses(run_dir):
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        e = json.loads(line)
        if "train/loss" in e:
            out[e["step"]] = e["train/loss"]
    return out


def final_val(run_dir):
    return json.loads((run_dir / "metrics.json").read_text())["final"]


def check_run_dir(run_dir, backend, world):
    plan = plan_json(run_dir / "plan.json")
    assert plan["backend"] == backend and plan["world_size"] == world
    cmd = json.loads((run_dir / "command.json").read_text())
    assert cmd["env"]["AUTOTUNE_PLAN"].endswith("plan.json")
    assert json.loads((run_dir / "hardware.json").read_text())["source"] == "detected"
    assert (run_dir / "deepspeed_config.json").exists() == (backend == "deepspeed")
    assert list((run_dir / "tensorboard").glob("events.out.tfevents.*"))
    ckpts = sorted((run_dir / "checkpoints").glob("step-*"))
    assert [c.name for c in ckpts] == ["step-00000005", "step-00000010", "step-00000012"]
    assert (ckpts[-1] / "model.pt").exists() and (ckpts[-1] / "meta.json").exists()
    for r in range(world):
        assert (ckpts[-1] / f"rng-rank{r}.pt").exists()
    replicas = run_dir / "replicas.json"
    if world > 1:  # every rank's weights hashed at the end: data-parallel copies are bit-identical
        rec = json.loads(replicas.read_text())
        assert rec["step"] == 12 and [r["rank"] for r in rec["ranks"]] == list(range(world))
        assert rec["identical"] and len({r["sha256"] for r in rec["ranks"]}) == 1
    else:
        assert not replicas.exists()
    loss = losses(run_dir)
    assert sorted(loss) == list(range(1, 13))
    assert loss[12] < loss[1] * 0.9, loss  # the loss falls
    return loss


def observed_as_planned(run_dir) -> dict:
    """What the launch observed the user's script run (delivery.json's "observed"): every plan value equal to
    the plan's, the script's own (not planned) or not observable, never different; no wrong batch or engine. The
    loader's workers may differ (DeepSpeed's own loader keeps its two): they change how fast, not what, it trains."""
    seen = json.loads((Path(run_dir) / "delivery.json").read_text())["observed"]
    statuses = {k: v["status"] for k, v in seen["values"].items()}
    assert seen["steps_observed"] > 0 and seen["wrong"] == [], seen
    assert not [k for k, s in statuses.items() if s == "different" and k != "num_workers"], seen["values"]
    return statuses


# The seed guides' Accelerate script: its batch and rate come from its own YAML (no batch flag for autotune to fill),
# an unmodified Accelerator(), an epoch of 8 steps a process (shorter than the observer's first 16) with a
# validation pass after each: the evaluation and Accelerate's one-batch look-ahead must not count as trained.
ACCELERATE_OWN_YAML = """
import argparse, yaml
import torch, torch.nn as nn, torch.nn.functional as F
from accelerate import Accelerator
from torch.utils.data import DataLoader, TensorDataset
p = argparse.ArgumentParser()
p.add_argument("--config", required=True)
p.add_argument("--epochs", type=int, default=3)
args = p.parse_args()
cfg = yaml.safe_load(open(args.config))
accelerator = Accelerator()
g = torch.Generator().manual_seed(0)
x = torch.randn(512, 16, generator=g)
y = x.sum(1, keepdim=True)
train = DataLoader(TensorDataset(x, y), batch_size=cfg["batch_size"], shuffle=True)
val = DataLoader(TensorDataset(x[:96], y[:96]), batch_size=48)
model = nn.Linear(16, 1)
opt = torch.optim.AdamW(model.parameters(), lr=cfg["lr"])
model, opt, train, val = accelerator.prepare(model, opt, train, val)
for epoch in range(args.epochs):
    model.train()
    for xb, yb in train:
        with accelerator.accumulate(model):
            accelerator.backward(F.mse_loss(model(xb), yb))
            opt.step()
            opt.zero_grad()
    model.eval()
    with torch.no_grad():
        val_loss = sum(F.mse_loss(model(xb), yb).item() for xb, yb in val)
effective = cfg["batch_size"] * accelerator.gradient_accumulation_steps * accelerator.num_processes
accelerator.print(f"TRAINED effective={effective} val_loss={val_loss:.3f}")
accelerator.wait_for_everyone()
accelerator.end_training()
"""


def accelerate_own_yaml(d: Path, batch_size: int, strict: bool = True) -> Path:
    """The Accelerate seed script, its own YAML (``batch_size``, lr 0.01) and autotune's config for it (global 64,
    16 a process: the plan's accumulation 2 cannot pair with the script's own batch, so it is withheld). Returns the
    config; the script's YAML goes after `--` as --config."""
    (d / "acc_yaml.py").write_text(ACCELERATE_OWN_YAML)
    (d / "own.yaml").write_text(f"batch_size: {batch_size}\nlr: 0.01\n")
    cfg = d / "autotune.yaml"
    cfg.write_text(f"training:\n  entrypoint: {d / 'acc_yaml.py'}\n  global_batch_size: 64\n  batch_size_per_gpu: 16\n"
                   f"  strict: {str(strict).lower()}\n  script_args: ['--config', '{d / 'own.yaml'}']\n"
                   "checkpoint:\n  save_every_steps: null\n")
    return cfg
