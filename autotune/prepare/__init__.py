"""Run setup as a library: config + overrides + hardware (+ the measured model) -> ``RunSetup``.

``plan_for`` is what ``plan``, ``export`` and ``report`` need (plan, profile, DeepSpeed
dict). ``prepare`` adds the run directory, resolves ``--resume_from`` once to a concrete
checkpoint (recorded in the plan the ranks read, so no rank resolves it again), checks
that checkpoint against the plan, and builds the ``LaunchSpec``. It writes nothing and spawns
nothing: ``autotune.rundir.records`` writes the records, ``autotune.launch`` runs them.
"""

from __future__ import annotations

import dataclasses
import os
import secrets
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.plan import TrainingPlan
from autotune.profiles import HardwareProfile, load_profile

# (config, policy, hardware) -> ModelFacts: how a user's model is measured (autotune.measure.model_facts)
Measure = Callable[..., Any]
# (**what to time) -> MeasuredSteps | None: a model's step timed on this CPU (autotune.measure.timing)
TimeSteps = Callable[..., Any]


@dataclass(frozen=True)
class RunSetup:
    plan: TrainingPlan
    hardware: HardwareProfile
    deepspeed_config: dict | None
    run_dir: Path
    resume_path: Path | None
    launch_spec: Any  # autotune.exports.launch_spec.LaunchSpec
    delivery: Any = None  # autotune.exports.wiring.Delivery: how each plan value reaches the script
    speed_key: tuple[str | None, str | None] = (None, None)  # (model, kind of machine): autotune.rundir.speeds

    @property
    def records_dir(self) -> Path:
        from autotune.rundir.layout import records_dir

        return records_dir(self.plan, self.run_dir)


def deepspeed_installed_locally() -> bool:
    try:
        metadata.version("deepspeed")
        return True
    except metadata.PackageNotFoundError:
        return False


def resolve_hardware(spec: str | HardwareProfile | None) -> HardwareProfile:
    """A preset name or profile path, an already resolved profile, or None to detect this machine."""
    if isinstance(spec, HardwareProfile):
        return spec
    if spec:
        return load_profile(spec)
    from autotune.hardware import detect

    return detect()


def plan_for(cfg: TrainConfig, overrides: Mapping[str, Any] | None = None,
             hardware: str | HardwareProfile | None = None, *, auto_optimize: bool = True, debug: bool = False,
             policy: str | None = None, with_deepspeed: bool = True, force: bool = False, facts=None,
             record: list | None = None, measure: Measure | None = None, time_steps: TimeSteps | None = None
             ) -> tuple[TrainingPlan, HardwareProfile, dict | None]:
    """config + flags + hardware -> (plan, profile, DeepSpeed dict or None; None too without with_deepspeed).

    ``measure(cfg, policy, hw)`` measures a user's model (``training.model``): the programs pass
    ``autotune.measure.model_facts``; ``prepare`` sits beside ``measure`` and never imports it.
    ``time_steps(**what)`` times the model's step on this CPU (``autotune.measure.timing.measured_steps``)
    when the plan is for this machine and it has no GPU (``_timed_here``). Past runs of the same model on the same
    kind of machine reach the planner from ``autotune.rundir.speeds``.
    Raises PlanRefused (exit 3) when nothing fits by the estimate, unless ``force``.
    """
    from autotune.planner import plan
    from autotune.planner.policy import load_policy

    if overrides:
        cfg = apply_overrides(cfg, dict(overrides))
    hw = resolve_hardware(hardware)
    pol = load_policy(policy)
    # A preset says nothing about installed software: the plan will run with what is installed here.
    ds_installed = bool(hw.software["deepspeed"]) if "deepspeed" in hw.software else deepspeed_installed_locally()
    facts = _with_past_runs(cfg, hw, facts or _model_facts(cfg, pol, hw, measure))
    p = plan(hw, cfg, auto_optimize=auto_optimize, debug=debug, policy=pol, deepspeed_installed=ds_installed,
             facts=facts, force=force, record=record)
    steps = _timed_here(cfg, hw, p, facts, time_steps) if time_steps is not None else None
    if steps is not None:  # the same plan again, timed by the step measured here
        p = plan(hw, cfg, auto_optimize=auto_optimize, debug=debug, policy=pol, deepspeed_installed=ds_installed,
                 facts=facts.model_copy(update={"measured_steps": steps}), force=force, record=record)
    if not (with_deepspeed and p.is_deepspeed):
        return p, hw, None
    from autotune.exports.deepspeed import deepspeed_config

    return p, hw, deepspeed_config(p)


