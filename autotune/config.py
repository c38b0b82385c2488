"""The training config: a YAML file validated by strict pydantic v2 models.

Unknown keys are rejected; every problem in a file is reported at once with
its dotted field path, what is allowed and what was given. Fields that the
planner can choose accept ``auto``.
"""

from __future__ import annotations

import re
from functools import partial
from pathlib import Path
from typing import Annotated, Any, Literal, Union

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    PlainSerializer,
    PlainValidator,
    ValidationError,
)

from autotune.errors import UserError, validation_problems

AUTO = "auto"
# training.sample_input as a per-sample shape: [16], float[3,32,32], int[512]<50257
SAMPLE_SHAPE_RE = r"^(float|int)?\[(\d+(?:,\d+)*)\](?:<(\d+))?$"


# -- field types that accept "auto" ------------------------------------------------

# One validator per kind of value ("auto" or an integer in bounds, a bool, a choice); each field type below binds
# its own bounds or choices with partial, so a type and its rule read on one line.
def _auto_or_int(v: Any, minimum: int, what: str, maximum: int = 2**24):
    if v is None or v == AUTO:
        return AUTO
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        raise ValueError(f'must be {what} or "auto"')
    if v > maximum:
        raise ValueError(f'must be at most {maximum} (or "auto")')
    return v


def _auto_or_bool(v: Any):
    if v is None or v == AUTO:
        return AUTO
    if isinstance(v, bool):
        return v
    raise ValueError('must be true, false or "auto"')


def _auto_or_choice(v: Any, choices: tuple[str, ...]):
    if v is None or v == AUTO:
        return AUTO
    if v in choices:
        return v
    raise ValueError(f'must be one of {", ".join(repr(c) for c in (AUTO,) + choices)}')


def _zero_stage(v: Any):
    if v is None or v == AUTO:
        return AUTO
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 3:
        raise ValueError('must be 0, 1, 2, 3 or "auto" (DeepSpeed ZeRO stages)')
    return v


_ser = PlainSerializer(lambda v: v)
AutoPosInt = Annotated[Union[int, str], PlainValidator(partial(_auto_or_int, minimum=1, what="a positive integer")),
                       _ser]
AutoNonNegInt = Annotated[Union[int, str], PlainValidator(partial(_auto_or_int, minimum=0, what="an integer >= 0")),
                          _ser]
AutoWorkers = Annotated[Union[int, str], PlainValidator(partial(_auto_or_int, minimum=0, what="an integer >= 0",
                                                                maximum=256)), _ser]
AutoSmallPosInt = Annotated[Union[int, str], PlainValidator(partial(_auto_or_int, minimum=1, what="a positive integer",
                                                                    maximum=65536)), _ser]
AutoBool = Annotated[Union[bool, str], PlainValidator(_auto_or_bool), _ser]
Precision = Annotated[str, PlainValidator(partial(_auto_or_choice, choices=("bf16", "fp16", "fp32"))), _ser]
Backend = Annotated[str, PlainValidator(partial(_auto_or_choice, choices=("single", "ddp", "deepspeed", "fsdp"))), _ser]
ZeroStage = Annotated[Union[int, str], PlainValidator(_zero_stage), _ser]


class _Section(BaseModel):
    # strict: a value is of its type as written (true is no count, '4' no number, 'yes' no boolean); an integer is
    # still a float
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False, strict=True)


class ModelConfig(_Section):
    """The built-in model (a small GPT); your own script's model is described in training.model."""

    name: Literal["gpt"] = "gpt"
    n_layer: int = Field(2, ge=1, le=1024, description="transformer blocks")
    n_head: int = Field(4, ge=1, le=1024, description="attention heads")
    n_embd: int = Field(64, ge=8, le=65536, description="embedding width, divisible by n_head")
    dropout: float = Field(0.0, ge=0.0, lt=1.0)
    # Moved to training.num_parameters (it describes your own script's model); kept to say so, and left out of
    # every dump (`check` prints only keys a config may set).
    num_parameters: int | None = Field(None, ge=1, le=10**15, exclude=True)


