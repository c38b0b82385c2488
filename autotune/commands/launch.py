"""`python -m autotune launch` (what launch_distributed_training.sh runs): detect, plan,
write the run directory, start the right engine, train."""

from __future__ import annotations

import argparse
import json
import os
import sys

HELP = "detect the hardware, plan, write the run directory and launch training"
EPILOG = """examples:
  ./launch_distributed_training.sh                               # default workload, this machine
  ./launch_distributed_training.sh --nproc_per_node 2            # CPU: 2 processes, DDP over gloo
  ./launch_distributed_training.sh --deepspeed --nproc_per_node 2 --zero_stage 2
  ./launch_distributed_training.sh --dry-run --hardware 8xH100-80GB
  ./launch_distributed_training.sh --run_dir runs/exp1 --resume_from auto
  ./launch_distributed_training.sh --config my.yaml -- --my-script-flag 1

The run directory (runs/<timestamp>-<id>/ unless --run_dir) gets plan.json,
hardware.json, command.json (argv and the variables autotune set, never secrets),
deepspeed_config.json for DeepSpeed, metrics, TensorBoard events and checkpoints."""


def add_parser(sub) -> None:
    from autotune.commands.common import add_plan_args, path_of
    from autotune.rundir.layout import JOB_SECRET_ENV

    p = sub.add_parser("launch", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print the plan and the launch command and environment; start nothing, write nothing")
    p.add_argument("--run_dir", metavar="DIR", type=path_of("a directory, e.g. runs/exp1"),
                   help="run directory (default: runs/<timestamp>-<id>)")
    p.add_argument("--resume_from", metavar="PATH|auto", type=path_of("a checkpoint's path, or auto"),
                   help="checkpoint directory, or 'auto' for the newest checkpoint in --run_dir "
                        "(or in the newest run under runs/)")
    p.add_argument("--wandb", action="store_true", help="log to Weights & Biases (offline unless WANDB_API_KEY is set)")
    p.add_argument("--force_run_dir", action="store_true",
                   help="write into a --run_dir that is not empty and not an autotune run directory "
                        "(files named like autotune's are replaced; never needed for a new or empty one). --force "
                        "implies it; this flag alone does not also lift the memory refusal")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan and spec as JSON")
    p.add_argument("--wire", choices=["none", "auto"],
                   help="auto: fill your script's own argparse flags (--batch_size, --lr, "
                        "--gradient_accumulation_steps, --deepspeed_config, --bf16, ...) with the plan's values, read "
                        "from its source (never run); flags you pass after `--` win (training.wire)")
    p.add_argument("--no_observe", action="store_true", help="do not observe your script (batch sizes, engine, "
                   "optimizer, precision, samples per step); delivery is then only what was handed over "
                   "(training.observe: false)")
    p.add_argument("--strict", action="store_true", help="stop when your script observably trains another effective "
                   "batch (> 10 %% off the plan), engine or learning rate than the plan (or as separate trainings), "
                   "naming the fix (training.strict); other values that differ are reported, not stopped")
    p.add_argument("--workdir", metavar="DIR", type=path_of("the directory your script starts in"),
                   help="start your script in DIR (training.workdir); its path, the "
                   "config and --run_dir stay relative to where you launch")
    p.add_argument("--trust_checkpoint", action="store_true",
                   help="resume from a checkpoint that has no checksums.json (an older autotune's, or one you copied "
                        "without it); it is still loaded as data only, never as code")
    p.add_argument("--job_secret_file", metavar="FILE", type=path_of("the path of the file holding the secret"),
                   help=f"the nodes' shared secret, the same on every node (default: ${JOB_SECRET_ENV}); the "
                        "multi-node hardware exchange admits only nodes that hold it")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="after `--`: arguments passed to the training script")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autotune.commands.common import overrides_from_args, script_args_of
    from autotune.config import load_config
    from autotune.errors import UserError
    from autotune.launch import checked_setup
    from autotune.prepare import prepare

    script_args = script_args_of(args.script_args)
    if args.hardware and not args.dry_run:
        raise UserError(
            f"--hardware {args.hardware}: a launch runs on this machine, so it plans for the detected hardware; "
            "use --hardware with --dry-run (or `autotune plan`) to look at other machines"
        )
    overrides = overrides_from_args(args)
    if args.wandb:
        overrides["logging.wandb"] = True
    if args.wire:
        overrides["training.wire"] = args.wire
    if args.workdir:
        overrides["training.workdir"] = args.workdir
    if args.no_observe:
        overrides["training.observe"] = False
    if args.strict:
        overrides["training.strict"] = True
    import functools

    planned = functools.partial(prepare, load_config(args.config), overrides, auto_optimize=not args.no_auto_optimize,
                                debug=args.debug, policy=args.policy, run_dir=args.run_dir,
                                resume_from=args.resume_from, script_args=script_args, environ=os.environ,
                                python=sys.executable, force=args.force, trust_checkpoint=args.trust_checkpoint,
                                probe_gpu=not args.dry_run)
    setup = checked_setup(planned, args.hardware, resuming=bool(args.resume_from),
                          reuse=args.force_run_dir or args.force)
    from autotune.launch.exchange import job_secret

    secret = job_secret(os.environ, args.job_secret_file)
    if args.dry_run:
        _print_dry_run(setup, args.json)
        return 0
    from autotune.launch import run as launch

    return launch(setup, replan=planned, job_secret=secret)


def _print_dry_run(setup, as_json: bool) -> None:
    from autotune.exports.report import render_plan
    from autotune.launch.announce import print_delivery, resume_note
    from autotune.plan import public_dict
    from autotune.rundir.records import shown_path

    if as_json:
        data = {"plan": public_dict(setup.plan), "launch": setup.launch_spec.to_record(),
                "deepspeed_config": setup.deepspeed_config, "run_dir": shown_path(setup.run_dir),
                "resume_from": setup.plan.run.resume_from,
                "delivery": None if setup.delivery is None else setup.delivery.to_record()}
        print(json.dumps(data, indent=2))
        return
    render_plan(setup.plan, sys.stdout)
    print(f"\nRun directory: {shown_path(setup.run_dir)} (not created: --dry-run)")
    eng = setup.plan.engine
    if eng.num_nodes > 1:
        print(f"Nodes: this is node {eng.node_rank}'s own plan; at launch the {eng.num_nodes} nodes compare hardware "
              f"at {eng.master_addr}:{eng.master_port} and every node plans for the smallest")
    if setup.resume_path:
        print(f"Resume from: {setup.resume_path}{resume_note(setup)}")
    print("Command:")
    print(f"  {setup.launch_spec.shell()}")
    print_delivery(setup)


