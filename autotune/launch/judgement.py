"""The judgement of what a user's script observably ran, against the plan, and its wording (``Judgement.line``).

The effective batch is counted from training steps only: the samples that reached the model the script trains in
each of the first steps after the first (its training forwards: never an evaluation batch or a loader's
look-ahead), the most common count per step, summed over the ranks; without such a count, the samples the
DataLoaders yielded per step; with neither, "not observable", never 0. Each plan value is judged by
``verdicts`` (the learning rate by ``rate_rule``, its own rule: ``RULES``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from autotune.exports.user_values import carries_plan
from autotune.launch.observed import (
    _accumulation,
    _engine,
    _micro,
    _optimizer_class,
    _per_step_samples,
    _precision,
    _trained,
    _training_loader,
    _trains_as,
    trainings,
    unsynced,
)
from autotune.launch.rate_rule import _lr, rate_verdict
from autotune.launch.resumed import resume_said, resume_verdict, started_over
from autotune.launch.verdicts import (
    _fmt,
    divided_accumulation_fix,
    engine_fix,
    trainings_fix,
    unsynced_fix,
    verdict,
)

TOLERANCE = 0.10  # an effective batch further than this from the plan's is a wrong training
RULES = {"learning_rate": rate_verdict}  # a value judged by a rule of its own; every other by ``verdicts.verdict``


@dataclass
class Judgement:
    values: dict[str, dict] = field(default_factory=dict)  # key -> {status, observed, plan, fix, note}
    effective_batch: float | None = None  # of one training
    batch_source: str | None = None  # where the effective batch was counted
    world_size: int | None = None  # of one training: its process group's
    trainings: int = 1  # independent trainings among the ranks (ranks of no common process group)
    steps: int = 0  # the optimizer steps every rank has taken
    stepped: int = 0  # the most optimizer steps any rank took (0: the script trained nothing)
    wrong: list[str] = field(default_factory=list)  # why the training is not the plan's (batch, engine, rate)
    notes: list[str] = field(default_factory=list)  # what the user should know and no status says
    unjudged: list[str] = field(default_factory=list)  # what --strict cannot judge: not observable
    untaken: list[str] = field(default_factory=list)  # values handed over only by routes the script did not take
    unsynced: bool = False  # the ranks share a process group but never synchronise their gradients
    resume: dict | None = None  # a resumed launch: whether the script continued (launch.resumed), and where

    def to_record(self) -> dict:
        return {"values": self.values, "effective_batch": self.effective_batch, "batch_source": self.batch_source,
                "world_size": self.world_size, "trainings": self.trainings, "steps_observed": self.steps,
                "steps_most": self.stepped, "wrong": self.wrong, "notes": self.notes, "unjudged": self.unjudged,
                "untaken": self.untaken, "unsynced": self.unsynced, "resume": self.resume}

    def line(self) -> str:
        def of(status):
            return [k for k, v in self.values.items() if v["status"] == status]

        diff = [f"{k} {_fmt(v['observed'])} (plan {_fmt(v['plan'])})" for k, v in self.values.items()
                if v["status"] == "different"]
        warming = [f"{k} {v['note']}" for k, v in self.values.items() if v["status"] == "warming up"]
        yours = [f"{k} {_fmt(v['observed'])}" for k, v in self.values.items()
                 if v["status"] == "yours" and v["observed"] is not None]
        eff = "not observable" if self.effective_batch is None else _fmt(self.effective_batch)
        why = ("their ranks share a process group but never synchronise gradients" if self.unsynced else
               "no process group joins their ranks")
        batch = (f"{self.trainings} independent trainings ({why}), effective batch {eff} each" if self.trainings > 1
                 else f"effective batch {eff}")
        return (f"observed after {self.steps} step(s): {batch} per optimizer step"
                + (f" ({self.batch_source})" if self.batch_source else "")
                + f"; as planned: {', '.join(of('equal')) or 'nothing'}"
                + (f"; {'; '.join(warming)}" if warming else "")
                + (f"; the script's own: {', '.join(yours)}" if yours else "")
                + (f"; different: {'; '.join(diff)}" if diff else "")
                + (f"; not observable: {', '.join(of('not observable'))}" if of("not observable") else "")
                + (f"; {resume_said(self.resume)}" if self.resume else ""))


BATCH_SOURCES = ("the model's training inputs", "the DataLoaders' batches, evaluation included")


def taken_routes(delivery, key: str, first: dict) -> list[str]:
    """The routes of ``key`` the script was observed to take: a DeepSpeed JSON route only if it ran
    deepspeed.initialize, Accelerate's variables only if it made an Accelerator. A route it did not take is never
    credited."""
    out = []
    for route in delivery.routes.get(key, []):
        if route.startswith("DeepSpeed JSON") and not first.get("deepspeed"):
            continue
        if "read by Accelerator()" in route and not first.get("accelerate"):
            continue
        out.append(route)
    return out


def _measured_accumulation(first: dict, micro: int | None) -> int | None:
    """Micro-batches per optimizer step: measured (backward passes, or new-input forwards where the script passes a
    micro-batch more than once; else samples per step / micro-batch), else the engine's word."""
    trained = _trained(first)
    if trained is not None and _accumulation(trained):
        return _accumulation(trained)
    if micro and _per_step_samples(first):
        return round(_per_step_samples(first) / micro)
    if first.get("deepspeed"):
        return first["deepspeed"].get("gradient_accumulation_steps")
    return (first.get("accelerate") or {}).get("gradient_accumulation_steps") or None