class DataConfig(_Section):
    """The built-in generated task: sort a sequence of digits."""

    task: Literal["sort"] = "sort"
    seq_len: int = Field(8, ge=2, le=256, description="digits to sort")
    vocab_size: int = Field(10, ge=2, le=1000, description="distinct digit values")
    num_samples: int | None = Field(16384, ge=1, le=10**12, description="training samples per epoch (None = unknown)")
    num_val_samples: int = Field(1024, ge=0, le=10**8)
    seed: int = Field(1234, ge=0, le=2**32 - 1)
    num_workers: AutoWorkers = AUTO
    max_workers_per_process: int = Field(3, ge=0, le=64)
    # each process's threads (OMP_NUM_THREADS); auto: effective cores / processes. An OMP_NUM_THREADS you export
    # is taken as this value when the plan is for this machine (the ranks run with it).
    omp_num_threads: AutoSmallPosInt = AUTO
    pin_memory: AutoBool = AUTO
    prefetch_factor: AutoSmallPosInt = AUTO


class TrainingConfig(_Section):
    global_batch_size: int = Field(256, ge=1, le=2**24, description="target effective batch per optimizer step")
    base_batch_size: int = Field(256, ge=1, le=2**24, description="batch size the learning_rate was tuned for")
    learning_rate: float = Field(3e-3, gt=0, le=100)
    lr_scaling: Literal["none", "linear", "sqrt"] = "none"
    warmup_steps: int = Field(20, ge=0, le=10**9)
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="cosine decay floor, fraction of peak")
    weight_decay: float = Field(0.01, ge=0.0, le=100)
    gradient_clipping: float | None = Field(1.0, gt=0, le=1e6)
    epochs: int | None = Field(4, ge=1, le=10**6)
    max_steps: int | None = Field(None, ge=1, le=10**9,
                                  description="stop after this many optimizer steps (wins over epochs)")
    batch_size_per_gpu: AutoPosInt = AUTO
    gradient_accumulation_steps: AutoPosInt = AUTO
    mixed_precision: Precision = AUTO
    gradient_checkpointing: AutoBool = AUTO
    seed: int = Field(42, ge=0, le=2**32 - 1)
    eval_every_steps: int = Field(50, ge=1, le=10**9)
    log_every_steps: int = Field(10, ge=1, le=10**9)
    entrypoint: str | None = Field(None, description="user script path or package.module:function")
    # Your own script's model, for the memory estimate (the built-in workload is sized from `model`):
    model: str | None = Field(None, description="package.module:factory returning your torch.nn.Module; built "
                              "under PyTorch's fake-tensor mode (no memory spent) and traced")
    sample_input: str | None = Field(None, description="package.module:function(batch_size) returning one batch "
                                     "for training.model (a tensor, tuple or dict), to measure activations")
    num_parameters: int | None = Field(None, ge=1, le=10**15,
                                       description="your model's parameter count, when it cannot be built")
    optimizer: Literal["adamw", "sgd_momentum", "sgd"] = Field(
        "adamw", description="your script's optimizer, for the memory estimate (the built-in workload uses adamw)")
    script_args: list[str] = Field(default_factory=list, description="arguments for the entrypoint; {placeholders} "
                                   "such as {micro_batch_size} are replaced by the plan's values")
    wire: Literal["none", "auto"] = Field("none", description="auto: fill the script's own argparse flags "
                                          "(--batch_size, --lr, ...) with the plan's values; flags you pass win")
    observe: bool = Field(True, description="record what your script really runs (batch sizes, engine, optimizer, "
                          "precision, samples per step) in <run_dir>/observed/ and judge the plan's delivery by it "
                          "(--no_observe: off)")
    strict: bool = Field(False, description="stop the launch when the script observably trains another effective "
                         "batch (> 10 % off) or engine than the plan (--strict); otherwise a warning")
    probe: bool = Field(True, description="measure on this machine before planning: on a CUDA machine launch runs "
                        "training.model on GPU 0 (real steps at two micro-batches: memory and step times); without a "
                        "GPU, plan and launch time the model's step on this CPU as the ranks will run it (once, "
                        "cached) (--no_probe: the trace and the model's time only)")
    workdir: str | None = Field(None, max_length=4096, description="the directory your script starts in "
                                "(default: where you launch); the script's path and the run directory stay "
                                "relative to where you launch")


