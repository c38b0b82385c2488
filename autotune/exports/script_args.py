"""Placeholders in a user script's arguments: ``--batch_size {micro_batch_size}`` (pure).

Every scalar that ``plan --json`` prints is a placeholder (``{micro_batch_size}``,
``{gradient_accumulation_steps}``, ``{global_batch_size}``, ``{learning_rate}``,
``{num_workers}``, ``{precision}``, ``{world_size}``, ...), plus the run's paths and
schedule: ``{deepspeed_config}``, ``{run_dir}``, ``{checkpoint_dir}``, ``{resume_from}``,
``{epochs}``, ``{max_steps}``, ``{seed}``, and ``{gradient_accumulation_steps_total}`` (the accumulation
over all processes, for a script that divides it by its world size). autotune replaces them itself (no shell is
involved); ``{{`` and ``}}`` are literal braces; an unknown name is a UserError naming
it and the known names.
"""

from __future__ import annotations

import re
from pathlib import Path

from autotune.errors import UserError
from autotune.plan import DTYPE_WORDS, TrainingPlan, public_dict
from autotune.redaction import redact_args
from autotune.rundir.layout import checkpoint_dir

_TOKEN = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")


def _text(value) -> str:
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def placeholder_names() -> set[str]:
    """Every name ``placeholder_values`` may give, known before any plan (what `check` judges a config's script
    arguments by, as launch will): the plan's flat fields, the run's values and the paths."""
    import types
    import typing

    from pydantic import BaseModel

    from autotune.plan import PUBLIC_FIELDS, TrainingPlan

    def scalar(kind) -> bool:  # a nested model (memory_estimate), a list or a dict is no placeholder
        origin = typing.get_origin(kind)
        if origin in (typing.Union, types.UnionType):
            return all(scalar(k) for k in typing.get_args(kind))
        kind = origin or kind
        return not (isinstance(kind, type) and issubclass(kind, (BaseModel, dict, list, tuple)))

    fields = {flat: TrainingPlan.model_fields[s].annotation.model_fields[a].annotation for flat, s, a in PUBLIC_FIELDS}
    return {flat for flat, kind in fields.items() if scalar(kind)} | set(RUN_NAMES) | set(_CONTEXT_NAMES) | {
        "hardware"}


RUN_NAMES = ("epochs", "max_steps", "seed", "resume_from", "node_rank", "master_addr", "master_port", "num_gpus",
             "dtype", "gradient_accumulation_steps_total")


def placeholder_values(plan: TrainingPlan, run_dir: str | Path | None,
                       deepspeed_config_path: str | Path | None) -> dict[str, str]:
    """Placeholder name -> text. Paths are None-free only when the caller knows them."""
    flat = public_dict(plan)
    values = {k: _text(v) for k, v in flat.items() if not isinstance(v, (dict, list))}
    values.update(  # RUN_NAMES
        epochs=_text(plan.schedule.epochs), max_steps=_text(plan.schedule.max_steps), seed=_text(plan.run.seed),
        resume_from=_text(plan.run.resume_from), node_rank=_text(plan.engine.node_rank),
        master_addr=plan.engine.master_addr, master_port=_text(plan.engine.master_port),
        num_gpus=_text(plan.engine.num_gpus),
        # the precision as torch's dtype name, for a --dtype flag (llm.c: float32, bfloat16, float16)
        dtype=DTYPE_WORDS[plan.numerics.precision],
        # for a script that divides its accumulation by its world size (nanoGPT's gradient_accumulation_steps)
        gradient_accumulation_steps_total=_text(plan.batch.gradient_accumulation_steps * plan.engine.world_size),
    )
    if run_dir is not None:
        values.update(run_dir=str(run_dir), checkpoint_dir=str(checkpoint_dir(run_dir)))
    if deepspeed_config_path is not None:
        values["deepspeed_config"] = str(deepspeed_config_path)
    return values


# Names that exist but need a value the caller may not have (a run directory, a DeepSpeed plan).
_CONTEXT_NAMES = {"run_dir": "a run directory", "checkpoint_dir": "a run directory",
                  "deepspeed_config": "the DeepSpeed engine (--deepspeed)"}


def expand(args: list[str], values: dict[str, str], where: str = "script arguments") -> list[str]:
    """Replace every {name} in every argument; UserError for unknown names or stray braces."""
    out = []
    shown = redact_args(list(args))  # what an error may quote: never a secret (autotune.redaction)
    for arg, seen in zip(args, shown):
        def sub(m: re.Match) -> str:
            tok = m.group(0)
            if tok == "{{":
                return "{"
            if tok == "}}":
                return "}"
            if m.group(1) is None:
                raise UserError(f"{where}: a lone {tok!r} in {seen!r}; write {tok * 2} for a literal brace")
            name = m.group(1).strip()
            if name in values:
                return values[name]
            if not re.fullmatch(r"\w+", name):  # a Hydra dict or JSON ({user:a,password:b}): never echoed
                elided = re.sub(r"\{[^{}]*\}", "{...}", seen)
                raise UserError(f"{where}: braces that hold no placeholder name in {elided!r} (what they hold is "
                                "not shown: it may be a secret); write {{ and }} for literal braces, as a Hydra dict "
                                "or JSON needs (+db={{user:alice}})")
            what = f"{{{name}}}" if seen == arg else "(not shown: a secret)"  # the braces may hold the secret
            if name in _CONTEXT_NAMES:
                raise UserError(f"{where}: {what} in {seen!r} needs {_CONTEXT_NAMES[name]}, which this command "
                                "has not")
            known = ", ".join("{" + k + "}" for k in sorted(values))
            raise UserError(f"{where}: unknown placeholder {what} in {seen!r}; known: {known}")

        out.append(_TOKEN.sub(sub, arg))
    return out


def used_placeholders(args: list[str]) -> list[str]:
    """The placeholder names appearing in ``args`` (for the run's records)."""
    names = []
    for arg in args:
        for m in _TOKEN.finditer(arg):
            if m.group(1) is not None and m.group(1).strip() not in names:
                names.append(m.group(1).strip())
    return names

