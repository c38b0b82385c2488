"""Issue 43 (items 2-5): every Kubernetes manifest `export` writes is checked against the operators' CRD schemas
(tests/data/kubeflow_crds: Kubeflow Trainer v2.3.0, training-operator v1.9; tests/helpers/crd_schema.py), not only
the models' round trip: enums, maxItems, patterns, required fields, unknown fields. Also: `--runtime NAME` (a
TrainJob alone on an installed ClusterTrainingRuntime), the admin's ClusterTrainingRuntime, a memory-backed
/dev/shm in every pod template, and the TrainJob's 128-item limit refused by name."""

import copy
import re

import pytest
import yaml
from helpers.crd_schema import crd_errors, is_crd_kind
from helpers.support import in_process_cli, require

from autotune.config import TrainConfig
from autotune.exports import kubernetes as k8s
from autotune.exports import trainjob
from autotune.planner import plan
from autotune.profiles import load_profile

IMAGE = "registry.example.com/team/train:1.0"
CASES = {  # issue 43's clusters: (flags, nodes, processes per node)
    "2x4xL4": (["--hardware", "2x4xL4"], 2, 4),
    "8xH100-80GB-4-nodes": (["--hardware", "8xH100-80GB", "--num_nodes", "4"], 4, 8),
    "4xA100-80GB-2-nodes-fsdp": (["--hardware", "4xA100-80GB", "--num_nodes", "2", "--fsdp"], 2, 4),
}
# k8s.io/apimachinery IsDomainPrefixedPath, which the TrainJob webhook applies to a runtime patch's manager
DOMAIN_PREFIXED = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*"
                             r"/[A-Za-z0-9/\-._~%!$&'()*+,;=:]+")


@pytest.fixture
def cli(capsys, monkeypatch):
    return in_process_cli(capsys, monkeypatch)


def _export(cli, fmt, *extra):
    r = cli("autotune", "export", "--format", fmt, "--image", IMAGE, *extra)
    assert r.returncode == 0, r.stderr
    return r.stdout, list(yaml.safe_load_all(r.stdout))


def _valid(docs):
    for doc in docs:
        if is_crd_kind(doc):
            assert crd_errors(doc) == [], (doc["kind"], crd_errors(doc))


def _round_trips(doc):
    """The Trainer's own models (kubeflow-trainer-api 2.3.0) hold every key too (their from_dict drops unknown ones)."""
    require("kubeflow_trainer_api", "kubeflow-trainer-api (test extra) models the Trainer's kinds")
    from kubeflow_trainer_api import models

    model = getattr(models, f"TrainerV1alpha1{doc['kind']}")
    assert model.from_dict(doc).to_dict() == doc


def pod_specs(doc):
    """Every pod template in ``doc``, with its trainer container's name: the runtimes', a TrainJob's patches, the
    PyTorchJob's replicas."""
    if doc["kind"] in ("TrainingRuntime", "ClusterTrainingRuntime"):
        for rj in doc["spec"]["template"]["spec"]["replicatedJobs"]:
            yield rj["template"]["spec"]["template"]["spec"], trainjob.NODE
    elif doc["kind"] == "TrainJob":
        for patch in doc["spec"].get("runtimePatches", []):
            for rj in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
                yield rj["template"]["spec"]["template"]["spec"], trainjob.NODE
    elif doc["kind"] == "PyTorchJob":
        for replica in doc["spec"]["pytorchReplicaSpecs"].values():
            yield replica["template"]["spec"], k8s.V1_CONTAINER


def _mounts_memory_shm(pod, container, procs):
    vols = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["mountPath"]: m["name"] for c in pod["containers"] if c["name"] == container
              for m in c["volumeMounts"]}
    assert vols[mounts["/dev/shm"]]["emptyDir"] == {"medium": "Memory", "sizeLimit": f"{procs + 1}Gi"}


