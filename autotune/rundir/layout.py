"""Every file and folder of a run directory, and every ``AUTOTUNE_*`` variable, named once. The launcher, the ranks,
the exports and users' scripts (through placeholders and variables) all find a name here; tests/unit/rundir/
test_layout.py finds no other home of one in ``autotune/``.

Standard library only: the observer (runtime/observe_record.py) imports it in a user's process before the script's
first line, without pydantic or torch.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # a name for the annotations only: a user's process (the observer) reads this module light
    from autotune.plan import TrainingPlan

# -- the launch's records (node 0's in the run directory, node r's in node<r>/) -----------------------------------
PLAN = "plan.json"
HARDWARE = "hardware.json"
# DeepSpeed's JSON in two flavours: the engine's (with the optimizer; autotune's runtime and plain
# DeepSpeed scripts), and the framework's (no optimizer, "auto" values; Accelerate and HF Trainer).
ENGINE_FLAVOUR_FILE = "deepspeed_config.json"
FRAMEWORK_FLAVOUR_FILE = "deepspeed_config_hf.json"
COMMAND = "command.json"
DELIVERY = "delivery.json"  # how each plan value reaches a user's script, and what it was observed to run
RUN_RECORDS = (PLAN, HARDWARE, ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE, COMMAND, DELIVERY)
PREVIOUS = "previous"  # an earlier launch's records, moved aside (autotune.rundir.records)
LOCK = ".autotune.lock"
LOGS = "logs"  # the launch's own output (autotune.launch.runlog)
STDOUT_LOG, STDERR_LOG = f"{LOGS}/stdout.log", f"{LOGS}/stderr.log"

# -- what the ranks write ------------------------------------------------------------------------------------------
CHECKPOINTS = "checkpoints"
CHECKPOINT_PREFIX = "step-"  # checkpoints/step-00000100/
STATUS_DIR = ".status"  # how each rank ended, when the launcher gave no folder of its own
METRICS = "metrics.json"  # the built-in loop's summary: history, final values, measured speed
METRICS_LOG = "metrics.jsonl"  # every logged entry as it comes (survives a crash and a resume)
METRICS_SUPERSEDED = "metrics.superseded.jsonl"  # entries a resume repeated, moved out of METRICS_LOG
BACKOFF = "backoff.jsonl"  # out-of-memory back-offs (autotune.runtime.oom_backoff)
RESUMES = "resumes.jsonl"  # each resume and what it changed
REPLICAS = "replicas.json"  # the data-parallel replicas' weight digests, and whether they agree
DEEPSPEED_IN_EFFECT = "deepspeed_in_effect.json"  # what DeepSpeed's engine runs with (autotune.runtime.deepspeed_io)
TIMING = "timing.json"  # predicted against measured samples/s (autotune.launch.speed_check)
TENSORBOARD = "tensorboard"
WANDB = "wandb"
OBSERVED = "observed"  # what a user's script ran, per rank (autotune.runtime.observe)
RANK_FILES = "rank-*.json"  # observed/ and the status folder: one file a rank
AGENT_ERROR = "torchrun-error.json"  # the status folder: what ended torchrun's agent (its TORCHELASTIC_ERROR_FILE)

# -- inside a checkpoint (autotune.runtime.checkpoint_manager writes, autotune.rundir.checkpoints verifies) --------
CHECKPOINT_META = "meta.json"  # step, micro-batches consumed, backend, world size, batch sizes, training values
CHECKSUMS = "checksums.json"  # size and SHA-256 of every file
MODEL_WEIGHTS = "model.pt"  # the unwrapped fp32 weights, rank 0
TRAINER_STATE = "trainer.pt"  # optimizer, scheduler and grad-scaler state (single, DDP)
FSDP_TRAINER = "trainer.json"  # FSDP2: the optimizer's param groups and the scheduler's state, rank 0
DEEPSPEED_ENGINE_DIR = "engine"  # DeepSpeed's own checkpoint
RNG_PREFIX = "rng-rank"  # rng-rank<N>.pt: each rank's random states

# Everything autotune writes into a run directory (launcher, ranks, observer), relative to it: none may be a
# symbolic link (autotune.rundir.fs.refuse_links), so nothing is ever written out of the run directory.
WRITTEN = (LOCK, LOGS, STDOUT_LOG, STDERR_LOG, *RUN_RECORDS, PREVIOUS, CHECKPOINTS, STATUS_DIR, TENSORBOARD,
           OBSERVED, METRICS, METRICS_LOG, METRICS_SUPERSEDED, BACKOFF, RESUMES, REPLICAS, DEEPSPEED_IN_EFFECT,
           TIMING, WANDB)

# -- kept between runs, in cache_dir() -----------------------------------------------------------------------------
SPEEDS = "speeds.json"  # past runs' measured speeds (autotune.rundir.speeds)
TIMING_REQUEST = "request.json"  # what the CPU timing's children time (in a temporary folder of their own)

# -- the environment -----------------------------------------------------------------------------------------------
ENV_PREFIX = "AUTOTUNE_"  # what a script's scan looks for (autotune.exports.script_scan)
# what the launcher hands every process of a run (autotune.exports.launch_spec), users' scripts included
PLAN_ENV = "AUTOTUNE_PLAN"  # the plan's file: the one channel from the launcher to the ranks
RUN_DIR_ENV = "AUTOTUNE_RUN_DIR"
CHECKPOINT_DIR_ENV = "AUTOTUNE_CHECKPOINT_DIR"
RESUME_FROM_ENV = "AUTOTUNE_RESUME_FROM"
DEEPSPEED_CONFIG_ENV = "AUTOTUNE_DEEPSPEED_CONFIG"
BACKEND_ENV = "AUTOTUNE_BACKEND"
GLOBAL_BATCH_SIZE_ENV = "AUTOTUNE_GLOBAL_BATCH_SIZE"
# the plan's values a script may read, by the plan's name for each
VALUE_ENV = {"micro_batch_size": "AUTOTUNE_MICRO_BATCH_SIZE",
             "gradient_accumulation_steps": "AUTOTUNE_GRADIENT_ACCUMULATION_STEPS",
             "learning_rate": "AUTOTUNE_LEARNING_RATE", "precision": "AUTOTUNE_PRECISION",
             "num_workers": "AUTOTUNE_NUM_WORKERS"}
STATUS_DIR_ENV = "AUTOTUNE_STATUS_DIR"  # the launcher's private folder for the ranks' statuses
# in that private folder: how each rank's script ended (script/rank-N.json), noted by the rank's own process
# (autotune.runtime.observe_end); nothing that writes into the run directory reaches it
SCRIPT_ENDS = "script"
# this launch's id: on every record the observer writes, so that a launch reads only its own ranks' records
LAUNCH_ID_ENV = "AUTOTUNE_LAUNCH_ID"
OBSERVE_ENV = "AUTOTUNE_OBSERVE"  # "0": no observer in this process; "end": only how its script ended
# this launch's key for the ranks' records (autotune.rundir.record_seal): handed to the ranks' processes only, and
# taken out of the environment by the observer before the script's first line (the script's children never see it)
OBSERVE_KEY_ENV = "AUTOTUNE_OBSERVE_KEY"
# "<pid> <run dir>" of the process that observes a rank: set by it, inherited by every process it starts, which is
# then not the rank's own and is left alone (a nested launch has another run dir and observes its own ranks)
OBSERVED_BY_ENV = "AUTOTUNE_OBSERVED_BY"
# the rank of a one-process launch that gets no RANK (a script that decides on DDP by RANK runs as plain Python)
OBSERVE_RANK_ENV = "AUTOTUNE_OBSERVE_RANK"
# The nodes' shared job secret (autotune.launch.exchange.job_secret): the exchange admits only its holders. An
# export that starts the nodes (sbatch, Kubernetes) puts one per job in this variable, never in a file.
JOB_SECRET_ENV = "AUTOTUNE_JOB_SECRET"
CACHE_DIR_ENV = "AUTOTUNE_CACHE_DIR"  # where cache_dir() is
# the share of its time a measurement may wait for a core, and of the cores other work may hold now, before it is
# judged under load (autotune.rundir.contention; 1 or more: nothing is)
BUSY_LOAD_ENV = "AUTOTUNE_BUSY_LOAD"
INJECT_OOM_ENV = "AUTOTUNE_INJECT_OOM"  # rank:step:max_rows: out of memory on purpose, for the tests


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


def rank_file(rank: int | str) -> str:
    """A rank's file in observed/ and in the status folder."""
    return f"rank-{rank}.json"


def rng_file(rank: int) -> str:
    """A rank's random states in a checkpoint."""
    return f"{RNG_PREFIX}{rank}.pt"


def cache_dir() -> Path:
    """What autotune keeps between runs (traces, probes, step timings, past runs' speeds): $AUTOTUNE_CACHE_DIR,
    else $XDG_CACHE_HOME/autotune/traces, else ~/.cache/autotune/traces."""
    import os

    if os.environ.get(CACHE_DIR_ENV):
        return Path(os.environ[CACHE_DIR_ENV])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "autotune" / "traces"


def cache_file(kind: str, key: str) -> Path:
    """A measurement kept in cache_dir(): ``kind`` "trace" (a model's traced or probed facts) or "steps" (its step
    timed on a CPU), under ``key`` (everything it depends on, hashed)."""
    return cache_dir() / (f"{key}.json" if kind == "trace" else f"{kind}-{key}.json")


def new_run_dir_name() -> str:
    """A run directory's name: when it was made, and 6 random hex digits (two in one second differ)."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)
