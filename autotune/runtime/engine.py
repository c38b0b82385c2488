"""One ``Engine`` protocol over single-process, DDP, DeepSpeed and FSDP2 (``autotune.runtime.fsdp``).

The training loop calls, per optimizer step, ``forward_backward(batch, boundary)`` for
each micro-batch (``boundary`` on the last one) and then ``step()``; checkpoints call
``save_state``/``load_state`` and ``full_state_dict``. Two classes implement it, sharing
code by composition (``LocalOptimizer``), not inheritance: ``LocalEngine`` (single, or DDP
with ``ddp=True``) and ``DeepSpeedEngine``.

Gradient accumulation: single and DDP divide the loss by the accumulation steps (DDP
skips the all-reduce with ``no_sync`` off the boundary). Under DeepSpeed the engine owns
accumulation (it scales the loss and counts micro-steps from the JSON); the loop's
``boundary`` is checked against DeepSpeed's count, so the two can never disagree silently.
Hyperparameters come from ``plan.optimizer`` and ``plan.schedule``, the same values the
DeepSpeed JSON carries.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any, Callable, Protocol

import torch
import torch.nn as nn

from autotune.plan import TrainingPlan
from autotune.rundir.layout import DEEPSPEED_ENGINE_DIR, MODEL_WEIGHTS, TRAINER_STATE
from autotune.runtime.deepspeed_io import read_ds_config
from autotune.runtime.dist import DistContext

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


def _loss(model: nn.Module, loss_fn: Callable | None, x, y) -> torch.Tensor:
    """model(x, y) returns the loss, or loss_fn(model(x), y) when a loss_fn was given."""
    return model(x, y) if loss_fn is None else loss_fn(model(x), y)


def _to(batch, device: torch.device):
    return (t.to(device, non_blocking=True) for t in batch)


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


class LocalEngine:
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

    def autocast(self):
        return self.opt.autocast()

    def forward_backward(self, batch, boundary: bool) -> torch.Tensor:
        x, y = _to(batch, self.ctx.device)
        with self._sync(boundary):
            with self.autocast():
                loss = _loss(self.model, self.loss_fn, x, y)
            self.opt.backward(loss)
        return loss.detach()

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
        x, y = _to(batch, self.ctx.device)
        sync_ddp = self.name == "ddp" and boundary
        with self._sync(boundary):
            loss, ran_out = None, False
            try:
                if before_forward is not None:
                    before_forward(int(x.shape[0]))
                with self.autocast():
                    loss = _loss(self.model, self.loss_fn, x, y)
            except torch.OutOfMemoryError:
                ran_out = True
            who = agree(ran_out)
            if who:
                if sync_ddp:
                    if loss is None:
                        with self.autocast():
                            loss = _loss(self.model, self.loss_fn, x[:1], y[:1])
                    (loss * 0).backward()
                self._drop(loss)
                return None, who
            try:
                self.opt.backward(loss)
            except torch.OutOfMemoryError:
                if sync_ddp:
                    raise
                ran_out = True
            who = agree(ran_out)
            if who:
                self._drop(loss)
                return None, who
        return loss.detach(), []

    def set_accumulation(self, steps: int) -> None:
        """Micro-steps per optimizer step from now on (each loss is divided by it)."""
        self.opt.accum = steps

    def _drop(self, loss) -> None:
        del loss
        self.opt.optimizer.zero_grad(set_to_none=True)
        if self.ctx.device.type == "cuda":
            torch.cuda.empty_cache()

    def step(self) -> float:
        return self.opt.step()

    def lr(self) -> float:
        return self.opt.lr()

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def full_state_dict(self) -> dict | None:
        return self.module.state_dict() if self.ctx.is_main else None

    def apply_hyperparameters(self) -> None:
        apply_hyperparameters(self.plan, self.opt.optimizer, self.opt.scheduler)
    def save_state(self, directory: Path, is_main: bool) -> None:
        if is_main:  # identical on every rank (DDP keeps replicas in step): one copy serves any world size
            torch.save(self.opt.state_dict(), directory / TRAINER_STATE)

    def load_state(self, directory: Path) -> None:
        from autotune.runtime import fsdp

        if fsdp.is_sharded(directory):  # an FSDP2 checkpoint: its weights and optimizer shards, whole through DCP
            fsdp.load_into_local(directory, self.module, self.opt.optimizer, self.opt.scheduler)
            return
        weights = torch.load(directory / MODEL_WEIGHTS, map_location=self.ctx.device, weights_only=True)
        self.module.load_state_dict(weights)
        self.opt.load_state_dict(torch.load(directory / TRAINER_STATE, map_location=self.ctx.device,
                                            weights_only=True))


class DeepSpeedEngine:
    name = "deepspeed"

    def __init__(self, plan: TrainingPlan, model: nn.Module, ctx: DistContext, ds_config: dict,
                 loss_fn: Callable | None = None):
        import warnings

        import deepspeed

        # DeepSpeed's ZeRO code calls a torch collective that torch marks deprecated; the warning is
        # theirs to fix and would otherwise be printed by every rank of every run.
        warnings.filterwarnings("ignore", message=r".*all_gather_into_tensor.* is deprecated", category=FutureWarning)
        self.plan, self.ctx, self.loss_fn = plan, ctx, loss_fn
        sched = schedule_lambda(plan)
        self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(
            model=model, model_parameters=model.parameters(), config=ds_config,
            lr_scheduler=lambda opt: torch.optim.lr_scheduler.LambdaLR(opt, sched))
        self.module = self.model.module

    def autocast(self):
        return contextlib.nullcontext()  # DeepSpeed casts the module itself for bf16/fp16

    def forward_backward(self, batch, boundary: bool) -> torch.Tensor:
        x, y = _to(batch, self.ctx.device)
        return self._backward_and_step(_loss(self.model, self.loss_fn, x, y), boundary)

    def _backward_and_step(self, loss: torch.Tensor, boundary: bool) -> torch.Tensor:
        self.model.backward(loss)
        if self.model.is_gradient_accumulation_boundary() != boundary:
            raise RuntimeError(
                f"gradient accumulation out of step: the loop says boundary={boundary}, DeepSpeed counts "
                f"{self.model.gradient_accumulation_steps()} micro-steps per step")
        self.model.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
        return loss.detach().float()

    def forward_backward_guarded(self, batch, boundary: bool, agree: Callable[[bool], list[int]],
                                 before_forward: Callable[[int], None] | None = None):
        """``forward_backward`` with an out-of-memory error in the forward agreed by every rank (see
        ``LocalEngine.forward_backward_guarded``). ZeRO-0/1/2 run no collective in the forward, so a rank
        that ran out there can still join the agreement; nothing of the failed micro-step reached
        DeepSpeed. Retrying the step is clean only at its first micro-step: by a later one, ZeRO has
        already reduced the earlier micro-steps' gradients into its partitions, and every rank stops
        with a clear error instead. Out of memory inside the backward (ZeRO's reduction hooks are
        collectives) ends the run."""
        x, y = _to(batch, self.ctx.device)
        loss, ran_out = None, False
        try:
            if before_forward is not None:
                before_forward(int(x.shape[0]))
            loss = _loss(self.model, self.loss_fn, x, y)
        except torch.OutOfMemoryError:
            ran_out = True
        who = agree(ran_out)
        if who:
            del loss
            done = self.model.micro_steps % self.model.gradient_accumulation_steps()
            if done:
                from autotune.errors import UserError

                raise UserError(
                    f"out of memory on rank {', '.join(map(str, who))} at micro-step {done + 1} of an optimizer "
                    "step under DeepSpeed: the earlier micro-steps' gradients are already reduced, so the step "
                    "cannot be retried with smaller pieces; relaunch with a smaller --batch_size (--resume_from "
                    "auto continues from the newest checkpoint)")
            if self.ctx.device.type == "cuda":
                torch.cuda.empty_cache()
            return None, who
        return self._backward_and_step(loss, boundary), []

    def set_accumulation(self, steps: int) -> None:
        """Micro-steps per optimizer step from now on: DeepSpeed's own accumulation (it divides each loss
        by it and steps at its boundary) and its micro-batch bookkeeping, the global batch unchanged."""
        if steps == self.model.gradient_accumulation_steps():
            return
        splits = steps // self.plan.batch.gradient_accumulation_steps
        micro = -(-self.plan.batch.micro_batch_size // splits)
        self.model.set_train_micro_batch_size(micro)
        self.model.set_train_batch_size(micro * steps * self.model.dp_world_size)
        # the boundary is counted from micro_steps: start the new accumulation at this step's first micro-step
        self.model.micro_steps = self.model.global_steps * steps

    def step(self) -> float:
        norm = self.model.get_global_grad_norm()
        return float(norm) if norm is not None else float("nan")

    def lr(self) -> float:
        return float(self.model.get_lr()[0])

    def train(self) -> None:
        self.model.train()

    def eval(self) -> None:
        self.model.eval()

    def full_state_dict(self) -> dict | None:
        if self.plan.engine.zero_stage == 3:
            # ZeRO-3 partitions the weights: gathering them is a collective every rank joins.
            return self.model._zero3_consolidated_16bit_state_dict()
        return self.module.state_dict() if self.ctx.is_main else None

    def save_state(self, directory: Path, is_main: bool) -> None:
        # every rank writes its partition
        self.model.save_checkpoint(str(directory / DEEPSPEED_ENGINE_DIR), tag="state")

    def load_state(self, directory: Path) -> None:
        from autotune.runtime.checkpoint_manager import weights_only_everywhere

        with weights_only_everywhere():
            self.model.load_checkpoint(str(directory / DEEPSPEED_ENGINE_DIR), tag="state")

    def apply_hyperparameters(self) -> None:
        apply_hyperparameters(self.plan, self.optimizer, self.scheduler)


def make_engine(plan: TrainingPlan, model: nn.Module, ctx: DistContext, loss_fn: Callable | None = None,
                ds_config: dict | None = None, plan_path: str | Path | None = None) -> Engine:
    """Dispatch on the plan's backend (the one place that chooses an engine).

    ``model(x, y)`` must return the loss, unless ``loss_fn(model(x), y)`` is given. DeepSpeed reads
    ``ds_config``, else the ``deepspeed_config.json`` beside ``plan_path`` (default $AUTOTUNE_PLAN).
    """
    backend = plan.engine.backend
    if backend == "fsdp":
        from autotune.runtime.fsdp import FSDPEngine

        return FSDPEngine(plan, model, ctx, loss_fn, LocalOptimizer, apply_hyperparameters)
    if backend == "deepspeed":
        if ds_config is None:
            ds_config = read_ds_config(plan_path)
        return DeepSpeedEngine(plan, model, ctx, ds_config, loss_fn)
    return LocalEngine(plan, model, ctx, loss_fn, ddp=backend == "ddp")

