"""Flags shared by plan/export/launch, and the run-directory writer."""

from __future__ import annotations

import argparse
import json
import secrets
import time
from importlib import metadata
from pathlib import Path

from autotune.config import TrainConfig, apply_overrides, load_config
from autotune.errors import UserError
from autotune.profiles import HardwareProfile, load_profile

DEFAULT_CONFIG = Path(__file__).resolve().parent.parent.parent / "configs" / "default_config.yaml"


def _int_at_least(minimum: int, what: str):
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            v = minimum - 1
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return v

    return parse


positive_int = _int_at_least(1, "a positive integer")
non_negative_int = _int_at_least(0, "an integer >= 0")


def zero_stage(text: str) -> int:
    if text not in {"0", "1", "2", "3"}:
        raise argparse.ArgumentTypeError(f"ZeRO stage must be 0, 1, 2 or 3, got {text!r}")
    return int(text)


def add_config_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=str(DEFAULT_CONFIG), metavar="FILE",
                   help="training config YAML (default: configs/default_config.yaml)")


def add_plan_args(p: argparse.ArgumentParser) -> None:
    add_config_arg(p)
    p.add_argument("--hardware", metavar="PRESET|PATH",
                   help="plan for a preset (e.g. 4xL4, 8xH100-80GB) or a profile JSON instead of this machine")
    p.add_argument("--policy", metavar="FILE", help="planning policy YAML (default: configs/policy.yaml)")
    g = p.add_argument_group("overrides (each beats the planner and is listed as 'auto would choose X')")
    g.add_argument("--num_gpus", type=non_negative_int, metavar="N", help="GPUs to use on each node (0 = CPU)")
    g.add_argument("--nproc_per_node", type=positive_int, metavar="N", help="processes per node (on CPU: >1 means DDP over gloo)")
    g.add_argument("--num_nodes", type=positive_int, metavar="N", help="nodes in the job")
    g.add_argument("--node_rank", type=non_negative_int, metavar="N", help="this node's rank, 0 .. num_nodes-1")
    g.add_argument("--master_addr", metavar="HOST", help="address of the rank-0 node (multi-node)")
    g.add_argument("--master_port", type=positive_int, metavar="N", help="rendezvous port on the rank-0 node")
    g.add_argument("--batch_size", type=positive_int, metavar="N", help="micro-batch per process (training.batch_size_per_gpu)")
    g.add_argument("--grad_accum", type=positive_int, metavar="N", help="gradient accumulation steps")
    g.add_argument("--global_batch_size", type=positive_int, metavar="N", help="target effective batch per optimizer step")
    g.add_argument("--epochs", type=positive_int, metavar="N", help="training epochs")
    g.add_argument("--max_steps", type=positive_int, metavar="N", help="stop after this many optimizer steps")
    eng = g.add_mutually_exclusive_group()
    eng.add_argument("--deepspeed", action="store_true", help="force the DeepSpeed engine")
    eng.add_argument("--ddp", action="store_true", help="force DDP via torchrun")
    eng.add_argument("--single", action="store_true", help="force one process")
    g.add_argument("--zero_stage", type=zero_stage, metavar="{0,1,2,3}", help="DeepSpeed ZeRO stage 0-3")
    g.add_argument("--precision", choices=["bf16", "fp16", "fp32"], help="mixed precision")
    g.add_argument("--debug", action="store_true", help="plan a tiny, fast run (small batch, 20 steps)")
    g.add_argument("--no_auto_optimize", action="store_true",
                   help="use the config verbatim: no policy table, no derived values")


_FLAG_TO_FIELD = {
    "num_gpus": "distributed.num_gpus",
    "nproc_per_node": "distributed.nproc_per_node",
    "num_nodes": "distributed.num_nodes",
    "node_rank": "distributed.node_rank",
    "master_addr": "distributed.master_addr",
    "master_port": "distributed.master_port",
    "batch_size": "training.batch_size_per_gpu",
    "grad_accum": "training.gradient_accumulation_steps",
    "global_batch_size": "training.global_batch_size",
    "epochs": "training.epochs",
    "max_steps": "training.max_steps",
    "zero_stage": "distributed.zero_stage",
    "precision": "training.mixed_precision",
}


