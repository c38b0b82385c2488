"""Hardware detection: the one thin layer that touches NVML, psutil and sysfs.

``detect()`` returns a frozen :class:`~autotune.profiles.HardwareProfile`. Every probe
fails alone (``probe.Probes``): a missing NVML library, a GPU that errors on one query or
an unreadable cgroup file makes that field unknown, with the reason in
``profile.unknown``, and the rest still works.

- ``visible``  CUDA_VISIBLE_DEVICES as CUDA applies it (pure);
- ``cgroups``  cgroup v1/v2 parsers (pure) and the tightest-ancestor reader;
- ``nvml``     GPUs, MIG, peer links; ``classify_interconnect`` (pure);
- ``host``     CPU, RAM, InfiniBand, SLURM variables, package versions;
- ``kubernetes`` the pod and a training operator's node variables (PET_*, pure).

Never imports torch or deepspeed (2-3 s each). ``python -m autotune.hardware report``
prints the report; ``--json`` the profile.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Mapping

from autotune.hardware.cgroups import (
    CgroupLimits,
    parse_cfs_quota,
    parse_cpu_max,
    parse_memory_limit,
    parse_proc_self_cgroup,
    read_cgroup_limits,
)
from autotune.hardware.host import (
    effective_cores,
    parse_slurm_env,
    probe_cpu,
    probe_infiniband,
    probe_memory,
    software_versions,
)
from autotune.hardware.nvml import classify_interconnect, probe_gpus
from autotune.hardware.pod import pod_info
from autotune.hardware.visible import PhysicalGPU, Visible, select_visible
from autotune.profiles import HardwareProfile

__all__ = [
    "detect", "select_visible", "PhysicalGPU", "Visible", "CgroupLimits", "read_cgroup_limits", "parse_cpu_max",
    "parse_cfs_quota", "parse_memory_limit", "parse_proc_self_cgroup", "effective_cores", "parse_slurm_env",
    "classify_interconnect", "probe_gpus", "probe_cpu", "probe_memory", "probe_infiniband", "software_versions",
]


def detect(
    nvml: Any = None,
    environ: Mapping[str, str] | None = None,
    cgroup_root: str | Path = "/sys/fs/cgroup",
    proc_self_cgroup: str | Path = "/proc/self/cgroup",
    sys_class: str | Path = "/sys/class",
    psutil_module: Any = None,
) -> HardwareProfile:
    """Probe this machine. Every argument exists so tests can substitute a recorded world."""
    environ = os.environ if environ is None else environ
    unknown: dict[str, str] = {}
    gpus = probe_gpus(nvml, environ, unknown)
    if psutil_module is None:
        import psutil as psutil_module
    cg = read_cgroup_limits(cgroup_root, proc_self_cgroup)
    if "cgroup" in cg.errors:
        unknown["cpu.cgroup_quota_cores"] = unknown["memory.cgroup_limit_mib"] = cg.errors["cgroup"]
    cpu = probe_cpu(psutil_module, cg, unknown)
    mem = probe_memory(psutil_module, cg, unknown)
    slurm = parse_slurm_env(environ)
    pod = pod_info(environ)
    try:
        host = socket.gethostname()
    except OSError:
        host = None
    return HardwareProfile(
        source="detected",
        hostname=host,
        num_nodes=slurm.num_nodes if slurm and slurm.num_nodes else (pod.num_nodes if pod and pod.num_nodes else 1),
        gpus=gpus,
        cpu=cpu,
        memory=mem,
        infiniband=probe_infiniband(sys_class, unknown),
        slurm=slurm,
        kubernetes=pod,
        software=software_versions(),
        unknown=unknown,
    )
