"""The plan in other tools' words (pure): Accelerate config, torchrun command."""

from __future__ import annotations

from autotune.policy import TrainingPlan


def accelerate_config(plan: TrainingPlan) -> dict:
    """A config for `accelerate launch --config_file` (keys of accelerate's ClusterConfig)."""
    mixed = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}[plan.precision]
    d = plan.config["distributed"]
    cfg: dict = {
        "compute_environment": "LOCAL_MACHINE",
        "debug": False,
        "machine_rank": d["node_rank"],
        "main_training_function": "main",
        "mixed_precision": mixed,
        "num_machines": plan.num_nodes,
        "num_processes": plan.world_size,
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": plan.device == "cpu",
        "downcast_bf16": "no",
        "tpu_env": [],
        "tpu_use_cluster": False,
        "tpu_use_sudo": False,
    }
    if plan.num_nodes > 1:
        cfg.update(main_process_ip=d["master_addr"], main_process_port=d["master_port"])
    if plan.backend == "deepspeed":
        cfg["distributed_type"] = "DEEPSPEED"
        cfg["deepspeed_config"] = {
            "zero_stage": plan.zero_stage,
            "gradient_accumulation_steps": plan.gradient_accumulation_steps,
            "gradient_clipping": plan.config["training"].get("gradient_clipping") or 1.0,
            "offload_optimizer_device": "cpu" if plan.offload_optimizer else "none",
            "offload_param_device": "none",
            "zero3_init_flag": False,
        }
    elif plan.world_size > 1:
        cfg["distributed_type"] = "MULTI_GPU" if plan.device == "cuda" else "MULTI_CPU"
    else:
        cfg["distributed_type"] = "NO"
    if plan.device == "cuda" and plan.backend != "deepspeed":
        cfg["gpu_ids"] = "all"
    return cfg


def torchrun_command(plan: TrainingPlan, script: str = "train.py") -> list[str]:
    from autotune.launch import torchrun_flags

    return ["torchrun", *torchrun_flags(plan), script]
