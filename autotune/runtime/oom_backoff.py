"""Out of memory on a rank, in the built-in loop: every rank retries the step together in smaller pieces (the
global batch unchanged), said and recorded in backoff.jsonl."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from autotune.errors import UserError
from autotune.plan import TrainingPlan
from autotune.rundir.fs import append_text
from autotune.rundir.layout import BACKOFF, INJECT_OOM_ENV
from autotune.runtime.dist import DistContext


class OomBackoff:
    """Out of memory on some ranks -> every rank backs off together (single process and DDP).

    On CUDA, each micro-step's forward and backward end with a collective on an "ran out" flag
    (two small all-reduces per micro-step); when any rank ran out, every rank drops the step's
    gradients, the step's micro-batches are split in two (micro-batch halves, accumulation
    doubles, the global batch and its samples are unchanged) and the same step is retried. The
    change is printed and appended to ``backoff.jsonl``; it holds for the rest of the run. At
    micro-batch 1 there is nothing smaller to try: a clear error. Under DeepSpeed ZeRO-0/1/2 the
    step is retried when the forward of its first micro-step ran out (the usual case: every
    micro-step has the same shapes), with DeepSpeed's accumulation and micro-batch set to match;
    not under ZeRO-3. Off on CPU (running out of host memory is the kernel's OOM killer, not an
    exception); ``AUTOTUNE_INJECT_OOM=rank:step:max_rows`` turns it on and makes
    that rank run out from that step on whenever a piece has more than max_rows samples
    (fault injection for the tests).
    """

    def __init__(self, plan: TrainingPlan, ctx: DistContext, engine, run_dir: Path):
        self.ctx, self.engine, self.run_dir = ctx, engine, run_dir
        self.micro, self.accum, self.splits = plan.batch.micro_batch_size, plan.batch.gradient_accumulation_steps, 1
        self.inject = _injection(os.environ.get(INJECT_OOM_ENV, ""), ctx.rank)
        # ZeRO-3 gathers parameters inside the forward (a collective a rank that ran out never joins): no back-off
        zero3 = plan.engine.backend == "deepspeed" and plan.engine.zero_stage == 3
        self.enabled = not zero3 and (ctx.device.type == "cuda" or self.inject is not None)
        self.step = 0

    def agree(self, ran_out: bool) -> list[int]:
        flags = torch.zeros(self.ctx.world_size, dtype=torch.int32, device=self.ctx.device)
        flags[self.ctx.rank] = int(ran_out)
        if self.ctx.distributed and torch.distributed.is_initialized():
            torch.distributed.all_reduce(flags)
        return [i for i, f in enumerate(flags.tolist()) if f]

    def _before_forward(self, rows: int) -> None:
        if self.inject is not None and self.step >= self.inject[0] and rows > self.inject[1]:
            raise torch.OutOfMemoryError(f"injected: {rows} rows > {self.inject[1]} ({INJECT_OOM_ENV})")

    def run_step(self, batches: list, step: int) -> torch.Tensor:
        """One optimizer step's forward/backward over ``batches``; returns the mean loss."""
        self.step = step
        while True:
            pieces = [piece for b in batches for piece in zip(*(t.tensor_split(self.splits) for t in b))]
            self.engine.set_accumulation(self.accum * self.splits)
            total = torch.zeros((), dtype=torch.float64, device=self.ctx.device)
            who: list[int] = []
            for i, piece in enumerate(pieces):
                loss, who = self.engine.forward_backward_guarded(piece, i == len(pieces) - 1, self.agree,
                                                                 self._before_forward)
                if who:
                    break
                total += loss.double()
            if not who:
                return total / len(pieces)
            self._back_off(who, step)

    def _back_off(self, who: list[int], step: int) -> None:
        micro = -(-self.micro // self.splits)
        ranks = ", ".join(map(str, who))
        if micro <= 1:
            raise UserError(f"out of memory on rank {ranks} at step {step} with micro-batch 1: nothing smaller "
                            "to try; this model does not fit this way (see `python -m autotune estimate`: "
                            "gradient checkpointing, ZeRO-3 or offload)")
        self.splits *= 2
        new_micro, new_accum = -(-self.micro // self.splits), self.accum * self.splits
        if self.ctx.is_main:
            print(f"autotune: out of memory on rank {ranks} at step {step} with micro-batch {micro}: every rank "
                  f"retries the step with micro-batch {new_micro} x accumulation {new_accum} (global batch "
                  f"unchanged); recorded in {BACKOFF}", flush=True)
            append_text(self.run_dir / BACKOFF, json.dumps({
                "step": step, "ranks": who, "micro_batch_size": new_micro, "gradient_accumulation_steps": new_accum,
                "was_micro_batch_size": micro}) + "\n")


def _injection(spec: str, rank: int) -> tuple[int, int] | None:
    try:
        r, s, rows = (int(x) for x in spec.split(":"))
    except ValueError:
        return None
    return (s, rows) if r == rank else (10**12, 0)
