"""Delivery from evidence: what the user's script observably ran (``<run_dir>/observed/rank-N.json``, written by
``autotune.runtime.observe`` in each rank's own process) against the plan.

Each plan value is one of: observed equal to the plan; observed different (the value, the plan's, and what would
deliver it); the script's own (a value the plan does not set); not observable (the evidence does not show it). The
effective batch is counted from training steps only: the samples that reached the model the script trains in each
of the first steps after the first (its training forwards: never an evaluation batch or a loader's look-ahead), the
most common count per step, summed over the ranks; without such a count, the samples the DataLoaders yielded per
step; with neither, "not observable", never 0. The learning rate is judged as a schedule: the rate the optimizer
was built with, the peak so far and where it is heading (a warm-up toward the plan's rate is not "different").

While the run goes, ``ScriptWatch`` reads the evidence once every rank has taken a few steps: it prints one line,
warns when the effective batch is more than 10 % off the plan's, the engine is another or the learning rate is not
the one the plan set (and, with ``--strict``, stops the run naming the fix; a value it cannot observe it says it
cannot judge); when every rank's script has ended and processes linger, it ends them. A teardown failure is
forgiven only after every rank's script returned normally: a script that exits non-zero fails the launch.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from autotune.rundir.layout import VALUE_ENV

EARLY_STEPS = 4  # the judgement after the first steps waits for this many optimizer steps on every rank
TOLERANCE = 0.10  # an effective batch further than this from the plan's is a wrong training
RATE_TOLERANCE = 1e-6  # relative: a rate passed as text and read back

# what would deliver each value to a script that did not take it
FIX = {
    "micro_batch_size": "pass it to your script's batch-size setting after `--` (--batch_size {micro_batch_size}, or "
                        "--batch_size={micro_batch_size} for a --key=value configurator)",
    "gradient_accumulation_steps": "pass {gradient_accumulation_steps} to your script's accumulation flag, or read "
                                   f"${VALUE_ENV['gradient_accumulation_steps']}",
    "learning_rate": "pass {learning_rate} to your script's learning-rate flag (it is the rate the optimizer should "
                     "run with, not a base to scale)",
    "precision": f"pass your script's precision flag ({{precision}}), or read ${VALUE_ENV['precision']}",
    "num_workers": "pass {num_workers} to your script's DataLoader (num_workers=), through its workers flag or "
                   f"${VALUE_ENV['num_workers']}",
    "engine": "let the script take the DeepSpeed path (its own switch, e.g. --use_deepspeed / --deepspeed) or "
              "plan for the engine it runs (--ddp / --fsdp / --deepspeed)",
    "world_size": "start the script with the launcher's ranks (it reads WORLD_SIZE/RANK)",
}
WIRE_HINT = ", or use --wire auto"  # added to the batch fixes when the launch was not wired


def read_observed(run_dir: str | Path) -> list[dict]:
    from autotune.rundir.layout import OBSERVED
    from autotune.rundir.status import read_rank_files

    return read_rank_files(Path(run_dir) / OBSERVED, "rank", 1_000_000)


def _trained(rec: dict) -> tuple[int, int, int] | None:
    """What reached the model the script trains in one step, as most of its first steps after the first had it:
    (samples, forwards, backward passes), or None when the observer counted no training forward. An epoch's last,
    shorter step and a step carrying an epoch's leftover micro-batches are the exceptions the most common leaves."""
    samples, forwards, backwards = (rec.get(k) or {} for k in ("step_samples", "step_forwards", "step_backwards"))
    steps = [(n, forwards.get(s, 0), backwards.get(s, 0)) for s, n in samples.items() if n]
    return Counter(steps).most_common(1)[0][0] if steps else None


def _per_step_samples(rec: dict) -> float | None:
    """Samples this rank trained per optimizer step: counted at the model's training forwards (see ``_trained``),
    else from the samples its DataLoaders yielded at the first steps (step 1 also carries what was loaded before
    training: the difference of later steps is the rate). Nothing counted is None (not observable), never 0."""
    trained = _trained(rec)
    if trained is not None:
        return float(trained[0])
    at = {int(k): v for k, v in (rec.get("samples_at_step") or {}).items()}
    steps = sorted(s for s in at if s >= 2)
    rate = None
    if len(steps) >= 2:
        a, b = steps[0], steps[-1]
        rate = (at[b] - at[a]) / (b - a) if b > a else None
    elif rec.get("steps") and rec.get("samples") and rec["steps"] >= 2:
        rate = rec["samples"] / rec["steps"]
    return rate or None


