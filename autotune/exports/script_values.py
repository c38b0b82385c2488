"""The plan's values as a script takes them (pure): the total accumulation to a script that divides it by its
world size, the rate / world size to one that multiplies it, the precision as torch's dtype name. Shared by the
argparse and configurator wiring (``wiring``) and the Hydra and LightningCLI wiring (``wire_shapes``).
"""

from __future__ import annotations

from autotune.exports.script_scan import ScriptFacts
from autotune.exports.user_values import planned_value
from autotune.plan import DTYPE_WORDS, TrainingPlan


def for_the_script(key: str, facts: ScriptFacts, plan: TrainingPlan):
    """The value that makes the script run the plan's, where the script transforms what it gets: the total
    accumulation over the processes to a script that divides it by its world size, the rate / world size to one that
    multiplies it (None: the plan's value as it is)."""
    world = plan.engine.world_size
    if key == "gradient_accumulation_steps" and key in facts.divided_by_world:
        return plan.batch.gradient_accumulation_steps * world
    if key == "learning_rate" and key in facts.scaled_by_world and world > 1:
        return plan.schedule.learning_rate / world
    return None


def setting_value(key: str, facts: ScriptFacts, plan: TrainingPlan):
    value = for_the_script(key, facts, plan)
    if value is not None:
        return value
    if key == "precision":  # a setting's value: torch's dtype name (a flag's words: wiring.precision_word)
        return DTYPE_WORDS[plan.numerics.precision]
    return planned_value(plan, key)
