"""Preemption saves the work (issue 11, promise 2): real signals to real launches.

SIGTERM, SIGUSR1 (SLURM's --signal) and Ctrl-C, to the launcher or to every process at once as
SLURM does: every rank finishes its step, one checkpoint is written, the launcher exits 75, and
--resume_from auto repeats no step. A rank that cannot finish within the grace budget is stopped
without a checkpoint, and nothing is left running.
"""

import json
import os
import signal
import subprocess
import time

import psutil
import pytest
from helpers.multiprocess import metric_rows
from helpers.support import ROOT, free_port

LONG = """
model: {n_layer: 1, n_head: 2, n_embd: 32}
data: {seq_len: 6, num_samples: 100000, num_val_samples: 64}
training: {probe: false, global_batch_size: 32, base_batch_size: 32, max_steps: 100000, log_every_steps: 1,
           eval_every_steps: 100000}
checkpoint: {save_every_steps: null, save_at_end: false, preemption_grace_s: GRACE}
"""


def _env():
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    return env


def _steps(run):
    return [r["step"] for r in metric_rows(run) if "train/loss" in r]


def _start(tmp_path, name, *extra, grace=60, min_steps=20):
    cfg = tmp_path / f"{name}.yaml"
    cfg.write_text(LONG.replace("GRACE", str(grace)))
    run = tmp_path / name
    out = open(tmp_path / f"{name}.out", "w")
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                          *map(str, extra)], stdout=out, stderr=subprocess.STDOUT, env=_env(), cwd=ROOT)
    deadline = time.monotonic() + 180
    while not ((run / "metrics.jsonl").exists() and len(_steps(run)) >= min_steps):
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / f"{name}.out").read_text()[-3000:]
        time.sleep(0.3)
    return p, cfg, run


def _stopped(p, tmp_path, name, limit=90):
    tree = psutil.Process(p.pid).children(recursive=True)
    t0 = time.monotonic()
    rc = p.wait(timeout=limit)
    took = time.monotonic() - t0
    gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, [a.cmdline() for a in alive]
    return rc, took, (tmp_path / f"{name}.out").read_text()


def _check_saved(run, out, rc, sig_name):
    assert rc == 75, out[-3000:]
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    assert len(ckpts) == 1, ckpts  # save_every_steps is off: this one was written because of the signal
    saved = json.loads((ckpts[0] / "meta.json").read_text())["step"]
    assert saved == max(_steps(run))  # the last step trained is in it: nothing lost
    assert f"Preempted ({sig_name})" in out and f"after step {saved}" in out
    # No rank failed. torchrun, when it is signalled itself (SLURM signals every process), ends with its own
    # SignalException traceback: kept in the run log, a line on the terminal says so (issue 52)
    assert "Traceback" not in out, out[-4000:]
    return saved


def _resume_repeats_nothing(cfg, run, saved, *extra):
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                        "--resume_from", "auto", "--max_steps", str(saved + 3), *map(str, extra)],
                       capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert f"resumed at step {saved} " in r.stdout
    steps = _steps(run)
    assert steps == list(range(1, saved + 4))  # every step once: none lost, none repeated


def test_sigterm_to_every_process_like_slurm_then_resume_repeats_no_step(tmp_path):
    engine = ["--nproc_per_node", 2]  # the DeepSpeed engine's checkpoints: test_checkpoints_real, test_launch_real
    p, cfg, run = _start(tmp_path, "r", *engine)
    for proc in [psutil.Process(p.pid), *psutil.Process(p.pid).children(recursive=True)]:
        proc.send_signal(signal.SIGTERM)  # launcher, torchrun and every rank at once
    rc, _, out = _stopped(p, tmp_path, "r")
    saved = _check_saved(run, out, rc, "SIGTERM")
    _resume_repeats_nothing(cfg, run, saved, *engine)


def test_sigterm_to_one_rank_only_stops_every_rank_at_one_checkpoint(tmp_path):
    """A user (or a node-local agent) signals rank 1 alone: the ranks agree after the step, every rank saves its
    share of the one checkpoint, and the launcher exits 75; continuing repeats no step."""
    engine = ["--nproc_per_node", 2]
    p, cfg, run = _start(tmp_path, "r", *engine)
    ranks = sorted((c for c in psutil.Process(p.pid).children(recursive=True)
                    if "autotune.train" in " ".join(c.cmdline())
                    and "torch.distributed.run" not in " ".join(c.cmdline())),
                   key=lambda c: c.environ().get("RANK", ""))
    assert len(ranks) == 2 and ranks[1].environ()["RANK"] == "1"
    ranks[1].send_signal(signal.SIGTERM)  # rank 1 only: not the launcher, not torchrun, not rank 0
    rc, _, out = _stopped(p, tmp_path, "r")
    saved = _check_saved(run, out, rc, "SIGTERM")
    ckpt = next(run.glob("checkpoints/step-*"))
    assert (ckpt / "rng-rank0.pt").exists() and (ckpt / "rng-rank1.pt").exists()  # both ranks saved their part
    _resume_repeats_nothing(cfg, run, saved, *engine)


