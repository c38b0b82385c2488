"""Run a user's entrypoint in this process: ``package.module:function`` or ``path/to/script.py``.

    python -m autotune.entry [script arguments...]      # what the launcher runs for module:function

The entrypoint sees only its own arguments in ``sys.argv`` (never autotune's), finds the plan in
$AUTOTUNE_PLAN, and its return value (or ``sys.exit``) is the exit code.
"""

from __future__ import annotations

import importlib
import runpy
import sys
from typing import Literal

from autotune.errors import UserError, run_cli
from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan


class ScriptPlan(TrainingPlan):
    """The plan as a user's script gets it from ``autotune.current_plan()``: the same typed plan with
    helpers that speak the script's libraries (DataLoader, Accelerator, DeepSpeed)."""

    @classmethod
    def of(cls, plan: TrainingPlan) -> "ScriptPlan":
        return cls.model_validate(plan.model_dump())

    def dataloader_kwargs(self) -> dict:
        """``DataLoader(dataset, **plan.dataloader_kwargs())``: per-process micro-batch and the loader's knobs."""
        kw: dict = {"batch_size": self.batch.micro_batch_size, "num_workers": self.loader.num_workers,
                    "pin_memory": self.loader.pin_memory}
        if self.loader.num_workers > 0 and self.loader.prefetch_factor is not None:
            kw["prefetch_factor"] = self.loader.prefetch_factor  # torch refuses it without workers
        return kw

    def accelerator_kwargs(self) -> dict:
        """``Accelerator(**plan.accelerator_kwargs())``: precision, accumulation, the CPU switch; on GPUs with
        a DeepSpeed plan also a ``deepspeed_plugin`` built from the framework-flavoured JSON (imports accelerate)."""
        kw: dict = {"mixed_precision": ACCELERATE_MIXED_PRECISION[self.numerics.precision],
                    "gradient_accumulation_steps": self.batch.gradient_accumulation_steps,
                    "cpu": self.engine.device == "cpu"}
        if self.is_deepspeed and self.engine.device == "cuda":
            from accelerate.utils import DeepSpeedPlugin

            kw["deepspeed_plugin"] = DeepSpeedPlugin(hf_ds_config=self.deepspeed_config("framework"))
        return kw

    def deepspeed_config(self, flavour: Literal["engine", "framework"] = "engine") -> dict:
        """The DeepSpeed JSON as a dict: ``engine`` (with the optimizer, for ``deepspeed.initialize``) or
        ``framework`` (no optimizer, "auto" values: for Accelerate and HF Trainer)."""
        from autotune.exports.deepspeed import deepspeed_config, framework_flavour

        ds = deepspeed_config(self)
        if flavour == "framework":
            return framework_flavour(ds)
        if flavour != "engine":
            raise ValueError(f"flavour: 'engine' or 'framework', not {flavour!r}")
        return ds


def run_entrypoint(entry: str, args: list[str]) -> int:
    if entry.endswith(".py"):
        sys.argv = [entry, *args]
        runpy.run_path(entry, run_name="__main__")
        return 0
    mod, _, fn = entry.partition(":")
    try:
        func = getattr(importlib.import_module(mod), fn or "main")
    except (ImportError, AttributeError) as e:
        raise UserError(f"training.entrypoint: cannot import {entry!r}: {e}") from None
    sys.argv = [mod, *args]
    return int(func() or 0)


def main(argv: list[str] | None = None) -> int:
    from autotune.rundir.records import load_plan

    args = list(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        plan = load_plan()  # the launcher's: $AUTOTUNE_PLAN
        if not plan.run.entrypoint:
            raise UserError("python -m autotune.entry: the plan has no training.entrypoint")
        return run_entrypoint(plan.run.entrypoint, args)

    return run_cli(body)


if __name__ == "__main__":
    sys.exit(main())
