"""Hardware detection: the one thin layer that touches NVML, psutil and sysfs.

``detect()`` returns a frozen :class:`HardwareProfile`. Every probe fails
alone: a missing NVML library, a GPU that errors on one query or an unreadable
cgroup file makes that field unknown (with the reason recorded in
``profile.unknown``) and the rest still works. Parsers of sysfs/cgroup text and
of ``CUDA_VISIBLE_DEVICES`` are pure functions, tested on recorded text.

This module must never import torch or deepspeed (2-3 s each); package
versions come from ``importlib.metadata``.

Run ``python -m autotune.hardware report`` for the human report, ``--json``
for the profile.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

from autotune.profiles import (
    CPUInfo,
    GPUInfo,
    GPUSection,
    HardwareProfile,
    MemoryInfo,
    SlurmInfo,
)

MIB = 1024 * 1024
# cgroup v1 reports "no limit" as a huge page-aligned number (e.g. 9223372036854771712).
_CGROUP_UNLIMITED_BYTES = 1 << 60

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


# ---------------------------------------------------------------------------
# CUDA_VISIBLE_DEVICES (pure)
# ---------------------------------------------------------------------------

@dataclass(frozen=True)
class PhysicalGPU:
    """What the visibility rules need to know about one NVML device."""

    nvml_index: int
    uuid: str | None
    mig_uuids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Visible:
    nvml_index: int
    mig_index: int | None = None  # index into PhysicalGPU.mig_uuids


def select_visible(value: str | None, gpus: list[PhysicalGPU]) -> tuple[list[Visible], str | None]:
    """Apply CUDA_VISIBLE_DEVICES as the CUDA runtime does.

    - unset: every device, in NVML order;
    - "" (or only spaces): no device;
    - comma-separated entries: integer indices, ``GPU-<uuid>`` (a unique prefix
      is enough) or ``MIG-<uuid>``; the list ends at the first invalid entry
      (unknown index, unknown or ambiguous UUID, a duplicate), as CUDA does.

    Returns the visible devices in CUDA order and a note when entries were dropped.
    """
    if value is None:
        return [Visible(g.nvml_index) for g in gpus], None
    entries = [e.strip() for e in value.split(",")]
    if not any(entries):
        return [], 'CUDA_VISIBLE_DEVICES is empty: CUDA sees no GPU'
    out: list[Visible] = []
    for pos, entry in enumerate(entries):
        hit: Visible | None = None
        if entry.lstrip("-").isdigit():
            idx = int(entry)
            if 0 <= idx < len(gpus):
                hit = Visible(gpus[idx].nvml_index)
        elif entry.startswith("MIG-"):
            matches = [
                Visible(g.nvml_index, k)
                for g in gpus
                for k, mu in enumerate(g.mig_uuids)
                if mu == entry or mu.startswith(entry)
            ]
            hit = matches[0] if len(matches) == 1 else None
        elif entry.startswith("GPU-"):
            matches = [Visible(g.nvml_index) for g in gpus if g.uuid and g.uuid.startswith(entry)]
            hit = matches[0] if len(matches) == 1 else None
        if hit is None or hit in out:
            why = "a duplicate" if hit is not None else "not a valid device"
            dropped = ",".join(entries[pos:])
            return out, (
                f"CUDA_VISIBLE_DEVICES entry {entry!r} is {why}; CUDA stops there, "
                f"so {dropped!r} is ignored"
            )
        out.append(hit)
    return out, None


# ---------------------------------------------------------------------------
# cgroups (pure parsers + a reader over a root directory)
# ---------------------------------------------------------------------------

def parse_cpu_max(text: str) -> float | None:
    """cgroup v2 ``cpu.max``: "max 100000" -> None, "200000 100000" -> 2.0."""
    parts = text.split()
    if not parts:
        raise ValueError("empty cpu.max")
    if parts[0] == "max":
        return None
    quota = int(parts[0])
    period = int(parts[1]) if len(parts) > 1 else 100000
    if period <= 0:
        raise ValueError(f"bad period in cpu.max: {text!r}")
    return quota / period


def parse_cfs_quota(quota_text: str, period_text: str) -> float | None:
    """cgroup v1 ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``: -1 means no quota."""
    quota = int(quota_text.strip())
    period = int(period_text.strip())
    if quota <= 0 or period <= 0:
        return None
    return quota / period


def parse_memory_limit(text: str) -> int | None:
    """v2 ``memory.max`` ("max" or bytes) or v1 ``memory.limit_in_bytes`` -> bytes or None."""
    t = text.strip()
    if t == "max":
        return None
    value = int(t)
    if value >= _CGROUP_UNLIMITED_BYTES:
        return None
    return value


def parse_proc_self_cgroup(text: str) -> dict[str, str]:
    """``/proc/self/cgroup`` -> {controller: path}; the v2 entry is keyed ""."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        parts = line.strip().split(":", 2)
        if len(parts) != 3:
            continue
        _, controllers, path = parts
        for c in controllers.split(",") if controllers else [""]:
            out[c] = path
    return out


