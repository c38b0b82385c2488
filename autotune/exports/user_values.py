"""Your own values after `--` for a script's settings of plan values: the route that names one as yours, the flag
it sets, the plan's value it wins over. Pure; no torch. ``wiring.given_by_user`` finds them in your arguments.
"""

from __future__ import annotations

from autotune.plan import TrainingPlan
from autotune.rundir.records import plan_values

YOURS = "yours:"  # the mark of a route that carries your own value, not the plan's


def given_flag(argument: str) -> str:
    """The flag (or Hydra key) of an argument the user passed: ``--batch_size`` of ``--batch_size 8``."""
    return argument.split(" ")[0].split("=")[0].lstrip("+~")


def planned_value(plan: TrainingPlan, key: str):
    """The plan's own value of ``key`` (as the plan says it, before any change for a script's arithmetic)."""
    return plan_values(plan).get(key)


def shown(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def yours_route(key: str, argument: str, plan: TrainingPlan) -> str:
    """The route of a value the user set after `--` on the script's own setting: theirs, winning over the plan's."""
    return (f"{YOURS} {argument} after `--` (the script's {given_flag(argument)}: your value wins over the plan's "
            f"{shown(planned_value(plan, key))})")


def carries_plan(routes: list[str]) -> list[str]:
    """The routes that carry the plan's value (not the user's own)."""
    return [r for r in routes if not r.startswith(YOURS)]
