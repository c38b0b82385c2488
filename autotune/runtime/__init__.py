"""In-rank helpers: read the plan once, init/cleanup the process group, one engine
interface over single/DDP/DeepSpeed, checkpoints and rank-0 logging.

User scripts can use these directly (see examples/autotune_train.py)::

    from autotune import runtime
    settings = runtime.load_settings()          # AUTOTUNE_PLAN
    ctx = runtime.init(settings)
    engine = runtime.make_engine(settings, model, ctx)
    ...
    runtime.cleanup(ctx)
"""

from autotune.runtime.settings import Settings, load_settings
from autotune.runtime.dist import DistContext, cleanup, init, wait_for_everyone
from autotune.runtime.engine import Engine, make_engine
from autotune.runtime.checkpoint import CheckpointManager
from autotune.runtime.data import BatchStream
from autotune.runtime.logging import make_logger

__all__ = [
    "Settings", "load_settings", "DistContext", "init", "cleanup", "wait_for_everyone",
    "Engine", "make_engine", "CheckpointManager", "BatchStream", "make_logger",
]