def test_sigusr1_to_a_one_process_run(tmp_path):
    p, cfg, run = _start(tmp_path, "r", "--single")
    os.kill(p.pid, signal.SIGUSR1)  # SLURM's --signal=USR1@120
    rc, _, out = _stopped(p, tmp_path, "r")
    _check_saved(run, out, rc, "SIGTERM")  # the launcher hands SIGUSR1 on as SIGTERM


def test_a_rank_that_cannot_finish_in_the_grace_budget_is_stopped_without_a_checkpoint(tmp_path):
    p, _, run = _start(tmp_path, "r", "--nproc_per_node", 2, grace=5)
    ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
             if "autotune.train" in " ".join(c.cmdline()) and "torch.distributed.run" not in " ".join(c.cmdline())]
    assert len(ranks) == 2
    ranks[1].suspend()  # a hung peer: rank 0 waits for it in the step's collective
    try:
        time.sleep(1)
        os.kill(p.pid, signal.SIGTERM)
        rc, took, out = _stopped(p, tmp_path, "r", limit=120)
    finally:
        for r in ranks:
            try:
                r.kill()
            except psutil.NoSuchProcess:
                pass
    assert rc == 128 + signal.SIGTERM, out[-3000:]
    assert "preemption_grace_s=5" in out and "before a checkpoint could be saved" in out
    assert not list(run.glob("checkpoints/step-*"))  # no checkpoint was written
    assert took < 30  # grace 5 s, then the launcher's +10 s: bounded, not the 30 min collective timeout


def test_a_hung_peer_ends_the_job_within_the_step_budget_naming_it(tmp_path):
    """Promise 7: rank 1 stopped (not dead); rank 0 waits for it in the step's collective until
    distributed.step_timeout_s, then the job ends with exit 124, naming the step and rank 1."""
    cfg = LONG.replace("GRACE", "5") + "distributed: {step_timeout_s: 5}\n"
    (tmp_path / "h.yaml").write_text(cfg)
    run = tmp_path / "h"
    out = open(tmp_path / "h.out", "w")
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(tmp_path / "h.yaml"),
                          "--run_dir", str(run), "--nproc_per_node", "2"], stdout=out, stderr=subprocess.STDOUT,
                         env=_env(), cwd=ROOT)
    deadline = time.monotonic() + 180
    while not ((run / "metrics.jsonl").exists() and len(_steps(run)) >= 20):
        assert p.poll() is None and time.monotonic() < deadline, (tmp_path / "h.out").read_text()[-3000:]
        time.sleep(0.3)
    ranks = [c for c in psutil.Process(p.pid).children(recursive=True)
             if "autotune.train" in " ".join(c.cmdline()) and "torch.distributed.run" not in " ".join(c.cmdline())]
    rank1 = next(c for c in ranks if c.environ().get("RANK") == "1")
    rank1.suspend()
    t0 = time.monotonic()
    try:
        rc = p.wait(timeout=120)
    finally:
        try:
            rank1.kill()
        except psutil.NoSuchProcess:
            pass
    took = time.monotonic() - t0
    text = (tmp_path / "h.out").read_text()
    assert rc == 124, text[-3000:]
    assert "rank 0: step " in text and "did not finish within 5 s (distributed.step_timeout_s)" in text
    assert "Never reported (hung, or killed before they could): rank 1" in text
    assert took < 30, took  # 5 s budget, then the launcher stops the rest 5 s after the report


