"""The training plan: the one contract between the planner, the builders and the ranks.

``TrainingPlan`` is what ``plan(hw, cfg)`` returns, what the launcher writes to
``<run_dir>/plan.json``, what every rank reads back (``load_plan``, with the model's own
JSON validation) and what users' scripts read (``autotune.current_plan()``). It is made
of typed, frozen sections; nothing in it is a free-form dict of config values.

Read it as ``plan.<section>.<field>``: ``engine``, ``batch``, ``numerics``, ``memory``, ``loader``,
``schedule``, ``optimizer``, ``run``, ``workload``, then ``reasons``, ``overrides``, ``warnings`` and
``hardware``. ``public_dict(plan)`` is the flat view printed by ``plan --json`` (a stable interface: tests
compare it with recorded outputs for every preset). Every field and key, with its type, default and meaning, is
in docs/plan-fields.md, generated from the models below and their comments by tools/plan_fields.py (a unit
test fails when the two disagree): a field's comment here is its documentation.
"""

from __future__ import annotations

import json
import os
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from autotune.errors import UserError, format_validation_error

Backend = Literal["single", "ddp", "deepspeed", "fsdp"]
# The plan's precision in Accelerate's words (its mixed_precision argument, variable and config key)
ACCELERATE_MIXED_PRECISION = {"bf16": "bf16", "fp16": "fp16", "fp32": "no"}
DTYPE_WORDS = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}  # torch's dtype names
Precision = Literal["bf16", "fp16", "fp32"]
Device = Literal["cuda", "cpu"]

# Every knob a reason or an override can be about: the flat plan keys, plus the GPU count.
Knob = Literal[
    "backend", "zero_stage", "num_nodes", "num_gpus", "node_rank", "master_addr", "nproc_per_node", "world_size",
    "micro_batch_size", "gradient_accumulation_steps", "global_batch_size",
    "precision", "tf32", "gradient_checkpointing", "offload_optimizer", "offload_param", "strategy",
    "reshard_after_forward", "dp_replicate",
    "num_workers", "pin_memory", "prefetch_factor", "omp_num_threads",
    "learning_rate", "warmup_steps", "steps_per_epoch", "total_steps",
    "gradient_clipping", "optimizer",  # what the DeepSpeed JSON applies (exports.deepspeed.deepspeed_reasons)
]


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class EngineSection(_Section):
    """Which engine runs, on how many processes and nodes, and how long each wait may last."""

    backend: Backend  # the one dispatch: one process, or DDP, FSDP2 or DeepSpeed through torchrun
    zero_stage: int | None = Field(None, ge=0, le=3)  # DeepSpeed's zero_optimization.stage; null without DeepSpeed
    device: Device  # where the ranks compute
    num_nodes: int = Field(1, ge=1)
    node_rank: int = Field(0, ge=0)  # this node's rank, 0 .. num_nodes - 1
    master_addr: str = "127.0.0.1"  # the rank-0 node, where the nodes meet
    master_port: int = Field(29500, ge=1, le=65535)  # node 0's port: the nodes' meeting, then torchrun's store
    rdzv_id: str | None = None  # the SLURM job id: torchrun's c10d rendezvous (same command on every node)
    nproc_per_node: int = Field(ge=1)  # processes on each node: one per GPU, or the CPU processes asked for
    world_size: int = Field(ge=1)  # nproc_per_node x num_nodes
    num_gpus: int = Field(0, ge=0)  # GPUs used on each node; 0 on CPU
    offload_optimizer: bool = False  # DeepSpeed keeps the optimizer state in host RAM (FSDP2: CPUOffloadPolicy)
    offload_param: bool = False  # ZeRO-3 parameter offload to host RAM (FSDP2: CPUOffloadPolicy, with the optimizer)
    # FSDP2 (backend fsdp): free each unit's gathered weights after its forward (all-gather again for the backward)
    reshard_after_forward: bool = True
    fsdp_unit: str | None = None  # FSDP2: the module class each fully_shard unit is (None: not FSDP2, or unknown)
    # FSDP2: copies of the sharded model (torchtitan's dp_replicate); above 1, HSDP: a 2-D mesh (dp_replicate,
    # dp_shard) that shards inside each node and replicates across the nodes; 1: one shard group of every rank
    dp_replicate: int = Field(1, ge=1)
    timeout_s: int = Field(1800, ge=1)  # the process group's (NCCL / gloo) timeout
    rendezvous_timeout_s: int = Field(600, ge=1)  # nodes waiting for each other (multi-node): torchrun's own default
    max_restarts: int = Field(0, ge=0)  # torchrun restarts of the group; ranks resume from the newest good checkpoint
    # per-phase hang budgets, watched in every rank: a rank past one ends the job, named
    setup_timeout_s: int = Field(1200, ge=1)  # joining the group, building the engine, the first step
    step_timeout_s: int = Field(600, ge=1)  # one optimizer step
    exit_barrier_s: int = Field(30, ge=1)  # a finished node waits this long for the others' agents
    checkpoint_timeout_s: int = Field(1200, ge=1)  # writing one checkpoint


