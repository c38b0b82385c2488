"""The plan in other tools' words (pure): Accelerate config, torchrun command, sbatch script,
DeepSpeed hostfile."""

from __future__ import annotations

import re

from autotune.exports.deepspeed import deepspeed_clipping
from autotune.plan import ACCELERATE_MIXED_PRECISION, TrainingPlan


def accelerate_config(plan: TrainingPlan, *, accumulation: bool = True) -> dict:
    """A config for `accelerate launch --config_file` (keys of accelerate's ClusterConfig).

    Several CPU processes: ``accelerate launch`` starts more than one process only on its torchrun
    path (``MULTI_GPU``) or through mpirun (``MULTI_CPU`` needs an MPI host file); on the torchrun path
    the processes train together over gloo only with ACCELERATE_USE_CPU=true in their environment
    (a config key cannot set it), and gradient accumulation outside DeepSpeed has no key either:
    ``accelerate_launch_line`` carries both as variables. DeepSpeed and FSDP through Accelerate
    need GPUs (its CPU mode trains with DDP instead): refused for a CPU plan. An FSDP2 plan writes
    ``distributed_type: FSDP`` with ``fsdp_config`` (``launch_spec.fsdp_settings``: ``fsdp_version: 2``, the wrap
    policy and unit, the state-dict type, resharding, offload, checkpointing), and an HSDP plan its 2-D mesh in
    ``parallelism_config`` (``launch_spec.hsdp_mesh``).

    The DeepSpeed section carries only what the plan owns, as the DeepSpeed JSON does (``exports.deepspeed``):
    ``accumulation`` False leaves ``gradient_accumulation_steps`` out, so Accelerate's DeepSpeedPlugin reads "auto"
    and takes the script's own ``Accelerator(gradient_accumulation_steps=...)`` (a number in the file beats it:
    accelerate's ``_prepare_deepspeed`` "Using DeepSpeed's value"); clipping the config does not set is 0.0, DeepSpeed
    adds none (left out, Accelerate would fill its "auto" with 1.0 and clip)."""
    eng = plan.engine
    if eng.backend in ("deepspeed", "fsdp") and eng.device == "cpu":
        from autotune.errors import UserError

        if eng.backend == "fsdp":
            raise UserError("export --format accelerate: Accelerate runs FSDP on GPUs only (on CPU its CPU mode "
                            "trains with DDP instead); export this CPU plan with --ddp, or run it with the launcher")
        raise UserError("export --format accelerate: Accelerate runs DeepSpeed on GPUs only (on CPU its CPU mode "
                        "turns DeepSpeed off); export this CPU plan with --ddp, or use --format deepspeed with "
                        "torchrun or the launcher")
    mixed = ACCELERATE_MIXED_PRECISION[plan.numerics.precision]
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
        ds: dict = {"zero_stage": eng.zero_stage}
        if accumulation:
            ds["gradient_accumulation_steps"] = plan.batch.gradient_accumulation_steps
        ds.update({
            "gradient_clipping": deepspeed_clipping(plan),  # 0.0 = off, as in DeepSpeed
            "offload_optimizer_device": "cpu" if eng.offload_optimizer else "none",
            "offload_param_device": "cpu" if eng.offload_param else "none",
            "zero3_init_flag": False,
        })
        cfg["deepspeed_config"] = ds
    elif eng.backend == "fsdp":  # FSDP2: Accelerate's default fsdp_version is still 1
        from autotune.exports.launch_spec import fsdp_settings, hsdp_mesh

        cfg["distributed_type"] = "FSDP"
        cfg["fsdp_config"] = fsdp_settings(plan)
        mesh = hsdp_mesh(plan)
        if mesh:  # HSDP: shard inside each node, replicate across the nodes (Accelerate's ParallelismConfig)
            cfg["parallelism_config"] = mesh
    elif eng.world_size > 1:
        cfg["distributed_type"] = "MULTI_GPU"  # accelerate's torchrun path, for CPU processes too (above)
    else:
        cfg["distributed_type"] = "NO"
    if eng.device == "cuda" and eng.backend != "deepspeed":
        cfg["gpu_ids"] = "all"
    return cfg


def accelerate_launch_env(plan: TrainingPlan) -> dict[str, str]:
    """What the exported file cannot carry: the CPU switch for several CPU processes, and gradient
    accumulation outside DeepSpeed (accelerate's config has no key for it; Accelerator() reads the variable)."""
    env = {}
    if plan.engine.device == "cpu" and plan.engine.world_size > 1:
        env["ACCELERATE_USE_CPU"] = "true"
    if plan.engine.backend != "deepspeed" and plan.batch.gradient_accumulation_steps > 1:
        env["ACCELERATE_GRADIENT_ACCUMULATION_STEPS"] = str(plan.batch.gradient_accumulation_steps)
    return env


