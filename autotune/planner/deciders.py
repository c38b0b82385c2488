"""The planner's deciders: each knob in its own short function (where it runs, each GPU's memory and the policy
band, the accumulation and the learning rate; the engine's seed, the precision, the loader and the run's steps have
modules of their own).

A decider reads the hardware profile, the config and the policy, and either returns the resolved value
(through ``Resolver.resolve``, which applies the user's value and records the reason) or raises
``UserError`` for a request that cannot run. Pure: no torch, no environment, no subprocess.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from autotune.config import AUTO, TrainConfig
from autotune.errors import UserError
from autotune.plan import Override
from autotune.planner import pods
from autotune.planner.policy import Policy
from autotune.planner.resolve import Decision, Resolver, is_set
from autotune.planner.schedule import steps  # noqa: F401 - where callers have found it
from autotune.profiles import GPUInfo, HardwareProfile

GB = 1e9
MIB = 1024 * 1024


@dataclass(frozen=True)
class Inputs:
    """What every decider reads."""

    hw: HardwareProfile
    cfg: TrainConfig
    policy: Policy
    deepspeed_installed: bool
    # backend -> why the user's script cannot run it, shown from its source (exports.script_engines); {}: the
    # built-in runtime, which runs every engine
    script_cannot: dict[str, str] = field(default_factory=dict)


def fmt_gb(mib: float) -> str:
    return f"{mib * MIB / GB:.1f} GB"


def summary(hw: HardwareProfile, network: bool = False) -> str:
    """One line for the machine; ``network``: with InfiniBand and what it means for NCCL (the plan's line)."""
    if not hw.gpus.devices:
        return f"{hw.num_nodes} node(s), no GPU, {hw.cpu.effective_cores} effective cores"
    names = sorted({d.name or "unknown GPU" for d in hw.gpus.devices})
    line = f"{hw.num_nodes} node(s) x {hw.num_gpus} GPU(s) ({', '.join(names)}), interconnect {hw.gpus.interconnect}"
    return f"{line}, {infiniband_note(hw)}" if network else line


def infiniband_note(hw: HardwareProfile) -> str:
    """InfiniBand present or not, and what the launch sets for NCCL because of it."""
    if hw.infiniband is None:
        return "InfiniBand unknown (NCCL_IB_DISABLE=1 is set; export NCCL_IB_DISABLE=0 to use it)"
    if hw.infiniband:
        return f"InfiniBand {', '.join(hw.infiniband)} (NCCL uses it between nodes)"
    return "no InfiniBand (NCCL_IB_DISABLE=1: between nodes NCCL uses TCP sockets)"


# -- GPUs, nodes and their meeting ----------------------------------------------------------------

def mig_view(hw: HardwareProfile, policy: Policy, resolver: Resolver) -> HardwareProfile:
    """The GPUs as a process will see them: a GPU in MIG mode is one of its slices.

    CUDA gives a process one MIG instance, and instances have no peer-to-peer path; unless
    the policy allows one process per instance, the plan uses one slice (the smallest).
    """
    devs = hw.gpus.devices
    if not any(d.mig_mode or d.mig_instance for d in devs):
        return hw
    out, notes = [], []
    for d in devs:
        if d.mig_mode and not d.mig_instance:
            if d.mig_slices_mib:
                mib = min(d.mig_slices_mib)
                notes.append(f"GPU {d.index} ({d.name or 'unknown'}) is in MIG mode with {len(d.mig_slices_mib)} "
                             f"instance(s): planning for one slice of {fmt_gb(mib)}, not the whole GPU")
                d = d.model_copy(update={"memory_total_mib": mib, "memory_free_mib": mib, "mig_instance": True,
                                         "name": f"{d.name or 'GPU'} MIG slice"})
            else:
                notes.append(f"GPU {d.index} is in MIG mode but its instances are unknown: its memory is unknown")
                d = d.model_copy(update={"memory_total_mib": None, "memory_free_mib": None, "mig_instance": True})
        out.append(d)
    if len(out) > 1 and not policy.mig_multi_process:
        notes.append(f"{len(out)} MIG devices visible, but MIG instances have no peer-to-peer path and the policy "
                     "does not plan NCCL across them (mig_multi_process: false): one process on one slice")
        out = out[:1]
    resolver.warnings.extend(notes)
    resolver.explain("num_gpus", "; ".join(notes))
    return hw.model_copy(update={"gpus": hw.gpus.model_copy(update={"devices": tuple(out)})})


def decide_num_gpus(inputs: Inputs, resolver: Resolver) -> int:
    """GPUs used on each node: all visible unless the user narrows it."""
    hw, d = inputs.hw, inputs.cfg.distributed
    visible = hw.num_gpus
    for name, value in (("distributed.num_gpus", d.num_gpus), ("distributed.nproc_per_node", d.nproc_per_node)):
        if is_set(value) and visible and value > visible:
            raise UserError(f"{name}: {value} GPUs requested but only {visible} are visible on this node "
                            f"({summary(hw)}); use at most {visible} or check CUDA_VISIBLE_DEVICES")
    if is_set(d.num_gpus):
        if d.num_gpus > 0 and not visible:
            raise UserError(f"distributed.num_gpus: {d.num_gpus} GPUs requested but this machine has none "
                            f"({hw.gpus.reason or 'no GPU detected'}); use --num_gpus 0 or plan with --hardware PRESET")
        n = d.num_gpus
        if is_set(d.nproc_per_node) and n and d.nproc_per_node != n:
            raise UserError(f"distributed.nproc_per_node: {d.nproc_per_node} processes for {n} GPUs; on GPUs autotune "
                            "runs one process per GPU, so set only one of --num_gpus / --nproc_per_node")
        if resolver.auto_optimize:
            resolver.overrides["num_gpus"] = Override(auto=visible, chosen=n)
        resolver.explain("num_gpus", f"you set num_gpus={n} (auto would use all {visible} visible)")
        return n
    if is_set(d.nproc_per_node) and visible:
        resolver.explain("num_gpus", f"nproc_per_node={d.nproc_per_node}: one process per GPU, {visible} visible")
        return d.nproc_per_node
    if "num_gpus" not in resolver.reasons:  # (a MIG note is already there)
        resolver.explain("num_gpus", f"all {visible} visible GPU(s)" if visible else
                         (hw.gpus.reason or "no GPU detected"))
    return visible


def decide_num_nodes(inputs: Inputs, resolver: Resolver) -> int:
    """Nodes in the job: the user's value wins (listed as an override), else the profile's."""
    hw, d = inputs.hw, inputs.cfg.distributed
    return resolver.resolve("num_nodes", d.num_nodes, lambda: pods.nodes(hw, d) or Decision(
        hw.num_nodes, f"the hardware profile describes {hw.num_nodes} node(s)"),
        verbatim=1, verbatim_reason="--no_auto_optimize: 'auto' means 1 node here")


LOOPBACK = ("127.", "localhost", "::1")


def decide_rendezvous(inputs: Inputs, resolver: Resolver, num_nodes: int) -> tuple[int, str, str | None]:
    """(node rank, master address, rendezvous id): flags, SLURM's allocation, an operator's (``pods``), one node."""
    d, slurm = inputs.cfg.distributed, inputs.hw.slurm
    in_slurm = slurm is not None and slurm.job_id is not None
    op_rank, op_master = pods.rendezvous(inputs.hw, d, num_nodes)
    rank = resolver.resolve("node_rank", d.node_rank, lambda: Decision(
        slurm.node_id, f"SLURM_NODEID={slurm.node_id} (job {slurm.job_id})") if in_slurm and slurm.node_id is not None
        else op_rank or Decision(0, "one node" if num_nodes == 1 else "no SLURM_NODEID and no --node_rank: node 0"),
        verbatim=0, verbatim_reason="--no_auto_optimize: 'auto' means node 0")
    if rank >= num_nodes:
        raise UserError(f"distributed.node_rank: must be below the number of nodes ({num_nodes}), got {rank}")
    from_slurm = in_slurm and bool(slurm.hosts) and num_nodes > 1  # the master is the allocation's first host
    if from_slurm:
        auto = Decision(slurm.hosts[0], f"first host of the SLURM allocation {slurm.nodelist} "
                                        f"({len(slurm.hosts)} host(s))")
    else:
        auto = op_master or Decision("127.0.0.1", "one node: the local machine" if num_nodes == 1 else
                                     "no --master_addr and no SLURM allocation: 127.0.0.1")
    master = d.master_addr if d.master_addr != AUTO else None
    addr = resolver.resolve("master_addr", master or AUTO, lambda: auto,
                            verbatim="127.0.0.1", verbatim_reason="--no_auto_optimize: 'auto' means 127.0.0.1")
    loopback = addr.startswith(LOOPBACK)
    if num_nodes > 1 and loopback and master is None and rank > 0 and not (from_slurm or op_master):
        raise UserError(f"distributed.master_addr: node {rank} of {num_nodes} needs the address of node 0; pass "
                        "--master_addr HOST (127.0.0.1 only when every node runs on this machine)")
    if num_nodes > 1 and loopback and inputs.hw.source != "detected" and not (master or from_slurm or op_master):
        resolver.explain("master_addr", f"no --master_addr: {addr} in this plan for another machine; where it runs, "
                                        "give node 0's address with --master_addr (SLURM: its first host)")
    elif num_nodes > 1 and loopback:
        resolver.warnings.append(f"master address {addr} is this machine: every one of the {num_nodes} nodes must run "
                                 "here (a test setup); on a cluster give node 0's address")
    rdzv = slurm.job_id if in_slurm and num_nodes > 1 and master is None and d.node_rank == AUTO else None
    return rank, addr, rdzv


# -- per-GPU memory and the policy band ---------------------------------------------

def usable_mib(dev: GPUInfo) -> tuple[int | None, str]:
    """The memory one process may plan for on ``dev``, and which figure it is: the smallest MIG slice of a
    GPU in MIG mode, else the free memory, else the total. The one rule (the nodes' comparison uses it too)."""
    if dev.mig_slices_mib:
        return min(dev.mig_slices_mib), "MIG slice"
    if dev.memory_free_mib is not None:
        return dev.memory_free_mib, "free"
    return dev.memory_total_mib, "total"


def planning_memory_mib(resolver: Resolver, devs: tuple[GPUInfo, ...]) -> float | None:
    """The smallest usable memory (``usable_mib``) among the job's GPUs; None if any is unknown."""
    values, basis = [], []
    for dev in devs:
        mib, which = usable_mib(dev)
        if mib is not None:
            values.append(mib)
            basis.append(which)
    if len(values) < len(devs) or not values:
        resolver.warnings.append("memory of some GPU is unknown (see the hardware report); planning for the smallest "
                                 "band")
        return None
    names = {d.name for d in devs}
    if len(names) > 1 or len(set(values)) > 1:
        i = values.index(min(values))
        resolver.warnings.append(
            f"GPUs differ ({', '.join(sorted(n or '?' for n in names))}): planning every rank to the smallest "
            f"{basis[i]} memory, GPU {devs[i].index} with {fmt_gb(values[i])}"
        )
    return float(min(values))


@dataclass(frozen=True)
class BandChoice:
    micro_batch_size: int
    micro_reason: str
    gradient_checkpointing: bool
    checkpointing_reason: str


def band_choice(inputs: Inputs, on_gpu: bool, mem_mib: float | None) -> BandChoice:
    """The policy table's micro-batch and checkpointing default for this memory."""
    policy = inputs.policy
    if not on_gpu:
        return BandChoice(policy.cpu_micro_batch_size,
                          f"no GPU: policy cpu_micro_batch_size {policy.cpu_micro_batch_size}",
                          False, "no GPU: memory is not the constraint, recomputation would only cost time")
    if mem_mib is None:
        band = min(policy.micro_batch_bands, key=lambda b: b.min_memory_gb)
        why = f"GPU memory unknown: the smallest band, micro-batch {band.micro_batch_size}"
    else:
        gb = mem_mib * MIB / GB  # the policy's bands are in GB (10^9 bytes), like the users' table
        band = policy.band_for(gb)
        why = (f"{gb:.1f} GB free per GPU is in the >= {band.min_memory_gb:g} GB band: micro-batch "
               f"{band.micro_batch_size}")
    return BandChoice(band.micro_batch_size, why, band.gradient_checkpointing,
                      f"the {band.min_memory_gb:g} GB band defaults to {('off', 'on')[band.gradient_checkpointing]}")


def fit_to_target(resolver: Resolver, band: BandChoice, target: int, world: int, debug: bool) -> BandChoice:
    """Shrink the band's micro-batch when the target global batch is smaller than one step of it."""
    if target < world:
        resolver.warnings.append(
            f"the target global batch {target} is smaller than the world size {world}: every process needs at "
            f"least one sample per step, so the global batch is at least {world}"
        )
    micro = band.micro_batch_size
    if debug or target >= micro * world:
        return band
    reduced = max(1, round(target / world))
    why = (f"{band.micro_reason}, reduced to {reduced} because the target global batch {target} < {micro} x {world} "
           "processes")
    return BandChoice(reduced, why, band.gradient_checkpointing, band.checkpointing_reason)


# -- accumulation and the learning rate ---------------------------------------------

def accumulation(target: int, micro: int, world: int) -> int:
    """Integer >= 1 bringing micro*accum*world closest to target; ties -> smaller."""
    per_step = micro * world
    lo = max(1, target // per_step)
    return min((lo, lo + 1), key=lambda a: (abs(a * per_step - target), a))


def learning_rate(inputs: Inputs, resolver: Resolver, global_batch: int) -> float:
    t = inputs.cfg.training
    if not resolver.auto_optimize:
        resolver.explain("learning_rate", f"training.learning_rate {t.learning_rate:g} verbatim")
        return t.learning_rate
    if t.lr_scaling == "none":
        resolver.explain("learning_rate", f"training.learning_rate {t.learning_rate:g} as given (lr_scaling: none)")
        return t.learning_rate
    ratio = global_batch / t.base_batch_size
    factor = ratio if t.lr_scaling == "linear" else math.sqrt(ratio)
    lr = t.learning_rate * factor
    op = ("{}/{}" if t.lr_scaling == "linear" else "sqrt({}/{})").format(global_batch, t.base_batch_size)
    resolver.explain("learning_rate", f"{t.lr_scaling} scaling: {t.learning_rate:g} x {op} = {lr:.6g}")
    return lr
