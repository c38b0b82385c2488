"""How long a training step takes (pure arithmetic; no torch): the step-time model the plan chooses by.

**Compute.** The trace counts each phase of a step as CUDA runs it (``autotune.measure.cuda_trace.WorkCount``:
FLOPs, bytes read and written, kernels, in rows of equal arithmetic intensity). Each row takes its roofline on
the GPU of the table (``configs/gpus.yaml``): ``max(FLOPs / (peak x efficiency of its kind), bytes / (bandwidth
x memory efficiency))``; rows without FLOPs are memory-bound. The efficiencies are the GPU's own (``gpus.Efficiency``:
per kind of op, attention's by its FLOPs per byte, each set with its evidence; a GPU without evidence gets the
conservative set and says so). A phase is never faster than the host can launch its kernels (eager PyTorch
dispatches each op from Python: ``kernels x kernel_s``), so a micro-step (forward + backward, with any recomputed
forward) is ``max(GPU time, host time)``. Every engine is timed on the same compute line (the step as the trace
ran it); what differs between engines is what they add to it, below.

**The optimizer step** updates what the rank holds: DDP all of it, ZeRO-1/2/3 and FSDP2 their 1/N shard (the
kernels are as many, each over 1/N of the elements: the host floor stays); under offload the host runs it, at the
rate of what runs it (DeepSpeed's CPU Adam, or torch's AdamW for FSDP2's CPUOffloadPolicy).

**Communication**, per engine as data (``ENGINES``: one row per strategy; a new engine is one more row): which
collectives move gradients or weights, per micro-step or per optimizer step, overlapped with backward or not, and what
offload moves over PCIe. A ring collective moves ``2 (n-1)/n`` (all-reduce) or ``(n-1)/n`` (reduce-scatter, all-
gather) of its bytes per rank over the slowest link of the job (``link_for``: NVLink or PCIe inside a node, InfiniBand
at the adapters' own rate, or TCP, between nodes), plus NCCL's latency per call and ring step. HSDP's collectives run
in groups (``Collective.group``): its gathers and reductions among a node's ranks over the link inside it, and one
all-reduce of the gradient shards across the nodes over the link between them. The overlapped transfers of a micro-
step share one backward's worth of hiding (``exposed_s``): what exceeds it costs in full, and the last bucket of each
never hides. These lines are not calibrated on a multi-GPU recording (none exists here): their constants carry their
sources below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from autotune.planner.gpus import Efficiency, GPUSpec
from autotune.planner.step_work import PhaseWork, StepWork
from autotune.profiles import HardwareProfile

# -- communication and the host: sources for the constants ------------------------------------------------------
# NCCL's bus bandwidth reaches about 80 % of a link's (nccl-tests' busbw on NVLink and PCIe systems).
LINK_EFFICIENCY = 0.8
# An InfiniBand adapter whose rate the profile does not give counts as HDR, 200 Gb/s (NVIDIA ConnectX-6); NCCL
# runs one ring per adapter, so a node's bandwidth between nodes is its adapters' (up to one per GPU) together.
IB_DEFAULT_GBPS = 200.0
# Without InfiniBand NCCL uses TCP sockets; the profile does not say the Ethernet speed: 10 GbE assumed.
TCP_BYTES_S = 1.25e9
# NCCL's own latency model (NVIDIA/nccl src/graph/tuning.cc, ring algorithm, Simple protocol): a base latency per
# call and one per ring step, larger across the network than inside a node; a ring takes n-1 steps (all-gather,
# reduce-scatter) or 2 (n-1) (all-reduce).
NCCL_CALL_S = 8.4e-6
NCCL_STEP_S = {"inside": 3.4e-6, "network": 14e-6}
# The host's optimizer under offload. DeepSpeed's CPU Adam: about 1e8 parameters per second per core
# (ZeRO-Offload, Ren et al. 2021: 1B parameters updated in about 0.2 s on a 2 x 24-core host), AVX-512 vectorised.
# torch's AdamW on the host (FSDP2's CPUOffloadPolicy steps the fp32 shard with the user's torch optimizer): the
# same paper measures CPU Adam 5.1-6.5x faster than PyTorch's CPU Adam (sec. 4.1, table 3): 1e8 / 5.8 a core.
HOST_ADAM_PARAMS_PER_CORE_S = {"deepspeed": 1e8, "torch": 1e8 / 5.8}
HOST_ADAM_BASIS = {"deepspeed": "DeepSpeed's CPU Adam at about 1e8 parameters/s a core (ZeRO-Offload, Ren et al. "
                                "2021)",
                   "torch": "torch's AdamW on the host at about 1.7e7 parameters/s a core (ZeRO-Offload, Ren et al. "
                            "2021: 5.1-6.5x slower than DeepSpeed's CPU Adam)"}
DDP_BUCKET_BYTES = 25 * 2**20  # torch DDP's bucket_cap_mb default: the last bucket is reduced after backward
DEEPSPEED_BUCKETS = 10  # autotune's DeepSpeed buckets hold a tenth of the model (planner.memory.bucket_size)


@dataclass(frozen=True)
class Collective:
    op: str  # "all_reduce" | "reduce_scatter" | "all_gather" | "to_host" | "from_host"
    what: str  # "grads" | "weights": the full model's gradients or weights, in the engine's bytes
    when: str  # "micro" (every micro-step) | "step" (once per optimizer step)
    overlapped: bool  # hidden behind the backward as far as it lasts (shared with the micro-step's others)
    # which ranks take part: "all" (every rank, over the job's slowest link), "node" (a node's ranks, over the link
    # inside it: HSDP's shard group), "nodes" (one rank a node, each on its node's share: HSDP's replicas)
    group: str = "all"


@dataclass(frozen=True)
class EngineLine:
    """What one strategy adds to a step beyond its compute."""

    collectives: tuple[Collective, ...] = ()
    grad_bytes: int = 2  # bytes per gradient element communicated (DeepSpeed bf16/fp16: 2; DDP with AMP: fp32 4)
    weight_bytes: int = 2
    cpu_optimizer: bool = False  # the optimizer runs on the host (offload), on its share of the cores
    sharded: bool = True  # optimizer state, PCIe traffic and host work are per rank's partition (1/n of the model)
    host_adam: str = "deepspeed"  # what runs the host's optimizer: "deepspeed" (CPU Adam) | "torch" (AdamW)
    per_unit: bool = False  # its collectives are issued per module (FSDP2's units, ZeRO-3's), not per bucket


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
                         C("reduce_scatter", "grads", "micro", True)), per_unit=True),
    # ZeRO-3 + parameter and optimizer offload: the partitions also cross PCIe for each use
    "zero3_offload": EngineLine((C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                 C("all_gather", "weights", "micro", True), C("reduce_scatter", "grads", "micro", True),
                                 C("to_host", "grads", "micro", True)), cpu_optimizer=True, per_unit=True),
    # FSDP2 (fully_shard per block, bf16 weights gathered, gradients reduce-scattered in fp32: reduce_dtype): each
    # micro-step gathers every unit for the forward and, resharded after it, again for the backward, and
    # reduce-scatters the unit's gradients as its backward ends, all on their own stream, overlapped
    "fsdp": EngineLine((C("all_gather", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                        C("reduce_scatter", "grads", "micro", True)), grad_bytes=4, per_unit=True),
    # without resharding after forward: one all-gather a micro-step (the weights stay gathered for the backward)
    "fsdp_no_reshard": EngineLine((C("all_gather", "weights", "micro", True),
                                   C("reduce_scatter", "grads", "micro", True)), grad_bytes=4, per_unit=True),
    # CPUOffloadPolicy: the fp32 shard to the GPU for each gather, its fp32 gradient shard back, torch's AdamW on
    # the host at its own rate
    "fsdp_offload": EngineLine((C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                C("all_gather", "weights", "micro", True), C("reduce_scatter", "grads", "micro", True),
                                C("to_host", "grads", "micro", True)), grad_bytes=4, weight_bytes=2,
                               cpu_optimizer=True, host_adam="torch", per_unit=True),
    # HSDP (FSDP2 on a 2-D mesh: sharded in each node, replicated across nodes): the gathers and the reduce-scatter
    # among a node's ranks; each node's gradient shards all-reduced across the nodes once a step (the runtime skips
    # the all-reduce on the other micro-steps: FSDPModule.set_requires_all_reduce), during the last backward
    "hsdp": EngineLine((C("all_gather", "weights", "micro", True, "node"),
                        C("all_gather", "weights", "micro", True, "node"),
                        C("reduce_scatter", "grads", "micro", True, "node"),
                        C("all_reduce", "grads", "step", True, "nodes")), grad_bytes=4, per_unit=True),
    "hsdp_no_reshard": EngineLine((C("all_gather", "weights", "micro", True, "node"),
                                   C("reduce_scatter", "grads", "micro", True, "node"),
                                   C("all_reduce", "grads", "step", True, "nodes")), grad_bytes=4, per_unit=True),
}
RING = {"all_reduce": lambda n: 2 * (n - 1) / n, "reduce_scatter": lambda n: (n - 1) / n,
        "all_gather": lambda n: (n - 1) / n}
RING_STEPS = {"all_reduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1, "all_gather": lambda n: n - 1}


@dataclass(frozen=True)
class Link:
    """The bandwidth a rank's collectives get (bytes/s, NCCL's bus bandwidth), PCIe to the host, and NCCL's
    latency per ring step over the slowest hop."""

    collective_bytes_s: float | None  # None: one process, nothing to exchange
    pcie_bytes_s: float
    basis: str
    step_latency_s: float = NCCL_STEP_S["inside"]
    inside_bytes_s: float | None = None  # the link among a node's GPUs (HSDP's shard group)
    between_bytes_s: float | None = None  # the link between nodes (HSDP's replicas); None on one node
    num_nodes: int = 1


def infiniband_bytes_s(hw: HardwareProfile) -> tuple[float, str]:
    """One adapter's rate (bytes/s) as the profile read it from the adapter, else HDR's, and how it is known."""
    gbps = hw.infiniband_rate_gbps
    if gbps:
        return gbps / 8 * 1e9, f"{gbps:g} Gb/s as the adapter reports"
    return IB_DEFAULT_GBPS / 8 * 1e9, f"{IB_DEFAULT_GBPS:g} Gb/s (HDR) assumed: the profile does not give the rate"


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
        rate, said = infiniband_bytes_s(hw)
        between = min(ib, nproc) * rate * LINK_EFFICIENCY
        why = f"InfiniBand, {min(ib, nproc)} adapter(s) x {said}"
    else:
        between = TCP_BYTES_S * LINK_EFFICIENCY
        why = "no InfiniBand: TCP sockets, 10 GbE assumed (the profile does not say the Ethernet speed)"
    return Link(min(inside, between), pcie, f"{why} between {num_nodes} nodes ({how} inside each) x {LINK_EFFICIENCY}",
                NCCL_STEP_S["network"], inside_bytes_s=inside, between_bytes_s=between, num_nodes=num_nodes)


def _group(c: Collective, world: int, num_nodes: int) -> int:
    """The ranks in ``c``'s ring: every rank; a node's ranks; or one rank a node (HSDP's replicas: each of a node's
    ranks all-reduces its own shard with its peers, so the node's link carries the node's whole gradient, the
    ``size`` counted)."""
    nodes = max(1, num_nodes)
    return {"node": max(1, world // nodes), "nodes": nodes}.get(c.group, world)


def _ring_link(c: Collective, link: Link) -> tuple[float | None, float]:
    """(bytes/s, latency of a ring step) of the link ``c``'s group crosses: a node's ranks the link inside it,
    HSDP's replicas the link between nodes, every rank the job's slowest."""
    if c.group == "node":
        return link.inside_bytes_s or link.collective_bytes_s, NCCL_STEP_S["inside"]
    if c.group == "nodes":
        return link.between_bytes_s or link.collective_bytes_s, NCCL_STEP_S["network"]
    return link.collective_bytes_s, link.step_latency_s


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
    optimizer_step_s: float  # the optimizer step (on the GPU over the rank's share, or on the host under offload)
    communication_s: float  # what collectives and PCIe add to an optimizer step, not hidden behind backward
    step_s: float  # one optimizer step: accumulation x micro-step + optimizer + communication
    samples_per_s: float  # the global batch / step_s
    parts: tuple[tuple[str, float], ...] = ()  # communication by kind, seconds per optimizer step
    tie: float = 0.005  # the model's own error here (relative): options closer than this are a tie

    def describe(self) -> str:
        extra = ", ".join(f"{name} {secs:.2g} s a step" for name, secs in self.parts if secs >= 0.0005)
        return extra


def phase_gpu_s(work: PhaseWork, gpu: GPUSpec, precision: str, tf32: bool, cal: Efficiency | None = None,
                memory_efficiency: float | None = None) -> float:
    """The GPU's time for one phase: the roofline of each row, at the GPU's efficiencies (``cal``: others)."""
    cal = cal or gpu.efficiency
    peak, bw = gpu.peak_flops(precision, tf32), gpu.memory_bytes_s * (memory_efficiency or cal.memory)
    total = 0.0
    for kind, _bin, flops, nbytes, _k in work.rows:
        mem = nbytes / bw
        if kind == "attention" and flops:
            eff = cal.attention_at(flops / max(nbytes, 1.0))
        else:
            eff = {"matmul": cal.matmul, "conv": cal.conv}.get(kind)
        total += mem if eff is None or not flops else max(flops / (peak * eff), mem)
    return total


def compute_s(step: StepWork, gpu: GPUSpec, precision: str, tf32: bool, cal: Efficiency | None = None
              ) -> tuple[float, float, float]:
    """(micro-step, the whole model's optimizer step, the backward's time that collectives can hide behind: its GPU
    time, or its kernels' dispatch where the host is slower, as NCCL's stream runs all the while)."""
    cal = cal or gpu.efficiency
    backward = phase_gpu_s(step.backward, gpu, precision, tf32, cal)
    gpu_s = phase_gpu_s(step.forward, gpu, precision, tf32, cal) + backward
    host_s = (step.forward.kernels + step.backward.kernels) * cal.kernel_s
    hide = max(backward, step.backward.kernels * cal.kernel_s)
    return max(gpu_s, host_s), optimizer_s(step, gpu, precision, tf32, 1.0, cal), hide


def optimizer_s(step: StepWork, gpu: GPUSpec, precision: str, tf32: bool, share: float,
                cal: Efficiency | None = None) -> float:
    """The optimizer step over ``share`` of the model's states: its GPU time shrinks with the share, its kernel
    launches do not (a sharded engine steps every parameter's shard)."""
    cal = cal or gpu.efficiency
    gpu_s = phase_gpu_s(step.optimizer, gpu, precision, tf32, cal, cal.optimizer_memory) * share
    return max(gpu_s, step.optimizer.kernels * cal.kernel_s)


def host_optimizer_s(line: EngineLine, num_parameters: int, share: float, cores: float) -> float:
    """The optimizer step on the host under offload, at the rate of what runs it."""
    return num_parameters * share / (HOST_ADAM_PARAMS_PER_CORE_S[line.host_adam] * max(1.0, cores))


def calls_for(line: EngineLine, strategy: str, size: float, units: int) -> int:
    """How many NCCL calls carry one collective: per unit (FSDP2, ZeRO-3), per bucket (DDP, ZeRO-1/2)."""
    if line.per_unit:
        return max(1, units)
    if strategy == "ddp":
        return max(1, math.ceil(size / DDP_BUCKET_BYTES))
    return DEEPSPEED_BUCKETS


def transfer_s(c: Collective, line: EngineLine, strategy: str, n: int, link: Link, num_parameters: int,
               units: int) -> tuple[str, float, float] | None:
    """(name, seconds, the last call's seconds) of one collective or PCIe copy; None where it moves nothing."""
    share = 1 / n if line.sharded else 1.0
    if c.op in RING:
        ranks = _group(c, n, link.num_nodes)
        bandwidth, step_latency = _ring_link(c, link)
        if bandwidth is None or ranks <= 1:
            return None
        size = num_parameters * (line.grad_bytes if c.what == "grads" else line.weight_bytes)
        calls = calls_for(line, strategy, size, units)
        latency = calls * (NCCL_CALL_S + RING_STEPS[c.op](ranks) * step_latency)
        secs = size * RING[c.op](ranks) / bandwidth + latency
        name = c.op.replace("_", "-") + {"node": " in each node", "nodes": " across nodes"}.get(c.group, "")
        return name, secs, secs / calls
    # offload: the rank's partition over PCIe (gradients go to the host in fp32)
    size = num_parameters * share * (4 if c.what == "grads" else line.weight_bytes)
    secs = size / link.pcie_bytes_s
    return "PCIe", secs, secs / calls_for(line, strategy, size, units)


def exposed_s(line: EngineLine, strategy: str, n: int, link: Link, hide_s: float, accumulation: int,
              num_parameters: int, units: int) -> dict[str, float]:
    """Seconds per optimizer step that communication adds, by kind. The overlapped transfers of one micro-step
    share its backward: together they cost what exceeds it, and at least their last calls; the optimizer step's
    overlapped ones ride the last micro-step's backward with that micro-step's own."""
    moved = [(c, t) for c in line.collectives if (t := transfer_s(c, line, strategy, n, link, num_parameters, units))]
    parts: dict[str, float] = {}

    def charge(group, exposed: float, times: int) -> None:
        total = sum(t[1] for _c, t in group)
        for _c, (name, secs, _tail) in group:
            parts[name] = parts.get(name, 0.0) + (exposed * secs / total if total else 0.0) * times

    every = [m for m in moved if m[0].overlapped and m[0].when == "micro"]
    last = every + [m for m in moved if m[0].overlapped and m[0].when == "step"]
    for group, times in ((every, accumulation - 1), (last, 1)):
        if group and times:
            total, tails = sum(t[1] for _c, t in group), sum(t[2] for _c, t in group)
            charge(group, max(total - hide_s, tails), times)
    for c, (name, secs, _tail) in moved:
        if not c.overlapped:
            parts[name] = parts.get(name, 0.0) + secs * (accumulation if c.when == "micro" else 1)
    return parts


def step_time(step: StepWork, *, strategy: str, micro: int, accumulation: int, world: int, gpu: GPUSpec,
              link: Link, precision: str, tf32: bool, num_parameters: int, host_cores_per_rank: float,
              cal: Efficiency | None = None, scale: tuple[float, float] = (1.0, 1.0), units: int = 1) -> StepTime:
    """One optimizer step of ``strategy`` at ``micro`` x ``accumulation`` on ``world`` ranks. ``scale``: the
    compute's (micro-step, optimizer step) times measured on the GPU over the model's, where a probe timed them;
    ``units``: the modules a sharded engine gathers one by one (FSDP2's units)."""
    line = ENGINES.get(strategy, ENGINES["ddp"])
    n = max(1, world)
    share = 1 / n if line.sharded else 1.0
    micro_s, _whole, hide_s = compute_s(step, gpu, precision, tf32, cal)
    micro_s, hide_s = micro_s * scale[0], hide_s * scale[0]
    opt_s = optimizer_s(step, gpu, precision, tf32, share, cal) * scale[1]
    parts = exposed_s(line, strategy, n, link, hide_s, accumulation, num_parameters, units)
    comm = sum(parts.values())
    if line.cpu_optimizer:
        opt_s = host_optimizer_s(line, num_parameters, share, host_cores_per_rank)
        parts["CPU Adam" if line.host_adam == "deepspeed" else "host AdamW"] = opt_s
    step_s = accumulation * micro_s + opt_s + comm
    return StepTime(micro_s, opt_s, comm, step_s, micro * accumulation * n / step_s,
                    tuple((k, v) for k, v in parts.items()), (cal or gpu.efficiency).time_error)
