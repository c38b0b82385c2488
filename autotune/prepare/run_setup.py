"""``prepare``: config + overrides + hardware (+ the measured model) -> ``RunSetup``, the launch as data.

It plans (``planning.plan_for``), picks the run directory and resolves ``--resume_from`` once to a concrete
checkpoint (``resume``; recorded in the plan the ranks read, so no rank resolves it again), checks that checkpoint
against the plan, reads what a user's script declares, wires the plan's values to it, and builds the
``LaunchSpec``. It writes nothing and spawns nothing: ``autotune.rundir.records`` writes the records,
``autotune.launch`` runs them.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import TrainingPlan
from autotune.prepare.entrypoint import check_entrypoint, workdir_of
from autotune.prepare.planning import plan_for, speed_key
from autotune.prepare.resume import (
    choose_run_dir,
    resolve_resume,
    resume_reaches,
    script_resume_point,
)
from autotune.profiles import HardwareProfile


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
    # why preparing again with time_cpu would not time the step on this CPU (measure.timing.why_untimed); None: it would
    untimed: str | None = None
    # what the user's script needs before a later --resume_from auto is taken (prepare.resume.resume_fix); None: taken
    resume_fix: str | None = None

    @property
    def records_dir(self) -> Path:
        from autotune.rundir.layout import records_dir

        return records_dir(self.plan, self.run_dir)


def prepare(cfg: TrainConfig, overrides: Mapping[str, Any] | None = None,
            hardware: str | HardwareProfile | None = None, *, auto_optimize: bool = True, debug: bool = False,
            policy: str | None = None, run_dir: str | Path | None = None, resume_from: str | None = None,
            script_args: list[str] | tuple[str, ...] = (), environ: Mapping[str, str] | None = None,
            python: str | None = None, runs_root: str | Path = "runs", force: bool = False,
            trust_checkpoint: bool = False, probe_gpu: bool = False, time_cpu: bool = False) -> RunSetup:
    """Plan, pick the run dir, resolve the resume point once, build the launch spec. Writes nothing.
    ``trust_checkpoint``: resume from a checkpoint without checksums (--trust_checkpoint); it is loaded as data.
    ``probe_gpu``, ``time_cpu``: measure on this machine first (``plan_for``)."""
    from autotune.exports.launch_spec import launch_spec
    from autotune.exports.script_scan import script_facts
    from autotune.rundir.checkpoints import check_compatible, read_meta

    if overrides:
        cfg = apply_overrides(cfg, dict(overrides))
    check_entrypoint(cfg)  # before any measuring: a missing script fails at once
    plan, hw, ds = plan_for(cfg, None, hardware, auto_optimize=auto_optimize, debug=debug, policy=policy,
                            force=force, probe_gpu=probe_gpu, time_cpu=time_cpu)
    entry = plan.run.entrypoint
    rd = choose_run_dir(run_dir, resume_from, Path(runs_root), own_format=bool(entry), entry=entry)
    workdir = workdir_of(cfg.training.workdir)  # checked by check_entrypoint above: the same function
    if workdir is not None:  # the child starts elsewhere: every path it is given must not depend on its cwd
        rd = rd.absolute()
        if entry and entry.endswith(".py"):
            entry = str(Path(entry).absolute())
            plan = plan.model_copy(update={"run": plan.run.model_copy(update={"entrypoint": entry})})
    resume_path = resolve_resume(resume_from, rd, own_format=bool(entry), searched=None if run_dir else Path(runs_root),
                                 trust=trust_checkpoint, entry=entry)
    facts = script_facts(entry)
    resume_path, reading = script_resume_point(entry, facts, resume_from, resume_path,
                                               [*plan.run.script_args, *script_args], cfg.training.wire == "auto")
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
        given_by_user,
        wire_flags,
        with_wired,
        withhold_accumulation,
        withhold_rank_env,
    )
    from autotune.rundir.layout import deepspeed_config_path

    ds_path = None
    if ds is not None:  # Accelerate and HF Trainer scripts get the flavour they accept (no optimizer, "auto")
        framework = facts is not None and (facts.uses_hf_trainer or facts.uses_accelerate)
        ds_path = deepspeed_config_path(plan, rd, framework)
    raw = [*plan.run.script_args, *script_args]
    values = placeholder_values(plan, rd, ds_path)
    args = expand(raw, values)
    wired: dict[str, str] = {}
    would: dict[str, str] = {}  # what --wire auto passes (or would): its hints name only what it finds
    given: dict[str, str] = {}  # your own arguments for the settings it finds: they win, and are shown as yours
    if facts is not None and entry:
        extra, would = wire_flags(facts, plan, values, args)
        given = given_by_user(facts, plan, values, args)
        if cfg.training.wire == "auto":
            args, wired = with_wired(args, extra), would
    resume_route, fix = None, None
    if entry and resume_from is not None:  # a checkpoint the script cannot receive is refused
        resume_route = resume_reaches(facts, used_placeholders(raw), wired, args, rd, resume_path, raw, reading,
                                      wire_auto=cfg.training.wire == "auto")
    elif entry:  # what a preempted launch may suggest: only a --resume_from auto the next launch takes
        fix = resume_fix(entry, facts, used_placeholders(raw), wired, args, rd, raw, reading,
                         wire_auto=cfg.training.wire == "auto")
    route = delivery(plan, facts, used_placeholders(raw), wired, args, ds is not None, given) if entry else \
        delivery(plan, None, [], {}, args, ds is not None)
    why = withhold_accumulation(facts, route.routes) if entry else None
    withheld = {"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": why} if why else {}
    why = withhold_rank_env(plan, facts) if entry else None
    if why:
        withheld.update(dict.fromkeys(RANK_VARIABLES, why))
    route = dataclasses.replace(route, withheld=withheld, wired=bool(wired) or cfg.training.wire == "auto",
                                resume=resume_route, would_wire=would)
    spec = launch_spec(plan, str(rd), os.environ if environ is None else environ, python=python,
                       has_infiniband=bool(hw.infiniband), script_args=args, cwd=workdir,
                       withhold=tuple(route.withheld))
    from autotune.measure.timing import why_untimed

    counted = plan.memory.estimate.num_parameters if plan.memory.estimate is not None else None
    return RunSetup(plan=plan, hardware=hw, deepspeed_config=ds, run_dir=rd, resume_path=resume_path,
                    launch_spec=spec, delivery=route, speed_key=speed_key(cfg, hw),
                    untimed=why_untimed(cfg, hw, plan, counted), resume_fix=fix)


def resume_fix(entry: str | None, facts, placeholders: list[str], wired: dict[str, str], args: list[str],
               run_dir: Path, raw: list[str], reading=None, wire_auto: bool = False) -> str | None:
    """The fix ``prepare.resume.resume_reaches`` would name for a later ``--resume_from auto`` by this script (None:
    that launch would take it: the built-in runtime, a script shown to receive a resume point), so that a preempted
    launch suggests only what the next one accepts (``launch.ending``)."""
    from autotune.errors import UserError
    from autotune.exports.script_resume import read_resume
    from autotune.rundir.layout import RESUME_FROM_ENV

    if not entry:
        return None
    if reading is None and entry.endswith(".py"):
        reading = read_resume(entry)
    try:
        resume_reaches(facts, placeholders, wired, args, run_dir, None, raw, reading, wire_auto)
    except UserError:
        return facts.resume_hint(RESUME_FROM_ENV)
    return None
