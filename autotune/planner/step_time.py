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
(``link_for``): NVLink or PCIe inside a node, InfiniBand or TCP between nodes; HSDP's collectives run in groups
(``ring_s``): its gathers and reductions among a node's ranks over the link inside it, and one all-reduce of the
gradient shards across the nodes over the link between them. An overlapped collective costs
what the backward cannot hide, and at least its last bucket. These lines are not calibrated (no multi-GPU
recording exists yet): their constants carry their sources below.
"""

from __future__ import annotations

from dataclasses import dataclass

from autotune.planner.gpus import GPUSpec
from autotune.planner.model_facts import PhaseWork, StepWork
from autotune.profiles import HardwareProfile


@dataclass(frozen=True)
class Calibration:
    """Fitted constants (fractions of the GPU table's peaks, and the host's time per kernel)."""

    matmul: float  # of the dense tensor-core peak, for matmuls
    attention: float  # for fused attention kernels
    conv: float  # for convolutions
    memory: float  # of the memory bandwidth, for memory-bound ops
    optimizer_memory: float  # of the memory bandwidth, for the optimizer's foreach ops
    kernel_s: float  # host time to dispatch one op (the floor of a step at small micro-batches)


CALIBRATION = Calibration(matmul=0.74, attention=1.0, conv=0.0864, memory=0.539, optimizer_memory=0.316,
                          kernel_s=3.69e-05)
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
    # which ranks take part: "all" (every rank, over the job's slowest link), "node" (a node's ranks, over the link
    # inside it: HSDP's shard group), "nodes" (one rank a node, each on its node's share: HSDP's replicas)
    group: str = "all"


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
    # FSDP2 (fully_shard per block, bf16 weights gathered, gradients reduce-scattered in fp32: reduce_dtype): each
    # micro-step gathers every unit for the forward and, resharded after it, again for the backward, and
    # reduce-scatters the unit's gradients as its backward ends, all on their own stream, overlapped
    "fsdp": EngineLine((C("all_gather", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                        C("reduce_scatter", "grads", "micro", True)), grad_bytes=4),
    # without resharding after forward: one all-gather a micro-step (the weights stay gathered for the backward)
    "fsdp_no_reshard": EngineLine((C("all_gather", "weights", "micro", True),
                                   C("reduce_scatter", "grads", "micro", True)), grad_bytes=4),
    # CPUOffloadPolicy: the fp32 shard to the GPU for each gather, its fp32 gradient shard back, torch's AdamW on
    # the host (counted at DeepSpeed's CPU Adam rate, which it does not reach: a lower bound on its time)
    "fsdp_offload": EngineLine((C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                C("all_gather", "weights", "micro", True), C("reduce_scatter", "grads", "micro", True),
                                C("to_host", "grads", "micro", True)), grad_bytes=4, weight_bytes=2,
                               cpu_optimizer=True),
    # HSDP (FSDP2 on a 2-D mesh: sharded in each node, replicated across nodes): the gathers and the reduce-scatter
    # among a node's ranks; each node's gradient shards all-reduced across the nodes once a step (the runtime skips
    # the all-reduce on the other micro-steps: FSDPModule.set_requires_all_reduce), during the last backward
    "hsdp": EngineLine((C("all_gather", "weights", "micro", True, "node"),
                        C("all_gather", "weights", "micro", True, "node"),
                        C("reduce_scatter", "grads", "micro", True, "node"),
                        C("all_reduce", "grads", "step", True, "nodes")), grad_bytes=4),
    "hsdp_no_reshard": EngineLine((C("all_gather", "weights", "micro", True, "node"),
                                   C("reduce_scatter", "grads", "micro", True, "node"),
                                   C("all_reduce", "grads", "step", True, "nodes")), grad_bytes=4),
}
RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
        "all_gather": lambda n: (n - 1) / n}


@dataclass(frozen=True)
class Link:
    """The bandwidth a rank's collectives get (bytes/s, NCCL's bus bandwidth) and PCIe to the host."""

    collective_bytes_s: float | None  # None: one process, nothing to exchange
    pcie_bytes_s: float
    basis: str
    inside_bytes_s: float | None = None  # the link among a node's GPUs (HSDP's shard group)
    between_bytes_s: float | None = None  # the link between nodes (HSDP's replicas); None on one node
    num_nodes: int = 1


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
        return Link(inside, pcie, f"{how} x {LINK_EFFICIENCY} between the {nproc} GPUs", inside_bytes_s=inside)
    ib = len(hw.infiniband or ())
    if ib:
        between = min(ib, nproc) * IB_ADAPTER_BYTES_S * LINK_EFFICIENCY
        why = f"InfiniBand, {min(ib, nproc)} adapter(s) x {IB_ADAPTER_BYTES_S / 1e9:.0f} GB/s"
    else:
        between = TCP_BYTES_S * LINK_EFFICIENCY
        why = "no InfiniBand: TCP sockets, 10 GbE assumed (the profile does not say the Ethernet speed)"
    return Link(min(inside, between), pcie, f"{why} between {num_nodes} nodes ({how} inside each) x {LINK_EFFICIENCY}",
                inside_bytes_s=inside, between_bytes_s=between, num_nodes=num_nodes)


def _group(c: Collective, world: int, num_nodes: int) -> int:
    """The ranks in ``c``'s ring: every rank; a node's ranks; or one rank a node (HSDP's replicas: each of a node's
    ranks all-reduces its own shard with its peers, so the node's link carries the node's whole gradient, the
    ``size`` counted)."""
    nodes = max(1, num_nodes)
    return {"node": max(1, world // nodes), "nodes": nodes}.get(c.group, world)


def ring_s(c: Collective, size: float, world: int, link: Link) -> tuple[float, str] | None:
    """(seconds, name) of ring collective ``c`` of ``size`` bytes among its group's ranks (``Collective.group``),
    over the link its group crosses; None where it moves nothing (one rank in its group, or no link)."""
    ranks = _group(c, world, link.num_nodes)
    if c.group == "node":
        bandwidth = link.inside_bytes_s or link.collective_bytes_s
    elif c.group == "nodes":
        bandwidth = link.between_bytes_s or link.collective_bytes_s
    else:
        bandwidth = link.collective_bytes_s
    if bandwidth is None or ranks <= 1:
        return None
    name = c.op.replace("_", "-") + {"node": " in each node", "nodes": " across nodes"}.get(c.group, "")
    return size * RING[c.op](ranks) / bandwidth, name


def bytes_between_nodes(strategy: str, num_parameters: int, world: int, num_nodes: int) -> tuple[float, float]:
    """(every micro-step, once an optimizer step) bytes each node sends over the link between nodes under
    ``strategy``'s ring collectives: a ring over every rank of several nodes crosses between them, its per-rank
    share (``RING``) on each crossing; a node's own group never does; HSDP's all-reduce across nodes carries the
    node's whole gradient (each rank its shard)."""
    if num_nodes <= 1:
        return 0.0, 0.0
    line = ENGINES.get(strategy, ENGINES["ddp"])
    out = {"micro": 0.0, "step": 0.0}
    for c in line.collectives:
        if c.op not in RING or c.group == "node":
            continue
        size = num_parameters * (line.grad_bytes if c.what == "grads" else line.weight_bytes)
        out[c.when] += size * RING[c.op](_group(c, world, num_nodes))
    return out["micro"], out["step"]


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
            ring = ring_s(c, size, n, link)
            if ring is None:
                continue
            secs, name = ring
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
