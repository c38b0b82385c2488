"""TrainingPlan -> DeepSpeed config dict (pure; no deepspeed import).

Key names are DeepSpeed's own (https://www.deepspeed.ai/docs/config-json/).
``check_keys`` guards our own spelling: DeepSpeed ignores unknown top-level
keys silently, so a typo here would otherwise go unnoticed.
"""

from __future__ import annotations

from autotune.plan import TrainingPlan

# Top-level keys this module may emit; all are documented DeepSpeed keys.
KNOWN_TOP_LEVEL_KEYS = frozenset({
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
    "gradient_clipping", "steps_per_print", "zero_optimization", "bf16", "fp16",
    "optimizer", "activation_checkpointing", "wall_clock_breakdown", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer",
})

def deepspeed_config(plan: TrainingPlan) -> dict:
    """The engine flavour: batch sizes, ZeRO, precision, and the optimizer from ``plan.optimizer``."""
    eng, opt = plan.engine, plan.optimizer
    stage = eng.zero_stage if eng.zero_stage is not None else 0
    bucket = plan.memory.bucket_elements
    zero: dict = {
        "stage": stage,
        "overlap_comm": eng.device == "cuda",  # overlap needs CUDA streams
        "contiguous_gradients": True,
        "reduce_bucket_size": bucket,
    }
    if stage in (1, 2):
        zero.update(allgather_bucket_size=bucket, reduce_scatter=True)
    if stage == 3:
        zero.update(stage3_prefetch_bucket_size=bucket, stage3_param_persistence_threshold=100_000)
    if eng.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": eng.device == "cuda"}
    if eng.offload_param:
        zero["offload_param"] = {"device": "cpu", "pin_memory": eng.device == "cuda"}
    out: dict = {
        "train_batch_size": plan.batch.global_batch_size,
        "train_micro_batch_size_per_gpu": plan.batch.micro_batch_size,
        "gradient_accumulation_steps": plan.batch.gradient_accumulation_steps,
        # DeepSpeed clips at 1.0 when the key is absent: 0.0 is its word for "no clipping".
        "gradient_clipping": float(opt.gradient_clipping or 0.0),
        "steps_per_print": max(1, plan.run.log_every_steps) * 100,
        "wall_clock_breakdown": False,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {
                "lr": plan.schedule.learning_rate,
                "betas": list(opt.betas),
                "eps": opt.eps,
                "weight_decay": opt.weight_decay,
                # torch's AdamW needs no JIT build. ZeRO-Offload on GPUs uses DeepSpeed's CPU Adam
                # (vectorised, built once per machine); on a CPU-only plan the states live in host
                # memory anyway, so torch's AdamW runs there without a ~50 s first-use build.
                "torch_adam": not eng.offload_optimizer or eng.device == "cpu",
            },
        },
    }
    if eng.offload_optimizer and eng.device == "cpu":
        out["zero_force_ds_cpu_optimizer"] = False  # DeepSpeed insists on its CPU Adam for offload otherwise
    if plan.numerics.precision == "bf16":
        out["bf16"] = {"enabled": True}
    elif plan.numerics.precision == "fp16":
        # loss_scale 0 = dynamic loss scaling, starting at 2^16.
        out["fp16"] = {"enabled": True, "loss_scale": 0, "initial_scale_power": 16,
                       "loss_scale_window": 1000, "hysteresis": 2, "min_loss_scale": 1}
    if plan.memory.gradient_checkpointing:
        out["activation_checkpointing"] = {
            "partition_activations": False,
            "contiguous_memory_optimization": False,
            "cpu_checkpointing": False,
            "number_checkpoints": None,
            "synchronize_checkpoint_boundary": False,
            "profile": False,
        }
    check_keys(out)
    return out


# The framework flavour (``deepspeed_config_hf.json``, rundir.layout.FRAMEWORK_FLAVOUR_FILE) is for Accelerate and
# Hugging Face Trainer: they build the optimizer and scheduler from the script (Accelerate refuses an optimizer
# section beside one made in code) and fill every "auto" from their own arguments, which the launcher sets to
# the plan's values (Accelerate's environment, Trainer's flags under --wire auto).
def framework_flavour(ds: dict) -> dict:
    """The engine flavour without the optimizer, with "auto" where Accelerate and HF Trainer fill in
    the value from their own arguments (batch sizes, accumulation, clipping, precision). ZeRO's
    settings stay concrete: they are the plan's and neither framework has them as arguments."""
    out = {k: v for k, v in ds.items() if k not in ("optimizer", "zero_force_ds_cpu_optimizer")}
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping"):
        out[key] = "auto"
    for key in ("bf16", "fp16"):
        if key in out:
            out[key] = {**out[key], "enabled": "auto"}
    out["zero_allow_untested_optimizer"] = True  # the script's own optimizer under ZeRO
    check_keys(out)
    return out


def check_keys(ds: dict) -> None:
    """Raise on a top-level key DeepSpeed does not know (it would ignore it silently)."""
    unknown = set(ds) - KNOWN_TOP_LEVEL_KEYS
    if unknown:
        raise ValueError(f"unknown DeepSpeed top-level keys: {sorted(unknown)}")
