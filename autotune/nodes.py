"""Several nodes, one plan.

Each node's launcher detects its own machine. Nodes of one job can differ (other GPUs, less free
memory, a smaller cgroup), and a plan made per node would then train inconsistently (different
micro-batches, world sizes that do not add up). So before any rank starts, the launchers exchange
what they detected through a PyTorch TCPStore on the master's port (node 0 hosts it for a moment,
then closes it for torchrun's own rendezvous on the same port), and every node plans for
``smallest(...)`` of them: the same plan everywhere, said in the plan's warnings.

The exchange doubles as the "are all nodes here" check: node 0 names the nodes that did not report
within ``distributed.rendezvous_timeout_s``; a node that cannot reach node 0 says so.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from autotune.errors import UserError
from autotune.planner.deciders import LOOPBACK
from autotune.profiles import GPUInfo, HardwareProfile

_INTERCONNECT_ORDER = ("none", "unknown", "pcie", "nvlink")  # weakest first
_PREFIX = "autotune/hardware/"


def _min_known(values):
    """The smallest value, or None when any is unknown (planning must not assume the unknown is large)."""
    values = list(values)
    return None if any(v is None for v in values) else min(values)


def _usable(d: GPUInfo) -> int | None:
    """The memory the planner gives one process on this GPU: its smallest MIG slice, else free, else total."""
    if d.mig_slices_mib:
        return min(d.mig_slices_mib)
    return d.memory_free_mib if d.memory_free_mib is not None else d.memory_total_mib


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
    only if every node has it; the weakest interconnect. Node ``me`` stays itself: its SLURM facts
    (which give its node rank) and host name are its own."""
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
        "infiniband": infiniband, "slurm": own.slurm, "hostname": own.hostname, "num_nodes": own.num_nodes,
    })
    lines = [f"the nodes differ; every node plans for the smallest ({node_line(combined)}):"]
    lines += [f"  node {r}: {node_line(profiles[r])}" for r in ranks]
    return combined, lines


def exchange(num_nodes: int, node_rank: int, master_addr: str, master_port: int, mine: HardwareProfile,
             timeout_s: float) -> dict[int, HardwareProfile]:
    """Every node's detected profile, by node rank (``meet``), from a child process: torch stays out of
    the launcher (its import, its memory for the whole run), the C++ store's own warnings stay out of
    the user's terminal, and a hard deadline bounds the child whatever the store does."""
    import json
    import os
    import subprocess
    import sys

    request = {"num_nodes": num_nodes, "node_rank": node_rank, "master_addr": master_addr,
               "master_port": master_port, "timeout_s": timeout_s, "profile": mine.model_dump(mode="json")}
    env = {**os.environ, "TORCH_CPP_LOG_LEVEL": "ERROR"}
    try:
        r = subprocess.run([sys.executable, "-m", "autotune.nodes"], input=json.dumps(request), capture_output=True,
                           text=True, env=env, timeout=timeout_s + 60)
    except subprocess.TimeoutExpired:
        raise UserError(f"the nodes' hardware exchange at {master_addr}:{master_port} did not end within "
                        f"{timeout_s + 60:g} s; check that the port is reachable from every node") from None
    try:
        answer = json.loads(r.stdout)
    except ValueError:
        raise UserError(f"the nodes' hardware exchange failed (exit {r.returncode}): "
                        f"{(r.stderr.strip() or r.stdout.strip())[-2000:]}") from None
    if "error" in answer:
        raise UserError(answer["error"])
    return {int(k): HardwareProfile.model_validate(v) for k, v in answer["profiles"].items()}


