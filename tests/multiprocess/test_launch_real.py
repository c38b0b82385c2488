"""Real launches on CPU through launch_distributed_training.sh: single, DDP (2 processes),
DeepSpeed ZeRO-2 (2 processes); equivalence, resume, cross-world checkpoints, user scripts.

Every run has a timeout; torchrun runs carry TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (set by the launcher).
"""

import json
import os
import shutil
import subprocess
import sys

import pytest
from helpers.multiprocess import ROOT, SMALL, check_run_dir, final_val, launch, losses, plan_json  # noqa: F401
from helpers.support import require

pytestmark = pytest.mark.multiprocess

def test_single_process_run(runs):
    check_run_dir(runs / "single", "single", 1)
    cmd = json.loads((runs / "single" / "command.json").read_text())
    assert cmd["argv"][1:3] == ["-m", "autotune.train"]


def test_ddp_two_processes(runs):
    check_run_dir(runs / "ddp", "ddp", 2)
    argv = json.loads((runs / "ddp" / "command.json").read_text())["argv"]
    assert "torch.distributed.run" in argv and "--nproc_per_node=2" in argv


def test_deepspeed_zero2_two_processes(runs):
    check_run_dir(runs / "ds", "deepspeed", 2)
    ds = json.loads((runs / "ds" / "deepspeed_config.json").read_text())
    assert ds["zero_optimization"]["stage"] == 2 and ds["train_batch_size"] == 32
    assert (runs / "ds" / "checkpoints" / "step-00000012" / "engine").is_dir()


def test_equivalence_one_process_accum2_vs_two_processes_accum1(runs):
    a, b, c = losses(runs / "single"), losses(runs / "ddp"), losses(runs / "ds")
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-4, abs=1e-6), (step, a[step], b[step])
        assert c[step] == pytest.approx(a[step], rel=1e-3, abs=1e-5), (step, a[step], c[step])
    va, vb = final_val(runs / "single"), final_val(runs / "ddp")
    # validation is all-reduced by sample count: equal to a one-process evaluation
    assert vb["val/samples"] == va["val/samples"] == 256
    assert vb["val/loss"] == pytest.approx(va["val/loss"], rel=1e-4)


def test_resume_continues_the_same_trajectory(runs, small_config, tmp_path):
    ref = losses(runs / "single")
    # A run stopped after its step-5 checkpoint: copy, drop what came later, resume "auto".
    stopped = tmp_path / "stopped"
    shutil.copytree(runs / "single", stopped)
    for later in ("step-00000010", "step-00000012"):
        shutil.rmtree(stopped / "checkpoints" / later)
    (stopped / "metrics.jsonl").write_text("")
    r = launch("--config", small_config, "--run_dir", stopped, "--batch_size", 16, "--grad_accum", 2,
               "--resume_from", "auto")
    assert "resumed at step 5" in r.stdout
    got = losses(stopped)
    assert sorted(got) == list(range(6, 13))
    for step, v in got.items():
        assert v == pytest.approx(ref[step], rel=1e-6, abs=1e-7), (step, v, ref[step])


def test_ddp_checkpoint_loads_in_one_process(runs, small_config, tmp_path):
    ref = losses(runs / "ddp")
    ckpt = runs / "ddp" / "checkpoints" / "step-00000005"
    r = launch("--config", small_config, "--run_dir", tmp_path / "one", "--batch_size", 16, "--grad_accum", 2,
               "--resume_from", ckpt)
    assert "resumed at step 5" in r.stdout
    import torch

    weights = torch.load(ckpt / "model.pt", weights_only=True)
    assert not any(k.startswith("module.") for k in weights)  # unwrapped
    got = losses(tmp_path / "one")
    for step, v in got.items():
        assert v == pytest.approx(ref[step], rel=1e-4), (step, v, ref[step])


def test_resume_refuses_a_mismatched_checkpoint_without_touching_it(runs, small_config, tmp_path):
    ckpt = runs / "single" / "checkpoints" / "step-00000005"
    before = sorted(p.name for p in ckpt.iterdir())
    full = {**os.environ}
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--config", str(small_config),
                        "--run_dir", str(tmp_path / "x"), "--global_batch_size", "64", "--resume_from", str(ckpt)],
                       capture_output=True, text=True, timeout=300, env=full, cwd=ROOT)
    assert r.returncode == 2  # refused by the launcher before any rank starts
    assert "trained with global batch 32" in r.stderr and "Traceback" not in r.stderr
    assert sorted(p.name for p in ckpt.iterdir()) == before