@dataclass
class CgroupLimits:
    version: int | None = None
    cpu_quota_cores: float | None = None
    memory_limit_bytes: int | None = None
    errors: dict[str, str] = field(default_factory=dict)


def _candidate_dirs(base: Path, rel: str) -> list[Path]:
    """The process's cgroup dir and its ancestors inside ``base`` (limits nest)."""
    rel = rel.strip("/")
    dirs = []
    parts = rel.split("/") if rel else []
    for i in range(len(parts), -1, -1):
        d = base.joinpath(*parts[:i]) if i else base
        if d.is_dir():
            dirs.append(d)
    return dirs or [base]


def _min_limit(values: list[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def read_cgroup_limits(root: str | Path = "/sys/fs/cgroup", proc_self_cgroup: str | Path = "/proc/self/cgroup") -> CgroupLimits:
    """Read CPU quota and memory limit for this process, cgroup v2 or v1.

    The limit in force is the smallest along the path from the process's cgroup
    to the root, so every ancestor present under ``root`` is read.
    """
    root = Path(root)
    res = CgroupLimits()
    try:
        paths = parse_proc_self_cgroup(Path(proc_self_cgroup).read_text())
    except OSError:
        paths = {}
    if (root / "cgroup.controllers").exists():
        res.version = 2
        dirs = _candidate_dirs(root, paths.get("", "/"))
        cpu, mem = [], []
        for d in dirs:
            try:
                if (d / "cpu.max").exists():
                    cpu.append(parse_cpu_max((d / "cpu.max").read_text()))
            except (OSError, ValueError) as e:
                res.errors["cpu"] = f"cannot read {d / 'cpu.max'}: {e}"
            try:
                if (d / "memory.max").exists():
                    mem.append(parse_memory_limit((d / "memory.max").read_text()))
            except (OSError, ValueError) as e:
                res.errors["memory"] = f"cannot read {d / 'memory.max'}: {e}"
        res.cpu_quota_cores = _min_limit(cpu)
        res.memory_limit_bytes = _min_limit(mem)
        return res
    cpu_base = next((root / n for n in ("cpu", "cpu,cpuacct", "cpuacct,cpu") if (root / n).is_dir()), None)
    mem_base = root / "memory" if (root / "memory").is_dir() else None
    if cpu_base is None and mem_base is None:
        res.errors["cgroup"] = f"no cgroup v1 or v2 hierarchy under {root}"
        return res
    res.version = 1
    if cpu_base is not None:
        rel = paths.get("cpu", paths.get("cpuacct", "/"))
        cpu = []
        for d in _candidate_dirs(cpu_base, rel):
            try:
                q, p = d / "cpu.cfs_quota_us", d / "cpu.cfs_period_us"
                if q.exists() and p.exists():
                    cpu.append(parse_cfs_quota(q.read_text(), p.read_text()))
            except (OSError, ValueError) as e:
                res.errors["cpu"] = f"cannot read {d / 'cpu.cfs_quota_us'}: {e}"
        res.cpu_quota_cores = _min_limit(cpu)
    if mem_base is not None:
        mem = []
        for d in _candidate_dirs(mem_base, paths.get("memory", "/")):
            try:
                f = d / "memory.limit_in_bytes"
                if f.exists():
                    mem.append(parse_memory_limit(f.read_text()))
            except (OSError, ValueError) as e:
                res.errors["memory"] = f"cannot read {d / 'memory.limit_in_bytes'}: {e}"
        res.memory_limit_bytes = _min_limit(mem)
    return res


# ---------------------------------------------------------------------------
# NVML
# ---------------------------------------------------------------------------

def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _err(e: BaseException) -> str:
    name = type(e).__name__
    msg = str(e)
    return f"{name}: {msg}" if msg and msg not in name else name


def _load_nvml():
    import pynvml  # from nvidia-ml-py; ~80 ms, no torch

    return pynvml


def probe_gpus(nvml: Any, environ: Mapping[str, str], unknown: dict[str, str]) -> GPUSection:
    """Query NVML for the visible GPUs. Never raises."""
    visible_env = environ.get("CUDA_VISIBLE_DEVICES")
    base = {"cuda_visible_devices": visible_env}
    if nvml is None:
        try:
            nvml = _load_nvml()
        except Exception as e:  # nvidia-ml-py not installed
            unknown["gpus"] = f"nvidia-ml-py is not installed ({_err(e)})"
            return GPUSection(reason=unknown["gpus"], interconnect="unknown", **base)
    try:
        nvml.nvmlInit()
    except Exception as e:
        # NVMLError_LibraryNotFound on machines without the NVIDIA driver: a normal CPU machine.
        if "LibraryNotFound" in type(e).__name__ or "Library Not Found" in str(e):
            return GPUSection(reason="no NVIDIA driver (NVML library not found)", **base)
        unknown["gpus"] = f"NVML failed to initialise ({_err(e)})"
        return GPUSection(reason=unknown["gpus"], interconnect="unknown", **base)
    try:
        return _probe_initialised(nvml, visible_env, unknown)
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:
            pass


def _probe_initialised(nvml: Any, visible_env: str | None, unknown: dict[str, str]) -> GPUSection:
    driver = cuda = None
    try:
        driver = _text(nvml.nvmlSystemGetDriverVersion())
    except Exception as e:
        unknown["gpus.driver_version"] = _err(e)
    try:
        v = int(nvml.nvmlSystemGetCudaDriverVersion())
        cuda = f"{v // 1000}.{(v % 1000) // 10}"
    except Exception as e:
        unknown["gpus.cuda_driver_version"] = _err(e)
    try:
        count = int(nvml.nvmlDeviceGetCount())
    except Exception as e:
        unknown["gpus"] = f"NVML could not count devices ({_err(e)})"
        return GPUSection(reason=unknown["gpus"], driver_version=driver, cuda_driver_version=cuda,
                          cuda_visible_devices=visible_env, interconnect="unknown")

    handles: list[Any] = []
    physical: list[PhysicalGPU] = []
    for i in range(count):
        h = uuid = None
        migs: list[str] = []
        try:
            h = nvml.nvmlDeviceGetHandleByIndex(i)
            uuid = _text(nvml.nvmlDeviceGetUUID(h))
        except Exception:
            pass
        if h is not None:
            migs = _mig_uuids(nvml, h)
        handles.append(h)
        physical.append(PhysicalGPU(i, uuid, tuple(migs)))

    visible, note = select_visible(visible_env, physical)
    if note:
        unknown["gpus.cuda_visible_devices"] = note
    devices = []
    vis_handles = []
    for cuda_index, v in enumerate(visible):
        h = handles[v.nvml_index]
        if v.mig_index is not None and h is not None:
            try:
                h = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, v.mig_index)
            except Exception as e:
                unknown[f"gpus.devices[{cuda_index}]"] = _err(e)
                h = None
        devices.append(_probe_device(nvml, h, cuda_index, v, unknown, mig_instance=v.mig_index is not None))
        vis_handles.append(h)

    pairs_nvlink, pairs_p2p, link_err = _probe_links(nvml, vis_handles)
    if len(devices) < 2:
        interconnect, why = "none", "fewer than two visible GPUs"
    elif link_err:
        interconnect = "unknown"
        why = f"NVML did not report peer links ({link_err}); treated as PCIe"
        unknown["gpus.interconnect"] = why
    elif pairs_nvlink and len(pairs_nvlink) == len(devices) * (len(devices) - 1) // 2:
        interconnect, why = "nvlink", "NVML reports NVLink between every pair of visible GPUs"
    elif pairs_nvlink:
        interconnect, why = "nvlink", f"NVML reports NVLink between {len(pairs_nvlink)} of the GPU pairs; the rest use PCIe"
    else:
        p2p = "with" if pairs_p2p else "without"
        interconnect, why = "pcie", f"no NVLink reported; PCIe {p2p} peer-to-peer reads"
    reason = None if devices else (note or "NVML found no GPU")
    return GPUSection(
        available=bool(devices),
        reason=reason,
        driver_version=driver,
        cuda_driver_version=cuda,
        cuda_visible_devices=visible_env,
        devices=tuple(devices),
        nvlink_pairs=tuple(pairs_nvlink),
        p2p_pairs=tuple(pairs_p2p),
        interconnect=interconnect,
        interconnect_reason=why,
    )


def _mig_uuids(nvml: Any, h: Any) -> list[str]:
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(h)
    except Exception:
        return []
    if not current:
        return []
    out = []
    try:
        for k in range(int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))):
            try:
                mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)
                out.append(_text(nvml.nvmlDeviceGetUUID(mh)))
            except Exception:
                break  # MIG slots are filled from 0; the first gap ends them
    except Exception:
        pass
    return out


