"""`python -m autotune export --format deepspeed|accelerate|torchrun`: the plan in other tools' words."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

HELP = ("write the plan as a DeepSpeed JSON, an Accelerate config YAML, a torchrun command line, an sbatch "
        "script, a DeepSpeed hostfile or a Kubernetes TrainJob / PyTorchJob")
EPILOG = """examples:
  python -m autotune export --format deepspeed --hardware 4xL4 -o ds.json
  python -m autotune export --format accelerate -o accelerate.yaml
  python -m autotune export --format torchrun --script train.py -- --batch_size {micro_batch_size}
  python -m autotune export --format slurm --num_nodes 2 --hardware 8xA100-40GB --time 12:00:00 -o train.sbatch
  python -m autotune export --format deepspeed-hostfile   # inside a SLURM allocation
  python -m autotune export --format kubeflow --hardware 2x4xL4 --image registry.example.com/train:1 -o job.yaml

--format slurm (or sbatch) writes an sbatch script: one launcher per node (srun --ntasks-per-node=1
--kill-on-bad-exit=1), autotune plans again on each node from the allocation and starts
torchrun with a c10d rendezvous on the first host; the output goes to the run directory
and to slurm-<name>-<id>.out in the submit directory); SIGUSR1 120 s before the time
limit, requeue, resume auto.