def _model_facts(cfg: TrainConfig, policy, hw: HardwareProfile, measure: Measure | None):
    """The planner's model facts: measured (a user's ``training.model``), else the built-in GPT's or
    what the config declares."""
    from autotune.planner.model_facts import facts_for

    t = cfg.training
    if t.entrypoint is None or t.model is None:
        return facts_for(cfg)
    if measure is None:  # a program that forgot to pass it: never plan a described model blind
        raise ValueError("plan_for: the config describes a model (training.model); pass measure=")
    return measure(cfg, policy, hw)


def speed_key(cfg: TrainConfig, hw: HardwareProfile) -> tuple[str | None, str | None]:
    """(model, kind of machine) under which past runs' speeds are kept (``autotune.rundir.speeds``)."""
    from autotune.rundir.speeds import machine_kind, model_key

    return model_key(cfg), machine_kind(hw)


def _with_past_runs(cfg: TrainConfig, hw: HardwareProfile, facts):
    """The facts with what earlier runs of this model measured on this kind of machine."""
    from pydantic import ValidationError

    from autotune.planner.model_facts import PastRun
    from autotune.rundir.speeds import past_runs

    runs = []
    for entry in past_runs(*speed_key(cfg, hw)):
        try:
            runs.append(PastRun.model_validate(entry))
        except ValidationError:
            continue  # an entry another version wrote: no past run
    return facts.model_copy(update={"past_runs": tuple(runs)}) if runs else facts


# the built-in GPT, as autotune.measure.timing builds and feeds it by name (the runtime holds the model)
BUILTIN_MODEL, BUILTIN_BATCH = "autotune.runtime.workload:timed_model", "autotune.runtime.workload:timed_batch"


def _timed_here(cfg: TrainConfig, hw: HardwareProfile, p: TrainingPlan, facts, time_steps: TimeSteps):
    """The model's step timed on this machine's CPU for plan ``p`` (its ranks, threads per rank, micro-batch,
    precision, checkpointing and clipping), or None: the plan is not for this machine's CPU (a preset, a GPU, several
    nodes), the model cannot be built here (a script without training.model and sample_input), DeepSpeed (whose
    step is not torch's), or ``training.probe`` is off (--no_probe)."""
    t, e = cfg.training, p.engine
    if hw.source != "detected" or hw.gpus.devices or e.device != "cpu" or p.is_deepspeed or not t.probe \
            or e.num_nodes > 1:
        return None
    if t.entrypoint is None:  # its shape only: the data set's size and seed change no step
        d = p.workload.data
        workload = {"model": p.workload.model.model_dump(), "data": {"seq_len": d.seq_len, "vocab_size": d.vocab_size}}
        model, sample, kw, what = BUILTIN_MODEL, BUILTIN_BATCH, {"workload": workload}, "the built-in GPT"
    elif t.model and t.sample_input and facts.num_parameters:
        model, sample, kw, what = t.model, t.sample_input, {}, t.model
    else:
        return None
    return time_steps(model=model, sample=sample, micro=p.batch.micro_batch_size, ranks=e.nproc_per_node,
                      threads=p.loader.omp_num_threads, precision=p.numerics.precision,
                      checkpointing=p.memory.gradient_checkpointing, clip=p.optimizer.gradient_clipping,
                      weight_decay=p.optimizer.weight_decay, what=what, model_kwargs=kw, sample_kwargs=kw,
                      cpu=hw.cpu.model_name)


def could_time_here(setup: RunSetup) -> bool:
    """Whether preparing ``setup`` again with ``time_steps`` could time its step: a plan for this machine's CPU,
    without DeepSpeed (a launch checks its run directory first, then pays for the timing)."""
    hw, p = setup.hardware, setup.plan
    return hw.source == "detected" and not hw.gpus.devices and not p.is_deepspeed and p.engine.num_nodes == 1


def new_run_dir_name() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def script_checkpoints(run_dir: Path, warn=None) -> list[tuple[Path, float]]:
    """What a user's script keeps in the run's checkpoint directory, in its own format (hidden names aside): its
    entries that are folders or regular files, with their times. A link (dangling or not), a named pipe or a socket
    is not followed or read: skipped, and said through ``warn``."""
    import stat

    from autotune.rundir.layout import checkpoint_dir

    where = checkpoint_dir(run_dir)
    if where.is_symlink() or not where.is_dir():
        return []
    out = []
    for p in where.iterdir():
        if p.name.startswith("."):
            continue
        try:
            st = p.lstat()
        except OSError:  # gone this moment
            continue
        if stat.S_ISDIR(st.st_mode) or stat.S_ISREG(st.st_mode):
            out.append((p, st.st_mtime))
        elif warn is not None:
            warn(f"--resume_from auto: {p} is " + ("a symbolic link" if stat.S_ISLNK(st.st_mode) else
                                                   "not a file or a folder") + ": skipped (never followed)")
    return out


