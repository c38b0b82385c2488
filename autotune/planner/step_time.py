"""How long a training step takes (pure arithmetic; no torch): the step-time model the plan chooses by.

**Compute.** The trace counts each phase of a step as CUDA runs it (``autotune.measure.cuda_trace.WorkCount``:
FLOPs, bytes read and written, kernels, in rows of equal arithmetic intensity). Each row takes its roofline on
the GPU of the table (``configs/gpus.yaml``): ``max(FLOPs / (peak x efficiency of its kind), bytes / (bandwidth
x memory efficiency))``; rows without FLOPs are memory-bound. A phase is never faster than the host can launch
its kernels (eager PyTorch dispatches each op from Python: ``kernels x kernel_s``), so a micro-step (forward +
backward, with any recomputed forward) is ``max(GPU time, host time)``; the optimizer step likewise. The
efficiencies and ``kernel_s`` are fitted (``CALIBRATION``; ``bench/fit_step_time.py``) on the H100 recordings of
the three shared models (GPT-2 small, BERT-base, ResNet-50: ../shared/gpu-truth) and nothing else.

**Communication**, per engine as data (``ENGINES``: one row per strategy; a new engine is one more row): which
collectives move gradients or weights, per micro-step or per optimizer step, overlapped with backward or not,
and what offload moves over PCIe and runs on the host's cores. A ring collective moves ``2 (n-1)/n`` (all-reduce)
or ``(n-1)/n`` (reduce-scatter, all-gather) of its bytes per rank over the slowest link of the job
(``link_for``): NVLink or PCIe inside a node, InfiniBand or TCP between nodes. An overlapped collective costs
what the backward cannot hide, and at least its last bucket. These lines are not calibrated (no multi-GPU
recording exists yet): their constants carry their sources below.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from autotune.planner.gpus import GPUSpec
from autotune.planner.model_facts import MeasuredSteps, PhaseWork, StepWork, WorkModel
from autotune.profiles import HardwareProfile

if TYPE_CHECKING:
    from autotune.plan import TimeEstimate


@dataclass(frozen=True)
class Calibration:
    """Fitted constants (fractions of the GPU table's peaks, and the host's time per kernel)."""

    matmul: float  # of the dense tensor-core peak, for matmuls
    attention: float  # for fused attention kernels
    conv: float  # for convolutions
    memory: float  # of the memory bandwidth, for memory-bound ops
    optimizer_memory: float  # of the memory bandwidth, for the optimizer's foreach ops
    kernel_s: float  # host time to dispatch one op (the floor of a step at small micro-batches)


CALIBRATION = Calibration(matmul=0.74, attention=1.0, conv=0.0864, memory=0.539, optimizer_memory=0.316, kernel_s=3.69e-05)
CALIBRATION_BASIS = ("roofline per op on the GPU table, efficiencies and kernel launch time fitted on the H100 "
                     "recordings of GPT-2 small, BERT-base and ResNet-50 (bench/fit_step_time.py)")

# -- communication: sources for the constants -------------------------------------------------------------
# NCCL's bus bandwidth reaches about 80 % of a link's (nccl-tests' busbw on NVLink and PCIe systems).
LINK_EFFICIENCY = 0.8
# InfiniBand HDR, 200 Gb/s = 25 GB/s per adapter (NVIDIA ConnectX-6); NCCL uses one ring per adapter.
IB_ADAPTER_BYTES_S = 25e9
# Without InfiniBand NCCL uses TCP sockets; the profile does not say the Ethernet speed: 10 GbE assumed.
TCP_BYTES_S = 1.25e9
# DeepSpeed's CPU Adam: about 1e8 parameters per second per core (ZeRO-Offload, Ren et al. 2021: 1B parameters
# updated in about 0.2 s on a 2 x 24-core host), AVX-512 vectorised.
CPU_ADAM_PARAMS_PER_CORE_S = 1e8
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default: the last bucket is reduced after backward
DEEPSPEED_BUCKETS = 10  # autotune's DeepSpeed buckets hold a tenth of the model (planner.memory.bucket_size)


@dataclass(frozen=True)
class Collective:
    op: str  # "all_reduce" | "reduce_scatter" | "all_gather" | "to_host" | "from_host"
    what: str  # "grads" | "weights": the full model's gradients or weights, in the engine's bytes
    when: str  # "micro" (every micro-step) | "step" (once per optimizer step)
    overlapped: bool  # hidden behind the backward as far as it lasts


@dataclass(frozen=True)
class EngineLine:
    """What one strategy adds to a step beyond its compute."""

    collectives: tuple[Collective, ...] = ()
    grad_bytes: int = 2  # bytes per gradient element communicated (DeepSpeed bf16/fp16: 2; DDP with AMP: fp32 4)
    weight_bytes: int = 2
    cpu_optimizer: bool = False  # the optimizer runs on the host (offload): CPU Adam on its share of the cores
    sharded: bool = True  # PCIe traffic and host work are per rank's partition (1/n of the model)


C = Collective
ENGINES: dict[str, EngineLine] = {
    # torch DDP: gradients all-reduced once per optimizer step (no_sync between), bucket by bucket during backward
    "ddp": EngineLine((C("all_reduce", "grads", "step", True),), grad_bytes=4, weight_bytes=4, sharded=False),
    # ZeRO-1: gradients whole, reduce-scattered at the boundary; updated partitions all-gathered after the step
    "zero1": EngineLine((C("reduce_scatter", "grads", "step", True), C("all_gather", "weights", "step", False))),
    "zero0": EngineLine((C("all_reduce", "grads", "step", True),), sharded=False),
    # ZeRO-2: gradients reduce-scattered every micro-step (no full gradient is kept), overlapped (overlap_comm)
    "zero2": EngineLine((C("reduce_scatter", "grads", "micro", True), C("all_gather", "weights", "step", False))),
    # ZeRO-2 + optimizer offload: also each micro-step's gradient partition to the host (fp32), the updated bf16
    # partition back after CPU Adam
    "zero2_offload": EngineLine((C("reduce_scatter", "grads", "micro", True), C("to_host", "grads", "micro", True),
                                 C("from_host", "weights", "step", False), C("all_gather", "weights", "step", False)),
                                cpu_optimizer=True),
    # ZeRO-3: weights all-gathered for the forward and again for the backward, gradients reduce-scattered
    "zero3": EngineLine((C("all_gather", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                         C("reduce_scatter", "grads", "micro", True))),
    # ZeRO-3 + parameter and optimizer offload: the partitions also cross PCIe for each use
    "zero3_offload": EngineLine((C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                 C("all_gather", "weights", "micro", True), C("reduce_scatter", "grads", "micro", True),
                                 C("to_host", "grads", "micro", True)), cpu_optimizer=True),
}
RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
        "all_gather": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class Link:
    """The bandwidth a rank's collectives get (bytes/s, NCCL's bus bandwidth) and PCIe to the host."""

    collective_bytes_s: float | None  # None: one process, nothing to exchange
    pcie_bytes_s: float
    basis: str


def link_for(hw: HardwareProfile, gpu: GPUSpec, nproc: int, num_nodes: int) -> Link:
    """The slowest link of the job: NVLink or PCIe inside a node, InfiniBand or TCP between nodes."""
    pcie = gpu.pcie_gbps * 1e9 * LINK_EFFICIENCY
    if nproc * num_nodes <= 1:
        return Link(None, pcie, "one process: no collectives")
    nv = gpu.nvlink_bytes_s
    if hw.gpus.interconnect == "nvlink" and nv:
        inside, how = nv * LINK_EFFICIENCY, f"NVLink {nv / 1e9:.0f} GB/s"
    else:
        inside, how = pcie, f"PCIe {gpu.pcie_gbps:.0f} GB/s"
    if num_nodes == 1:
        return Link(inside, pcie, f"{how} x {LINK_EFFICIENCY} between the {nproc} GPUs")
    ib = len(hw.infiniband or ())
    if ib:
        between = min(ib, nproc) * IB_ADAPTER_BYTES_S * LINK_EFFICIENCY
        why = f"InfiniBand, {min(ib, nproc)} adapter(s) x {IB_ADAPTER_BYTES_S / 1e9:.0f} GB/s"
    else:
        between = TCP_BYTES_S * LINK_EFFICIENCY
        why = "no InfiniBand: TCP sockets, 10 GbE assumed (the profile does not say the Ethernet speed)"
    return Link(min(inside, between), pcie, f"{why} between {num_nodes} nodes ({how} inside each) x {LINK_EFFICIENCY}")


@dataclass(frozen=True)
class StepTime:
    micro_step_s: float  # forward + backward of one micro-batch (with any recomputed forward)
    optimizer_step_s: float  # the optimizer step (on the GPU, or CPU Adam under offload)
    communication_s: float  # what collectives and PCIe add to an optimizer step, not hidden behind backward
    step_s: float  # one optimizer step: accumulation x micro-step + optimizer + communication
    samples_per_s: float  # the global batch / step_s
    parts: tuple[tuple[str, float], ...] = ()  # communication by kind, seconds per optimizer step

    def describe(self) -> str:
        extra = ", ".join(f"{name} {secs:.2g} s a step" for name, secs in self.parts if secs >= 0.0005)
        return extra


def phase_gpu_s(work: PhaseWork, gpu: GPUSpec, precision: str, tf32: bool, cal: Calibration = CALIBRATION,
                memory_efficiency: float | None = None) -> float:
    """The GPU's time for one phase: the roofline of each row."""
    peak, bw = gpu.peak_flops(precision, tf32), gpu.memory_bytes_s * (memory_efficiency or cal.memory)
    eff = {"matmul": cal.matmul, "attention": cal.attention, "conv": cal.conv}
    total = 0.0
    for kind, _bin, flops, nbytes, _k in work.rows:
        mem = nbytes / bw
        total += mem if kind not in eff or not flops else max(flops / (peak * eff[kind]), mem)
    return total


