"""Launching is data first: ``launch_spec(plan, ...) -> LaunchSpec(cmd, env)`` is pure (the one place
that spawns is ``autotune.launch.process.execute``).

Backends map to launchers in one table (``LAUNCHERS`` below):
- ``single``    -> ``python -m autotune.train`` (or the user's script) in one process;
- ``ddp``       -> ``torchrun`` (as ``python -m torch.distributed.run``, so the same interpreter);
- ``fsdp``      -> ``torchrun``, one process per GPU (FSDP2 needs a process group, one process too);
- ``deepspeed`` -> ``torchrun`` as well. DeepSpeed's engine reads torchrun's RANK/LOCAL_RANK/
  WORLD_SIZE through ``deepspeed.init_distributed``; one launcher for both engines means the
  same flags, the same multi-node rendezvous and the same signal handling, and no dependency
  on the ``deepspeed`` launcher's pdsh/ssh hostfile machinery for single-node runs.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan
from autotune.rundir.installation import installation_key
from autotune.rundir.layout import (
    BACKEND_ENV,
    CHECKPOINT_DIR_ENV,
    DEEPSPEED_CONFIG_ENV,
    ENGINE_FLAVOUR_FILE,
    FRAMEWORK_FLAVOUR_FILE,
    GLOBAL_BATCH_SIZE_ENV,
    OBSERVE_ENV,
    OBSERVE_RANK_ENV,
    PLAN,
    PLAN_ENV,
    RESUME_FROM_ENV,
    RUN_DIR_ENV,
    VALUE_ENV,
    checkpoint_dir,
    records_dir,
)
from autotune.rundir.records import redact, redact_args
from autotune.safe_input import shell_word

# autotune.runtime.observe's sitecustomize (a path, not an import: exports do not import the runtime)
OBSERVE_SITE = Path(__file__).resolve().parents[1] / "runtime" / "observe_site"


# what a variable the launch fills just before it spawns says until then (``LaunchSpec.at_launch``)
FREE_PORT = "<a free port, chosen at launch>"


@dataclass(frozen=True)
class LaunchSpec:
    cmd: list[str]
    env: dict[str, str]  # the variables autotune sets (final values; the user's exported ones win)
    env_sources: dict[str, str] = field(default_factory=dict)  # name -> "autotune" | "user"
    cwd: str | None = None
    # variables that hold FREE_PORT here and a free port once the launch takes one, just before it spawns
    # (autotune.launch.process.with_free_ports): a one-process run's MASTER_PORT, as torchrun --standalone takes
    # one, so that two launches on one machine never meet at 29500. Building the spec probes nothing.
    at_launch: tuple[str, ...] = ()

    def to_record(self) -> dict:
        """What command.json holds: argv and the variables set, never a secret (a script argument whose name says
        it is one, such as --hub_token, is shown as <redacted>; the script still receives it). A spec not yet
        launched (--dry-run) names the variables the launch fills (``at_launch``)."""
        out = {
            "argv": redact_args(self.cmd),
            "env": redact(self.env),
            "env_sources": {k: v for k, v in self.env_sources.items() if k in self.env},
            "cwd": self.cwd,
        }
        if self.at_launch:
            out["at_launch"] = list(self.at_launch)
        return out

    def shell(self) -> str:
        """The command as a printed shell line: secrets redacted, every word quoted, control characters escaped
        (``$'...'``: a script argument holding ESC or a newline is shown, never acted on by the terminal)."""
        env = " ".join(f"{k}={shell_word(v)}" for k, v in sorted(redact(self.env).items()))
        line = f"{env} {' '.join(shell_word(a) for a in redact_args(self.cmd))}".strip()
        return f"cd {shell_word(self.cwd)} && {line}" if self.cwd else line


def default_cache_dir(environ: Mapping[str, str]) -> str:
    base = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "/tmp")) / ".cache")
    return str(Path(base) / "autotune")


def plan_env(plan: TrainingPlan, run_dir: str, environ: Mapping[str, str],
             has_infiniband: bool | None) -> tuple[dict[str, str], dict[str, str]]:
    """The environment the plan asks for; a value the user exported wins and is recorded as theirs."""
    want: dict[str, str] = {
        "OMP_NUM_THREADS": str(plan.loader.omp_num_threads),
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        # Elastic restarts are flaky with the shared rendezvous TCP store (PyTorch issue 135712).
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "1",
        # keyed by the installation (interpreter prefix, torch build, DeepSpeed version): two virtualenvs or
        # checkouts never rebuild, nor load, each other's ops
        "TORCH_EXTENSIONS_DIR": str(Path(default_cache_dir(environ)) / "torch_extensions" / installation_key()),
        "PYTHONUNBUFFERED": "1",
    }
    if plan.engine.backend != "single":
        # torchrun gives its ranks this long after SIGTERM before SIGKILL (their grace, plus slack),
        # and treats SIGUSR1 (SLURM's --signal) like SIGTERM instead of dying of it.
        want["TORCH_ELASTIC_SHUTDOWN_TIMEOUT"] = str(plan.run.preemption_grace_s + 5)
        want["PET_SIGNALS_TO_HANDLE"] = "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    if not has_infiniband:
        want["NCCL_IB_DISABLE"] = "1"
    if plan.engine.device == "cuda":
        want.update(allocator_env(environ))
    else:
        want["DS_ACCELERATOR"] = "cpu"
    if plan.run.wandb:  # W&B's own variables, so a script's plain wandb.init() logs where the plan says
        want["WANDB_PROJECT"] = plan.run.wandb_project
        if plan.run.wandb_entity:
            want["WANDB_ENTITY"] = plan.run.wandb_entity
        want["WANDB_DIR"] = str(records_dir(plan, run_dir))  # wandb writes its wandb/ folder inside
        if not environ.get("WANDB_API_KEY"):
            want["WANDB_MODE"] = "offline"
    want.update(accelerate_env(plan))
    # OMP_NUM_THREADS is always the plan's, which it says and timed: an exported value the plan took (this machine,
    # the config's `auto`) is the same value, and yours; threads the config sets win over it, and so do the plan's
    # own where the exported value is above the machine's cores (prepare.planning.threads_above_cores)
    env, sources = {}, {}
    for k, v in want.items():
        if k == "OMP_NUM_THREADS":
            env[k], sources[k] = v, "user" if environ.get(k) == v else "autotune"
        elif k in environ:
            env[k], sources[k] = environ[k], "user"
        else:
            env[k], sources[k] = v, "autotune"
    if plan.run.entrypoint:  # the observer starts in every process of the user's script (--no_observe: only the
        # note of how its script ended, for the launch's exit code: nothing of what it trains)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(OBSERVE_SITE), environ.get("PYTHONPATH")]))
        sources["PYTHONPATH"] = "autotune"
        env[OBSERVE_ENV], sources[OBSERVE_ENV] = ("1" if plan.run.observe else "end"), "autotune"
    # This launch's facts: always ours, never inherited from an outer run.
    for k, v in {**plan_values_env(plan, run_dir), **single_process_rank_env(plan)}.items():
        env[k], sources[k] = v, "autotune"
    # torchrun takes PET_<FLAG> as the default of each flag it is not given: a training operator's
    # PET_NNODES=2 would turn a one-node --standalone run (--num_nodes 1 in a pod) into a wait for a node
    # that never comes. Those the environment has get the plan's values.
    eng = plan.engine
    for k, v in {"PET_NNODES": eng.num_nodes, "PET_NODE_RANK": eng.node_rank, "PET_MASTER_ADDR": eng.master_addr,
                 "PET_MASTER_PORT": eng.master_port, "PET_NPROC_PER_NODE": eng.nproc_per_node}.items():
        if k in environ:
            env[k], sources[k] = str(v), "autotune"
    return env, sources


ALLOC_CONF = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")  # torch 2.9+ reads the first; older torch the second


def allocator_env(environ: Mapping[str, str]) -> dict[str, str]:
    """The caching allocator's configuration on GPU plans: expandable segments (torchtitan's run_train.sh sets it;
    PyTorch's CUDA notes: segments grow by mapping pages, so a large tensor needs no free block whole), under both the
    name torch reads now and the one older torch reads. An allocator configuration you exported under either name is
    yours alone: neither is set beside it (torch would read the new name over yours)."""
    if any(k in environ for k in ALLOC_CONF):
        return {k: environ[k] for k in ALLOC_CONF if k in environ}
    return dict.fromkeys(ALLOC_CONF, "expandable_segments:True")


def plan_values_env(plan: TrainingPlan, run_dir: str) -> dict[str, str]:
    """AUTOTUNE_PLAN (the whole plan) and its main values, for scripts that read the environment."""
    records = records_dir(plan, run_dir)
    out = {
        PLAN_ENV: str(records / PLAN),
        RUN_DIR_ENV: str(run_dir),
        CHECKPOINT_DIR_ENV: str(checkpoint_dir(run_dir)),
        VALUE_ENV["micro_batch_size"]: str(plan.batch.micro_batch_size),
        VALUE_ENV["gradient_accumulation_steps"]: str(plan.batch.gradient_accumulation_steps),
        GLOBAL_BATCH_SIZE_ENV: str(plan.batch.global_batch_size),
        VALUE_ENV["precision"]: plan.numerics.precision,
        VALUE_ENV["num_workers"]: str(plan.loader.num_workers),
        BACKEND_ENV: plan.engine.backend,
    }
    if "learning_rate" not in plan.run.script_defaults:  # a rate the config does not set is the script's own
        out[VALUE_ENV["learning_rate"]] = str(plan.schedule.learning_rate)
    if plan.is_deepspeed:
        out[DEEPSPEED_CONFIG_ENV] = str(records / ENGINE_FLAVOUR_FILE)
        if plan.engine.device == "cuda":  # an unmodified Accelerator() runs DeepSpeed with the plan's ZeRO
            out["ACCELERATE_USE_DEEPSPEED"] = "true"
            out["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str(records / FRAMEWORK_FLAVOUR_FILE)
    if plan.engine.backend == "fsdp" and plan.engine.device == "cuda":  # ... and FSDP2 (on CPU Accelerate runs DDP)
        out.update(accelerate_fsdp_env(plan))
    if plan.run.resume_from:
        out[RESUME_FROM_ENV] = plan.run.resume_from
    return out


def single_process_rank_env(plan: TrainingPlan) -> dict[str, str]:
    """torchrun's variables for a one-process launch too, so a script that reads RANK works unchanged
    (under torchrun, --max_restarts included, torchrun sets them per rank, and its agent must not look like a rank).
    A script that decides on DDP by testing RANK gets them withheld (``launch_spec(withhold=...)``, the delivery
    record says why): the observer then knows the process as rank 0 by AUTOTUNE_OBSERVE_RANK. MASTER_PORT is
    FREE_PORT: the launch takes a free one (a process group of one still opens a store there)."""
    if plan.engine.backend != "single" or plan.engine.max_restarts:
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": plan.engine.master_addr, "MASTER_PORT": FREE_PORT, OBSERVE_RANK_ENV: "0"}


def fsdp_settings(plan: TrainingPlan) -> dict:
    """An FSDP2 plan in Accelerate's config keys (``fsdp_config`` of ``accelerate launch --config_file``): version 2
    (Accelerate's default is still 1), the transformer wrap policy on the plan's unit class (unknown: Accelerate
    takes the model's ``_no_split_modules``), sharded checkpoints, resharding, offload and checkpointing as
    planned. Each rank loads its own copy of the weights (``fsdp_cpu_ram_efficient_loading``: off)."""
    eng = plan.engine
    out: dict = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP"}
    if eng.fsdp_unit:
        out["fsdp_transformer_layer_cls_to_wrap"] = eng.fsdp_unit
    out.update(fsdp_state_dict_type="SHARDED_STATE_DICT", fsdp_reshard_after_forward=eng.reshard_after_forward,
               fsdp_offload_params=eng.offload_param, fsdp_cpu_ram_efficient_loading=False,
               fsdp_activation_checkpointing=plan.memory.gradient_checkpointing)
    return out


# Accelerate's launcher turns each fsdp_config key into a variable its FullyShardedDataParallelPlugin reads
# (accelerate/utils/launch.py: prepare_multi_gpu_env); an unmodified Accelerator() started by autotune reads these
FSDP_ENV = {"fsdp_version": "FSDP_VERSION", "fsdp_auto_wrap_policy": "FSDP_AUTO_WRAP_POLICY",
            "fsdp_transformer_layer_cls_to_wrap": "FSDP_TRANSFORMER_CLS_TO_WRAP",
            "fsdp_state_dict_type": "FSDP_STATE_DICT_TYPE", "fsdp_reshard_after_forward": "FSDP_RESHARD_AFTER_FORWARD",
            "fsdp_offload_params": "FSDP_OFFLOAD_PARAMS",
            "fsdp_cpu_ram_efficient_loading": "FSDP_CPU_RAM_EFFICIENT_LOADING",
            "fsdp_activation_checkpointing": "FSDP_ACTIVATION_CHECKPOINTING"}


def hsdp_mesh(plan: TrainingPlan) -> dict[str, int] | None:
    """An HSDP plan's 2-D mesh in Accelerate's ``parallelism_config`` keys (its ParallelismConfig: copies across
    the nodes, shards inside each), None for any other plan (FSDP2's 1-D mesh is Accelerate's default)."""
    eng = plan.engine
    if eng.backend != "fsdp" or eng.dp_replicate <= 1:
        return None
    return {"parallelism_config_dp_replicate_size": eng.dp_replicate,
            "parallelism_config_dp_shard_size": eng.world_size // eng.dp_replicate}


def accelerate_fsdp_env(plan: TrainingPlan) -> dict[str, str]:
    """ACCELERATE_USE_FSDP and the FSDP_* variables of ``fsdp_settings`` (values as Accelerate's launcher writes
    them: booleans lower-case); for HSDP, the PARALLELISM_CONFIG_* variables an ``Accelerator()`` (HF Trainer's
    too) builds its 2-D mesh from when ACCELERATE_USE_PARALLELISM_CONFIG is true (accelerate/parallelism_config.py,
    as ``accelerate launch`` writes them from a config file's ``parallelism_config``)."""
    out = {"ACCELERATE_USE_FSDP": "true"}
    for key, value in fsdp_settings(plan).items():
        out[FSDP_ENV[key]] = str(value).lower() if isinstance(value, bool) else str(value)
    mesh = hsdp_mesh(plan)
    if mesh:
        out["ACCELERATE_USE_PARALLELISM_CONFIG"] = "true"
        out.update({k.upper(): str(v) for k, v in mesh.items()})
    return out


def hf_fsdp_config(plan: TrainingPlan) -> dict:
    """HF Trainer's ``--fsdp_config`` for an FSDP2 plan (its keys: ``version``, ``reshard_after_forward``, ...)."""
    out = {k.removeprefix("fsdp_"): v for k, v in fsdp_settings(plan).items() if k != "fsdp_offload_params"}
    if "transformer_layer_cls_to_wrap" in out:
        out["transformer_layer_cls_to_wrap"] = out["transformer_layer_cls_to_wrap"].split(",")
    return {**out, "cpu_offload": plan.engine.offload_param}


def accelerate_env(plan: TrainingPlan) -> dict[str, str]:
    """What an unmodified ``Accelerator()`` reads (names from accelerate's state.py/accelerator.py):
    mixed precision, gradient accumulation steps (this variable beats an explicit argument), and the
    CPU switch without which each CPU rank under torchrun trains alone. A user's exported value wins.
    DeepSpeed through Accelerate (ACCELERATE_USE_DEEPSPEED and the framework-flavoured JSON) is set with
    the plan's paths (``plan_values_env``) on GPUs only: on CPU Accelerate's CPU switch turns DeepSpeed
    off (its state.py), so an Accelerate script runs its own DDP there and the launch says so."""
    out = {"ACCELERATE_MIXED_PRECISION": ACCELERATE_MIXED_PRECISION[plan.numerics.precision],
           "ACCELERATE_GRADIENT_ACCUMULATION_STEPS": str(plan.batch.gradient_accumulation_steps)}
    if plan.engine.device == "cpu":
        out["ACCELERATE_USE_CPU"] = "true"
    return out


def _program(plan: TrainingPlan, script_args: list[str]) -> list[str]:
    """What each rank runs: the user's script, or the built-in runtime. Either finds the plan in
    AUTOTUNE_PLAN, the one channel from the launcher to the ranks."""
    entry = plan.run.entrypoint
    if entry and entry.endswith(".py"):
        return [entry, *script_args]
    if entry:  # package.module:function: its own argv, never autotune's
        return ["-m", "autotune.entry", *script_args]
    return ["-m", "autotune.train", *script_args]


def torchrun_flags(plan: TrainingPlan) -> list[str]:
    """torchrun's flags for the plan: standalone on one node; across nodes the c10d rendezvous
    under SLURM (the same command on every node) or the static form (--node_rank)."""
    eng = plan.engine
    flags = [f"--nproc_per_node={eng.nproc_per_node}"]
    if eng.max_restarts:
        flags.append(f"--max_restarts={eng.max_restarts}")
    if eng.num_nodes == 1:
        return flags + ["--standalone"]
    if eng.rdzv_id:
        return flags + [f"--nnodes={eng.num_nodes}", "--rdzv_backend=c10d",
                        f"--rdzv_endpoint={eng.master_addr}:{eng.master_port}", f"--rdzv_id={eng.rdzv_id}",
                        f"--rdzv_conf=join_timeout={eng.rendezvous_timeout_s}"]
    return flags + [
        f"--nnodes={eng.num_nodes}",
        f"--node_rank={eng.node_rank}",
        f"--master_addr={eng.master_addr}",
        f"--master_port={eng.master_port}",
        f"--rdzv_conf=timeout={eng.rendezvous_timeout_s}",  # the static store's wait for the other nodes
    ]


def _single(plan: TrainingPlan, python: str, program: list[str]) -> list[str]:
    if plan.engine.max_restarts:  # restarts are torchrun's: one process under it
        return _torchrun(plan, python, program)
    return [python, *program]


def _torchrun(plan: TrainingPlan, python: str, program: list[str]) -> list[str]:
    cmd = [python, "-m", "torch.distributed.run", *torchrun_flags(plan)]
    if program[0] == "-m":
        return cmd + ["--module", *program[1:]]
    return cmd + program


LAUNCHERS: dict[str, Callable[[TrainingPlan, str, list[str]], list[str]]] = {
    "single": _single,
    "ddp": _torchrun,
    "deepspeed": _torchrun,
    "fsdp": _torchrun,
}


def launch_spec(plan: TrainingPlan, run_dir: str, environ: Mapping[str, str], *, python: str | None = None,
                has_infiniband: bool | None = None, script_args: list[str] | None = None,
                cwd: str | None = None, withhold: tuple[str, ...] = ()) -> LaunchSpec:
    """Build the command and environment for ``plan``. Pure: reads only its arguments (and the installation's key
    for the extension cache's folder: ``installation_key``, from metadata). ``withhold``: variables
    of the plan not to export to this script (the delivery record says why)."""
    python = python or sys.executable
    program = _program(plan, list(script_args or []))
    cmd = LAUNCHERS[plan.engine.backend](plan, python, program)
    env, sources = plan_env(plan, run_dir, environ, has_infiniband)
    for name in withhold:
        if sources.get(name) == "autotune":
            env.pop(name, None)
            sources.pop(name, None)
    return LaunchSpec(cmd=cmd, env=env, env_sources=sources, cwd=cwd,
                      at_launch=tuple(k for k, v in env.items() if v == FREE_PORT))


