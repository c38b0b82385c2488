"""How the plan reaches a user's script, and the honest record of it (pure; no torch).

``scan_script(path)`` reads the script's syntax tree (never runs it): the argparse flags
it declares (``add_argument``), ``deepspeed.add_config_arguments`` (``--deepspeed``,
``--deepspeed_config``), Hugging Face ``HfArgumentParser``/``TrainingArguments`` (their
flags), and whether it uses Accelerate's ``Accelerator``, ``deepspeed.initialize``,
``autotune`` itself, or reads ``AUTOTUNE_*`` variables.

``wire_flags`` (``--wire auto``) adds the recognised flags with the plan's values; a flag
the user passed wins. ``delivery`` records, for each plan value a script can act on, every
route by which it reached the script (placeholder, recognised flag, environment read by
Accelerate or the script, DeepSpeed JSON, Python API); a value with no route is
*advisory*, and the launch says so.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass, field
from pathlib import Path

from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan
from autotune.rundir.layout import ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE

# plan value -> flag names a script may declare for it (first declared one is used)
FLAGS: dict[str, tuple[str, ...]] = {
    "micro_batch_size": ("--per_device_train_batch_size", "--micro_batch_size", "--batch_size", "--batch-size",
                         "--micro-batch-size"),
    "gradient_accumulation_steps": ("--gradient_accumulation_steps", "--grad_accum", "--gradient-accumulation-steps",
                                    "--grad-accum"),
    "learning_rate": ("--learning_rate", "--lr", "--learning-rate"),
    "num_workers": ("--num_workers", "--dataloader_num_workers", "--num-workers", "--workers"),
    "deepspeed_config": ("--deepspeed_config", "--deepspeed-config"),
    "epochs": ("--num_train_epochs", "--epochs", "--num_epochs", "--num-epochs"),
    "max_steps": ("--max_steps", "--max-steps"),
    "resume_from": ("--resume_from", "--resume", "--resume_from_checkpoint", "--resume-from", "--resume-from-checkpoint"),
    "precision": ("--mixed_precision", "--mixed-precision", "--precision"),
}
# Values a script acts on (the launch reports each one's routes)
DELIVERED = ("micro_batch_size", "gradient_accumulation_steps", "learning_rate", "precision", "num_workers",
             "world_size")
HF_FLAGS = {"--per_device_train_batch_size": False, "--gradient_accumulation_steps": False,
            "--learning_rate": False, "--dataloader_num_workers": False, "--num_train_epochs": False,
            "--max_steps": False, "--deepspeed": False, "--bf16": True, "--fp16": True, "--output_dir": False,
            "--seed": False, "--weight_decay": False, "--adam_beta1": False, "--adam_beta2": False,
            "--adam_epsilon": False, "--max_grad_norm": False, "--fsdp": True, "--fsdp_config": False}


@dataclass
class ScriptFacts:
    path: str
    flags: dict[str, bool] = field(default_factory=dict)  # declared flag -> is a switch (store_true)
    aliases: dict[str, tuple[str, ...]] = field(default_factory=dict)  # flag -> every name of its add_argument
    choices: dict[str, tuple[str, ...]] = field(default_factory=dict)  # flag -> its declared string choices
    uses_accelerate: bool = False
    accelerator_kwargs: set[str] = field(default_factory=set)  # explicit Accelerator(...) arguments
    reads_deepspeed_micro_batch: bool = False  # engine.train_micro_batch_size_per_gpu() or training_data=
    uses_deepspeed_initialize: bool = False
    uses_fully_shard: bool = False  # the script wraps its model with FSDP itself (fully_shard, FSDP1's class)
    deepspeed_launcher_args: bool = False  # deepspeed.add_config_arguments: --deepspeed is a switch
    uses_hf_trainer: bool = False
    uses_autotune: bool = False
    env_reads: set[str] = field(default_factory=set)  # AUTOTUNE_* names found as string literals
    error: str | None = None


def scan_script(path: str | Path) -> ScriptFacts:
    facts = ScriptFacts(str(path))
    try:
        tree = ast.parse(Path(path).read_text(), filename=str(path))
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError) as e:
        facts.error = f"could not read {path}: {e}"
        return facts
    for node in ast.walk(tree):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
            if any(m == "autotune" or m.startswith("autotune.") for m in mods):
                facts.uses_autotune = True
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.startswith("AUTOTUNE_"):
            facts.env_reads.add(node.value)
        elif isinstance(node, ast.Call):
            name = _call_name(node.func)
            if name.endswith("add_argument"):
                switch = any(k.arg == "action" and isinstance(k.value, ast.Constant)
                             and k.value.value in ("store_true", "store_false") for k in node.keywords)
                names = tuple(a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)
                              and a.value.startswith("-"))
                choices = next((k.value for k in node.keywords if k.arg == "choices"), None)
                words = tuple(e.value for e in choices.elts if isinstance(e, ast.Constant)) \
                    if isinstance(choices, (ast.List, ast.Tuple, ast.Set)) else ()
                for name in names:
                    if name.startswith("--"):
                        facts.flags[name] = switch
                        facts.aliases[name] = names
                        if words:
                            facts.choices[name] = tuple(str(w) for w in words)
            elif name.endswith("add_config_arguments"):
                facts.deepspeed_launcher_args = True
                facts.flags.update({"--deepspeed": True, "--deepspeed_config": False})
            elif name.split(".")[-1] in ("HfArgumentParser", "TrainingArguments", "Seq2SeqTrainingArguments"):
                facts.uses_hf_trainer = True
                if name.split(".")[-1] == "HfArgumentParser":
                    for flag, switch in HF_FLAGS.items():
                        facts.flags.setdefault(flag, switch)
            elif name.split(".")[-1] == "Accelerator":
                facts.uses_accelerate = True
                facts.accelerator_kwargs.update(k.arg for k in node.keywords if k.arg)
            elif name.split(".")[-1] in ("fully_shard", "FullyShardedDataParallel"):
                facts.uses_fully_shard = True
            elif name.endswith("deepspeed.initialize") or name == "initialize" and "deepspeed" in _imports(tree):
                facts.uses_deepspeed_initialize = True
                if any(k.arg == "training_data" for k in node.keywords):
                    facts.reads_deepspeed_micro_batch = True
        elif isinstance(node, ast.Attribute) and node.attr == "train_micro_batch_size_per_gpu":
            facts.reads_deepspeed_micro_batch = True
    if facts.uses_hf_trainer and "--deepspeed" in facts.flags and not facts.deepspeed_launcher_args:
        facts.flags["--deepspeed"] = False  # HF's --deepspeed takes the JSON's path
    return facts


def _imports(tree: ast.AST) -> set[str]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module.split(".")[0])
    return out


def _call_name(func: ast.AST) -> str:
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    return ".".join(reversed(parts))


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
        if key == "deepspeed_config" and "deepspeed_config" not in values:
            continue
        if key in ("epochs", "max_steps", "resume_from") and not values.get(key):
            continue
        if key in plan.run.script_defaults:  # the built-in workload's default, not the user's: the script's stays
            continue
        extra += [flag, values[key]]
        used[key] = flag
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


@dataclass(frozen=True)
class Delivery:
    routes: dict[str, list[str]]  # plan value -> how it reached the script
    advisory: list[str]  # plan values that reached the script by no route
    withheld: dict[str, str] = field(default_factory=dict)  # variable -> why it is not exported to this script
    engine: str = "deepspeed"  # the plan's backend, for the advisory engine's words

    def to_record(self) -> dict:
        return {"routes": self.routes, "advisory": self.advisory, "withheld": self.withheld}

    def summary(self) -> list[str]:
        words = {"micro_batch_size": "batch size", "gradient_accumulation_steps": "accumulation steps",
                 "learning_rate": "learning rate", "precision": "precision", "num_workers": "DataLoader workers"}
        out = []
        for k in self.advisory:
            if k == "engine" and self.engine == "fsdp":
                out.append("the script was given no way to run FSDP2: the plan's engine (FSDP2) is advisory and the "
                           "script trains with whatever it sets up itself (Accelerate and HF Trainer run FSDP on GPUs "
                           "only; a torchrun script wraps its model with fully_shard itself, reading "
                           "$AUTOTUNE_BACKEND)")
            elif k == "engine":
                out.append("the script was given no way to run DeepSpeed: the plan's engine (DeepSpeed ZeRO) is "
                           "advisory and the script trains with whatever it sets up itself (Accelerate and HF "
                           "Trainer run DeepSpeed on GPUs only; a deepspeed.initialize script needs "
                           "--deepspeed_config {deepspeed_config} or --wire auto)")
            else:
                out.append(f"the script was given no {words.get(k, k)}: the plan's {k} is advisory")
        out += [f"{name} not exported: {why}" for name, why in self.withheld.items()]
        return out


def delivery(plan: TrainingPlan, facts: ScriptFacts | None, placeholders: list[str], wired: dict[str, str],
             user_args: list[str], deepspeed_json: bool) -> Delivery:
    """Every route by which each plan value reached the script."""
    routes: dict[str, list[str]] = {k: [] for k in DELIVERED}
    if facts is None:  # autotune's own runtime or a module:function entrypoint that reads the plan
        return Delivery({k: ["Python API (autotune runtime)"] for k in DELIVERED}, [])
    for k in DELIVERED:
        if k in placeholders:
            routes[k].append(f"placeholder {{{k}}}")
        if k in wired:
            routes[k].append(f"recognised flag {wired[k]}")
    routes["world_size"].append("environment (WORLD_SIZE, RANK, LOCAL_RANK from the launcher)")
    env_names = {"micro_batch_size": "AUTOTUNE_MICRO_BATCH_SIZE",
                 "gradient_accumulation_steps": "AUTOTUNE_GRADIENT_ACCUMULATION_STEPS",
                 "learning_rate": "AUTOTUNE_LEARNING_RATE", "precision": "AUTOTUNE_PRECISION",
                 "num_workers": "AUTOTUNE_NUM_WORKERS"}
    for k, name in env_names.items():
        if name in facts.env_reads:
            routes[k].append(f"environment ({name}, read by the script)")
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
            routes[k].append("DeepSpeed JSON")
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
    return Delivery(routes, advisory, engine=plan.engine.backend)


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


def _engine_routes(plan: TrainingPlan, facts: ScriptFacts, ds_path_given: bool) -> list[str]:
    out = []
    if facts.uses_deepspeed_initialize and ds_path_given:
        out.append("DeepSpeed JSON (deepspeed.initialize)")
    if plan.engine.device == "cuda":  # on CPU their CPU switch turns DeepSpeed off
        if facts.uses_accelerate:
            out.append("environment (ACCELERATE_USE_DEEPSPEED, ACCELERATE_DEEPSPEED_CONFIG_FILE, read by Accelerator())")
        if facts.uses_hf_trainer and ds_path_given:
            out.append("Trainer's --deepspeed (its DeepSpeed integration)")
    return out


def _fsdp_routes(plan: TrainingPlan, facts: ScriptFacts, wired: dict[str, str]) -> list[str]:
    out = []
    if facts.uses_fully_shard:
        out.append("the script wraps its model with FSDP itself")
    if "AUTOTUNE_BACKEND" in facts.env_reads:
        out.append("environment (AUTOTUNE_BACKEND=fsdp, read by the script)")
    if plan.engine.device == "cuda":  # on CPU Accelerate's CPU mode trains with DDP
        if facts.uses_accelerate:
            out.append("environment (ACCELERATE_USE_FSDP, FSDP_VERSION=2 and the FSDP_* settings, read by "
                       "Accelerator())")
        if wired.get("engine") == "--fsdp":
            out.append("Trainer's --fsdp and --fsdp_config (FSDP2)")
    return out
