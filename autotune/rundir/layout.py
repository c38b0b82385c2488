"""Every file and folder of a run directory, named once. The launcher, the ranks, the exports and
users' scripts (through placeholders and variables) all find a path here."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a name for the annotations only: a user's process (the observer) reads this module light
    from autotune.plan import TrainingPlan

PLAN = "plan.json"
HARDWARE = "hardware.json"
# DeepSpeed's JSON in two flavours: the engine's (with the optimizer; autotune's runtime and plain
# DeepSpeed scripts), and the framework's (no optimizer, "auto" values; Accelerate and HF Trainer).
ENGINE_FLAVOUR_FILE = "deepspeed_config.json"
FRAMEWORK_FLAVOUR_FILE = "deepspeed_config_hf.json"
COMMAND = "command.json"
DELIVERY = "delivery.json"
RUN_RECORDS = (PLAN, HARDWARE, ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE, COMMAND, DELIVERY)
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step-"
STATUS_DIR = ".status"
LOCK = ".autotune.lock"
METRICS = "metrics.json"
TIMING = "timing.json"  # predicted against measured samples/s (autotune.launch.speed_check)
TENSORBOARD = "tensorboard"
OBSERVED = "observed"  # what a user's script ran, per rank (autotune.runtime.observe)
LOGS = "logs"  # the launch's own output (autotune.launch.runlog)
# Everything autotune writes into a run directory (launcher, ranks, observer), relative to it: none may be a
# symbolic link (autotune.rundir.fs.refuse_links), so nothing is ever written out of the run directory.
WRITTEN = (LOCK, LOGS, f"{LOGS}/stdout.log", f"{LOGS}/stderr.log", *RUN_RECORDS, "previous", CHECKPOINTS, STATUS_DIR,
           TENSORBOARD, OBSERVED, METRICS, "metrics.jsonl", "metrics.superseded.jsonl", "backoff.jsonl",
           "resumes.jsonl", "replicas.json", "deepspeed_in_effect.json", "wandb")
# The nodes' shared job secret (autotune.launch.exchange.job_secret): the exchange admits only its holders. An
# export that starts the nodes (sbatch, Kubernetes) puts one per job in this variable, never in a file.
JOB_SECRET_ENV = "AUTOTUNE_JOB_SECRET"


def records_dir(plan: TrainingPlan, run_dir: str | Path) -> Path:
    """Where this node's launch records (plan.json, command.json, ...) go. Node 0 writes into the
    run directory itself; on a multi-node job each other node writes into ``node<rank>/`` beside
    it, so nodes sharing a file system never overwrite each other's records. Checkpoints, metrics
    and TensorBoard events stay in the run directory (rank 0 writes them)."""
    node_rank = plan.engine.node_rank  # 0 on one node: the planner refuses node_rank >= num_nodes
    return Path(run_dir) if node_rank == 0 else Path(run_dir) / f"node{node_rank}"




def deepspeed_config_path(plan, run_dir: str | Path, framework: bool = False) -> Path:
    """The DeepSpeed JSON the launch writes for this node: the framework flavour for Accelerate and
    HF Trainer scripts, the engine flavour otherwise."""
    return records_dir(plan, run_dir) / (FRAMEWORK_FLAVOUR_FILE if framework else ENGINE_FLAVOUR_FILE)


def checkpoint_dir(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS


def cache_dir() -> Path:
    """What autotune keeps between runs (traces, probes, step timings, past runs' speeds): $AUTOTUNE_CACHE_DIR,
    else $XDG_CACHE_HOME/autotune/traces, else ~/.cache/autotune/traces."""
    import os

    if os.environ.get("AUTOTUNE_CACHE_DIR"):
        return Path(os.environ["AUTOTUNE_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autotune" / "traces"
