"""`python -m autotune export --format deepspeed|accelerate|torchrun`: the plan in other tools' words."""

from __future__ import annotations

import argparse
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
PersistentVolumeClaim for the run directory; with --runtime NAME the TrainJob runs on that installed
ClusterTrainingRuntime instead), --format pytorchjob a v1 PyTorchJob: every pod runs the launcher, reads
its node rank and master from the operator's PET_* variables and plans for its own node; exit 75
(preempted, checkpoint saved) and 69 (a peer not there in time) restart the job, which resumes; exit 2 and
3 stop it. --format kubeflow-runtime writes the ClusterTrainingRuntime with that failure policy, for an
admin to install once. The header says how to apply it (docs/kubernetes.md)."""


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
    from autotune.commands.common import add_plan_args, path_of
    from autotune.exports.formats import FORMATS
    from autotune.rundir.layout import JOB_SECRET_ENV

    p = sub.add_parser("export", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", required=True, choices=list(FORMATS),
                   help="sbatch is another name of slurm (an sbatch script)")
    p.add_argument("-o", "--output", metavar="FILE", type=path_of("a file's path"),
                   help="write here instead of stdout (refuses to overwrite)")
    p.add_argument("--overwrite", action="store_true", help="allow --output to overwrite an existing file")
    p.add_argument("--script", type=path_of("your script's path"),
                   help="training script for the torchrun and accelerate launch lines (default: the "
                   "config's training.entrypoint, else train.py)")
    s = p.add_argument_group("--format slurm")
    s.add_argument("--run_dir", metavar="DIR", type=path_of("a directory"),
                   help="run directory of the job (default: runs/slurm-<job name>; "
                   "kubeflow/pytorchjob: /autotune/runs/<job name>, the claim mounted at its parent; torchrun "
                   "without --script: where the plan its line reads is written, default runs/export-torchrun-<id>, a "
                   "new one each time)")
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
    k.add_argument("--job_restarts", type=int, default=3, metavar="N", help="kubeflow, kubeflow-runtime, slurm: "
                   "restarts of the whole job after a failure other than preemption (default 3). A preemption is "
                   "always restarted; it does not count in a Kubernetes job, while an sbatch script's limit reads "
                   "SLURM_RESTART_COUNT, which counts every requeue, the preemptions' too")
    k.add_argument("--runtime", metavar="NAME", help="kubeflow: run on this installed ClusterTrainingRuntime (e.g. "
                   "torch-distributed, or the one kubeflow-runtime writes) instead of writing a TrainingRuntime; "
                   "kubeflow-runtime: the name of the one written (default autotune-torch)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="after `--`: the training script's arguments "
                   "({placeholders} expanded for torchrun, kept for slurm where each node expands them)")
    add_plan_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.commands.common import DEFAULT_CONFIG, plan_flags_argv, plan_from_args, script_args_of
    from autotune.exports.formats import (
        KUBERNETES,
        REPLANNED,
        ExportRequest,
        canonical_format,
        check_job_flags,
        check_pod_flags,
        export_plan,
    )

    fmt = canonical_format(args.format)
    check_job_flags(fmt, args.runtime, args.job_restarts)
    if fmt in KUBERNETES:
        given = [f"--{f}" for f in ("node_rank", "master_addr") if getattr(args, f) is not None]
        if fmt == "kubeflow" and args.master_port is not None:
            given.append("--master_port")
        check_pod_flags(fmt, given=given, no_auto_optimize=args.no_auto_optimize, image=args.image)
    plan, hw, ds = plan_from_args(args, timed=fmt not in REPLANNED)
    request = ExportRequest(
        format=fmt, script=args.script or _entry_script(plan), script_args=tuple(script_args_of(args.script_args)),
        output=args.output,
        config=args.config, config_is_default=args.config == str(DEFAULT_CONFIG),
        plan_flags=tuple(plan_flags_argv(args, skip=("hardware", "config"))),
        pod_plan_flags=tuple(plan_flags_argv(args, skip=("hardware", "config", "num_nodes", "node_rank",
                                                         "master_addr", "master_port"))),
        run_dir=args.run_dir, time=args.time, partition=args.partition, account=args.account,
        job_name=args.job_name, image=args.image, namespace=args.namespace, pvc=args.pvc, storage=args.storage,
        storage_class=args.storage_class, secret=args.secret, job_restarts=args.job_restarts,
        cpu_on_purpose=args.num_gpus == 0, runtime=args.runtime,
        own_program=args.script is None and not (plan.run.entrypoint or "").endswith(".py"))
    exported = export_plan(request, plan, hw, ds)
    if exported.records:  # the plan the line reads, written whole as a launch writes it (never through a link)
        from autotune.exports.deepspeed import framework_flavour
        from autotune.rundir.records import write_records

        write_records(Path(exported.records), plan, hw, ds, ds_framework=None if ds is None else framework_flavour(ds))
    for line in exported.messages:
        print(line, file=sys.stderr)
    if args.output:
        _write_output(Path(args.output), exported.text, args.overwrite)
    else:
        sys.stdout.write(exported.text)
    return 0


def _entry_script(plan) -> str:
    """The script the launch lines start: the config's entrypoint when it is a script (issue 42: they printed
    train.py whatever the config said), else train.py."""
    entry = plan.run.entrypoint
    return entry if entry and entry.endswith(".py") else "train.py"
