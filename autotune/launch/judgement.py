"""The judgement of what a user's script observably ran, against the plan, and its wording (``Judgement.line``).

The effective batch is counted from training steps only: the samples that reached the model the script trains in
each of the first steps after the first (its training forwards: never an evaluation batch or a loader's
look-ahead), the most common count per step, summed over the ranks; without such a count, the samples the
DataLoaders yielded per step; with neither, "not observable", never 0. Each plan value is judged by
``verdicts`` (the learning rate by ``rate_rule``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.launch.observed import (
    _engine,
    _micro,
    _optimizer_class,
    _per_step_samples,
    _precision,
    _trained,
    _training_loader,
    _trains_as,
)
from autotune.launch.rate_rule import _lr, _rate_verdict
from autotune.launch.verdicts import FIX, _fmt, divided_accumulation_fix, verdict

TOLERANCE = 0.10  # an effective batch further than this from the plan's is a wrong training


@dataclass
class Judgement:
    values: dict[str, dict] = field(default_factory=dict)  # key -> {status, observed, plan, fix, note}
    effective_batch: float | None = None
    batch_source: str | None = None  # where the effective batch was counted
    world_size: int | None = None
    steps: int = 0
    wrong: list[str] = field(default_factory=list)  # why the training is not the plan's (batch, engine, rate)
    notes: list[str] = field(default_factory=list)  # what the user should know and no status says
    unjudged: list[str] = field(default_factory=list)  # what --strict cannot judge: not observable

    def to_record(self) -> dict:
        return {"values": self.values, "effective_batch": self.effective_batch, "batch_source": self.batch_source,
                "world_size": self.world_size, "steps_observed": self.steps, "wrong": self.wrong, "notes": self.notes,
                "unjudged": self.unjudged}

    def line(self) -> str:
        def of(status):
            return [k for k, v in self.values.items() if v["status"] == status]

        diff = [f"{k} {_fmt(v['observed'])} (plan {_fmt(v['plan'])})" for k, v in self.values.items()
                if v["status"] == "different"]
        warming = [f"{k} {v['note']}" for k, v in self.values.items() if v["status"] == "warming up"]
        yours = [f"{k} {_fmt(v['observed'])}" for k, v in self.values.items()
                 if v["status"] == "yours" and v["observed"] is not None]
        eff = "not observable" if self.effective_batch is None else _fmt(self.effective_batch)
        return (f"observed after {self.steps} step(s): effective batch {eff} per optimizer step"
                + (f" ({self.batch_source})" if self.batch_source else "")
                + f"; as planned: {', '.join(of('equal')) or 'nothing'}"
                + (f"; {'; '.join(warming)}" if warming else "")
                + (f"; the script's own: {', '.join(yours)}" if yours else "")
                + (f"; different: {'; '.join(diff)}" if diff else "")
                + (f"; not observable: {', '.join(of('not observable'))}" if of("not observable") else ""))



BATCH_SOURCES = ("the model's training inputs", "the DataLoaders' batches, evaluation included")


def judge(plan, observed: list[dict], delivery=None) -> Judgement:
    """Each plan value as observed in the script's processes (all ranks agree, or rank 0 speaks for them).
    ``delivery`` (autotune.exports.wiring.Delivery): what was handed over, read from the script before the launch:
    whether --wire auto ran (its fixes do not suggest it again), whether the script divides its accumulation by its
    world size (only then is an accumulation of plan / world put down to that)."""
    wired = bool(delivery is not None and delivery.wired)
    divides = delivery.divides_accumulation if delivery is not None else None
    j = Judgement()
    if not observed:
        return j
    first = min(observed, key=lambda r: r["rank"])
    pg = first.get("process_group") or {}
    world = pg.get("world_size") or (len(observed) if len(observed) > 1 else 1)
    j.world_size, j.steps = world, min(r.get("steps") or 0 for r in observed)
    rates = [_per_step_samples(r) for r in observed]
    if rates and all(x is not None for x in rates):
        j.effective_batch = sum(rates) / len(rates) * world
        j.batch_source = BATCH_SOURCES[0 if all(_trained(r) for r in observed) else 1]
    b, eng = plan.batch, plan.engine
    micro = _micro(first)
    trained = _trained(first)
    acc = None  # measured (backward passes per step, or samples per step / micro-batch), else the engine's word
    if trained is not None and (trained[2] or trained[1]):
        acc = trained[2] or trained[1]
    elif micro and _per_step_samples(first):
        acc = round(_per_step_samples(first) / micro)
    elif first.get("deepspeed"):
        acc = first["deepspeed"].get("gradient_accumulation_steps")
    elif (first.get("accelerate") or {}).get("gradient_accumulation_steps"):
        acc = first["accelerate"]["gradient_accumulation_steps"]
    engine = _trains_as(_engine(first) or ("single" if world == 1 else None), world)
    planned_engine = _trains_as(eng.backend, eng.world_size)
    rate = _lr(first)
    obs = {"micro_batch_size": (micro, b.micro_batch_size),
           "gradient_accumulation_steps": (acc, b.gradient_accumulation_steps),
           "learning_rate": (rate, plan.schedule.learning_rate),
           "precision": (_precision(first), plan.numerics.precision),
           "num_workers": (_training_loader(first).get("num_workers"), plan.loader.num_workers),
           "world_size": (world, eng.world_size), "engine": (engine, planned_engine)}
    ds = first.get("deepspeed") or {}
    json_rate = bool(ds) and not ds.get("script_optimizer")  # DeepSpeed built the optimizer from autotune's JSON
    for key, (seen, want) in obs.items():
        if key == "learning_rate" and seen is not None:
            seen_value = seen.peak if seen.peak is not None else seen.built
            if key in plan.run.script_defaults and not json_rate:
                j.values[key] = {"status": "yours", "observed": seen_value, "plan": None}
            else:
                handed = delivery is None or key not in delivery.advisory or json_rate
                j.values[key] = _rate_verdict(seen, want, world, handed)
            continue
        j.values[key] = verdict(plan, key, seen, want, wired)
    divided_accumulation_fix(j.values["gradient_accumulation_steps"], divides, world, wired)
    if (first.get("deepspeed") or {}).get("script_optimizer"):
        note = ("the script passes its own optimizer to deepspeed.initialize: DeepSpeed ignores the JSON's optimizer "
                "and learning rate")
        j.values["learning_rate"]["note"] = note
        ran = j.values["learning_rate"].get("observed")
        j.notes.append(note + (f" (the script's optimizer runs at {_fmt(ran)})" if ran is not None else ""))
    if j.effective_batch is None:
        j.unjudged.append("the effective batch (nothing the script trained could be counted: no training forward of a "
                          "model it wrapped or optimized, no DataLoader batch)")
    elif abs(j.effective_batch - b.global_batch_size) > TOLERANCE * b.global_batch_size:
        fixes = [j.values[k]["fix"] for k in ("micro_batch_size", "gradient_accumulation_steps")
                 if j.values[k]["status"] == "different"]  # the fix for each part of it seen different
        j.wrong.append(f"the script trains an effective batch of {_fmt(j.effective_batch)} samples per optimizer step, "
                       f"the plan {b.global_batch_size} ({b.micro_batch_size} x {b.gradient_accumulation_steps} x "
                       f"{eng.world_size})" + (f": {'; '.join(fixes)}" if fixes else ""))
    if engine is not None and engine != planned_engine:
        j.wrong.append(f"the script runs {engine}, the plan {planned_engine}: {FIX['engine']}")
    cls = _optimizer_class(first)
    if cls is not None and "adam" not in cls.lower():  # never handed over: the script's own, and what the plan assumed
        j.values["optimizer"] = {"status": "yours", "observed": cls, "plan": None}
        j.notes.append(f"the script's optimizer is {cls}, not AdamW: the plan's memory estimate and time assume "
                       "AdamW's two fp32 states a parameter (more memory than most others keep)")
    rate_v = j.values.get("learning_rate", {})
    if rate_v.get("status") == "different":  # a rate the plan set (a script's own default is "yours", not this)
        why = rate_v.get("note") or rate_v["fix"].format(learning_rate=_fmt(rate_v["plan"]))
        j.wrong.append(f"the script trains at learning rate {_fmt(rate_v['observed'])}, the plan "
                       f"{_fmt(rate_v['plan'])}: {why}")
    return j
