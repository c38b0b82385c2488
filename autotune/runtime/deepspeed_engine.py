"""DeepSpeed's engine behind the ``Engine`` protocol: its own accumulation, ZeRO, its checkpoints."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable

import torch
import torch.nn as nn

from autotune.plan import TrainingPlan
from autotune.rundir.layout import DEEPSPEED_ENGINE_DIR
from autotune.runtime.dist import DistContext
from autotune.runtime.local_engine import loss_of, to_device
from autotune.runtime.optimizer import apply_hyperparameters, schedule_lambda


class DeepSpeedEngine:
    """DeepSpeed's engine from the plan's JSON: it owns accumulation (the loop's boundary checked against its
    count), casting and the optimizer's step; every rank writes its partition of the checkpoint."""

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
        x, y = to_device(batch, self.ctx.device)
        return self._backward_and_step(loss_of(self.model, self.loss_fn, x, y), boundary)

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
        x, y = to_device(batch, self.ctx.device)
        loss, ran_out = None, False
        try:
            if before_forward is not None:
                before_forward(int(x.shape[0]))
            loss = loss_of(self.model, self.loss_fn, x, y)
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