--format kubeflow writes a Kubeflow Trainer v2 TrainJob (with its TrainingRuntime and a ReadWriteMany
PersistentVolumeClaim for the run directory), --format pytorchjob a v1 PyTorchJob: every pod runs the
launcher, reads its node rank and master from the operator's PET_* variables and plans for its own node;
exit 75 (preempted, checkpoint saved) restarts the job, which resumes; exit 2 and 3 stop it. The header
says how to apply it (docs/kubernetes.md)."""


def _write_output(out, text: str, overwrite: bool) -> None:
    """Write ``text`` to ``out`` whole or not at all: never into a directory, never over a file
    unless asked, never a half-written file (temporary file, then rename)."""
    import errno

    from autotune.errors import UserError
    from autotune.rundir.fs import fs_error

    if out.is_dir():
        raise UserError(f"--output: {out} is a directory; give a file name inside it, e.g. {out / 'plan.out'}")
    if not out.parent.is_dir():
        raise UserError(f"--output: the directory {out.parent} does not exist; create it first or choose another path")
    if out.exists() and not out.is_file():
        raise UserError(f"--output: {out} is not a regular file; choose a file path")
    if out.exists() and not overwrite:
        raise UserError(f"--output: {out} exists; add --overwrite to replace it")
    tmp = out.with_name(f".{out.name}.autotune-tmp")
    try:
        tmp.write_text(text)
        tmp.replace(out)
    except OSError as e:
        try:
            tmp.unlink()
        except OSError:
            pass
        if e.errno == errno.EISDIR:
            raise UserError(f"--output: {out} is a directory") from None
        raise fs_error(e, out, what="--output") from None
    print(f"wrote {out}", file=sys.stderr)


def add_parser(sub) -> None:
    from autotune.commands.common import add_plan_args
    from autotune.rundir.layout import JOB_SECRET_ENV

    p = sub.add_parser("export", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", required=True, choices=["deepspeed", "accelerate", "torchrun", "slurm", "sbatch",
                                                       "deepspeed-hostfile", "kubeflow", "pytorchjob"],
                   help="sbatch is another name of slurm (an sbatch script)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (refuses to overwrite)")
    p.add_argument("--overwrite", action="store_true", help="allow --output to overwrite an existing file")
    p.add_argument("--script", default="train.py",
                   help="training script for the torchrun and accelerate launch lines (default: train.py)")
    s = p.add_argument_group("--format slurm")
    s.add_argument("--run_dir", metavar="DIR", help="run directory of the job (default: runs/slurm-<job name>; "
                   "kubeflow/pytorchjob: /autotune/runs/<job name>, the claim mounted at its parent)")
    s.add_argument("--time", default="24:00:00", metavar="HH:MM:SS", help="time limit (default 24:00:00)")
    s.add_argument("--partition", metavar="NAME", help="SLURM partition")
    s.add_argument("--account", metavar="NAME", help="SLURM account")
    s.add_argument("--job_name", default="autotune", metavar="NAME", help="job name (default autotune)")
    k = p.add_argument_group("--format kubeflow / pytorchjob")
    k.add_argument("--image", metavar="REF", help="container image with autotune and torch (required), e.g. "
                   "registry.example.com/team/train:1.0")
    k.add_argument("--namespace", metavar="NAME", help="Kubernetes namespace (default: kubectl's current one)")
    k.add_argument("--pvc", metavar="NAME", help="PersistentVolumeClaim for the run directory (default "
                   "<job name>-runs)")
    k.add_argument("--storage", default="100Gi", metavar="SIZE", help="its size (default 100Gi)")
    k.add_argument("--storage_class", metavar="NAME", help="its storage class (one that offers ReadWriteMany)")
    k.add_argument("--secret", metavar="NAME", help=f"Secret holding {JOB_SECRET_ENV} (default <job name>-secret)")
    k.add_argument("--job_restarts", type=int, default=3, metavar="N", help="kubeflow: restarts of the whole job "
                   "after a failure other than preemption (default 3; preemptions do not count)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="after `--`: the training script's arguments "
                   "({placeholders} expanded for torchrun, kept for slurm where each node expands them)")
    add_plan_args(p)
    p.set_defaults(func=run)


def _sbatch(args, plan, hw, script_args: list[str]) -> str:
    import re
    from pathlib import Path

    from autotune.commands.common import plan_flags_argv
    from autotune.errors import UserError
    from autotune.exports.launchers import sbatch_script

    if not re.fullmatch(r"\d+(-\d+)?(:\d\d){0,2}", args.time):
        raise UserError(f"--time: SLURM time limits look like 12:00:00, 1-00:00:00 or 90, got {args.time!r}")
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", args.job_name):
        raise UserError(f"--job_name: letters, digits, '_', '.', '-' only, got {args.job_name!r}")
    root = Path(__file__).resolve().parent.parent.parent
    run_dir = Path(args.run_dir or f"runs/slurm-{args.job_name}").absolute()

    def here(p: Path) -> str:  # relative to the submit directory when inside it: the script stays portable
        p = p.absolute()
        try:
            rel = p.relative_to(Path.cwd())
        except ValueError:
            return str(p)
        return str(rel) if str(rel).startswith(".") or "/" in str(rel) else f"./{rel}"

    return sbatch_script(plan, launcher=here(root / "launch_distributed_training.sh"),
                         config=here(Path(args.config)), run_dir=here(run_dir),
                         cpus_per_task=hw.cpu.effective_cores, time_limit=args.time, partition=args.partition,
                         account=args.account, job_name=args.job_name, script_args=script_args,
                         plan_flags=plan_flags_argv(args, skip=("hardware", "config")))


ACCUMULATION_VARIABLE = "ACCELERATE_GRADIENT_ACCUMULATION_STEPS"


def _accelerate(args, plan, raw: list[str]) -> str:
    """The Accelerate config and the line that starts it. The script is scanned as the launcher scans it: the
    plan's accumulation is set only for a script that also gets the plan's micro-batch (a {micro_batch_size}
    placeholder after `--`), else the script's own batch times the plan's accumulation would train another
    effective batch; withheld, the output says so and how to pair them."""
    import yaml

    from autotune.exports.launchers import accelerate_config, accelerate_launch_env, accelerate_launch_line
    from autotune.exports.script_args import expand, placeholder_values, used_placeholders
    from autotune.exports.script_scan import script_facts
    from autotune.exports.wiring import FLAGS, withhold_accumulation

    cfg = accelerate_config(plan)  # refuses what Accelerate cannot run before anything is scanned
    raw = [*plan.run.script_args, *raw]
    script_args = expand(raw, placeholder_values(plan, None, None), where="export --format accelerate")
    facts = script_facts(args.script)
    paired = "micro_batch_size" in used_placeholders(raw)
    why = withhold_accumulation(facts, {"micro_batch_size": ["placeholder"] if paired else []}) \
        if ACCUMULATION_VARIABLE in accelerate_launch_env(plan) else None
    withhold = (ACCUMULATION_VARIABLE,) if why else ()
    line = accelerate_launch_line(plan, args.output or "accelerate.yaml", args.script, script_args=script_args,
                                  withhold=withhold)
    b = plan.batch
    accumulation = f"gradient accumulation {b.gradient_accumulation_steps}" + (" (not set: below)" if why else "")
    notes = [f"{plan.engine.world_size} process(es), micro-batch {b.micro_batch_size} per process (your script's "
             f"batch size), {accumulation}; start them with:", f"  {line}"]
    carried = {"ACCELERATE_USE_CPU": "the CPU switch for several CPU processes",
               ACCUMULATION_VARIABLE: "gradient accumulation outside DeepSpeed"}
    kept = [carried[k] for k in accelerate_launch_env(plan) if k not in withhold]
    if kept:
        notes.append(f"(the variables carry what an Accelerate config file cannot: {', '.join(kept)})")
    warned = []
    if why and "gradient_accumulation_steps" in facts.accelerator_kwargs:  # the script's own accumulation
        warned.append(f"{ACCUMULATION_VARIABLE} is not set for {args.script}: {why}")
    elif why:
        flag = next((f for f in FLAGS["micro_batch_size"] if facts is not None and f in facts.flags), None)
        how = f"pass {flag or 'its batch-size flag'} {{micro_batch_size}} after `--` to deliver both"
        warned.append(f"{ACCUMULATION_VARIABLE} is not set for {args.script}: {why.removesuffix(': not exported')}; "
                      f"it trains its own batch size x {plan.engine.world_size} process(es), no accumulation ({how})")
    elif facts is not None and facts.error and ACCUMULATION_VARIABLE in accelerate_launch_env(plan):
        warned.append(f"{args.script} was not scanned ({facts.error}): {ACCUMULATION_VARIABLE} assumes the script "
                      "trains the plan's micro-batch")
    for note in warned:
        print(f"note: {note}", file=sys.stderr)
    print(f"start with: {line}", file=sys.stderr)
    return "".join(f"# {n}\n" for n in notes + warned) + yaml.safe_dump(cfg, sort_keys=False)


def _kubernetes_flags(args) -> None:
    """Before planning: flags a pod takes from the operator, and the image, which has no default."""
    from autotune.errors import UserError

    fmt = args.format
    flags = [f"--{f}" for f in ("node_rank", "master_addr") if getattr(args, f) is not None]
    if fmt == "kubeflow" and args.master_port is not None:
        flags.append("--master_port")
    if flags:
        raise UserError(f"{', '.join(flags)}: every pod takes its rank and master from the operator's variables "
                        "(PET_NODE_RANK, PET_MASTER_ADDR, PET_MASTER_PORT); drop the flag(s)")
    if args.no_auto_optimize:
        raise UserError("--no_auto_optimize: it takes node rank and master from the config alone, so every pod "
                        "would train by itself; drop it (your config's values and flags still win)")
    if not args.image:
        raise UserError(f"--image: required for --format {fmt}: the container image every pod runs (with autotune "
                        "and torch), e.g. --image registry.example.com/team/train:1.0")
    if not 0 <= args.job_restarts <= 10_000:
        raise UserError(f"--job_restarts: a number from 0 to 10000, got {args.job_restarts}")


def _kubernetes(args, plan, raw: list[str]) -> str:
    """The TrainJob (kubeflow) or PyTorchJob (pytorchjob) manifests: the launcher with the plan's flags and
    no node flags in every pod; every value checked (exports.kubernetes.problems)."""
    from autotune.commands.common import DEFAULT_CONFIG, plan_flags_argv
    from autotune.exports import kubernetes as k8s

    fmt, name = args.format, args.job_name
    config = None if args.config == str(DEFAULT_CONFIG) else args.config  # the image's default otherwise
    run_dir = args.run_dir or f"/autotune/runs/{name}"
    command = k8s.launcher_command(config, plan_flags_argv(args, skip=("hardware", "config", "num_nodes", "node_rank",
                                                                          "master_addr", "master_port")),
                                   run_dir, raw)
    job = k8s.Job(name=name, image=args.image, command=tuple(command), run_dir=run_dir,
                  pvc=args.pvc or f"{name}-runs", storage=args.storage, secret=args.secret or f"{name}-secret",
                  namespace=args.namespace, storage_class=args.storage_class, job_restarts=args.job_restarts)
    docs = k8s.manifests(plan, job, fmt, cpu_on_purpose=args.num_gpus == 0)
    if k8s.unpinned(args.image):
        print(f"warning: --image {args.image} has no tag or digest: a restarted pod may pull another image than "
              "the one that wrote the checkpoint; pin a tag or @sha256 digest", file=sys.stderr)
    kind = "TrainJob" if fmt == "kubeflow" else "PyTorchJob"
    out_name = args.output or f"{name}.yaml"
    return k8s.render(docs, k8s.header(plan, job, kind, out_name, config))


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.commands.common import plan_from_args
    from autotune.errors import UserError
    from autotune.exports.deepspeed import deepspeed_config
    from autotune.exports.launchers import torchrun_command

    if args.format == "sbatch":  # the help says "an sbatch script": the name users reach for
        args.format = "slurm"
    if args.format in ("kubeflow", "pytorchjob"):
        _kubernetes_flags(args)
    plan, hw, ds = plan_from_args(args)
    raw = list(args.script_args or [])
    if raw and raw[0] == "--":
        raw = raw[1:]
    elif raw:
        raise UserError(f"unrecognised arguments: {' '.join(raw)} (put script arguments after `--`)")
    if args.format == "deepspeed":
        text = json.dumps(ds if ds is not None else deepspeed_config(plan), indent=2) + "\n"
    elif args.format == "accelerate":
        text = _accelerate(args, plan, raw)
    elif args.format == "torchrun":
        from autotune.exports.script_args import expand, placeholder_values

        script_args = expand(raw, placeholder_values(plan, None, None), where="export --format torchrun")
        text = shlex.join([*torchrun_command(plan, args.script), *script_args]) + "\n"
    elif args.format == "deepspeed-hostfile":
        import os

        from autotune.exports.launchers import deepspeed_hostfile
        from autotune.hardware.slurm import allocation

        alloc = allocation(os.environ)
        text = deepspeed_hostfile(plan, alloc.hosts if alloc else (hw.slurm.hosts if hw.slurm else ()))
    elif args.format in ("kubeflow", "pytorchjob"):
        text = _kubernetes(args, plan, raw)
    else:
        text = _sbatch(args, plan, hw, raw)
    if args.output:
        _write_output(Path(args.output), text, args.overwrite)
    else:
        sys.stdout.write(text)
    return 0
