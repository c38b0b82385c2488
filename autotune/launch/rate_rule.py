"""The learning-rate rule: a script's rate read as a schedule (the rate its optimizer was built with, the peak so far
and where it is heading) and judged against the plan's: a warm-up toward the plan's rate is not "different", and a
script that multiplies the rate it was handed by its world size is told the rate to pass. ``rate_verdict`` is the
rate's verdict, as ``verdicts.verdict`` is every other value's (``judgement.judge`` asks each the same way).
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.launch.verdicts import FIX, _fmt, fix_for, verdict

RATE_TOLERANCE = 1e-6  # relative: a rate passed as text and read back


@dataclass(frozen=True)
class Rate:
    """A script's learning rate as a schedule: the rate its optimizer was built with (a torch scheduler's base when
    it has one), the rate at its latest step, the peak so far, the steps read, and whether it is still rising; and
    whether the plan's rate was ``handed`` to it (by a route the script took, or in the DeepSpeed JSON its optimizer
    was built from)."""
    built: float | None
    now: float | None = None
    peak: float | None = None
    steps: int = 0
    rising: bool = False
    handed: bool = True


def _lr(rec: dict, handed: bool = True) -> Rate | None:
    """The rate of the optimizer that steps (the last one made that stepped, else the last one made); DeepSpeed's
    engine's when no optimizer was seen stepping. ``handed``: whether the plan's rate reached it."""
    opts = rec.get("optimizers") or []
    stepped = [o for o in opts if o.get("lr_steps")]
    o = (stepped or opts or [None])[-1]
    ds = rec.get("deepspeed") or {}
    if o is None or not (o.get("lr") or o.get("lr_base") is not None):
        return Rate(ds["lr"][0], handed=handed) if ds.get("lr") else None
    built = o["lr_base"] if o.get("lr_base") is not None else o["lr"][0]
    now, peak = o.get("lr_now"), o.get("lr_max")
    early = [v for v in (o.get("lr_at") or {}).values() if isinstance(v, (int, float))]
    rising = now is not None and peak is not None and now >= peak and any(v < now for v in early)
    return Rate(built, now, peak, o.get("lr_steps") or 0, rising, handed)


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= RATE_TOLERANCE * max(abs(b), 1e-12)


def _rate_verdict(rate: Rate, plan_lr: float, world: int, delivered: bool = True, fix: str | None = None) -> dict:
    """The learning rate judged as a schedule: equal when it reaches the plan's rate or was built at it; warming up
    when built at the plan's rate and still rising toward it; different otherwise (the higher of its target and its
    peak shown), with the fix for a script that multiplies the rate it was handed by its world size (only when the
    plan's rate was handed over: a script's own rate that happens to be the plan's times the world is its own)."""
    if _close(rate.peak, plan_lr) or (_close(rate.built, plan_lr) and not (rate.peak or 0) > plan_lr * 1.000001):
        if rate.rising and not _close(rate.peak, plan_lr):
            return {"status": "warming up", "observed": rate.now, "plan": plan_lr,
                    "note": f"warming up toward {_fmt(plan_lr)} (at {_fmt(rate.now)} after {rate.steps} steps)"}
        return {"status": "equal", "observed": rate.peak if _close(rate.peak, plan_lr) else rate.built,
                "plan": plan_lr}
    seen = max(v for v in (rate.built, rate.peak) if v is not None)
    out = {"status": "different", "observed": seen, "plan": plan_lr, "fix": fix or FIX["learning_rate"]}
    if world > 1 and delivered and _close(seen, plan_lr * world):
        out["fix"] = (f"the script runs the plan's rate times its world size ({_fmt(seen)} = {_fmt(plan_lr)} x "
                      f"{world}): pass {_fmt(plan_lr / world)} (the plan's rate / {world}) to its learning-rate flag; "
                      "--wire auto does when it reads the multiplication in the script")
    return out


def rate_verdict(plan, key: str, seen: Rate | None, want: float, delivery, world: int, micro=None) -> dict:
    """The learning rate's verdict, asked as ``verdicts.verdict`` is for every other value: with no rate seen, as
    any value (not observable, or the script's own); the script's own where the plan only defaults it (DeepSpeed's
    JSON then carries no rate); else the schedule judged (``_rate_verdict``) with this script's fix."""
    if seen is None:
        return verdict(plan, key, None, want, delivery, world, micro)
    value = seen.peak if seen.peak is not None else seen.built
    if key in plan.run.script_defaults:
        return {"status": "yours", "observed": value, "plan": None}
    return _rate_verdict(seen, want, world, seen.handed, fix_for(key, value, plan, delivery, world))