def test_default_workload_learns(tmp_path):
    """The README's main job, shortened: validation accuracy well above chance (10%)."""
    r = launch("--run_dir", tmp_path / "default", "--max_steps", 120)
    acc = final_val(tmp_path / "default")["val/accuracy"]
    assert acc > 0.5, acc
    assert "Final validation accuracy" in r.stdout and "TensorBoard: tensorboard --logdir" in r.stdout


def test_wandb_offline_and_no_secret_anywhere(small_config, tmp_path):
    require("wandb", reason="wandb is not installed")
    secret = "sekrit-value-0123456789"
    env = {"MY_SERVICE_TOKEN": secret, "HF_TOKEN": secret, "WANDB_API_KEY": ""}
    run = tmp_path / "wb"
    r = launch("--config", small_config, "--run_dir", run, "--wandb", "--max_steps", 6, env=env)
    assert list((run / "wandb").glob("offline-run-*")), "W&B did not write an offline run"
    assert "wandb sync" in r.stdout
    assert json.loads((run / "command.json").read_text())["env"]["WANDB_MODE"] == "offline"
    assert secret not in r.stdout + r.stderr
    for f in run.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_bring_your_own_script(tmp_path):
    """examples/autotune_train.py (plain_train.py plus the runtime's calls) with DDP over 2 processes; the
    one-process runtime path is the shared reference run's."""
    nproc = 2
    plain = subprocess.run([sys.executable, str(ROOT / "examples" / "plain_train.py"), "--epochs", "2"],
                           capture_output=True, text=True, timeout=120)
    assert plain.returncode == 0 and "final accuracy" in plain.stdout
    r = launch("--config", ROOT / "examples" / "byo_config.yaml", "--run_dir", tmp_path / "byo",
               "--nproc_per_node", nproc)
    acc = float(r.stdout.rsplit("final accuracy", 1)[1].split()[0])
    assert acc > 0.8, r.stdout[-2000:]
    plan = plan_json(tmp_path / "byo" / "plan.json")
    assert plan["world_size"] == nproc and plan["global_batch_size"] == 64
    from helpers.multiprocess import observed_as_planned

    assert observed_as_planned(tmp_path / "byo")["engine"] == "equal"


