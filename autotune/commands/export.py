"""`python -m autotune export --format deepspeed|accelerate|torchrun`: the plan in other tools' words."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

HELP = ("write the plan as a DeepSpeed JSON, an Accelerate config YAML, a torchrun command line, an sbatch "
        "script or a DeepSpeed hostfile")
EPILOG = """examples:
  python -m autotune export --format deepspeed --hardware 4xL4 -o ds.json
  python -m autotune export --format accelerate -o accelerate.yaml
  python -m autotune export --format torchrun --script train.py -- --batch_size {micro_batch_size}
  python -m autotune export --format slurm --num_nodes 2 --hardware 8xA100-40GB --time 12:00:00 -o train.sbatch
  python -m autotune export --format deepspeed-hostfile   # inside a SLURM allocation

--format slurm (or sbatch) writes an sbatch script: one launcher per node (srun --ntasks-per-node=1
--kill-on-bad-exit=1), autotune plans again on each node from the allocation and starts
torchrun with a c10d rendezvous on the first host; the output goes to the run directory
and to slurm-<name>-<id>.out in the submit directory); SIGUSR1 120 s before the time
limit, requeue, resume auto."""


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

    p = sub.add_parser("export", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--format", required=True, choices=["deepspeed", "accelerate", "torchrun", "slurm", "sbatch",
                                                       "deepspeed-hostfile"],
                   help="sbatch is another name of slurm (an sbatch script)")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (refuses to overwrite)")
    p.add_argument("--overwrite", action="store_true", help="allow --output to overwrite an existing file")
    p.add_argument("--script", default="train.py",
                   help="training script for the torchrun and accelerate launch lines (default: train.py)")
    s = p.add_argument_group("--format slurm")
    s.add_argument("--run_dir", metavar="DIR", help="run directory of the job (default: runs/slurm-<job name>)")
    s.add_argument("--time", default="24:00:00", metavar="HH:MM:SS", help="time limit (default 24:00:00)")
    s.add_argument("--partition", metavar="NAME", help="SLURM partition")
    s.add_argument("--account", metavar="NAME", help="SLURM account")
    s.add_argument("--job_name", default="autotune", metavar="NAME", help="job name (default autotune)")
    p.add_argument("script_args", nargs=argparse.REMAINDER, help="after `--`: the training script's arguments "
                   "({placeholders} expanded for torchrun, kept for slurm where each node expands them)")
    add_plan_args(p)
    p.set_defaults(func=run)


def _sbatch(args, plan, hw, script_args: list[str]) -> str:
    import re
    from pathlib import Path

    from autotune.commands.common import plan_flags_argv
    from autotune.errors import UserError
    from autotune.exports.tools import sbatch_script

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

    from autotune.exports.script_args import expand, placeholder_values, used_placeholders
    from autotune.exports.tools import accelerate_config, accelerate_launch_env, accelerate_launch_line
    from autotune.exports.wiring import FLAGS, withhold_accumulation
    from autotune.prepare import script_facts

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


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.commands.common import plan_from_args
    from autotune.errors import UserError
    from autotune.exports.deepspeed import deepspeed_config
    from autotune.exports.tools import torchrun_command

    if args.format == "sbatch":  # the help says "an sbatch script": the name users reach for
        args.format = "slurm"
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

        from autotune.exports.tools import deepspeed_hostfile
        from autotune.hardware.slurm import allocation

        alloc = allocation(os.environ)
        text = deepspeed_hostfile(plan, alloc.hosts if alloc else (hw.slurm.hosts if hw.slurm else ()))
    else:
        text = _sbatch(args, plan, hw, raw)
    if args.output:
        _write_output(Path(args.output), text, args.overwrite)
    else:
        sys.stdout.write(text)
    return 0
