"""Kubernetes (issue 37), the export: `export --format kubeflow|pytorchjob` checked against the operators' own models
(kubeflow-trainer-api, kubeflow-training) and Kubernetes' schemas (kubernetes-validate), the exit codes that restart
or stop the job, every value checked. The launcher's side is tests/unit/hardware/test_pods.py, the real two-pod run
tests/multiprocess/test_kubernetes_real.py."""

import copy
import json
import re
import signal
import subprocess
import sys

import pytest
import yaml
from helpers.support import in_process_cli, require

from autotune.config import TrainConfig
from autotune.errors import UserError
from autotune.exports import kubernetes as k8s
from autotune.exports import trainjob
from autotune.planner import plan
from autotune.profiles import load_profile

IMAGE = "registry.example.com/team/train:1.0"


@pytest.fixture
def cli(capsys, monkeypatch):
    return in_process_cli(capsys, monkeypatch)


def _export(cli, fmt, *extra, env=None):
    r = cli("autotune", "export", "--format", fmt, "--hardware", "2x4xL4", "--image", IMAGE, *extra, env=env)
    assert r.returncode == 0, r.stderr
    return r.stdout, list(yaml.safe_load_all(r.stdout))


def _round_trip(model, doc):
    """The model holds every key (its from_dict drops unknown ones silently) and every value type."""
    assert model.from_dict(doc).to_dict() == doc


def _k8s_valid(doc):
    kv = require("kubernetes_validate", "kubernetes-validate (test extra) checks the built-in kinds")
    assert kv.validate(doc, "1.37.0", strict=True)


