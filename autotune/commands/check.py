"""`python -m autotune check --config F`: validate a config and print what was understood."""

from __future__ import annotations

import argparse
import json
import sys

HELP = "validate a config file and print what autotune understood (exit 2 with every problem listed)"


def add_parser(sub) -> None:
    from autotune.commands.common import add_config_arg

    p = sub.add_parser("check", help=HELP, description=HELP)
    add_config_arg(p)
    p.add_argument("--json", action="store_true", help="print the validated config as JSON")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import yaml

    from autotune.config import AUTO, config_to_dict, load_config
    from autotune.prepare import check_entrypoint

    cfg = load_config(args.config)
    check_entrypoint(cfg)
    data = config_to_dict(cfg)
    if data["training"]["script_args"]:  # printed: a secret among them is shown <redacted> (autotune.redaction)
        from autotune.redaction import redact_args

        data["training"]["script_args"] = redact_args(data["training"]["script_args"])
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{args.config}: OK")
    autos = [f"{s}.{k}" for s, sec in data.items() for k, v in sec.items() if v == AUTO]
    sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    if autos:
        print(f"# chosen by the planner at launch ({len(autos)}): {', '.join(autos)}")
    return 0
