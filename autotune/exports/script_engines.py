"""Which engines a user's script can run, shown from its source (pure; never run; no torch).

The built-in runtime runs every engine, and so does a script that uses it (``autotune.runtime.make_engine``).
A user's script runs DeepSpeed only where it calls ``deepspeed.initialize``, or uses Accelerate or the Hugging Face
Trainer, which take the DeepSpeed config autotune hands them (Accelerate's ACCELERATE_DEEPSPEED_CONFIG_FILE, the
Trainer's ``--deepspeed``); FSDP2 only where it shards its model itself (``fully_shard``), or through Accelerate or
the Trainer's ``--fsdp``. A plain DDP script does neither: launched under a DeepSpeed or FSDP2 plan, it trains DDP
while the plan's memory and time are another engine's. What is not shown is not assumed: the planner keeps DDP and
says why (``planner.choice.candidates``).
"""

from __future__ import annotations

from autotune.exports.script_scan import ScriptFacts

NAMES = {"deepspeed": "DeepSpeed", "fsdp": "FSDP2"}


def engines_not_run(entry: str | None, facts: ScriptFacts | None) -> dict[str, str]:
    """backend -> why the script ``entry`` cannot run it ({} for autotune's own runtime, ``entry`` None).
    ``facts``: what its source shows (None: its source is not here to read)."""
    if not entry:
        return {}
    if facts is None or facts.error:
        seen = f"its source could not be read here ({facts.error})" if facts is not None and facts.error else \
            "its source is not here to read"
        return {b: f"{entry}: {seen}, so it is not shown to run {n} (--{b} if it does)" for b, n in NAMES.items()}
    if facts.uses_autotune:  # autotune's own runtime in the script (runtime.make_engine): every engine
        return {}
    out = {}
    if not (facts.uses_deepspeed_initialize or facts.uses_accelerate or
            (facts.uses_hf_trainer and "--deepspeed" in facts.flags)):
        out["deepspeed"] = (f"{entry} does not call deepspeed.initialize, nor use Accelerate or the Hugging Face "
                            "Trainer, which take a DeepSpeed config: it cannot run DeepSpeed (--deepspeed if it does)")
    if not (facts.uses_fully_shard or facts.uses_accelerate or (facts.uses_hf_trainer and "--fsdp" in facts.flags)):
        out["fsdp"] = (f"{entry} does not shard its model (fully_shard), nor use Accelerate or the Hugging Face "
                       "Trainer's --fsdp: it cannot run FSDP2 (--fsdp if it does)")
    return out