def latest_run_with_checkpoint(root: Path, own_format: bool = False) -> Path | None:
    """The newest run under ``root`` holding a checkpoint (``own_format``: anything a user's script kept)."""
    from autotune.rundir.checkpoints import latest_checkpoint

    runs = sorted((d for d in root.glob("*") if d.is_dir()), key=lambda d: d.stat().st_mtime, reverse=True)
    return next((d for d in runs if (script_checkpoints(d) if own_format else latest_checkpoint(d) is not None)),
                None)


def choose_run_dir(run_dir: str | Path | None, resume_from: str | None, runs_root: Path,
                   own_format: bool = False) -> Path:
    if run_dir:
        return Path(run_dir)
    if resume_from == "auto":
        return latest_run_with_checkpoint(runs_root, own_format) or runs_root / new_run_dir_name()
    return runs_root / new_run_dir_name()


def resolve_resume(resume_from: str | None, run_dir: Path, warn=None, *, own_format: bool = False,
                   searched: Path | None = None, trust: bool = False) -> Path | None:
    """'auto' -> the newest checkpoint in run_dir that verifies (None: start fresh, said in one line through
    ``warn``), each damaged newer one named through ``warn`` (default: a warning on stderr); a path must exist and
    verify. ``searched``: the folder of runs 'auto' looked through when no --run_dir was given. What verifying
    cannot excuse is refused (exit 2): a link, an object that is not data, no checksums without ``trust``.

    ``own_format`` (a user's script, which keeps checkpoints its own way): a path only has to exist
    (file or directory); it reaches the script as {resume_from} and AUTOTUNE_RESUME_FROM, never as
    an argument autotune adds."""
    import sys

    from autotune.rundir.checkpoints import newest_good_checkpoint, verify_checkpoint

    if resume_from is None:
        return None
    if own_format and resume_from != "auto":
        path = Path(resume_from)
        if not path.exists():
            raise UserError(f"--resume_from: no such file or directory {resume_from!r}; give the checkpoint your "
                            "script wrote (it receives it as {resume_from} and $AUTOTUNE_RESUME_FROM)")
        return path.resolve()
    if warn is None:
        def warn(msg: str) -> None:
            print(f"warning: {msg}", file=sys.stderr, flush=True)
    from autotune.rundir.layout import checkpoint_dir

    who = "your script" if own_format else "training"
    fresh = (f"--resume_from auto: no run under {searched}/ holds a checkpoint: {who} starts fresh in {run_dir}"
             if searched is not None else
             f"--resume_from auto: {checkpoint_dir(run_dir)} holds no checkpoint yet: {who} starts fresh")
    if own_format:  # auto, for a user's script: the newest entry its checkpoint directory holds
        entries = script_checkpoints(run_dir, warn)
        if not entries:
            warn(fresh)
            return None
        return max(entries, key=lambda e: (e[1], e[0].name))[0].resolve()
    if resume_from == "auto":
        found = newest_good_checkpoint(run_dir, warn, trust)
        if found is None:
            warn(fresh)
        return found
    path = Path(resume_from)
    if not path.is_dir():
        raise UserError(f"--resume_from: no checkpoint directory {resume_from!r}")
    problems = verify_checkpoint(path, trust)
    if problems:
        raise UserError(f"--resume_from: {path} is damaged; choose another checkpoint (or --resume_from auto, "
                        "which skips damaged ones)", problems)
    return path.resolve()