class BatchSection(_Section):
    """The batch: what one process takes per forward, and what one optimizer step sees."""

    micro_batch_size: int = Field(ge=1)  # samples per process per forward and backward
    gradient_accumulation_steps: int = Field(ge=1)  # micro-batches per optimizer step
    global_batch_size: int = Field(ge=1)  # micro x accumulation x world_size: what really runs
    target_global_batch_size: int = Field(ge=1)  # what the config asked for (training.global_batch_size)
    global_batch_deviation: int  # global_batch_size - target_global_batch_size


class NumericsSection(_Section):
    """The number formats of the step."""

    precision: Precision  # bf16 or fp16 autocast (fp16 with loss scaling), or fp32
    tf32: bool = False  # TensorFloat-32 matmuls (compute capability >= 8.0)


class MemoryEstimate(_Section):
    """Per GPU (per process on CPU): model states + activations + overhead against the budget."""

    strategy: str = ""  # e.g. "ZeRO-2", "DDP"
    model_source: str = ""  # where the model facts come from
    num_parameters: int | None
    model_states_gib: float | None  # weights, gradients and optimizer state as the engine holds them at the peak
    activations_gib: float | None  # traced (or probed) at the planned micro-batch
    overhead_gib: float = 0.0  # DeepSpeed's communication buckets as configured; 0 for other engines and on CPU
    total_gib: float | None  # the allocated peak: states + activations + overhead
    # FSDP2 with a model built whole before sharding (your script's; the built-in workload builds on the meta device):
    # the set-up's peak, its fp32 weights whole beside the shards being made; the plan fits the larger of the two
    init_gib: float | None = None
    # usable for the estimate: free memory less what the allocator never counts (CUDA context, NCCL) and its own
    # share above the estimate (allocator_gib)
    budget_gib: float | None
    allocator_gib: float | None = None  # the caching allocator above the estimate: its slack, the largest block
    host_gib_per_node: float | None = None  # offloaded state in host RAM, with the policy's margin
    unknown: str | None = None  # what the estimate cannot know, and why


class MemorySection(_Section):
    """What the plan holds in memory, and the estimate that says it fits."""

    gradient_checkpointing: bool = False  # activations recomputed in backward instead of kept
    gpu_memory_gib: float | None = None  # per-GPU memory the plan was sized for
    estimate: MemoryEstimate | None = None
    # DeepSpeed's reduce/allgather/prefetch bucket in elements, sized by the planner for this GPU memory
    # (the estimate counts these buffers; the DeepSpeed JSON writes the same number)
    bucket_elements: int = Field(50_000_000, ge=1)


class LoaderSection(_Section):
    """The DataLoader of each process, and its CPU threads."""

    num_workers: int = Field(0, ge=0)  # DataLoader workers per process
    pin_memory: bool = False  # page-locked batches, copied to the GPU without a staging copy
    prefetch_factor: int | None = Field(None, ge=1)  # batches each worker loads ahead; null without workers
    omp_num_threads: int = Field(1, ge=1)  # OMP_NUM_THREADS of each process (an exported one, up to the cores)


class TimeEstimate(_Section):
    """How long the run takes, predicted (``autotune.planner.step_time``); a null figure has its reason in
    ``unknown`` (field -> why), never a guess."""

    micro_step_s: float | None = None  # forward + backward of one micro-batch
    optimizer_step_s: float | None = None  # the optimizer step (CPU Adam under offload)
    communication_s: float | None = None  # collectives and PCIe per optimizer step, not hidden behind backward
    step_s: float | None = None  # one optimizer step, accumulation and communication included
    samples_per_s: float | None = None  # global batch / step_s, the whole job's
    tokens_per_s: float | None = None  # samples_per_s x the sequence length, for a model that has one
    total_s: float | None = None  # the configured steps (or epochs)
    speedup_vs_1_gpu: float | None = None  # samples_per_s against the same model on one of these GPUs
    basis: str = ""  # where the figures come from: the model's work, the GPU table's row, the links
    speedup_basis: str | None = None  # what the one-GPU figure assumed
    unknown: dict[str, str] = {}  # field -> why it is null