@pytest.mark.parametrize("case", CASES)
def test_the_exports_for_issue_43s_clusters_validate_against_the_crd_schemas(cli, case):
    """The TrainJob with its runtime, the TrainJob on torch-distributed, the PyTorchJob: every document valid by
    its CRD's schema, every pod template with a memory-backed /dev/shm of the plan's size."""
    flags, nodes, procs = CASES[case]
    for fmt, extra in (("kubeflow", []), ("kubeflow", ["--runtime", "torch-distributed"]), ("pytorchjob", [])):
        _, docs = _export(cli, fmt, *flags, *extra, "--", "--lr", "{learning_rate}")
        _valid(docs)
        pods = [(p, c) for d in docs for p, c in pod_specs(d)]
        assert len(pods) == {"kubeflow": 1, "pytorchjob": 1 + (nodes > 1)}[fmt]
        for pod, container in pods:
            _mounts_memory_shm(pod, container, procs)
        job = docs[-1]
        if fmt == "kubeflow":
            t = job["spec"]["trainer"]
            assert (t["numNodes"], t["numProcPerNode"], t["command"]) == (nodes, procs, list(k8s.LAUNCHER))
            assert t["args"][-3:] == ["--", "--lr", "{learning_rate}"] and ("--fsdp" in t["args"]) == ("fsdp" in case)
        else:
            assert job["spec"]["nprocPerNode"] == str(procs)


def test_the_validator_refuses_what_the_api_server_would():
    """The validator itself: a bogus failure-policy action (an enum), too many arguments (maxItems), a bad
    quantity (a pattern inside an int-or-string), a missing required field, an unknown field, two volumes of one
    name (a list of type map), a TrainJob name the CRD's CEL rule refuses. The valid documents pass."""
    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    job = k8s.Job(name="llm", image=IMAGE, command=tuple(k8s.launcher_command(None, [], "/a/runs/llm", [])),
                  run_dir="/a/runs/llm", pvc="llm-runs", storage="1Ti", secret="llm-secret")
    _, runtime, train = trainjob.trainjob(p, job)
    assert crd_errors(runtime) == [] and crd_errors(train) == []

    def broken(doc, change):
        doc = copy.deepcopy(doc)
        change(doc)
        return crd_errors(doc)

    pod = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    assert pod["volumes"][1]["name"] == "dshm"
    cases = {
        "spec.template.spec.failurePolicy.rules.0.action: enum": (runtime, lambda d: d["spec"]["template"]["spec"][
            "failurePolicy"]["rules"][0].update(action="RestartEverything")),
        "spec.trainer.args: maxItems 128": (train, lambda d: d["spec"]["trainer"].update(args=["-x"] * 129)),
        "spec.template.spec.replicatedJobs.0.template.spec.template.spec.volumes.1.emptyDir.sizeLimit: pattern": (
            runtime, lambda d: d["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
                "spec"]["volumes"][1]["emptyDir"].update(sizeLimit="lots")),
        "spec.runtimeRef: required": (train, lambda d: d["spec"]["runtimeRef"].pop("name")),
        "spec.trainer: additionalProperties": (train, lambda d: d["spec"]["trainer"].update(nodes=2)),
        "spec.template.spec.replicatedJobs.0.template.spec.template.spec.volumes: x-kubernetes-list-type": (
            runtime, lambda d: d["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"][
                "spec"]["volumes"].append({"name": "dshm", "emptyDir": {}})),
        "CEL: metadata.name must match RFC 1035": (train, lambda d: d["metadata"].update(name="9-llm")),
    }
    for want, (doc, change) in cases.items():
        got = broken(doc, change)
        assert len(got) == 1 and got[0].startswith(want), (want, got)