def test_module_function_entrypoint(small_config, tmp_path):
    """A module:function entry gets its own arguments only, placeholders expanded; a secret among them
    (--hub_token) reaches it, and is <redacted> wherever autotune wrote or printed the command (issue 34)."""
    secret = "hf_sekrit0123456789"
    mod = tmp_path / "my_entry.py"
    mod.write_text("import json, os, sys\n"
                   "def main():\n"
                   "    plan = json.load(open(os.environ['AUTOTUNE_PLAN']))\n"
                   "    print('ENTRY micro', plan['batch']['micro_batch_size'],"
                   " 'world', plan['engine']['world_size'])\n"
                   "    print('ARGV', sys.argv[:3])\n"
                   f"    json.dump(sys.argv, open({str(tmp_path / 'argv.json')!r}, 'w'))\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(SMALL.replace("training:\n", "training:\n  entrypoint: my_entry:main\n"))
    run = tmp_path / "run"
    r = launch("--config", cfg, "--run_dir", run, "--", "--foo", "{micro_batch_size}", "--hub_token", secret,
               env={"PYTHONPATH": f"{tmp_path}:{ROOT}"})
    assert "ENTRY micro 32 world 1" in r.stdout
    assert "ARGV ['my_entry', '--foo', '32']" in r.stdout  # its own arguments only, placeholders expanded
    assert json.loads((tmp_path / "argv.json").read_text())[3:] == ["--hub_token", secret]
    assert secret not in r.stdout + r.stderr and "--hub_token '<redacted>'" in r.stdout
    assert json.loads((run / "command.json").read_text())["argv"][-2:] == ["--hub_token", "<redacted>"]
    assert "<redacted>" in (run / "logs" / "stdout.log").read_text().splitlines()[0]
    for f in run.rglob("*"):
        if f.is_file():
            assert secret.encode() not in f.read_bytes(), f


def test_a_rank_never_plans_it_reads_the_launchers_plan(small_config, tmp_path):
    """`python -m autotune.train` trains from a plan the launcher wrote and writes no plan of its own;
    `--config` (planning inside a rank) is refused with the command that plans."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for k in ("AUTOTUNE_PLAN", "AUTOTUNE_RUN_DIR"):
        env.pop(k, None)
    refused = subprocess.run([sys.executable, "-m", "autotune.train", "--config", str(small_config)],
                             capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert refused.returncode == 2 and "ranks never plan" in refused.stderr
    assert "python -m autotune launch --config" in refused.stderr and "Traceback" not in refused.stderr
    r = launch("--config", small_config, "--max_steps", 6, "--batch_size", 8, "--run_dir", tmp_path / "one")
    assert r.returncode == 0, r.stderr[-3000:]
    again = subprocess.run([sys.executable, "-m", "autotune.train", "--plan", str(tmp_path / "one" / "plan.json"),
                            "--run_dir", str(tmp_path / "two")], capture_output=True, text=True, timeout=300, env=env,
                           cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert sorted(losses(tmp_path / "two")) == list(range(1, 7)) and not (tmp_path / "two" / "plan.json").exists()
    assert losses(tmp_path / "two") == losses(tmp_path / "one")  # the same plan, the same training
    script = tmp_path / "mine.py"
    script.write_text("print('MINE')\n")
    cfg = tmp_path / "c.yaml"
    cfg.write_text(SMALL.replace("training:\n", f"training:\n  entrypoint: {script}\n"))
    mine = launch("--config", cfg, "--run_dir", tmp_path / "mine")
    assert mine.returncode == 0 and "MINE" in mine.stdout, mine.stderr[-2000:]
    wrong = subprocess.run([sys.executable, "-m", "autotune.train", "--plan", str(tmp_path / "mine" / "plan.json")],
                           capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert wrong.returncode == 2 and "plan for your own script" in wrong.stderr


def test_deepspeed_resume_through_its_own_checkpoint(runs, small_config, tmp_path):
    ref = losses(runs / "ds")
    ckpt = runs / "ds" / "checkpoints" / "step-00000005"
    r = launch("--config", small_config, "--run_dir", tmp_path / "ds2", "--nproc_per_node", 2, "--deepspeed",
               "--zero_stage", 2, "--batch_size", 16, "--grad_accum", 1, "--resume_from", ckpt, timeout=600)
    assert "resumed at step 5" in r.stdout
    got = losses(tmp_path / "ds2")
    assert sorted(got) == list(range(6, 13))
    for step, v in got.items():
        assert v == pytest.approx(ref[step], rel=1e-5), (step, v, ref[step])


def test_ctrl_c_stops_every_rank_and_the_run_resumes(small_config, tmp_path):
    """SIGINT to the launcher reaches both ranks; they save the step and exit, the launcher 75; resume finishes the
    run."""
    import signal
    import time

    import psutil

    cfg = tmp_path / "long.yaml"
    cfg.write_text(SMALL.replace("max_steps: 12", "max_steps: 100000")
                   .replace("save_every_steps: 5", "save_every_steps: 3"))
    run = tmp_path / "run"
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    proc = subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg), "--run_dir", str(run),
                             "--nproc_per_node", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=ROOT)
    deadline = time.time() + 240
    while time.time() < deadline and not list((run / "checkpoints").glob("step-*[0-9]")):
        time.sleep(0.2)
    assert list((run / "checkpoints").glob("step-*[0-9]")), "no checkpoint appeared"
    def this_run(p):  # the launcher hands every process its run dir in AUTOTUNE_RUN_DIR
        try:
            return p.environ().get("AUTOTUNE_RUN_DIR") == str(run)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            return False

    ranks = [p for p in psutil.process_iter(["cmdline"]) if "autotune.train" in " ".join(p.info["cmdline"] or [])
             and this_run(p)]
    assert len(ranks) >= 2  # torchrun agent + 2 workers
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 75, err[-3000:]  # preempted: a checkpoint of the last step was saved
    assert "Preempted (SIGINT)" in err and "--resume_from auto" in err
    trained = max(losses(run))
    assert f"every rank stopped after step {trained} " in err and (run / "checkpoints" / f"step-{trained:08d}").is_dir()
    gone, alive = psutil.wait_procs(ranks, timeout=30)
    assert not alive, f"ranks left running: {alive}"
    # The same command with --resume_from auto continues from the newest complete checkpoint.
    newest = sorted(p for p in (run / "checkpoints").glob("step-*") if not p.name.endswith(".tmp"))[-1]
    step = int(newest.name.split("-")[1])
    cfg.write_text(SMALL.replace("max_steps: 12", f"max_steps: {step + 3}")
                   .replace("save_every_steps: 5", "save_every_steps: 3"))
    # the plan's total steps changed, so this continues the weights and data position on a new schedule
    r = launch("--config", cfg, "--run_dir", run, "--nproc_per_node", 2, "--resume_from", "auto")
    assert f"resumed at step {step}" in r.stdout
    assert json.loads((run / "metrics.json").read_text())["steps"] == step + 3
    # the first launch's records are kept, not overwritten
    (prev,) = (run / "previous").iterdir()
    assert plan_json(prev / "plan.json")["total_steps"] == 100000


@pytest.mark.parametrize("rows, cols", [(40, 120), (0, 0)])  # 0x0: some pseudo-terminals report no size
def test_progress_bar_on_a_terminal_plain_lines_otherwise(small_config, tmp_path, rows, cols):
    """tqdm when stdout is a TTY (the launcher run under a pseudo-terminal here: its rank gets a terminal of
    the same size and the bar); plain step lines in a pipe."""
    import pty

    env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "120"}
    env.pop("AUTOTUNE_PLAN", None)
    import fcntl
    import struct
    import termios

    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, cols, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "autotune", "launch", "--config", str(small_config),
                             "--run_dir", str(tmp_path / "tty"), "--max_steps", "6"],
                            stdin=slave, stdout=slave, stderr=slave, env=env, cwd=tmp_path, close_fds=True)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 4096)
        except OSError:  # the child closed the terminal
            break
        if not data:
            break
        chunks.append(data)
    assert proc.wait(timeout=120) == 0
    os.close(master)
    tty_out = b"".join(chunks).decode(errors="replace")
    assert "6/6" in tty_out and "step/s" in tty_out  # tqdm's bar
    logged = b"".join((tmp_path / "tty" / "logs" / f).read_bytes() for f in ("stdout.log", "stderr.log")).decode(
        errors="replace")
    assert "step/s" in logged and "\r\n" not in logged  # the bar in the log too, with plain line ends
    plain = losses(tmp_path / "tty")  # the same metrics either way
    assert sorted(plain) == list(range(1, 7))
    if rows == 0:
        return  # the piped run below does not depend on the terminal's size: once is enough
    piped = subprocess.run([sys.executable, "-m", "autotune", "launch", "--config", str(small_config),
                            "--run_dir", str(tmp_path / "pipe"), "--max_steps", "6"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert piped.returncode == 0 and "step 6/6 | loss" in piped.stdout and "step/s" not in piped.stdout


def test_training_works_without_deepspeed_installed(small_config, tmp_path):
    """DeepSpeed is an optional extra: with it unimportable, a CPU rank still trains its plan."""
    first = launch("--config", small_config, "--max_steps", 3, "--run_dir", tmp_path / "first")
    assert first.returncode == 0, first.stderr[-2000:]
    code = ("import sys\n"
            "sys.modules['deepspeed'] = None  # any `import deepspeed` now raises ImportError\n"
            "from autotune.train import main\n"
            f"rc = main(['--plan', {str(tmp_path / 'first' / 'plan.json')!r}, '--run_dir', {str(tmp_path / 'r')!r}])\n"
            "assert 'deepspeed' not in [m for m in sys.modules if sys.modules[m] is not None]\n"
            "sys.exit(rc)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("AUTOTUNE_PLAN", None)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    assert sorted(losses(tmp_path / "r")) == [1, 2, 3]


@pytest.mark.parametrize("engine", ["ddp", "deepspeed"])
def test_two_nodes_on_one_machine_through_the_slurm_path(runs, small_config, tmp_path, engine):
    """Issue 10: two launchers given a 2-node SLURM allocation's variables (node 0 and node 1, no
    flags for nodes, rank or master): each reads the allocation, torchrun's c10d rendezvous on the first
    host keyed by the job id; one job of world size 2 that follows the 2-process single-node
    trajectory (DDP over gloo, DeepSpeed ZeRO-2), one checkpoint set written for global rank 0.
    The static form (--node_rank) is exercised by the two tests below."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "mn"
    secret = f"job-secret-{engine}-0123456789"  # what the exported sbatch script makes once per job
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") and k != "AUTOTUNE_PLAN"}
    env.update(SLURM_JOB_ID="4242", SLURM_JOB_NODELIST="localhost,127.0.0.1", SLURM_JOB_NUM_NODES="2",
               AUTOTUNE_JOB_SECRET=secret)
    flags = ["--deepspeed", "--zero_stage", "2"] if engine == "deepspeed" else ["--ddp"]

    def start(node):
        return subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(small_config),
                                 "--run_dir", str(run), "--nproc_per_node", "1", "--master_port", str(port),
                                 "--batch_size", "16", "--grad_accum", "1", *flags],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                env={**env, "SLURM_NODEID": str(node)})

    # Node 0 first: its hardware exchange (autotune.launch.exchange) listens on the master address only, meets a
    # stranger without the job's secret who says it is node 1, and 60 idle connections; the real node 1 then joins.
    procs = [start(0)]
    strangers = _strangers_at_node_0s_exchange(procs[0], port)
    try:
        procs.append(start(1))
        outs = [p.communicate(timeout=600) for p in procs]
    finally:
        for s in strangers:
            s.close()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(
        f"--- node {n} (exit {p.returncode}):\n{out[-2500:]}\n{err[-3000:]}"
        for n, (p, (out, err)) in enumerate(zip(procs, outs)))
    assert "the nodes' exchange ignored 127.0.0.1:" in outs[0][1]  # the stranger, named; it took no rank
    assert all(secret not in out + err for out, err in outs)
    assert not [f for f in run.rglob("*") if f.is_file() and secret.encode() in f.read_bytes()]
    for node, plan_file in ((0, run / "plan.json"), (1, run / "node1" / "plan.json")):
        plan = plan_json(plan_file)
        assert (plan["backend"], plan["num_nodes"], plan["node_rank"], plan["world_size"], plan["master_addr"]) \
            == (engine, 2, node, 2, "localhost")
        assert "SLURM_NODEID" in plan["reasons"]["node_rank"]
    argv = json.loads((run / "node1" / "command.json").read_text())["argv"]
    assert "--rdzv_backend=c10d" in argv and "--rdzv_id=4242" in argv and f"--rdzv_endpoint=localhost:{port}" in argv
    ref, got = losses(runs / engine.replace("deepspeed", "ds")), losses(run)
    assert got.keys() == ref.keys()
    for step in ref:
        assert got[step] == pytest.approx(ref[step], rel=1e-4), (step, got[step], ref[step])
    assert sorted(c.name for c in (run / "checkpoints").glob("step-*")) == ["step-00000005", "step-00000010",
                                                                           "step-00000012"]
    assert not list((run / "node1").glob("checkpoints"))  # checkpoints and metrics are rank 0's alone
    # weights identical on both nodes: each rank hashed its own copy after the last step
    rec = json.loads((run / "replicas.json").read_text())
    assert sorted(r["node_rank"] for r in rec["ranks"]) == [0, 1], rec  # one rank per node
    assert rec["identical"] and rec["ranks"][0]["sha256"] == rec["ranks"][1]["sha256"], rec


