"""`python -m autotune <command>` / `autotune <command>`: registers the commands, nothing else."""

from __future__ import annotations

import argparse
import importlib
import sys

from autotune import __version__
from autotune.commands import COMMANDS
from autotune.errors import run_cli

DESCRIPTION = """autotune: detect the hardware, plan batch sizes / accumulation / precision /
engine for it, and launch training with the right engine (single, DDP, DeepSpeed).

start here:
  python -m autotune report                  what this machine is and what autotune would do
  python -m autotune check --config F        validate a config
  python -m autotune plan --hardware 4xL4    plan for a machine you don't have
  python -m autotune launch                  train the built-in workload here"""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="autotune", description=DESCRIPTION,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"autotune {__version__}")
    sub = p.add_subparsers(dest="command", metavar="<command>", required=True)
    for name in COMMANDS:
        importlib.import_module(f"autotune.commands.{name}").add_parser(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        hint = " (arguments for your training script go after `--`)" if args.command == "launch" else ""
        parser.error(f"unrecognized arguments: {' '.join(unknown)}{hint}")
    return run_cli(lambda: args.func(args))


if __name__ == "__main__":
    sys.exit(main())
