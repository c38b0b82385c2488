"""`python -m autotune plan`: the explained training plan for a config on a machine."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "plan every training knob for a config on this machine (or --hardware PRESET) and say why"
EPILOG = """examples:
  python -m autotune plan
  python -m autotune plan --hardware 4xL4 --json
  python -m autotune plan --hardware 8xH100-80GB --batch_size 8 --zero_stage 3
  python -m autotune plan --config my.yaml --no_auto_optimize

Every key of --json, and every field of the run's plan.json, with its type and meaning:
docs/plan-fields.md (generated from autotune/plan.py)."""


def add_parser(sub) -> None:
    from autotune.commands.common import add_plan_args

    p = sub.add_parser("plan", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    p.add_argument("--json", action="store_true", help="print the plan as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autotune.commands.common import plan_from_args
    from autotune.exports.report import render_plan

    plan, _, _ = plan_from_args(args)
    if args.json:
        from autotune.plan import public_dict

        print(json.dumps(public_dict(plan), indent=2))
    else:
        render_plan(plan, sys.stdout)
    return 0
