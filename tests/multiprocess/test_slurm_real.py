"""A real SLURM on this machine: munged, slurmctld and slurmd started (and stopped) by the test,
the exported sbatch script submitted unchanged, training run to completion.

SLURM comes from the Debian packages ``slurm-wlm`` and ``munge``; the fixture installs them
when missing and it may (root, apt-get present: as in CI). One node only: two ``slurmd`` on
one host need a SLURM built with --enable-multiple-slurmd, which Debian's is not; the
two-node path is covered by the two-launcher tests in test_launch_real.py.
"""

import os
import shutil
import signal
import subprocess
import time

import pytest
from helpers.support import ROOT, free_port

IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"SLURM is required in CI: {reason}")
    pytest.skip(f"needs SLURM (slurm-wlm, munge): {reason}")


def _install() -> None:
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        _unavailable("sbatch not found and this is not root with apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"]):
        r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
        if r.returncode != 0:
            _unavailable(f"{' '.join(cmd)} failed: {r.stderr[-500:]}")



def _wait(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    if not (shutil.which("sbatch") and shutil.which("slurmctld") and shutil.which("munged")):
        _install()
    if os.geteuid() != 0:
        _unavailable("the daemons are started as root here")
    d = tmp_path_factory.mktemp("slurm")
    (d / "munge").mkdir(mode=0o700)
    key = d / "munge" / "key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    for sub in ("state", "spool"):
        (d / sub).mkdir()
    sock = d / "munge" / "sock"
    conf = d / "slurm.conf"
    cpus = os.cpu_count() or 1
    conf.write_text(f"""ClusterName=autotune-test
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket={sock}
StateSaveLocation={d}/state
SlurmdSpoolDir={d}/spool
SlurmctldPidFile={d}/slurmctld.pid
SlurmdPidFile={d}/slurmd.pid
SlurmctldPort={free_port()}
SlurmdPort={free_port()}
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
ReturnToService=2
MpiDefault=none
SlurmctldLogFile={d}/slurmctld.log
SlurmdLogFile={d}/slurmd.log
NodeName=localhost NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES MaxTime=INFINITE State=UP
""")
    env = {**os.environ, "SLURM_CONF": str(conf)}
    for k in [k for k in env if k.startswith("SLURM_") and k != "SLURM_CONF"]:
        env.pop(k)  # a test run inside a SLURM job must not leak its allocation
    started = []
    try:
        subprocess.run(["munged", "--force", f"--key-file={key}", f"--socket={sock}", f"--pid-file={d}/munge/pid",
                       f"--log-file={d}/munge/log", f"--seed-file={d}/munge/seed"], check=True, timeout=30)
        started.append(d / "munge" / "pid")
        subprocess.run(["slurmctld", "-f", str(conf)], check=True, timeout=30, env=env)
        started.append(d / "slurmctld.pid")
        subprocess.run(["slurmd", "-f", str(conf), "-N", "localhost"], check=True, timeout=30, env=env)
        started.append(d / "slurmd.pid")

        def idle() -> bool:
            r = subprocess.run(["sinfo", "-h", "-o", "%t"], capture_output=True, text=True, env=env, timeout=10)
            return r.returncode == 0 and r.stdout.strip() == "idle"

        _wait(idle, 60, f"the node to be idle (logs in {d})")
        yield env
    finally:
        subprocess.run(["scancel", "--user=root"], capture_output=True, env=env, timeout=10)
        for pidfile in reversed(started):
            try:
                os.kill(int(pidfile.read_text().split()[0]), signal.SIGTERM)
            except (OSError, ValueError):
                pass
        time.sleep(1)


def test_exported_script_trains_under_slurm_and_requeues_itself_when_preempted(slurm, tmp_path):
    """The exported sbatch script, submitted unchanged, trains under SLURM; SIGUSR1 to the job's
    steps (what --signal=USR1@120 sends before the time limit) makes the ranks save a checkpoint
    of the last step, the launcher exit 75 and the script requeue the job."""
    import json

    from helpers.multiprocess import SMALL

    cfg = tmp_path / "long.yaml"
    cfg.write_text(SMALL.replace("max_steps: 12", "max_steps: 600").replace("save_every_steps: 5, keep_last: 5",
                                                                             "save_every_steps: null")
                   .replace("eval_every_steps: 6", "eval_every_steps: 100000"))
    run_dir, script = tmp_path / "job", tmp_path / "train.sbatch"
    env = {**slurm, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "autotune", "export", "--format", "slurm",
                        "--config", str(cfg), "--nproc_per_node", "2", "--time", "00:10:00",
                        "--run_dir", str(run_dir), "-o", str(script)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env,
                        cwd=tmp_path, timeout=60)
    assert sb.returncode == 0, sb.stderr
    job = sb.stdout.strip().split(";")[0]

    def steps():
        f = run_dir / "metrics.jsonl"
        return [json.loads(x)["step"] for x in f.read_text().splitlines() if "train/loss" in x] if f.exists() else []

    _wait(lambda: len(steps()) >= 30, 180, "the job to train 30 steps")
    subprocess.run(["scancel", "--signal=USR1", job], check=True, env=env, timeout=30)

    logs = lambda: "".join(p.read_text() for p in sorted(run_dir.glob("slurm-*.out")))  # noqa: E731
    _wait(lambda: f"requeueing job {job}" in logs(), 120, "the script to requeue the job")
    log = logs()
    assert "Preempted (SIGUSR1)" in log and "srun: error: localhost: task 0: Exited with exit code 75" in log
    saved = int(log.split("every rank stopped after step ")[1].split(" ")[0])
    assert saved == max(steps()) and (run_dir / "checkpoints" / f"step-{saved:08d}" / "meta.json").exists()
    show = lambda: subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,  # noqa: E731
                                  env=env, timeout=10).stdout
    _wait(lambda: "Restarts=1" in show(), 60, "SLURM to record the requeue")
    # The requeued job would now resume from that checkpoint (--resume_from auto, tested without
    # SLURM elsewhere); SLURM holds requeued jobs back for minutes, so the test stops here.
    subprocess.run(["scancel", job], env=env, timeout=30)
    assert [p.name for p in run_dir.glob("slurm-*.out")] == [f"slurm-{job}.out"]  # the job's log, in the run dir
    hw = json.loads((run_dir / "hardware.json").read_text())
    assert hw["slurm"]["job_id"] == job and hw["slurm"]["hosts"] == ["localhost"]


