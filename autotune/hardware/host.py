"""CPU, RAM (psutil and cgroup limits), InfiniBand, SLURM variables and package versions.

Versions come from the installed packages' metadata folders: this module never imports torch or deepspeed.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from pathlib import Path
from typing import Any, Mapping

from autotune.hardware.cgroups import CgroupLimits
from autotune.hardware.fail_alone import Probes
from autotune.profiles import CPUInfo, MemoryInfo, SlurmInfo

MIB = 1024 * 1024

SOFTWARE_PACKAGES = (
    "torch",
    "deepspeed",
    "accelerate",
    "nvidia-ml-py",
    "nvidia-nccl-cu12",
    "nvidia-nccl-cu13",
    "psutil",
    "pydantic",
)


def _cpu_model_name(cpuinfo: str | Path = "/proc/cpuinfo") -> str | None:
    try:
        for line in Path(cpuinfo).read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def effective_cores(logical: int | None, affinity: int | None, quota: float | None) -> tuple[int, str]:
    """The cores this process may really use: min(logical, affinity, floor(quota)), at least 1."""
    candidates = []
    if logical:
        candidates.append((logical, f"{logical} logical cores"))
    if affinity:
        candidates.append((affinity, f"CPU affinity allows {affinity}"))
    if quota is not None:
        candidates.append((max(1, int(quota)), f"cgroup CPU quota is {quota:g} cores"))
    if not candidates:
        return 1, "core count unknown; assuming 1"
    value, why = min(candidates, key=lambda c: c[0])
    others = [w for v, w in candidates if w != why]
    tail = f" (also: {'; '.join(others)})" if others else ""
    return value, f"{why}{tail}"


def probe_cpu(psutil: Any, cg: CgroupLimits, unknown: dict[str, str], cpuinfo: str | Path = "/proc/cpuinfo") -> CPUInfo:
    pr = Probes(unknown)
    logical = pr.get("cpu.logical_cores", lambda: psutil.cpu_count(logical=True))
    physical = pr.get("cpu.physical_cores", lambda: psutil.cpu_count(logical=False))
    if physical is None and "cpu.physical_cores" not in unknown:
        pr.note("cpu.physical_cores", "psutil could not tell physical cores")
    affinity = pr.get("cpu.affinity_cores", lambda: len(psutil.Process().cpu_affinity()))
    if "cpu" in cg.errors:
        pr.note("cpu.cgroup_quota_cores", cg.errors["cpu"])
    eff, why = effective_cores(logical, affinity, cg.cpu_quota_cores)
    return CPUInfo(
        model_name=_cpu_model_name(cpuinfo),
        physical_cores=physical,
        logical_cores=logical,
        affinity_cores=affinity,
        cgroup_quota_cores=cg.cpu_quota_cores,
        cgroup_version=cg.version,
        effective_cores=eff,
        effective_cores_reason=why,
    )


def probe_memory(psutil: Any, cg: CgroupLimits, unknown: dict[str, str]) -> MemoryInfo:
    vm = Probes(unknown).get("memory.total_mib", psutil.virtual_memory)
    total = avail = None
    if vm is None:
        unknown["memory.available_mib"] = unknown["memory.total_mib"]
    else:
        total, avail = vm.total // MIB, vm.available // MIB
    limit = cg.memory_limit_bytes // MIB if cg.memory_limit_bytes is not None else None
    if "memory" in cg.errors:
        unknown["memory.cgroup_limit_mib"] = cg.errors["memory"]
    candidates = [(v, w) for v, w in ((avail, "available RAM"), (limit, "the cgroup memory limit")) if v is not None]
    if candidates:
        eff, which = min(candidates, key=lambda c: c[0])
        why = f"{which} ({eff / 1024:.1f} GiB) is the tighter bound"
        if limit is None:
            why = f"available RAM ({eff / 1024:.1f} GiB); no cgroup memory limit"
    else:
        eff, why = None, "RAM unknown"
        unknown["memory.effective_mib"] = why
    return MemoryInfo(total_mib=total, available_mib=avail, cgroup_limit_mib=limit, effective_mib=eff,
                      effective_reason=why)


def probe_infiniband(sys_class: str | Path, unknown: dict[str, str]) -> tuple[str, ...] | None:
    p = Path(sys_class) / "infiniband"
    if not p.exists():
        return ()
    try:
        return tuple(sorted(x.name for x in p.iterdir()))
    except OSError as e:
        unknown["infiniband"] = f"cannot list {p}: {e.strerror}"
        return None


def parse_ib_rate(text: str) -> float | None:
    """Gb/s from a port's ``rate`` file ("400 Gb/sec (4X NDR)"); None when it says no rate."""
    found = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text)
    return float(found.group(1)) if found and float(found.group(1)) > 0 else None


