"""`python -m autotune.hardware report` / `python -m autotune report`: what this machine is,
and what autotune would do on it."""

from __future__ import annotations

import argparse
import sys

from autotune.errors import run_cli

HELP = "show the detected hardware (or a preset/profile) and the training settings autotune would choose"


def configure(p: argparse.ArgumentParser) -> None:
    from autotune.commands.common import DEFAULT_CONFIG, path_of

    p.add_argument("--json", action="store_true", help="print the hardware profile as JSON (stable field names)")
    p.add_argument("--profile", "--hardware", dest="profile", metavar="PRESET|PATH",
                   type=path_of("a preset (e.g. 4xL4) or a profile JSON's path"),
                   help="report a preset (cpu-only, 4xL4, 8xH100-80GB, ...) or a saved profile instead of this machine")
    p.add_argument("--config", default=str(DEFAULT_CONFIG), metavar="FILE", type=path_of("a config YAML's path"),
                   help="config used for the OPTIMAL TRAINING SETTINGS section (default: configs/default_config.yaml)")
    p.add_argument("--no_plan", "--no-plan", dest="with_plan", action="store_false",
                   help="omit the OPTIMAL TRAINING SETTINGS section (--no-plan: the older spelling, still read)")


def add_parser(sub) -> None:
    p = sub.add_parser("report", help=HELP, description=HELP)
    configure(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace, out=None) -> int:
    from autotune.config import load_config
    from autotune.exports.report import render_plan, render_profile
    from autotune.prepare import plan_for, resolve_hardware

    out = out or sys.stdout
    hw = resolve_hardware(args.profile)
    if args.json:
        out.write(hw.to_json() + "\n")
        return 0
    render_profile(hw, out)
    if args.with_plan:
        cfg = load_config(args.config)
        plan, _, _ = plan_for(cfg, {}, hw, with_deepspeed=False)
        render_plan(_untimed_said(cfg, hw, plan), out)
    return 0


UNTIMED = "no GPU, and the model's step was not timed here"  # the planner's reason, when nothing timed the step


def _untimed_said(cfg, hw, plan):
    """``plan`` with the reason its CPU step was not timed made this report's own: the condition that failed
    (``measure.timing.why_untimed``, the one rule), else that ``report`` times nothing by design (it answers at once;
    ``plan`` times the step)."""
    from autotune.measure.timing_rule import why_untimed

    te = plan.schedule.time_estimate
    said = te.unknown.get("samples_per_s", "") if te is not None else ""
    if not said.startswith(UNTIMED):
        return plan
    e = plan.memory.estimate
    why = why_untimed(cfg, hw, plan, e.num_parameters if e else None) or (
        "`report` never times it (it runs nothing, by design, and answers at once): `python -m autotune plan` "
        "times the step on this CPU, once, then keeps the figure")
    te = te.model_copy(update={"unknown": {**te.unknown, "samples_per_s": f"{UNTIMED}: {why}"}})
    return plan.model_copy(update={"schedule": plan.schedule.model_copy(update={"time_estimate": te})})


def main(argv: list[str] | None = None) -> int:
    """Entry for `python -m autotune.hardware report [...]`."""
    from autotune.commands.common import Parser

    p = Parser(prog="python -m autotune.hardware", description=HELP)
    sub = p.add_subparsers(dest="command", metavar="report", required=True)
    add_parser(sub)
    args = p.parse_args(argv)
    return run_cli(lambda: args.func(args))
