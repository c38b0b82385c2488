"""`python -m autotune estimate`: the memory table behind the plan's strategy choice."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "show the memory estimate of every strategy the planner weighs (and which fits)"
EPILOG = """For each option (DDP, ZeRO-1/2/3, with offload, with and without gradient
checkpointing) the table shows the model states, activations and overhead per GPU at the
largest micro-batch that fits (up to the policy band's), the host RAM that offload needs,
and why an option does not fit, with its predicted samples/s at the global batch.

Which option the plan takes, among those that fit: where your model's step is traced as
CUDA runs it on a GPU of configs/gpus.yaml, the most predicted samples/s; options within
the model's own error out of sample on that GPU's evidence (5.8 % on an H100, 12 % on an A100, 10 %
without evidence) of the fastest are a tie, settled by the preference order
(configs/policy.yaml's strategy_preference). Otherwise (the built-in GPT, counted by
formula; a micro-batch you set; a GPU not in the table) the first option in that order
that reaches the band's micro-batch (a traced model on a GPU not in the table: the largest
micro-batch without checkpointing). Offload only where nothing fits without it. The line
under the table says which rule chose, and the rows that tie with the fastest are marked.

Your own model: set training.model (package.module:factory) and training.sample_input in
the config; it is built and traced under fake tensors (no memory spent, a few seconds).

examples:
  python -m autotune estimate --hardware 8xA100-40GB
  python -m autotune estimate --config my.yaml --hardware 1xT4 --json

exit codes: 0 a plan fits, 3 nothing fits (the table says what was tried), 2 bad input."""


def add_parser(sub) -> None:
    from autotune.commands.common import add_plan_args

    p = sub.add_parser("estimate", help=HELP, description=HELP, epilog=EPILOG,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    add_plan_args(p)
    p.add_argument("--json", action="store_true", help="print the table as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from autotune.commands.common import overrides_from_args
    from autotune.config import load_config
    from autotune.errors import EXIT_REFUSED, PlanRefused
    from autotune.exports.options_table import estimate_json, render_estimate
    from autotune.prepare import weigh_for

    refused = None
    plan = None
    try:
        plan, weighing, _ = weigh_for(load_config(args.config), overrides_from_args(args), args.hardware,
                                      auto_optimize=not args.no_auto_optimize, debug=args.debug, policy=args.policy,
                                      force=args.force, time_cpu=True)
    except PlanRefused as e:
        refused, weighing = e, e.weighing
    if args.json:
        print(json.dumps(estimate_json(plan, weighing, refused), indent=2))
    else:
        render_estimate(plan, weighing, sys.stdout)
        if refused is not None:
            print(refused.render(), file=sys.stderr)
    return EXIT_REFUSED if refused is not None else 0
