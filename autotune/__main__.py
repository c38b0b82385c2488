"""`python -m autotune <command>` / `autotune <command>`: registers the commands, nothing else."""

from __future__ import annotations

import argparse
import sys

from autotune import __version__
from autotune.commands import check, estimate, export, launch, plan, report
from autotune.commands.common import Parser, did_you_mean
from autotune.errors import run_cli
from autotune.redaction import declared_not_secret, redact_args

DESCRIPTION = """autotune: detect the hardware, plan batch sizes / accumulation / precision /
engine for it, and launch training with the right engine (single, DDP, FSDP2, DeepSpeed).

start here:
  python -m autotune report                  what this machine is and what autotune would do
  python -m autotune check --config F        validate a config
  python -m autotune plan --hardware 4xL4    plan for a machine you don't have
  python -m autotune launch                  train the built-in workload here"""

REGISTERED = (check, report, plan, estimate, export, launch)  # in the order `--help` lists them
COMMANDS = tuple(m.__name__.rsplit(".", 1)[1] for m in REGISTERED)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="autotune", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="<command>", required=True)
    for command in REGISTERED:
        command.add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and not argv[0].startswith("-") and argv[0] not in COMMANDS:  # a mistyped command
        parser.error(f"unknown command {argv[0]!r}{did_you_mean(argv[0], COMMANDS)}; the commands: "
                     f"{', '.join(COMMANDS)}")
    args, unknown = parser.parse_known_args(argv)
    if unknown:  # the command's own usage, and the flag it has that comes closest
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices[args.command]
        flags = [s for a in sub._actions for s in a.option_strings]
        guesses = "".join(did_you_mean(u, flags) for u in unknown if u.startswith("-"))
        hint = " (arguments for your training script go after `--`)" if args.command == "launch" else ""
        sub.error(f"unrecognized arguments: {' '.join(redact_args(unknown))}{guesses}{hint}")
    with declared_not_secret(getattr(args, "not_secret", None) or ()):  # the user's word: no secret
        return run_cli(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
