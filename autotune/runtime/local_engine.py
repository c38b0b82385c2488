"""The engines that step torch's own optimizer: their base (``TorchEngine``, shared with FSDP2's engine) and
``LocalEngine`` (one process, or DDP)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from autotune.plan import TrainingPlan
from autotune.rundir.layout import MODEL_WEIGHTS, TRAINER_STATE
from autotune.rundir.sharded import sharded_backend
from autotune.runtime.dist import DistContext
from autotune.runtime.optimizer import LocalOptimizer, apply_hyperparameters


def loss_of(model: nn.Module, loss_fn: Callable | None, x, y) -> torch.Tensor:
    """model(x, y) returns the loss, or loss_fn(model(x), y) when a loss_fn was given."""
    return model(x, y) if loss_fn is None else loss_fn(model(x), y)


def to_device(batch, device: torch.device):
    return (t.to(device, non_blocking=True) for t in batch)


class TorchEngine:
    """What single process, DDP and FSDP2 share: the forward and backward of a micro-step over ``model`` under
    ``LocalOptimizer`` (``opt``), the step, the rate, the mode, the accumulation and the hyperparameters after a
    resume. A subclass sets ``plan``, ``ctx``, ``loss_fn``, ``model`` (what runs the forward), ``module`` (the
    unwrapped model) and ``opt``, and says how a micro-step synchronises (``_sync``) and what an interrupted step
    leaves besides its gradients (``_release``)."""

    name: str
    plan: TrainingPlan
    ctx: DistContext
    loss_fn: Callable | None
    model: nn.Module
    module: nn.Module
    opt: LocalOptimizer

    def _sync(self, boundary: bool) -> contextlib.AbstractContextManager:
        """The context a micro-step's forward and backward run in (``boundary``: the accumulation's last)."""
        return contextlib.nullcontext()

    def autocast(self):
        return self.opt.autocast()

    def _loss(self, x, y) -> torch.Tensor:
        return loss_of(self.model, self.loss_fn, x, y)

    def forward_backward(self, batch, boundary: bool) -> torch.Tensor:
        x, y = to_device(batch, self.ctx.device)
        with self._sync(boundary):
            with self.autocast():
                loss = self._loss(x, y)
            self.opt.backward(loss)
        return loss.detach()

    def set_accumulation(self, steps: int) -> None:
        """Micro-steps per optimizer step from now on (each loss is divided by it)."""
        self.opt.accum = steps

    def _drop(self) -> None:
        """Forget the step: its gradients and what ``_release`` names (the GPU's cache emptied after)."""
        self.opt.optimizer.zero_grad(set_to_none=True)
        self._release()
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def _release(self) -> None:
        """What an interrupted step leaves besides its gradients: nothing here."""

    def step(self) -> float:
        return self.opt.step()

    def lr(self) -> float:
        return self.opt.lr()

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def apply_hyperparameters(self) -> None:
        apply_hyperparameters(self.plan, self.opt.optimizer, self.opt.scheduler)


class LocalEngine(TorchEngine):
    """Single process, or DDP (``ddp=True``): torch's optimizer, checkpoint files model.pt + trainer.pt."""

    def __init__(self, plan: TrainingPlan, model: nn.Module, ctx: DistContext, loss_fn: Callable | None = None,
                 ddp: bool = False):
        self.plan, self.ctx, self.loss_fn = plan, ctx, loss_fn
        self.name = "ddp" if ddp else "single"
        self.module = model.to(ctx.device)
        if ddp:
            from torch.nn.parallel import DistributedDataParallel as DDP

            self.model = DDP(self.module, device_ids=[ctx.local_rank] if ctx.device.type == "cuda" else None)
        else:
            self.model = self.module
        self.opt = LocalOptimizer(plan, self.module, ctx.device)

    def _sync(self, boundary: bool):
        # DDP: skip the gradient all-reduce on all but the last micro-step of an accumulation.
        if self.name == "ddp" and not boundary:
            return self.model.no_sync()
        return contextlib.nullcontext()

    def forward_backward_guarded(self, batch, boundary: bool, agree: Callable[[bool], list[int]],
                                 before_forward: Callable[[int], None] | None = None):
        """``forward_backward`` with out-of-memory errors agreed by every rank: ``agree(ran_out)``
        is a collective returning the ranks that ran out. Returns (loss, []) or (None, ranks); in
        the second case every rank has dropped this step's gradients, so the step can be retried
        with smaller pieces.

        Under DDP the forward of a synchronising micro-step prepares a gradient all-reduce that
        every rank must finish: a rank whose forward ran out runs the forward again on one sample,
        and every rank back-propagates zero, so the all-reduce completes and is discarded. An
        out-of-memory error inside that synchronising backward cannot be undone (part of the
        all-reduce has happened) and ends the run."""
        x, y = to_device(batch, self.ctx.device)
        sync_ddp = self.name == "ddp" and boundary
        with self._sync(boundary):
            loss, ran_out = None, False
            try:
                if before_forward is not None:
                    before_forward(int(x.shape[0]))
                with self.autocast():
                    loss = self._loss(x, y)
            except torch.OutOfMemoryError:
                ran_out = True
            who = agree(ran_out)
            if who:
                if sync_ddp:
                    if loss is None:
                        with self.autocast():
                            loss = self._loss(x[:1], y[:1])
                    (loss * 0).backward()
                del loss
                self._drop()
                return None, who
            try:
                self.opt.backward(loss)
            except torch.OutOfMemoryError:
                if sync_ddp:
                    raise
                ran_out = True
            who = agree(ran_out)
            if who:
                del loss
                self._drop()
                return None, who
        return loss.detach(), []

    def full_state_dict(self) -> dict | None:
        return self.module.state_dict() if self.ctx.is_main else None

    def save_state(self, directory: Path, is_main: bool) -> None:
        if is_main:  # identical on every rank (DDP keeps replicas in step): one copy serves any world size
            torch.save(self.opt.state_dict(), directory / TRAINER_STATE)

    def load_state(self, directory: Path) -> None:
        if sharded_backend(directory):  # an FSDP2 checkpoint: its weights and optimizer shards, whole through DCP
            from autotune.runtime.fsdp_checkpoint import load_into_local

            load_into_local(directory, self.module, self.opt.optimizer, self.opt.scheduler)
            return
        weights = torch.load(directory / MODEL_WEIGHTS, map_location=self.ctx.device, weights_only=True)
        self.module.load_state_dict(weights)
        self.opt.load_state_dict(torch.load(directory / TRAINER_STATE, map_location=self.ctx.device,
                                            weights_only=True))
