"""The training loop of the built-in workload, read top to bottom."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from pathlib import Path

import torch

from autotune.errors import UserError
from autotune.plan import TrainingPlan
from autotune.rundir.contention import as_record, share_between, snapshot
from autotune.rundir.fs import append_text, write_whole
from autotune.rundir.layout import LAUNCH_ID_ENV, METRICS, METRICS_LOG
from autotune.runtime.checkpoint_manager import CheckpointManager
from autotune.runtime.data import BatchStream, eval_batches
from autotune.runtime.deepspeed_io import write_in_effect
from autotune.runtime.dist import (
    DistContext,
    all_reduce_sum,
    check_replicas,
    cleanup,
    init,
    wait_for_everyone,
)
from autotune.runtime.engine import make_engine
from autotune.runtime.metric_sinks import Progress, make_logger
from autotune.runtime.oom_backoff import OomBackoff
from autotune.runtime.preempt import StopRequest
from autotune.runtime.resuming import resume_point
from autotune.runtime.watchdog import Watchdog
from autotune.runtime.workload import build_model, eval_sums, make_datasets


def evaluate(engine, val_ds, ctx: DistContext, batch_size: int) -> dict:
    """Validation over every sample once; sums all-reduced, so it equals a 1-process evaluation."""
    engine.eval()
    sums = eval_sums(engine.module, eval_batches(val_ds, ctx.rank, ctx.world_size, batch_size), ctx.device,
                     engine.autocast)
    engine.train()
    sums = all_reduce_sum(ctx, sums.cpu() if ctx.device.type == "cpu" else sums).tolist()
    loss, correct, tokens, exact, seqs = sums
    return {"val/loss": loss / max(1, tokens), "val/accuracy": correct / max(1, tokens),
            "val/exact_match": exact / max(1, seqs), "val/samples": int(seqs)}


def train(plan: TrainingPlan, run_dir: str | Path, ds_config: dict | None = None,
          plan_path: str | Path | None = None) -> dict:
    """Train the built-in workload under ``plan``; DeepSpeed reads ``ds_config`` or the JSON beside plan_path.

    A resume point, if any, is ``plan.run.resume_from`` (resolved once by the launcher)."""
    if not plan.schedule.total_steps:
        raise UserError("plan: total_steps is unknown; set training.max_steps or data.num_samples with epochs")
    run_dir = Path(run_dir)
    stop = StopRequest(plan.run.preemption_grace_s).install()  # from the start: a signal during setup counts
    eng = plan.engine
    rank = int(os.environ.get("RANK", "0"))

    def hung(code: int, message: str) -> None:
        from autotune.rundir.status import write_status

        write_status(run_dir, rank, code, f"error: {message}")

    watch = Watchdog({"setup": eng.setup_timeout_s, "step": eng.step_timeout_s,
                      "checkpoint": eng.checkpoint_timeout_s}, rank, on_fire=hung)
    watch.enter("setup", "set-up (joining the process group, building the model, resuming)")
    try:
        ctx = init(plan)
        try:
            result = _train(plan, ctx, run_dir, ds_config, plan_path, stop, watch)
        except BaseException:
            cleanup(ctx, barrier=False)
            raise
        cleanup(ctx)
    finally:
        watch.close()
        stop.restore()
    return result


def _train(plan: TrainingPlan, ctx: DistContext, run_dir: Path, ds_config: dict | None,
           plan_path: str | Path | None, stop: StopRequest, watch: Watchdog) -> dict:
    b, run, total = plan.batch, plan.run, plan.schedule.total_steps
    # -- build: the same seed gives every rank the same initial weights (FSDP2: on the meta device, shards made)
    model = build_model(plan.workload, plan.memory.gradient_checkpointing, on_meta=plan.engine.backend == "fsdp")
    train_ds, val_ds = make_datasets(plan.workload.data)
    run_dir.mkdir(parents=True, exist_ok=True)
    engine = make_engine(plan, model, ctx, ds_config=ds_config, plan_path=plan_path)
    if ctx.is_main and engine.name == "deepspeed":  # DeepSpeed's own reading of the plan's JSON
        write_in_effect(engine.model, run_dir)
    ckpts = CheckpointManager(run_dir, ctx, keep_last=run.keep_last)

    # -- resume: the weights, optimizer and position of the checkpoint the launcher (or a restart) names
    step, consumed, saved_micro, resume_path = resume_point(plan, ctx, engine, ckpts, run_dir)
    ld = plan.loader
    stream = BatchStream(train_ds, b.micro_batch_size, ctx.rank, ctx.world_size, run.seed,
                         ld.num_workers, ld.pin_memory, ld.prefetch_factor, start_micro_batch=consumed,
                         saved_micro=saved_micro)
    logger = make_logger(plan, ctx, run_dir)
    progress = Progress(total, step, ctx.is_main, run.progress_bar)
    if ctx.is_main:
        progress.write(
            f"autotune: {plan.engine.backend} x{ctx.world_size} on {plan.engine.device}, micro-batch "
            f"{b.micro_batch_size} x accumulation {b.gradient_accumulation_steps} x "
            f"{ctx.world_size} = {b.global_batch_size} per step, {plan.numerics.precision}, "
            f"{total} steps" + (f", resumed at step {step} from {resume_path}" if resume_path else "")
        )
    accum = b.gradient_accumulation_steps
    log_every, eval_every, save_every = run.log_every_steps, run.eval_every_steps, run.save_every_steps
    history = _History(run_dir / METRICS_LOG, ctx.is_main)
    window = _Window(ctx, b.global_batch_size)
    batches = iter(stream)
    engine.train()
    if ctx.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(ctx.device)
    metrics: dict = {}
    backoff = OomBackoff(plan, ctx, engine, run_dir)
    preempted: dict | None = None
    while step < total:
        # -- one optimizer step: the micro-batches' gradients accumulated, then the update
        watch.enter("step", f"step {step + 1}")
        t0 = time.perf_counter()
        if backoff.enabled:  # out of memory on a rank: every rank retries the step in smaller pieces
            step_loss = backoff.run_step([next(batches) for _ in range(accum)], step + 1)
        else:
            step_loss = torch.zeros((), dtype=torch.float64, device=ctx.device)
            for k in range(accum):
                step_loss += engine.forward_backward(next(batches), boundary=(k == accum - 1)).double()
            step_loss = step_loss / accum
        grad_norm = engine.step()
        step += 1
        window.add(step_loss, t0)

        # -- log the window since the last line: its loss over every rank and samples (a CPU-GPU sync point)
        if step % log_every == 0 or step == total or step == 1:
            metrics = window.close(engine, grad_norm, stream.consumed / stream.per_epoch)
            logger.log(metrics, step)
            history.record({"step": step, **metrics})
            progress.write(
                f"step {step}/{total} | loss {metrics['train/loss']:.4f} | lr {metrics['train/lr']:.2e} | grad_norm "
                f"{grad_norm:.3f} | {metrics['train/samples_per_s']:.0f} samples/s | "
                f"{metrics['train/step_time_s'] * 1000:.0f} ms/step"
            )
        progress.update(1, {"loss": f"{metrics.get('train/loss', float('nan')):.3f}"})

        # -- evaluate every sample of the validation set once, every rank together
        if step % eval_every == 0 or step == total:
            watch.enter("step", f"evaluation at step {step}")
            wait_for_everyone(ctx)
            val = evaluate(engine, val_ds, ctx, max(b.micro_batch_size, 64))
            logger.log(val, step)
            history.record({"step": step, **val})
            progress.write(f"step {step}/{total} | val loss {val['val/loss']:.4f} | "
                           f"val accuracy {val['val/accuracy']:.3f} | exact match {val['val/exact_match']:.3f}")
            wait_for_everyone(ctx)

        # -- checkpoint on schedule and at the end
        saved_now = False
        if (save_every and step % save_every == 0) or (step == total and run.save_at_end):
            with watch.phase("checkpoint", f"checkpoint at step {step}"):
                path = ckpts.save(engine, step, stream.consumed, last=step == total)
            saved_now = True
            progress.write(f"checkpoint: {path}")

        # -- a preemption signal stops every rank after the same step, agreed by all, with a checkpoint
        watch.enter("step", f"step {step} (agreeing whether to stop)")
        signum = stop.agreed(ctx.distributed, ctx.device)
        if signum and step < total:
            if not saved_now:
                with watch.phase("checkpoint", f"checkpoint at step {step} (preempted)"):
                    path = ckpts.save(engine, step, stream.consumed, last=False)
            stop.finished.set()
            name = signal.Signals(signum).name
            progress.write(f"autotune: {name}: stopped after step {step}/{total}; checkpoint: {path}")
            preempted = {"preempted": True, "step": step, "signal": name, "checkpoint": str(path)}
            break
    progress.close()
    logger.close()
    if preempted:
        return preempted

    # -- the end: the data-parallel replicas must hold the same weights; the summary with the measured speed
    watch.enter("step", f"comparing the ranks' weights after step {step}")
    check_replicas(ctx, engine.module, step, run_dir, sharded=plan.engine.backend == "fsdp" or
                   plan.engine.backend == "deepspeed" and plan.engine.zero_stage == 3)
    final = dict(history.entries[-1]) if history.entries else {}
    if ctx.is_main:
        summary = {"launch": os.environ.get(LAUNCH_ID_ENV), "steps": step, "history": history.entries, "final": final,
                   "measured_samples_per_s": window.samples_per_s(), "measured_steps": window.timed_steps,
                   "measured_process": window.process()}  # what this rank's process got meanwhile
        write_whole(run_dir / METRICS, json.dumps(summary, indent=2, default=_nan_safe))
    return final


class _History:
    """Every logged entry, kept for metrics.json; rank 0 also appends each to metrics.jsonl as it comes (a record
    that survives a crash and a resume)."""

    def __init__(self, jsonl: Path, is_main: bool):
        self.jsonl, self.is_main, self.entries = jsonl, is_main, []

    def record(self, entry: dict) -> None:
        self.entries.append(entry)
        if self.is_main:
            append_text(self.jsonl, json.dumps(entry, default=_nan_safe) + "\n")


class _Window:
    """The steps since the last log line: their summed loss (on the CPU), count and time. And the run's speed after
    warm-up: the steps after the first window, which holds the first step's set-up, counted apart."""

    def __init__(self, ctx: DistContext, global_batch: int):
        self.ctx, self.global_batch = ctx, global_batch
        self.loss, self.steps, self.t0 = torch.zeros((), dtype=torch.float64), 0, time.perf_counter()
        self.timed_steps, self.timed_s, self.warm, self.since = 0, 0.0, False, None

    def add(self, step_loss: torch.Tensor, t0: float) -> float:
        """Count a step that started at ``t0``; its time, to the moment its loss reached the CPU."""
        self.loss += step_loss.cpu()  # waits for the step's kernels: a CPU-GPU sync point
        self.steps += 1
        step_time = time.perf_counter() - t0
        if self.warm:
            self.timed_steps, self.timed_s = self.timed_steps + 1, self.timed_s + step_time
        return step_time

    def close(self, engine, grad_norm: float, epoch: float) -> dict:
        """The window's metrics (the loss averaged over its steps and every rank; samples/s and the time of a step
        both over the whole window, so that the log line's two speeds agree), and a new window."""
        ctx = self.ctx
        loss = all_reduce_sum(ctx, self.loss.clone()).item() / (self.steps * ctx.world_size)
        elapsed = time.perf_counter() - self.t0
        metrics = {"train/loss": loss, "train/lr": engine.lr(), "train/grad_norm": grad_norm,
                   "train/samples_per_s": self.steps * self.global_batch / max(elapsed, 1e-9),
                   "train/step_time_s": elapsed / self.steps, "train/epoch": epoch}
        if ctx.device.type == "cuda":
            metrics["train/peak_memory_gib"] = torch.cuda.max_memory_allocated(ctx.device) / 2**30
        self.loss.zero_()
        self.since = self.since or snapshot()  # the speed's steps start: what the process gets from here
        self.steps, self.t0, self.warm = 0, time.perf_counter(), True
        return metrics

    def samples_per_s(self) -> float | None:
        """Samples/s after warm-up (None: no step after the first window)."""
        return self.timed_steps * self.global_batch / self.timed_s if self.timed_steps else None

    def process(self) -> dict | None:
        """What this process got while the speed was measured (rundir.contention): did it have its cores?"""
        return as_record(share_between(self.since, snapshot(), torch.get_num_threads())) if self.since else None


def _nan_safe(x):
    return None if isinstance(x, float) and math.isnan(x) else str(x)