def judge(plan, observed: list[dict], delivery=None, final: bool = False) -> Judgement:
    """Each plan value as observed in the script's processes (all ranks agree, or rank 0 speaks for them).
    ``delivery`` (autotune.exports.wiring.Delivery): what was handed over, read from the script before the launch:
    whether --wire auto ran (its fixes do not suggest it again), the flags the script declares (the fixes name
    them), whether the script divides its accumulation by its world size (only then is an accumulation of plan /
    world put down to that). ``final``: every rank's script has returned; the steps it trained are judged too."""
    wired = bool(delivery is not None and delivery.wired)
    divides = delivery.divides_accumulation if delivery is not None else None
    j = Judgement()
    if not observed:
        return j
    j.stepped = max(r.get("steps") or 0 for r in observed)
    idle = sorted(r["rank"] for r in observed if not r.get("steps"))
    if j.stepped and idle:  # the ranks that trained are judged; the others are named
        j.notes.append(f"rank {', '.join(map(str, idle))} took no optimizer step: judged on the ranks that trained")
    observed = [r for r in observed if r.get("steps")] or observed
    j.steps = min(r.get("steps") or 0 for r in observed)
    first = min(observed, key=lambda r: r["rank"])
    world, j.trainings = trainings(observed)
    if j.trainings == 1 and world > 1 and unsynced(observed):  # one group, and no gradient crosses it
        world, j.trainings, j.unsynced = 1, len(observed), True
    j.world_size = world
    rates = [_per_step_samples(r) for r in observed]
    if rates and all(x is not None for x in rates):
        j.effective_batch = sum(rates) / len(rates) * world
        j.batch_source = BATCH_SOURCES[0 if all(_trained(r) for r in observed) else 1]
    b, eng, sched = plan.batch, plan.engine, plan.schedule
    micro = _micro(first)
    engine = _trains_as(_engine(first) or ("single" if world == 1 else None), world)
    planned_engine = _trains_as(eng.backend, eng.world_size)
    ds = first.get("deepspeed") or {}
    # DeepSpeed built the optimizer from autotune's JSON, which carries the rate only where the plan owns it
    json_rate = bool(ds) and not ds.get("script_optimizer") and "learning_rate" not in plan.run.script_defaults
    # the plan's rate reached it (not the user's own after `--`, "yours: ...")
    handed = delivery is None or bool(carries_plan(taken_routes(delivery, "learning_rate", first))) or json_rate
    obs = {"micro_batch_size": (micro, b.micro_batch_size),
           "gradient_accumulation_steps": (_measured_accumulation(first, micro), b.gradient_accumulation_steps),
           "learning_rate": (_lr(first, handed), sched.learning_rate),
           "precision": (_precision(first), plan.numerics.precision),
           "num_workers": (_training_loader(first).get("num_workers"), plan.loader.num_workers),
           "world_size": (world, eng.world_size), "engine": (engine, planned_engine)}
    if final and sched.max_steps and not plan.run.resume_from:  # a resumed script counts from its resume point
        obs["max_steps"] = (j.stepped, sched.max_steps)
    for key, (seen, want) in obs.items():
        j.values[key] = RULES.get(key, verdict)(plan, key, seen, want, delivery, world, micro)
    divided_accumulation_fix(j.values["gradient_accumulation_steps"], divides, world, wired)
    resume = plan.run.resume_from if plan.run.entrypoint and not _chooses(delivery) else None
    if resume or str(getattr(delivery, "resume", None) or "").startswith("your flag"):
        j.resume = resume_verdict(observed, resume)
    if delivery is not None:
        j.untaken = [k for k, routes in delivery.routes.items() if routes and not taken_routes(delivery, k, first)]
    _said(j, plan, first, delivery, engine, planned_engine)
    return j