def compute_s(step: StepWork, gpu: GPUSpec, precision: str, tf32: bool, cal: Calibration = CALIBRATION
              ) -> tuple[float, float, float]:
    """(micro-step, optimizer step, the backward's GPU time that collectives can hide behind), seconds."""
    backward = phase_gpu_s(step.backward, gpu, precision, tf32, cal)
    gpu_s = phase_gpu_s(step.forward, gpu, precision, tf32, cal) + backward
    host_s = (step.forward.kernels + step.backward.kernels) * cal.kernel_s
    opt = max(phase_gpu_s(step.optimizer, gpu, precision, tf32, cal, cal.optimizer_memory),
              step.optimizer.kernels * cal.kernel_s)
    return max(gpu_s, host_s), opt, backward


def step_time(step: StepWork, *, strategy: str, micro: int, accumulation: int, world: int, gpu: GPUSpec,
              link: Link, precision: str, tf32: bool, num_parameters: int, host_cores_per_rank: float,
              cal: Calibration = CALIBRATION, scale: tuple[float, float] = (1.0, 1.0)) -> StepTime:
    """One optimizer step of ``strategy`` at ``micro`` x ``accumulation`` on ``world`` ranks. ``scale``: the
    compute's (micro-step, optimizer step) times measured on the GPU over the model's, where a probe timed them."""
    micro_s, opt_s, hide_s = compute_s(step, gpu, precision, tf32, cal)
    micro_s, opt_s, hide_s = micro_s * scale[0], opt_s * scale[1], hide_s * scale[0]
    line = ENGINES.get(strategy, ENGINES["ddp"])
    n = max(1, world)
    share = 1 / n if line.sharded else 1.0
    parts: dict[str, float] = {}
    for c in line.collectives:
        size = num_parameters * (line.grad_bytes if c.what == "grads" else line.weight_bytes)
        if c.op in RING:
            if link.collective_bytes_s is None or n == 1:
                continue
            secs, name = size * RING[c.op](n) / link.collective_bytes_s, c.op.replace("_", "-")
        else:  # offload: the rank's partition over PCIe (gradients go to the host in fp32)
            size = num_parameters * share * (4 if c.what == "grads" else line.weight_bytes)
            secs, name = size / link.pcie_bytes_s, "PCIe"
        if c.overlapped:  # hidden behind this micro-step's backward, all but the last bucket
            tail = secs * (min(1.0, DDP_BUCKET_BYTES / max(size, 1)) if strategy == "ddp" else 1 / DEEPSPEED_BUCKETS)
            secs = max(secs - hide_s, tail)
        parts[name] = parts.get(name, 0.0) + secs * (accumulation if c.when == "micro" else 1)
    if line.cpu_optimizer:
        opt_s = num_parameters * share / (CPU_ADAM_PARAMS_PER_CORE_S * max(1.0, host_cores_per_rank))
        parts["CPU Adam"] = opt_s
    comm = sum(v for k, v in parts.items() if k != "CPU Adam")
    step_s = accumulation * micro_s + opt_s + comm
    return StepTime(micro_s, opt_s, comm, step_s, micro * accumulation * n / step_s,
                    tuple((k, v) for k, v in parts.items()))


