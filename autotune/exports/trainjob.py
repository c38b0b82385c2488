"""The plan as Kubeflow Trainer v2 documents (pure; facts from kubeflow/trainer v2.3.0 and JobSet 0.12): the
``TrainJob`` on the export's own ``TrainingRuntime`` (``--format kubeflow``), on an installed
``ClusterTrainingRuntime`` with the pod's volumes and grace through ``runtimePatches`` (``--runtime NAME``), and
the ``ClusterTrainingRuntime`` with autotune's failure policy that an admin installs once (``kubeflow-runtime``).

A JobSet restarts only as its runtime's ``failurePolicy`` says, and a TrainJob cannot carry one
(``runtimePatches`` reach labels, volumes, containers' mounts and the pod's grace only), so the policy lives in a
runtime: the Torch policy of ``torch-distributed`` (PET_* injected into the container ``node``), ``backoffLimit:
0``, a ``podFailurePolicy`` that fails the Job on 2, 3, 69 or 75 (the Job's message then names the exit code),
and JobSet rules on that message: 2 and 3 fail the job set, 75 restarts it without counting against
``maxRestarts``, 69 (a peer or lock holder not there in time) restarts it, counted; any other failure
restarts it, counted.
"""

from __future__ import annotations

from autotune.exports.kubernetes import (
    PREEMPTED,
    STOP_CODES,
    UNAVAILABLE,
    Job,
    claim,
    common_header,
    gpu_limits,
    grace_s,
    meta,
    out_name_shown,
    secret_env,
    shm,
    volume_header,
    volumes,
)
from autotune.plan import TrainingPlan

API = "trainer.kubeflow.org/v1alpha1"
NODE = "node"  # the Torch runtime's trainer job and container: the one the Trainer injects PET_* into
PATCH_MANAGER = "autotune/export"  # a domain-prefixed path, as the TrainJob webhook requires of a manager
CLUSTER_RUNTIME = "autotune-torch"  # the default name of the runtime `--format kubeflow-runtime` writes
CLUSTER_SHM_PROCS = 8  # the cluster runtime's /dev/shm: 8 processes a node; each TrainJob patches in its plan's


def _message(codes_re: str) -> list[str]:  # the Job controller's: "... failed with exit code N matching FailJob"
    return [f"failed with exit code {codes_re} matching FailJob rule"]


def failure_policy(job_restarts: int) -> dict:
    """The JobSet's rules on the Job's failure message (JobSet 0.12's ``onJobFailureMessagePatterns``)."""
    return {"maxRestarts": job_restarts, "rules": [
        {"name": "stopOnBadInputOrNoPlan", "action": "FailJobSet", "onJobFailureReasons": ["PodFailurePolicy"],
         "onJobFailureMessagePatterns": _message("(" + "|".join(map(str, STOP_CODES)) + ")")},
        {"name": "resumeAfterPreemption", "action": "RestartJobSetAndIgnoreMaxRestarts",
         "onJobFailureReasons": ["PodFailurePolicy"], "onJobFailureMessagePatterns": _message(str(PREEMPTED))},
        {"name": "restartWhenAPeerIsLate", "action": "RestartJobSet",
         "onJobFailureReasons": ["PodFailurePolicy"], "onJobFailureMessagePatterns": _message(str(UNAVAILABLE))}]}


def runtime_spec(job_restarts: int, pod: dict, num_nodes: int = 1) -> dict:
    """A Torch runtime's spec with the failure policy, around ``pod`` (its container ``node``)."""
    codes = {"containerName": NODE, "operator": "In", "values": sorted((*STOP_CODES, PREEMPTED, UNAVAILABLE))}
    node_job = {"name": NODE, "template": {
        "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
        "spec": {"backoffLimit": 0, "podFailurePolicy": {"rules": [{"action": "FailJob", "onExitCodes": codes}]},
                 "template": {"spec": {"restartPolicy": "Never", **pod}}}}}
    return {"mlPolicy": {"numNodes": num_nodes, "torch": {}},
            "template": {"spec": {"failurePolicy": failure_policy(job_restarts), "replicatedJobs": [node_job]}}}


def training_runtime(plan: TrainingPlan, job: Job) -> dict:
    """The export's own namespaced runtime: the policy, the claim and /dev/shm, the grace period."""
    vols, mounts = volumes(job, plan.engine.nproc_per_node)
    pod = {"terminationGracePeriodSeconds": grace_s(plan), "volumes": vols,
           "containers": [{"name": NODE, "image": job.image, "volumeMounts": mounts}]}
    return {"apiVersion": API, "kind": "TrainingRuntime",
            "metadata": meta(job, f"{job.name}-runtime", **{"trainer.kubeflow.org/framework": "torch",
                                                              "app.kubernetes.io/component": "runtime"}),
            "spec": runtime_spec(job.job_restarts, pod, plan.engine.num_nodes)}


def cluster_runtime(name: str, job_restarts: int, grace: int, image: str | None) -> dict:
    """The runtime an admin installs once: the policy and /dev/shm; each TrainJob brings its claim and grace."""
    vol, mount = shm(CLUSTER_SHM_PROCS)
    container = {"name": NODE, **({"image": image} if image else {}), "volumeMounts": [mount]}
    pod = {"terminationGracePeriodSeconds": grace, "volumes": [vol], "containers": [container]}
    return {"apiVersion": API, "kind": "ClusterTrainingRuntime",
            "metadata": {"name": name, "labels": {"app.kubernetes.io/managed-by": "autotune",
                                                  "trainer.kubeflow.org/framework": "torch"}},
            "spec": runtime_spec(job_restarts, pod)}


