"""Launching is data first: ``launch_spec(plan, ...) -> LaunchSpec(cmd, env)`` is pure;
``execute(spec)`` is the one place that spawns a process.

Backends map to launchers in one table (``LAUNCHERS`` below):
- ``single``    -> ``python -m autotune.train`` (or the user's script) in one process;
- ``ddp``       -> ``torchrun`` (as ``python -m torch.distributed.run``, so the same interpreter);
- ``deepspeed`` -> ``torchrun`` as well. DeepSpeed's engine reads torchrun's RANK/LOCAL_RANK/
  WORLD_SIZE through ``deepspeed.init_distributed``; one launcher for both engines means the
  same flags, the same multi-node rendezvous and the same signal handling, and no dependency
  on the ``deepspeed`` launcher's pdsh/ssh hostfile machinery for single-node runs.
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping

from autotune.deepspeed_config import ENGINE_FLAVOUR_FILE, FRAMEWORK_FLAVOUR_FILE
from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan

SECRET_NAME = re.compile(r"(KEY|TOKEN|SECRET|PASSWORD|PASSWD|CREDENTIAL|AUTH)", re.IGNORECASE)


def redact(env: Mapping[str, str]) -> dict[str, str]:
    return {k: ("<redacted>" if SECRET_NAME.search(k) else v) for k, v in env.items()}


@dataclass(frozen=True)
class LaunchSpec:
    cmd: list[str]
    env: dict[str, str]  # the variables autotune sets (final values; the user's exported ones win)
    env_sources: dict[str, str] = field(default_factory=dict)  # name -> "autotune" | "user"
    cwd: str | None = None

    def to_record(self) -> dict:
        """What command.json holds: argv and the variables set, never a secret."""
        return {
            "argv": list(self.cmd),
            "env": redact(self.env),
            "env_sources": {k: v for k, v in self.env_sources.items() if k in self.env},
            "cwd": self.cwd,
        }

    def shell(self) -> str:
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in sorted(redact(self.env).items()))
        line = f"{env} {shlex.join(self.cmd)}".strip()
        return f"cd {shlex.quote(self.cwd)} && {line}" if self.cwd else line


def records_dir(plan: TrainingPlan, run_dir: str | Path) -> Path:
    """Where this node's launch records (plan.json, command.json, ...) go. Node 0 writes into the
    run directory itself; on a multi-node job each other node writes into ``node<rank>/`` beside
    it, so nodes sharing a file system never overwrite each other's records. Checkpoints, metrics
    and TensorBoard events stay in the run directory (rank 0 writes them)."""
    node_rank = plan.engine.node_rank  # 0 on one node: the planner refuses node_rank >= num_nodes
    return Path(run_dir) if node_rank == 0 else Path(run_dir) / f"node{node_rank}"


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
        "TORCH_EXTENSIONS_DIR": str(Path(default_cache_dir(environ)) / "torch_extensions"),
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
        want["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
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
    env, sources = {}, {}
    for k, v in want.items():
        if k in environ:
            env[k], sources[k] = environ[k], "user"
        else:
            env[k], sources[k] = v, "autotune"
    # This launch's facts: always ours, never inherited from an outer run.
    for k, v in {**plan_values_env(plan, run_dir), **single_process_rank_env(plan)}.items():
        env[k], sources[k] = v, "autotune"
    return env, sources


def plan_values_env(plan: TrainingPlan, run_dir: str) -> dict[str, str]:
    """AUTOTUNE_PLAN (the whole plan) and its main values, for scripts that read the environment."""
    records = records_dir(plan, run_dir)
    out = {
        "AUTOTUNE_PLAN": str(records / "plan.json"),
        "AUTOTUNE_RUN_DIR": str(run_dir),
        "AUTOTUNE_CHECKPOINT_DIR": str(Path(run_dir) / "checkpoints"),
        "AUTOTUNE_MICRO_BATCH_SIZE": str(plan.batch.micro_batch_size),
        "AUTOTUNE_GRADIENT_ACCUMULATION_STEPS": str(plan.batch.gradient_accumulation_steps),
        "AUTOTUNE_GLOBAL_BATCH_SIZE": str(plan.batch.global_batch_size),
        "AUTOTUNE_LEARNING_RATE": str(plan.schedule.learning_rate),
        "AUTOTUNE_PRECISION": plan.numerics.precision,
        "AUTOTUNE_NUM_WORKERS": str(plan.loader.num_workers),
        "AUTOTUNE_BACKEND": plan.engine.backend,
    }
    if plan.is_deepspeed:
        out["AUTOTUNE_DEEPSPEED_CONFIG"] = str(records / ENGINE_FLAVOUR_FILE)
        if plan.engine.device == "cuda":  # an unmodified Accelerator() runs DeepSpeed with the plan's ZeRO
            out["ACCELERATE_USE_DEEPSPEED"] = "true"
            out["ACCELERATE_DEEPSPEED_CONFIG_FILE"] = str(records / FRAMEWORK_FLAVOUR_FILE)
    if plan.run.resume_from:
        out["AUTOTUNE_RESUME_FROM"] = plan.run.resume_from
    return out


def single_process_rank_env(plan: TrainingPlan) -> dict[str, str]:
    """torchrun's variables for a one-process launch too, so a script that reads RANK works unchanged
    (under torchrun, torchrun sets them per rank)."""
    if plan.engine.backend != "single":
        return {}
    return {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": plan.engine.master_addr, "MASTER_PORT": str(plan.engine.master_port)}


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
}


def launch_spec(plan: TrainingPlan, run_dir: str, environ: Mapping[str, str], *, python: str | None = None,
                has_infiniband: bool | None = None, script_args: list[str] | None = None,
                cwd: str | None = None) -> LaunchSpec:
    """Build the command and environment for ``plan``. Pure: reads only its arguments."""
    python = python or sys.executable
    program = _program(plan, list(script_args or []))
    cmd = LAUNCHERS[plan.engine.backend](plan, python, program)
    env, sources = plan_env(plan, run_dir, environ, has_infiniband)
    return LaunchSpec(cmd=cmd, env=env, env_sources=sources, cwd=cwd)


def _die_with_parent(parent_pid: int):
    """For the child, before exec: SIGTERM when the launcher dies, whatever kills it (SIGKILL
    included), so torchrun stops its ranks instead of training on unattended (Linux
    PR_SET_PDEATHSIG; elsewhere nothing)."""
    def setup() -> None:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
        except (OSError, AttributeError):
            return
        if os.getppid() != parent_pid:  # the launcher died before prctl took effect
            os.kill(os.getpid(), signal.SIGTERM)

    return setup if sys.platform.startswith("linux") else None


def execute(spec: LaunchSpec, environ: Mapping[str, str] | None = None, forwarded: list[int] | None = None,
            keep_fds: tuple[int, ...] = (), kill_after_s: float | None = None, signal_ranks: bool = False,
            should_kill: Callable[[], str | None] | None = None, output=None) -> int:
    """Run the spec; forward SIGINT/SIGTERM/SIGHUP/SIGUSR1 to the child; return its exit code
    (128+N if killed by N).

    Signals forwarded are appended to ``forwarded`` when given, so a caller can tell an
    interruption from a failure (torchrun exits 1 when interrupted). ``kill_after_s`` after the
    first forwarded signal (or at a second SIGINT: Ctrl-C twice), the child and every process
    under it are killed: the ranks' grace to save a checkpoint is over.

    ``signal_ranks`` (autotune's runtime, which turns the signal into "checkpoint, then stop"):
    the signal goes to torchrun's ranks instead of torchrun, so torchrun sees its ranks finish
    and exits cleanly; before the ranks exist, and for scripts that die of the signal (torchrun
    would count that as a failure and restart them under --max_restarts), torchrun gets it.

    ``should_kill`` is asked every second; a reason returned ends the child's whole tree (the
    launcher uses it when a rank has reported failure and the rest do not stop).

    ``output`` (an ``autotune.runlog.RunLog``) copies the child's stdout and stderr into the run directory
    as well as to the terminal.
    """
    import time

    full_env = {**(os.environ if environ is None else environ), **spec.env}
    streams = output.child_fds() if output is not None else (None, None)
    proc = subprocess.Popen(spec.cmd, env=full_env, cwd=spec.cwd, start_new_session=True,
                            preexec_fn=_die_with_parent(os.getpid()), pass_fds=tuple(keep_fds),
                            stdout=streams[0], stderr=streams[1])
    if output is not None:
        output.started()
    seen = forwarded if forwarded is not None else []
    first: list[float] = []

    def forward(signum, _frame):
        seen.append(signum)
        if not first:
            first.append(time.monotonic())
        elif signum == signal.SIGINT and seen.count(signal.SIGINT) >= 2:
            kill_tree(proc.pid)
            return
        ranks = _children(proc.pid) if signal_ranks else []
        for r in ranks:
            try:
                r.send_signal(signum)
            except Exception:  # psutil.NoSuchProcess: it ended meanwhile
                pass
        if ranks:
            return
        try:  # torchrun stops its workers on SIGTERM/SIGINT/SIGHUP; SIGUSR1 would kill it alone
            proc.send_signal(signal.SIGTERM if signum == signal.SIGUSR1 else signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP,
                                                         signal.SIGUSR1)}
    try:
        while True:
            try:
                rc = proc.wait(timeout=1.0)
                break
            except subprocess.TimeoutExpired:
                reason = should_kill() if should_kill is not None else None
                if reason:
                    print(f"autotune: {reason}; stopping the rest", file=sys.stderr, flush=True)
                    kill_tree(proc.pid)
                    should_kill = None
                if first and kill_after_s is not None and time.monotonic() - first[0] > kill_after_s:
                    print(f"autotune: the ranks did not stop {kill_after_s:g} s after the signal; killing them",
                          file=sys.stderr, flush=True)
                    kill_tree(proc.pid)
                    first.clear()
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
        if output is not None:
            output.ended()
    return 128 - rc if rc < 0 else rc


def _children(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children()
    except Exception:
        return []


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and every process under it (torchrun starts its ranks in sessions of their own)."""
    try:
        import psutil

        procs = psutil.Process(pid).children(recursive=True)
    except Exception:  # psutil missing or the process already gone
        procs = []
    for p in [*procs]:
        try:
            p.kill()
        except Exception:
            pass
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
