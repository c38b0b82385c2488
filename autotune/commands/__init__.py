"""One module per command: ``add_parser(subparsers)`` and ``run(args) -> int``."""

COMMANDS = ("check", "report", "plan", "estimate", "export", "launch")
