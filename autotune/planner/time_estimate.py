"""The plan's predicted time (pure arithmetic; no torch): each option's step time from the step-time model
(``step_time``: the traced work on the GPU table), or from the model's step timed for real on this machine's CPU or
probed on GPU 0, calibrated by a past run with the same settings; and the plan's ``time_estimate``, every figure or
null with its reason."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.planner.communication import Link, link_for
from autotune.planner.gpus import GPUSpec
from autotune.planner.model_facts import MeasuredSteps, WorkModel
from autotune.planner.step_time import StepTime, compute_s, step_time
from autotune.profiles import HardwareProfile

if TYPE_CHECKING:
    from autotune.plan import TimeEstimate


@dataclass(frozen=True)
class Timing:
    """Predicted step times of one plan's options (``time``), from the traced work on the GPU table, or from the
    model's steps timed for real on this machine's CPU (``measured``)."""

    basis: str
    num_parameters: int
    world: int
    precision: str = "bf16"
    tf32: bool = False
    work: WorkModel | None = None
    gpu: GPUSpec | None = None
    link: Link | None = None
    cores_per_rank: float = 1.0
    measured: MeasuredSteps | None = None
    units: int = 1  # the modules a sharded engine gathers one by one (FSDP2's units): NCCL calls per collective

    def time(self, strategy, checkpointing: bool, micro: int, accumulation: int) -> StepTime | None:
        if self.measured is not None and self.gpu is None:  # timed on this CPU: torch's step, as the ranks ran it
            fits = strategy.backend != "deepspeed" and self.measured.ranks == self.world
            return self._measured(micro, accumulation) if fits else None
        half = self.precision in ("bf16", "fp16")
        # every engine on the same compute line (the step as the trace ran it): engines differ by what they add
        line = self.work.line(half, checkpointing) if self.work else None
        if line is None or self.gpu is None or self.link is None:
            return None
        return step_time(line.at(micro), strategy=strategy.name, micro=micro, accumulation=accumulation,
                         world=self.world, gpu=self.gpu, link=self.link, precision=self.precision, tf32=self.tf32,
                         num_parameters=self.num_parameters, host_cores_per_rank=self.cores_per_rank,
                         scale=self._probed(half, micro), units=self.units)

    def why_untimed(self, strategy) -> str:
        if self.measured is not None and self.gpu is None:
            if strategy.backend == "deepspeed":
                return "DeepSpeed on the CPU is not timed (the step timed here is torch's)"
            return f"the step was timed with {self.measured.ranks} process(es), the plan has {self.world}"
        return "no traced work for this precision and checkpointing"

    def _probed(self, half: bool, micro: int) -> tuple[float, float]:
        """Measured over modelled compute of the probed step (plain, the plan's precision) at ``micro``: every
        option's compute is the model's times that (the probed option's is then what the GPU measured)."""
        plain = self.work.line(half, False) if self.measured is not None and self.work else None
        if plain is None:
            return 1.0, 1.0
        model_micro, model_opt, _ = compute_s(plain.at(micro), self.gpu, self.precision, self.tf32)
        real_micro, real_opt = self.measured.at(micro)
        return real_micro / max(model_micro, 1e-12), real_opt / max(model_opt, 1e-12)

    def _measured(self, micro: int, accumulation: int) -> StepTime:
        """micro-step = a + b x micro as the ranks ran it at once, x accumulation, + the optimizer step, + DDP's
        gloo all-reduce of the fp32 gradients once per step (timed among the same processes)."""
        m = self.measured
        micro_s, opt_s = m.at(micro)
        comm = (m.all_reduce_s or 0.0) if self.world > 1 else 0.0
        step_s = accumulation * micro_s + opt_s + comm
        return StepTime(micro_s, opt_s, comm, step_s, micro * accumulation * self.world / step_s,
                        (("gloo all-reduce", comm),) if comm else ())


def timing_for(hw: HardwareProfile, devs, facts, *, precision: str, tf32: bool, nproc: int, num_nodes: int,
               world: int) -> tuple[Timing | None, str]:
    """The plan's Timing, or None and why a time cannot be predicted."""
    if facts.num_parameters is None:
        return None, "the model's size is unknown (set training.model, or training.num_parameters)"
    if not devs:
        m = facts.measured_steps
        if m is None:
            return None, ("no GPU, and the model's step was not timed here: a CPU plan is timed for real only on "
                          "this machine (not a preset), on one node, for a model autotune can build (the built-in GPT, "
                          "or training.model with training.sample_input), without DeepSpeed or FSDP2, "
                          "unless --no_probe")
        return Timing(basis=m.basis, num_parameters=facts.num_parameters, world=world, measured=m,
                      precision=precision), ""
    if facts.work is None:
        return None, ("the model's work is not counted (a model autotune cannot trace, or a script of unknown size): "
                      "give training.model and training.sample_input")
    from autotune.planner.gpus import attention_assumed, spec_for

    gpu = spec_for(devs[0])
    if gpu is None:
        return None, (f"{devs[0].name or 'this GPU'} is not in the GPU table (configs/gpus.yaml): unknown, so the "
                      "plan keeps the memory rule")
    cores = max(1.0, hw.cpu.effective_cores / max(1, nproc))
    link = link_for(hw, gpu, nproc, num_nodes)
    eff = gpu.efficiency
    said = (f"efficiencies '{eff.name}': {eff.evidence}" if eff.measured else
            f"no evidence for the {gpu.row.name}: the conservative efficiencies ({eff.evidence})")
    attention = attention_assumed(devs[0].compute_capability_tuple(), precision, eff)
    basis = f"model: {facts.work.source} on {gpu.basis}; every engine on the same compute line; {said}; {attention}"
    units = max(1, round(facts.num_parameters / facts.fsdp_unit_parameters)) if facts.fsdp_unit_parameters else 1
    probed = facts.measured_steps
    if probed is not None:  # the compute as GPU 0 ran it; the other options' by the model, scaled alike
        basis = f"{probed.basis}; other options and communication by the {basis}"
    return Timing(basis=basis, num_parameters=facts.num_parameters, world=world, precision=precision, tf32=tf32,
                  work=facts.work, gpu=gpu, link=link, cores_per_rank=cores, measured=probed, units=units), ""


def matching_run(runs, strategy, checkpointing: bool, micro: int, world: int, precision: str):
    """The newest past run (``model_facts.PastRun``) with these settings, or None."""
    return next((r for r in runs if r.strategy == strategy.name and r.world_size == world and
                 r.micro_batch_size == micro and r.gradient_checkpointing == checkpointing and
                 r.precision == precision), None)


def _calibrated(t: StepTime | None, past, timing: Timing | None, strategy, checkpointing: bool, micro: int,
                accumulation: int, world: int) -> tuple[StepTime | None, str]:
    """The step as a past run with the same settings measured it: its samples/s where the accumulation is the
    same, else the model's prediction times measured / predicted at its accumulation. Each part of the step is
    scaled alike. (None, "") when it cannot say more than the model."""
    then = timing.time(strategy, checkpointing, micro, past.gradient_accumulation_steps) if timing else None
    if past.gradient_accumulation_steps == accumulation:
        rate = past.measured_samples_per_s
    elif t is not None and then is not None:
        rate = t.samples_per_s * past.measured_samples_per_s / then.samples_per_s
    else:
        return None, ""
    step_s = micro * accumulation * world / rate
    f = step_s / t.step_s if t is not None else None
    parts = ((t.micro_step_s * f, t.optimizer_step_s * f, t.communication_s * f) if f is not None else
             (float("nan"),) * 3)
    said = (f"calibrated by your run of {past.date} in {past.run_dir}: measured {past.measured_samples_per_s:,.1f} "
            f"samples/s at accumulation {past.gradient_accumulation_steps}"
            + (f" (the model predicts {then.samples_per_s:,.1f} there)" if then is not None else ""))
    return StepTime(*parts, step_s, rate), said


def time_estimate(timing: Timing | None, untimed: str, strategy, checkpointing: bool, micro: int, accumulation: int,
                  total_steps: int | None, tokens_per_sample: int | None, world: int, precision: str = "bf16",
                  past_runs: tuple = (), on_gpu: bool = True) -> TimeEstimate:
    """The plan's ``time_estimate``: each figure, or null with its reason; a past run with the same settings
    calibrates it (``past_runs``: the model's, on this kind of machine, newest first)."""
    import math

    from autotune.plan import TimeEstimate

    figures = ("micro_step_s", "optimizer_step_s", "communication_s", "step_s", "samples_per_s", "tokens_per_s",
               "total_s", "speedup_vs_1_gpu")
    t = timing.time(strategy, checkpointing, micro, accumulation) if timing is not None else None
    basis = timing.basis if timing is not None else ""
    past = matching_run(past_runs, strategy, checkpointing, micro, world, precision)
    if past is not None:
        calibrated, said = _calibrated(t, past, timing, strategy, checkpointing, micro, accumulation, world)
        if calibrated is not None:
            t, basis = calibrated, said + (f"; {basis}" if basis else "")
    if t is None:
        why = untimed or (timing.why_untimed(strategy) if timing is not None else "unknown")
        return TimeEstimate(basis="unknown", unknown={f: why for f in figures})
    unknown: dict[str, str] = {}
    split = {"micro_step_s": t.micro_step_s, "optimizer_step_s": t.optimizer_step_s,
             "communication_s": t.communication_s}
    for name, v in split.items():
        if math.isnan(v):
            why = untimed or (timing.why_untimed(strategy) if timing is not None else "unknown")
            unknown[name] = f"not predicted ({why}): only the run's samples/s is known"
    tokens = None if tokens_per_sample is None else t.samples_per_s * tokens_per_sample
    if tokens is None:
        unknown["tokens_per_s"] = "no sequence length known (a sample input of token ids, int[N], gives one)"
    total = None if not total_steps else total_steps * t.step_s
    if total is None:
        unknown["total_s"] = "the number of steps is unknown (set training.max_steps, or data.num_samples and epochs)"
    speedup, speedup_basis = _speedup(timing, strategy, checkpointing, micro, accumulation, world)
    if speedup is None:
        unknown["speedup_vs_1_gpu"] = _no_speedup(timing, untimed, on_gpu)
    comm = f"; communication over {timing.link.basis}" if timing and timing.link is not None and world > 1 else ""

    def r(v, n):
        return None if v is None or math.isnan(v) else round(v, n)

    return TimeEstimate(micro_step_s=r(t.micro_step_s, 6), optimizer_step_s=r(t.optimizer_step_s, 6),
                        communication_s=r(t.communication_s, 6), step_s=round(t.step_s, 6),
                        samples_per_s=round(t.samples_per_s, 3), tokens_per_s=r(tokens, 1), total_s=r(total, 2),
                        speedup_vs_1_gpu=r(speedup, 3), basis=basis + comm, speedup_basis=speedup_basis,
                        unknown=unknown)


def _no_speedup(timing: Timing | None, untimed: str, on_gpu: bool) -> str:
    """Why the speedup over one GPU is unknown."""
    if not on_gpu:
        return "no GPU: a CPU plan"
    if timing is None:
        return untimed or "unknown"
    if timing.gpu is None:
        return "no GPU: a CPU plan"
    return "the one-GPU step could not be predicted"


def _speedup(timing: Timing | None, strategy, checkpointing: bool, micro: int, accumulation: int,
             world: int) -> tuple[float | None, str | None]:
    """This plan's samples/s over the fastest one GPU reaches with the same global batch (micro-batch x the
    accumulation times the world), by the same model on the same compute line: DDP's plain step, or this engine's
    own line on one GPU with the host's every core. Never above the GPU count, by construction: one GPU runs the
    same micro-steps one after another, the whole optimizer step at most N times this plan's share of it, and no
    communication."""
    from autotune.planner.memory import STRATEGIES

    if timing is None or timing.gpu is None or timing.link is None:
        return None, None
    model = timing.time(strategy, checkpointing, micro, accumulation)
    one_acc = max(1, round(accumulation * world))
    one = dataclasses.replace(timing, world=1, link=Link(None, timing.link.pcie_bytes_s, "one process"),
                              cores_per_rank=timing.cores_per_rank * max(1, world))
    engines = [STRATEGIES["ddp"]] + ([strategy] if strategy.name != "ddp" else [])
    options = [(s, one.time(s, checkpointing, micro, one_acc)) for s in engines]
    options = [(s, t) for s, t in options if t is not None]
    if model is None or not options:
        return None, None
    base, t1 = max(options, key=lambda o: o[1].samples_per_s)
    how = "DDP's plain step" if base.name == "ddp" else f"{base.label} on one GPU with the host's cores"
    return model.samples_per_s / t1.samples_per_s, (
        f"against one {timing.gpu.row.name} at micro-batch {micro} x accumulation {one_acc} (one process, {how}: the "
        f"faster of DDP and this engine there), by the same model on the same compute line")
