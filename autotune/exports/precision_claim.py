"""What can be said before the launch of the precision of a script no route of the plan's reaches, shown from its
source (pure; no torch): a precision it sets itself, one behind a switch of its own (not known), a precision argument
of its own (its default is a setting), or PyTorch's fp32 where nothing read sets another.
"""

from __future__ import annotations

import ast

from autotune.exports.script_scan import ScriptFacts
from autotune.plan import TrainingPlan


def precision_claim(plan: TrainingPlan, facts: ScriptFacts, routes: dict[str, list[str]], notes: list[str]) -> None:
    """What can be said of the precision of a script no route reaches: read from the script and the modules of its
    own project (minGPT autocasts in its trainer.py). A precision it sets itself is named (the plan's does not reach
    it); one behind its own switch is not known (timm autocasts only under --amp); a precision argument of its own
    sets one by its default (litgpt's --precision); fp32 is PyTorch's default only when nothing read sets another,
    and everything could be read; otherwise it is not known before the launch."""
    own = [p for p in facts.precision_set if not p.conditional] or facts.precision_set
    if own and not own[0].conditional:
        first = own[0]
        what = first.precision or "a dtype read at run time"
        notes.append(f"the script sets its own precision ({first.where}: {what}"
                     + (f"; {len(own) - 1} more place(s)" if len(own) > 1 else "")
                     + f"): the plan's {plan.numerics.precision} does not reach it; its first steps show what it runs")
        return
    if own:  # every one behind a switch of the script's: on or off is the script's arguments' to say
        first = own[0]
        flags = switch_flags((first.switch or "").removeprefix("enabled="), facts)
        turn = f" ({', '.join(flags)} turns it on)" if flags else ""
        notes.append(f"the script sets a precision of its own only behind its switch `{first.switch or 'enabled=...'}`"
                     f"{turn} ({first.where}): whether it runs {first.precision or 'a dtype read at run time'} or "
                     f"PyTorch's fp32 is not known before the launch; the plan's {plan.numerics.precision} does not "
                     "reach it; its first steps show what it runs")
        return
    own_args = precision_arguments(facts)
    if own_args:
        if plan.numerics.precision == "fp32":
            notes.append(f"the script has its own precision argument(s) ({', '.join(own_args)}): its default is a "
                         "setting of its own, not known before the launch; its first steps show what it runs")
        return
    if plan.numerics.precision != "fp32" or facts.uses_deepspeed_initialize or \
            "mixed_precision" in facts.accelerator_kwargs:
        return
    if facts.project_unread:
        notes.append(f"whether the script sets its own precision is not known before launch: "
                     f"{'; '.join(facts.project_unread)} could not be read; its first steps show what it runs")
        return
    read = f" (read with {len(facts.project)} module(s) of its own project)" if facts.project else ""
    routes["precision"].append(f"fp32 is PyTorch's default and the script sets no precision{read}")


PRECISION_WORDS_IN_NAMES = ("precision", "dtype", "amp", "fp16", "bf16", "half", "autocast")


def precision_arguments(facts: ScriptFacts) -> list[str]:
    """The script's own flags and configurator settings that name a precision (``--precision``, ``--dtype``,
    ``--amp``, ``--bf16``; nanoGPT's ``dtype``): a default of one is a setting of the script's."""
    def names(n: str) -> bool:
        words = n.lstrip("-").replace("-", "_").replace(".", "_").split("_")
        return any(w in PRECISION_WORDS_IN_NAMES for w in words)

    return [f for f in facts.flags if names(f)] + [s for s in facts.settings if names(s)]


def switch_flags(test: str, facts: ScriptFacts) -> list[str]:
    """The script's declared flags whose attribute a switch's test reads (``args.amp`` -> --amp)."""
    try:
        tree = ast.parse(test, mode="eval")
    except SyntaxError:
        return []
    read = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} | \
        {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    return [f for f in facts.flags if facts.dests.get(f, f.lstrip("-").replace("-", "_")) in read]