class ScheduleSection(_Section):
    """How long the run is and how its learning rate moves: linear warm-up, then cosine decay."""

    learning_rate: float = Field(gt=0)  # the peak, after training.lr_scaling
    warmup_steps: int = Field(0, ge=0)  # optimizer steps of linear warm-up from 0 to learning_rate
    min_lr_ratio: float = Field(0.1, ge=0, le=1)  # the cosine ends at learning_rate x this
    epochs: int | None = None  # passes over the data; max_steps wins when set
    max_steps: int | None = None  # optimizer steps; wins over epochs when set
    steps_per_epoch: int | None = None  # optimizer steps; null when the data's size is not known
    # optimizer steps of the whole run; null when neither max_steps nor the data's size is known
    total_steps: int | None = None
    time_estimate: TimeEstimate | None = None


class OptimizerSection(_Section):
    """AdamW's settings: the DeepSpeed JSON and ``torch.optim`` both take them from here."""

    name: Literal["adamw"] = "adamw"
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    weight_decay: float = Field(0.01, ge=0)
    gradient_clipping: float | None = Field(1.0, gt=0)  # max global gradient norm; null: no clipping


class RunSection(_Section):
    """The run around the steps: seed, intervals, checkpoints, logging sinks and the script that trains."""

    seed: int = 42
    eval_every_steps: int = Field(50, ge=1)  # the built-in workload's validation interval, in optimizer steps
    log_every_steps: int = Field(10, ge=1)  # one log line (and metrics record) per this many optimizer steps
    save_every_steps: int | None = Field(100, ge=1)  # null: no checkpoint on an interval
    keep_last: int = Field(3, ge=1)  # checkpoints kept; older ones are deleted
    save_at_end: bool = True  # a checkpoint after the last step
    # FSDP2: the whole weights (model.pt, gathered on rank 0) at the save after the last step only ("last"), or at
    # every save ("every"); its periodic and preemption saves hold the shards (fsdp/), which any resume reads
    full_weights: Literal["last", "every"] = "last"
    preemption_grace_s: int = 60  # after a stop signal: how long the ranks have to finish the step and save
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "autotune"
    wandb_entity: str | None = None
    progress_bar: bool | Literal["auto"] = "auto"  # auto: on a terminal only
    entrypoint: str | None = None  # your script (a path, or package.module:function); null: the built-in workload
    # plan values that are only the built-in workload's defaults, for a user's script that did not set them: they
    # never reach the script (its own defaults stay) and are not judged against what it runs
    script_defaults: tuple[str, ...] = ()
    observe: bool = True  # a user's script is observed (autotune.runtime.observe) and delivery judged by it
    strict: bool = False  # a script observed training another effective batch or engine is stopped
    script_args: tuple[str, ...] = ()  # the config's training.script_args, placeholders not yet expanded
    resume_from: str | None = None  # resolved once by the launcher: a checkpoint directory, or null
    auto_optimize: bool = True  # false: --no_auto_optimize, the config taken verbatim
    debug: bool = False  # --debug: a tiny, fast run


class BuiltinModel(_Section):
    """The built-in GPT (``autotune.runtime.workload``)."""

    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    dropout: float = 0.0


class BuiltinData(_Section):
    """The built-in task: sorting digits, generated from ``seed``."""

    seq_len: int = 8
    vocab_size: int = 10
    num_samples: int | None = 16384  # training samples per epoch; your script's data size when it says so
    num_val_samples: int = 1024
    seed: int = 1234


class WorkloadSection(_Section):
    """The built-in model and data; a script of your own reads only ``data.num_samples``."""

    model: BuiltinModel = BuiltinModel()
    data: BuiltinData = BuiltinData()


class Override(_Section):
    """A value you set: what the planner would have chosen, and what you chose."""

    auto: Any
    chosen: Any


class TrainingPlan(_Section):
    engine: EngineSection
    batch: BatchSection
    numerics: NumericsSection
    memory: MemorySection
    loader: LoaderSection
    schedule: ScheduleSection
    optimizer: OptimizerSection
    run: RunSection
    workload: WorkloadSection
    reasons: dict[Knob, str] = {}  # knob -> one sentence saying why it has its value
    overrides: dict[Knob, Override] = {}  # knob -> {auto, chosen} for every value you set
    warnings: tuple[str, ...] = ()  # what to watch: a global batch off its target, a node that differs, ...
    hardware: str = ""  # one-line summary of the profile planned for

    @property
    def is_deepspeed(self) -> bool:
        return self.engine.backend == "deepspeed"

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)