def runtime_patches(plan: TrainingPlan, job: Job) -> list[dict]:
    """The claim, /dev/shm and the grace period on an installed runtime's job ``node`` (merged by name)."""
    vols, mounts = volumes(job, plan.engine.nproc_per_node)
    pod = {"volumes": vols, "containers": [{"name": NODE, "volumeMounts": mounts}],
           "terminationGracePeriodSeconds": grace_s(plan)}
    return [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [
        {"name": NODE, "template": {"spec": {"template": {"spec": pod}}}}]}}}}]


def trainjob(plan: TrainingPlan, job: Job) -> list[dict]:
    """PersistentVolumeClaim, then the export's TrainingRuntime and the TrainJob on it, or (``job.runtime``) the
    TrainJob alone on that ClusterTrainingRuntime, its pod's additions as runtimePatches."""
    eng = plan.engine
    trainer: dict = {"image": job.image, "command": job.entry, "args": job.args, "numNodes": eng.num_nodes,
                     "numProcPerNode": eng.nproc_per_node, "env": secret_env(job)}
    if eng.num_gpus:
        trainer["resourcesPerNode"] = gpu_limits(plan)
    if job.runtime:
        ref, spec_extra, docs = {"kind": "ClusterTrainingRuntime", "name": job.runtime}, \
            {"runtimePatches": runtime_patches(plan, job)}, [claim(job)]
    else:
        runtime = training_runtime(plan, job)
        ref, spec_extra, docs = {"kind": "TrainingRuntime", "name": runtime["metadata"]["name"]}, {}, \
            [claim(job), runtime]
    train = {"apiVersion": API, "kind": "TrainJob", "metadata": meta(job, job.name),
             "spec": {"runtimeRef": {"apiGroup": "trainer.kubeflow.org", **ref}, "trainer": trainer, **spec_extra}}
    return [*docs, train]


def _policy_lines(job_restarts: int) -> list[str]:
    return ["which restarts the whole job, not counted in maxRestarts; exit 69 (a peer or a lock holder not there",
            "in time) restarts it, counted; exit 2 (bad input) and 3 (no plan fits) stop it; any other failure",
            f"restarts it, counted: at most {job_restarts} counted restarts in all (the runtime's failurePolicy)."]


def header(plan: TrainingPlan, job: Job, out_name: str) -> list[str]:
    """How to apply the TrainJob (the runtime first) and what to edit."""
    ns = f" -n {job.namespace}" if job.namespace else ""
    out_name = out_name_shown(out_name)
    lines = common_header(plan, job, "Kubeflow Trainer v2 TrainJob")
    if job.runtime:
        lines += [
            f"It runs on the ClusterTrainingRuntime {job.runtime}, installed by an admin (its trainer job and",
            "container named node, as in torch-distributed); the claim, /dev/shm and the grace period come as",
            "runtimePatches.",
            "Rights: create trainjobs and persistentvolumeclaims in the namespace (the Kubeflow Platform's "
            "kubeflow-edit", "role has both).",
            f"Apply: kubectl apply{ns} -f {out_name}"]
    else:
        lines += [
            "Rights: create trainingruntimes and trainjobs (trainer.kubeflow.org) and persistentvolumeclaims in the "
            "namespace.", "The Kubeflow Platform's kubeflow-edit role may only read trainingruntimes: export with "
            "--runtime NAME instead,", "NAME a ClusterTrainingRuntime an admin installed once (`export --format "
            "kubeflow-runtime` writes", f"one, {CLUSTER_RUNTIME}).",
            "Apply the runtime first: the TrainJob webhook reads runtimes through a cache that may not hold it yet",
            "(\"specified trainingRuntime must be created before the TrainJob\"):",
            f"  kubectl apply{ns} -f {out_name} -l app.kubernetes.io/component=runtime   # the claim is "
            "applied with the job",
            f"  sleep 5; kubectl apply{ns} -f {out_name}        # or apply the whole file again if it was refused"]
    lines += [f"Watch: kubectl get trainjob{ns} {job.name}", *volume_header(plan, job)]
    if job.runtime:
        lines += [f"which {job.runtime}'s failurePolicy decides. The runtime `export --format kubeflow-runtime` "
                  "writes restarts", f"the job on 75 (not counted) and {UNAVAILABLE} (counted) and stops it on 2 and "
                  "3; torch-distributed has no policy:", "its Jobs' own retries apply to every exit code, 2 and 3 "
                  "included, and the first Job that fails ends the job."]
    else:
        lines += _policy_lines(job.job_restarts)
    lines.append("Edit: the claim's size and storageClassName; memory/cpu requests beside the GPU limits"
                 + ("." if job.runtime else "; maxRestarts."))
    return [f"# {line}" for line in lines]


def cluster_runtime_header(name: str, job_restarts: int, grace: int, out_name: str) -> list[str]:
    """What the admin's file is and how the users reach it."""
    lines = [
        f"Kubeflow Trainer v2 ClusterTrainingRuntime {name}, written by `python -m autotune export --format",
        "kubeflow-runtime` (docs/kubernetes.md): the Torch runtime with autotune's failure policy. Install it once",
        "(cluster-scoped: an admin's rights, create clustertrainingruntimes):",
        f"  kubectl apply -f {out_name_shown(out_name)}",
        f"Users then export with --runtime {name}: their TrainJob alone, its claim, /dev/shm and grace period as",
        "runtimePatches (the Kubeflow Platform's kubeflow-edit role suffices).",
        f"Exit 75 (preempted, checkpoint saved; the pods' grace here is {grace} s, each TrainJob patches its own),",
        *_policy_lines(job_restarts),
        f"/dev/shm: memory-backed, sized for {CLUSTER_SHM_PROCS} processes a node; each TrainJob patches its "
        "plan's size."]
    return [f"# {line}" for line in lines]
