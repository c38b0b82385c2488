"""The plan in other tools' words (pure): Accelerate config, torchrun command."""

from __future__ import annotations

from autotune.plan import TrainingPlan


def accelerate_config(plan: TrainingPlan) -> dict:
    """A config for `accelerate launch --config_file` (keys of accelerate's ClusterConfig)."""
    eng = plan.engine
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[plan.numerics.precision]
    cfg: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "machine_rank": eng.node_rank,
        "main_training_function": "main",
        "mixed_precision": mixed,
        "num_machines": eng.num_nodes,
        "num_processes": eng.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": eng.device == "cpu",
        "downcast_bf16": "no",
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if eng.num_nodes > 1:
        cfg.update(main_process_ip=eng.master_addr, main_process_port=eng.master_port)
    if eng.backend == "deepspeed":
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "zero_stage": eng.zero_stage,
            "gradient_accumulation_steps": plan.batch.gradient_accumulation_steps,
            "gradient_clipping": plan.optimizer.gradient_clipping or 0.0,  # 0.0 = off, as in DeepSpeed
            "offload_optimizer_device": "cpu" if eng.offload_optimizer else "none",
            "offload_param_device": "none",
            "zero3_init_flag": False,
        }
    elif eng.world_size > 1:
        cfg["distributed_type"] = "MULTI_GPU" if eng.device == "cuda" else "MULTI_CPU"
    else:
        cfg["distributed_type"] = "NO"
    if eng.device == "cuda" and eng.backend != "deepspeed":
        cfg["gpu_ids"] = "all"
    return cfg


def torchrun_command(plan: TrainingPlan, script: str = "train.py") -> list[str]:
    from autotune.launch import torchrun_flags

    return ["torchrun", *torchrun_flags(plan), script]