def _probe_device(nvml: Any, h: Any, cuda_index: int, v: Visible, unknown: dict[str, str], mig_instance: bool) -> GPUInfo:
    key = f"gpus.devices[{cuda_index}]"
    if h is None:
        unknown.setdefault(key, "NVML returned no handle for this device")
        return GPUInfo(index=cuda_index, nvml_index=v.nvml_index, error=unknown[key])
    vals: dict[str, Any] = {}

    def q(name: str, fn):
        try:
            vals[name] = fn()
        except Exception as e:
            unknown[f"{key}.{name}"] = _err(e)

    q("uuid", lambda: _text(nvml.nvmlDeviceGetUUID(h)))
    q("name", lambda: _text(nvml.nvmlDeviceGetName(h)))

    def mem():
        m = nvml.nvmlDeviceGetMemoryInfo(h)
        vals["memory_free_mib"] = int(m.free) // MIB
        return int(m.total) // MIB

    q("memory_total_mib", mem)
    if "memory_total_mib" not in vals:
        unknown[f"{key}.memory_free_mib"] = unknown[f"{key}.memory_total_mib"]
    # A MIG instance shares its parent's compute capability and PCI address.
    parent = h
    if mig_instance:
        try:
            parent = nvml.nvmlDeviceGetHandleByIndex(v.nvml_index)
        except Exception as e:
            unknown[f"{key}.compute_capability"] = _err(e)

    def cc():
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(parent)
        return f"{int(major)}.{int(minor)}"

    q("compute_capability", cc)
    q("pci_bus_id", lambda: _text(nvml.nvmlDeviceGetPciInfo(parent).busId))

    def mig():
        current, _pending = nvml.nvmlDeviceGetMigMode(parent)
        return bool(current)

    q("mig_mode", mig)
    if "mig_mode" not in vals and "NotSupported" in unknown.get(f"{key}.mig_mode", ""):
        # GPUs before Ampere have no MIG at all: that is a "no", not an unknown.
        unknown.pop(f"{key}.mig_mode")
        vals["mig_mode"] = False
    failed = [k for k in ("name", "memory_total_mib", "compute_capability") if k not in vals]
    error = None
    if len(failed) == 3:
        error = "device did not answer NVML queries"
    return GPUInfo(index=cuda_index, nvml_index=v.nvml_index, error=error, **vals)