def accelerate_launch_line(plan: TrainingPlan, config_file: str, script: str = "train.py", *,
                           script_args: list[str] | tuple[str, ...] = (), withhold: tuple[str, ...] = ()) -> str:
    """The command that starts the planned processes with the exported file; ``withhold``: variables not to set
    for this script (the export says why), ``script_args``: the script's arguments, placeholders expanded."""
    from autotune.safe_input import shell_line

    env = "".join(f"{k}={v} " for k, v in accelerate_launch_env(plan).items() if k not in withhold)
    return env + shell_line(["accelerate", "launch", "--config_file", config_file, script, *script_args])


def torchrun_command(plan: TrainingPlan, script: str = "train.py") -> list[str]:
    from autotune.exports.launch_spec import torchrun_flags

    return ["torchrun", *torchrun_flags(plan), script]


# ---- values written into generated scripts: each one checked, and named when refused -----------------------
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_SLURM_NAME = re.compile(r"[A-Za-z0-9_.+-]+(,[A-Za-z0-9_.+-]+)*")  # partitions, accounts (a comma list)
_SLURM_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]+")  # also a folder's name: runs/slurm-<job name>
# man sbatch's --time forms: minutes, minutes:seconds, hours:minutes:seconds, days-hours, days-hours:minutes,
# days-hours:minutes:seconds; and no limit, as SLURM reads it (parse_time.c: INFINITE or UNLIMITED, any case)
_SLURM_TIME = re.compile(r"\d+(:\d\d){0,2}|\d+-\d+(:\d\d){0,2}|(?i:UNLIMITED|INFINITE)")
_SLURM_TIME_SHAPE = ("a SLURM time limit: minutes (90), minutes:seconds, hours:minutes:seconds (12:00:00), days-hours, "
                    "days-hours:minutes, days-hours:minutes:seconds (1-00:00:00), or UNLIMITED")
_HOST = re.compile(r"[A-Za-z0-9_.:-]+")


def check_script_value(field: str, value: str, pattern: re.Pattern | None = None, shape: str = "") -> None:
    """A value bound for a generated script (sbatch, hostfile): no newline or other control character (it would
    become a line of its own), and of ``pattern`` where given; UserError naming ``field`` otherwise."""
    from autotune.errors import UserError

    if _CONTROL.search(value):
        raise UserError(f"{field}: {value!r} holds a newline or another control character, which would become a "
                        "line of its own in the generated script; give the value on one line")
    if pattern is not None and not pattern.fullmatch(value):
        raise UserError(f"{field}: {value!r} is not {shape}")


def deepspeed_hostfile(plan: TrainingPlan, hosts: tuple[str, ...] | list[str]) -> str:
    """``host slots=N`` per node, for the ``deepspeed`` launcher (--hostfile); every host name checked."""
    eng = plan.engine
    for i, h in enumerate(hosts):
        check_script_value(f"SLURM_JOB_NODELIST (host {i})", h, _HOST, "a host name (letters, digits, '.', '-', "
                           "'_', ':')")
    names = list(hosts) or (["localhost"] if eng.num_nodes == 1 else [])
    if len(names) < eng.num_nodes:
        from autotune.errors import UserError

        raise UserError(f"export --format deepspeed-hostfile: the plan has {eng.num_nodes} nodes but only "
                        f"{len(names)} host name(s) are known; run it inside the SLURM allocation (it reads "
                        "SLURM_JOB_NODELIST)")
    return "".join(f"{h} slots={eng.nproc_per_node}\n" for h in names[:eng.num_nodes])


FIRST_EXIT_FILE = "slurm-first-exit"  # in the run directory: the code of the first node to fail, and its host
# each node's task: the launcher ("$@" after the note's path), then its code noted if no node failed before it. SLURM
# signals every process of the step (the USR1 before the time limit, srun's TERM): the shell traps them, so that
# it outlives the launcher, which handles them itself (a trap, unlike an ignored signal, is not inherited)
_FIRST_EXIT_WRAPPER = ('note=$1; shift; trap : USR1 TERM INT HUP; "$@"; rc=$?; if [ "$rc" -ne 0 ]; then '
                       '(set -o noclobber; echo "$rc $(hostname)" > "$note") 2>/dev/null; fi; exit "$rc"')


