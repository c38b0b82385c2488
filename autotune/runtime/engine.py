"""One engine interface over single-process, DDP and DeepSpeed.

The training loop calls, per optimizer step, ``forward_backward(batch, boundary)``
for each micro-batch (``boundary`` on the last one) and then ``step()``. Each
backend does accumulation its own way: plain/DDP divide the loss by the
accumulation steps (DDP skips the all-reduce with ``no_sync`` off the boundary);
DeepSpeed scales and counts micro-steps itself.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable

import torch
import torch.nn as nn

from autotune.runtime.dist import DistContext
from autotune.runtime.settings import Settings

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def lr_lambda(warmup_steps: int, total_steps: int, min_ratio: float) -> Callable[[int], float]:
    """Linear warm-up, then cosine decay to ``min_ratio`` of the peak at ``total_steps``."""

    def f(step: int) -> float:
        if warmup_steps and step < warmup_steps:
            return (step + 1) / warmup_steps
        span = max(1, total_steps - warmup_steps)
        progress = min(1.0, (step - warmup_steps) / span)
        return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))

    return f


class Engine:
    """Base: the single-process engine. ``module`` is always the unwrapped model."""

    name = "single"

    def __init__(self, settings: Settings, model: nn.Module, ctx: DistContext, loss_fn: Callable | None = None):
        self.settings, self.ctx, self.loss_fn = settings, ctx, loss_fn
        self.module = model.to(ctx.device)
        self.model = self._wrap(self.module)
        t = settings.config["training"]
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=settings.learning_rate, betas=(0.9, 0.95),
                                           eps=1e-8, weight_decay=t["weight_decay"])
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_lambda(settings.warmup_steps, settings.total_steps, t["min_lr_ratio"]))
        self.clip = t.get("gradient_clipping")
        fp16 = settings.precision == "fp16"
        self.scaler = torch.amp.GradScaler(ctx.device.type, enabled=fp16)
        self.accum = settings.gradient_accumulation_steps

    def _wrap(self, module: nn.Module) -> nn.Module:
        return module

    def autocast(self):
        dtype = _DTYPES.get(self.settings.precision)
        if dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.ctx.device.type, dtype=dtype)

    def _sync_context(self, boundary: bool):
        return contextlib.nullcontext()

    def forward_backward(self, batch: tuple[Any, ...], boundary: bool) -> torch.Tensor:
        x, y = (t.to(self.ctx.device, non_blocking=True) for t in batch)
        with self._sync_context(boundary):
            with self.autocast():
                loss = self._loss(x, y)
            self.scaler.scale(loss / self.accum).backward()
        return loss.detach()

    def _loss(self, x, y) -> torch.Tensor:
        """model(x, y) returns the loss, or loss_fn(model(x), y) when a loss_fn was given."""
        if self.loss_fn is None:
            return self.model(x, y)
        return self.loss_fn(self.model(x), y)

    def step(self) -> float:
        self.scaler.unscale_(self.optimizer)
        if self.clip:
            norm = torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in self.module.parameters() if p.grad is not None]))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    # -- checkpoint state --------------------------------------------------
    def trainer_state(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_trainer_state(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


class DDPEngine(Engine):
    name = "ddp"

    def _wrap(self, module: nn.Module) -> nn.Module:
        from torch.nn.parallel import DistributedDataParallel as DDP

        ids = [self.ctx.local_rank] if self.ctx.device.type == "cuda" else None
        return DDP(module, device_ids=ids)

    def _sync_context(self, boundary: bool):
        # Skip the gradient all-reduce on all but the last micro-step of an accumulation.
        return contextlib.nullcontext() if boundary else self.model.no_sync()


class DeepSpeedEngine(Engine):
    name = "deepspeed"

    def __init__(self, settings: Settings, model: nn.Module, ctx: DistContext, ds_config: dict,
                 loss_fn: Callable | None = None):
        import warnings

        import deepspeed

        # DeepSpeed's ZeRO code calls a torch collective that torch marks deprecated; the warning is
        # theirs to fix and would otherwise be printed by every rank of every run.
        warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)
        self.settings, self.ctx, self.loss_fn = settings, ctx, loss_fn
        self.accum = settings.gradient_accumulation_steps
        t = settings.config["training"]
        sched = lr_lambda(settings.warmup_steps, settings.total_steps, t["min_lr_ratio"])
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, sched))
        self.module = self.model.module

    def autocast(self):
        # DeepSpeed casts the module itself for bf16/fp16.
        return contextlib.nullcontext()

    def forward_backward(self, batch, boundary: bool) -> torch.Tensor:
        x, y = (t.to(self.ctx.device, non_blocking=True) for t in batch)
        loss = self._loss(x, y)
        self.model.backward(loss)
        self.model.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        return loss.detach().float()

    def step(self) -> float:
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.model.get_lr()[0])

    def trainer_state(self) -> dict:  # saved through the engine's own checkpoint
        return {}

    def load_trainer_state(self, state: dict) -> None:
        pass


def make_engine(settings: Settings, model: nn.Module, ctx: DistContext, loss_fn: Callable | None = None,
                ds_config: dict | None = None) -> Engine:
    """Dispatch on the plan's backend (the one place that chooses an engine).

    ``model(x, y)`` must return the loss, unless ``loss_fn(model(x), y)`` is given.
    """
    if settings.backend == "deepspeed":
        if ds_config is None:
            import json

            path = settings.deepspeed_config_path
            if path is None:
                raise RuntimeError("deepspeed backend but no deepspeed_config.json beside plan.json")
            with open(path) as f:
                ds_config = json.load(f)
        return DeepSpeedEngine(settings, model, ctx, ds_config, loss_fn)
    if settings.backend == "ddp":
        return DDPEngine(settings, model, ctx, loss_fn)
    return Engine(settings, model, ctx, loss_fn)