def probe_infiniband_rate(sys_class: str | Path, adapters: tuple[str, ...] | None) -> float | None:
    """The slowest active port's rate among the adapters (Gb/s); None when no port says (a down port reads
    ``state`` other than ACTIVE and is skipped)."""
    rates = []
    for name in adapters or ():
        for port in sorted((Path(sys_class) / "infiniband" / name / "ports").glob("*")):
            try:
                if "ACTIVE" not in (port / "state").read_text():
                    continue
                rate = parse_ib_rate((port / "rate").read_text())
            except OSError:
                continue
            if rate:
                rates.append(rate)
    return min(rates) if rates else None


def _int_or_none(v: str | None) -> int | None:
    try:
        return int(v) if v is not None else None
    except ValueError:
        return None


def parse_slurm_env(environ: Mapping[str, str]) -> SlurmInfo | None:
    if "SLURM_JOB_ID" not in environ:
        return None
    return SlurmInfo(
        job_id=environ.get("SLURM_JOB_ID"),
        num_nodes=_int_or_none(environ.get("SLURM_JOB_NUM_NODES", environ.get("SLURM_NNODES"))),
        nodelist=environ.get("SLURM_JOB_NODELIST", environ.get("SLURM_NODELIST")),
        ntasks=_int_or_none(environ.get("SLURM_NTASKS")),
        ntasks_per_node=environ.get("SLURM_NTASKS_PER_NODE"),
        cpus_per_task=_int_or_none(environ.get("SLURM_CPUS_PER_TASK")),
        gpus=environ.get("SLURM_GPUS_ON_NODE", environ.get("SLURM_GPUS")),
        partition=environ.get("SLURM_JOB_PARTITION"),
        **_allocation_fields(environ),
    )


def _allocation_fields(environ: Mapping[str, str]) -> dict:
    """Node index, expanded host list, GPUs and memory per node; empty when the variables are unreadable
    (the planner then says what is missing)."""
    from autotune.errors import UserError
    from autotune.hardware.slurm import allocation

    try:
        a = allocation(environ)
    except UserError:
        return {}
    if a is None:
        return {}
    return {"node_id": a.node_rank if "SLURM_NODEID" in environ else None,
            "hosts": a.hosts,  # () without a node list
            "gpus_per_node": a.gpus_per_node, "mem_per_node_mib": a.mem_per_node_mib}


def _normalize(name: str) -> str:
    """PEP 503 name normalisation: case and runs of - _ . do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions(search_path: list[str] | None = None) -> dict[str, str]:
    """{normalised name: version} from the ``<name>-<version>.dist-info`` folders pip writes (PEP 627),
    first sys.path entry first, as ``importlib.metadata.version`` resolves them. One directory listing
    per path entry instead of importing importlib.metadata (about 30 ms of the report's start-up)."""
    found: dict[str, str] = {}
    for entry in search_path if search_path is not None else sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for folder in names:
            m = _DIST_INFO.match(folder)
            if m:
                found.setdefault(_normalize(m["name"]), m["version"])
    return found


_DIST_INFO = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+?)(?:-py\d[\d.]*)?\.(?:dist-info|egg-info)$")


def software_versions(search_path: list[str] | None = None) -> dict[str, str | None]:
    versions = installed_versions(search_path)
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in SOFTWARE_PACKAGES:
        out[name] = versions.get(_normalize(name))
    return out