def test_a_trainjob_past_the_crds_128_arguments_is_refused_by_name_and_the_pytorchjob_takes_them(cli):
    """65 flag pairs after `--` are 135 items of trainer.args, past the CRD's maxItems 128: refused by name with
    the fix, before anything is written. 123 script arguments make exactly 128 and validate; the v1 PyTorchJob
    has no such limit."""
    pairs = [a for i in range(65) for a in (f"--opt{i}", str(i))]
    r = cli("autotune", "export", "--format", "kubeflow", "--image", IMAGE, "--hardware", "2x4xL4", "--", *pairs)
    assert r.returncode == 2 and r.stdout == "" and "Traceback" not in r.stderr
    assert ("trainer.args: 135 items (130 of them your script's arguments after `--`), but the TrainJob CRD allows "
            "at most 128 (maxItems)") in r.stderr and "pass the script's settings in a file it reads" in r.stderr
    # the refusal is the schema's: written anyway, the TrainJob fails the CRD there
    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    job = k8s.Job(name="llm", image=IMAGE, command=tuple(k8s.launcher_command(None, [], "/a/r/llm", pairs)),
                  run_dir="/a/r/llm", pvc="r", storage="1Ti", secret="s")
    assert [e.split(":")[0] for e in crd_errors(trainjob.trainjob(p, job)[-1])] == ["spec.trainer.args"]
    _, docs = _export(cli, "kubeflow", "--hardware", "2x4xL4", "--", *pairs[:123])
    assert len(docs[-1]["spec"]["trainer"]["args"]) == 128
    _valid(docs)
    r = cli("autotune", "export", "--format", "kubeflow", "--image", IMAGE, "--hardware", "2x4xL4", "--",
            *pairs[:124])
    assert r.returncode == 2 and "trainer.args: 129 items" in r.stderr
    _, docs = _export(cli, "pytorchjob", "--hardware", "2x4xL4", "--", *pairs)
    _valid(docs)
    assert docs[-1]["spec"]["pytorchReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]["args"][-130:] == \
        pairs


def test_runtime_writes_one_trainjob_on_that_cluster_runtime_with_its_pod_as_patches(cli):
    """`--runtime torch-distributed`: the claim and one TrainJob whose runtimeRef is that ClusterTrainingRuntime,
    no runtime of its own; the claim, /dev/shm and grace reach the pod through runtimePatches, as the webhook
    takes them (a domain-prefixed manager, the job and container `node`, no env there)."""
    text, docs = _export(cli, "kubeflow", "--hardware", "2x4xL4", "--runtime", "torch-distributed",
                         "--namespace", "team-a", "--job_name", "llm")
    assert [d["kind"] for d in docs] == ["PersistentVolumeClaim", "TrainJob"]
    _valid(docs)
    _round_trips(docs[1])
    job = docs[1]
    assert job["spec"]["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime",
                                         "name": "torch-distributed"}
    (patch,) = job["spec"]["runtimePatches"]
    assert DOMAIN_PREFIXED.fullmatch(patch["manager"])
    (rj,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = rj["template"]["spec"]["template"]["spec"]
    assert rj["name"] == "node" and [c["name"] for c in pod["containers"]] == ["node"]
    assert "env" not in pod["containers"][0] and pod["terminationGracePeriodSeconds"] == 90
    assert pod["volumes"][0] == {"name": "runs", "persistentVolumeClaim": {"claimName": "llm-runs"}}
    assert {"name": "runs", "mountPath": "/autotune/runs"} in pod["containers"][0]["volumeMounts"]
    assert job["spec"]["trainer"]["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "llm-secret"
    assert "kubectl apply -n team-a -f llm.yaml" in text and " -l " not in text  # one apply
    assert "torch-distributed has no policy" in text
    r = cli("autotune", "export", "--format", "kubeflow", "--image", IMAGE, "--hardware", "2x4xL4",
            "--runtime", "Torch_Distributed")
    assert r.returncode == 2 and "--runtime: a ClusterTrainingRuntime's name" in r.stderr
    r = cli("autotune", "export", "--format", "pytorchjob", "--image", IMAGE, "--runtime", "torch-distributed")
    assert r.returncode == 2 and "--runtime: only for --format kubeflow" in r.stderr


def test_the_default_trainjobs_header_says_the_rights_and_applies_the_runtime_first(cli):
    """The rights the default export needs, the Kubeflow Platform's role and the way out; the runtime applied
    before the TrainJob (the webhook's cache), by a selector that picks the runtime alone."""
    text, docs = _export(cli, "kubeflow", "--hardware", "2x4xL4", "--job_name", "llm")
    assert "Rights: create trainingruntimes and trainjobs" in text and "kubeflow-edit role may only read" in text
    selector = re.search(r"kubectl apply -f llm\.yaml -l (\S+)=(\S+)", text)
    picked = [d["kind"] for d in docs if d["metadata"]["labels"].get(selector[1]) == selector[2]]
    assert picked == ["TrainingRuntime"]  # the first apply: the runtime alone; then the whole file
    assert "sleep 5; kubectl apply -f llm.yaml" in text


def test_the_cluster_runtime_an_admin_installs_validates_and_needs_no_plan_of_the_cluster(cli):
    """`--format kubeflow-runtime` writes one ClusterTrainingRuntime with the failure policy and /dev/shm, valid by
    its CRD; no image needed, no GPU plan (it is no pod of a plan); a TrainJob on it validates too."""
    r = cli("autotune", "export", "--format", "kubeflow-runtime", "--runtime", "team-torch", "--job_restarts", "5")
    assert r.returncode == 0, r.stderr
    (doc,) = list(yaml.safe_load_all(r.stdout))
    assert (doc["kind"], doc["metadata"]["name"]) == ("ClusterTrainingRuntime", "team-torch")
    assert "namespace" not in doc["metadata"] and crd_errors(doc) == []
    _round_trips(doc)
    assert doc["spec"]["template"]["spec"]["failurePolicy"]["maxRestarts"] == 5
    ((pod, container),) = list(pod_specs(doc))
    _mounts_memory_shm(pod, container, trainjob.CLUSTER_SHM_PROCS)
    assert "kubectl apply -f team-torch.yaml" in r.stdout and "--runtime team-torch" in r.stdout
    _, docs = _export(cli, "kubeflow", "--hardware", "2x4xL4", "--runtime", "team-torch")
    _valid(docs)
    assert docs[-1]["spec"]["runtimeRef"]["name"] == "team-torch"


def test_an_image_past_the_trainjobs_500_characters_is_refused_by_name_and_the_pytorchjob_takes_it(cli):
    """A valid reference (a sha512 digest) of 520 characters: the TrainJob CRD's trainer.image maxLength 500."""
    image = "registry.example.com/" + "a" * 234 + ":" + "t" * 128 + "@sha512:" + "0" * 128
    assert len(image) == 520 and k8s.image_problem(image) is None
    r = cli("autotune", "export", "--format", "kubeflow", "--image", image, "--hardware", "2x4xL4")
    assert r.returncode == 2 and "--image: 520 characters, but the TrainJob CRD allows at most 500" in r.stderr
    p = plan(load_profile("2x4xL4"), TrainConfig(), deepspeed_installed=True)
    job = k8s.Job(name="llm", image=image, command=tuple(k8s.launcher_command(None, [], "/a/r/llm", [])),
                  run_dir="/a/r/llm", pvc="r", storage="1Ti", secret="s")
    assert [e.split(":")[0] for e in crd_errors(trainjob.trainjob(p, job)[-1])] == ["spec.trainer.image"]
    r = cli("autotune", "export", "--format", "pytorchjob", "--image", image, "--hardware", "2x4xL4")
    assert r.returncode == 0, r.stderr
    _valid(list(yaml.safe_load_all(r.stdout)))


def test_the_header_names_autotunes_config_not_the_scripts(cli):
    text, _ = _export(cli, "kubeflow", "--hardware", "2x4xL4", "--", "--config", "script.yaml")
    assert "and its default config, configs/default_config.yaml;" in text and "script.yaml;" not in text
