"""One ``Engine`` protocol over single-process, DDP, DeepSpeed and FSDP2 (``autotune.runtime.fsdp``).

The training loop calls, per optimizer step, ``forward_backward(batch, boundary)`` for
each micro-batch (``boundary`` on the last one) and then ``step()``; checkpoints call
``save_state``/``load_state`` and ``full_state_dict``. Three classes implement it, and
``make_engine`` here is the one place that chooses among them: ``LocalEngine`` (single, or DDP
with ``ddp=True``; ``runtime.local_engine``) and ``FSDPEngine`` (``runtime.fsdp``), which share
one base (``TorchEngine``: torch's own optimizer, ``runtime.optimizer``), and ``DeepSpeedEngine``
(``runtime.deepspeed_engine``).

Gradient accumulation: single and DDP divide the loss by the accumulation steps (DDP
skips the all-reduce with ``no_sync`` off the boundary). Under DeepSpeed the engine owns
accumulation (it scales the loss and counts micro-steps from the JSON); the loop's
``boundary`` is checked against DeepSpeed's count, so the two can never disagree silently.
Hyperparameters come from ``plan.optimizer`` and ``plan.schedule``, the same values the
DeepSpeed JSON carries.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import torch.nn as nn

from autotune.plan import TrainingPlan
from autotune.runtime.deepspeed_io import read_ds_config
from autotune.runtime.dist import DistContext
from autotune.runtime.local_engine import LocalEngine


class Engine(Protocol):
    name: str
    plan: TrainingPlan
    module: nn.Module  # the unwrapped model

    def forward_backward(self, batch: tuple[Any, ...], boundary: bool) -> torch.Tensor: ...
    def step(self) -> float: ...
    def lr(self) -> float: ...
    def train(self) -> None: ...
    def eval(self) -> None: ...
    def autocast(self) -> contextlib.AbstractContextManager: ...
    def full_state_dict(self) -> dict | None: ...
    def save_state(self, directory: Path, is_main: bool) -> None: ...
    def load_state(self, directory: Path) -> None: ...
    def apply_hyperparameters(self) -> None: ...


def make_engine(plan: TrainingPlan, model: nn.Module, ctx: DistContext, loss_fn: Callable | None = None,
                ds_config: dict | None = None, plan_path: str | Path | None = None) -> Engine:
    """Dispatch on the plan's backend (the one place that chooses an engine).

    ``model(x, y)`` must return the loss, unless ``loss_fn(model(x), y)`` is given. DeepSpeed reads
    ``ds_config``, else the ``deepspeed_config.json`` beside ``plan_path`` (default $AUTOTUNE_PLAN).
    """
    backend = plan.engine.backend
    if backend == "fsdp":
        from autotune.runtime.fsdp import FSDPEngine

        return FSDPEngine(plan, model, ctx, loss_fn)
    if backend == "deepspeed":
        from autotune.runtime.deepspeed_engine import DeepSpeedEngine

        if ds_config is None:
            ds_config = read_ds_config(plan_path)
        return DeepSpeedEngine(plan, model, ctx, ds_config, loss_fn)
    return LocalEngine(plan, model, ctx, loss_fn, ddp=backend == "ddp")