def sbatch_script(plan: TrainingPlan, *, launcher: str, config: str, run_dir: str, cpus_per_task: int,
                  time_limit: str, partition: str | None, account: str | None, job_name: str,
                  script_args: list[str] | tuple[str, ...] = (), plan_flags: list[str] | tuple[str, ...] = (),
                  requeues: int = 3, no_resume: str | None = None) -> str:
    """An sbatch script for the plan: one launcher task per node (srun), torchrun's c10d rendezvous
    across nodes (autotune reads the allocation on each node), logs inside the run directory,
    SIGUSR1 two minutes before the time limit; the ranks save a checkpoint and exit 75, and the
    script requeues the job, which resumes from that checkpoint (``no_resume``: why the script cannot resume, read
    from its source: no --resume_from auto is added, and the file says why). Exit 69 (a peer or a lock holder not
    there in time) requeues it too while SLURM_RESTART_COUNT (every requeue of the job) is below ``requeues``."""
    import shlex
    import textwrap

    from autotune.rundir.layout import JOB_SECRET_ENV

    for field, value, pattern, shape in (
            ("--job_name", job_name, _SLURM_JOB_NAME, "a SLURM job name (letters, digits, '_', '.', '-')"),
            ("--time", time_limit, _SLURM_TIME, _SLURM_TIME_SHAPE),
            ("--partition", partition or "x", _SLURM_NAME, "a SLURM partition name (or a comma list of them)"),
            ("--account", account or "x", _SLURM_NAME, "a SLURM account name"),
            ("the launcher path", launcher, None, ""), ("--config", config, None, ""), ("--run_dir", run_dir, None, ""),
            *((f"plan flag {i}", v, None, "") for i, v in enumerate(plan_flags)),
            *((f"script argument {i + 1} after `--`", v, None, "") for i, v in enumerate(script_args))):
        check_script_value(field, value, pattern, shape)
    eng = plan.engine
    lines = ["#!/bin/bash", f"#SBATCH --job-name={job_name}", f"#SBATCH --nodes={eng.num_nodes}",
             "#SBATCH --ntasks-per-node=1"]
    if eng.num_gpus:
        lines.append(f"#SBATCH --gpus-per-node={eng.num_gpus}")
    lines += [f"#SBATCH --cpus-per-task={cpus_per_task}", f"#SBATCH --time={time_limit}"]
    if partition:
        lines.append(f"#SBATCH --partition={partition}")
    if account:
        lines.append(f"#SBATCH --account={account}")
    q = shlex.quote(run_dir)
    lines += ["#SBATCH --output=slurm-%x-%j.out", "#SBATCH --signal=USR1@120", "#SBATCH --requeue",
              "#", "# Written by `python -m autotune export --format slurm`: the plan is made again on each node",
              "# from the allocation (node rank, master = first host, GPUs), the same command on every node.",
              "# The job's output is also kept in the run directory (slurm-<job id>.out). Relative paths are",
              "# relative to the directory this was exported in: submit it from there.",
              "set -euo pipefail", 'cd "${SLURM_SUBMIT_DIR:-.}"', f"mkdir -p {q}",
              f'exec > >(tee -a {q}/"slurm-${{SLURM_JOB_ID:-local}}.out") 2>&1',
              "# The nodes' hardware exchange admits only this job's nodes: one secret per job, made here (never",
              "# written to a file) and handed to every node's launcher by srun in its environment.",
              f"export {JOB_SECRET_ENV}=\"$(head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \\n')\"",
              *(["# Exit 75: stopped by a signal (the USR1 above, a preemption) after saving a checkpoint:",
                 "# requeue, and the job continues from it (--resume_from auto)."] if no_resume is None else
                ["# No --resume_from auto: a requeued job of this script would start over. Why:",
                 *(f"#   {line}" for line in textwrap.wrap(no_resume, 100))]),
              "# srun ends with its tasks' highest code, and --kill-on-bad-exit terminates the other nodes at",
              "# the first failure: one node's 69 came back as 143. So each node's launcher notes its code if",
              "# it is the first to fail (noclobber: one writer), and that code is the job's.",
              f"first={shlex.quote(run_dir + '/' + FIRST_EXIT_FILE)}",
              'rm -f "$first"',
              "rc=0",
              "srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c " + shlex.quote(_FIRST_EXIT_WRAPPER)
              + ' autotune-node "$first" '
              + shlex.join([launcher, "--config", config, *plan_flags, "--run_dir", run_dir,
                            *(["--resume_from", "auto"] if no_resume is None else []),
                            *(["--", *script_args] if script_args else [])]) + " || rc=$?",
              'code=$(cut -d" " -f1 "$first" 2>/dev/null || true)',
              'if [ "$rc" -ne 0 ] && [[ "$code" =~ ^[0-9]{1,3}$ ]]; then',
              '  echo "autotune: the first node to fail ended with $code (srun: $rc, the others\' codes after it)"',
              '  rc=$code',
              "fi",
              'if [ "$rc" -eq 75 ] && [ -n "${SLURM_JOB_ID:-}" ]; then',
              '  echo "autotune: checkpoint saved on preemption; requeueing job $SLURM_JOB_ID"',
              '  scontrol requeue "$SLURM_JOB_ID"',
              "  exit 0",
              "fi",
              f"# Exit 69: a node or the run's lock holder was not there in time: requeue, at most {requeues} times "
              "(SLURM", "# counts every requeue of the job, the preemptions' too, in SLURM_RESTART_COUNT).",
              'if [ "$rc" -eq 69 ] && [ -n "${SLURM_JOB_ID:-}" ] && '
              f'[ "${{SLURM_RESTART_COUNT:-0}}" -lt {requeues} ]; then',
              '  echo "autotune: a peer was not there in time; requeueing job $SLURM_JOB_ID '
              '(restart ${SLURM_RESTART_COUNT:-0})"',
              '  scontrol requeue "$SLURM_JOB_ID"',
              "  exit 0",
              "fi",
              'exit "$rc"', ""]
    return "\n".join(lines)