class DistributedConfig(_Section):
    backend: Backend = AUTO
    zero_stage: ZeroStage = AUTO
    offload_optimizer: AutoBool = AUTO
    num_gpus: AutoWorkers = AUTO
    nproc_per_node: AutoSmallPosInt = AUTO
    num_nodes: AutoSmallPosInt = AUTO
    node_rank: AutoNonNegInt = AUTO  # auto: SLURM_NODEID under SLURM, else 0
    master_addr: str = Field(AUTO, min_length=1, description="auto: the first host of the SLURM allocation, "
                             "else 127.0.0.1 on one node")
    master_port: int = Field(29500, ge=1, le=65535)
    timeout_s: int = Field(1800, ge=10, le=7 * 24 * 3600, description="process-group (NCCL/gloo) timeout")
    rendezvous_timeout_s: int = Field(600, ge=5, le=24 * 3600, description="how long the nodes of a multi-node "
                                      "job wait for each other before giving up (exit 69, retryable; torchrun's own "
                                      "default)")
    setup_timeout_s: int = Field(1200, ge=1, le=7 * 24 * 3600, description="per rank: joining, building, "
                                 "loading a checkpoint (DeepSpeed may compile ops first)")
    step_timeout_s: int = Field(600, ge=1, le=7 * 24 * 3600, description="per rank: one optimizer step (or one "
                                "evaluation); longer means a peer is hung: the job ends, naming the rank")
    checkpoint_timeout_s: int = Field(1200, ge=1, le=7 * 24 * 3600, description="per rank: writing one checkpoint")
    exit_barrier_s: int = Field(30, ge=1, le=24 * 3600, description="several nodes: once every rank of this node "
                                "has finished, how long its launcher waits for the other nodes' agents before "
                                "stopping torchrun's exit barrier (torchrun's own wait: 5 minutes)")
    max_restarts: int = Field(0, ge=0, le=100, description="torchrun restarts the ranks this many times after a "
                              "failure; they continue from the newest good checkpoint")


class LoggingConfig(_Section):
    tensorboard: bool = True
    wandb: bool = False
    wandb_project: str = "autotune"
    wandb_entity: str | None = None
    progress_bar: AutoBool = AUTO


class CheckpointConfig(_Section):
    save_every_steps: int | None = Field(100, ge=1, le=10**9)
    keep_last: int = Field(3, ge=1, le=10**6)
    save_at_end: bool = True
    full_weights: Literal["last", "every"] = Field("last", description="FSDP2: the whole fp32 weights (model.pt, "
                                                  "gathered on rank 0) at the save after the last step only, or at "
                                                  "every save; the sharded state (fsdp/) is in every checkpoint")
    preemption_grace_s: int = Field(60, ge=5, le=3600, description="on SIGTERM/SIGUSR1/SIGINT: how long the ranks "
                                    "may take to finish the step and save a checkpoint before they are stopped")


class TrainConfig(_Section):
    model: ModelConfig = ModelConfig()
    data: DataConfig = DataConfig()
    training: TrainingConfig = TrainingConfig()
    distributed: DistributedConfig = DistributedConfig()
    logging: LoggingConfig = LoggingConfig()
    checkpoint: CheckpointConfig = CheckpointConfig()


