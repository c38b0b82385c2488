"""`python -m autotune export --format deepspeed|accelerate|torchrun`: the plan in other tools' words."""

from __future__ import annotations

import argparse
import json
import shlex
import sys

HELP = "write the plan as a DeepSpeed JSON, an Accelerate config YAML, or a torchrun command line"


def add_parser(sub) -> None:
    from autotune.commands.common import add_plan_args

    p = sub.add_parser("export", help=HELP, description=HELP)
    p.add_argument("--format", required=True, choices=["deepspeed", "accelerate", "torchrun"])
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout (refuses to overwrite)")
    p.add_argument("--overwrite", action="store_true", help="allow --output to overwrite an existing file")
    p.add_argument("--script", default="train.py", help="training script for the torchrun line (default: train.py)")
    add_plan_args(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from pathlib import Path

    from autotune.commands.common import plan_from_args
    from autotune.deepspeed_config import deepspeed_config
    from autotune.errors import UserError
    from autotune.exports import accelerate_config, torchrun_command

    plan, _, ds = plan_from_args(args)
    if args.format == "deepspeed":
        text = json.dumps(ds if ds is not None else deepspeed_config(plan), indent=2) + "\n"
    elif args.format == "accelerate":
        import yaml

        text = yaml.safe_dump(accelerate_config(plan), sort_keys=False)
    else:
        text = shlex.join(torchrun_command(plan, args.script)) + "\n"
    if args.output:
        out = Path(args.output)
        if out.exists() and not args.overwrite:
            raise UserError(f"--output: {out} exists; add --overwrite to replace it")
        out.write_text(text)
        print(f"wrote {out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
