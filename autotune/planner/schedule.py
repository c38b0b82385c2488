"""The run's length: steps per epoch and in all, as the data stream runs them, with their reasons."""

from __future__ import annotations

from autotune.config import TrainConfig
from autotune.planner.resolve import Resolver


def steps(num_samples: int | None, micro: int, acc: int, world: int, epochs: int | None, max_steps: int | None,
          keep_last: bool = False, drop_partial: bool = False):
    """(steps per epoch, total optimizer steps, micro-batches per process per epoch); None where unknown. As the
    built-in stream runs (runtime/data.py): num_samples // world a process in whole micro-batches, across epochs (a
    step may straddle two; steps per epoch rounded down). ``keep_last``, a user's script under PyTorch's defaults:
    ceil(num_samples / world) a process, the partial micro-batch kept, a step at each epoch's end (rounded up);
    ``drop_partial`` with it: the script's DataLoader drops that partial micro-batch (drop_last=True)."""
    if not num_samples:
        per_epoch = None
    elif keep_last:
        each = -(-num_samples // world)  # rounded up: the last partial share is kept
        per_epoch = each // micro if drop_partial else -(-each // micro)
    else:
        per_epoch = (num_samples // world) // micro
    spe = None
    if per_epoch and keep_last:
        spe = -(-per_epoch // acc)
    elif per_epoch:
        spe = per_epoch // acc
    if max_steps:
        return spe, max_steps, per_epoch
    if not (epochs and per_epoch):
        return spe, None, per_epoch
    total = epochs * spe if keep_last else epochs * per_epoch // acc
    return spe, max(1, total), per_epoch


def count_steps(resolver: Resolver, cfg: TrainConfig, micro: int, acc: int, world: int, max_steps: int | None,
                lr: float, debug: bool, drops_last: str | None = None) -> tuple[int | None, int | None, int | None]:
    """(samples, steps per epoch, total optimizer steps), None where unknown, with their reasons; a warmup as long as
    the run is warned of (it would never reach the learning rate ``lr``). ``drops_last``: where the user's script
    makes a DataLoader with drop_last=True (``ModelFacts.drops_last``)."""
    t = cfg.training
    # a user's script: its data is its own; the figures are known only when the config describes it
    described = t.entrypoint is None or "num_samples" in cfg.data.model_fields_set
    num_samples = cfg.data.num_samples if described else None
    # a user's script runs PyTorch's defaults: the last partial micro-batch kept (the built-in stream drops it)
    keep = bool(t.entrypoint)
    drops = drops_last if keep else None
    spe, total, per_epoch = steps(num_samples, micro, acc, world, t.epochs, max_steps, keep_last=keep,
                                  drop_partial=drops is not None)
    resolver.explain("steps_per_epoch", _per_epoch_reason(num_samples, described, world, micro, acc, per_epoch, spe,
                                                          keep, drops))
    resolver.explain("total_steps", _total_reason(t.epochs, max_steps, per_epoch, spe, acc, total, keep))
    resolver.explain("warmup_steps", f"training.warmup_steps {t.warmup_steps} carried over")
    yours = t.entrypoint is None or "warmup_steps" in t.model_fields_set
    if total and t.warmup_steps >= total and not debug and yours:
        resolver.warnings.append(f"training.warmup_steps {t.warmup_steps} >= the run's {total} optimizer steps: the "
                                 f"learning rate never reaches {lr:.6g} (lower warmup_steps, or train longer)")
    return num_samples, spe, total


def _per_epoch_reason(num_samples: int | None, described: bool, world: int, micro: int, acc: int,
                      per_epoch: int | None, spe: int | None, keep: bool, drops: str | None = None) -> str:
    if not num_samples and described:
        return "data.num_samples unknown"
    if not num_samples:
        return "unknown: your script's data is not described (set data.num_samples to have them counted)"
    if not per_epoch:
        return f"{num_samples} samples give no whole micro-batch of {micro} per process"
    each = -(-num_samples // world) if keep else num_samples // world
    if not each % micro:
        dropped = ""
    elif drops:
        dropped = f" (the last partial one dropped: your DataLoader's drop_last=True, {drops})"
    elif keep:
        dropped = " (the last partial one kept, as PyTorch's DataLoader does without drop_last)"
    else:
        dropped = " (a partial one dropped)"
    whole = "" if keep and not drops else "whole "
    reason = (f"{num_samples} samples / {world} process(es) = {each} each, in {per_epoch} {whole}micro-batches of "
              f"{micro}{dropped} / accumulation {acc} = {per_epoch / acc:g}")
    if keep and per_epoch % acc:
        reason += f", a step at each epoch's end: {spe}"
    return reason


def _total_reason(epochs: int | None, max_steps: int | None, per_epoch: int | None, spe: int | None, acc: int,
                  total: int | None, keep: bool) -> str:
    if max_steps:
        return f"max_steps {max_steps}"
    if not total:
        return "unknown"
    if keep:
        return f"{epochs} epoch(s) x {spe} steps = {total}"
    return f"{epochs} epoch(s) x {per_epoch} micro-batches // accumulation {acc} = {total}"
