"""In-rank helpers: read the plan once, init/cleanup the process group, one engine
protocol over single/DDP/DeepSpeed, checkpoints and rank-0 logging.

User scripts can use these directly (see examples/autotune_train.py)::

    from autotune import runtime
    plan = runtime.load_plan()                  # $AUTOTUNE_PLAN, a typed TrainingPlan
    ctx = runtime.init(plan)
    engine = runtime.make_engine(plan, model, ctx)
    ...
    runtime.cleanup(ctx)

Nothing is imported until it is used: the observer (``autotune.runtime.observe``) starts in every process of a
user's script, before the script's own imports, and must not import torch (a second) or anything else there.
"""

import importlib

_WHERE = {
    "TrainingPlan": "autotune.plan", "load_plan": "autotune.rundir.records",
    "CheckpointManager": "autotune.runtime.checkpoint_manager", "BatchStream": "autotune.runtime.data",
    "DistContext": "autotune.runtime.dist", "cleanup": "autotune.runtime.dist", "init": "autotune.runtime.dist",
    "wait_for_everyone": "autotune.runtime.dist", "Engine": "autotune.runtime.engine",
    "make_engine": "autotune.runtime.engine", "make_logger": "autotune.runtime.metric_sinks",
}
__all__ = list(_WHERE)


def __getattr__(name: str):
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(_WHERE[name]), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_WHERE))
