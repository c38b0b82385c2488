"""The run's speed against the plan's prediction: ``timing.json`` in the run directory, and the line the launch
prints ("predicted X samples/s, measured Y (+-Z %)").

The built-in loop records samples/s after warm-up (the first logged window, which holds the first step's set-up,
is left out: ``measured_samples_per_s`` in metrics.json); a user's script's figure can come from its observer
later through ``compare`` with the figure it counted. Off by more than ``WARN_FRACTION`` is a warning naming both.

A run's speed is kept for later plans (``rundir.speeds``) only when rank 0's process had its cores while it was
measured (``under_load``); such a quiet run replaces the CPU step timing its plan used when that was measured under
load or is contradicted by more than 2x (``replace_timing``).
"""

from __future__ import annotations

import json
from pathlib import Path

WARN_FRACTION = 0.25
KEPT_AFTER_STEPS = 10  # a speed counted over fewer optimizer steps calibrates no later plan (too few to be steady)
CONTRADICTED = 2.0  # a quiet run this many times faster or slower than its timed prediction replaces the timing


def settings(plan) -> dict:
    """What a measured speed belongs to: the same model on the same kind of GPU with these settings."""
    e, b = plan.engine, plan.batch
    return {"hardware": plan.hardware, "backend": e.backend, "zero_stage": e.zero_stage,
            "offload_optimizer": e.offload_optimizer, "world_size": e.world_size,
            "micro_batch_size": b.micro_batch_size, "gradient_accumulation_steps": b.gradient_accumulation_steps,
            "precision": plan.numerics.precision, "gradient_checkpointing": plan.memory.gradient_checkpointing,
            "model": (plan.memory.estimate.model_source if plan.memory.estimate else None)}


def compare(plan, measured: float | None, source: str, steps: int | None = None) -> tuple[dict, list[str]]:
    """(the timing.json record, the lines to print). ``measured``: samples/s after warm-up, or None; ``steps``: the
    optimizer steps it was counted over (fewer than ``KEPT_AFTER_STEPS``: said, never warned about)."""
    te = plan.schedule.time_estimate
    predicted = te.samples_per_s if te is not None else None
    record = {"predicted_samples_per_s": predicted, "measured_samples_per_s": measured,
              "prediction_basis": te.basis if te is not None else None, "measured_by": source,
              "settings": settings(plan)}
    if measured is None:
        return record, [f"speed: predicted {_fmt(predicted)} samples/s, not measured ({source})"]
    if predicted is None:
        why = next(iter(te.unknown.values()), "") if te is not None and te.unknown else ""
        return record, [f"speed: measured {measured:,.1f} samples/s (no prediction{': ' + why if why else ''})"]
    off = (measured - predicted) / predicted
    record["error_fraction"] = round(off, 4)
    lines = [f"speed: predicted {predicted:,.1f} samples/s, measured {measured:,.1f} ({off * 100:+.0f} %)"]
    if steps is not None and steps < KEPT_AFTER_STEPS:
        lines[0] += (f", over {steps} optimizer step(s) after warm-up: too few to judge the prediction (or to "
                     f"calibrate a later plan; {KEPT_AFTER_STEPS} do)")
    elif abs(off) > WARN_FRACTION:
        lines.append(f"warning: the prediction ({predicted:,.1f} samples/s) is off by {off * 100:+.0f} % from what "
                     f"this run measured ({measured:,.1f} samples/s); basis: {te.basis}")
    return record, lines


def _fmt(v) -> str:
    return "unknown" if v is None else f"{v:,.1f}"


def _measured(metrics: dict) -> tuple[float | None, int | None]:
    """(samples/s after warm-up, the optimizer steps it was counted over) from metrics.json's record."""
    value, steps = metrics.get("measured_samples_per_s"), metrics.get("measured_steps")
    rate = float(value) if isinstance(value, (int, float)) and value > 0 else None
    return rate, steps if isinstance(steps, int) else None  # None: an older metrics.json that does not say


