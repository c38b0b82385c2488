"""Issue 43: exit 69 (errors.EXIT_UNAVAILABLE: a peer or the run's lock holder not there in time) is retryable, and
every export restarts it, counted against the job's restarts; 2 and 3 stay permanent, 75 stays the preemption
path. Checked on what each export writes: the TrainJob runtime's and the admin's ClusterTrainingRuntime's failure
policies, the PyTorchJob container's own command (run here under sh), the sbatch script (run here under bash
with stand-ins for srun and scontrol)."""

import os
import re
import subprocess
import sys

import pytest
import yaml
from helpers.support import in_process_cli

from autotune.errors import EXIT_PREEMPTED, EXIT_UNAVAILABLE

IMAGE = "registry.example.com/team/train:1.0"


@pytest.fixture
def cli(capsys, monkeypatch):
    return in_process_cli(capsys, monkeypatch)


def _docs(cli, *args):
    r = cli("autotune", "export", *args)
    assert r.returncode == 0, r.stderr
    return r.stdout, list(yaml.safe_load_all(r.stdout))


def jobset_action(runtime: dict, code: int) -> str:
    """What the JobSet does when a pod of the runtime's job `node` exits ``code``: the Job's podFailurePolicy
    fails it on the listed codes with the Job controller's message (pkg/controller/job/pod_failure_policy.go),
    the runtime's rules match that message (RE2; these patterns mean the same in Python's re); a Job failed
    otherwise (backoffLimit 0: BackoffLimitExceeded) meets no rule: RestartJobSet, counted."""
    spec = runtime["spec"]["template"]["spec"]
    job = spec["replicatedJobs"][0]["template"]["spec"]
    assert job["backoffLimit"] == 0 and job["template"]["spec"]["restartPolicy"] == "Never"
    (rule,) = job["podFailurePolicy"]["rules"]
    if rule["action"] != "FailJob" or code not in rule["onExitCodes"]["values"]:
        return "RestartJobSet"
    msg = f"Container node for pod ns/llm-node-0-1-x failed with exit code {code} matching FailJob rule at index 0"
    return next((r["action"] for r in spec["failurePolicy"]["rules"] if "PodFailurePolicy" in r["onJobFailureReasons"]
                 and any(re.search(p, msg) for p in r["onJobFailureMessagePatterns"])), "RestartJobSet")


RESTARTS = {2: "FailJobSet", 3: "FailJobSet", EXIT_PREEMPTED: "RestartJobSetAndIgnoreMaxRestarts",
            EXIT_UNAVAILABLE: "RestartJobSet", 1: "RestartJobSet", 137: "RestartJobSet"}


def test_the_trainjob_runtimes_restart_on_69_counted_and_stop_on_2_and_3(cli):
    """The export's own TrainingRuntime and the admin's ClusterTrainingRuntime: 69 restarts the job set by a rule
    of its own (counted in maxRestarts, --job_restarts), 75 restarts it uncounted, 2 and 3 fail it."""
    assert EXIT_UNAVAILABLE == 69
    _, (_, runtime, job) = _docs(cli, "--format", "kubeflow", "--image", IMAGE, "--hardware", "2x4xL4",
                                 "--job_restarts", "5")
    _, (cluster,) = _docs(cli, "--format", "kubeflow-runtime", "--job_restarts", "5")
    for rt in (runtime, cluster):
        assert {code: jobset_action(rt, code) for code in RESTARTS} == RESTARTS
        assert rt["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 5
        (late,) = [r for r in rt["spec"]["template"]["spec"]["failurePolicy"]["rules"] if "69" in
                   r["onJobFailureMessagePatterns"][0]]
        assert late["action"] == "RestartJobSet"  # counted: not the IgnoreMaxRestarts of a preemption
    assert job["spec"]["runtimeRef"]["name"] == runtime["metadata"]["name"]


def test_the_pytorchjob_container_turns_69_and_75_into_codes_the_v1_operator_retries(cli, tmp_path):
    """Under restartPolicy ExitCode the v1 operator retries 128+ and ends the job on 1-127: the container's own
    command, as the manifest writes it, exits 197 for the launcher's 69 and 143 for its 75; 2 and 3 pass."""
    _, (_, job) = _docs(cli, "--format", "pytorchjob", "--image", IMAGE, "--hardware", "2x4xL4")
    for replica in job["spec"]["pytorchReplicaSpecs"].values():
        assert replica["restartPolicy"] == "ExitCode"
        (container,) = replica["template"]["spec"]["containers"]
        command = container["command"]

        def exits(code):  # the launcher stands in as a Python that exits `code`
            argv = [*command, sys.executable, "-c", f"import sys; sys.exit({code})"]
            return subprocess.run(argv, capture_output=True, timeout=20).returncode

        got = {code: exits(code) for code in (EXIT_UNAVAILABLE, EXIT_PREEMPTED, 2, 3, 0)}
        assert got == {EXIT_UNAVAILABLE: 197, EXIT_PREEMPTED: 143, 2: 2, 3: 3, 0: 0}
        assert all(got[c] >= 128 for c in (EXIT_UNAVAILABLE, EXIT_PREEMPTED)) and all(got[c] < 128 for c in (2, 3))


def test_the_sbatch_script_requeues_on_69_within_job_restarts(cli, tmp_path):
    """The sbatch script as exported, run by bash: srun's 69 requeues the job while SLURM_RESTART_COUNT is below
    --job_restarts, then ends with 69; 75 requeues whatever the count; 2 ends the job without a requeue."""
    r = cli("autotune", "export", "--format", "slurm", "--hardware", "2x4xL4", "--run_dir", str(tmp_path / "run"),
            "--job_restarts", "2")
    assert r.returncode == 0, r.stderr
    script = tmp_path / "job.sbatch"
    script.write_text(r.stdout)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text('#!/bin/sh\nexit "$FAKE_RC"\n')
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path}/scontrol.log\n')
    for f in bin_dir.iterdir():
        f.chmod(0o755)

    def run(rc, restarts):
        log = tmp_path / "scontrol.log"
        log.unlink(missing_ok=True)
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "FAKE_RC": str(rc), "SLURM_JOB_ID": "7",
               "SLURM_RESTART_COUNT": str(restarts), "SLURM_SUBMIT_DIR": str(tmp_path)}
        p = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, timeout=30)
        return p.returncode, log.read_text().split() if log.exists() else []

    assert run(EXIT_UNAVAILABLE, 0) == (0, ["requeue", "7"])
    assert run(EXIT_UNAVAILABLE, 1) == (0, ["requeue", "7"])
    assert run(EXIT_UNAVAILABLE, 2) == (EXIT_UNAVAILABLE, [])  # its restarts spent
    assert run(EXIT_PREEMPTED, 9) == (0, ["requeue", "7"])
    assert run(2, 0) == (2, [])
    # what the script does is what its comment and --job_restarts' help say: preemptions always requeue, and SLURM's
    # count (which the limit reads) holds them too (new user: the help said "preemptions do not count")
    assert "counts every requeue of the job, the preemptions' too, in SLURM_RESTART_COUNT" in " ".join(
        line.removeprefix("# ") for line in r.stdout.splitlines())
    from autotune.__main__ import build_parser

    export = next(a for a in build_parser()._actions if a.dest == "command").choices["export"]
    text = " ".join(next(a for a in export._actions if a.dest == "job_restarts").help.split())
    assert "an sbatch script's limit reads SLURM_RESTART_COUNT, which counts every requeue, the preemptions' too" \
        in text
    assert "preemptions do not count" not in text