# -- a plan's timing: the model bound to the hardware, the model's facts and the plan so far ---------------------


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

    def time(self, strategy, checkpointing: bool, micro: int, accumulation: int) -> StepTime | None:
        if self.measured is not None and self.gpu is None:  # timed on this CPU: torch's step, as the ranks ran it
            fits = strategy.backend != "deepspeed" and self.measured.ranks == self.world
            return self._measured(micro, accumulation) if fits else None
        half = self.precision in ("bf16", "fp16")
        line = self.work.line(half, checkpointing, strategy.backend == "deepspeed") if self.work else None
        if line is None or self.gpu is None or self.link is None:
            return None
        return step_time(line.at(micro), strategy=strategy.name, micro=micro, accumulation=accumulation,
                         world=self.world, gpu=self.gpu, link=self.link, precision=self.precision, tf32=self.tf32,
                         num_parameters=self.num_parameters, host_cores_per_rank=self.cores_per_rank,
                         scale=self._probed(half, micro))

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
                          "or training.model with training.sample_input), without DeepSpeed, unless --no_probe")
        return Timing(basis=m.basis, num_parameters=facts.num_parameters, world=world, measured=m,
                      precision=precision), ""
    if facts.work is None:
        return None, ("the model's work is not counted (a model autotune cannot trace, or a script of unknown size): "
                      "give training.model and training.sample_input")
    from autotune.planner.gpus import spec_for

    gpu = spec_for(devs[0])
    if gpu is None:
        return None, (f"{devs[0].name or 'this GPU'} is not in the GPU table (configs/gpus.yaml): unknown, so the "
                      "plan keeps the memory rule")
    cores = max(1.0, hw.cpu.effective_cores / max(1, nproc))
    link = link_for(hw, gpu, nproc, num_nodes)
    basis = f"model: {facts.work.source} on {gpu.basis}; {CALIBRATION_BASIS}"
    probed = facts.measured_steps
    if probed is not None:  # the compute as GPU 0 ran it; the other options' by the model, scaled alike
        basis = f"{probed.basis}; other options and communication by the {basis}"
    return Timing(basis=basis, num_parameters=facts.num_parameters, world=world, precision=precision, tf32=tf32,
                  work=facts.work, gpu=gpu, link=link, cores_per_rank=cores, measured=probed), ""


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
                  past_runs: tuple = ()) -> TimeEstimate:
    """The plan's ``time_estimate``: each figure, or null with its reason; a past run with the same settings
    calibrates it (``past_runs``: the model's, on this kind of machine, newest first)."""
    import dataclasses
    import math

    from autotune.plan import TimeEstimate
    from autotune.planner.memory import STRATEGIES

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
            unknown[name] = f"not predicted ({untimed}): only the run's samples/s is known"
    tokens = None if tokens_per_sample is None else t.samples_per_s * tokens_per_sample
    if tokens is None:
        unknown["tokens_per_s"] = "no sequence length known (a sample input of token ids, int[N], gives one)"
    total = None if not total_steps else total_steps * t.step_s
    if total is None:
        unknown["total_s"] = "the number of steps is unknown (set training.max_steps, or data.num_samples and epochs)"
    speedup, speedup_basis = None, None
    if timing is not None and timing.gpu is not None and timing.link is not None:
        one_acc = max(1, round(accumulation * world))
        one = dataclasses.replace(timing, world=1, link=Link(None, timing.link.pcie_bytes_s, "one process"))
        t1 = one.time(STRATEGIES["ddp"], checkpointing, micro, one_acc)
        model = timing.time(strategy, checkpointing, micro, accumulation)
        if t1 is not None and model is not None:
            speedup = model.samples_per_s / t1.samples_per_s
            speedup_basis = (f"against one {timing.gpu.row.name} at micro-batch {micro} x accumulation {one_acc} "
                             f"(one process), by the same model")
    if speedup is None:
        unknown["speedup_vs_1_gpu"] = (untimed or "unknown" if timing is None else "no GPU: a CPU plan"
                                       if timing.gpu is None else "the one-GPU step could not be predicted")
    comm = f"; communication over {timing.link.basis}" if timing and timing.link is not None and world > 1 else ""

    def r(v, n):
        return None if v is None or math.isnan(v) else round(v, n)

    return TimeEstimate(micro_step_s=r(t.micro_step_s, 6), optimizer_step_s=r(t.optimizer_step_s, 6),
                        communication_s=r(t.communication_s, 6), step_s=round(t.step_s, 6),
                        samples_per_s=round(t.samples_per_s, 3), tokens_per_s=r(tokens, 1), total_s=r(total, 2),
                        speedup_vs_1_gpu=r(speedup, 3), basis=basis + comm, speedup_basis=speedup_basis,
                        unknown=unknown)
