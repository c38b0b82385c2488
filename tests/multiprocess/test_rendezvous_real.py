"""Waiting is not failing, and one machine holds several launches (issue 43), with real launchers: two "pods" (the
Kubeflow Trainer's PET_* and nothing else) whose second starts 75 s after the first both train to the end with the
default rendezvous budget (a node that never comes: test_preflight_real, exit 69); two one-process launches at
once on this machine each take a port of their own and both train, and neither says a word of another launch's
DeepSpeed build."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from helpers.multiprocess import metric_rows
from helpers.support import ROOT, free_port

pytestmark = pytest.mark.multiprocess

TINY = """
model: {n_layer: 1, n_head: 2, n_embd: 16}
data: {seq_len: 6, num_samples: 4096, num_val_samples: 32}
training: {probe: false, global_batch_size: 8, base_batch_size: 8, warmup_steps: 1, max_steps: 3,
           log_every_steps: 1, eval_every_steps: 100000}
checkpoint: {save_every_steps: null, save_at_end: false}
"""
LATE_S = 75


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_")) and k != "AUTOTUNE_PLAN"}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _launch(*args):
    return [sys.executable, "-m", "autotune", "launch", *map(str, args)]


def test_a_pod_75_s_late_is_waited_for_and_both_train_to_the_end(tmp_path):
    """Node 1's pod starts first and finds nothing at node 0's port for 75 s (its pod not scheduled yet): it says
    so, keeps trying and says how long it has waited every 30 s; node 0's pod then starts and both train their 3
    steps (they used to give up after 60 s with exit 2, which the exported TrainJob treats as permanent)."""
    cfg = tmp_path / "job.yaml"
    cfg.write_text(TINY)
    run, port = tmp_path / "pvc" / "job", free_port()
    env = _env(KUBERNETES_SERVICE_HOST="kubernetes.default.svc", PET_NNODES="2", PET_NPROC_PER_NODE="1",
               PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), AUTOTUNE_JOB_SECRET="s3cr3t-of-this-test")
    outs = [tmp_path / f"pod{n}.out" for n in (0, 1)]
    cmd = _launch("--config", cfg, "--run_dir", run, "--num_gpus", 0, "--nproc_per_node", 1)
    pods = {}
    try:
        for n in (1, 0):
            with open(outs[n], "w") as out:
                pods[n] = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT,
                                           env={**env, "PET_NODE_RANK": str(n)})
            if n == 1:
                deadline = time.monotonic() + LATE_S
                while time.monotonic() < deadline:
                    assert pods[1].poll() is None, outs[1].read_text()  # node 1 waits, never gives up
                    time.sleep(1)
        rcs = {n: p.wait(timeout=240) for n, p in pods.items()}
    finally:
        for p in pods.values():
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
    texts = [o.read_text() for o in outs]
    assert rcs == {0: 0, 1: 0}, texts
    assert "waits up to 600 s" in texts[1]  # the default: torchrun's own
    assert (f"autotune: node 1 of 2: node 0 at 127.0.0.1:{port} is not up yet (nothing listens there yet); waiting "
            "up to 600 s (distributed.rendezvous_timeout_s)") in texts[1]
    waited = [line for line in texts[1].splitlines() if line.startswith("autotune: node 1 of 2: still waiting")]
    assert len(waited) == 2 and all(f"for node 0 at 127.0.0.1:{port}: " in w for w in waited), texts[1]
    assert [r["step"] for r in metric_rows(run) if "train/loss" in r] == [1, 2, 3]
    assert all("Done." in t for t in texts)


SCRIPT = """
import os, sys, time, torch, torch.distributed as dist
dist.init_process_group("gloo")  # env://: a store at MASTER_PORT, which a second launch at 29500 could not open
time.sleep(3)  # both launches hold their stores at once
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    model(torch.randn(8, 4)).sum().backward()
    opt.step()
    opt.zero_grad()
print("trained at port", os.environ["MASTER_PORT"], flush=True)
dist.destroy_process_group()
"""


def test_two_one_process_launches_at_once_each_take_a_free_port_and_train(tmp_path):
    """Issue 43: every one-process launch got MASTER_PORT=29500, so a second one at the same time died with
    EADDRINUSE. Each now takes a free port at launch (as torchrun --standalone does) and records it; both train.
    Meanwhile another launch's DeepSpeed build holds its lock in this installation's extension folder: neither run
    (no DeepSpeed) says a word of it."""
    from autotune.rundir.installation import installation_key

    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cfg = tmp_path / "job.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  probe: false\n")
    cache = tmp_path / "xdg"
    lock = cache / "autotune" / "torch_extensions" / installation_key() / "deepspeed_shm_comm" / "lock"
    lock.parent.mkdir(parents=True)
    lock.write_text("")
    os.utime(lock, (time.time() - 60, time.time() - 60))  # another launch has been building for a minute
    builder = subprocess.Popen(["sh", "-c", f'exec 3<"{lock}"; exec sleep 120'])  # ... and holds the lock open
    env = _env(XDG_CACHE_HOME=str(cache))
    try:
        procs = [subprocess.Popen(_launch("--config", cfg, "--run_dir", tmp_path / f"run{n}", "--single"),
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=ROOT, env=env)
                 for n in (0, 1)]
        outs = [p.communicate(timeout=180)[0] for p in procs]
    finally:
        builder.kill()
        builder.wait()
    assert [p.returncode for p in procs] == [0, 0], outs
    ports = [json.loads((tmp_path / f"run{n}" / "command.json").read_text())["env"]["MASTER_PORT"] for n in (0, 1)]
    assert ports[0] != ports[1] and "29500" not in ports
    for n in (0, 1):
        assert f"trained at port {ports[n]}" in outs[n]  # the port the records say is the one the script got
        assert "building" not in outs[n] and "deepspeed_shm_comm" not in outs[n], outs[n]
