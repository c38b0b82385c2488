"""``--wire auto``: the plan's values as the script's own flags and settings (pure; no torch).

``autotune.exports.script_scan`` reads what the script declares and does (never running it). ``wire_flags`` adds
the recognised flags and configurator settings with the plan's values (the total accumulation to a script that
divides it by its world size, the rate / world size to one that multiplies it); a flag the user passed wins.
``autotune.exports.delivery`` records every route by which each value reached the script.
"""

from __future__ import annotations

from autotune.exports.delivery import (  # noqa: F401 - the record's names, where callers have found them
    DELIVERED,
    Delivery,
    delivery,
)
from autotune.exports.script_scan import (  # noqa: F401 - the scan's names, where callers have found them
    FLAGS,
    SETTINGS,
    ScriptFacts,
    scan_script,
)
from autotune.exports.script_values import for_the_script, setting_value
from autotune.exports.withheld import (  # noqa: F401 - what a script is not given, where callers have found it
    RANK_VARIABLES,
    withhold_accumulation,
    withhold_rank_env,
)
from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan


def _passed(args: list[str], flag: str, facts: ScriptFacts | None = None) -> bool:
    """Whether ``args`` give ``flag`` under any of its names (``--lr`` and ``--learning_rate`` of one
    add_argument are one value: flags you pass win, whichever name you use)."""
    names = facts.aliases.get(flag, (flag,)) if facts is not None else (flag,)
    for a in args:
        for n in names:
            if a == n or a.startswith(n + "=") or (len(n) == 2 and not n.startswith("--") and a.startswith(n)):
                return True
            if facts is not None and abbreviates(a, n, facts):
                return True
    return False


def abbreviates(arg: str, flag: str, facts: ScriptFacts) -> bool:
    """Whether ``arg`` (``--per_device``, ``--per_device=8``) names the script's ``flag`` by argparse's prefix
    matching (``allow_abbrev``, its default): the start of that declared long flag and of no other, not a flag
    itself. An abbreviation the wiring missed let the plan's flag, appended after it, silently win over the user's
    value (framework audit: ``--per_device 8`` ran 4)."""
    word = arg.split("=", 1)[0]
    if not word.startswith("--") or len(word) < 3 or word in facts.flags or not flag.startswith(word):
        return False
    return [f for f in facts.flags if f.startswith(word)] == [flag]


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
    """(extra arguments, plan value -> flag used) for the flags the script declares and the user left out; a Hydra
    or LightningCLI app gets its own forms (``autotune.exports.wire_shapes``)."""
    if facts.hydra is not None or facts.lightning is not None:
        from autotune.exports.wire_shapes import wire_hydra, wire_lightning

        return (wire_hydra if facts.hydra is not None else wire_lightning)(facts, plan, values, user_args)
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
        value = for_the_script(key, facts, plan)
        extra += [flag, values[key] if value is None else _text(value)]
        used[key] = flag
    if facts.configurator:  # module settings in the one-token form its configurator reads
        for key, names in SETTINGS.items():
            name = next((n for n in names if n in facts.settings), None)
            if name is None or key in used or key in plan.run.script_defaults or _passed(user_args, f"--{name}"):
                continue
            if key == "precision" and any(_passed(user_args, f, facts) for f in ("--bf16", "--fp16", *FLAGS[key])):
                continue
            text = _as_setting(setting_value(key, facts, plan), facts.settings[name])
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
    _wire_precision(facts, plan, user_args, extra, used)
    # HF Trainer on a CPU plan: TrainingArguments refuses --bf16 without a GPU unless --use_cpu says it is meant
    if facts.uses_hf_trainer and plan.engine.device == "cpu" and "--use_cpu" in facts.flags and \
            _passed([*user_args, *extra], "--bf16") and not _passed(user_args, "--use_cpu"):
        extra.append("--use_cpu")
    return extra, used


def given_by_user(facts: ScriptFacts, plan: TrainingPlan, values: dict[str, str], user_args: list[str]
                  ) -> dict[str, str]:
    """Plan value -> the user's own argument after `--` that sets it (``--batch_size 8``), for each setting --wire
    auto finds in the script and leaves to the user because they passed it (a flag you pass wins, under any of its
    names). The delivery shows it as theirs, not as no route; the fixes name it."""
    if facts is None or not user_args:
        return {}
    _, bare = wire_flags(facts, plan, values, [])
    _, kept = wire_flags(facts, plan, values, user_args)
    out = {}
    for key, flag in bare.items():
        if key in kept:
            continue
        argument = _argument_given(user_args, _names_of(key, flag, facts), facts)
        if argument is not None:
            out[key] = argument
    return out


def _names_of(key: str, flag: str, facts: ScriptFacts) -> set[str]:
    """Every name under which the user may have set ``key`` in this script: the flag --wire auto would pass, the
    other declared names of the value (and their aliases), its configurator setting, its precision switches."""
    if flag.startswith("hydra:"):
        return {flag[len("hydra:"):]}
    names = {flag.rstrip("=")}
    for n in (*FLAGS.get(key, ()), *(("--bf16", "--fp16") if key == "precision" else ())):
        if n in facts.flags:
            names.update(facts.aliases.get(n, (n,)))
    if facts.configurator:
        names.update(f"--{n}" for n in SETTINGS.get(key, ()) if n in facts.settings)
    return names


def _argument_given(args: list[str], names: set[str], facts: ScriptFacts) -> str | None:
    """The user's argument that sets one of ``names`` (with its value), as they passed it; secrets shown redacted,
    control characters escaped (it is printed)."""
    from autotune.redaction import redact_args
    from autotune.safe_input import printable

    shown = [printable(a) for a in redact_args(args)]
    for i, a in enumerate(args):
        override = a.lstrip("+~") if "=" in a and not a.startswith("-") else a  # a Hydra override: [+~]key=value
        for n in names:
            if override.startswith(n + "=") or (len(n) == 2 and n != a and a.startswith(n)):  # -b4
                return shown[i]
            if a.startswith("--") and "=" in a and abbreviates(a, n, facts):  # --per_device=8
                return shown[i]
            if a != n and not abbreviates(a, n, facts):
                continue
            if facts.flags.get(n) or i + 1 == len(args) or args[i + 1].startswith("--"):
                return shown[i]  # a switch (--bf16), or a flag with no value after it
            return f"{shown[i]} {shown[i + 1]}"
    return None


def with_wired(args: list[str], extra: list[str]) -> list[str]:
    """The script's arguments with what --wire auto adds: after the user's, except a LightningCLI subcommand the
    wiring adds, which comes first (its flags belong to it)."""
    from autotune.exports.script_lightning import SUBCOMMANDS

    if extra and extra[0] in SUBCOMMANDS:
        return [extra[0], *args, *extra[1:]]
    return [*args, *extra]


def _wire_precision(facts: ScriptFacts, plan: TrainingPlan, user_args: list[str], extra: list[str],
                    used: dict[str, str]) -> None:
    """The plan's precision as the script's value flag or its --bf16/--fp16 switch, unless the user chose one."""
    precision, switches = plan.numerics.precision, {"bf16": "--bf16", "fp16": "--fp16"}
    if any(_passed(user_args, f, facts) for f in (*switches.values(), *FLAGS["precision"])):
        return  # the user chose the precision
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


def _text(value) -> str:
    return repr(value) if isinstance(value, float) else str(value)


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


