"""Torch's optimizer from the plan: AdamW, the warm-up/cosine schedule, clipping, fp16 loss scaling, and the plan's
hyperparameters put back after a resume (the single, DDP and FSDP2 engines; DeepSpeed takes the schedule)."""

from __future__ import annotations

import contextlib
import math
from typing import Callable

import torch
import torch.nn as nn

from autotune.plan import TrainingPlan

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


def schedule_lambda(plan: TrainingPlan) -> Callable[[int], float]:
    s = plan.schedule
    return lr_lambda(s.warmup_steps, s.total_steps or 1, s.min_lr_ratio)


class LocalOptimizer:
    """torch.optim AdamW + warm-up/cosine schedule + clipping + fp16 loss scaling, from the plan."""

    def __init__(self, plan: TrainingPlan, module: nn.Module, device: torch.device):
        opt = plan.optimizer
        self.module, self.device, self.precision = module, device, plan.numerics.precision
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=plan.schedule.learning_rate, betas=opt.betas,
                                           eps=opt.eps, weight_decay=opt.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(self.optimizer, schedule_lambda(plan))
        self.clip = opt.gradient_clipping
        self.scaler = torch.amp.GradScaler(device.type, enabled=self.precision == "fp16")
        self.accum = plan.batch.gradient_accumulation_steps

    def autocast(self):
        dtype = _DTYPES.get(self.precision)
        return contextlib.nullcontext() if dtype is None else torch.autocast(device_type=self.device.type, dtype=dtype)

    def backward(self, loss: torch.Tensor) -> None:
        self.scaler.scale(loss / self.accum).backward()

    def step(self) -> float:
        self.scaler.unscale_(self.optimizer)
        params = [p for p in self.module.parameters() if p.grad is not None]
        if self.clip:
            norm = torch.nn.utils.clip_grad_norm_(params, self.clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([p.grad.detach().norm() for p in params]))
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        return float(norm)

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def state_dict(self) -> dict:
        return {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict(),
                "scaler": self.scaler.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.scaler.load_state_dict(state["scaler"])


def apply_hyperparameters(plan: TrainingPlan, optimizer, scheduler) -> None:
    """After a resume: the plan's learning rate, betas, eps and weight decay replace the ones that
    came back with the optimizer and scheduler state; the schedule continues at the restored step
    with this plan's shape (warm-up, total steps, floor are the plan's already: the schedule
    function is never stored)."""
    o, lr = plan.optimizer, plan.schedule.learning_rate
    for group in optimizer.param_groups:
        group.update(betas=tuple(o.betas), eps=o.eps, weight_decay=o.weight_decay, initial_lr=lr)
    scheduler.base_lrs = [lr for _ in optimizer.param_groups]
    factor = schedule_lambda(plan)(scheduler.last_epoch)
    for group in optimizer.param_groups:
        group["lr"] = lr * factor
    scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
