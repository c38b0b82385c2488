"""Which of autotune's variables a script is not given, and why: Accelerate's accumulation where the script sets its
own or the plan's micro-batch cannot reach it, torchrun's rank variables for a one-process script that decides on
DDP by testing RANK. Pure; no torch.
"""

from __future__ import annotations

from pathlib import Path

from autotune.exports.script_scan import ScriptFacts
from autotune.exports.user_values import carries_plan
from autotune.plan import TrainingPlan

# torchrun's variables for one process: withheld from a script that decides on DDP by testing them
RANK_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def withhold_accumulation(facts: ScriptFacts | None, routes: dict[str, list[str]] | None = None) -> str | None:
    """Why ACCELERATE_GRADIENT_ACCUMULATION_STEPS must not be exported to this script, or None. Accelerate lets the
    variable beat an explicit ``Accelerator(gradient_accumulation_steps=...)``, so exporting it would silently
    override the script; and accumulation without the plan's micro-batch trains another effective batch."""
    if facts is None or not facts.uses_accelerate:
        return None
    if "gradient_accumulation_steps" in facts.accelerator_kwargs:
        return ("the script passes gradient_accumulation_steps to Accelerator() itself: autotune does not override "
                "it (pass {gradient_accumulation_steps} there to deliver the plan's)")
    if routes is not None and not carries_plan(routes.get("micro_batch_size", [])):
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