def prepare(cfg: TrainConfig, overrides: Mapping[str, Any] | None = None,
            hardware: str | HardwareProfile | None = None, *, auto_optimize: bool = True, debug: bool = False,
            policy: str | None = None, run_dir: str | Path | None = None, resume_from: str | None = None,
            script_args: list[str] | tuple[str, ...] = (), environ: Mapping[str, str] | None = None,
            python: str | None = None, runs_root: str | Path = "runs", force: bool = False,
            measure: Measure | None = None, trust_checkpoint: bool = False,
            time_steps: TimeSteps | None = None) -> RunSetup:
    """Plan, pick the run dir, resolve the resume point once, build the launch spec. Writes nothing.
    ``trust_checkpoint``: resume from a checkpoint without checksums (--trust_checkpoint); it is loaded as data."""
    from autotune.exports.launch_spec import launch_spec
    from autotune.rundir.checkpoints import check_compatible, read_meta

    if overrides:
        cfg = apply_overrides(cfg, dict(overrides))
    plan, hw, ds = plan_for(cfg, None, hardware, auto_optimize=auto_optimize, debug=debug, policy=policy,
                            force=force, measure=measure, time_steps=time_steps)
    entry = plan.run.entrypoint
    if entry and entry.endswith(".py") and not Path(entry).is_file():
        raise UserError(f"training.entrypoint: no such script {entry!r} (paths are relative to {Path.cwd()})")
    rd = choose_run_dir(run_dir, resume_from, Path(runs_root), own_format=bool(entry))
    workdir = _workdir(cfg.training.workdir)
    if workdir is not None:  # the child starts elsewhere: every path it is given must not depend on its cwd
        rd = rd.absolute()
        if entry and entry.endswith(".py"):
            entry = str(Path(entry).absolute())
            plan = plan.model_copy(update={"run": plan.run.model_copy(update={"entrypoint": entry})})
    resume_path = resolve_resume(resume_from, rd, own_format=bool(entry), searched=None if run_dir else Path(runs_root),
                                 trust=trust_checkpoint)
    if resume_path is not None:
        if not entry:  # the built-in runtime's checkpoints: refuse an incompatible one before any rank starts
            check_compatible(read_meta(resume_path), resume_path, plan.engine.backend, plan.batch.global_batch_size)
        plan = plan.model_copy(update={"run": plan.run.model_copy(update={"resume_from": str(resume_path)})})
    from autotune.exports.script_args import (
        expand,
        placeholder_values,
        used_placeholders,
    )
    from autotune.exports.wiring import (
        RANK_VARIABLES,
        delivery,
        wire_flags,
        withhold_accumulation,
        withhold_rank_env,
    )
    from autotune.rundir.layout import deepspeed_config_path

    facts = script_facts(entry)
    ds_path = None
    if ds is not None:  # Accelerate and HF Trainer scripts get the flavour they accept (no optimizer, "auto")
        framework = facts is not None and (facts.uses_hf_trainer or facts.uses_accelerate)
        ds_path = deepspeed_config_path(plan, rd, framework)
    raw = [*plan.run.script_args, *script_args]
    values = placeholder_values(plan, rd, ds_path)
    args = expand(raw, values)
    wired: dict[str, str] = {}
    if cfg.training.wire == "auto" and facts is not None:
        extra, wired = wire_flags(facts, plan, values, args)
        args += extra
    if entry and resume_path is not None:
        _check_resume_reaches(facts, used_placeholders(raw), wired, args)
    route = delivery(plan, facts, used_placeholders(raw), wired, args, ds is not None) if entry else \
        delivery(plan, None, [], {}, args, ds is not None)
    why = withhold_accumulation(facts, route.routes) if entry else None
    withheld = {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": why} if why else {}
    why = withhold_rank_env(plan, facts) if entry else None
    if why:
        withheld.update(dict.fromkeys(RANK_VARIABLES, why))
    route = dataclasses.replace(route, withheld=withheld, wired=bool(wired) or cfg.training.wire == "auto")
    spec = launch_spec(plan, str(rd), os.environ if environ is None else environ, python=python,
                       has_infiniband=bool(hw.infiniband), script_args=args, cwd=workdir,
                       withhold=tuple(route.withheld))
    return RunSetup(plan=plan, hardware=hw, deepspeed_config=ds, run_dir=rd, resume_path=resume_path,
                    launch_spec=spec, delivery=route, speed_key=speed_key(cfg, hw))


def _check_resume_reaches(facts, placeholders: list[str], wired: dict[str, str], args: list[str]) -> None:
    """A resume point for a user's script must reach it: as {resume_from}, through $AUTOTUNE_RESUME_FROM (read
    by the script), or its own resume flag (--wire auto, or given after `--`). Otherwise the script would start
    from scratch without a word: refused."""
    from autotune.exports.wiring import FLAGS

    if "resume_from" in placeholders or "resume_from" in wired or facts is None or facts.uses_autotune:
        return
    if "AUTOTUNE_RESUME_FROM" in facts.env_reads or any(a.split("=")[0] in FLAGS["resume_from"] for a in args):
        return
    declared = [f for f in FLAGS["resume_from"] if f in facts.flags]
    how = (f"your script declares {declared[0]}: add --wire auto, or pass {declared[0]} {{resume_from}} after `--`"
           if declared else "pass it to your script after `--` (e.g. --resume {resume_from}) or have the script "
           "read $AUTOTUNE_RESUME_FROM")
    raise UserError(f"--resume_from: your script has no way to receive the resume point, and would start from "
                    f"scratch; {how}")


def _workdir(value: str | None) -> str | None:
    if not value:
        return None
    path = Path(value).expanduser()
    if not path.is_dir():
        raise UserError(f"training.workdir: {value!r} is not a directory (relative to {Path.cwd()}); create it "
                        "or give the directory your script should start in (--workdir)")
    return str(path.absolute())


def script_facts(entry: str | None):
    """What a user's entrypoint declares (syntax tree only; never run); None for autotune's runtime."""
    from autotune.exports.wiring import ScriptFacts, scan_script

    if not entry:
        return None
    if entry.endswith(".py"):
        return scan_script(entry)
    import importlib.util

    try:
        spec = importlib.util.find_spec(entry.partition(":")[0])
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.origin or not spec.origin.endswith(".py"):
        return ScriptFacts(entry, error="source not found: not scanned")
    return scan_script(spec.origin)


