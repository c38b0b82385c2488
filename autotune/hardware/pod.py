"""Kubernetes pods as data (pure): is this a pod, and what did a training operator say about the job.

The Kubeflow Trainer (v2, ``TrainJob``; its Torch plugin, pkg/runtime/framework/plugins/torch) sets only
torchrun's defaults: ``PET_NNODES``, ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK`` (the Job's completion
index), ``PET_MASTER_ADDR`` (``<trainjob>-node-0-0.<trainjob>``) and ``PET_MASTER_PORT`` (29500); no
WORLD_SIZE, no RANK. The v1 training-operator (``PyTorchJob``, pkg/controller.v1/pytorch/envvar.go) sets
``MASTER_ADDR``/``MASTER_PORT``, ``WORLD_SIZE`` (replicas x nprocPerNode) and ``RANK`` (the pod's index, a
node rank), and from 1.7 on the same ``PET_*`` too. ``pod_info(environ)`` reads them as ``allocation``
reads SLURM's: the node count, this node's rank and the master, each with the variable it came from.

WORLD_SIZE/RANK/MASTER_ADDR are torchrun's own names for a rank's view too, so they count as node
facts only in a pod, without ``PET_NNODES``, and outside a rank (no ``LOCAL_RANK``). An unreadable
variable is kept as ``error``: detection never raises, the plan refuses naming it.
"""

from __future__ import annotations

import re
from typing import Mapping

from autotune.profiles import KubernetesInfo

_HOST = re.compile(r"[A-Za-z0-9:]([A-Za-z0-9._:-]{0,251}[A-Za-z0-9:])?")  # a DNS name, IPv4 or IPv6 address


class _Bad(Exception):
    pass


def _whole(environ: Mapping[str, str], name: str, *, low: int = 0, high: int = 100_000) -> int | None:
    v = environ.get(name)
    if v is None or not v.strip():
        return None
    v = v.strip()
    if not (v.isascii() and v.isdigit()) or not low <= int(v) <= high:
        hint = " (an elastic range: autotune plans a fixed number of nodes; drop the job's elasticPolicy)" \
            if name == "PET_NNODES" and ":" in v else ""
        raise _Bad(f"{name}={v[:40]!r}: expected a whole number from {low} to {high}{hint}")
    return int(v)


def _host(environ: Mapping[str, str], *names: str) -> tuple[str | None, str | None]:
    for name in names:
        v = (environ.get(name) or "").strip()
        if v:
            if not _HOST.fullmatch(v):
                raise _Bad(f"{name}={v[:80]!r}: not a host name or address")
            return v, name
    return None, None


def pod_info(environ: Mapping[str, str]) -> KubernetesInfo | None:
    """The pod and the operator's node facts; None outside a pod with no ``PET_NNODES``."""
    pod = bool(environ.get("KUBERNETES_SERVICE_HOST"))
    pet = bool((environ.get("PET_NNODES") or "").strip())
    v1 = (pod and not pet and "LOCAL_RANK" not in environ
          and all((environ.get(n) or "").strip() for n in ("WORLD_SIZE", "RANK", "MASTER_ADDR")))
    if not (pod or pet):
        return None
    nproc = (environ.get("PET_NPROC_PER_NODE") or "").strip()[:16] or None
    if not (pet or v1):
        return KubernetesInfo(pod=pod, nproc_per_node=nproc)
    try:
        if pet:
            nodes, rank = _whole(environ, "PET_NNODES", low=1), _whole(environ, "PET_NODE_RANK")
            sources = {"num_nodes": "PET_NNODES", "node_rank": "PET_NODE_RANK"}
        else:
            per_pod = int(nproc) if nproc and nproc.isascii() and nproc.isdigit() and int(nproc) > 0 else 1
            world, rank = _whole(environ, "WORLD_SIZE", low=1), _whole(environ, "RANK")
            if world % per_pod:
                raise _Bad(f"WORLD_SIZE={world} is not a multiple of PET_NPROC_PER_NODE={per_pod}")
            nodes = world // per_pod
            sources = {"num_nodes": "WORLD_SIZE" + (f" / PET_NPROC_PER_NODE {per_pod}" if per_pod > 1 else ""),
                       "node_rank": "RANK"}
        if rank is None:
            if nodes > 1:
                raise _Bad(f"{sources['num_nodes'].split()[0]}={nodes} but PET_NODE_RANK is not set: which node "
                           "is this? (the operator sets it; started by hand, set it 0..N-1)")
            rank, sources["node_rank"] = 0, "default 0"
        if rank >= nodes:
            raise _Bad(f"{sources['node_rank']}={rank} is not below the number of nodes {nodes}")
        addr, addr_from = _host(environ, "PET_MASTER_ADDR", "MASTER_ADDR")
        if addr is None and nodes > 1:
            raise _Bad(f"{sources['num_nodes'].split()[0]}={nodes} but neither PET_MASTER_ADDR nor MASTER_ADDR "
                       "names node 0")
        port = _whole(environ, "PET_MASTER_PORT", low=1, high=65535)
        port_from = "PET_MASTER_PORT"
        if port is None:
            port, port_from = _whole(environ, "MASTER_PORT", low=1, high=65535), "MASTER_PORT"
    except _Bad as e:
        return KubernetesInfo(pod=pod, nproc_per_node=nproc, error=str(e))
    if addr_from:
        sources["master_addr"] = addr_from
    if port is not None:
        sources["master_port"] = port_from
    return KubernetesInfo(pod=pod, num_nodes=nodes, node_rank=rank, master_addr=addr, master_port=port,
                          nproc_per_node=nproc, sources=sources)


def describe(k: KubernetesInfo) -> str:
    """One line: the pod and the operator's facts (the report's, and the reasons' source note)."""
    who = "a pod (KUBERNETES_SERVICE_HOST is set)" if k.pod else "not a pod (no KUBERNETES_SERVICE_HOST)"
    if k.error:
        return f"{who}; the operator's variables cannot be read: {k.error}"
    if k.num_nodes is None:
        return f"{who}; no training operator's node variables (one node unless flags say otherwise)"
    master = f", master {k.master_addr}" + (f":{k.master_port}" if k.master_port else "") if k.master_addr else ""
    return (f"{who}; node {k.node_rank} of {k.num_nodes}{master} (from "
            f"{', '.join(dict.fromkeys(s.split()[0] for s in k.sources.values() if s != 'default 0'))})")
