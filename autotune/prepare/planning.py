"""config + flags + hardware (+ the measured model) -> (plan, profile, DeepSpeed dict): ``plan_for``, what
``plan``, ``export``, ``report`` and ``estimate`` need, and the first half of ``prepare``. The hardware is a preset,
a profile file or this machine detected; the model's facts are measured (``autotune.measure``: a user's
``training.model``), else the built-in GPT's or what the config declares; past runs of the same model on the same
kind of machine join them (``autotune.rundir.speeds``); a plan for this machine's CPU can be timed by the model's
own step run here (``autotune.measure.timing``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

from autotune.config import AUTO, TrainConfig, apply_overrides
from autotune.plan import TrainingPlan
from autotune.profiles import HardwareProfile, load_profile


def resolve_hardware(spec: str | HardwareProfile | None) -> HardwareProfile:
    """A preset name or profile path, an already resolved profile, or None to detect this machine."""
    if isinstance(spec, HardwareProfile):
        return spec
    if spec:
        return load_profile(spec)
    from autotune.hardware import detect

    return detect()


def plan_for(cfg: TrainConfig, overrides: Mapping[str, Any] | None = None,
             hardware: str | HardwareProfile | None = None, *, with_deepspeed: bool = True, **options
             ) -> tuple[TrainingPlan, HardwareProfile, dict | None]:
    """config + flags + hardware -> (plan, profile, DeepSpeed dict or None; None too without with_deepspeed);
    ``options``: ``weigh_for``'s. Raises PlanRefused (exit 3) when nothing fits by the estimate, unless ``force``."""
    p, _, hw = weigh_for(cfg, overrides, hardware, times=False, **options)
    if not (with_deepspeed and p.is_deepspeed):
        return p, hw, None
    from autotune.exports.deepspeed import deepspeed_config, deepspeed_reasons

    ds = deepspeed_config(p)  # the plan says what its JSON applies: clipping, and the optimizer's parameters
    return p.model_copy(update={"reasons": {**p.reasons, **deepspeed_reasons(p, ds)}}), hw, ds


# the config field a plan flag sets -> the plan's knob it decides: a value from a flag is named as one
# (--no_auto_optimize took every flag's value "from the config verbatim")
FLAG_KNOBS = {"distributed.backend": "backend", "distributed.zero_stage": "zero_stage",
              "distributed.nproc_per_node": "nproc_per_node", "distributed.num_nodes": "num_nodes",
              "distributed.node_rank": "node_rank", "distributed.master_addr": "master_addr",
              "training.batch_size_per_gpu": "micro_batch_size",
              "training.gradient_accumulation_steps": "gradient_accumulation_steps",
              "training.mixed_precision": "precision", "data.num_workers": "num_workers"}


def weigh_for(cfg: TrainConfig, overrides: Mapping[str, Any] | None = None,
              hardware: str | HardwareProfile | None = None, *, auto_optimize: bool = True, debug: bool = False,
              policy: str | None = None, force: bool = False, facts=None, probe_gpu: bool = False,
              time_cpu: bool = False, times: bool = True):
    """config + flags + hardware -> (plan, what its memory decider weighed, profile): ``autotune estimate``'s table
    (``planner.weigh``; a refusal carries its weighing).

    A user's model (``training.model``) is measured here (``autotune.measure``): traced under fake tensors, and with
    ``probe_gpu`` (a launch on this machine's GPUs, not a dry run) refined by real steps on GPU 0. With ``time_cpu``,
    a plan for this machine's CPU is timed by the model's own step run here, then planned again by it
    (``measure.timing.steps_for``). ``facts``: the model's facts, measured already.
    """
    from autotune.measure.timing import steps_for
    from autotune.planner import weigh
    from autotune.planner.policy import load_policy
    from autotune.rundir.installation import deepspeed_installed

    if overrides:
        cfg = apply_overrides(cfg, dict(overrides))
    hw = resolve_hardware(hardware)
    threads_set = cfg.data.omp_num_threads != AUTO
    above = None if threads_set else threads_above_cores(hw, os.environ)
    cfg = cfg if above else exported_threads(cfg, hw, os.environ)
    exported = not threads_set and cfg.data.omp_num_threads != AUTO  # yours, by the environment
    pol = load_policy(policy)
    ds_installed = deepspeed_installed(hw.software)
    facts = _with_past_runs(cfg, hw, facts or _model_facts(cfg, pol, hw, probe_gpu))
    sources = {FLAG_KNOBS[k]: "flag" for k in (overrides or {}) if k in FLAG_KNOBS}
    if exported:
        sources["omp_num_threads"] = "environment"
    options = dict(auto_optimize=auto_optimize, debug=debug, policy=pol, deepspeed_installed=ds_installed,
                   force=force, times=times, sources=sources or None)
    p, weighing = weigh(hw, cfg, facts=facts, **options)
    steps = steps_for(cfg, hw, p, facts) if time_cpu else None
    if steps is not None:  # the same plan again, timed by the step measured here
        p, weighing = weigh(hw, cfg, facts=facts.model_copy(update={"measured_steps": steps}), **options)
    if above:
        p = p.model_copy(update={"warnings": (*p.warnings, above.format(planned=p.loader.omp_num_threads))})
    return p, weighing, hw