def _probe_links(nvml: Any, handles: list[Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]], str | None]:
    nvlink, p2p = [], []
    if len(handles) < 2:
        return nvlink, p2p, None
    ok = getattr(nvml, "NVML_P2P_STATUS_OK", 0)
    idx_nvlink = getattr(nvml, "NVML_P2P_CAPS_INDEX_NVLINK", 2)
    idx_read = getattr(nvml, "NVML_P2P_CAPS_INDEX_READ", 0)
    if isinstance(idx_read, tuple):  # nvidia-ml-py defines it with a stray comma
        idx_read = idx_read[0]
    try:
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                if handles[i] is None or handles[j] is None:
                    raise RuntimeError(f"GPU {i if handles[i] is None else j} has no handle")
                if nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], idx_nvlink) == ok:
                    nvlink.append((i, j))
                if nvml.nvmlDeviceGetP2PStatus(handles[i], handles[j], idx_read) == ok:
                    p2p.append((i, j))
    except Exception as e:
        return [], [], _err(e)
    return nvlink, p2p, None


# ---------------------------------------------------------------------------
# CPU, memory, InfiniBand, SLURM, software
# ---------------------------------------------------------------------------

def _cpu_model_name() -> str | None:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
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


def probe_cpu(psutil: Any, cg: CgroupLimits, unknown: dict[str, str]) -> CPUInfo:
    logical = physical = affinity = None
    try:
        logical = psutil.cpu_count(logical=True)
    except Exception as e:
        unknown["cpu.logical_cores"] = _err(e)
    try:
        physical = psutil.cpu_count(logical=False)
        if physical is None:
            unknown["cpu.physical_cores"] = "psutil could not tell physical cores"
    except Exception as e:
        unknown["cpu.physical_cores"] = _err(e)
    try:
        affinity = len(psutil.Process().cpu_affinity())
    except Exception as e:
        unknown["cpu.affinity_cores"] = _err(e)
    if "cpu" in cg.errors:
        unknown["cpu.cgroup_quota_cores"] = cg.errors["cpu"]
    eff, why = effective_cores(logical, affinity, cg.cpu_quota_cores)
    return CPUInfo(
        model_name=_cpu_model_name(),
        physical_cores=physical,
        logical_cores=logical,
        affinity_cores=affinity,
        cgroup_quota_cores=cg.cpu_quota_cores,
        cgroup_version=cg.version,
        effective_cores=eff,
        effective_cores_reason=why,
    )


