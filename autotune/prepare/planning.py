"""config + flags + hardware (+ the measured model) -> (plan, profile, DeepSpeed dict): ``plan_for``, what
``plan``, ``export``, ``report`` and ``estimate`` need, and the first half of ``prepare``. The hardware is a preset,
a profile file or this machine detected; the model's facts are measured (a user's ``training.model``), the built-in
GPT's, or what the config declares; past runs of the same model on the same kind of machine join them
(``autotune.rundir.speeds``); on this machine's CPU the model's step is timed here (``_timed_here``).
"""

from __future__ import annotations

from importlib import metadata
from typing import Any, Callable, Mapping

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import TrainingPlan
from autotune.profiles import HardwareProfile, load_profile

# (config, policy, hardware) -> ModelFacts: how a user's model is measured (autotune.measure.model_facts)
Measure = Callable[..., Any]
# (**what to time) -> MeasuredSteps | None: a model's step timed on this CPU (autotune.measure.timing)
TimeSteps = Callable[..., Any]

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


def could_time_here(setup) -> bool:
    """Whether preparing ``setup`` again with ``time_steps`` could time its step: a plan for this machine's CPU,
    without DeepSpeed (a launch checks its run directory first, then pays for the timing)."""
    hw, p = setup.hardware, setup.plan
    return hw.source == "detected" and not hw.gpus.devices and not p.is_deepspeed and p.engine.num_nodes == 1

