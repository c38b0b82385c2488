"""``ScriptPlan``: the plan as a user's script gets it from ``autotune.current_plan()``, with helpers that speak
the script's libraries (DataLoader, Accelerator, DeepSpeed)."""

from __future__ import annotations

from typing import Literal

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
