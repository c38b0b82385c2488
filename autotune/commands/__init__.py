"""One module per command: ``add_parser(subparsers)`` and ``run(args) -> int``; `autotune/__main__.py`
registers them by import."""
