"""Several nodes, one plan.

Each node's launcher detects its own machine. Nodes of one job can differ (other GPUs, less free
memory, a smaller cgroup), and a plan made per node would then train inconsistently (different
micro-batches, world sizes that do not add up). So before any rank starts, the launchers exchange
what they detected on the master's port (autotune.launch.exchange: node 0 listens there for a moment,
then closes it for torchrun's own rendezvous on the same port; only the job's nodes are admitted, and
each profile has passed a profile file's checks), and every node plans for ``smallest(...)`` of them:
the same plan everywhere, said in the plan's warnings.

The exchange doubles as the "are all nodes here" check: node 0 names the nodes that did not report
within ``distributed.rendezvous_timeout_s``; a node that cannot reach node 0 says so.
"""

from __future__ import annotations

from collections.abc import Mapping

from autotune.planner.deciders import usable_mib
from autotune.profiles import GPUInfo, HardwareProfile

_INTERCONNECT_ORDER = ("none", "unknown", "pcie", "nvlink")  # weakest first


def _min_known(values):
    """The smallest value, or None when any is unknown (planning must not assume the unknown is large)."""
    values = list(values)
    return None if any(v is None for v in values) else min(values)


def _usable(d: GPUInfo) -> int | None:
    return usable_mib(d)[0]


def _gpu_memory(hw: HardwareProfile) -> int | None:
    mems = [_usable(g) for g in hw.gpus.devices]
    return _min_known(mems) if mems else None


def node_line(hw: HardwareProfile) -> str:
    """What of a node's hardware changes a plan, in one line."""
    g = hw.gpus
    if g.count:
        names = sorted({d.name or "?" for d in g.devices})
        mem = _gpu_memory(hw)
        gpus = f"{g.count} GPU(s) {'/'.join(names)}, " + (f"{mem / 1024:.1f} GiB free" if mem is not None
                                                          else "memory unknown")
    else:
        gpus = "no GPU"
    ram = hw.memory.effective_mib
    return (f"{gpus}, {hw.cpu.effective_cores} effective core(s), "
            + (f"{ram / 1024:.1f} GiB RAM" if ram is not None else "RAM unknown")
            + (f", InfiniBand {'/'.join(hw.infiniband)}" if hw.infiniband else ""))


def _key(hw: HardwareProfile) -> tuple:
    """Plan-relevant facts; nodes equal in these plan identically."""
    devices = tuple((d.name, d.memory_total_mib, d.memory_free_mib, d.compute_capability, d.mig_instance,
                     d.mig_slices_mib) for d in hw.gpus.devices)
    return (devices, hw.gpus.interconnect, hw.cpu.effective_cores, hw.memory.effective_mib, hw.infiniband)


def smallest(profiles: Mapping[int, HardwareProfile], me: int) -> tuple[HardwareProfile, list[str]]:
    """Node rank -> detected profile, to (the profile node ``me`` plans for, lines saying how the nodes
    differ; none when they plan alike). The smallest is the node with the fewest GPUs (then the least
    GPU memory, RAM, cores), with every per-GPU and host figure lowered to the smallest any node has:
    GPU i's memory and compute capability over the nodes' GPU i, effective cores and RAM; InfiniBand
    only if every node has it; the weakest interconnect. Node ``me`` stays itself: its SLURM and
    Kubernetes facts (which give its node rank) and host name are its own."""
    if me not in profiles:
        raise ValueError(f"node {me} is not among the profiles {sorted(profiles)}")
    ranks = sorted(profiles)
    own = profiles[me]
    if len({_key(profiles[r]) for r in ranks}) == 1:
        return own, []

    def size(r):
        hw = profiles[r]
        return (hw.gpus.count, _gpu_memory(hw) or 0, hw.memory.effective_mib or 0, hw.cpu.effective_cores, r)

    base = profiles[min(ranks, key=size)]
    every = [profiles[r] for r in ranks]
    devices = []
    for i in range(base.gpus.count):
        peers = [hw.gpus.devices[i] for hw in every]
        # The GPU i with the least memory per process (unknown counts as least) is the template: a MIG
        # slice stays a slice. Free memory where one is known, else total, lowered to the smallest.
        tight = min(peers, key=lambda p: (_usable(p) is not None, _usable(p) or 0))
        caps = [p.compute_capability_tuple() for p in peers]
        update: dict = {"compute_capability": None if any(c is None for c in caps) else "%d.%d" % min(caps)}
        if not tight.mig_slices_mib:
            update["memory_total_mib"] = _min_known(p.memory_total_mib for p in peers)
            update["memory_free_mib"] = (None if all(p.memory_free_mib is None for p in peers)
                                         else _min_known(_usable(p) for p in peers))
        devices.append(tight.model_copy(update=update))
    links = [hw.gpus.interconnect for hw in every]
    interconnect = min(links, key=_INTERCONNECT_ORDER.index)
    ibs = [hw.infiniband for hw in every]
    infiniband = None if any(ib is None for ib in ibs) else (base.infiniband if all(ibs) else ())
    rates = [hw.infiniband_rate_gbps for hw in every]
    ib_rate = None if any(r is None for r in rates) else min(rates)  # the slowest adapter of the job
    cores = min(hw.cpu.effective_cores for hw in every)
    ram = _min_known(hw.memory.effective_mib for hw in every)
    why = f"the smallest of {len(every)} nodes"
    combined = base.model_copy(update={
        "description": f"{why} of this job",
        "gpus": base.gpus.model_copy(update={
            "devices": tuple(devices), "interconnect": interconnect,
            "interconnect_reason": base.gpus.interconnect_reason if interconnect == base.gpus.interconnect
            else f"{why}: {interconnect}"}),
        "cpu": base.cpu.model_copy(update={"effective_cores": cores, "effective_cores_reason": f"{why}: {cores}"}),
        "memory": base.memory.model_copy(update={"effective_mib": ram, "effective_reason": f"{why}: {ram} MiB"}),
        "infiniband": infiniband, "infiniband_rate_gbps": ib_rate, "slurm": own.slurm, "kubernetes": own.kubernetes,
        "hostname": own.hostname,
        "num_nodes": own.num_nodes,
    })
    lines = [f"the nodes differ; every node plans for the smallest ({node_line(combined)}):"]
    lines += [f"  node {r}: {node_line(profiles[r])}" for r in ranks]
    return combined, lines


