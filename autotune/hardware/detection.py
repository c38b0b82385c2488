"""``detect()``: this machine as a frozen HardwareProfile, every probe failing alone (the package's face says
which module probes what). Every argument of ``detect`` exists so tests can substitute a recorded world."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Mapping

from autotune.hardware.cgroups import (
    read_cgroup_limits,
)
from autotune.hardware.host import (
    parse_slurm_env,
    probe_cpu,
    probe_infiniband,
    probe_infiniband_rate,
    probe_memory,
    software_versions,
)
from autotune.hardware.nvml import probe_gpus
from autotune.hardware.pod import pod_info
from autotune.profiles import HardwareProfile


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
        infiniband=(ib := probe_infiniband(sys_class, unknown)),
        infiniband_rate_gbps=probe_infiniband_rate(sys_class, ib),
        slurm=slurm,
        kubernetes=pod,
        software=software_versions(),
        unknown=unknown,
    )
