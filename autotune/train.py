"""The built-in default workload's entry point (runs in every rank).

    python -m autotune.train --plan runs/<id>/plan.json      # what the launcher runs
    python -m autotune.train --config configs/default_config.yaml [--batch_size N] ...

With ``--config`` it plans for this machine itself: outside a launcher it runs
in one process; under torchrun it plans for the world torchrun started.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from pathlib import Path

from autotune.errors import UserError, run_cli


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
    p.add_argument("--resume_from", help="checkpoint dir, or 'auto' for the newest in the run dir")
    return p


def _plan_here(args) -> tuple[dict, Path, dict | None]:
    """--config mode: detect, plan and write the run dir like the launcher would."""
    from autotune.commands.common import prepare_run, write_run_files
    from autotune.config import load_config

    cfg = load_config(args.config)
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
    plan_obj, hw, ds = prepare_run(cfg, overrides, auto_optimize=args.auto_optimize)
    run_dir = Path(args.run_dir or os.environ.get("AUTOTUNE_RUN_DIR") or _default_run_dir(world))
    # Every rank planned the same thing from the same inputs and keeps its own copy (no waiting
    # on another rank's files); one process per node writes the records.
    if int(os.environ.get("LOCAL_RANK", "0")) == 0:
        write_run_files(run_dir, plan_obj, hw, ds, None)
    return json.loads(plan_obj.model_dump_json()), run_dir, ds


def _default_run_dir(world: int) -> str:
    if world > 1:
        return f"runs/torchrun-{os.environ.get('TORCHELASTIC_RUN_ID', 'job')}"
    from autotune.commands.common import new_run_dir_name

    return f"runs/{new_run_dir_name()}"


def _call_entrypoint(entry: str) -> int:
    mod, _, fn = entry.partition(":")
    try:
        func = getattr(importlib.import_module(mod), fn or "main")
    except (ImportError, AttributeError) as e:
        raise UserError(f"training.entrypoint: cannot import {entry!r}: {e}") from None
    result = func()
    return int(result or 0)


def main(argv: list[str] | None = None) -> int:
    def body() -> int:
        args = build_parser().parse_args(argv)
        ds_config = None
        if args.config:
            plan, run_dir, ds_config = _plan_here(args)
            plan_path = str(run_dir / "plan.json")
        else:
            from autotune.runtime.settings import read_plan

            plan_path = args.plan or os.environ.get("AUTOTUNE_PLAN")
            plan = read_plan(plan_path)
            run_dir = Path(args.run_dir or os.environ.get("AUTOTUNE_RUN_DIR") or Path(plan_path).parent)
        os.environ["AUTOTUNE_PLAN"] = plan_path
        entry = plan["config"]["training"].get("entrypoint")
        if entry and ":" in entry:
            return _call_entrypoint(entry)
        from autotune.runtime.settings import settings_from_plan
        from autotune.runtime.loop import train

        settings = settings_from_plan(plan, plan_path)
        train(settings, run_dir, resume_from=args.resume_from, ds_config=ds_config)
        return 0

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
