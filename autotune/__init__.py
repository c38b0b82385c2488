"""autotune: detect the hardware, plan the training knobs, launch the right engine."""

__version__ = "0.1.0"


def current_plan(path=None):
    """The typed plan of this run (``autotune.plan.TrainingPlan``), read from ``path`` or $AUTOTUNE_PLAN.

    Under ``python -m autotune launch`` every process has AUTOTUNE_PLAN; outside a launch,
    pass the path of a run's plan.json. Kept import-light: ``import autotune`` loads nothing.
    """
    from autotune.plan import load_plan

    return load_plan(path)
