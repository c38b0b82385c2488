"""The delivery record: every route by which each plan value reached a user's script (placeholder, recognised flag
or setting, environment read by Accelerate or the script, DeepSpeed JSON, Python API), or your own value after `--`
on the script's setting (yours: it wins); a value with no route is *advisory*, and the launch says so. Before the
launch these are the routes handed over; what the script ran is observed in its first steps
(autotune.launch.evidence). Pure; no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from autotune.exports.flag_words import flag_form, value_of
from autotune.exports.precision_claim import precision_claim
from autotune.exports.script_scan import ScriptFacts
from autotune.exports.script_world import world_read_switch
from autotune.exports.user_values import yours_route
from autotune.exports.withheld import withhold_accumulation
from autotune.plan import TrainingPlan
from autotune.rundir.layout import BACKEND_ENV, ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE, PLAN_ENV, VALUE_ENV

# Values a script acts on (the launch reports each one's routes)
DELIVERED = ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision", "num_workers",
             "world_size")
# ... and the schedule's, where the plan sets them for the script (max_steps wins over epochs)
SCHEDULE = ("max_steps", "epochs", "warmup_steps")
# each value's setting, as a hint names one the script must have (--<its batch-size flag>)
HINT_WORDS = {"micro_batch_size": "batch-size", "gradient_accumulation_steps": "accumulation",
              "learning_rate": "learning-rate", "precision": "precision", "num_workers": "DataLoader-workers",
              "max_steps": "step-count", "epochs": "epoch-count", "warmup_steps": "warm-up-steps",
              "world_size": "world-size"}
WORDS = {"micro_batch_size": "batch size", "gradient_accumulation_steps": "accumulation steps",
         "learning_rate": "learning rate", "precision": "precision", "num_workers": "DataLoader workers",
         "max_steps": "step limit", "epochs": "epoch count", "warmup_steps": "warm-up steps"}


def delivered_keys(plan: TrainingPlan) -> tuple[str, ...]:
    """Every plan value the launch hands to a script and reports a route for: DELIVERED, and the schedule's values
    the plan sets (not a script's own default): the step limit, else the epochs; the warm-up."""
    sc, yours = plan.schedule, plan.run.script_defaults
    schedule = ["max_steps"] if sc.max_steps else (["epochs"] if sc.epochs and "epochs" not in yours else [])
    if "warmup_steps" not in yours and sc.warmup_steps:
        schedule.append("warmup_steps")
    return (*DELIVERED, *schedule)


@dataclass(frozen=True)
class Delivery:
    routes: dict[str, list[str]]  # plan value -> how it reached the script
    advisory: list[str]  # plan values that reached the script by no route
    withheld: dict[str, str] = field(default_factory=dict)  # variable -> why it is not exported to this script
    notes: tuple[str, ...] = ()  # what the script does with what it is handed (said before the launch)
    wired: bool = False  # --wire auto filled the script's own settings
    divides_accumulation: str | None = None  # the script's statement dividing its accumulation by its world size
    engine: str = "deepspeed"  # the plan's backend, for the advisory engine's words
    resume: str | None = None  # how the resume point reaches the script (--resume_from), said before the launch
    would_wire: dict[str, str] = field(default_factory=dict)  # plan value -> what --wire auto passes it as
    shape: str = "argparse"  # the script's shape: argparse, configurator, hydra, lightning (for its hints' forms)
    deepspeed_condition: str | None = None  # the condition its deepspeed.initialize path is behind, as read
    flags: tuple[str, ...] = ()  # every flag the script declares (argparse), known to autotune or not
    switches: tuple[str, ...] = ()  # those of them that take no value (store_true): never given a placeholder
    given: dict[str, str] = field(default_factory=dict)  # plan value -> your own argument after `--` that sets it
    derived: Any = None  # script_derived.DerivedAccumulation: the script computes its accumulation from its argument
    derived_given: str | None = None  # your own value of that argument after `--`, as you passed it

    @property
    def declared(self) -> dict[str, str]:
        """Plan value -> the flag the script declares for it (what --wire auto passes): the fixes name these."""
        return {k: f for k, f in self.would_wire.items() if f.startswith("-")}

    def wire_hint(self, key: str) -> str:
        """", or use --wire auto (it passes ...)" where --wire auto would deliver ``key`` and did not run; else ""."""
        if self.wired or key not in self.would_wire:
            return ""
        return f", or use --wire auto (it passes {spelled(self.would_wire[key], key)})"

    def placeholder_form(self, key: str) -> str:
        """How ``key``'s placeholder goes after `--` to a script with no recognised setting for it, in its own
        shape's form (never a flag it lacks)."""
        word = HINT_WORDS.get(key, key)
        if self.shape == "hydra":
            return f"<its {word} key>={{{key}}}"
        if self.shape == "lightning":
            part = "data" if key in ("micro_batch_size", "num_workers") else \
                "model" if key in ("learning_rate", "warmup_steps") else "trainer"
            if key == "learning_rate":  # LightningCLI adds --optimizer where the model has no configure_optimizers
                return (f"--model.<its {word} argument> {{{key}}} (or --optimizer.lr {{{key}}} where the model "
                        "leaves its optimizer to LightningCLI's --optimizer)")
            return f"--{part}.<its {word} argument> {{{key}}}"
        if self.shape == "configurator":
            return f"--<its {word} setting>={{{key}}}"
        return flag_form(key, word, self.flags, self.switches)  # "": it declares none (placeholder_hint says so)

    def placeholder_hint(self, keys=("micro_batch_size",)) -> str:
        """How to pass ``keys`` (the values it has no recognised setting for), in the script's shape's form; for an
        argparse script, only flags it declares, and which values it declares none for."""
        forms = [(k, self.placeholder_form(k)) for k in keys]
        named = " ".join(f for _, f in forms if f)
        lead = {"hydra": "as Hydra overrides of the keys it trains with: ",
                "lightning": "as LightningCLI flags of its model, data or trainer: ",
                "configurator": "as its --key=value settings: "}.get(self.shape, "to its own flags: ")
        none = [k for k, f in forms if not f]
        if not none:
            return lead + named
        lacks = (f"it declares no flag for its {', '.join(WORDS.get(k, k) for k in none)}: give it one that takes "
                 + " ".join(f"{{{k}}}" for k in none))
        return (lead + named + "; " + lacks) if named else lacks

    def advisory_hint(self) -> str:
        """The line under the routes when values are advisory: what --wire auto would pass (only where it finds the
        script's own setting), else the placeholder form that fits the script's shape, for the advisory values
        only."""
        can = [k for k in self.advisory if k in self.would_wire]
        rest = [k for k in self.advisory if k not in can and k != "engine"
                and not (k == "gradient_accumulation_steps" and self.derived is not None)]  # said in its note
        if not can and not rest:
            return ""
        if can and not self.wired:
            return ("(use --wire auto: it passes " + ", ".join(spelled(self.would_wire[k], k) for k in can)
                    + (f"; {self.pass_them(rest, 'the others')})" if rest else ")"))
        found = "--wire auto found no setting for them in your script: " if self.wired else ""
        return f"({found}{self.pass_them(rest or self.advisory)})"

    def pass_them(self, keys, them: str = "them") -> str:
        how = self.placeholder_hint(keys)
        return how if how.startswith("it declares no flag") else f"pass {them} after `--` {how}"

    def to_record(self) -> dict:
        return {"routes": self.routes, "advisory": self.advisory, "withheld": self.withheld, "notes": list(self.notes),
                "wired": self.wired, "divides_accumulation": self.divides_accumulation, "resume": self.resume,
                "given": self.given}

    def summary(self) -> list[str]:
        words = WORDS
        out = []
        for k in self.advisory:
            if k == "engine" and self.engine == "fsdp":
                out.append("the script was given no way to run FSDP2: the plan's engine (FSDP2) is advisory and the "
                           "script trains with whatever it sets up itself (Accelerate and HF Trainer run FSDP on GPUs "
                           f"only; a torchrun script wraps its model with fully_shard itself, reading "
                           f"${BACKEND_ENV})")
            elif k == "engine":
                out.append("the script was given no way to run DeepSpeed: the plan's engine (DeepSpeed ZeRO) is "
                           "advisory and the script trains with whatever it sets up itself (Accelerate and HF "
                           "Trainer run DeepSpeed on GPUs only; a deepspeed.initialize script needs "
                           "--deepspeed_config {deepspeed_config} or --wire auto)")
            else:
                out.append(f"the script was given no {words.get(k, k)}: the plan's {k} is advisory")
        reasons: dict[str, list[str]] = {}
        for name, why in self.withheld.items():  # one line per reason (torchrun's six variables share one)
            if name == "ACCELERATE_GRADIENT_ACCUMULATION_STEPS" and self.routes.get("gradient_accumulation_steps"):
                continue  # the script's own flag (or a placeholder) carries the plan's accumulation: nothing to warn
            reasons.setdefault(why, []).append(name)
        out += [f"{', '.join(names)} not exported: {why}" for why, names in reasons.items()]
        return out + list(self.notes)


def spelled(flag: str, key: str) -> str:
    """A wired flag or setting with the value's placeholder, as the user would pass it after `--`."""
    if flag.startswith("hydra:"):
        return f"{flag[6:]}={{{key}}}"
    return f"{flag}{{{key}}}" if flag.endswith("=") else f"{flag} {{{key}}}"


def shape_of(facts: ScriptFacts | None) -> str:
    if facts is None:
        return "argparse"
    if facts.hydra is not None:
        return "hydra"
    if facts.lightning is not None:
        return "lightning"
    return "configurator" if facts.configurator else "argparse"


def delivery(plan: TrainingPlan, facts: ScriptFacts | None, placeholders: list[str], wired: dict[str, str],
             user_args: list[str], deepspeed_json: bool, given: dict[str, str] | None = None) -> Delivery:
    """Every route by which each plan value reached the script. ``given``: the user's own arguments after `--` for
    the script's settings of plan values (``wiring.given_by_user``): theirs, shown as such, not as no route."""
    keys = delivered_keys(plan)
    routes: dict[str, list[str]] = {k: [] for k in keys}
    if facts is None:  # autotune's own runtime or a module:function entrypoint that reads the plan
        return Delivery({k: ["Python API (autotune runtime)"] for k in keys}, [])
    world = plan.engine.world_size
    notes = []
    given = {k: a for k, a in (given or {}).items() if k in routes and k not in placeholders and k not in wired}
    for k in keys:
        if k in placeholders:
            routes[k].append(f"placeholder {{{k}}}")
        if k in wired:
            routes[k].append(_wired_route(k, wired[k], facts, plan))
        if k in given:  # the user's own value wins over the plan's: theirs, on the script's own setting
            routes[k].append(yours_route(k, given[k], plan))
    if world > 1 and "gradient_accumulation_steps" in placeholders and \
            "gradient_accumulation_steps" in facts.divided_by_world:
        divides, accumulation = facts.divided_by_world["gradient_accumulation_steps"], \
            plan.batch.gradient_accumulation_steps
        notes.append(f"the script divides its accumulation by its world size (`{divides}`): "
                     f"{{gradient_accumulation_steps}} makes it accumulate {accumulation // world or 'less than 1'} a "
                     f"process, not the plan's {accumulation}; pass {{gradient_accumulation_steps_total}} (the total "
                     "over the processes) instead")
    if "gradient_accumulation_steps_total" in placeholders:  # the total over the processes, for a dividing script
        if world == 1 or "gradient_accumulation_steps" in facts.divided_by_world:
            routes["gradient_accumulation_steps"].append(
                "placeholder {gradient_accumulation_steps_total}" + (
                    f" (the total over the {world} processes; the script divides it by its world size: "
                    f"`{facts.divided_by_world['gradient_accumulation_steps']}`)" if world > 1 else ""))
        else:
            total = plan.batch.gradient_accumulation_steps * world
            notes.append(f"{{gradient_accumulation_steps_total}} is the accumulation over all {world} processes "
                         f"({total}), for a script that divides it by its world size; this script is not read "
                         f"dividing it, so it would accumulate {total} a process, {world} times the plan's "
                         f"{plan.batch.gradient_accumulation_steps}: pass {{gradient_accumulation_steps}} instead")
    if world > 1 and "learning_rate" in placeholders and "learning_rate" in facts.scaled_by_world:
        notes.append(f"the script multiplies its learning rate by its world size "
                     f"(`{facts.scaled_by_world['learning_rate']}`): {{learning_rate}} makes it train at "
                     f"{plan.schedule.learning_rate * world:g}, not the plan's {plan.schedule.learning_rate:g}; "
                     f"pass {plan.schedule.learning_rate / world:g} instead (--wire auto does)")
    switch = world_read_switch(facts.path, {facts.dests.get(f) or f.lstrip("-").replace("-", "_"): f
                                            for f in facts.flags}) if facts.path.endswith(".py") else None
    routes["world_size"].append("environment (WORLD_SIZE, RANK, LOCAL_RANK from the launcher)" + (
        f", read by the script only where `{switch[0]}` holds ({', '.join(switch[1])}): not known before the launch "
        "whether it holds with the arguments given; its first steps show whether its ranks join one job"
        if switch else ""))
    for k, name in VALUE_ENV.items():
        if name in facts.env_reads and k not in plan.run.script_defaults:  # not exported then
            routes[k].append(f"environment ({name}, read by the script)")
    if PLAN_ENV in facts.env_reads:  # the plan's file: a route for the values the script names in its source only
        unnamed = []
        for k in keys:
            if k in plan.run.script_defaults or k == "world_size":
                continue
            if k in facts.names_in_source:
                routes[k].append(f"environment ({PLAN_ENV}, the plan's file, read by the script: it names {k})")
            else:
                unnamed.append(k)
        if unnamed:
            notes.append(f"the script reads the plan's file (${PLAN_ENV}) but names no {', '.join(unnamed)} in its "
                         "source: not counted as handed over (its first steps show what it runs)")
    if facts.uses_accelerate:  # an explicit Accelerator(mixed_precision=...) beats the environment
        if "mixed_precision" not in facts.accelerator_kwargs:
            routes["precision"].append("environment (ACCELERATE_MIXED_PRECISION, read by Accelerator())")
        if not withhold_accumulation(facts, routes):
            routes["gradient_accumulation_steps"].append(
                "environment (ACCELERATE_GRADIENT_ACCUMULATION_STEPS, read by Accelerator())")
    ds_path_given = "deepspeed_config" in placeholders or "deepspeed_config" in wired or \
        any(a.endswith((ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE)) for a in user_args)
    if deepspeed_json and ds_path_given and facts.uses_deepspeed_initialize:
        # the engine takes accumulation, precision and the optimizer from the JSON; the micro-batch
        # reaches the data only when the script's loader asks the engine for it
        keys = ["gradient_accumulation_steps", "precision"]
        if "learning_rate" not in plan.run.script_defaults:  # a rate the JSON leaves out is not delivered by it
            keys.append("learning_rate")
        if facts.reads_deepspeed_micro_batch:
            keys.append("micro_batch_size")
        for k in keys:
            routes[k].append(_behind("DeepSpeed JSON", facts))
    if not routes["precision"]:
        precision_claim(plan, facts, routes, notes)
    if deepspeed_json:  # the engine itself: does the script run DeepSpeed with the plan's ZeRO settings?
        routes["engine"] = _engine_routes(plan, facts, ds_path_given, wired)
    elif plan.engine.backend == "fsdp":  # ... or FSDP2 with the plan's sharding?
        routes["engine"] = _fsdp_routes(plan, facts, wired)
    if facts.uses_autotune:
        for k in routes:
            routes[k].append("Python API (the script imports autotune)")
    for k in plan.run.script_defaults:
        if k in routes and not routes[k]:
            routes[k].append(f"yours: training.{k} is not set, so the script keeps its own (set it to have autotune "
                             "pass it)")
    derived = facts.derived_accumulation
    if derived is not None and not routes.get("gradient_accumulation_steps"):
        notes.append(f"the script computes its accumulation in code from its own {derived.flag} (`{derived.statement}`"
                     f"): the plan's accumulation cannot reach it, and its global batch is that argument's; set "
                     f"{derived.flag} after `--` for the plan's {plan.batch.global_batch_size} samples a step (its "
                     "first steps show what it trains, and the fix)")
    advisory = [k for k in routes if not routes[k]]
    # where it saves: the run directory's checkpoints folder, when autotune handed it over (shown in the table, not
    # only on the Command: line); no plan value, never advisory
    if "checkpoint_dir" in wired:
        routes["checkpoint_dir"] = [f"{_wired_route('checkpoint_dir', wired['checkpoint_dir'], facts, plan)}: the "
                                    "run directory's checkpoints folder (--wire auto)"]
    elif "checkpoint_dir" in placeholders:
        routes["checkpoint_dir"] = ["placeholder {checkpoint_dir}: the run directory's checkpoints folder"]
    return Delivery(routes, advisory, notes=tuple(notes), engine=plan.engine.backend, shape=shape_of(facts),
                    divides_accumulation=facts.divided_by_world.get("gradient_accumulation_steps"),
                    deepspeed_condition=facts.deepspeed_condition, flags=tuple(facts.flags),
                    switches=tuple(f for f, switch in facts.flags.items() if switch), given=given,
                    derived=facts.derived_accumulation, derived_given=value_of(
                        facts.derived_accumulation.flag, user_args) if facts.derived_accumulation else None)


def _behind(route: str, facts: ScriptFacts) -> str:
    """A route the script takes only on its own condition is handed over, not a fact until observed."""
    if facts.deepspeed_condition is None:
        return route
    return (f"{route}, only if the script takes its deepspeed.initialize path (behind `if "
            f"{facts.deepspeed_condition}`; the first steps show which it took)")


def _wired_route(key: str, flag: str, facts: ScriptFacts, plan: TrainingPlan) -> str:
    if flag.startswith("hydra:"):
        how = f"Hydra override {flag[6:]}=... (a key of {facts.hydra.where(flag[6:])}, read by @hydra.main)"
    elif facts.lightning is not None:
        how = f"LightningCLI flag {flag}"
    else:
        how = (f"recognised setting {flag[2:-1]} ({flag}..., read by the script's --key=value configurator)"
               if flag.endswith("=") else f"recognised flag {flag}")
    world = plan.engine.world_size
    if key == "gradient_accumulation_steps" and key in facts.divided_by_world:
        how += (f", given the total over the {world} process(es), {plan.batch.gradient_accumulation_steps * world}: "
                f"the script divides it by its world size (`{facts.divided_by_world[key]}`)")
    if key == "learning_rate" and key in facts.scaled_by_world and world > 1:
        how += (f", given the plan's rate / {world}, {plan.schedule.learning_rate / world:g}: the script multiplies "
                f"it by its world size (`{facts.scaled_by_world[key]}`)")
    return how


def _engine_routes(plan: TrainingPlan, facts: ScriptFacts, ds_path_given: bool, wired: dict[str, str]
                   ) -> list[str]:
    out = []
    if "engine" in wired and facts.lightning is not None:
        out.append(f"LightningCLI flag --trainer.strategy (Lightning's own DeepSpeed settings for ZeRO stage "
                   f"{plan.engine.zero_stage}, not autotune's JSON)")
    if facts.uses_deepspeed_initialize and ds_path_given:
        out.append(_behind("DeepSpeed JSON (deepspeed.initialize)", facts))
    if plan.engine.device == "cuda":  # on CPU their CPU switch turns DeepSpeed off
        if facts.uses_accelerate:
            out.append("environment (ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_CONFIG_FILE, read by "
                       "Accelerator())")
        if facts.uses_hf_trainer and ds_path_given:
            out.append("Trainer's --deepspeed (its DeepSpeed integration)")
    return out


def _fsdp_routes(plan: TrainingPlan, facts: ScriptFacts, wired: dict[str, str]) -> list[str]:
    out = []
    if wired.get("engine") == "--trainer.strategy":
        out.append("LightningCLI flag --trainer.strategy fsdp (Lightning's own FSDP settings)")
    if facts.uses_fully_shard:
        out.append("the script wraps its model with FSDP itself")
    if BACKEND_ENV in facts.env_reads:
        out.append(f"environment ({BACKEND_ENV}=fsdp, read by the script)")
    if plan.engine.device == "cuda":  # on CPU Accelerate's CPU mode trains with DDP
        if facts.uses_accelerate:
            out.append("environment (ACCELERATE_USE_FSDP, FSDP_VERSION=2 and the FSDP_* settings, read by "
                       "Accelerator())")
        if wired.get("engine") == "--fsdp":
            out.append("Trainer's --fsdp and --fsdp_config (FSDP2)")
    return out
