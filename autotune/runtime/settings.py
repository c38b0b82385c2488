"""The plan, read once into a small struct the runtime passes around."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

from autotune.errors import UserError


@dataclass(frozen=True)
class Settings:
    backend: str
    device: str
    precision: str
    tf32: bool
    zero_stage: int | None
    micro_batch_size: int
    gradient_accumulation_steps: int
    global_batch_size: int
    world_size: int
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None
    gradient_checkpointing: bool
    learning_rate: float
    warmup_steps: int
    total_steps: int
    config: dict
    plan_path: str | None = None

    @property
    def deepspeed_config_path(self) -> str | None:
        if self.plan_path is None:
            return None
        p = Path(self.plan_path).with_name("deepspeed_config.json")
        return str(p) if p.exists() else None


def settings_from_plan(plan: dict, plan_path: str | None = None) -> Settings:
    total = plan.get("total_steps")
    if not total:
        raise UserError("plan: total_steps is unknown; set training.max_steps or data.num_samples with epochs")
    return Settings(
        backend=plan["backend"], device=plan["device"], precision=plan["precision"], tf32=plan["tf32"],
        zero_stage=plan["zero_stage"], micro_batch_size=plan["micro_batch_size"],
        gradient_accumulation_steps=plan["gradient_accumulation_steps"],
        global_batch_size=plan["global_batch_size"], world_size=plan["world_size"],
        num_workers=plan["num_workers"], pin_memory=plan["pin_memory"], prefetch_factor=plan["prefetch_factor"],
        gradient_checkpointing=plan["gradient_checkpointing"], learning_rate=plan["learning_rate"],
        warmup_steps=plan["warmup_steps"], total_steps=total, config=plan["config"], plan_path=plan_path,
    )


def read_plan(path: str | None) -> dict:
    """plan.json (``path`` or $AUTOTUNE_PLAN) as a dict; a missing or broken file is a UserError."""
    path = path or os.environ.get("AUTOTUNE_PLAN")
    if not path:
        raise UserError("no plan: pass --plan PATH or --config FILE, or launch with `python -m autotune launch` "
                        "(which sets AUTOTUNE_PLAN)")
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise UserError(f"--plan: no such file {path!r}") from None
    except (OSError, json.JSONDecodeError) as e:
        raise UserError(f"--plan: cannot read {path!r}: {e}") from None


def load_settings(path: str | None = None) -> Settings:
    """Read plan.json (``path`` or $AUTOTUNE_PLAN) once."""
    path = path or os.environ.get("AUTOTUNE_PLAN")
    return settings_from_plan(read_plan(path), path)
