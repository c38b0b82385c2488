"""Each plan value against what the script was observed to run: equal; different, with the plan's value and what
would deliver it (``FIX``); the script's own (a value the plan does not set); or not observable.
"""

from __future__ import annotations

from autotune.rundir.layout import VALUE_ENV

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


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:g}" if v != int(v) else str(int(v))
    return str(v)


def verdict(plan, key: str, seen, want, wired: bool) -> dict:
    """One plan value (not the learning rate: ``rate_rule``): the script's own when the plan only defaults it,
    not observable when nothing shows it, else equal or different (with the fix)."""
    if key in plan.run.script_defaults:  # not planned: the script's own value, observed for the record
        return {"status": "yours", "observed": seen, "plan": None}
    if seen is None:
        return {"status": "not observable", "observed": None, "plan": want}
    same = abs(seen - want) <= 1e-9 * max(1.0, abs(want)) if isinstance(want, float) else seen == want
    out = {"status": "equal" if same else "different", "observed": seen, "plan": want}
    if not same:
        hint = "" if wired else WIRE_HINT
        out["fix"] = FIX.get(key, "") + (hint if key in ("micro_batch_size", "gradient_accumulation_steps") else "")
    return out


def divided_accumulation_fix(accumulation: dict, divides: str | None, world: int, wired: bool) -> None:
    """An accumulation of plan / world from a script read dividing it by its world size: the fix names the division
    and the total to pass (in place)."""
    if accumulation["status"] == "different" and divides and accumulation["observed"] * world == accumulation["plan"]:
        accumulation["fix"] = (f"the script divides its accumulation by its world size (`{divides}`: "
                               f"{accumulation['observed']} a "
                               f"process = {accumulation['plan']} / {world}): pass the total over the processes, "
                               f"{{gradient_accumulation_steps_total}} ({accumulation['plan'] * world})"
                               + (", which --wire auto passes when it reads the division" if not wired else ""))
