"""The Kubernetes contract on this machine, as the operator runs it (issue 37): two "pods" (two launchers)
run the command of the exported TrainJob with only what the Kubeflow Trainer gives a pod (PET_NNODES,
PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT, PET_NPROC_PER_NODE), KUBERNETES_SERVICE_HOST and the job
secret from its Secret; no node flags. The kubelet's SIGTERM to each pod's PID 1 (the launcher) mid-run gives
one checkpoint and exit 75 on both; the job's restart (the same command and environment) resumes from it and
trains the built-in workload to its end."""

import json
import os
import signal
import subprocess
import time

import psutil
import yaml
from helpers.multiprocess import metric_rows, plan_json
from helpers.support import ROOT, free_port

CONFIG = """
model: {n_layer: 1, n_head: 2, n_embd: 32}
data: {seq_len: 6, num_samples: 100000, num_val_samples: 64}
training: {global_batch_size: 32, base_batch_size: 32, max_steps: MAX, log_every_steps: 1, eval_every_steps: 100000}
checkpoint: {save_every_steps: null, save_at_end: false, preemption_grace_s: 60}
"""
MAX_STEPS = 60


def _steps(run):
    return [r["step"] for r in metric_rows(run) if "train/loss" in r]


def test_two_pods_run_the_exported_trainjob_preempted_then_resumed_to_the_end(cli, tmp_path):
    cfg = tmp_path / "job.yaml"
    cfg.write_text(CONFIG.replace("MAX", str(MAX_STEPS)))
    run = tmp_path / "pvc" / "job"  # the claim is mounted at its parent in every pod
    r = cli("autotune", "export", "--format", "kubeflow", "--image", "registry.example.com/team/train:1.0",
            "--job_name", "job", "--config", str(cfg), "--run_dir", str(run), "--num_nodes", "2",
            "--num_gpus", "0", "--nproc_per_node", "1")
    assert r.returncode == 0, r.stderr
    job = list(yaml.safe_load_all(r.stdout))[2]
    command = job["spec"]["trainer"]["command"] + job["spec"]["trainer"]["args"]  # the container's entry and args
    secret = "s3cr3t-for-this-test-only"
    assert (job["spec"]["trainer"]["numNodes"], job["spec"]["trainer"]["numProcPerNode"]) == (2, 1)
    assert "--num_nodes" not in command and "--num_gpus" in command  # node facts come from PET_*, in each pod
    port = free_port()
    base = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PET_")) and k != "AUTOTUNE_PLAN"}
    base.update(KUBERNETES_SERVICE_HOST="kubernetes.default.svc", PET_NNODES="2", PET_NPROC_PER_NODE="1",
                PET_MASTER_ADDR="127.0.0.1", PET_MASTER_PORT=str(port), AUTOTUNE_JOB_SECRET=secret,
                PATH=f"{ROOT / '.venv' / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}",
                PYTHONPATH=str(ROOT))  # the image's autotune: this checkout

    def start(attempt):
        outs = [open(tmp_path / f"{attempt}-pod{n}.out", "w") for n in (0, 1)]
        return [subprocess.Popen(command, stdout=outs[n], stderr=subprocess.STDOUT, cwd=ROOT,
                                 env={**base, "PET_NODE_RANK": str(n)}) for n in (0, 1)]

    def texts(attempt):
        return [(tmp_path / f"{attempt}-pod{n}.out").read_text() for n in (0, 1)]

    pods = start("a")
    deadline = time.monotonic() + 180
    while not ((run / "metrics.jsonl").exists() and len(_steps(run)) >= 5):
        assert all(p.poll() is None for p in pods) and time.monotonic() < deadline, texts("a")
        time.sleep(0.1)
    tree = [c for p in pods for c in psutil.Process(p.pid).children(recursive=True)]
    for p in pods:
        p.send_signal(signal.SIGTERM)  # the kubelet, to each container's PID 1
    rcs = [p.wait(timeout=120) for p in pods]
    assert not psutil.wait_procs(tree, timeout=20)[1]
    assert rcs == [75, 75], (rcs, *texts("a"))
    ckpts = sorted((run / "checkpoints").glob("step-*"))
    assert len(ckpts) == 1, ckpts
    saved = json.loads((ckpts[0] / "meta.json").read_text())["step"]
    assert saved == max(_steps(run)) < MAX_STEPS
    for node, records in ((0, run), (1, run / "node1")):
        plan = plan_json(records / "plan.json")
        assert (plan["num_nodes"], plan["node_rank"], plan["master_addr"], plan["world_size"]) == \
            (2, node, "127.0.0.1", 2)
        assert plan["reasons"]["node_rank"] == f"PET_NODE_RANK={node} (the training operator's, in a Kubernetes pod)"
        argv = json.loads((records / "command.json").read_text())["argv"]
        assert [f"--node_rank={node}", "--master_addr=127.0.0.1", f"--master_port={port}"] == \
            [a for a in argv if a.startswith(("--node_rank=", "--master_addr=", "--master_port="))]
    assert not any(secret in t for t in texts("a"))

    pods = start("b")  # the job's restart: the same command, the same environment
    rcs = [p.wait(timeout=300) for p in pods]
    assert rcs == [0, 0], (rcs, *texts("b"))
    assert f"resumed at step {saved} " in texts("b")[0]
    assert _steps(run) == list(range(1, MAX_STEPS + 1))  # to its end, every step once
    assert not any(secret in t for t in texts("b"))
    assert not any(secret in f.read_text(errors="replace") for f in run.rglob("*") if f.is_file() and
                   f.suffix in (".json", ".jsonl", ".log", ".yaml"))
