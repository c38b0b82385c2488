"""The built-in default workload's entry point (runs in every rank).

    python -m autotune.train --plan runs/<id>/plan.json      # what the launcher runs
    python -m autotune.train --config configs/default_config.yaml [--batch_size N] ...

With ``--config`` it plans for this machine itself: outside a launcher it runs
in one process; under torchrun it plans for the world torchrun started.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from autotune.deepspeed_config import ENGINE_FLAVOUR_FILE
from autotune.errors import UserError, run_cli
from autotune.plan import TrainingPlan, load_plan


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m autotune.train",
        description="Train the built-in workload (a small GPT sorting digits) under a plan.",
    )
    src = p.add_mutually_exclusive_group()
    src.add_argument("--plan", help="plan.json written by `autotune launch` (default: $AUTOTUNE_PLAN)")
    src.add_argument("--config", help="plan for this machine from this YAML config, then train")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--auto_optimize", dest="auto_optimize", action="store_true", default=True,
                   help="let the planner choose every 'auto' value (default)")
    g.add_argument("--no_auto_optimize", dest="auto_optimize", action="store_false",
                   help="use the config verbatim")
    p.add_argument("--use_deepspeed", action="store_true", help="force the DeepSpeed engine (with --config)")
    p.add_argument("--batch_size", type=int, help="micro-batch per process (with --config)")
    p.add_argument("--epochs", type=int, help="epochs (with --config)")
    p.add_argument("--max_steps", type=int, help="optimizer steps (with --config)")
    p.add_argument("--run_dir", help="run directory (default: $AUTOTUNE_RUN_DIR or a new runs/<id>)")
    p.add_argument("--resume_from", help="with --config: checkpoint dir, or 'auto' for the newest in the run dir")
    return p


def _plan_here(args) -> tuple[TrainingPlan, Path, dict | None]:
    """--config mode: detect, plan and write the run dir like the launcher would."""
    from autotune.config import load_config
    from autotune.runs import plan_for, resolve_resume, write_records

    overrides = {}
    if args.batch_size:
        overrides["training.batch_size_per_gpu"] = args.batch_size
    if args.epochs:
        overrides["training.epochs"] = args.epochs
    if args.max_steps:
        overrides["training.max_steps"] = args.max_steps
    if args.use_deepspeed:
        overrides["distributed.backend"] = "deepspeed"
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:  # under torchrun: plan for the world it started
        local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
        overrides["distributed.nproc_per_node"] = local
        overrides["distributed.num_nodes"] = world // local
        if overrides.get("distributed.backend") != "deepspeed":
            overrides["distributed.backend"] = "ddp"
    plan, hw, ds = plan_for(load_config(args.config), overrides, auto_optimize=args.auto_optimize)
    run_dir = Path(args.run_dir or os.environ.get("AUTOTUNE_RUN_DIR") or _default_run_dir(world))
    resume = resolve_resume(args.resume_from, run_dir)
    if resume is not None:
        plan = plan.model_copy(update={"run": plan.run.model_copy(update={"resume_from": str(resume)})})
    # Every rank planned the same thing from the same inputs and keeps its own copy (no waiting
    # on another rank's files); one process per node writes the records.
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        write_records(run_dir, plan, hw, ds)
    return plan, run_dir, ds


def _default_run_dir(world: int) -> str:
    if world > 1:
        return f"runs/torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}"
    from autotune.runs import new_run_dir_name

    return f"runs/{new_run_dir_name()}"


def main(argv: list[str] | None = None) -> int:
    where: dict = {}

    def report(code: int, message: str) -> None:
        """Tell the launcher how this rank ended (torchrun turns every failure into exit 1)."""
        if "run_dir" in where:
            from autotune.runtime_paths import write_status

            write_status(where["run_dir"], int(os.environ.get("RANK", "0")), where.get("code", code), message,
                         **where.get("extra", {}))

    def body() -> int:
        args = build_parser().parse_args(argv)
        ds_config = None
        if args.config:
            plan, run_dir, ds_config = _plan_here(args)
            plan_path = str(run_dir / "plan.json")
        else:
            if args.resume_from:
                raise UserError("--resume_from: with --plan the launcher has already resolved the resume point "
                                "(plan.run.resume_from); use it with --config, or launch with --resume_from")
            plan_path = args.plan or os.environ.get("AUTOTUNE_PLAN")
            plan = load_plan(plan_path)
            run_dir = Path(args.run_dir or os.environ.get("AUTOTUNE_RUN_DIR") or Path(plan_path).parent)
        where["run_dir"] = run_dir
        os.environ["AUTOTUNE_PLAN"] = plan_path
        if plan.run.entrypoint:  # the user's own script or function, never the built-in workload
            from autotune.entry import run_entrypoint
            from autotune.script_args import expand, placeholder_values

            ds_path = Path(plan_path).with_name(ENGINE_FLAVOUR_FILE) if plan.is_deepspeed else None
            args = expand(list(plan.run.script_args), placeholder_values(plan, run_dir, ds_path))
            return run_entrypoint(plan.run.entrypoint, args)
        from autotune.runtime.loop import train

        try:
            result = train(plan, run_dir, ds_config=ds_config, plan_path=plan_path)
        except OSError as e:  # metrics, TensorBoard, W&B files: a full or read-only disk is one line
            from autotune.rundir import disk_cause, fs_error

            if disk_cause(e, run_dir) is None:
                raise
            raise fs_error(e, what="run dir") from None
        if result.get("preempted"):
            from autotune.runtime_paths import EXIT_PREEMPTED

            where["code"], where["extra"] = EXIT_PREEMPTED, {k: result[k] for k in ("step", "signal", "checkpoint")}
            # Under torchrun a non-zero exit would read as a crash (and trigger --max_restarts):
            # exit 0 there and let the status file carry the code to the launcher.
            return 0 if "TORCHELASTIC_RUN_ID" in os.environ else EXIT_PREEMPTED
        return 0

    return run_cli(body, on_exit=report)


if __name__ == "__main__":
    sys.exit(main())
