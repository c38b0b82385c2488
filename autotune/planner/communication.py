"""What each engine sends, over which link, and what of it the backward hides: the communication of a step.

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

from autotune.planner.gpus import GPUSpec
from autotune.profiles import HardwareProfile

# -- sources for the constants ------------------------------------------------------------------------------------
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
# A copy between the host and the GPU costs its submission besides its bytes: 5-7 us a cudaMemcpyAsync (Wu et al.
# 2026, DualPath, sec. 5.2). Offload copies from pinned memory (autotune's DeepSpeed JSON sets pin_memory on GPUs;
# FSDP2's CPUOffloadPolicy pins by default), so the copies are asynchronous and can hide behind the backward; a
# pageable buffer would be staged through a pinned one, synchronously. DeepSpeed issues one copy a parameter
# tensor; the model counts one a unit (ZeRO-3's and FSDP2's modules) or a bucket (ZeRO-2), the fewest there can be.
PCIE_CALL_S = 6e-6
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
    # ZeRO-3 + parameter and optimizer offload: the partitions also cross PCIe for each use: each module's fetched
    # from the host for the forward's gather and again for the backward's (ZeRO-Infinity, Rajbhandari et al. 2021,
    # sec. 4: parameters move in forward and backward, gradients once), its gradient partition back
    "zero3_offload": EngineLine((C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                 C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                 C("reduce_scatter", "grads", "micro", True), C("to_host", "grads", "micro", True)),
                                cpu_optimizer=True, per_unit=True),
    # FSDP2 (fully_shard per block, bf16 weights gathered, gradients reduce-scattered in fp32: reduce_dtype): each
    # micro-step gathers every unit for the forward and, resharded after it, again for the backward, and
    # reduce-scatters the unit's gradients as its backward ends, all on their own stream, overlapped
    "fsdp": EngineLine((C("all_gather", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                        C("reduce_scatter", "grads", "micro", True)), grad_bytes=4, per_unit=True),
    # without resharding after forward: one all-gather a micro-step (the weights stay gathered for the backward)
    "fsdp_no_reshard": EngineLine((C("all_gather", "weights", "micro", True),
                                   C("reduce_scatter", "grads", "micro", True)), grad_bytes=4, per_unit=True),
    # CPUOffloadPolicy: the shard to the GPU for each gather (the forward's and, resharded after it, the backward's),
    # its fp32 gradient shard back, torch's AdamW on the host at its own rate
    "fsdp_offload": EngineLine((C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                C("from_host", "weights", "micro", True), C("all_gather", "weights", "micro", True),
                                C("reduce_scatter", "grads", "micro", True),
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
    # offload: the rank's partition over PCIe (gradients go to the host in fp32), each copy's submission besides
    size = num_parameters * share * (4 if c.what == "grads" else line.weight_bytes)
    calls = calls_for(line, strategy, size, units)
    secs = size / link.pcie_bytes_s + calls * PCIE_CALL_S
    return "PCIe", secs, secs / calls


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