def threads_above_cores(hw: HardwareProfile, environ: Mapping[str, str]) -> str | None:
    """Why an exported OMP_NUM_THREADS above this machine's logical cores is not the plan's (None: it is not
    above them, or the plan is for another machine): torch starts a process with at most the machine's logical
    cores whatever the variable says (torch 2.13 here: OMP_NUM_THREADS=7 on 2 cores gives get_num_threads() 2),
    so a plan that said 7 told of threads no script got; the plan chooses, and the launch sets its own."""
    raw, cores = environ.get("OMP_NUM_THREADS", "").strip(), hw.cpu.logical_cores
    if hw.source != "detected" or not cores or not raw.isdigit() or int(raw) <= cores:
        return None
    return (f"OMP_NUM_THREADS={raw} in your environment is above this machine's {cores} logical cores, which torch "
            f"caps it at: the plan chose {{planned}} thread(s) a process and the launch sets that (export at most "
            f"{cores}, or set data.omp_num_threads)")


def exported_threads(cfg: TrainConfig, hw: HardwareProfile, environ: Mapping[str, str]) -> TrainConfig:
    """``cfg`` with the OMP_NUM_THREADS the user exported as ``data.omp_num_threads`` when the plan is for this
    machine: the launch leaves an exported value in the ranks' environment (``launch_spec.plan_env``), so the plan
    says, and times, what they will run. A number in the config wins (``launch_spec.plan_env`` then sets it; the
    configs' ``auto`` is no number); a preset or profile file is another machine."""
    raw = environ.get("OMP_NUM_THREADS")
    if raw is None or hw.source != "detected" or cfg.data.omp_num_threads != AUTO:
        return cfg
    try:
        threads = int(raw.strip())
    except ValueError:
        threads = 0
    if not 1 <= threads <= 65536:
        from autotune.errors import UserError

        raise UserError(f"OMP_NUM_THREADS={raw!r} in your environment is not a number of threads",
                        ["unset it (the plan then chooses effective cores / processes) or export a positive integer"])
    return apply_overrides(cfg, {"data.omp_num_threads": threads})


def _model_facts(cfg: TrainConfig, policy, hw: HardwareProfile, probe_gpu: bool):
    """The planner's model facts: measured (a user's ``training.model``), else the built-in GPT's or
    what the config declares."""
    from autotune.exports.script_config_meta import meta_in_config
    from autotune.exports.script_engines import engines_not_run
    from autotune.planner.model_facts import facts_for

    t = cfg.training
    if t.entrypoint is None:
        return facts_for(cfg)
    read = _script_read(t.entrypoint, t.workdir)
    if t.model is None:
        facts = facts_for(cfg)
    else:
        from autotune.measure import model_facts, model_facts_probed

        facts = (model_facts_probed if probe_gpu else model_facts)(cfg, policy, hw)
    meta = None if read is None else read.builds_on_meta or meta_in_config(t.script_args, t.workdir, read)
    if meta:  # measured or declared: the set-up makes only each rank's shards
        facts = facts.model_copy(update={"builds_on_meta": meta})
    if read is not None and read.drops_last:
        facts = facts.model_copy(update={"drops_last": read.drops_last})
    cannot = engines_not_run(t.entrypoint, read if read is not None else _module_read(t.entrypoint))
    return facts.model_copy(update={"script_cannot": tuple(cannot.items())}) if cannot else facts


def _module_read(entrypoint: str):
    """A module:function entrypoint's source, read (None for a script file not here: a plan for another machine)."""
    from autotune.exports.script_scan import script_facts

    return None if entrypoint.endswith(".py") else script_facts(entrypoint)


def _script_read(entrypoint: str, workdir: str | None):
    """What the user's script (a readable .py file) and its project's modules say of the plan, read from source
    (``exports.script_scan.ScriptFacts``): where it builds its model on the meta device, where its DataLoader drops
    the last partial batch; None for a module:function entrypoint or a file not here (a plan for another machine)."""
    from pathlib import Path

    from autotune.exports.script_scan import scan_script

    path = Path(entrypoint) if Path(entrypoint).is_absolute() else Path(workdir or ".") / entrypoint
    if not entrypoint.endswith(".py") or not path.is_file():
        return None
    return scan_script(path)


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


def could_time_here(setup) -> bool:
    """Whether preparing ``setup`` again with ``time_cpu`` would time its step (a launch checks its run directory
    first, then pays for the timing). A plan for this machine's CPU that will not be timed (--no_probe, a model that
    cannot be built here) says why on stderr, in one line, and is not prepared again."""
    import sys

    from autotune.measure.timing import times_here

    if setup.untimed is None:
        return True
    if times_here(setup.hardware, setup.plan):  # a plan for this CPU: a timing was to be expected
        print(f"autotune: the step is not timed on this CPU: {setup.untimed}", file=sys.stderr, flush=True)
    return False