def read_metrics(run_dir: Path) -> dict:
    """metrics.json as a dict ({} when missing, damaged, a link or not a regular file: never followed, never a
    hang on a named pipe)."""
    from autotune.rundir.layout import METRICS
    from autotune.rundir.records import read_record

    return read_record(Path(run_dir) / METRICS)


def under_load(metrics: dict) -> str | None:
    """Why the run's speed is not this machine's own (None: it is): rank 0's process did not have its cores while
    it was measured (``measured_process`` of metrics.json's record); where it does not say, the machine is busy
    now."""
    from autotune.rundir import contention

    got = contention.from_record(metrics.get("measured_process"))
    if got is not None:
        why = got.under_load()
        return f"measured under load: {why}" if why else None
    return contention.busy_now()


def replace_timing(setup, record: dict) -> list[str]:
    """A quiet run's speed replaces the step timing its plan was timed by (``measure.timing``) where that timing
    was measured under load, or where this run contradicts it by more than ``CONTRADICTED``x: the lines that say
    so (the next plan times the step again; this run's figure calibrates a plan with its settings)."""
    plan = setup.plan
    if plan.engine.device != "cpu" or plan.run.entrypoint:
        return []
    from autotune.measure.timing import builtin_entry, forget, read_kept, times_here

    if not times_here(setup.hardware, plan):
        return []
    where = builtin_entry(plan, setup.hardware)
    kept = read_kept(where)
    predicted, measured = record.get("predicted_samples_per_s"), record.get("measured_samples_per_s")
    if kept is None or not measured:
        return []
    timed = (record.get("prediction_basis") or "").startswith("timed on this CPU")
    if kept.under_load:
        why = "it was measured under load"
    elif timed and predicted and not 1 / CONTRADICTED <= measured / predicted <= CONTRADICTED:
        why = f"this run measured {measured / predicted:.2g}x what it predicted"
    else:
        return []
    if not forget(where):
        return []
    return [f"speed: the step timing of {kept.measured_at or 'an earlier plan'} is replaced by this run's measured "
            f"speed ({why}); the next plan times the step again"]


def write(run_dir: Path, record: dict) -> Path:
    from autotune.rundir.fs import write_whole
    from autotune.rundir.layout import TIMING

    path = Path(run_dir) / TIMING
    write_whole(path, json.dumps(record, indent=2) + "\n")  # never through a link
    return path


def report(setup, run_dir: Path, out, metrics: dict | None = None) -> None:
    """After a run of the built-in loop: compare, print, write timing.json and keep the measured figure for later
    plans of the same model on this kind of machine (``autotune.rundir.speeds``; node 0); never fails the launch.
    ``metrics``: metrics.json's record as the launch read it (read here when not given)."""
    from autotune.planner.memory import strategy_of
    from autotune.rundir.speeds import record as keep

    plan = setup.plan
    metrics = read_metrics(run_dir) if metrics is None else metrics
    measured, steps = _measured(metrics)
    record, lines = compare(plan, measured, "the built-in loop, after its first logged window", steps)
    busy = record["measured_under_load"] = under_load(metrics) if measured is not None else None
    from autotune.errors import UserError

    try:
        write(run_dir, record)
    except (OSError, UserError) as e:  # a full disk, or a link planted after the launch's check: one line
        lines.append(f"warning: timing.json not written ({e})")
    if measured is not None and (steps or 0) >= KEPT_AFTER_STEPS and plan.engine.node_rank == 0:
        if busy:
            lines.insert(1, f"speed: not kept to calibrate later plans: {busy}")
        else:
            keep(*setup.speed_key, plan, strategy_of(plan.engine), measured, record["predicted_samples_per_s"],
                 Path(run_dir).absolute())
            lines += replace_timing(setup, record)
    for line in lines:
        print(line, file=out)