def _said(j: Judgement, plan, first: dict, delivery, engine, planned_engine) -> None:
    """What is wrong with the training, what --strict cannot judge, and the notes."""
    b, eng = plan.batch, plan.engine
    trained = _trained(first)
    if trained is not None and trained[3] and trained[1]:
        passes = (trained[1] + trained[3]) / trained[1]
        j.notes.append(f"the script passes each micro-batch through its model {_fmt(passes)} times a step (SAM-style: "
                       f"{trained[1] + trained[3]} forwards and {trained[2]} backward passes for {trained[1]} "
                       "micro-batch(es)): each sample is counted once in the effective batch")
    if (first.get("deepspeed") or {}).get("script_optimizer"):
        note = ("the script passes its own optimizer to deepspeed.initialize: DeepSpeed ignores the JSON's optimizer "
                "and learning rate")
        j.values["learning_rate"]["note"] = note
        ran = j.values["learning_rate"].get("observed")
        j.notes.append(note + (f" (the script's optimizer runs at {_fmt(ran)})" if ran is not None else ""))
    eff = None if j.effective_batch is None else _fmt(j.effective_batch)
    if not j.stepped:  # nothing trained: nothing to be wrong, and nothing to count
        j.unjudged.append("the effective batch (the script took no optimizer step)")
        return
    if j.resume is not None and j.resume["status"] == "started over":
        j.wrong.append(started_over(j.resume, None if _chooses(delivery) else plan.run.resume_from,
                                    _resume_flag(delivery)))
    if j.trainings > 1 and eng.world_size > 1:  # no process group joins the ranks, or none syncs: each trains alone
        fix = unsynced_fix(eng.world_size) if j.unsynced else trainings_fix(eng.world_size, delivery)
        for key in ("world_size", "engine"):
            if j.values[key]["status"] == "different":
                j.values[key]["fix"] = fix
        j.wrong.append(f"{j.trainings} independent trainings" + (f" of {eff} each" if eff is not None else "")
                       + f"; the plan was one job of {b.global_batch_size} ({b.micro_batch_size} x "
                       f"{b.gradient_accumulation_steps} x {eng.world_size}): {fix}")
    if j.effective_batch is None:
        j.unjudged.append("the effective batch (nothing the script trained could be counted: no training forward of a "
                          "model it wrapped or optimized, no DataLoader batch)")
    elif j.trainings == 1 and abs(j.effective_batch - b.global_batch_size) > TOLERANCE * b.global_batch_size:
        fixes = [j.values[k]["fix"] for k in ("micro_batch_size", "gradient_accumulation_steps")
                 if j.values[k]["status"] == "different"]  # the fix for each part of it seen different
        j.wrong.append(f"the script trains an effective batch of {eff} samples per optimizer step, "
                       f"the plan {b.global_batch_size} ({b.micro_batch_size} x {b.gradient_accumulation_steps} x "
                       f"{eng.world_size})" + (f": {'; '.join(dict.fromkeys(fixes))}" if fixes else ""))
    if engine is not None and engine != planned_engine and j.trainings == 1:
        fix = engine_fix(engine, planned_engine, delivery)
        j.values["engine"]["fix"] = fix
        j.wrong.append(f"the script runs {engine}, the plan {planned_engine}: {fix}")
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


def _chooses(delivery) -> bool:
    """The script resumes under its own resume flag, from what it chooses (litgpt's --resume auto)."""
    said = str(getattr(delivery, "resume", None) or "")
    return said.startswith("your flag") and "the script chooses" in said


def _resume_flag(delivery) -> str | None:
    """The script's flag the resume point went to, as the delivery said it before the launch."""
    said = str(getattr(delivery, "resume", None) or "")
    for head in ("recognised ", "your flag ", "placeholder {resume_from} to "):
        if said.startswith(head):
            return said[len(head):].split(" ")[0] or None
    return None
