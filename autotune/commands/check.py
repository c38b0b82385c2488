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


def _entrypoint_problem(path: str, error) -> str | None:
    """What ``check_entrypoint`` (launch's own check before it spawns) says of the config's training.entrypoint and
    training.workdir alone, where the config's other problems kept them unchecked; None when they are fine, absent,
    or already among ``error``'s."""
    from autotune.config import parse_config
    from autotune.errors import UserError
    from autotune.prepare import check_entrypoint
    from autotune.safe_input import load_yaml, read_text

    if any(p.startswith(("training.entrypoint", "training.workdir")) for p in error.problems):
        return None
    try:
        data = load_yaml(read_text(path, "--config"), path)
        training = data.get("training") if isinstance(data, dict) else None
        if not isinstance(training, dict) or not any(isinstance(training.get(k), str) for k in ("entrypoint",
                                                                                               "workdir")):
            return None
        keep = {k: training[k] for k in ("entrypoint", "workdir") if isinstance(training.get(k), str)}
        check_entrypoint(parse_config({"training": keep}, origin=path))
    except UserError as e:
        found = [p for p in (str(e), *e.problems) if p.startswith(("training.entrypoint", "training.workdir"))]
        return found[0] if found else None
    return None


def run(args: argparse.Namespace) -> int:
    import yaml

    from autotune.config import AUTO, config_to_dict, load_config
    from autotune.errors import UserError
    from autotune.prepare import check_entrypoint

    try:
        cfg = load_config(args.config)
    except UserError as e:  # every problem at once: the entrypoint's too, where the config's others kept it unread
        raise UserError(str(e).replace(f"{len(e.problems)} problem(s)", f"{len(e.problems) + 1} problem(s)"),
                        [*e.problems, why]) if e.problems and (why := _entrypoint_problem(args.config, e)) else e
    check_entrypoint(cfg)
    if cfg.training.script_args:  # their placeholders, as launch expands them (its values are the plan's)
        from autotune.exports.script_args import expand, placeholder_names

        expand(list(cfg.training.script_args), dict.fromkeys(placeholder_names(), ""), where="training.script_args")
    data = config_to_dict(cfg)
    if data["training"]["script_args"]:  # printed: a secret among them is shown <redacted> (autotune.redaction)
        from autotune.redaction import redact_args

        data["training"]["script_args"] = redact_args(data["training"]["script_args"])
    if args.json:
        print(json.dumps(data, indent=2))
        return 0
    print(f"{args.config}: OK")
    autos = [f"{s}.{k}" for s, sec in data.items() for k, v in sec.items() if v == AUTO]
    if cfg.training.entrypoint:  # your script: what you set, and the defaults said as defaults (issue 51)
        _print_for_a_script(cfg, data)
    else:
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    if autos:
        print(f"# chosen by the planner at launch ({len(autos)}): {', '.join(autos)}")
    return 0


# the built-in workload's own settings: a user's script is its own workload, so they are not shown for it
BUILTIN_ONLY = ("model.", "data.task", "data.seq_len", "data.vocab_size", "data.num_val_samples", "data.seed",
                "training.min_lr_ratio", "training.eval_every_steps", "training.optimizer", "training.seed")


def _print_for_a_script(cfg, data: dict) -> None:
    """For a user's script: only the values the config sets, then the defaults by what they are: the values its
    script keeps (the plan passes none it was not given), autotune's own defaults, and the built-in workload's
    settings, which are not its (never printed as if the user had set them)."""
    import yaml

    from autotune.config import AUTO
    from autotune.planner.compose import SCRIPT_DEFAULTABLE

    given = {s: {k: v for k, v in sec.items() if k in getattr(cfg, s).model_fields_set} for s, sec in data.items()}
    sys.stdout.write(yaml.safe_dump({s: sec for s, sec in given.items() if sec}, sort_keys=False))
    unset = [(f"{s}.{k}", v) for s, sec in data.items() for k, v in sec.items()
             if k not in given[s] and v != AUTO]
    yours = [k for k, _ in unset if k.startswith("training.") and k.split(".")[1] in SCRIPT_DEFAULTABLE]
    builtin = [k for k, _ in unset if k.startswith(BUILTIN_ONLY)]
    rest = [f"{k}={v}" for k, v in unset if k not in yours and k not in builtin and v not in (None, [])]
    if yours:
        print(f"# not set: your script keeps its own ({len(yours)}): {', '.join(yours)}")
    if rest:
        print(f"# not set: autotune's defaults ({len(rest)}): {', '.join(rest)}")
    if builtin:
        print(f"# not shown: the built-in workload's settings ({len(builtin)}), not your script's")