def _listening(port):
    """The local addresses listening on ``port``, from the kernel's tables (IPv4 and IPv6)."""
    import ipaddress

    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for line in f.readlines()[1:]:
                local, state = line.split()[1], line.split()[3]
                addr, _, p = local.partition(":")
                if int(p, 16) == port and state == "0A":
                    raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, len(addr), 8))
                    out.append(str(ipaddress.ip_address(raw)))
    return out


def _strangers_at_node_0s_exchange(node0, port):
    """Once node 0's exchange listens: only on loopback (never every interface); a client without the job's secret
    that says it is node 1 with made-up facts is refused; then 60 idle connections, returned open."""
    import socket
    import time

    from autotune.errors import UserError
    from autotune.launch.exchange import meet
    from autotune.profiles import load_profile

    deadline = time.monotonic() + 120
    while not _listening(port):
        assert node0.poll() is None and time.monotonic() < deadline, "node 0's exchange never listened"
        time.sleep(0.05)
    assert set(_listening(port)) <= {"127.0.0.1", "::1"}, _listening(port)
    fake = load_profile("cpu-only")
    fake = fake.model_copy(update={"cpu": fake.cpu.model_copy(update={"effective_cores": 1}), "hostname": "fake"})
    with pytest.raises(UserError, match="the job secret differs"):
        meet(2, 1, "127.0.0.1", port, fake, 20.0)
    return [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(60)]


