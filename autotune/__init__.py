"""autotune: detect the hardware, plan the training knobs, launch the right engine."""

__version__ = "0.1.0"


def current_plan(path=None, *, config=None):
    """The typed plan of this run (``autotune.plan.TrainingPlan``).

    Under ``python -m autotune launch`` every process reads the launcher's plan from $AUTOTUNE_PLAN
    (or pass ``path``, a run's plan.json). Outside a launch it plans on the spot for this machine,
    from ``config`` (a YAML path) or the defaults, as ``python -m autotune plan`` would for this script
    (its entrypoint: the running script unless the config names one); a plan that does not fit is
    refused (``PlanRefused``) as there. Helpers on the plan:
    ``plan.dataloader_kwargs()``, ``plan.accelerator_kwargs()``, ``plan.deepspeed_config()``.
    Kept import-light: ``import autotune`` loads nothing, and planning imports no torch unless the
    config describes a model to trace.
    """
    import os

    from autotune.exports.script_plan import ScriptPlan
    from autotune.rundir.layout import PLAN_ENV
    from autotune.rundir.records import load_plan

    if path is not None or (os.environ.get(PLAN_ENV) and config is None):
        return ScriptPlan.of(load_plan(path))
    from autotune.config import TrainConfig, load_config
    from autotune.prepare import plan_for

    cfg = load_config(config) if config is not None else TrainConfig()
    if cfg.training.entrypoint is None:  # the caller is the script: its model is its own, not the built-in one
        import sys

        from autotune.config import apply_overrides

        script = sys.argv[0] if sys.argv[0].endswith(".py") else "__main__:main"  # python -c, a REPL, a notebook
        cfg = apply_overrides(cfg, {"training.entrypoint": script})
    plan, _hw, _ds = plan_for(cfg, with_deepspeed=False)
    return ScriptPlan.of(plan)
