"""The DeepSpeed JSON in and out of the runtime: read the one autotune wrote beside plan.json, and
record what DeepSpeed's engine actually runs with (``deepspeed_in_effect.json``).

DeepSpeed ignores keys it does not know, so the JSON autotune wrote is not proof of what runs: the
record is read back from the engine and its ZeRO optimizer, and tests compare the two.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from autotune.errors import UserError
from autotune.rundir.layout import DEEPSPEED_IN_EFFECT, ENGINE_FLAVOUR_FILE, PLAN, PLAN_ENV


def read_ds_config(plan_path: str | Path | None) -> dict:
    plan_path = plan_path or os.environ.get(PLAN_ENV)
    path = Path(plan_path).with_name(ENGINE_FLAVOUR_FILE) if plan_path else None
    if path is None or not path.is_file():
        raise UserError(f"the plan's backend is deepspeed but no {ENGINE_FLAVOUR_FILE} lies beside {PLAN} "
                        f"({plan_path or '$' + PLAN_ENV + ' unset'}); launch with `python -m autotune launch`")
    return json.loads(path.read_text())


def in_effect(ds_engine) -> dict:
    """What a ``deepspeed.DeepSpeedEngine`` runs with, read from it and its ZeRO optimizer, not from the
    JSON (a key DeepSpeed does not read would leave its default here). None: not a property of this stage."""
    e, opt = ds_engine, ds_engine.optimizer
    off = e.zero_offload_optimizer()
    return {"zero_stage": e.zero_optimization_stage(),
            "train_micro_batch_size_per_gpu": e.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": e.gradient_accumulation_steps(),
            "gradient_clipping": e.gradient_clipping(),
            "overlap_comm": getattr(opt, "overlap_comm", None),
            "reduce_bucket_size": getattr(opt, "reduce_bucket_size", None),
            "allgather_bucket_size": getattr(opt, "allgather_bucket_size", None),
            "offload_optimizer_device": None if off is None else str(getattr(off.device, "value", off.device)),
            "optimizer_on_cpu": getattr(opt, "cpu_offload", None),
            "zero_optimizer": type(opt).__name__}


def write_in_effect(ds_engine, run_dir: Path) -> None:
    from autotune.rundir.fs import write_whole

    write_whole(Path(run_dir) / DEEPSPEED_IN_EFFECT, json.dumps(in_effect(ds_engine), indent=2))
