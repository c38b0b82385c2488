"""Fault-injection figures for RELIABILITY.md, from real 2-process CPU launches.

    .venv/bin/python bench/reliability.py [--repeat N]

Per scenario and repetition: SIGTERM to every process (seconds to exit 75, steps lost),
kill -9 of one rank under --max_restarts 1 (steps repeated, run completed), kill -9 of one rank
without restarts (seconds until the launcher has exited), SIGSTOP of one rank with a 5 s step
budget (seconds until the launcher has exited).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
CFG = """
model: {n_layer: 1, n_head: 2, n_embd: 32}
data: {seq_len: 6, num_samples: 100000, num_val_samples: 64}
training: {global_batch_size: 32, base_batch_size: 32, max_steps: MAX, log_every_steps: 1, eval_every_steps: 100000}
checkpoint: {save_every_steps: 20, keep_last: 3, preemption_grace_s: 10}
distributed: {step_timeout_s: 5}
"""


def _env():
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    return env


def _steps(run: Path) -> list[int]:
    f = run / "metrics.jsonl"
    if not f.exists():
        return []
    return [json.loads(x)["step"] for x in f.read_text().splitlines() if "train/loss" in json.loads(x)]


def _start(base: Path, name: str, max_steps: int, *extra):
    cfg = base / f"{name}.yaml"
    cfg.write_text(CFG.replace("MAX", str(max_steps)))
    run = base / name
    out = open(base / f"{name}.out", "w")
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                          "--nproc_per_node", "2", *extra], stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
    while len(_steps(run)) < 50:
        if p.poll() is not None:
            raise SystemExit((base / f"{name}.out").read_text()[-3000:])
        time.sleep(0.05)
    ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
             if "autotune.train" in " ".join(c.cmdline()) and "torch.distributed.run" not in " ".join(c.cmdline())]
    return p, run, {c.environ()["RANK"]: c for c in ranks}


def preempt(base: Path) -> dict:
    p, run, _ = _start(base, "preempt", 100000)
    t0 = time.monotonic()
    for proc in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
        proc.send_signal(signal.SIGTERM)
    rc = p.wait(timeout=120)
    took = time.monotonic() - t0
    saved = max(int(c.name.split("-")[1]) for c in (run / "checkpoints").glob("step-*") if "." not in c.name)
    return {"exit": rc, "seconds_to_exit": round(took, 2), "steps_lost": max(_steps(run)) - saved}


def restart(base: Path) -> dict:
    p, run, ranks = _start(base, "restart", 300, "--max_restarts", "1")
    killed_at = max(_steps(run))
    ranks["1"].send_signal(signal.SIGKILL)
    rc = p.wait(timeout=300)
    log = (base / "restart.out").read_text()
    resumed = int(log.split("restart 1: resuming from")[1].split("step-")[1][:8])
    steps = _steps(run)
    return {"exit": rc, "completed": steps == list(range(1, 301)), "steps_repeated": killed_at - resumed}


def dead_peer(base: Path) -> dict:
    p, run, ranks = _start(base, "dead", 100000)
    t0 = time.monotonic()
    ranks["1"].send_signal(signal.SIGKILL)
    rc = p.wait(timeout=120)
    return {"exit": rc, "seconds_to_exit": round(time.monotonic() - t0, 2)}


def hung_peer(base: Path) -> dict:
    p, run, ranks = _start(base, "hung", 100000)
    t0 = time.monotonic()
    ranks["1"].suspend()
    try:
        rc = p.wait(timeout=180)
    finally:
        try:
            ranks["1"].kill()
        except psutil.NoSuchProcess:
            pass
    log = (base / "hung.out").read_text()
    return {"exit": rc, "seconds_to_exit": round(time.monotonic() - t0, 2), "step_budget_s": 5,
            "names_rank_1": "Never reported (hung, or killed before they could): rank 1" in log}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=1)
    args = ap.parse_args()
    results: dict[str, list] = {"preempt_sigterm_everyone": [], "kill9_rank_with_max_restarts_1": [],
                                "kill9_rank_no_restarts": [], "sigstop_rank_step_budget_5s": []}
    for _ in range(args.repeat):
        with tempfile.TemporaryDirectory() as d:
            base = Path(d)
            results["preempt_sigterm_everyone"].append(preempt(base))
            results["kill9_rank_with_max_restarts_1"].append(restart(base))
            results["kill9_rank_no_restarts"].append(dead_peer(base))
            results["sigstop_rank_step_budget_5s"].append(hung_peer(base))
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