def overrides_from_args(args: argparse.Namespace) -> dict:
    out = {field: getattr(args, flag) for flag, field in _FLAG_TO_FIELD.items() if getattr(args, flag, None) is not None}
    for flag in ("deepspeed", "ddp", "single"):
        if getattr(args, flag, False):
            out["distributed.backend"] = flag
    return out


def deepspeed_installed_locally() -> bool:
    try:
        metadata.version("deepspeed")
        return True
    except metadata.PackageNotFoundError:
        return False


def resolve_hardware(spec: str | None) -> HardwareProfile:
    if spec:
        return load_profile(spec)
    from autotune.hardware import detect

    return detect()


def prepare_run(cfg: TrainConfig, overrides: dict, *, auto_optimize: bool = True, debug: bool = False,
                hardware: str | HardwareProfile | None = None, policy: str | None = None):
    """config + flags + hardware -> (plan, profile, deepspeed dict or None).

    ``hardware`` is a preset name or profile path, an already resolved profile, or None to detect.
    """
    from autotune.deepspeed_config import deepspeed_config
    from autotune.policy import load_policy, plan

    if overrides:
        cfg = apply_overrides(cfg, overrides)
    hw = hardware if isinstance(hardware, HardwareProfile) else resolve_hardware(hardware)
    # A preset says nothing about installed software: the plan will run with what is installed here.
    if "deepspeed" in hw.software:
        ds_installed = bool(hw.software["deepspeed"])
    else:
        ds_installed = deepspeed_installed_locally()
    p = plan(hw, cfg, auto_optimize=auto_optimize, debug=debug, policy=load_policy(policy),
             deepspeed_installed=ds_installed)
    return p, hw, (deepspeed_config(p) if p.backend == "deepspeed" else None)


def plan_from_args(args: argparse.Namespace):
    cfg = load_config(args.config)
    return prepare_run(cfg, overrides_from_args(args), auto_optimize=not args.no_auto_optimize,
                       debug=args.debug, hardware=args.hardware, policy=args.policy)


def new_run_dir_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


RUN_RECORDS = ("plan.json", "hardware.json", "deepspeed_config.json", "command.json")


def archive_run_files(run_dir: Path) -> Path | None:
    """Move an earlier launch's records to previous/<time>/ so a resume never overwrites them."""
    present = [run_dir / n for n in RUN_RECORDS if (run_dir / n).exists()]
    if not present:
        return None
    dest = run_dir / "previous" / time.strftime("%Y%m%d-%H%M%S")
    while dest.exists():
        dest = dest.with_name(dest.name + "-1")
    dest.mkdir(parents=True)
    for f in present:
        f.rename(dest / f.name)
    return dest


def write_run_files(run_dir: Path, plan, hw, ds: dict | None, spec) -> None:
    """Write the run's records; plan.json last, so its presence means the rest is there."""
    run_dir.mkdir(parents=True, exist_ok=True)
    archive_run_files(run_dir)
    _write_atomic(run_dir / "hardware.json", hw.to_json() + "\n")
    if ds is not None:
        _write_atomic(run_dir / "deepspeed_config.json", json.dumps(ds, indent=2) + "\n")
    if spec is not None:
        _write_atomic(run_dir / "command.json", json.dumps(spec.to_record(), indent=2) + "\n")
    _write_atomic(run_dir / "plan.json", plan.model_dump_json(indent=2) + "\n")


def check_run_dir_free(run_dir: Path, resuming: bool) -> None:
    """Never overwrite a user's finished run by accident."""
    if run_dir.exists() and (run_dir / "plan.json").exists() and not resuming:
        raise UserError(
            f"--run_dir: {run_dir} already holds a run (plan.json); add --resume_from auto to continue it, "
            "or choose another directory"
        )
    if run_dir.exists() and not run_dir.is_dir():
        raise UserError(f"--run_dir: {run_dir} exists and is not a directory")

