"""`python -m autotune launch` (what launch_distributed_training.sh runs): detect, plan,
write the run directory, start the right engine, train."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

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
    from autotune.commands.common import add_plan_args

    p = sub.add_parser("launch", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    p.add_argument("--dry-run", "--dry_run", dest="dry_run", action="store_true",
                   help="print the plan and the launch command and environment; start nothing, write nothing")
    p.add_argument("--run_dir", metavar="DIR", help="run directory (default: runs/<timestamp>-<id>)")
    p.add_argument("--resume_from", metavar="PATH|auto",
                   help="checkpoint directory, or 'auto' for the newest checkpoint in --run_dir "
                        "(or in the newest run under runs/)")
    p.add_argument("--wandb", action="store_true", help="log to Weights & Biases (offline unless WANDB_API_KEY is set)")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan and spec as JSON")
    p.add_argument("script_args", nargs=argparse.REMAINDER,
                   help="after `--`: arguments passed to the training script")
    p.set_defaults(func=run)


def _latest_run_with_checkpoint(root: Path) -> Path | None:
    from autotune.runtime_paths import latest_checkpoint

    runs = sorted((d for d in root.glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    for d in runs:
        if latest_checkpoint(d) is not None:
            return d
    return None


def run(args: argparse.Namespace) -> int:
    from autotune.commands.common import (check_run_dir_free, new_run_dir_name, overrides_from_args, prepare_run,
                                          write_run_files)
    from autotune.config import load_config
    from autotune.errors import UserError
    from autotune.launch import execute, launch_spec, records_dir
    from autotune.report import render_plan
    from autotune.runtime_paths import check_compatible, latest_checkpoint, read_meta

    script_args = list(args.script_args or [])
    if script_args and script_args[0] == "--":
        script_args = script_args[1:]
    elif script_args:
        raise UserError(f"unrecognised arguments: {' '.join(script_args)} (put script arguments after `--`)")
    cfg = load_config(args.config)
    overrides = overrides_from_args(args)
    if args.wandb:
        overrides["logging.wandb"] = True
    plan, hw, ds = prepare_run(cfg, overrides, auto_optimize=not args.no_auto_optimize, debug=args.debug,
                               hardware=args.hardware, policy=args.policy)

    resuming = bool(args.resume_from)
    if args.run_dir:
        run_dir = Path(args.run_dir)
    elif args.resume_from == "auto":
        run_dir = _latest_run_with_checkpoint(Path("runs")) or Path("runs") / new_run_dir_name()
    else:
        run_dir = Path("runs") / new_run_dir_name()
    entry = plan.config["training"].get("entrypoint")
    if entry and entry.endswith(".py") and not Path(entry).is_file():
        raise UserError(f"training.entrypoint: no such script {entry!r} (paths are relative to {Path.cwd()})")
    if args.hardware and not args.dry_run:
        raise UserError(
            f"--hardware {args.hardware}: a launch runs on this machine, so it plans for the detected hardware; "
            "use --hardware with --dry-run (or `autotune plan`) to look at other machines"
        )
    if args.resume_from not in (None, "auto") and not Path(args.resume_from).is_dir():
        raise UserError(f"--resume_from: no checkpoint directory {args.resume_from!r}")
    resume_path = Path(args.resume_from) if args.resume_from not in (None, "auto") else \
        (latest_checkpoint(run_dir) if args.resume_from == "auto" else None)
    if resume_path is not None and not plan.config["training"].get("entrypoint"):
        check_compatible(read_meta(resume_path), resume_path, plan.backend, plan.global_batch_size)
    if args.resume_from not in (None, "auto"):
        script_args = ["--resume_from", str(Path(args.resume_from).resolve()), *script_args]
    elif args.resume_from == "auto" and not plan.config["training"].get("entrypoint"):
        script_args = ["--resume_from", "auto", *script_args]
    spec = launch_spec(plan, str(run_dir), os.environ, python=sys.executable,
                       has_infiniband=bool(hw.infiniband), script_args=script_args)
    if args.dry_run:
        if args.json:
            data = {"plan": json.loads(plan.model_dump_json()), "launch": spec.to_record(),
                    "deepspeed_config": ds, "run_dir": str(run_dir)}
            data["plan"].pop("config")
            print(json.dumps(data, indent=2))
        else:
            render_plan(plan, sys.stdout)
            print(f"\nRun directory: {run_dir} (not created: --dry-run)")
            print("Command:")
            print(f"  {spec.shell()}")
        return 0
    check_run_dir_free(records_dir(plan, run_dir), resuming)
    write_run_files(records_dir(plan, run_dir), plan, hw, ds, spec)
    render_plan(plan, sys.stdout)
    print(f"\nRun directory: {run_dir}\nCommand: {spec.shell()}\n", flush=True)
    signals: list[int] = []
    rc = execute(spec, forwarded=signals)
    if rc != 0 and signals:  # interrupted: the shell convention 128+N, whatever torchrun made of it
        rc = 128 + signals[0]
    if rc == 0:
        print(f"\nDone. Run directory: {run_dir}")
        if (run_dir / "tensorboard").is_dir():
            print(f"TensorBoard: tensorboard --logdir {run_dir / 'tensorboard'}")
        metrics = run_dir / "metrics.json"
        if metrics.exists():
            final = json.loads(metrics.read_text()).get("final", {})
            if "val/accuracy" in final:
                print(f"Final validation accuracy: {final['val/accuracy']:.3f} (loss {final['val/loss']:.4f})")
    elif rc in (128 + 2, 128 + 15):
        print(f"\nInterrupted ({'SIGINT' if rc == 130 else 'SIGTERM'}). Run directory: {run_dir}", file=sys.stderr)
        if latest_checkpoint(run_dir) is not None:
            print(f"To continue from its newest checkpoint, run the same command with "
                  f"--run_dir {run_dir} --resume_from auto", file=sys.stderr)
    else:
        print(f"\nTraining exited with code {rc}. Run directory: {run_dir}", file=sys.stderr)
    return rc