def probe_memory(psutil: Any, cg: CgroupLimits, unknown: dict[str, str]) -> MemoryInfo:
    total = avail = None
    try:
        vm = psutil.virtual_memory()
        total, avail = vm.total // MIB, vm.available // MIB
    except Exception as e:
        unknown["memory.total_mib"] = unknown["memory.available_mib"] = _err(e)
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
    return MemoryInfo(total_mib=total, available_mib=avail, cgroup_limit_mib=limit, effective_mib=eff, effective_reason=why)


def probe_infiniband(sys_class: str | Path, unknown: dict[str, str]) -> tuple[str, ...] | None:
    p = Path(sys_class) / "infiniband"
    if not p.exists():
        return ()
    try:
        return tuple(sorted(x.name for x in p.iterdir()))
    except OSError as e:
        unknown["infiniband"] = f"cannot list {p}: {e.strerror}"
        return None


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
    )


def software_versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in SOFTWARE_PACKAGES:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = None
    return out


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
    num_nodes = slurm.num_nodes if slurm and slurm.num_nodes else 1
    try:
        host = socket.gethostname()
    except OSError:
        host = None
    return HardwareProfile(
        source="detected",
        hostname=host,
        num_nodes=num_nodes,
        gpus=gpus,
        cpu=cpu,
        memory=mem,
        infiniband=probe_infiniband(sys_class, unknown),
        slurm=slurm,
        software=software_versions(),
        unknown=unknown,
    )


if __name__ == "__main__":  # python -m autotune.hardware report
    import sys

    from autotune.commands.report import main

    sys.exit(main(sys.argv[1:]))