def test_the_exported_trainjob_validates_against_the_trainers_models_and_kubernetes(cli):
    trainer_api = require("kubeflow_trainer_api", "kubeflow-trainer-api (test extra) models the TrainJob")
    from kubeflow_trainer_api.models.trainer_v1alpha1_train_job import TrainerV1alpha1TrainJob
    from kubeflow_trainer_api.models.trainer_v1alpha1_training_runtime import TrainerV1alpha1TrainingRuntime

    assert trainer_api
    text, (pvc, runtime, job) = _export(cli, "kubeflow", "--job_name", "llm", "--namespace", "team-a", "--config",
                                        "configs/default_config.yaml", "--max_steps", "50", "--", "--x", "{seed}")
    _round_trip(TrainerV1alpha1TrainingRuntime, runtime)
    _round_trip(TrainerV1alpha1TrainJob, job)
    _k8s_valid(pvc)
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] and pvc["metadata"]["namespace"] == "team-a"
    t = job["spec"]["trainer"]
    assert (t["numNodes"], t["numProcPerNode"], t["resourcesPerNode"], t["image"]) == \
        (2, 4, {"limits": {"nvidia.com/gpu": "4"}}, IMAGE)
    assert t["command"] == ["python", "-m", "autotune", "launch"]  # the script's arguments go in args
    assert t["args"] == ["--config", "configs/default_config.yaml", "--max_steps", "50", "--run_dir",
                         "/autotune/runs/llm", "--resume_from", "auto", "--", "--x", "{seed}"]  # no node flags
    assert t["env"] == [{"name": "AUTOTUNE_JOB_SECRET", "valueFrom": {"secretKeyRef": {"name": "llm-secret",
                                                                                        "key": "AUTOTUNE_JOB_SECRET"}}}]
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "TrainingRuntime",
                                         "name": "llm-runtime"}
    # the pod the Trainer makes: the runtime's, with the TrainJob's container values; a Job as Kubernetes checks it
    rj = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]
    assert rj["name"] == "node" and rj["template"]["metadata"]["labels"] == {
        "trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}
    made = copy.deepcopy(rj["template"]["spec"])
    c = made["template"]["spec"]["containers"][0]
    c.update(command=t["command"], args=t["args"], env=t["env"], resources=t["resourcesPerNode"])
    _k8s_valid({"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "llm-node-0"}, "spec": made})
    pod = made["template"]["spec"]
    assert (pod["restartPolicy"], pod["terminationGracePeriodSeconds"], made["backoffLimit"]) == ("Never", 90, 0)
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "llm-runs" == pvc["metadata"]["name"]
    assert c["volumeMounts"][0]["mountPath"] == "/autotune/runs"
    assert (pod["volumes"][1], c["volumeMounts"][1]) == ({"name": "dshm", "emptyDir": {"medium": "Memory",
                                                                                       "sizeLimit": "5Gi"}},
                                                         {"name": "dshm", "mountPath": "/dev/shm"})
    # the Secret the header's command makes holds the key the pods read
    secret = re.search(r"kubectl create secret generic (\S+) -n team-a --from-literal=(\w+)=", text)
    _k8s_valid({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": secret[1], "namespace": "team-a"},
                "type": "Opaque", "stringData": {secret[2]: "x"}})
    assert (secret[1], secret[2]) == (t["env"][0]["valueFrom"]["secretKeyRef"]["name"], "AUTOTUNE_JOB_SECRET")
    _exit_codes_decide(runtime, made)


def _exit_codes_decide(runtime, made):
    """Exit 75 restarts the job set (not counted), 2 and 3 fail it, 69 (a peer not there in time) and anything else
    restart it (counted): the Job fails on 2/3/69/75 with the Job controller's message
    (pkg/controller/job/pod_failure_policy.go), which the JobSet's rules match (RE2; these patterns mean the same
    in Python's re)."""
    rules = made["podFailurePolicy"]["rules"]
    assert rules == [{"action": "FailJob", "onExitCodes": {"containerName": "node", "operator": "In",
                                                           "values": [2, 3, 69, 75]}}]
    policy = runtime["spec"]["template"]["spec"]["failurePolicy"]
    assert policy["maxRestarts"] == 3

    def action(code):
        if code not in rules[0]["onExitCodes"]["values"]:
            return "RestartJobSet"  # BackoffLimitExceeded: no rule matches, the default
        msg = f"Container node for pod ns/llm-node-0-1-x failed with exit code {code} matching FailJob rule at index 0"
        return next(r["action"] for r in policy["rules"] if "PodFailurePolicy" in r["onJobFailureReasons"] and
                    any(re.search(p, msg) for p in r["onJobFailureMessagePatterns"]))

    assert {code: action(code) for code in (2, 3, 75, 69, 1, 137)} == {
        2: "FailJobSet", 3: "FailJobSet", 75: "RestartJobSetAndIgnoreMaxRestarts", 69: "RestartJobSet",
        1: "RestartJobSet", 137: "RestartJobSet"}


def test_the_exported_pytorchjob_validates_against_the_v1_models_and_kubernetes(cli):
    require("kubeflow.training", "kubeflow-training (test extra) models the PyTorchJob")
    from kubeflow.training.api_client import ApiClient

    _, (pvc, job) = _export(cli, "pytorchjob", "--hardware", "4xL4", "--num_nodes", "3", "--master_port", "23456")
    client = ApiClient()

    class Response:
        data = json.dumps(job)

    assert client.sanitize_for_serialization(client.deserialize(Response(), "KubeflowOrgV1PyTorchJob")) == job
    _k8s_valid(pvc)
    specs = job["spec"]["pytorchReplicaSpecs"]
    assert {r: (s["replicas"], s["restartPolicy"]) for r, s in specs.items()} == {"Master": (1, "ExitCode"),
                                                                                "Worker": (2, "ExitCode")}
    assert job["spec"]["nprocPerNode"] == "4" and job["spec"]["runPolicy"] == {"cleanPodPolicy": "Running"}
    for s in specs.values():
        _k8s_valid({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "t"}, "template": s["template"]})
        c = s["template"]["spec"]["containers"][0]
        assert (c["name"], c["ports"], c["resources"]) == ("pytorch", [{"name": "pytorchjob-port",
                                                                        "containerPort": 23456}],
                                                           {"limits": {"nvidia.com/gpu": "4"}})
        assert c["command"] == ["/bin/sh", "-c", k8s.V1_WRAPPER, "autotune"]
        assert c["args"][:4] == ["python", "-m", "autotune", "launch"]
        assert "--master_port" not in c["args"] and "--num_nodes" not in c["args"]


def test_the_v1_wrapper_restarts_a_preempted_or_unavailable_launcher_and_keeps_2_and_3_permanent(tmp_path):
    """PID 1 of the v1 pod: SIGTERM reaches the launcher, whose exit 75 leaves as 143 and 69 (a peer not there in
    time) as 197 (both retryable under restartPolicy ExitCode: 128+); other codes pass unchanged."""
    child = tmp_path / "launcher.py"
    child.write_text("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *a: sys.exit(75))\n"
                     "print('up', flush=True)\nif len(sys.argv) > 1: sys.exit(int(sys.argv[1]))\ntime.sleep(60)\n")

    def wrapped(*args):
        return ["/bin/sh", "-c", k8s.V1_WRAPPER, "autotune", sys.executable, str(child), *args]

    p = subprocess.Popen(wrapped(), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"
    p.send_signal(signal.SIGTERM)  # the kubelet signals the container's PID 1: the shell
    assert p.wait(timeout=20) == 143
    assert [subprocess.run(wrapped(code), capture_output=True, timeout=20).returncode
            for code in ("0", "2", "3", "1", "69")] == [0, 2, 3, 1, 197]


@pytest.mark.parametrize("flag, value, why", [
    ("--image", "Registry/Team:1", "--image: not an image reference"),
    ("--image", "team/train:1\nkind: Secret", "--image: not an image reference"),
    ("--job_name", "1job", "--job_name: a DNS-1035 label"),
    ("--job_name", "x" * 41, "--job_name: a DNS-1035 label"),
    ("--namespace", "Team_A", "--namespace: a DNS-1123 label"),
    ("--secret", "s/ecret", "--secret: a DNS-1123 name"),
    ("--storage", "lots", "--storage: a Kubernetes quantity"),
    ("--run_dir", "runs/x", "--run_dir: the run directory inside the container: an absolute path"),
    ("--run_dir", "/runs", "--run_dir: the run directory inside the container: an absolute path"),
    ("--config", "my\nconfig.yaml", "command argument 5 ('my\\nconfig.yaml'): holds the control character '\\n'"),
])
def test_every_value_that_goes_into_the_manifest_is_checked_and_named(flag, value, why):
    job = dict(name="llm", image=IMAGE, command=tuple(k8s.launcher_command(None, [], "/a/runs/llm", [])),
               run_dir="/a/runs/llm", pvc="llm-runs", storage="1Ti", secret="llm-secret")
    assert k8s.problems(k8s.Job(**job)) == []
    field = {"--image": "image", "--job_name": "name", "--namespace": "namespace", "--secret": "secret",
             "--storage": "storage", "--run_dir": "run_dir"}.get(flag)
    if field:
        job[field] = value
    else:
        job["command"] = tuple(k8s.launcher_command(value, [], "/a/runs/llm", []))
    found = k8s.problems(k8s.Job(**job))
    assert len(found) == 1 and found[0].startswith(why), found
    for good in ("team/train", "localhost:5000/a/b:v1.2", "ghcr.io/o/r@sha256:" + "a" * 64,
                 "nvcr.io/nvidia/pytorch:24.01-py3", "[::1]:5000/x"):
        assert k8s.image_problem(good) is None, good


def test_a_manifest_without_gpu_limits_or_with_a_bad_image_is_refused_at_export(cli):
    cpu = cli("autotune", "export", "--format", "kubeflow", "--image", IMAGE, "--hardware", "cpu-only")
    assert cpu.returncode == 2 and "the plan is for CPUs" in cpu.stderr and "--num_gpus 0" in cpu.stderr
    assert "Traceback" not in cpu.stderr and cpu.stdout == ""
    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    job = k8s.Job(name="llm", image=IMAGE, command=("python",), run_dir="/a/runs/llm", pvc="r", storage="1Ti",
                  secret="s")
    docs = trainjob.trainjob(p, job)
    del docs[2]["spec"]["trainer"]["resourcesPerNode"]
    with pytest.raises(UserError, match=r"TrainJob spec.trainer.resourcesPerNode asks for no GPU, but the plan runs "
                                        r"4 process\(es\) on 4 GPU\(s\) per node"):
        k8s.check_gpus(p, docs, cpu_on_purpose=False)
    bad = cli("autotune", "export", "--format", "pytorchjob", "--hardware", "2x4xL4", "--image", "Bad Image",
              "--job_name", "Bad_Name")
    assert bad.returncode == 2 and "2 value(s) cannot go into the manifest" in bad.stderr
    assert "--image: not an image reference" in bad.stderr and "--job_name: a DNS-1035 label" in bad.stderr
    for args, why in ((["--node_rank", "1"], "--node_rank: every pod takes its rank"),
                      (["--master_port", "1234"], "--master_port: every pod takes"), ([], "--image: required"),
                      (["--no_auto_optimize"], "--no_auto_optimize: it takes node rank and master from the config"),
                      (["--job_restarts", "-1"], "--job_restarts: a number from 0 to 10000")):
        r = cli("autotune", "export", "--format", "kubeflow", "--hardware", "2x4xL4",
                *(["--image", IMAGE] if args else []), *args)
        assert r.returncode == 2 and why in r.stderr, r.stderr