def test_nodes_that_planned_differently_stop_together_naming_the_smallest_plan(small_config, tmp_path):
    """Each node plans from its own hardware; here node 1 plans micro-batch 8 (as a node with less memory
    would) and node 0 micro-batch 16, the same global batch 32. The ranks compare plans once at start:
    both nodes stop with exit 2 before training, naming each node's values and the flags for every node."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    run = tmp_path / "mn"
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    procs = [subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(small_config),
                               "--run_dir", str(run), "--nproc_per_node", "1", "--num_nodes", "2", "--node_rank",
                               str(node), "--master_addr", "127.0.0.1", "--master_port", str(port),
                               "--batch_size", micro],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
             for node, micro in ((0, "16"), (1, "8"))]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 2, f"{out[-2000:]}\n{err[-4000:]}"
        # torchrun prints its own ChildFailedError traceback for any failed worker; none of autotune's frames
        assert "the nodes of this job planned differently" in err and 'autotune/runtime' not in err
        assert "node 0: micro-batch 16 x accumulation 1 (global 32)" in err
        assert "node 1: micro-batch 8 x accumulation 2 (global 32)" in err
        assert "add --batch_size 8 --grad_accum 2 --precision fp32 on every node" in err
    assert not (run / "metrics.jsonl").exists()  # nobody trained


@pytest.mark.parametrize("base_url", [None, "http://127.0.0.1:9"], ids=["no-network", "refused"])
def test_wandb_with_a_key_and_no_server_goes_offline_fast(small_config, tmp_path, base_url):
    """Promise 9: a real-looking key, W&B's server unreachable (no route here; or a closed port):
    the run goes offline within seconds, says how to sync, finishes, and the key is nowhere."""
    import time

    require("wandb", reason="wandb is not installed")
    key = "0123456789abcdef0123456789abcdef01234567"  # 40 hex characters, the shape of a W&B key
    env = {"WANDB_API_KEY": key, "WANDB_MODE": ""}
    if base_url:
        env["WANDB_BASE_URL"] = base_url
    run = tmp_path / "wb"
    t0 = time.monotonic()
    r = launch("--config", small_config, "--run_dir", run, "--wandb", "--max_steps", 4, env=env, timeout=240)
    took = time.monotonic() - t0
    assert "cannot be reached" in r.stdout and "logging offline instead" in r.stdout, r.stdout[-2000:]
    assert "wandb sync" in r.stdout and list((run / "wandb").glob("offline-run-*"))
    assert took < 90, took  # never W&B's minutes of retries
    assert key not in r.stdout + r.stderr
    for f in run.rglob("*"):
        if f.is_file():
            assert key.encode() not in f.read_bytes(), f


def test_node_0_learns_when_node_1_dies(tmp_path):
    """Issue 11, promise 1 across nodes: kill -9 of node 1's launcher (two launchers as two nodes on
    one machine); node 1's ranks die with it, node 0's collective fails, and node 0 ends too, with no
    process of either node left running."""
    import socket
    import time

    import psutil

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cfg = tmp_path / "long.yaml"
    cfg.write_text(SMALL.replace("max_steps: 12", "max_steps: 100000").replace("eval_every_steps: 6",
                                                                               "eval_every_steps: 100000")
                   + "distributed: {exit_barrier_s: 5}\n")  # node 0 stops waiting for node 1's agent after 5 s
    run = tmp_path / "mn"
    env = {**os.environ}
    env.pop("AUTOTUNE_PLAN", None)
    procs = [subprocess.Popen([str(ROOT / "launch_distributed_training.sh"), "--config", str(cfg),
                               "--run_dir", str(run),
                               "--nproc_per_node", "1", "--num_nodes", "2", "--node_rank", str(node), "--master_addr",
                               "127.0.0.1", "--master_port", str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env=env, cwd=ROOT) for node in (0, 1)]
    deadline = time.monotonic() + 180
    while not ((run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 3):
        assert all(p.poll() is None for p in procs) and time.monotonic() < deadline, "the job did not start"
        time.sleep(0.3)
    tree = [c for p in procs for c in psutil.Process(p.pid).children(recursive=True)]
    t0 = time.monotonic()
    procs[1].kill()
    rc0 = procs[0].wait(timeout=120)
    took = time.monotonic() - t0
    gone, alive = psutil.wait_procs(tree, timeout=30)
    assert not alive, [a.cmdline() for a in alive]
    assert rc0 != 0 and took < 25, (rc0, took)