def _engine(rec: dict) -> str | None:
    acc = rec.get("accelerate") or {}
    kind = str(acc.get("distributed_type") or "")
    if rec.get("engine") == "deepspeed" or "DEEPSPEED" in kind:
        return "deepspeed"
    if rec.get("engine") == "fsdp" or "FSDP" in kind:
        return "fsdp"
    if rec.get("engine") == "ddp" or kind.startswith("DistributedType.MULTI") or kind.startswith("MULTI"):
        return "ddp"
    return None


def _trains_as(engine: str | None, world: int) -> str | None:
    """One process under a DDP wrapper (or Accelerate's MULTI_CPU) trains exactly as one process: "single"."""
    return "single" if world == 1 and engine == "ddp" else engine


def _precision(rec: dict) -> str | None:
    ds, acc = rec.get("deepspeed"), rec.get("accelerate")
    if ds:
        return "bf16" if ds.get("bfloat16") else "fp16" if ds.get("fp16") else "fp32"
    if acc and acc.get("mixed_precision") not in (None, "None"):
        return {"no": "fp32", "bf16": "bf16", "fp16": "fp16"}.get(acc["mixed_precision"], acc["mixed_precision"])
    if rec.get("autocast"):
        return {"bfloat16": "bf16", "float16": "fp16"}.get(rec["autocast"], rec["autocast"])
    if rec.get("grad_scaler"):
        return "fp16"
    return "fp32" if rec.get("steps") else None


def _micro(rec: dict) -> int | None:
    trained = _trained(rec)
    if trained is not None and trained[1] and trained[0] % trained[1] == 0:
        return trained[0] // trained[1]  # samples per training forward
    if rec.get("deepspeed"):
        return rec["deepspeed"].get("train_micro_batch_size_per_gpu")
    return _training_loader(rec).get("batch_size")


def _training_loader(rec: dict) -> dict:
    """The DataLoader the script most likely trains with: the sharded one, else the first ({} without one)."""
    loaders = rec.get("dataloaders") or []
    return ([d for d in loaders if d.get("distributed")] or loaders or [{}])[0]


@dataclass(frozen=True)
class Rate:
    """A script's learning rate as a schedule: the rate its optimizer was built with (a torch scheduler's base when
    it has one), the rate at its latest step, the peak so far, the steps read, and whether it is still rising."""
    built: float | None
    now: float | None = None
    peak: float | None = None
    steps: int = 0
    rising: bool = False


def _optimizer_class(rec: dict) -> str | None:
    """The class of the optimizer that steps (as ``_lr`` picks it), else DeepSpeed's, else None."""
    opts = rec.get("optimizers") or []
    o = ([x for x in opts if x.get("lr_steps")] or opts or [None])[-1]
    name = o.get("class") if o is not None else (rec.get("deepspeed") or {}).get("optimizer")
    return name if isinstance(name, str) and name else None


def _lr(rec: dict) -> Rate | None:
    """The rate of the optimizer that steps (the last one made that stepped, else the last one made); DeepSpeed's
    engine's when no optimizer was seen stepping."""
    opts = rec.get("optimizers") or []
    stepped = [o for o in opts if o.get("lr_steps")]
    o = (stepped or opts or [None])[-1]
    ds = rec.get("deepspeed") or {}
    if o is None or not (o.get("lr") or o.get("lr_base") is not None):
        return Rate(ds["lr"][0]) if ds.get("lr") else None
    built = o["lr_base"] if o.get("lr_base") is not None else o["lr"][0]
    now, peak = o.get("lr_now"), o.get("lr_max")
    early = [v for v in (o.get("lr_at") or {}).values() if isinstance(v, (int, float))]
    rising = now is not None and peak is not None and now >= peak and any(v < now for v in early)
    return Rate(built, now, peak, o.get("lr_steps") or 0, rising)


def _close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) <= RATE_TOLERANCE * max(abs(b), 1e-12)


