"""Delivery from evidence: what the user's script observably ran (``<run_dir>/observed/rank-N.json``, written by
``autotune.runtime.observe`` in each of its processes) against the plan.

Each plan value is one of: observed equal to the plan; observed different (the value, the plan's, and what would
deliver it); not observable (the evidence does not show it). The effective batch is measured: the samples the
ranks' DataLoaders yielded per optimizer step, summed over the ranks. While the run goes, ``ScriptWatch`` reads
the evidence once every rank has taken a few steps: it prints one line, warns when the effective batch is more
than 10 % off the plan's, the engine is another or the learning rate is not the one the plan set (and, with
``--strict``, stops the run naming the fix); when
every rank's script has returned and processes linger, it ends them (a teardown hang is not a failed training).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path

EARLY_STEPS = 4  # the judgement after the first steps waits for this many optimizer steps on every rank
TOLERANCE = 0.10  # an effective batch further than this from the plan's is a wrong training

# what would deliver each value to a script that did not take it
FIX = {
    "micro_batch_size": "pass it as your script's batch-size flag after `--` (e.g. --batch_size {micro_batch_size}) "
                        "or use --wire auto",
    "gradient_accumulation_steps": "pass {gradient_accumulation_steps} to your script's accumulation flag, or read "
                                   "$AUTOTUNE_GRADIENT_ACCUMULATION_STEPS",
    "learning_rate": "pass {learning_rate} to your script's learning-rate flag (it is the rate the optimizer should "
                     "run with, not a base to scale)",
    "precision": "pass your script's precision flag ({precision}), or read $AUTOTUNE_PRECISION",
    "engine": "let the script take the DeepSpeed path (its own switch, e.g. --use_deepspeed / --deepspeed) or "
              "plan for the engine it runs (--ddp / --fsdp / --deepspeed)",
    "world_size": "start the script with the launcher's ranks (it reads WORLD_SIZE/RANK)",
}


def read_observed(run_dir: str | Path) -> list[dict]:
    from autotune.rundir.layout import OBSERVED
    from autotune.rundir.status import read_rank_files

    return read_rank_files(Path(run_dir) / OBSERVED, "rank", 1_000_000)


def _per_step_samples(rec: dict) -> float | None:
    """Samples this rank's DataLoaders yielded per optimizer step, from the first steps' counts (step 1 also
    carries what was loaded before training: the difference of later steps is the rate)."""
    at = {int(k): v for k, v in (rec.get("samples_at_step") or {}).items()}
    steps = sorted(s for s in at if s >= 2)
    if len(steps) >= 2:
        a, b = steps[0], steps[-1]
        return (at[b] - at[a]) / (b - a) if b > a else None
    if rec.get("steps") and rec.get("samples") and rec["steps"] >= 2:
        return rec["samples"] / rec["steps"]
    return None


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
    if rec.get("deepspeed"):
        return rec["deepspeed"].get("train_micro_batch_size_per_gpu")
    loaders = rec.get("dataloaders") or []
    distributed = [d for d in loaders if d.get("distributed")]
    pick = (distributed or loaders)[:1]
    return pick[0].get("batch_size") if pick else None


def _lr(rec: dict):
    ds = rec.get("deepspeed")
    if ds and ds.get("lr"):
        return ds["lr"][0]
    opts = rec.get("optimizers") or []
    if not opts:
        return None
    # the peak a scheduler starts from (initial_lr), not the warm-up's current rate
    lrs = opts[-1].get("lr_peak") or opts[-1].get("lr") or []
    return lrs[0] if lrs else None


@dataclass
class Judgement:
    values: dict[str, dict] = field(default_factory=dict)  # key -> {status, observed, plan, fix}
    effective_batch: float | None = None
    world_size: int | None = None
    steps: int = 0
    wrong: list[str] = field(default_factory=list)  # why the training is not the plan's (batch, engine)

    def to_record(self) -> dict:
        return {"values": self.values, "effective_batch": self.effective_batch, "world_size": self.world_size,
                "steps_observed": self.steps, "wrong": self.wrong}

    def line(self) -> str:
        eq = [k for k, v in self.values.items() if v["status"] == "equal"]
        diff = [f"{k} {_fmt(v['observed'])} (plan {_fmt(v['plan'])})" for k, v in self.values.items()
                if v["status"] == "different"]
        unseen = [k for k, v in self.values.items() if v["status"] == "not observable"]
        eff = "unknown" if self.effective_batch is None else _fmt(self.effective_batch)
        return (f"observed after {self.steps} step(s): effective batch {eff} per optimizer step; as planned: "
                f"{', '.join(eq) or 'nothing'}" + (f"; different: {'; '.join(diff)}" if diff else "")
                + (f"; not observable: {', '.join(unseen)}" if unseen else ""))


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}" if v != int(v) else str(int(v))
    return str(v)


def judge(plan, observed: list[dict]) -> Judgement:
    """Each plan value as observed in the script's processes (all ranks agree, or rank 0 speaks for them)."""
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
    b, eng = plan.batch, plan.engine
    micro = _micro(first)
    acc = None  # measured (samples per optimizer step / micro-batch) where it can be, else the engine's own word
    if micro and _per_step_samples(first):
        acc = round(_per_step_samples(first) / micro)
    elif first.get("deepspeed"):
        acc = first["deepspeed"].get("gradient_accumulation_steps")
    elif (first.get("accelerate") or {}).get("gradient_accumulation_steps"):
        acc = first["accelerate"]["gradient_accumulation_steps"]
    engine = _trains_as(_engine(first) or ("single" if world == 1 else None), world)
    planned_engine = _trains_as(eng.backend, eng.world_size)
    lr = _lr(first)
    obs = {"micro_batch_size": (micro, b.micro_batch_size), "gradient_accumulation_steps": (acc, b.gradient_accumulation_steps),
           "learning_rate": (lr, plan.schedule.learning_rate), "precision": (_precision(first), plan.numerics.precision),
           "world_size": (world, eng.world_size), "engine": (engine, planned_engine)}
    for key, (seen, want) in obs.items():
        if key in plan.run.script_defaults:  # not planned: the script's own value, observed for the record
            j.values[key] = {"status": "yours", "observed": seen, "plan": None}
            continue
        if seen is None:
            j.values[key] = {"status": "not observable", "observed": None, "plan": want}
            continue
        same = abs(seen - want) <= 1e-9 * max(1.0, abs(want)) if isinstance(want, float) else seen == want
        j.values[key] = {"status": "equal" if same else "different", "observed": seen, "plan": want}
        if not same:
            j.values[key]["fix"] = FIX.get(key, "")
    if (first.get("deepspeed") or {}).get("script_optimizer"):
        j.values["learning_rate"]["note"] = ("the script passes its own optimizer to deepspeed.initialize: DeepSpeed "
                                             "ignores the JSON's optimizer and learning rate")
    if j.effective_batch is not None and abs(j.effective_batch - b.global_batch_size) > TOLERANCE * b.global_batch_size:
        j.wrong.append(f"the script trains an effective batch of {_fmt(j.effective_batch)} samples per optimizer step, "
                       f"the plan {b.global_batch_size} ({b.micro_batch_size} x {b.gradient_accumulation_steps} x "
                       f"{eng.world_size})")
    if engine is not None and engine != planned_engine:
        j.wrong.append(f"the script runs {engine}, the plan {planned_engine}: {FIX['engine']}")
    rate = j.values.get("learning_rate", {})
    if rate.get("status") == "different":  # a rate the plan set (a script's own default is "yours", not this)
        why = rate.get("note") or FIX["learning_rate"].format(learning_rate=_fmt(rate["plan"]))
        j.wrong.append(f"the script trains at learning rate {_fmt(rate['observed'])}, the plan "
                       f"{_fmt(rate['plan'])}: {why}")
    return j