SCRIPT_STOPS = """
import os, signal, sys, time
ckpt = os.environ["AUTOTUNE_CHECKPOINT_DIR"]
assert os.path.isdir(ckpt)  # the launcher created {checkpoint_dir}
def stop(signum, frame):
    if os.environ.get("SAVES") == "1":
        open(os.path.join(ckpt, "last.pt"), "w").write("state")
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("READY", flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("saves", [True, False])
def test_a_preempted_script_is_requeued_only_when_it_saved_after_the_signal(tmp_path, saves):
    """SIGTERM to the launcher of a user's script: exit 75 (requeue, resume auto) when the script wrote into
    {checkpoint_dir} after the signal; otherwise 128+15 and the launch says the script does not handle preemption."""
    script = tmp_path / "s.py"
    script.write_text(SCRIPT_STOPS)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n")
    env = {**_env(), "SAVES": "1" if saves else "0"}
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir",
                          str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                         cwd=ROOT)
    deadline = time.monotonic() + 60
    line = ""
    while "READY" not in line:
        assert time.monotonic() < deadline and p.poll() is None
        line = p.stdout.readline()
    time.sleep(0.5)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    if saves:
        assert p.returncode == 75, err[-2000:]
        assert "Preempted (SIGTERM): your script wrote" in err and "--resume_from auto" in err
    else:
        assert p.returncode == 128 + signal.SIGTERM, err[-2000:]
        assert "wrote no checkpoint" in err and "does not handle preemption" in err


def test_sigterm_to_one_node_of_two_stops_both_nodes_at_one_checkpoint(tmp_path):
    """Two nodes on this machine (one rank each, a shared run directory as on a shared file system). SIGTERM to
    node 1's launcher alone (its scheduler preempting that node): node 1's rank stops after its step, the ranks
    agree, both save their share of one checkpoint, and both launchers exit 75; no process is left running."""
    port = free_port()
    cfg = tmp_path / "two.yaml"
    cfg.write_text(LONG.replace("GRACE", "60"))
    run = tmp_path / "two"
    outs = [open(tmp_path / f"node{n}.out", "w") for n in (0, 1)]
    procs = [subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg),
                               "--run_dir", str(run),
                               "--nproc_per_node", "1", "--num_nodes", "2", "--node_rank", str(n), "--master_addr",
                               "127.0.0.1", "--master_port", str(port)], stdout=outs[n], stderr=subprocess.STDOUT,
                              env=_env(), cwd=ROOT) for n in (0, 1)]
    deadline = time.monotonic() + 180
    while not ((run / "metrics.jsonl").exists() and len(_steps(run)) >= 10):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, \
            (tmp_path / "node0.out").read_text()[-2000:] + (tmp_path / "node1.out").read_text()[-2000:]
        time.sleep(0.3)
    tree = [c for p in procs for c in psutil.Process(p.pid).children(recursive=True)]
    procs[1].send_signal(signal.SIGTERM)  # node 1's launcher only
    rcs = [p.wait(timeout=120) for p in procs]
    gone, alive = psutil.wait_procs(tree, timeout=20)
    assert not alive, [a.cmdline() for a in alive]
    texts = [(tmp_path / f"node{n}.out").read_text() for n in (0, 1)]
    assert rcs == [75, 75], (rcs, texts[0][-2000:], texts[1][-2000:])
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    assert len(ckpts) == 1, ckpts
    saved = json.loads((ckpts[0] / "meta.json").read_text())["step"]
    assert saved == max(_steps(run))
    assert (ckpts[0] / "rng-rank0.pt").exists() and (ckpts[0] / "rng-rank1.pt").exists()
    assert all(f"after step {saved}" in t for t in texts)


SCRIPT_NO_HANDLER = """
import time
print("READY", flush=True)
time.sleep(120)
"""


def test_sigusr1_then_sigterm_to_a_script_without_handlers_is_the_first_signal_and_our_line_only(tmp_path):
    """Issue 52: SLURM's --signal=USR1 and then its SIGTERM to a launch (torchrun, two ranks) whose script handles
    neither. The run is interrupted by the first: exit 128 + SIGUSR1, "Interrupted (SIGUSR1)", and the terminal shows
    no Python traceback: torchrun's SignalException traceback is in the run's stderr.log, and a line says so. (A
    second signal after the child ended: tests/unit/launch/test_process_edges.py.)"""
    procs = 2
    script = tmp_path / "s.py"
    script.write_text(SCRIPT_NO_HANDLER)
    cfg = tmp_path / "c.yaml"
    cfg.write_text(f"training:\n  entrypoint: {script}\n")
    run = tmp_path / "run"
    p = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                          "--nproc_per_node", str(procs)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         env=_env(), cwd=ROOT)
    deadline = time.monotonic() + 60
    line = ""
    while "READY" not in line:
        assert time.monotonic() < deadline and p.poll() is None
        line = p.stdout.readline()
    time.sleep(0.5)
    p.send_signal(signal.SIGUSR1)
    time.sleep(0.3)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 128 + signal.SIGUSR1, (p.returncode, err[-3000:])
    assert "Interrupted (SIGUSR1)" in err and "Traceback" not in out + err, err[-3000:]
    log = run / "logs" / "stderr.log"
    assert "SignalException" in log.read_text()  # torchrun's traceback, kept in the run log
    assert "autotune: torchrun's own traceback (SignalException: Process " in err and str(log) in err