def meet(num_nodes: int, node_rank: int, master_addr: str, master_port: int, mine: HardwareProfile,
         timeout_s: float, poll_s: float = 0.1) -> dict[int, HardwareProfile]:
    """Every node's detected profile, by node rank, through a TCPStore that node 0 hosts on the master's
    port until every node has read every profile; the other nodes return only once it is closed, so
    their torchrun never meets this store instead of its own. Raises UserError naming the missing nodes
    (node 0), an unreachable or vanished node 0 (the others), or two nodes claiming one rank; bounded by
    ``timeout_s`` (plus a few seconds for the others to read)."""
    from datetime import timedelta

    import torch.distributed as dist

    deadline = time.monotonic() + timeout_s
    where = f"{master_addr}:{master_port}"
    try:
        store = dist.TCPStore(master_addr, master_port, is_master=node_rank == 0, wait_for_workers=False,
                              timeout=timedelta(seconds=timeout_s))
    except Exception as e:  # torch raises DistNetworkError / RuntimeError with its own text
        if node_rank == 0:
            raise UserError(f"distributed.master_port: node 0 could not open {where} for the nodes' meeting "
                            f"({_first_line(e)}); choose a free port with --master_port, the same on every "
                            "node") from None
        here = (f"; {master_addr} is this machine, so node 0 must run here too: give node 0's address with "
                "--master_addr" if master_addr.startswith(LOOPBACK) else "")
        raise UserError(f"node {node_rank} of {num_nodes} could not reach node 0 at {where} within {timeout_s:g} s "
                        "(distributed.rendezvous_timeout_s): start the same command on node 0, check that the "
                        f"port is reachable from here, or raise the budget{here}") from None
    try:
        return _exchange_in(store, num_nodes, node_rank, where, mine, deadline, timeout_s, poll_s)
    except dist.DistError as e:
        raise UserError(f"node {node_rank} of {num_nodes} lost node 0 at {where} while the nodes compared hardware "
                        f"({_first_line(e)}); node 0 gave up or stopped: see its output") from None
    finally:
        del store


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _exchange_in(store, num_nodes, node_rank, where, mine, deadline, timeout_s, poll_s):
    if store.add(f"{_PREFIX}claim/{node_rank}", 1) > 1:
        raise UserError(f"distributed.node_rank: two nodes of this job both say they are node {node_rank}; "
                        f"give each node its own rank 0..{num_nodes - 1}")
    store.set(f"{_PREFIX}{node_rank}", mine.to_json(indent=None))
    keys = [f"{_PREFIX}{r}" for r in range(num_nodes)]
    while not store.check(keys):
        if time.monotonic() > deadline:
            missing = [r for r, k in enumerate(keys) if not store.check([k])]
            raise UserError(
                f"node(s) {', '.join(map(str, missing))} of {num_nodes} did not join at {where} within "
                f"{timeout_s:g} s (distributed.rendezvous_timeout_s): start the same command on every node "
                f"(node ranks 0..{num_nodes - 1}), check that {where} is reachable from them, or raise the budget")
        time.sleep(poll_s)
    profiles = {r: HardwareProfile.model_validate_json(store.get(k)) for r, k in enumerate(keys)}
    store.add(f"{_PREFIX}read", 1)
    if node_rank == 0:  # keep the store up until every node has read (then torchrun takes the port)
        while store.add(f"{_PREFIX}read", 0) < num_nodes and time.monotonic() < deadline + 5:
            time.sleep(poll_s)
        return profiles
    try:  # the others: wait until node 0 has closed it (a store call then fails at once)
        while time.monotonic() < deadline + 10:
            store.check(keys)
            time.sleep(poll_s)
    except Exception:  # noqa: BLE001 - the connection closing is the signal
        pass
    return profiles


def _main() -> int:
    """``python -m autotune.nodes``: ``meet`` for ``exchange``; JSON request on stdin, answer on stdout."""
    import json
    import sys

    req = json.loads(sys.stdin.read())
    try:
        got = meet(req["num_nodes"], req["node_rank"], req["master_addr"], req["master_port"],
                   HardwareProfile.model_validate(req["profile"]), req["timeout_s"])
    except UserError as e:
        print(json.dumps({"error": str(e)}))
        return 2
    print(json.dumps({"profiles": {r: hw.model_dump(mode="json") for r, hw in got.items()}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(_main())
