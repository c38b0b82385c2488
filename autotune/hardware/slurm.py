"""SLURM allocations as data (pure; no subprocess unless asked): host lists and the job's shape.

``expand_hostlist`` expands SLURM's compressed host lists the way ``scontrol show
hostnames`` does: ``node[01-04,07]``, ``gpu-a[1,3],gpu-b2``, ``n[1-2]-ib``, zero padding
kept. ``allocation(environ)`` reads the variables ``srun``/``sbatch`` set for a task:
nodes, this node's index, the host list (first host = rendezvous master), GPUs per node
(``SLURM_GPUS_ON_NODE``, or ``SLURM_GPUS_PER_NODE`` including typed forms like
``a100:4``), CPUs per task and memory per node; each value says which variable it came from.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Mapping

from autotune.errors import UserError
from autotune.profile_checks import MAX_NODES

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top(text: str) -> list[str]:
    """Split on commas outside brackets."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("unbalanced ']'")
        if ch == "," and depth == 0:
            out.append(cur)
            cur = ""
        else:
            cur += ch
    if depth:
        raise ValueError("unbalanced '['")
    out.append(cur)
    return [p for p in (s.strip() for s in out) if p]


def _bounds(part: str) -> tuple[int, int, int]:
    """``09-11`` -> (9, 11, 2): a range's ends and its zero padding; ValueError saying what is wrong."""
    r = _RANGE.match(part.strip())
    if r is None:
        raise ValueError(f"bad range {part!r}")
    lo, hi = r.group(1), r.group(2) or r.group(1)
    if int(hi) < int(lo):
        raise ValueError(f"descending range {part!r}")
    return int(lo), int(hi), (len(lo) if lo.startswith("0") else 0)  # without padding, no number is shorter than lo


def _count_one(expr: str) -> int:
    """How many hosts ``_expand_one(expr)`` names, without naming them."""
    m = re.search(r"\[([^\[\]]*)\]", expr)
    if m is None:
        return 1
    n = sum(hi - lo + 1 for lo, hi, _ in map(_bounds, m.group(1).split(",")))
    return n * _count_one(expr[m.end():])


def _expand_one(expr: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", expr)
    if m is None:
        return [expr]
    head, tail = expr[:m.start()], expr[m.end():]
    out = []
    for part in m.group(1).split(","):
        lo, hi, width = _bounds(part)
        for n in range(lo, hi + 1):
            out.extend(_expand_one(f"{head}{str(n).zfill(width)}{tail}"))
    return out


def expand_hostlist(text: str) -> list[str]:
    """``node[01-02],gpu7`` -> ['node01', 'node02', 'gpu7']; ValueError on a malformed list, or one naming more
    hosts than SLURM allows, counted before anything is expanded (``a[1-999999999]`` is refused at once, not built)."""
    items = _split_top(text)
    total = 0
    for item in items:
        total += _count_one(item)
        if total > MAX_NODES:
            raise ValueError(f"more than {MAX_NODES} hosts")
    hosts: list[str] = []
    for item in items:
        hosts.extend(_expand_one(item))
    return hosts


def gpus_per_node(value: str | None) -> int | None:
    """``4``, ``a100:4``, ``gpu:a100:4`` or ``4(x2)`` -> 4; None when absent or unreadable."""
    if not value:
        return None
    first = value.split(",")[0].split("(")[0]
    last = first.split(":")[-1]
    return int(last) if last.isascii() and last.isdigit() else None  # isdigit() alone takes "²"


@dataclass(frozen=True)
class Allocation:
    job_id: str
    num_nodes: int
    node_rank: int
    hosts: tuple[str, ...]
    gpus_per_node: int | None
    cpus_per_task: int | None
    mem_per_node_mib: int | None
    sources: dict[str, str] = field(default_factory=dict)

    @property
    def master_addr(self) -> str:
        return self.hosts[0]


def allocation(environ: Mapping[str, str]) -> Allocation | None:
    """This task's view of its SLURM job; None outside SLURM. A malformed variable is a UserError."""
    job = environ.get("SLURM_JOB_ID") or environ.get("SLURM_JOBID")
    if not job:
        return None
    def num(*names: str) -> int | None:
        for n in names:
            v = environ.get(n)
            if v is not None and v.strip():
                if not (v.strip().isascii() and v.strip().isdigit()):
                    raise UserError(f"{n}={v!r}: expected a whole number (is this a SLURM allocation?)")
                return int(v)
        return None

    raw_list = environ.get("SLURM_JOB_NODELIST") or environ.get("SLURM_NODELIST")
    try:
        hosts = tuple(expand_hostlist(raw_list)) if raw_list else ()
    except ValueError as e:
        raise UserError(f"SLURM_JOB_NODELIST={raw_list!r}: cannot expand it ({e})") from None
    nodes = num("SLURM_JOB_NUM_NODES", "SLURM_NNODES") or (len(hosts) or 1)
    if hosts and len(hosts) != nodes:
        raise UserError(f"SLURM_JOB_NUM_NODES={nodes} but SLURM_JOB_NODELIST={raw_list!r} names {len(hosts)} "
                        "host(s); run autotune inside the allocation (srun), not with copied variables")
    rank = num("SLURM_NODEID")
    if rank is None:
        rank = 0
    if rank >= nodes:
        raise UserError(f"SLURM_NODEID={rank} is not below SLURM_JOB_NUM_NODES={nodes}")
    gpn = gpus_per_node(environ.get("SLURM_GPUS_ON_NODE")) or gpus_per_node(environ.get("SLURM_GPUS_PER_NODE"))
    mem = num("SLURM_MEM_PER_NODE")
    return Allocation(job_id=job, num_nodes=nodes, node_rank=rank, hosts=hosts or ("127.0.0.1",),
                      gpus_per_node=gpn, cpus_per_task=num("SLURM_CPUS_PER_TASK"), mem_per_node_mib=mem,
                      sources={"num_nodes": "SLURM_JOB_NUM_NODES" if "SLURM_JOB_NUM_NODES" in environ else
                               "SLURM_NNODES" if "SLURM_NNODES" in environ else "SLURM_JOB_NODELIST",
                               "node_rank": "SLURM_NODEID" if "SLURM_NODEID" in environ else "default 0",
                               "master_addr": f"first host of SLURM_JOB_NODELIST ({raw_list})" if raw_list
                               else "no SLURM_JOB_NODELIST: 127.0.0.1"})