class ScriptWatch:
    """Asked every second while a user's script runs (with the rank watch): the early judgement, --strict, and
    ending a teardown that lingers after every rank's script returned."""

    def __init__(self, plan, run_dir: str | Path, out, clock=time.monotonic):
        self.plan, self.run_dir, self.out, self.clock = plan, Path(run_dir), out, clock
        self.early: Judgement | None = None
        self._returned_since: float | None = None
        self.cut_teardown = False
        self.stopped_strict = False  # --strict stopped the run

    def _local(self, observed: list[dict]) -> list[dict]:
        eng = self.plan.engine
        first = eng.node_rank * eng.nproc_per_node
        return [r for r in observed if first <= r["rank"] < first + eng.nproc_per_node]

    def all_returned(self) -> bool:
        local = self._local(read_observed(self.run_dir))
        return len(local) == self.plan.engine.nproc_per_node and all(r.get("returned") for r in local)

    def check(self) -> str | None:
        """A reason to stop the run, or None."""
        observed = read_observed(self.run_dir)
        if self.early is None and len(observed) >= self.plan.engine.nproc_per_node and \
                min(r.get("steps") or 0 for r in observed) >= EARLY_STEPS:
            self.early = judge(self.plan, observed)
            print(f"autotune: {self.early.line()}", file=self.out, flush=True)
            for w in self.early.wrong:
                print(f"autotune: warning: {w}", file=self.out, flush=True)
            if self.early.wrong and self.plan.run.strict:
                self.stopped_strict = True
                return ("--strict: " + "; ".join(self.early.wrong) + "; or drop --strict (training.strict) to let it "
                        "train as it is")
        local = self._local(observed)
        if local and len(local) == self.plan.engine.nproc_per_node and all(r.get("returned") for r in local):
            now = self.clock()
            self._returned_since = self._returned_since if self._returned_since is not None else now
            if now - self._returned_since >= self.plan.engine.exit_barrier_s:
                self.cut_teardown = True
                return (f"every rank's script returned and its processes still linger "
                        f"{self.plan.engine.exit_barrier_s} s later (distributed.exit_barrier_s)")
        return None
