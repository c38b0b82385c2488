"""``export_plan``: one plan in the format asked for (DeepSpeed JSON, Accelerate YAML, torchrun line, sbatch
script, DeepSpeed hostfile, Kubernetes manifests, the Trainer's cluster runtime), and the notes to say beside
it. The command parses the flags into an ``ExportRequest`` and writes what comes back; the flags a format
reads are named here."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from autotune.errors import UserError
from autotune.redaction import redact_args, secret_flags, where_secrets_belong
from autotune.rundir.layout import JOB_SECRET_ENV
from autotune.safe_input import shell_line, shell_word

if TYPE_CHECKING:  # the command's parser reads FORMATS: it imports no model
    from autotune.plan import TrainingPlan
    from autotune.profiles import HardwareProfile

FORMATS = ("deepspeed", "accelerate", "torchrun", "slurm", "sbatch", "deepspeed-hostfile", "kubeflow", "pytorchjob",
           "kubeflow-runtime")
KUBERNETES = ("kubeflow", "pytorchjob")  # pod manifests; kubeflow-runtime is the admin's runtime, no pod of a plan
# jobs whose every node plans again where it runs (the sbatch script, the pods; the admin's runtime holds no plan): the
# plan made here decides no engine or batch of theirs, so nothing is timed for them (exports.formats; commands.export)
REPLANNED = ("slurm", *KUBERNETES, "kubeflow-runtime")
ACCUMULATION_VARIABLE = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"
ROOT = Path(__file__).resolve().parent.parent.parent  # the launcher's folder


@dataclass(frozen=True)
class ExportRequest:
    """What the flags ask for. ``plan_flags``: the user's plan flags as argv again (sbatch: every node plans
    again with them); ``pod_plan_flags``: the same without node flags (a pod takes those from the operator);
    ``config``: None when it is the default (a pod then uses its image's)."""

    format: str
    script: str
    script_args: tuple[str, ...]
    output: str | None = None
    config: str = ""
    config_is_default: bool = True
    plan_flags: tuple[str, ...] = ()
    pod_plan_flags: tuple[str, ...] = ()
    run_dir: str | None = None
    time: str = "24:00:00"
    partition: str | None = None
    account: str | None = None
    job_name: str = "autotune"
    image: str | None = None
    namespace: str | None = None
    pvc: str | None = None
    storage: str = "100Gi"
    storage_class: str | None = None
    secret: str | None = None
    job_restarts: int = 3
    cpu_on_purpose: bool = False
    runtime: str | None = None
    # no --script and no script in the config: the plan runs autotune's own program (the built-in workload, or your
    # module:function through autotune.entry)
    own_program: bool = False


@dataclass(frozen=True)
class Exported:
    """The export's text, and the lines to say on stderr before it is written."""

    text: str
    messages: tuple[str, ...] = ()
    records: str | None = None  # a folder the command writes the plan's records into (the line's AUTOTUNE_PLAN)


def canonical_format(fmt: str) -> str:
    return "slurm" if fmt == "sbatch" else fmt  # the help says "an sbatch script": the name users reach for


def check_job_flags(fmt: str, runtime: str | None, job_restarts: int) -> None:
    """``--runtime`` names a ClusterTrainingRuntime: the one a TrainJob runs on, or the one written;
    ``--job_restarts`` bounds the restarts that count (TrainJob, the cluster runtime, the sbatch requeues)."""
    if not 0 <= job_restarts <= 10_000:
        raise UserError(f"--job_restarts: a number from 0 to 10000, got {job_restarts}")
    if runtime is not None and fmt not in ("kubeflow", "kubeflow-runtime"):
        raise UserError(f"--runtime: only for --format kubeflow (the installed ClusterTrainingRuntime the TrainJob "
                        f"runs on) or kubeflow-runtime (the name of the one written); drop it for --format {fmt}")


def check_pod_flags(fmt: str, *, given: list[str], no_auto_optimize: bool, image: str | None) -> None:
    """Before planning: flags a pod takes from the operator (``given``: the node flags the user passed), and
    the image, which has no default."""
    if given:
        raise UserError(f"{', '.join(given)}: every pod takes its rank and master from the operator's variables "
                        "(PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT); drop the flag(s)")
    if no_auto_optimize:
        raise UserError("--no_auto_optimize: it takes node rank and master from the config alone, so every pod "
                        "would train by itself; drop it (your config's values and flags still win)")
    if not image:
        raise UserError(f"--image: required for --format {fmt}: the container image every pod runs (with autotune "
                        "and torch), e.g. --image registry.example.com/team/train:1.0")


def _refuse_secrets(req: ExportRequest, where: str, instead: str) -> None:
    """A file applied, kept and shared (a manifest, a batch script) never carries a secret script argument: refused
    by its flag (exit 2), never printed (autotune.redaction: by name and by value)."""
    flags = secret_flags(list(req.script_args))
    if flags:
        raise UserError(f"export --format {req.format}: script arguments carry a secret ({', '.join(flags)}), which "
                        f"{where} would hold in clear", [f"give it to the script through its environment instead: "
                                                         f"{instead}, e.g. HF_TOKEN or WANDB_API_KEY",
                                                         where_secrets_belong(JOB_SECRET_ENV),
                                                         "if a value named here is no secret (a checksum, a run "
                                                         "name), say so: --not_secret NAME, the flag or key named "
                                                         "without its dashes (--not_secret run_name), or "
                                                         "--not_secret=VALUE for a positional one"])


def _sbatch(req: ExportRequest, plan: TrainingPlan, hw: HardwareProfile) -> str:
    from autotune.exports.launchers import sbatch_script
    from autotune.exports.script_resume import why_no_resume

    _refuse_secrets(req, "the batch script", "a variable exported where you submit it (sbatch passes your "
                    "environment on)")
    run_dir = Path(req.run_dir or f"runs/slurm-{req.job_name}").absolute()

    def here(p: Path) -> str:  # relative to the submit directory when inside it: the script stays portable
        p = p.absolute()
        try:
            rel = p.relative_to(Path.cwd())
        except ValueError:
            return str(p)
        return str(rel) if str(rel).startswith(".") or "/" in str(rel) else f"./{rel}"

    return sbatch_script(plan, launcher=here(ROOT / "launch_distributed_training.sh"),
                         config=here(Path(req.config)), run_dir=here(run_dir),
                         cpus_per_task=hw.cpu.effective_cores, time_limit=req.time, partition=req.partition,
                         account=req.account, job_name=req.job_name, script_args=list(req.script_args),
                         plan_flags=list(req.plan_flags), requeues=req.job_restarts,
                         no_resume=why_no_resume(plan.run.entrypoint, [*plan.run.script_args, *req.script_args],
                                                 _wires(req.plan_flags, req)))


def _wires(flags, req: ExportRequest) -> bool:
    """--wire auto among the plan flags (the batch script's launcher passes it to every node), or the config's
    training.wire: auto, which every node's launcher reads from the same config."""
    from autotune.config import load_config

    flags = list(flags)
    if "--wire=auto" in flags or any(a == "--wire" and flags[i + 1:i + 2] == ["auto"] for i, a in enumerate(flags)):
        return True
    return bool(req.config) and load_config(req.config).training.wire == "auto"


def clipping_note(plan: TrainingPlan) -> str:
    """What the DeepSpeed section's gradient_clipping means, in the plan's words (under DeepSpeed, Accelerate's
    ``clip_grad_norm_`` clips nothing itself: the file's value is all the clipping there is)."""
    from autotune.exports.deepspeed import deepspeed_clipping

    clip = deepspeed_clipping(plan)
    if "gradient_clipping" in plan.run.script_defaults:
        return ("gradient_clipping 0.0: training.gradient_clipping is not set, so DeepSpeed does not clip (under "
                "DeepSpeed, accelerator.clip_grad_norm_ clips nothing; set training.gradient_clipping to clip)")
    if clip:
        return f"gradient_clipping {clip:g}: the plan's (training.gradient_clipping); DeepSpeed clips at {clip:g}"
    return "gradient_clipping 0.0: training.gradient_clipping is null, so DeepSpeed does not clip"


def _accelerate_warnings(req: ExportRequest, plan: TrainingPlan, facts, why: str | None) -> list[str]:
    """The notes beside an Accelerate export: the program it does not start, the accumulation withheld and why."""
    from autotune.exports.launchers import accelerate_launch_env
    from autotune.exports.script_scan import FLAGS

    warned = []
    if req.own_program:  # no script of yours to start: say so rather than start a train.py that is not there
        runs = ("the built-in workload (python -m autotune.train)" if plan.run.entrypoint is None
                else f"your {plan.run.entrypoint} (through autotune.entry)")
        warned.append(f"the plan runs {runs}, which is not an Accelerate script, and the line starts "
                      f"{req.script}: give your Accelerate script with "
                      "--script, or start the plan with `export --format torchrun` (its line starts it) or "
                      "`python -m autotune launch`")
    what = ("the DeepSpeed section's gradient_accumulation_steps is" if plan.is_deepspeed
            else f"{ACCUMULATION_VARIABLE} is")
    if why and "gradient_accumulation_steps" in facts.accelerator_kwargs:  # the script's own accumulation
        warned.append(f"{what} not set for {req.script}: {why}")
    elif why:
        flag = next((f for f in FLAGS["micro_batch_size"] if facts is not None and f in facts.flags), None)
        how = (f"pass {flag} {{micro_batch_size}} after `--` to deliver both" if flag else
               "no batch-size flag of the script is known: give it the plan's micro-batch where it reads its batch "
               "size, e.g. as a {micro_batch_size} placeholder after `--`, to deliver both")
        warned.append(f"{what} not set for {req.script}: {why.removesuffix(': not exported')}; it trains its own "
                      f"batch size x {plan.engine.world_size} process(es), no accumulation ({how})")
    elif facts is not None and facts.error and (ACCUMULATION_VARIABLE in accelerate_launch_env(plan)
                                                 or plan.is_deepspeed):
        warned.append(f"{req.script} was not scanned ({facts.error}): the plan's accumulation assumes the script "
                      "trains the plan's micro-batch")
    return warned


def _accelerate(req
: ExportRequest, plan: TrainingPlan) -> Exported:
    """The Accelerate config and the line that starts it. The script is scanned as the launcher scans it: the
    plan's accumulation is set only for a script that also gets the plan's micro-batch (a {micro_batch_size}
    placeholder after `--`), else the script's own batch times the plan's accumulation would train another
    effective batch; withheld, the output says so and how to pair them."""
    import yaml

    from autotune.exports.launchers import accelerate_config, accelerate_launch_env, accelerate_launch_line
    from autotune.exports.script_args import expand, placeholder_values, used_placeholders
    from autotune.exports.script_scan import script_facts
    from autotune.exports.withheld import withhold_accumulation

    accelerate_config(plan)  # refuses what Accelerate cannot run before anything is scanned
    raw = [*plan.run.script_args, *req.script_args]
    script_args = expand(raw, placeholder_values(plan, None, None), where="export --format accelerate")
    facts = script_facts(req.script)
    paired = "micro_batch_size" in used_placeholders(raw)
    # the plan's accumulation, by the variable (DDP, FSDP) or by the file's DeepSpeed section: withheld alike from a
    # script that sets its own or does not get the plan's micro-batch (a number in the file beats Accelerator()'s)
    own = facts is not None and "gradient_accumulation_steps" in facts.accelerator_kwargs
    accumulates = ACCUMULATION_VARIABLE in accelerate_launch_env(plan) or (
        plan.is_deepspeed and (plan.batch.gradient_accumulation_steps > 1 or own))
    why = withhold_accumulation(facts, {"micro_batch_size": ["placeholder"] if paired else []}) \
        if accumulates else None
    cfg = accelerate_config(plan, accumulation=not why)
    withhold = (ACCUMULATION_VARIABLE,) if why else ()
    shown = redact_args(script_args)  # printed and written: a secret argument's value is the user's to give again
    line = accelerate_launch_line(plan, req.output or "accelerate.yaml", req.script, script_args=shown,
                                  withhold=withhold)
    if shown != script_args:
        line += "   # <redacted>: your secret values, never written here"
    b = plan.batch
    accumulation = f"gradient accumulation {b.gradient_accumulation_steps}" + (" (not set: below)" if why else "")
    notes = [f"{plan.engine.world_size} process(es), micro-batch {b.micro_batch_size} per process (your script's "
             f"batch size), {accumulation}; start them with:", f"  {line}"]
    if plan.is_deepspeed:
        notes.append(clipping_note(plan))
    carried = {"ACCELERATE_USE_CPU": "the CPU switch for several CPU processes",
               ACCUMULATION_VARIABLE: "gradient accumulation outside DeepSpeed"}
    kept = [carried[k] for k in accelerate_launch_env(plan) if k not in withhold]
    if kept:
        notes.append(f"(the variables carry what an Accelerate config file cannot: {', '.join(kept)})")
    warned = _accelerate_warnings(req, plan, facts, why)
    messages = (*(f"note: {note}" for note in warned), f"start with: {line}")
    return Exported("".join(f"# {n}\n" for n in notes + warned) + yaml.safe_dump(cfg, sort_keys=False), messages)


def _kubernetes(req: ExportRequest, plan: TrainingPlan) -> Exported:
    """The TrainJob (kubeflow) or PyTorchJob (pytorchjob) manifests: the launcher with the plan's flags and
    no node flags in every pod; every value checked (exports.kubernetes.problems, the CRDs' limits)."""
    from autotune.exports import kubernetes as k8s
    from autotune.exports import trainjob

    fmt, name = req.format, req.job_name
    _refuse_secrets(req, "the manifest", "a key of a Kubernetes Secret (as the job secret is) that the script reads")
    config = None if req.config_is_default else req.config  # the image's default otherwise
    run_dir = req.run_dir or f"/autotune/runs/{name}"
    from autotune.exports.script_resume import why_no_resume

    no_resume = why_no_resume(plan.run.entrypoint, [*plan.run.script_args, *req.script_args],
                              _wires(req.pod_plan_flags, req))
    command = k8s.launcher_command(config, list(req.pod_plan_flags), run_dir, list(req.script_args),
                                   resumes=no_resume is None)
    job = k8s.Job(name=name, image=req.image, command=tuple(command), run_dir=run_dir,
                  pvc=req.pvc or f"{name}-runs", storage=req.storage, secret=req.secret or f"{name}-secret",
                  namespace=req.namespace, storage_class=req.storage_class, job_restarts=req.job_restarts,
                  runtime=req.runtime)
    k8s.check(job, fmt)
    docs = trainjob.trainjob(plan, job) if fmt == "kubeflow" else k8s.pytorchjob(plan, job)
    k8s.check_gpus(plan, docs, req.cpu_on_purpose)
    messages: tuple[str, ...] = ()
    if no_resume is not None:  # a restarted pod starts over: said, never claimed
        messages = (f"note: no --resume_from auto in the pods' command: {no_resume}",)
    if k8s.unpinned(req.image):
        messages += (f"warning: --image {req.image} has no tag or digest: a restarted pod may pull another image "
                    "than the one that wrote the checkpoint; pin a tag or @sha256 digest",)
    out_name = req.output or f"{name}.yaml"
    head = trainjob.header(plan, job, out_name) if fmt == "kubeflow" else k8s.pytorchjob_header(plan, job, out_name)
    return Exported(k8s.render(docs, head), messages)


def _cluster_runtime(req: ExportRequest, plan: TrainingPlan) -> Exported:
    """The ClusterTrainingRuntime with autotune's failure policy, for an admin to install once."""
    from autotune.exports import kubernetes as k8s
    from autotune.exports import trainjob

    name = req.runtime or trainjob.CLUSTER_RUNTIME
    bad = [f"{flag}: {why}" for flag, why in (("--runtime", k8s.runtime_name_problem(name)),
                                              ("--image", req.image and k8s.image_problem(req.image))) if why]
    if bad:
        raise UserError(f"export --format kubeflow-runtime: {len(bad)} value(s) cannot go into the manifest", bad)
    grace = k8s.grace_s(plan)
    doc = trainjob.cluster_runtime(name, req.job_restarts, grace, req.image)
    head = trainjob.cluster_runtime_header(name, req.job_restarts, grace, req.output or f"{name}.yaml")
    return Exported(k8s.render([doc], head))


def _torchrun(req: ExportRequest, plan: TrainingPlan) -> Exported:
    """The torchrun line. A plan that runs autotune's own program (``req.own_program``): the line starts that program
    (``--module autotune.train``, or ``autotune.entry`` for your module:function) with the plan's threads and
    AUTOTUNE_PLAN naming the plan it reads, which the command writes into a run directory (``--run_dir``, default
    runs/export-torchrun-<its own id>: plan.json, and DeepSpeed's JSON beside it for a DeepSpeed plan). Your
    script: the line starts it with your arguments ({placeholders} expanded); what the line does not carry is said
    on stderr."""
    from autotune.exports.launch_spec import torchrun_flags
    from autotune.exports.script_args import expand, placeholder_values
    from autotune.rundir.layout import PLAN, PLAN_ENV, new_run_dir_name, records_dir

    script_args = expand(list(req.script_args), placeholder_values(plan, None, None), where="export --format torchrun")
    shown = redact_args(script_args)  # printed: a secret argument's value is the user's to give again
    secret = "# <redacted>: your secret values, never written here\n" if shown != script_args else ""
    e, b = plan.engine, plan.batch
    what = (f"{e.backend} x{e.world_size} on {e.device}, micro-batch {b.micro_batch_size} x accumulation "
            f"{b.gradient_accumulation_steps} x {e.world_size} = {b.global_batch_size}, {plan.numerics.precision}")
    if not req.own_program:
        deepspeed = (", nor its DeepSpeed JSON (`export --format deepspeed -o ds_config.json`, for your script to "
                     "read)") if plan.is_deepspeed else ""
        return Exported(shell_line(["torchrun", *torchrun_flags(plan), req.script, *shown]) + "\n" + secret, (
            f"note: this line starts {req.script} as the plan's {e.world_size} process(es) ({what}); it carries no "
            f"other value of the plan{deepspeed}: give them to your script as {{placeholders}} after `--`"
            f"{_example(req.script)}, or start it with `python -m autotune launch`, which delivers them",))
    if plan.run.entrypoint is None and script_args:
        raise UserError("export --format torchrun: arguments after `--` are your script's, and the plan runs the "
                        "built-in workload (python -m autotune.train), which takes none; name your script with "
                        "--script (or training.entrypoint)")
    # each export its own folder: a second export into one shared folder replaced the plan an earlier printed line
    # starts (and mixed their checkpoints) without a word
    run_dir = req.run_dir or f"runs/export-torchrun-{new_run_dir_name()}"
    plan_path = records_dir(plan, run_dir) / PLAN
    program = ["autotune.entry", *shown] if plan.run.entrypoint else ["autotune.train"]
    env = f"OMP_NUM_THREADS={plan.loader.omp_num_threads} {PLAN_ENV}={shell_word(str(plan_path))} "
    beside = " and DeepSpeed's JSON beside it" if plan.is_deepspeed else ""
    text = (f"# the plan ({what}) is in {plan_path}{beside}, written by this export; the line starts what it runs\n"
            + env + shell_line(["torchrun", *torchrun_flags(plan), "--module", *program]) + "\n" + secret)
    return Exported(text, (f"wrote the plan the line reads: {plan_path}",), records=str(plan_path.parent))


def _example(script: str) -> str:
    """An example placeholder on a batch-size flag the script declares (read from its source), or none: a note never
    names a flag the script lacks."""
    from autotune.exports.script_scan import FLAGS, script_facts

    facts = script_facts(script) if script.endswith(".py") and Path(script).is_file() else None
    flag = next((f for f in FLAGS["micro_batch_size"] if facts is not None and f in facts.flags), None)
    return f" (e.g. {flag} {{micro_batch_size}})" if flag else ""


def export_plan(req: ExportRequest, plan: TrainingPlan, hw: HardwareProfile, ds: dict | None,
                environ=None) -> Exported:
    """The plan in ``req.format``; ``ds``: the DeepSpeed JSON the plan came with, if any. The hostfile's hosts
    are the SLURM allocation's in ``environ`` (default: this process's), else the profile's."""
    fmt = canonical_format(req.format)
    if fmt == "deepspeed":
        from autotune.exports.deepspeed import deepspeed_config

        return Exported(json.dumps(ds if ds is not None else deepspeed_config(plan), indent=2) + "\n")
    if fmt == "accelerate":
        return _accelerate(req, plan)
    if fmt == "torchrun":
        return _torchrun(req, plan)
    if fmt == "deepspeed-hostfile":
        from autotune.exports.launchers import deepspeed_hostfile
        from autotune.hardware.slurm import allocation

        alloc = allocation(os.environ if environ is None else environ)
        return Exported(deepspeed_hostfile(plan, alloc.hosts if alloc else (hw.slurm.hosts if hw.slurm else ())))
    if fmt in KUBERNETES:
        return _kubernetes(req, plan)
    if fmt == "kubeflow-runtime":
        return _cluster_runtime(req, plan)
    return Exported(_sbatch(req, plan, hw))