def test_an_accelerate_script_with_its_own_batch_trains_the_plan_under_slurm(slurm, tmp_path):
    """The seed guides' Accelerate script (batch and rate from its own YAML, epochs of 8 steps with a validation pass),
    exported as an sbatch script with training.strict and submitted unchanged: the plan's 64 is its own 32 x 2
    processes, and the plan's accumulation, which cannot pair with the script's batch, is withheld. The observed
    effective batch is 64 to the sample (its validation and Accelerate's look-ahead batch not counted), --strict lets
    it train, the rate it keeps is shown as its own, and the job ends 0."""
    import json

    from helpers.multiprocess import accelerate_own_yaml

    cfg = accelerate_own_yaml(tmp_path, batch_size=32)
    run_dir, script = tmp_path / "job", tmp_path / "acc.sbatch"
    env = {**slurm, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "autotune", "export", "--format", "slurm",
                        "--config", str(cfg), "--nproc_per_node", "2", "--time", "00:10:00", "--run_dir", str(run_dir),
                        "-o", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env,
                        cwd=tmp_path, timeout=60)
    assert sb.returncode == 0, sb.stderr
    job = sb.stdout.strip().split(";")[0]
    show = lambda: subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True,  # noqa: E731
                                  env=env, timeout=10).stdout
    _wait(lambda: "JobState=COMPLETED" in show() or "JobState=FAILED" in show(), 300, "the job to end")
    log = (run_dir / f"slurm-{job}.out").read_text()
    assert "JobState=COMPLETED" in show() and "ExitCode=0:0" in show(), log[-4000:]
    assert "TRAINED effective=64 " in log and "ACCELERATE_GRADIENT_ACCUMULATION_STEPS not exported" in log
    seen = json.loads((run_dir / "delivery.json").read_text())["observed"]
    assert seen["effective_batch"] == 64 and seen["batch_source"] == "the model's training inputs", seen
    assert seen["wrong"] == []
    assert seen["values"]["learning_rate"] == {"status": "yours", "observed": 0.01, "plan": None}
    assert "Learning rate:            yours      training.learning_rate is not set" in log
    assert "; the script's own: learning_rate 0.01" in log.split("\nDone. Run directory")[1]