def training_values(plan: TrainingPlan) -> dict:
    """What the ranks train with: every plan value a run's trajectory depends on. The one list of them:
    the ranks of a job must agree on these (runtime.dist), a resume names those that changed since its
    checkpoint (rundir.checkpoints), and a re-plan for the smallest node that changes none of them keeps
    this node's plan (launch)."""
    e, b, s, o = plan.engine, plan.batch, plan.schedule, plan.optimizer
    return {"backend": e.backend, "zero_stage": e.zero_stage, "offload_optimizer": e.offload_optimizer,
            "offload_param": e.offload_param, "nproc_per_node": e.nproc_per_node, "world_size": e.world_size,
            "micro_batch_size": b.micro_batch_size, "gradient_accumulation_steps": b.gradient_accumulation_steps,
            "global_batch_size": b.global_batch_size, "precision": plan.numerics.precision,
            "gradient_checkpointing": plan.memory.gradient_checkpointing, "num_workers": plan.loader.num_workers,
            "learning_rate": s.learning_rate, "warmup_steps": s.warmup_steps, "min_lr_ratio": s.min_lr_ratio,
            "total_steps": s.total_steps, "betas": list(o.betas), "eps": o.eps, "weight_decay": o.weight_decay,
            "gradient_clipping": o.gradient_clipping, "seed": plan.run.seed,
            "dp_replicate": e.dp_replicate}  # FSDP2's mesh: ranks of a job that disagree would wait on each other


# (flat key, section, attribute) in the order `plan --json` prints them.
PUBLIC_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("backend", "engine", "backend"), ("zero_stage", "engine", "zero_stage"), ("device", "engine", "device"),
    ("num_nodes", "engine", "num_nodes"), ("node_rank", "engine", "node_rank"),
    ("master_addr", "engine", "master_addr"), ("nproc_per_node", "engine", "nproc_per_node"),
    ("world_size", "engine", "world_size"),
    ("micro_batch_size", "batch", "micro_batch_size"),
    ("gradient_accumulation_steps", "batch", "gradient_accumulation_steps"),
    ("global_batch_size", "batch", "global_batch_size"),
    ("target_global_batch_size", "batch", "target_global_batch_size"),
    ("global_batch_deviation", "batch", "global_batch_deviation"),
    ("precision", "numerics", "precision"), ("tf32", "numerics", "tf32"),
    ("gradient_checkpointing", "memory", "gradient_checkpointing"),
    ("offload_optimizer", "engine", "offload_optimizer"), ("offload_param", "engine", "offload_param"),
    ("num_workers", "loader", "num_workers"), ("pin_memory", "loader", "pin_memory"),
    ("prefetch_factor", "loader", "prefetch_factor"), ("omp_num_threads", "loader", "omp_num_threads"),
    ("learning_rate", "schedule", "learning_rate"), ("warmup_steps", "schedule", "warmup_steps"),
    ("steps_per_epoch", "schedule", "steps_per_epoch"), ("total_steps", "schedule", "total_steps"),
    ("gpu_memory_gib", "memory", "gpu_memory_gib"), ("memory_estimate", "memory", "estimate"),
    ("time_estimate", "schedule", "time_estimate"),
    ("auto_optimize", "run", "auto_optimize"), ("debug", "run", "debug"),
)


def public_dict(plan: TrainingPlan) -> dict:
    """The flat plan of ``plan --json``: every value, then reasons, overrides, warnings, hardware."""
    data = json.loads(plan.model_dump_json())
    out = {flat: data[section][attr] for flat, section, attr in PUBLIC_FIELDS}
    out.update(reasons=data["reasons"], overrides=data["overrides"], warnings=data["warnings"],
               hardware=data["hardware"])
    return out


# plan.json's flat view of the main values beside its sections (rundir.records.plan_file_text), dropped on reading
FLAT_VIEW = ("micro_batch_size", "gradient_accumulation_steps", "global_batch_size", "learning_rate", "precision",
             "num_workers", "world_size", "max_steps", "epochs", "warmup_steps")


def size_text(gib: float) -> str:
    """A size as every plan line says it (one unit rule): GiB from 0.1 GiB up, MiB below (never 0.01 GiB beside
    10.6 MiB)."""
    return f"{gib:.2f} GiB" if gib >= 0.1 else f"{gib * 1024:.1f} MiB"


def load_plan(path: str | os.PathLike) -> TrainingPlan:
    """Read plan.json at ``path`` in bounded time and memory; a missing, oversized or broken file is a UserError.
    (``autotune.rundir.records.load_plan`` finds the path in the launcher's environment.)"""
    from autotune.safe_input import read_text

    if not path:
        raise UserError("no plan: pass --plan PATH, or launch with `python -m autotune launch`")
    text = read_text(path, "--plan")
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and "batch" in data:  # plan.json's flat view (plan_file_text) is not the model's
        text = json.dumps({k: v for k, v in data.items() if k not in FLAT_VIEW or k in TrainingPlan.model_fields})
    try:
        return TrainingPlan.model_validate_json(text)
    except ValidationError as e:
        raise UserError(format_validation_error(e, f"--plan: {path} is not a plan written by this autotune",
                                                keys_in="the plan.json a launch writes")) from None
