"""The launcher owns its process tree: whatever ends it, no rank trains on unattended."""

import os
import signal
import subprocess
import time

import psutil
import pytest
from helpers.support import ROOT

LONG = """
model: {n_layer: 1, n_head: 2, n_embd: 32}
data: {seq_len: 6, num_samples: 100000, num_val_samples: 64}
training: {global_batch_size: 32, base_batch_size: 32, max_steps: 100000, log_every_steps: 1, eval_every_steps: 100000}
checkpoint: {save_every_steps: null, save_at_end: false}
"""


def _start(tmp_path, name):
    cfg = tmp_path / "long.yaml"
    cfg.write_text(LONG)
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    run = tmp_path / name
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                          "--nproc_per_node", "2"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env,
                         cwd=ROOT)
    deadline = time.monotonic() + 120
    while not (run / "metrics.jsonl").exists():  # training has started: every rank is up
        assert p.poll() is None and time.monotonic() < deadline, "the run did not start"
        time.sleep(0.5)
    tree = psutil.Process(p.pid).children(recursive=True)
    assert len(tree) >= 3  # torchrun and two ranks
    return p, tree, run


@pytest.mark.parametrize("sig", [signal.SIGKILL])  # SIGHUP/SIGUSR1/SIGINT/SIGTERM are forwarded: test_preemption_real
def test_no_rank_outlives_the_launcher(tmp_path, sig):
    p, tree, run = _start(tmp_path, f"r{int(sig)}")
    os.kill(p.pid, sig)
    gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, f"still running 20 s after {sig.name} to the launcher: {[a.cmdline() for a in alive]}"
    p.wait(timeout=30)
    size = (run / "metrics.jsonl").stat().st_size
    time.sleep(2)
    assert (run / "metrics.jsonl").stat().st_size == size  # the run dir stopped changing


def test_max_restarts_restart_a_failed_one_process_run(tmp_path):
    """A CPU plan is one process (the single backend); with --max_restarts 2 a run that fails is still started
    again (under torchrun, one process), and the launch succeeds when the second attempt does."""
    import json
    import sys

    from helpers.multiprocess import launch

    marker = tmp_path / "attempts"
    script = tmp_path / "flaky.py"
    script.write_text("import os, sys\n"
                      f"p = {str(marker)!r}\n"
                      "n = int(open(p).read()) if os.path.exists(p) else 0\n"
                      "open(p, 'w').write(str(n + 1))\n"
                      "print('ATTEMPT', n + 1, 'RANK', os.environ.get('RANK'), 'WORLD', os.environ.get('WORLD_SIZE'))\n"
                      "sys.exit(1 if n == 0 else 0)\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n")
    r = launch("--config", cfg, "--run_dir", tmp_path / "run", "--max_restarts", 2)
    assert marker.read_text() == "2" and "ATTEMPT 2 RANK 0 WORLD 1" in r.stdout, r.stdout[-2000:]
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert plan["engine"]["backend"] == "single" and plan["engine"]["max_restarts"] == 2
    argv = json.loads((tmp_path / "run" / "command.json").read_text())["argv"]
    assert argv[:3] == [sys.executable, "-m", "torch.distributed.run"] and "--max_restarts=2" in argv
    assert "--nproc_per_node=1" in argv


LINGERS = """
import os, threading, time
import torch, torch.distributed as dist, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler
dist.init_process_group("gloo")
x = torch.randn(256, 16)
data = TensorDataset(x, x.sum(1, keepdim=True))
model = nn.parallel.DistributedDataParallel(nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
micro = int(os.environ["AUTOTUNE_MICRO_BATCH_SIZE"])
for xb, yb in DataLoader(data, batch_size=micro, sampler=DistributedSampler(data)):
    F.mse_loss(model(xb), yb).backward(); opt.step(); opt.zero_grad()
dist.barrier(); dist.destroy_process_group()
os.write(1, f"SUMMARY rank {os.environ['RANK']}\\n".encode())  # one write: two ranks share the pipe
if os.environ["RANK"] == "1":  # a teardown that never ends: a thread left behind after the script returned
    threading.Thread(target=time.sleep, args=(600,)).start()
"""


def test_a_rank_lingering_after_its_script_returned_is_ended_and_the_run_reported_done(tmp_path):
    """Every rank's script returned (each rank's own process said so, in the launcher's private folder); rank 1's
    process lingers. After distributed.exit_barrier_s the launch ends it and reports success with a warning, not
    "Training exited with code ..."."""
    import time

    from helpers.multiprocess import launch

    script = tmp_path / "lingers.py"
    script.write_text(LINGERS)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\ndistributed:\n  exit_barrier_s: 3\n")
    t0 = time.monotonic()
    r = launch("--config", cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "run", timeout=240)
    took = time.monotonic() - t0
    import json

    assert "SUMMARY rank 0\n" in r.stdout and "SUMMARY rank 1\n" in r.stdout and "Done. Run directory" in r.stdout
    rank1 = json.loads((tmp_path / "run" / "observed" / "rank-1.json").read_text())
    assert rank1["returned"] is True and rank1["steps"] > 0  # its script had returned when it was ended
    assert ("every rank's script returned (each rank's own process said so) and its processes still linger 3 s "
            "later") in r.stderr
    assert "the training completed" in r.stderr and "Training exited with code" not in r.stderr
    assert took < 120, took  # ended by the launch, not the 600 s thread


def test_a_rank_aborting_after_its_script_returned_is_reported_as_teardown_not_a_failed_training(tmp_path):
    """Rank 1's process aborts (SIGABRT) in its exit handlers, after its script returned (observed): torchrun
    reports a failed rank, and the launch says what it was, a teardown after the training completed, and exits 0."""
    import json

    from helpers.multiprocess import launch

    script = tmp_path / "aborts.py"
    script.write_text(LINGERS.replace(
        "    threading.Thread(target=time.sleep, args=(600,)).start()",
        "    import atexit; atexit.register(os.abort)  # after the script's main module has finished"))
    assert "atexit.register(os.abort)" in script.read_text()  # the planted abort, not the lingering thread
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n  global_batch_size: 32\n")
    r = launch("--config", cfg, "--nproc_per_node", 2, "--run_dir", tmp_path / "run", timeout=240)
    assert "SUMMARY rank 1\n" in r.stdout and "Done. Run directory" in r.stdout
    assert json.loads((tmp_path / "run" / "observed" / "rank-1.json").read_text())["returned"] is True
    assert "after its script had returned (teardown); the training completed" in r.stderr, r.stderr[-3000:]
    assert "Training exited with code" not in r.stderr