def test_the_first_node_to_fail_decides_the_job_though_srun_ends_with_the_highest_code(slurm, tmp_path):
    """Two tasks of one step stand in for two nodes (one slurmd here). One node's launcher gives up on its peer
    (69); srun's --kill-on-bad-exit then terminates the other, and srun ends with the highest code: 143 for a
    launcher that dies of the TERM (measured here), 75 for one that saves on it, so the job ended for good, or
    requeued without limit as a preemption. The exported script takes the first failing node's code and requeues
    the job on 69, within its restarts, saying which code came first."""
    run_dir, script = tmp_path / "job", tmp_path / "train.sbatch"
    env = {**slurm, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([str(ROOT / ".venv" / "bin" / "python"), "-m", "autotune", "export", "--format", "slurm",
                        "--hardware", "2x4xL4", "--time", "00:10:00", "--run_dir", str(run_dir)],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = [x for x in r.stdout.splitlines() if not x.startswith(("#SBATCH --nodes", "#SBATCH --ntasks-per-node",
                                                                     "#SBATCH --gpus-per-node", "#SBATCH --cpus"))]
    text = "\n".join(lines).replace("#!/bin/bash", "#!/bin/bash\n#SBATCH --ntasks=2 --cpus-per-task=1", 1)
    assert text.count("srun --ntasks-per-node=1 ") == 1
    launcher = tmp_path / "stand_in_launcher.sh"  # node 1 gives up; node 0 saves and exits 75 on TERM
    exported = text.split('autotune-node "$first" ', 1)[1].split(" ", 1)[0]  # the launcher's path, as exported
    text = text.replace(f'autotune-node "$first" {exported} ', f'autotune-node "$first" {launcher} ', 1)
    script.write_text(text.replace("srun --ntasks-per-node=1 ", "srun --ntasks=2 "))
    launcher.write_text('#!/bin/bash\nif [ "$SLURM_PROCID" = 1 ]; then sleep 2; echo "node 1: gave up"; exit 69; fi\n'
                        'trap \'echo "node 0: terminated"; exit 75\' TERM\nsleep 120 & wait\n')
    launcher.chmod(0o755)
    sb = subprocess.run(["sbatch", "--parsable", str(script)], capture_output=True, text=True, env=env,
                        cwd=tmp_path, timeout=60)
    assert sb.returncode == 0, sb.stderr
    job = sb.stdout.strip().split(";")[0]
    logs = lambda: "".join(p.read_text() for p in sorted(run_dir.glob("slurm-*.out")))  # noqa: E731
    try:
        try:
            _wait(lambda: f"requeueing job {job}" in logs(), 120, "the script to requeue the job")
        except AssertionError as e:
            show = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, env=env,
                                  timeout=10).stdout
            raise AssertionError(f"{e}\n{show}\n{logs()}\n{sorted(p.name for p in tmp_path.iterdir())}") from None
        log = logs()
        assert "task 1: Exited with exit code 69" in log and "node 0: terminated" in log
        assert "autotune: the first node to fail ended with 69 (srun: 75" in log
        assert f"autotune: a peer was not there in time; requeueing job {job} (restart 0)" in log
        assert "checkpoint saved on preemption" not in log
        assert (run_dir / "slurm-first-exit").read_text().split()[0] == "69"
    finally:
        subprocess.run(["scancel", job], env=env, timeout=30)
