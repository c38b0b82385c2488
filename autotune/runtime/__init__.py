"""In-rank helpers: read the plan once, init/cleanup the process group, one engine
protocol over single/DDP/DeepSpeed, checkpoints and rank-0 logging.

User scripts can use these directly (see examples/autotune_train.py)::

    from autotune import runtime
    plan = runtime.load_plan()                  # $AUTOTUNE_PLAN, a typed TrainingPlan
    ctx = runtime.init(plan)
    engine = runtime.make_engine(plan, model, ctx)
    ...
    runtime.cleanup(ctx)
"""

from autotune.plan import TrainingPlan, load_plan
from autotune.runtime.checkpoint import CheckpointManager
from autotune.runtime.data import BatchStream
from autotune.runtime.dist import DistContext, cleanup, init, wait_for_everyone
from autotune.runtime.engine import Engine, make_engine
from autotune.runtime.logging import make_logger

__all__ = [
    "TrainingPlan", "load_plan", "DistContext", "init", "cleanup", "wait_for_everyone",
    "Engine", "make_engine", "CheckpointManager", "BatchStream", "make_logger",
]
