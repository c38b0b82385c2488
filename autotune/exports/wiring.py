"""How the plan reaches a user's script, and the honest record of it (pure; no torch).

``autotune.exports.script_scan`` reads what the script declares and does (never running it). ``wire_flags``
(``--wire auto``) adds the recognised flags and configurator settings with the plan's values (the total accumulation
to a script that divides it by its world size, the rate / world size to one that multiplies it); a flag the user
passed wins. ``delivery`` records, for each plan value a script can act on, every route by which it reached the
script (placeholder, recognised flag or setting, environment read by Accelerate or the script, DeepSpeed JSON,
Python API); a value with no route is *advisory*, and the launch says so. Before the launch these are the routes
handed over; what the script ran is observed in its first steps (autotune.launch.evidence).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from autotune.exports.script_scan import (  # noqa: F401 - the scan's names, where callers have found them
    FLAGS,
    SETTINGS,
    ScriptFacts,
    scan_script,
)
from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan
from autotune.rundir.layout import BACKEND_ENV, ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE, PLAN_ENV, VALUE_ENV

DTYPE_WORDS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
# torchrun's variables for one process: withheld from a script that decides on DDP by testing them
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
# Values a script acts on (the launch reports each one's routes)
DELIVERED = ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision", "num_workers",
             "world_size")

def _passed(args: list[str], flag: str, facts: ScriptFacts | None = None) -> bool:
    """Whether ``args`` give ``flag`` under any of its names (``--lr`` and ``--learning_rate`` of one
    add_argument are one value: flags you pass win, whichever name you use)."""
    names = facts.aliases.get(flag, (flag,)) if facts is not None else (flag,)
    for a in args:
        for n in names:
            if a == n or a.startswith(n + "=") or (len(n) == 2 and not n.startswith("--") and a.startswith(n)):
                return True
    return False


# The precision in a script's own words: its declared choices first, else the flag's convention
# (Accelerate's words for --mixed_precision, the plain ones for --precision).
PRECISION_WORDS = {"bf16": ("bf16", "bfloat16"), "fp16": ("fp16", "float16", "half"),
                   "fp32": ("fp32", "no", "float32", "32", "full", "none")}


def precision_word(flag: str, precision: str, choices: tuple[str, ...] = ()) -> str | None:
    """What to pass to ``flag`` for ``precision``; None when its declared choices have no word for it."""
    if choices:
        return next((w for w in PRECISION_WORDS[precision] if w in choices), None)
    return ACCELERATE_MIXED_PRECISION[precision] if "mixed" in flag else precision


def wire_flags(facts: ScriptFacts, plan: TrainingPlan, values: dict[str, str], user_args: list[str]
               ) -> tuple[list[str], dict[str, str]]:
    """(extra arguments, plan value -> flag used) for the flags the script declares and the user left out."""
    extra: list[str] = []
    used: dict[str, str] = {}
    for key, names in FLAGS.items():
        flag = next((n for n in names if n in facts.flags), None)
        if flag is None or any(_passed(user_args, n, facts) for n in names):
            continue
        if key == "precision":
            continue  # below: switches or a value
        if key in ("deepspeed_config", "checkpoint_dir") and key not in values:
            continue
        if key in ("epochs", "max_steps", "resume_from") and not values.get(key):
            continue
        if key in plan.run.script_defaults:  # the built-in workload's default, not the user's: the script's stays
            continue
        value = _for_the_script(key, facts, plan)
        extra += [flag, values[key] if value is None else _text(value)]
        used[key] = flag
    if facts.configurator:  # module settings in the one-token form its configurator reads
        for key, names in SETTINGS.items():
            name = next((n for n in names if n in facts.settings), None)
            if name is None or key in used or key in plan.run.script_defaults or _passed(user_args, f"--{name}"):
                continue
            if key == "precision" and any(_passed(user_args, f, facts) for f in ("--bf16", "--fp16", *FLAGS[key])):
                continue
            text = _as_setting(_setting_value(key, facts, plan), facts.settings[name])
            if text is not None:
                extra.append(f"--{name}={text}")
                used[key] = f"--{name}="
    # HF's --deepspeed takes the JSON's path; the DeepSpeed launcher's --deepspeed is a switch
    if "deepspeed_config" in values and "--deepspeed" in facts.flags and not _passed(user_args, "--deepspeed"):
        if facts.flags["--deepspeed"]:
            extra.append("--deepspeed")
        elif "deepspeed_config" not in used:
            extra += ["--deepspeed", values["deepspeed_config"]]
            used["deepspeed_config"] = "--deepspeed"
    # HF Trainer's FSDP2 (transformers >= 5: a bare --fsdp, the rest in --fsdp_config as JSON), on GPUs: on CPU
    # Trainer's Accelerate trains with DDP
    if plan.engine.backend == "fsdp" and plan.engine.device == "cuda" and facts.uses_hf_trainer and \
            "--fsdp" in facts.flags and not _passed(user_args, "--fsdp"):
        import json

        from autotune.exports.launch_spec import hf_fsdp_config

        extra.append("--fsdp")
        if not _passed(user_args, "--fsdp_config"):
            extra += ["--fsdp_config", json.dumps(hf_fsdp_config(plan), separators=(",", ":"))]
        used["engine"] = "--fsdp"
    if facts.uses_hf_trainer and plan.optimizer.name == "adamw":
        # Trainer builds its own AdamW (its default optim) from these; with the framework-flavoured
        # DeepSpeed JSON they are the only way the plan's optimizer reaches it.
        opt = plan.optimizer
        for flag, value, key in (("--weight_decay", opt.weight_decay, "weight_decay"),
                                 ("--max_grad_norm", opt.gradient_clipping or 0.0, "gradient_clipping")):  # 0: off
            if flag in facts.flags and not _passed(user_args, flag) and key not in plan.run.script_defaults:
                extra += [flag, f"{value:g}"]  # Trainer's own betas and eps stay: autotune only defaults them
                used.setdefault("optimizer", flag)
    precision, switches = plan.numerics.precision, {"bf16": "--bf16", "fp16": "--fp16"}
    if any(_passed(user_args, f, facts) for f in (*switches.values(), *FLAGS["precision"])):
        return extra, used  # the user chose the precision
    value_flag = next((n for n in FLAGS["precision"] if n in facts.flags and not facts.flags[n]), None)
    word = None if value_flag is None else precision_word(value_flag, precision, facts.choices.get(value_flag, ()))
    if value_flag is not None and word is not None:
        extra += [value_flag, word]
        used["precision"] = value_flag
    elif switches.get(precision) in facts.flags:
        extra.append(switches[precision])
        used["precision"] = switches[precision]
    elif precision == "fp32" and any(f in facts.flags for f in switches.values()):
        used["precision"] = "(no --bf16/--fp16: fp32)"
    return extra, used


def _for_the_script(key: str, facts: ScriptFacts, plan: TrainingPlan):
    """The value that makes the script run the plan's, where the script transforms what it gets: the total
    accumulation over the processes to a script that divides it by its world size, the rate / world size to one that
    multiplies it (None: the plan's value as it is)."""
    world = plan.engine.world_size
    if key == "gradient_accumulation_steps" and key in facts.divided_by_world:
        return plan.batch.gradient_accumulation_steps * world
    if key == "learning_rate" and key in facts.scaled_by_world and world > 1:
        return plan.schedule.learning_rate / world
    return None


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


def _setting_value(key: str, facts: ScriptFacts, plan: TrainingPlan):
    value = _for_the_script(key, facts, plan)
    if value is not None:
        return value
    return {"micro_batch_size": plan.batch.micro_batch_size,
            "gradient_accumulation_steps": plan.batch.gradient_accumulation_steps,
            "learning_rate": plan.schedule.learning_rate, "warmup_steps": plan.schedule.warmup_steps,
            "max_steps": plan.schedule.max_steps, "num_workers": plan.loader.num_workers,
            "precision": DTYPE_WORDS[plan.numerics.precision]}[key]


def _as_setting(value, kind: str) -> str | None:
    """``value`` as a configurator reads it back into a setting of ``kind`` (literal_eval, then its type check):
    a float keeps its point (1.0, not 1); None when the setting's type cannot hold it."""
    if value is None or isinstance(value, bool):
        return None
    if kind == "str":
        return value if isinstance(value, str) else None
    if kind == "float" and isinstance(value, (int, float)):
        return repr(float(value))
    if kind == "int" and isinstance(value, (int, float)) and float(value).is_integer():
        return str(int(value))
    return None


@dataclass(frozen=True)
class Delivery:
    routes: dict[str, list[str]]  # plan value -> how it reached the script
    advisory: list[str]  # plan values that reached the script by no route
    withheld: dict[str, str] = field(default_factory=dict)  # variable -> why it is not exported to this script
    notes: tuple[str, ...] = ()  # what the script does with what it is handed (said before the launch)
    wired: bool = False  # --wire auto filled the script's own settings
    divides_accumulation: str | None = None  # the script's statement dividing its accumulation by its world size
    engine: str = "deepspeed"  # the plan's backend, for the advisory engine's words
    # plan value -> the flag or setting the script declares for it (what --wire auto passes): the fixes name these
    declared: dict[str, str] = field(default_factory=dict)

    def to_record(self) -> dict:
        return {"routes": self.routes, "advisory": self.advisory, "withheld": self.withheld, "notes": list(self.notes),
                "wired": self.wired, "divides_accumulation": self.divides_accumulation}

    def summary(self) -> list[str]:
        words = {"micro_batch_size": "batch size", "gradient_accumulation_steps": "accumulation steps",
                 "learning_rate": "learning rate", "precision": "precision", "num_workers": "DataLoader workers"}
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


def delivery(plan: TrainingPlan, facts: ScriptFacts | None, placeholders: list[str], wired: dict[str, str],
             user_args: list[str], deepspeed_json: bool) -> Delivery:
    """Every route by which each plan value reached the script."""
    routes: dict[str, list[str]] = {k: [] for k in DELIVERED}
    if facts is None:  # autotune's own runtime or a module:function entrypoint that reads the plan
        return Delivery({k: ["Python API (autotune runtime)"] for k in DELIVERED}, [])
    world = plan.engine.world_size
    notes = []
    for k in DELIVERED:
        if k in placeholders:
            routes[k].append(f"placeholder {{{k}}}")
        if k in wired:
            routes[k].append(_wired_route(k, wired[k], facts, plan))
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
    routes["world_size"].append("environment (WORLD_SIZE, RANK, LOCAL_RANK from the launcher)")
    for k, name in VALUE_ENV.items():
        if name in facts.env_reads and k not in plan.run.script_defaults:  # not exported then
            routes[k].append(f"environment ({name}, read by the script)")
    if PLAN_ENV in facts.env_reads:  # the whole plan, read from the file the variable names
        for k in DELIVERED:
            if k not in plan.run.script_defaults and k != "world_size":
                routes[k].append(f"environment ({PLAN_ENV}, the plan's file, read by the script)")
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
        keys = ["gradient_accumulation_steps", "precision", "learning_rate"]
        if facts.reads_deepspeed_micro_batch:
            keys.append("micro_batch_size")
        for k in keys:
            routes[k].append(_behind("DeepSpeed JSON", facts))
    if plan.numerics.precision == "fp32" and not routes["precision"] and not facts.uses_deepspeed_initialize \
            and "mixed_precision" not in facts.accelerator_kwargs \
            and not any(f in facts.flags for f in ("--bf16", "--fp16", *FLAGS["precision"])):
        routes["precision"].append("fp32 is PyTorch's default and the script sets no precision")
    if deepspeed_json:  # the engine itself: does the script run DeepSpeed with the plan's ZeRO settings?
        routes["engine"] = _engine_routes(plan, facts, ds_path_given)
    elif plan.engine.backend == "fsdp":  # ... or FSDP2 with the plan's sharding?
        routes["engine"] = _fsdp_routes(plan, facts, wired)
    if facts.uses_autotune:
        for k in routes:
            routes[k].append("Python API (the script imports autotune)")
    for k in plan.run.script_defaults:
        if k in routes and not routes[k]:
            routes[k].append(f"yours: training.{k} is not set, so the script keeps its own (set it to have autotune "
                             "pass it)")
    advisory = [k for k in routes if not routes[k]]
    return Delivery(routes, advisory, notes=tuple(notes), engine=plan.engine.backend,
                    divides_accumulation=facts.divided_by_world.get("gradient_accumulation_steps"))


def _behind(route: str, facts: ScriptFacts) -> str:
    """A route the script takes only on its own condition is handed over, not a fact until observed."""
    if facts.deepspeed_condition is None:
        return route
    return (f"{route}, only if the script takes its deepspeed.initialize path (behind `if "
            f"{facts.deepspeed_condition}`; the first steps show which it took)")


def _wired_route(key: str, flag: str, facts: ScriptFacts, plan: TrainingPlan) -> str:
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


def withhold_accumulation(facts: ScriptFacts | None, routes: dict[str, list[str]] | None = None) -> str | None:
    """Why ACCELERATE_GRADIENT_ACCUMULATION_STEPS must not be exported to this script, or None. Accelerate lets the
    variable beat an explicit ``Accelerator(gradient_accumulation_steps=...)``, so exporting it would silently
    override the script; and accumulation without the plan's micro-batch trains another effective batch."""
    if facts is None or not facts.uses_accelerate:
        return None
    if "gradient_accumulation_steps" in facts.accelerator_kwargs:
        return ("the script passes gradient_accumulation_steps to Accelerator() itself: autotune does not override "
                "it (pass {gradient_accumulation_steps} there to deliver the plan's)")
    if routes is not None and not routes.get("micro_batch_size"):
        return ("the plan's micro-batch has no route to the script, so its accumulation alone would train another "
                "effective batch: not exported")
    return None


def withhold_rank_env(plan: TrainingPlan, facts: ScriptFacts | None) -> str | None:
    """Why torchrun's variables must not be exported to this one-process script, or None: a script that tests RANK
    to decide on DDP would take its DDP path where plain `python train.py` does not (issue 39). A script that reads
    them without testing them needs them, and gets them."""
    if facts is None or facts.decides_ddp_by is None or plan.engine.backend != "single" or plan.engine.max_restarts:
        return None
    return (f"the script decides on DDP by testing RANK (`{facts.decides_ddp_by}`): one process runs as plain Python, "
            f"as `python {Path(facts.path).name}` would")


def _engine_routes(plan: TrainingPlan, facts: ScriptFacts, ds_path_given: bool) -> list[str]:
    out = []
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
