"""cgroup v1 and v2 CPU quota and memory limit: pure parsers plus a reader over a root directory.

The limit in force is the tightest along the path from the process's cgroup to the root.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# cgroup v1 reports "no limit" as a huge page-aligned number (e.g. 9223372036854771712).
_CGROUP_UNLIMITED_BYTES = 1 << 60


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
        for c in controllers.split(","):  # the v2 line has none: "".split(",") == [""]
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
    parts = [p for p in rel.split("/") if p]
    dirs = [base.joinpath(*parts[:i]) for i in range(len(parts), -1, -1)]
    return [d for d in dirs if d.is_dir()] or [base]


def _min_limit(values: list[float | int | None]) -> Any:
    present = [v for v in values if v is not None]
    return min(present) if present else None


def read_cgroup_limits(root: str | Path = "/sys/fs/cgroup",
                       proc_self_cgroup: str | Path = "/proc/self/cgroup") -> CgroupLimits:
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