def _cross_checks(cfg: TrainConfig) -> list[str]:
    problems = []
    if cfg.model.n_embd % cfg.model.n_head:
        problems.append(
            f"model.n_embd: must be divisible by model.n_head ({cfg.model.n_head}), got {cfg.model.n_embd}"
        )
    t = cfg.training
    if cfg.model.num_parameters is not None:
        problems.append("model.num_parameters: moved to training.num_parameters (it describes your own script's "
                        "model; the built-in GPT's size follows from n_layer and n_embd)")
    for name in ("model", "sample_input"):
        value = getattr(t, name)
        shape = re.match(SAMPLE_SHAPE_RE, value.replace(" ", "")) if name == "sample_input" and value else None
        if shape and min(int(v) for v in [*shape.group(2).split(","), shape.group(3) or 1]) < 1:  # [0]: no batch
            problems.append(f"training.sample_input: every dimension of a per-sample shape, and the bound after <, "
                            f"is 1 or more, got {value!r} (e.g. [16] or int[512]<50257)")
        if value is None or shape:
            continue
        if value.count(":") != 1 or not all(value.split(":")):
            shape = " or a per-sample shape such as [3,224,224] or int[512]<50257" if name == "sample_input" else ""
            problems.append(f"training.{name}: must look like package.module:function{shape}, got {value!r}")
    if t.entrypoint is None:
        for name in ("model", "sample_input", "num_parameters"):
            if getattr(t, name) is not None:
                problems.append(f"training.{name}: describes your own script's model, but training.entrypoint is "
                                "empty (the built-in workload is sized from the model section); set an entrypoint "
                                "or remove it")
        if t.optimizer != "adamw":
            problems.append(f"training.optimizer: the built-in workload trains with adamw, got {t.optimizer!r}")
    if t.sample_input is not None and t.model is None:
        problems.append("training.sample_input: needs training.model (the factory of the model it feeds)")
    if cfg.training.epochs is None and cfg.training.max_steps is None:
        problems.append("training.epochs: set training.epochs or training.max_steps (both are empty)")
    return problems + _meaning_problems(cfg)


def _meaning_problems(cfg: TrainConfig) -> list[str]:
    """Values of the right type that still mean nothing: an entrypoint that is neither a script path nor
    package.module:function, a path the system cannot hold, a master address that is no host, a NUL byte anywhere
    (no process argument, variable or path can carry one)."""
    from autotune.safe_input import (
        MAX_ARG_BYTES,
        MODULE_FUNCTION,
        control_character,
        host_problem,
        path_problem,
        wandb_name_problem,
    )

    t, out = cfg.training, []
    entry = t.entrypoint
    if entry is not None and entry.endswith(".py") and path_problem(entry):
        out.append(f"training.entrypoint: the script's path {path_problem(entry)}; give the path of your script")
    elif entry is not None and not entry.endswith(".py") and not MODULE_FUNCTION.fullmatch(entry):
        shown = f"{entry[:80]!r}{'...' if len(entry) > 80 else ''}"
        out.append(f"training.entrypoint: must be a script path ending in .py (train.py) or package.module:function "
                   f"(my_pkg.train:main), got {shown}; remove the key to train the built-in workload")
    if t.workdir is not None and path_problem(t.workdir):
        out.append(f"training.workdir: {path_problem(t.workdir)}; give the directory your script starts in, or "
                   "remove the key (it then starts where you launch)")
    for i, arg in enumerate(t.script_args):  # never shown: an argument may be a secret
        if "\0" in arg:
            out.append(f"training.script_args[{i}]: holds a NUL byte, which no process argument can; remove it")
        elif len(arg.encode("utf-8", "surrogatepass")) > MAX_ARG_BYTES:
            out.append(f"training.script_args[{i}]: longer than a process argument may be ({MAX_ARG_BYTES} bytes); "
                       "pass a file's path instead")
    addr = cfg.distributed.master_addr
    if addr != AUTO and host_problem(addr):
        out.append(f"distributed.master_addr: {addr[:80]!r} {host_problem(addr)}; give node 0's host name or IP "
                   "address (--master_addr), or auto")
    for field, value in (("logging.wandb_project", cfg.logging.wandb_project),
                         ("logging.wandb_entity", cfg.logging.wandb_entity)):
        why = wandb_name_problem(value, entity=field.endswith("entity")) if value is not None else None
        if why:
            out.append(f"{field}: {why}")
    named = {p.split(":", 1)[0] for p in out}  # one problem a field
    for section, values in config_to_dict(cfg).items():
        for key, value in values.items():
            if not isinstance(value, str) or f"{section}.{key}" in named:
                continue
            if "\0" in value:
                out.append(f"{section}.{key}: holds a NUL byte; text only")
            elif control_character(value) is not None:
                out.append(f"{section}.{key}: holds the control character {control_character(value)!r} (a newline, "
                           "a terminal escape or a bidi control), which would act on the terminal it is printed "
                           "to; text only")
    return out


