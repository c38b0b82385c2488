"""The plan as Kubernetes manifests (pure), the parts every operator shares: the job's values and their checks
(``problems``, the CRDs' limits), the claim, the pod's volumes (the run directory's claim, a memory-backed
``/dev/shm``), the header's common lines, and the v1 ``PyTorchJob`` (``pytorchjob``). The Kubeflow Trainer v2
documents (``kubeflow``, ``kubeflow-runtime``) are ``exports.trainjob``'s.

Every pod runs autotune's launcher with the plan's flags and no node flags: it reads its node count, rank
and master from the operator's variables (``autotune.hardware.pod``), plans for its own node, meets
the others and trains, resuming from the newest checkpoint (``--resume_from auto``) after any restart.

Exit codes and the v1 operator (training-operator v1.9): under ``restartPolicy: ExitCode`` codes 1-127 are
permanent and 128+ restart the pod, so 75 (preempted) and 69 (a peer or lock holder not there in time) would end
the job. A small ``sh`` wrapper (PID 1: it forwards SIGTERM to the launcher) turns 75 into 143 (128 + SIGTERM,
what preemption is) and 69 into 197 (128 + 69); 2 and 3 stay permanent. A launcher flag would have changed the
launcher's exit contract everywhere for one operator.
The job secret (``AUTOTUNE_JOB_SECRET``) comes from a Secret by ``secretKeyRef``, never a value here; the
grace period covers ``checkpoint.preemption_grace_s`` plus the launcher's own 10 s and a margin.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import PurePosixPath

from autotune.errors import EXIT_PREEMPTED, EXIT_UNAVAILABLE, UserError
from autotune.plan import TrainingPlan
from autotune.rundir.layout import JOB_SECRET_ENV

SECRET_KEY = JOB_SECRET_ENV
V1_CONTAINER, V1_PORT_NAME = "pytorch", "pytorchjob-port"  # the v1 operator requires both names
GRACE_MARGIN_S = 30  # the launcher stops the tree at grace + 10 s; 20 s more to write its records and exit
STOP_CODES, PREEMPTED, UNAVAILABLE = (2, 3), EXIT_PREEMPTED, EXIT_UNAVAILABLE
V1_RESTART = {PREEMPTED: 128 + 15, UNAVAILABLE: 128 + UNAVAILABLE}  # retryable under restartPolicy ExitCode
MAX_NAME = 40  # pods are <name>-node-0-<i> / <name>-worker-<i>: host names stay within DNS's 63
LAUNCHER = ("python", "-m", "autotune", "launch")  # the container's command; the rest of the argv is its args
MAX_ITEMS, MAX_IMAGE = 128, 500  # the TrainJob CRD (v2.3.0): trainer.command/args/env maxItems, image maxLength
SHM_VOLUME = "dshm"
# the pod's exits, 75 and 69 as the v1 operator retries them; SIGTERM (the kubelet's, to PID 1) reaches the launcher
V1_WRAPPER = ('trap \'kill -TERM "$pid" 2>/dev/null\' TERM INT HUP; "$@" & pid=$!; '
              'while :; do wait "$pid"; rc=$?; kill -0 "$pid" 2>/dev/null || break; done; '
              f'case "$rc" in {PREEMPTED}) rc={V1_RESTART[PREEMPTED]};; '
              f'{UNAVAILABLE}) rc={V1_RESTART[UNAVAILABLE]};; esac; exit "$rc"')

_LABEL_1035 = re.compile(r"[a-z]([-a-z0-9]*[a-z0-9])?")
_LABEL_1123 = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
_QUANTITY = re.compile(r"[0-9]+(\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E)?")
# OCI image reference (github.com/distribution/reference, regexp.go): [host[:port]/]path[:tag][@digest]
_LABEL = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = rf"{_LABEL}(?:\.{_LABEL})*"
_PATH = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_IMAGE = re.compile(rf"(?P<name>(?:(?:{_DOMAIN}|\[[a-fA-F0-9:]+\])(?::[0-9]+)?/)?{_PATH}(?:/{_PATH})*)"
                    r"(?::(?P<tag>[\w][\w.-]{0,127}))?"
                    r"(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,}))?")


@dataclass(frozen=True)
class Job:
    """What the manifests hold besides the plan: every field is checked by ``problems``."""

    name: str
    image: str
    command: tuple[str, ...]  # the launcher's argv (``launcher_command``)
    run_dir: str  # inside the container; the claim is mounted at its parent
    pvc: str
    storage: str
    secret: str
    namespace: str | None = None
    storage_class: str | None = None
    job_restarts: int = 3
    runtime: str | None = None  # an installed ClusterTrainingRuntime (``--runtime``), else the export's own

    @property
    def mount_path(self) -> str:
        return str(PurePosixPath(self.run_dir).parent)

    @property
    def entry(self) -> list[str]:
        """The container's command: the launcher; ``args`` holds the rest (flags, run directory, script's)."""
        return list(self.command[:len(LAUNCHER)])

    @property
    def args(self) -> list[str]:
        return list(self.command[len(LAUNCHER):])


def launcher_command(config: str | None, plan_flags: list[str], run_dir: str, script_args: list[str],
                     resumes: bool = True) -> list[str]:
    """The same command in every pod: no node flags (the operator's variables give them); ``--resume_from auto``
    only for a script that can resume (``script_resume.why_no_resume``)."""
    return [*LAUNCHER, *(["--config", config] if config else []), *plan_flags, "--run_dir", run_dir,
            *(["--resume_from", "auto"] if resumes else []), *(["--", *script_args] if script_args else [])]


def _text(value: str) -> str | None:
    """Why ``value`` cannot go into a manifest or a command line, or None."""
    if not value:
        return "must not be empty"
    if len(value) > 4096:
        return f"longer than 4096 characters ({len(value)})"
    bad = next((c for c in value if ord(c) < 32 or 127 <= ord(c) < 160 or c in "\u2028\u2029"), None)
    return None if bad is None else f"holds the control character {bad!r} (a newline or a terminal escape)"


def _name(value: str | None, pattern: re.Pattern, limit: int, what: str) -> str | None:
    if value is None or (pattern.fullmatch(value) and len(value) <= limit):
        return None
    return f"{what}, at most {limit} characters; got {value[:80]!r}"


def image_problem(image: str) -> str | None:
    m = _IMAGE.fullmatch(image or "")
    if not m or len(m["name"]) > 255:
        return (f"not an image reference such as registry.example.com/team/train:1.0 or name@sha256:<digest> "
                f"(lower-case path, optional tag and digest); got {(image or '')[:80]!r}")
    return None


def runtime_name_problem(name: str | None) -> str | None:
    return _name(name, _SUBDOMAIN, 253, "a ClusterTrainingRuntime's name, a DNS-1123 name: a-z, 0-9, '-' and '.'")


def unpinned(image: str) -> bool:
    """A valid reference with neither tag nor digest (``:latest`` by default: it may change under a restart)."""
    m = _IMAGE.fullmatch(image)
    return bool(m) and not (m["tag"] or m["digest"])


def problems(job: Job) -> list[str]:
    """Every field that cannot go into a manifest, named by its flag."""
    out = []
    dns = "a DNS-1123 name: a-z, 0-9, '-' and '.'"
    checks = [
        ("--image", image_problem(job.image)),
        ("--job_name", _name(job.name, _LABEL_1035, MAX_NAME, "a DNS-1035 label: a-z, 0-9 and '-', starting with "
                                                              "a letter, ending with a letter or digit")),
        ("--namespace", _name(job.namespace, _LABEL_1123, 63, "a DNS-1123 label: a-z, 0-9 and '-'")),
        ("--pvc", _name(job.pvc, _SUBDOMAIN, 253, dns)),
        ("--secret", _name(job.secret, _SUBDOMAIN, 253, dns)),
        ("--storage_class", _name(job.storage_class, _SUBDOMAIN, 253, dns)),
        ("--runtime", runtime_name_problem(job.runtime)),
        ("--storage", None if _QUANTITY.fullmatch(job.storage or "") else
         f"a Kubernetes quantity such as 100Gi or 2Ti; got {(job.storage or '')[:40]!r}"),
    ]
    # the default claim and secret names follow a bad --job_name: fixed with it, not named twice
    derived = {} if checks[1][1] is None else {"--pvc": (job.pvc, f"{job.name}-runs"),
                                               "--secret": (job.secret, f"{job.name}-secret")}
    out += [f"{flag}: {why}" for flag, why in checks if why and not (flag in derived and len(set(derived[flag])) == 1)]
    run = PurePosixPath(job.run_dir or ".")
    why = _text(job.run_dir)
    if why is None and (not run.is_absolute() or ".." in run.parts or len(run.parts) < 3):
        why = (f"the run directory inside the container: an absolute path below a mount point, e.g. "
               f"/autotune/runs/{job.name}; got {job.run_dir[:80]!r}")
    if why:
        out.append(f"--run_dir: {why}")
    for i, arg in enumerate(job.command):
        why = _text(arg) if arg else None  # an empty argument is one a script may want
        if why:
            out.append(f"command argument {i} ({arg[:40]!r}): {why}")
    return out


def trainjob_problems(job: Job) -> list[str]:
    """The TrainJob CRD's limits the other checks leave: ``trainer.args`` at most 128 items, ``trainer.image`` at
    most 500 characters (past them the API server refuses the job; the v1 PyTorchJob has neither)."""
    out = [why for why in (_args_problem(job),) if why]
    if image_problem(job.image) is None and len(job.image) > MAX_IMAGE:
        out.append(f"--image: {len(job.image)} characters, but the TrainJob CRD allows at most {MAX_IMAGE} "
                   "(trainer.image's maxLength); push it under a shorter name")
    return out


def _args_problem(job: Job) -> str | None:
    args = job.args
    if len(args) <= MAX_ITEMS:
        return None
    script = len(args) - args.index("--") - 1 if "--" in args else 0
    return (f"trainer.args: {len(args)} items ({script} of them your script's arguments after `--`), but the TrainJob "
            f"CRD allows at most {MAX_ITEMS} (maxItems) and the API server would refuse the job; pass the script's "
            f"settings in a file it reads (one flag, e.g. --config its.yaml) and the plan's in --config")


def gpu_limits(plan: TrainingPlan) -> dict:
    return {"limits": {"nvidia.com/gpu": str(plan.engine.num_gpus)}} if plan.engine.num_gpus else {}


def check_gpus(plan: TrainingPlan, docs: list[dict], cpu_on_purpose: bool) -> None:
    """A GPU plan whose trainer containers lack its ``nvidia.com/gpu`` limit, or a CPU plan nobody asked for
    (the exporting machine has no GPU), would run one process per node on CPUs without a word: refused."""
    eng = plan.engine
    if not eng.num_gpus and not cpu_on_purpose:
        raise UserError("export: the plan is for CPUs (this machine has no GPU), so the manifest would ask for no "
                        "GPU; plan for the cluster's nodes with --hardware (e.g. --hardware 2x4xL4, or a profile "
                        "written by `report --json` on one node), or pass --num_gpus 0 to train on CPUs on purpose")
    want = {"nvidia.com/gpu": str(eng.num_gpus)} if eng.num_gpus else {}
    for doc in docs:
        for where, res in _trainer_resources(doc):
            got = {k: v for k, v in (res.get("limits") or {}).items() if k == "nvidia.com/gpu"}
            if got != want:
                raise UserError(f"export: {doc['kind']} {where} asks for {got or 'no GPU'}, but the plan runs "
                                f"{eng.nproc_per_node} process(es) on {eng.num_gpus} GPU(s) per node")


def _trainer_resources(doc: dict):
    if doc["kind"] == "TrainJob":
        yield "spec.trainer.resourcesPerNode", doc["spec"]["trainer"].get("resourcesPerNode", {})
    elif doc["kind"] == "PyTorchJob":
        for role, spec in doc["spec"]["pytorchReplicaSpecs"].items():
            for c in spec["template"]["spec"]["containers"]:
                yield f"{role} container {c['name']}", c.get("resources", {})


def meta(job: Job, name: str, namespaced: bool = True, **labels: str) -> dict:
    out: dict = {"name": name}
    if job.namespace and namespaced:
        out["namespace"] = job.namespace
    out["labels"] = {"app.kubernetes.io/managed-by": "autotune", **labels}
    return out


def claim(job: Job) -> dict:
    spec: dict = {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": job.storage}}}
    if job.storage_class:
        spec["storageClassName"] = job.storage_class
    return {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": meta(job, job.pvc), "spec": spec}


def grace_s(plan: TrainingPlan) -> int:
    return plan.run.preemption_grace_s + GRACE_MARGIN_S


def secret_env(job: Job) -> list[dict]:
    return [{"name": SECRET_KEY, "valueFrom": {"secretKeyRef": {"name": job.secret, "key": SECRET_KEY}}}]


def shm_limit(procs: int) -> str:
    """The ``/dev/shm`` cap for ``procs`` processes on a node: 1 GiB each and 1 GiB more (docs/kubernetes.md:
    NCCL's shared-memory buffers and the DataLoader workers' batches in flight). Memory-backed: the pages used
    count against the pod's memory, the cap is no reservation; past it the kubelet evicts the pod."""
    return f"{max(1, procs) + 1}Gi"


def shm(procs: int) -> tuple[dict, dict]:
    """A memory-backed ``/dev/shm`` (a container's own is 64 MiB: DataLoader workers and NCCL's SHM transport
    fail with "Bus error" in it): the volume and its mount."""
    return ({"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": shm_limit(procs)}},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"})


def volumes(job: Job, procs: int) -> tuple[list[dict], list[dict]]:
    """The run directory's claim and ``/dev/shm``: the pod's volumes and the trainer container's mounts."""
    vol, mount = shm(procs)
    return ([{"name": "runs", "persistentVolumeClaim": {"claimName": job.pvc}}, vol],
            [{"name": "runs", "mountPath": job.mount_path}, mount])


def pytorchjob(plan: TrainingPlan, job: Job) -> list[dict]:
    """PersistentVolumeClaim, PyTorchJob (Master and Worker replicas, restartPolicy ExitCode)."""
    eng = plan.engine

    def template() -> dict:  # one per role: a shared object would be written as a YAML alias
        vols, mounts = volumes(job, eng.nproc_per_node)
        container = {"name": V1_CONTAINER, "image": job.image,
                     "command": ["/bin/sh", "-c", V1_WRAPPER, "autotune"], "args": list(job.command),
                     "ports": [{"name": V1_PORT_NAME, "containerPort": eng.master_port}],
                     "env": secret_env(job), "volumeMounts": mounts, **({"resources": gpu_limits(plan)}
                                                                        if eng.num_gpus else {})}
        return {"spec": {"terminationGracePeriodSeconds": grace_s(plan), "volumes": vols, "containers": [container]}}

    roles = {"Master": 1, "Worker": eng.num_nodes - 1}
    specs = {role: {"replicas": n, "restartPolicy": "ExitCode", "template": template()}
             for role, n in roles.items() if n}
    job_doc = {"apiVersion": "kubeflow.org/v1", "kind": "PyTorchJob", "metadata": meta(job, job.name),
               "spec": {"nprocPerNode": str(eng.nproc_per_node), "runPolicy": {"cleanPodPolicy": "Running"},
                        "pytorchReplicaSpecs": specs}}
    return [claim(job), job_doc]


def common_header(plan: TrainingPlan, job: Job, what: str) -> list[str]:
    """The lines every pod manifest's header starts with: what runs, the image, the secret."""
    eng = plan.engine
    gpus = f"{eng.num_gpus} GPU(s) each (nvidia.com/gpu)" if eng.num_gpus else "CPUs only (--num_gpus 0)"
    ns = f" -n {job.namespace}" if job.namespace else ""
    own = job.command[:job.command.index("--")] if "--" in job.command else job.command  # not the script's
    config = next((own[i + 1] for i, a in enumerate(own[:-1]) if a == "--config"), None)
    where = (f"and, relative to its working directory, {config}" if config and not config.startswith("/")
             else f"and {config}" if config else "and its default config, configs/default_config.yaml")
    return [
        f"{what} written by `python -m autotune export` (docs/kubernetes.md):",
        f"{eng.num_nodes} node(s) x {eng.nproc_per_node} process(es), {gpus}. Every pod runs the same launcher",
        "command, takes its node count, rank and master from the operator (PET_*), plans for its own node, meets",
        "the others, trains, and resumes from the run directory after any restart.",
        "Before applying:",
        f"  1. the image {job.image} holds autotune's checkout (autotune/, configs/) with torch,",
        f"     {where};",
        "  2. create the job secret once (its value never appears in this file):",
        f"     kubectl create secret generic {job.secret}{ns} --from-literal={SECRET_KEY}=\"$(openssl rand -hex 32)\"",
    ]


def volume_header(plan: TrainingPlan, job: Job) -> list[str]:
    return [
        f"The claim {job.pvc} ({job.storage}, ReadWriteMany: every node writes the run directory {job.run_dir})",
        f"is mounted at {job.mount_path}, hiding what the image has there. Delete it only when the run is done.",
        f"/dev/shm is memory-backed, at most {shm_limit(plan.engine.nproc_per_node)} (1 GiB per process and 1 more: "
        "NCCL's shared memory, DataLoader",
        "workers' batches); its pages count against the pod's memory.",
        f"Preemption: SIGTERM -> a checkpoint within {plan.run.preemption_grace_s} s (checkpoint.preemption_grace_s; "
        f"pods' grace {grace_s(plan)} s) -> exit 75,",
    ]


def pytorchjob_header(plan: TrainingPlan, job: Job, out_name: str) -> list[str]:
    ns = f" -n {job.namespace}" if job.namespace else ""
    lines = [*common_header(plan, job, "Kubeflow training-operator v1 PyTorchJob"),
             f"Apply: kubectl apply{ns} -f {out_name}", f"Watch: kubectl get pytorchjob{ns} {job.name}",
             *volume_header(plan, job),
             f"which the wrapper turns into {V1_RESTART[PREEMPTED]}, and exit {UNAVAILABLE} (a peer or a lock holder "
             f"not there in time) into {V1_RESTART[UNAVAILABLE]}: under",
             "restartPolicy ExitCode 128+ restarts the pod and 1-127 end the job (exit 2: bad input, 3: no plan "
             "fits).", "The operator sets no bound on these restarts.",
             "Edit: the claim's size and storageClassName; memory/cpu requests beside the GPU limits."]
    return [f"# {line}" for line in lines]


def out_name_shown(out_name: str) -> str:
    return out_name if _text(out_name) is None else "<this file>"


def render(docs: list[dict], header_lines: list[str]) -> str:
    import yaml

    body = yaml.safe_dump_all(docs, sort_keys=False, default_flow_style=False, width=1000)
    return "\n".join(header_lines) + "\n" + body


def check(job: Job, fmt: str) -> None:
    """Every value that cannot go into the manifest, named; exit 2."""
    bad = problems(job)
    if fmt == "kubeflow":
        bad += trainjob_problems(job)
    if bad:
        raise UserError(f"export --format {fmt}: {len(bad)} value(s) cannot go into the manifest", bad)