def _rate_verdict(rate: Rate, plan_lr: float, world: int, delivered: bool = True) -> dict:
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
    out = {"status": "different", "observed": seen, "plan": plan_lr, "fix": FIX["learning_rate"]}
    if world > 1 and delivered and _close(seen, plan_lr * world):
        out["fix"] = (f"the script runs the plan's rate times its world size ({_fmt(seen)} = {_fmt(plan_lr)} x "
                      f"{world}): pass {_fmt(plan_lr / world)} (the plan's rate / {world}) to its learning-rate flag; "
                      "--wire auto does when it reads the multiplication in the script")
    return out


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


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}" if v != int(v) else str(int(v))
    return str(v)


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
    hint = "" if wired else WIRE_HINT
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
        if key in plan.run.script_defaults:  # not planned: the script's own value, observed for the record
            j.values[key] = {"status": "yours", "observed": seen, "plan": None}
            continue
        if seen is None:
            j.values[key] = {"status": "not observable", "observed": None, "plan": want}
            continue
        same = abs(seen - want) <= 1e-9 * max(1.0, abs(want)) if isinstance(want, float) else seen == want
        j.values[key] = {"status": "equal" if same else "different", "observed": seen, "plan": want}
        if not same:
            j.values[key]["fix"] = FIX.get(key, "") + (
                (delivery.wire_hint(key) if delivery is not None else hint)  # only where --wire auto finds one
                if key in ("micro_batch_size", "gradient_accumulation_steps") else "")
    accumulation = j.values["gradient_accumulation_steps"]
    if accumulation["status"] == "different" and divides and accumulation["observed"] * world == accumulation["plan"]:
        accumulation["fix"] = (f"the script divides its accumulation by its world size (`{divides}`: "
                               f"{accumulation['observed']} a "
                               f"process = {accumulation['plan']} / {world}): pass the total over the processes, "
                               f"{{gradient_accumulation_steps_total}} ({accumulation['plan'] * world})"
                               + (", which --wire auto passes when it reads the division" if not wired else ""))
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


class ScriptWatch:
    """Asked every second while a user's script runs (with the rank watch): the early judgement, --strict, and
    ending the processes that linger after every rank's script has ended."""

    def __init__(self, plan, run_dir: str | Path, out, clock=time.monotonic, delivery=None):
        self.plan, self.run_dir, self.out, self.clock, self.delivery = plan, Path(run_dir), out, clock, delivery
        self.early: Judgement | None = None
        self._ended_since: tuple[frozenset, float] | None = None  # the local ranks' (rank, pid) and when all ended
        self.cut_teardown = False
        self.stopped_strict = False  # --strict stopped the run

    def _local(self, observed: list[dict]) -> list[dict]:
        eng = self.plan.engine
        first = eng.node_rank * eng.nproc_per_node
        return [r for r in observed if first <= r["rank"] < first + eng.nproc_per_node]

    def _all_local(self, observed: list[dict], what: str) -> bool:
        local = self._local(observed)
        return len(local) == self.plan.engine.nproc_per_node and all(r.get(what) for r in local)

    def all_returned(self) -> bool:
        """Every local rank's script returned normally (no exception, no non-zero exit): only then is a failure
        after it a teardown's."""
        return self._all_local(read_observed(self.run_dir), "returned")

    def script_failure(self) -> tuple[int, str] | None:
        """The exit code the script itself chose and which rank, when one ended otherwise than by returning:
        (code, how), or None. Under torchrun every failure is exit 1; this is the script's own."""
        for r in sorted(self._local(read_observed(self.run_dir)), key=lambda r: r["rank"]):
            if r.get("raised"):
                return 1, f"rank {r['rank']} raised {r['raised']}"
            if r.get("exit_code"):
                return r["exit_code"], f"rank {r['rank']} exited with code {r['exit_code']} before its end"
        return None

    def check(self) -> str | None:
        """A reason to stop the run, or None."""
        observed = read_observed(self.run_dir)
        if self.early is None and len(observed) >= self.plan.engine.nproc_per_node and \
                min(r.get("steps") or 0 for r in observed) >= EARLY_STEPS:
            self.early = judge(self.plan, observed, self.delivery)
            print(f"autotune: {self.early.line()}", file=self.out, flush=True)
            for note in self.early.notes:
                print(f"autotune: note: {note}", file=self.out, flush=True)
            for w in self.early.wrong:
                print(f"autotune: warning: {w}", file=self.out, flush=True)
            if self.early.wrong and self.plan.run.strict:
                self.stopped_strict = True
                return ("--strict: " + "; ".join(self.early.wrong) + "; or drop --strict (training.strict) to let it "
                        "train as it is")
            if self.plan.run.strict:
                for what in self.early.unjudged:
                    print(f"autotune: --strict cannot judge {what}; the run goes on", file=self.out, flush=True)
        local = self._local(observed)
        if self._all_local(observed, "ended"):
            key = frozenset((r["rank"], r.get("pid")) for r in local)
            if self._ended_since is None or self._ended_since[0] != key:  # once, from these processes' records
                self._ended_since = (key, self.clock())
            elif self.clock() - self._ended_since[1] >= self.plan.engine.exit_barrier_s:
                self.cut_teardown = True
                how = "returned" if self._all_local(observed, "returned") else "ended"
                return (f"every rank's script {how} and its processes still linger "
                        f"{self.plan.engine.exit_barrier_s} s later (distributed.exit_barrier_s)")
        else:
            self._ended_since = None
        return None