def _keys_at(section: str) -> list[str]:
    """The keys a config may set at ``section`` ('' for the top level, 'training', ...): what an unknown key
    is compared with."""
    model = TrainConfig if not section else TrainConfig.model_fields[section].annotation \
        if section in TrainConfig.model_fields else None
    return [k for k, f in model.model_fields.items() if not f.exclude] if model is not None else []


def yaml_meanings(data: Any, where: str = "") -> list[str]:
    """Values YAML 1.1 made of what the user wrote, not what they meant: base-60 and octal numbers
    (``learning_rate: 1:20`` is 80 to YAML, ``epochs: 010`` is 8), each named by its dotted field with what YAML
    made of it."""
    from autotune.safe_input import Yaml11Float, Yaml11Int

    if isinstance(data, dict):
        return [p for k, v in data.items() for p in yaml_meanings(v, f"{where}.{k}" if where else str(k))]
    if isinstance(data, list):
        return [p for i, v in enumerate(data) for p in yaml_meanings(v, f"{where}[{i}]")]
    if isinstance(data, (Yaml11Int, Yaml11Float)):
        meant = float(data) if isinstance(data, float) else int(data)
        return [f"{where}: {data.written} is read by YAML 1.1 as {data.reading}, {meant}; write the number you mean "
                f"({meant} if that is it), or quote it ('{data.written}') for text"]
    return []


def parse_config(data: Any, origin: str = "<config>") -> TrainConfig:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise UserError(f"{origin}: the top level must be a mapping of sections (model, data, training, ...), "
                        f"got {type(data).__name__}")
    problems = yaml_meanings(data)
    try:
        cfg = TrainConfig.model_validate(data)
    except ValidationError as e:
        named = {p.split(":", 1)[0] for p in problems}
        problems += [p.replace("Value error, ", "") for p in validation_problems(e, siblings=_keys_at)
                     if p.split(":", 1)[0] not in named]
        raise UserError(f"{origin}: {len(problems)} problem(s) in the config", problems) from None
    if problems:
        raise UserError(f"{origin}: {len(problems)} problem(s) in the config", problems)
    problems = _cross_checks(cfg)
    if problems:
        raise UserError(f"{origin}: {len(problems)} problem(s) in the config", problems)
    return cfg


def load_config(path: str | Path) -> TrainConfig:
    """Read and validate a YAML config; every problem is listed in one UserError."""
    from autotune.safe_input import load_yaml, read_text

    p = Path(path)
    if not p.exists():
        raise UserError(f"--config: no such file {str(p)!r} (the shipped example is configs/default_config.yaml)")
    data = load_yaml(read_text(p, "--config"), str(p))
    if data is None or data == {}:
        import sys

        print(f"warning: --config {p} holds no settings (it is empty or only comments): every default applies, "
              "which trains the built-in workload; check the file's path and contents", file=sys.stderr, flush=True)
    return parse_config(data, origin=str(p))


def config_to_dict(cfg: TrainConfig) -> dict:
    return cfg.model_dump(mode="json")


def apply_overrides(cfg: TrainConfig, updates: dict[str, Any]) -> TrainConfig:
    """Return a copy with dotted-path updates applied and re-validated. Only what was set (in the file, or
    by an earlier override) is carried, so a value left to its default still reads as not set."""
    data = cfg.model_dump(mode="json", exclude_unset=True)
    for dotted, value in updates.items():
        section, key = dotted.split(".")
        data.setdefault(section, {})[key] = value
    return parse_config(data, origin="command line")
