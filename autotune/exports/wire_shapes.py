"""``--wire auto`` for the script shapes that are not argparse: a Hydra app (``key=value`` overrides of its
``@hydra.main`` config) and a LightningCLI app (``--trainer.*``, ``--model.*``, ``--data.*``). Pure; no torch.
``autotune.exports.wiring.wire_flags`` hands a script of either shape here.
"""

from __future__ import annotations

from autotune.exports.script_hydra import override_text
from autotune.exports.script_lightning import PRECISION, SUBCOMMANDS, strategy
from autotune.exports.script_scan import ScriptFacts
from autotune.exports.script_values import setting_value
from autotune.plan import TrainingPlan

HYDRA = "hydra:"  # the mark of a Hydra override in the wired record (plan value -> "hydra:<dotted key>")


def _planned(key: str, plan: TrainingPlan, values: dict[str, str]) -> bool:
    """Whether the plan sets ``key`` for the script (a script's own default and an unset schedule are its own)."""
    if key in plan.run.script_defaults:
        return False
    return bool(values.get(key)) if key in ("max_steps", "epochs") else True


def wire_hydra(facts: ScriptFacts, plan: TrainingPlan, values: dict[str, str], user_args: list[str]
               ) -> tuple[list[str], dict[str, str]]:
    """The plan as overrides of the keys the app's config has; an override the user passed wins."""
    app = facts.hydra
    given = {a.split("=")[0].lstrip("+~") for a in user_args if "=" in a}
    extra: list[str] = []
    used: dict[str, str] = {}
    for key, dotted in app.routes()[0].items():
        if dotted in given or not _planned(key, plan, values):
            continue
        kind = app.keys[dotted]
        if key == "precision":
            text = override_text(app.precision_text(dotted, plan.numerics.precision), kind)
        else:
            text = override_text(setting_value(key, facts, plan), kind)
        if text is not None:
            extra.append(f"{dotted}={text}")
            used[key] = HYDRA + dotted
    return extra, used


def wire_lightning(facts: ScriptFacts, plan: TrainingPlan, values: dict[str, str], user_args: list[str]
                   ) -> tuple[list[str], dict[str, str]]:
    """The plan as LightningCLI's flags in Lightning's own spellings, after the subcommand (``fit`` added when none
    is given to an app that needs one); a flag the user passed wins."""
    app, eng = facts.lightning, plan.engine
    extra: list[str] = []
    if app.subcommands and not any(a in SUBCOMMANDS for a in user_args):
        extra.append("fit")  # training is what a launch is for: LightningCLI refuses to start without one
    given = {a.split("=")[0] for a in user_args if a.startswith("--")}
    used: dict[str, str] = {}
    texts = {"world_size": str(eng.nproc_per_node), "precision": PRECISION[plan.numerics.precision],
             "engine": strategy(plan)}
    for key, flag in app.flags().items():
        if flag in given or not _planned(key, plan, values):
            continue
        text = texts[key] if key in texts else str(setting_value(key, facts, plan))
        if text is not None:
            extra += [flag, text]
            used[key] = flag
    if "--trainer.accelerator" not in given:  # Lightning's words for the plan's device
        extra += ["--trainer.accelerator", "gpu" if eng.device == "cuda" else "cpu"]
    if eng.num_nodes > 1 and "--trainer.num_nodes" not in given:
        extra += ["--trainer.num_nodes", str(eng.num_nodes)]
    return extra, used
