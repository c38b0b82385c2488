"""Run a user's entrypoint in this process: ``package.module:function`` or ``path/to/script.py``.

    python -m autotune.entry [script arguments...]      # what the launcher runs for module:function

The entrypoint sees only its own arguments in ``sys.argv`` (never autotune's), finds the plan in
$AUTOTUNE_PLAN, and its return value (or ``sys.exit``) is the exit code.
"""

from __future__ import annotations

import importlib
import runpy
import sys

from autotune.errors import UserError, run_cli
from autotune.exports.script_plan import ScriptPlan

__all__ = ["ScriptPlan", "main", "run_entrypoint"]  # ScriptPlan: users import it from here


def run_entrypoint(entry: str, args: list[str]) -> int:
    if entry.endswith(".py"):
        sys.argv = [entry, *args]
        runpy.run_path(entry, run_name="__main__")
        return 0
    mod, _, fn = entry.partition(":")
    try:
        func = getattr(importlib.import_module(mod), fn or "main")
    except (ImportError, AttributeError) as e:
        raise UserError(f"training.entrypoint: cannot import {entry!r}: {e}") from None
    sys.argv = [mod, *args]
    return int(func() or 0)


def main(argv: list[str] | None = None) -> int:
    from autotune.rundir.records import load_plan

    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        plan = load_plan()  # the launcher's: $AUTOTUNE_PLAN
        if not plan.run.entrypoint:
            raise UserError("python -m autotune.entry: the plan has no training.entrypoint")
        return run_entrypoint(plan.run.entrypoint, args)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
