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

# torch.optim.AdamW's own defaults: what DeepSpeed builds the JSON's AdamW with for a parameter the JSON leaves out
TORCH_ADAMW_DEFAULTS = {"lr": 0.001, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
# DeepSpeed's own default when the JSON has no gradient_clipping key (deepspeed.runtime.constants)
DEEPSPEED_DEFAULT_CLIPPING = 1.0


def deepspeed_clipping(plan: TrainingPlan) -> float:
    """The clipping DeepSpeed applies for this plan: the config's, or 0.0 (none) where the config sets none and the
    value is the script's (``plan.run.script_defaults``), as the DeepSpeed JSON writes it."""
    if "gradient_clipping" in plan.run.script_defaults:
        return 0.0
    return float(plan.optimizer.gradient_clipping or 0.0)


def optimizer_params(plan: TrainingPlan) -> dict:
    """The JSON's AdamW parameters: only what the plan owns. A user's script keeps its own rate, weight decay, betas
    and eps unless the config sets them (``plan.run.script_defaults``); left out, DeepSpeed builds AdamW with torch's
    defaults (``TORCH_ADAMW_DEFAULTS``), and a script that passes its own optimizer keeps all of its own."""
    opt, yours = plan.optimizer, plan.run.script_defaults
    out: dict = {}
    if "learning_rate" not in yours:
        out["lr"] = plan.schedule.learning_rate
    if not plan.run.entrypoint:  # the built-in workload's AdamW; no config key sets them for a script
        out.update(betas=list(opt.betas), eps=opt.eps)
    if "weight_decay" not in yours:
        out["weight_decay"] = opt.weight_decay
    return out


def deepspeed_config(plan: TrainingPlan) -> dict:
    """The engine flavour: batch sizes, ZeRO, precision, and the optimizer from ``plan.optimizer`` (only what the
    plan owns: ``optimizer_params``)."""
    eng = plan.engine
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
        # DeepSpeed clips at 1.0 when the key is absent: 0.0 is its word for "no clipping" (a script's own clipping,
        # when the config sets none, is the script's: DeepSpeed adds none)
        "gradient_clipping": deepspeed_clipping(plan),
        "steps_per_print": max(1, plan.run.log_every_steps) * 100,
        "wall_clock_breakdown": False,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {
                **optimizer_params(plan),
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


def deepspeed_reasons(plan: TrainingPlan, ds: dict) -> dict[str, str]:
    """What the engine flavour ``ds`` sets for the optimizer and clipping, in the plan's words (its reasons
    ``gradient_clipping`` and ``optimizer``): the plan says whatever the JSON applies, and which values it leaves to
    the script or to DeepSpeed's and torch's defaults."""
    yours = plan.run.script_defaults
    clip = ds.get("gradient_clipping", DEEPSPEED_DEFAULT_CLIPPING)
    if "gradient_clipping" in yours:
        clipping = (f"training.gradient_clipping is not set: the DeepSpeed JSON sets gradient_clipping 0.0, so "
                    f"DeepSpeed does not clip (its own default would clip at {DEEPSPEED_DEFAULT_CLIPPING:g}); your "
                    "script's own clipping, if any, is all there is")
    elif clip:
        clipping = f"the DeepSpeed JSON's gradient_clipping {clip:g}: DeepSpeed clips the gradient norm at {clip:g}"
    else:
        clipping = (f"the DeepSpeed JSON sets gradient_clipping 0.0: DeepSpeed does not clip (training.gradient_"
                    f"clipping is null; DeepSpeed's own default would clip at {DEEPSPEED_DEFAULT_CLIPPING:g})")
    params = (ds.get("optimizer") or {}).get("params") or {}
    set_ = ", ".join(f"{k} {_words(params[k])}" for k in ("lr", "betas", "eps", "weight_decay") if k in params)
    left = [k for k in ("lr", "betas", "eps", "weight_decay") if k not in params]
    optimizer = f"the DeepSpeed JSON's AdamW: {set_ or 'no parameter set'}"
    if left:
        optimizer += (f"; left out: {', '.join(left)}: a script that passes its own optimizer to deepspeed.initialize "
                      "keeps its own, otherwise DeepSpeed builds AdamW at torch's defaults ("
                      + ", ".join(f"{k} {_words(TORCH_ADAMW_DEFAULTS[k])}" for k in left) + ")")
    return {"gradient_clipping": clipping, "optimizer": optimizer}


def _words(v) -> str:
    return f"({', '.join(f'{x:g}' for x in v)})" if isinstance(v, (list, tuple)) else f"{v:g}"


def check_keys(ds: dict) -> None:
    """Raise on a top-level key DeepSpeed does not know (it would ignore it silently)."""
    unknown = set(ds) - KNOWN_TOP_LEVEL_KEYS
    if unknown:
        raise ValueError(f"unknown DeepSpeed top-level keys: {sorted(unknown)}")
