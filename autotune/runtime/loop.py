"""The training loop of the built-in workload, read top to bottom."""

from __future__ import annotations

import json
import math
import os
import signal
import sys
import time
from pathlib import Path

import torch

from autotune.errors import UserError
from autotune.plan import TrainingPlan
from autotune.rundir.contention import as_record, share_between, snapshot
from autotune.rundir.fs import append_text, write_whole
from autotune.rundir.layout import (
    BACKOFF,
    INJECT_OOM_ENV,
    METRICS,
    METRICS_LOG,
    METRICS_SUPERSEDED,
    RESUMES,
)
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
from autotune.runtime.preempt import StopRequest
from autotune.runtime.watchdog import Watchdog
from autotune.runtime.workload import build_model, eval_sums, make_datasets
from autotune.safe_input import read_text


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
    step, consumed, saved_micro, resume_path = _resume(plan, ctx, engine, ckpts, run_dir)
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
        summary = {"steps": step, "history": history.entries, "final": final,
                   "measured_samples_per_s": window.samples_per_s(), "measured_steps": window.timed_steps,
                   "measured_process": window.process()}  # what this rank's process got meanwhile
        write_whole(run_dir / METRICS, json.dumps(summary, indent=2, default=_nan_safe))
    return final


def _resume(plan: TrainingPlan, ctx: DistContext, engine, ckpts: CheckpointManager, run_dir: Path):
    """(step, micro-batches consumed, the checkpoint's micro-batch, the checkpoint or None): where training starts.
    The launcher's ``plan.run.resume_from``; after torchrun restarted the group (--max_restarts), the newest
    checkpoint that verifies. Rank 0 moves what was logged after that step aside and records the resume."""
    resume_path = Path(plan.run.resume_from) if plan.run.resume_from else None
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") or 0)
    if restart > 0:
        def warn(msg: str) -> None:
            print(f"autotune: warning: {msg}", file=sys.stderr, flush=True)

        resume_path = ckpts.newest_good(warn) or resume_path
        if ctx.is_main:
            print(f"autotune: restart {restart}: " + (f"resuming from {resume_path}" if resume_path
                                                       else "no checkpoint yet, starting over"), flush=True)
    if resume_path is None:
        return 0, 0, None, None
    meta = ckpts.load(engine, resume_path)
    step = meta["step"]
    if ctx.is_main:
        _forget_after(run_dir / METRICS_LOG, step)
        _record_resume(run_dir, resume_path, step, meta.get("changed", {}))
    return step, meta["micro_batches_consumed"], meta.get("micro_batch_size"), resume_path


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


def _record_resume(run_dir: Path, path: Path, step: int, changed: dict) -> None:
    """Say and record what this resume changed against the checkpoint (applied from ``step`` on)."""
    from autotune.rundir.checkpoints import describe_changes

    if changed:
        print(f"autotune: changed since {path.name} (applied from step {step + 1}): {describe_changes(changed)}",
              flush=True)
    append_text(run_dir / RESUMES, json.dumps({
        "step": step, "checkpoint": str(path), "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "changed": {k: {"checkpoint": a, "now": b} for k, (a, b) in changed.items()}}) + "\n")


def _forget_after(jsonl: Path, step: int) -> None:
    """Resuming at ``step`` repeats what was logged after it: move those entries to
    metrics.superseded.jsonl, so metrics.jsonl has each step once."""
    if not jsonl.exists():
        return
    keep, drop = [], []
    for line in read_text(jsonl, METRICS_LOG, limit=1 << 30, follow_links=False).splitlines():
        try:
            later = json.loads(line).get("step", 0) > step
        except (ValueError, AttributeError, TypeError):
            later = False
        (drop if later else keep).append(line)
    if not drop:
        return
    append_text(jsonl.parent / METRICS_SUPERSEDED, "\n".join(drop) + "\n")
    write_whole(jsonl, "".join(x + "\n" for x in keep))


def _nan_safe(x):
    return None if isinstance(x, float) and math.isnan(x) else str(x)
