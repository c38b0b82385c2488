"""The hardware profile: a frozen, JSON round-tripping snapshot of one machine.

Detection (``autotune.hardware``) produces it; the planner and the report read it.
Presets in ``configs/hardware/*.json`` are the same model written by hand from
vendor figures, so users can plan for machines they do not have.

"Unknown" is a value: a probe that fails leaves its field ``None`` and records
why in ``unknown`` (dotted field path -> reason). Field names follow NVML /
nvidia-smi vocabulary with units at the end (``memory_total_mib``).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune.errors import UserError, format_validation_error

SCHEMA_VERSION = 1
PRESET_DIR = Path(__file__).resolve().parent.parent / "configs" / "hardware"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class GPUInfo(_Frozen):
    """One visible GPU, numbered as CUDA numbers it after CUDA_VISIBLE_DEVICES."""

    index: int
    nvml_index: int | None = None
    uuid: str | None = None
    name: str | None = None
    memory_total_mib: int | None = None
    memory_free_mib: int | None = None
    compute_capability: str | None = None  # "8.9"
    pci_bus_id: str | None = None
    mig_mode: bool | None = None
    # This entry is a MIG instance (CUDA_VISIBLE_DEVICES=MIG-...): its memory is the slice's.
    mig_instance: bool = False
    # A whole GPU in MIG mode: the memory of each of its MIG instances (a process gets one).
    mig_slices_mib: tuple[int, ...] = ()
    error: str | None = None  # set when the device failed to answer at all
    # what NVML tells of speed (nvidia-smi's clocks.max.sm, clocks.max.memory, pcie.link.gen.max,
    # pcie.link.width.max); None: not asked (an older profile or a preset) or not answered
    clocks_max_sm_mhz: int | None = None
    clocks_max_memory_mhz: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width_max: int | None = None

    def compute_capability_tuple(self) -> tuple[int, int] | None:
        if not self.compute_capability:
            return None
        found = re.fullmatch(r"([0-9]+)(?:\.([0-9]+))?", self.compute_capability)
        return (int(found.group(1)), int(found.group(2) or 0)) if found else None  # not a capability: unknown


Interconnect = Literal["nvlink", "pcie", "none", "unknown"]


class GPUSection(_Frozen):
    available: bool = False
    reason: str | None = None  # why no GPUs (library missing, CUDA_VISIBLE_DEVICES="", ...)
    driver_version: str | None = None
    cuda_driver_version: str | None = None
    cuda_visible_devices: str | None = None
    devices: tuple[GPUInfo, ...] = ()
    # Pairs of visible indices (i < j) linked by NVLink, as NVML reports it.
    nvlink_pairs: tuple[tuple[int, int], ...] = ()
    # Pairs that NVML says can read each other's memory directly (P2P over PCIe or NVLink).
    p2p_pairs: tuple[tuple[int, int], ...] = ()
    interconnect: Interconnect = "none"
    interconnect_reason: str | None = None

    @property
    def count(self) -> int:
        return len(self.devices)


class CPUInfo(_Frozen):
    model_name: str | None = None
    physical_cores: int | None = None
    logical_cores: int | None = None
    affinity_cores: int | None = None  # len(sched_getaffinity)
    cgroup_quota_cores: float | None = None  # cpu.max / cfs_quota_us, None if unlimited/unknown
    cgroup_version: Literal[1, 2] | None = None  # None: unknown (a profile says null)
    effective_cores: int = 1
    effective_cores_reason: str = ""

    @field_validator("cgroup_version", mode="before")
    @classmethod
    def _no_boolean(cls, v):
        if isinstance(v, bool):  # Literal[1, 2] would take true as 1
            raise ValueError("must be 1, 2 or null (unknown), not true or false")
        return v


class MemoryInfo(_Frozen):
    total_mib: int | None = None
    available_mib: int | None = None
    cgroup_limit_mib: int | None = None
    effective_mib: int | None = None
    effective_reason: str = ""


class SlurmInfo(_Frozen):
    job_id: str | None = None
    num_nodes: int | None = None
    nodelist: str | None = None
    ntasks: int | None = None
    ntasks_per_node: str | None = None
    cpus_per_task: int | None = None
    gpus: str | None = None
    partition: str | None = None
    node_id: int | None = None  # SLURM_NODEID: this node's index in the allocation
    hosts: tuple[str, ...] = ()  # SLURM_JOB_NODELIST expanded, in order
    gpus_per_node: int | None = None
    mem_per_node_mib: int | None = None


class KubernetesInfo(_Frozen):
    """A Kubernetes pod (KUBERNETES_SERVICE_HOST is set) and what a training operator told it about the job:
    the Kubeflow Trainer's PET_NNODES / PET_NODE_RANK / PET_MASTER_ADDR / PET_MASTER_PORT (torchrun's own
    defaults), or the v1 operator's WORLD_SIZE / RANK / MASTER_ADDR where one pod is one node
    (``autotune.hardware.pod``). ``sources`` names the variable each value came from."""

    pod: bool = False
    num_nodes: int | None = Field(None, ge=1, le=100_000)
    node_rank: int | None = Field(None, ge=0)
    master_addr: str | None = Field(None, max_length=253)
    master_port: int | None = Field(None, ge=1, le=65535)
    nproc_per_node: str | None = Field(None, max_length=16)  # PET_NPROC_PER_NODE as given; each node plans its own
    sources: dict[str, str] = {}
    error: str | None = Field(None, max_length=2000)  # a variable that cannot be read: the plan refuses, naming it


class HardwareProfile(_Frozen):
    schema_version: int = SCHEMA_VERSION
    source: str = "detected"  # "detected" or "preset:<name>" or a file path
    description: str | None = None
    hostname: str | None = None
    num_nodes: int = Field(1, ge=1)  # identical nodes this profile stands for
    gpus: GPUSection = GPUSection()
    cpu: CPUInfo = CPUInfo()
    memory: MemoryInfo = MemoryInfo()
    infiniband: tuple[str, ...] | None = None  # None = unknown, () = none present
    # the slowest active InfiniBand port's rate, Gb/s, as the adapter reports it (ports/N/rate); None = unknown
    infiniband_rate_gbps: float | None = Field(None, gt=0, le=6400)
    slurm: SlurmInfo | None = None
    kubernetes: KubernetesInfo | None = None
    software: dict[str, str | None] = {}
    unknown: dict[str, str] = {}  # dotted field -> why it is unknown

    # -- convenience -------------------------------------------------------
    @property
    def num_gpus(self) -> int:
        return self.gpus.count

    def to_json(self, indent: int | None = 2) -> str:
        return self.model_dump_json(indent=indent)

    @classmethod
    def from_json(cls, text: str, origin: str = "<profile>") -> "HardwareProfile":
        from autotune.safe_input import load_json

        data = load_json(text, origin)
        if isinstance(data, dict) and data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
            raise UserError(f"{origin}: schema_version {data.get('schema_version')!r} is not one this autotune "
                            f"reads ({SCHEMA_VERSION}); write the profile again with "
                            "`python -m autotune.hardware report --json`")
        try:
            profile = cls.model_validate(_tuples(data), strict=True)
        except ValidationError as e:
            raise UserError(format_validation_error(
                e, f"{origin}: not a valid hardware profile; fix the fields below or write the profile again with "
                   "`python -m autotune.hardware report --json`",
                keys_in="`python -m autotune.hardware report --json` or a preset in configs/hardware/")) from None
        problems = profile_problems(profile)
        if problems:
            raise UserError(f"{origin}: not a possible machine ({len(problems)} problem(s)); fix the numbers or "
                            "write the profile again with `python -m autotune.hardware report --json`", problems)
        return profile


def _tuples(value):
    """JSON's lists as the profile's tuples: a profile from a file or a peer is validated strictly (true is no count,
    '4' no number), and strict validation takes a tuple only as a tuple."""
    if isinstance(value, list):
        return tuple(_tuples(v) for v in value)
    if isinstance(value, dict):
        return {k: _tuples(v) for k, v in value.items()}
    return value


def peer_profile(data, node: int) -> HardwareProfile:
    """A profile another node sent over the nodes' exchange, with the checks a profile file gets (its schema, its
    fields, numbers no machine has): UserError "node N sent an impossible profile: field ..." (exit 2) otherwise."""
    from autotune.errors import validation_problems

    head = f"node {node} sent an impossible profile"
    if not isinstance(data, dict):
        raise UserError(f"{head}: not a JSON object")
    if data.get("schema_version", SCHEMA_VERSION) != SCHEMA_VERSION:
        raise UserError(f"{head}: field schema_version: {data.get('schema_version')!r}, this autotune reads "
                        f"{SCHEMA_VERSION}; run the same autotune on every node")
    try:
        profile = HardwareProfile.model_validate(_tuples(data), strict=True)
    except ValidationError as e:
        problems = validation_problems(e, keys_in="`python -m autotune.hardware report --json`")
    else:
        problems = profile_problems(profile)
    if problems:
        raise UserError(f"{head}: field {problems[0]}", problems[1:])
    return profile


# Numbers no machine has: generous, finite bounds (a profile file or a peer is outside input; its numbers become
# OMP_NUM_THREADS, world sizes and memory budgets). Linux builds for at most 8192 CPUs; 64 GPUs in one node, 64 TiB
# of host memory and 4 TiB on one GPU are each several times what any machine has had.
MAX_NODES = 65536
MAX_GPUS_PER_NODE = 64
MAX_CORES = 8192
MAX_HOST_MEMORY_MIB = 64 << 20  # 64 TiB
MAX_GPU_MEMORY_MIB = 4 << 20  # 4 TiB
MAX_CLOCK_MHZ = 100_000
MAX_PCIE = {"pcie_link_gen_max": 32, "pcie_link_width_max": 64}
# Text is printed (reports, plans, errors): printable, and bounded. Reasons may span lines; names may not.
MAX_TEXT_CHARS = 4096
MAX_NODELIST_CHARS = 1 << 20  # SLURM's compressed list of a large job's scattered nodes is long
MAX_ENTRIES = MAX_NODES  # entries of a list or mapping (slurm.hosts: one per node; software, unknown)
_FREE_TEXT = {"reason", "error", "interconnect_reason", "effective_cores_reason", "effective_reason", "description"}


def _text_problem(where: str, v: str, lines: bool = False, in_key: bool = False,
                  limit: int = MAX_TEXT_CHARS) -> str | None:
    bad = next((i for i, ch in enumerate(v) if not ch.isprintable() and not (lines and ch in "\n\t")), None)
    if bad is not None:
        return f"{where}: a control character ({v[bad]!r} at {bad}){' in a key' if in_key else ''}: text only"
    if len(v) > limit:
        return f"{where}: {len(v)} characters{' in a key' if in_key else ''}, at most {limit}"
    return None


def _text_problems(where: str, value, field: str = "") -> list[str]:
    """Every string in ``value`` (a profile's data, as JSON would hold it), each named by its dotted field."""
    if isinstance(value, str):
        found = _text_problem(where, value, lines=field in _FREE_TEXT or where.startswith("unknown."),
                              limit=MAX_NODELIST_CHARS if where == "slurm.nodelist" else MAX_TEXT_CHARS)
        return [found] if found else []
    out = []
    if isinstance(value, (dict, list, tuple)) and len(value) > MAX_ENTRIES:
        return [f"{where}: {len(value)} entries, at most {MAX_ENTRIES}"]
    if isinstance(value, dict):
        for k, v in value.items():
            key_problem = _text_problem(where, str(k), in_key=True)
            if key_problem:
                out.append(key_problem)
                continue
            out += _text_problems(f"{where}.{k}" if where else str(k), v, str(k))
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            out += _text_problems(f"{where}[{i}]", v, field)
    return out


def _bound_problems(p: HardwareProfile) -> list[str]:
    out = []

    def at_most(where: str, v, limit: int, unit: str = "") -> None:
        if v is not None and v > limit:
            shown = v if v < 10 ** 40 else f"a number of {len(str(v))} digits"
            out.append(f"{where}: at most {limit}{unit}, got {shown}")

    at_most("num_nodes", p.num_nodes, MAX_NODES)
    if len(p.gpus.devices) > MAX_GPUS_PER_NODE:
        out.append(f"gpus.devices: {len(p.gpus.devices)} GPUs, at most {MAX_GPUS_PER_NODE} in one node")
    for i, d in enumerate(p.gpus.devices[:MAX_GPUS_PER_NODE]):
        where = f"gpus.devices[{i}]"
        at_most(f"{where}.memory_total_mib", d.memory_total_mib, MAX_GPU_MEMORY_MIB, " (4 TiB)")
        at_most(f"{where}.memory_free_mib", d.memory_free_mib, MAX_GPU_MEMORY_MIB, " (4 TiB)")
        at_most(f"{where}.mig_slices_mib", max(d.mig_slices_mib, default=None), MAX_GPU_MEMORY_MIB, " (4 TiB) each")
        for name in ("clocks_max_sm_mhz", "clocks_max_memory_mhz"):
            at_most(f"{where}.{name}", getattr(d, name), MAX_CLOCK_MHZ)
        for name, limit in MAX_PCIE.items():
            at_most(f"{where}.{name}", getattr(d, name), limit)
    for name in ("effective_cores", "physical_cores", "logical_cores", "affinity_cores"):
        at_most(f"cpu.{name}", getattr(p.cpu, name), MAX_CORES)
    for name in ("total_mib", "available_mib", "cgroup_limit_mib", "effective_mib"):
        at_most(f"memory.{name}", getattr(p.memory, name), MAX_HOST_MEMORY_MIB, " (64 TiB)")
    if p.slurm is not None:
        at_most("slurm.num_nodes", p.slurm.num_nodes, MAX_NODES)
        at_most("slurm.ntasks", p.slurm.ntasks, MAX_NODES * MAX_GPUS_PER_NODE)
        at_most("slurm.cpus_per_task", p.slurm.cpus_per_task, MAX_CORES)
        at_most("slurm.gpus_per_node", p.slurm.gpus_per_node, MAX_GPUS_PER_NODE)
        at_most("slurm.mem_per_node_mib", p.slurm.mem_per_node_mib, MAX_HOST_MEMORY_MIB, " (64 TiB)")
    return out


def profile_problems(p: HardwareProfile) -> list[str]:
    """Numbers no machine has, in a profile read from a file or sent by a peer (detection records unknowns as None
    and is not checked here: a strange probe must never stop a report): impossible values, values past the bounds
    above, and text that is not printable or is too long (named, never shown: it could hold terminal escapes)."""
    out = _bound_problems(p)
    g = p.gpus
    if g.available and not g.devices:
        out.append("gpus.available: true, but gpus.devices lists none")
    if g.devices and not g.available:
        out.append("gpus.available: false, but gpus.devices lists GPUs")
    indexes = [d.index for d in g.devices]
    if len(set(indexes)) != len(indexes):
        out.append(f"gpus.devices: repeated index in {indexes}")
    for i, d in enumerate(g.devices):
        where = f"gpus.devices[{i}]"
        if d.index < 0:
            out.append(f"{where}.index: must be >= 0, got {d.index}")
        if d.memory_total_mib is not None and d.memory_total_mib <= 0:
            out.append(f"{where}.memory_total_mib: must be positive, got {d.memory_total_mib}")
        if d.memory_free_mib is not None and d.memory_free_mib < 0:
            out.append(f"{where}.memory_free_mib: must be >= 0, got {d.memory_free_mib}")
        if (d.memory_free_mib is not None and d.memory_total_mib is not None and d.memory_total_mib > 0
                and d.memory_free_mib > d.memory_total_mib):
            out.append(f"{where}.memory_free_mib: {d.memory_free_mib} is more than memory_total_mib "
                       f"{d.memory_total_mib}")
        if d.compute_capability is not None:
            # ASCII digits: str.isdigit() also takes "²", which int() refuses
            if not re.fullmatch(r"[0-9]+(\.[0-9]+)?", d.compute_capability):
                out.append(f"{where}.compute_capability: must look like \"8.9\", got {d.compute_capability!r}")
        if any(s <= 0 for s in d.mig_slices_mib):
            out.append(f"{where}.mig_slices_mib: every slice must be positive, got {list(d.mig_slices_mib)}")
    for a, b in (*g.nvlink_pairs, *g.p2p_pairs):
        if a not in indexes or b not in indexes:
            out.append(f"gpus: link ({a}, {b}) names a GPU that gpus.devices does not list")
    c = p.cpu
    if c.effective_cores < 1:
        out.append(f"cpu.effective_cores: must be >= 1, got {c.effective_cores}")
    for name in ("physical_cores", "logical_cores", "affinity_cores"):
        v = getattr(c, name)
        if v is not None and v < 1:
            out.append(f"cpu.{name}: must be >= 1 or null (unknown), got {v}")
    if c.cgroup_quota_cores is not None and not (0 < c.cgroup_quota_cores < 1e6):
        out.append(f"cpu.cgroup_quota_cores: must be positive, got {c.cgroup_quota_cores}")
    m = p.memory
    for name in ("total_mib", "available_mib", "cgroup_limit_mib", "effective_mib"):
        v = getattr(m, name)
        if v is not None and v < 0:
            out.append(f"memory.{name}: must be >= 0 or null (unknown), got {v}")
    from autotune.safe_input import host_problem

    hosts = [("kubernetes.master_addr", p.kubernetes.master_addr if p.kubernetes else None),
             *((f"slurm.hosts[{i}]", h) for i, h in enumerate(p.slurm.hosts[:MAX_ENTRIES] if p.slurm else ()))]
    out += [f"{where}: {host_problem(h)}" for where, h in hosts if h is not None and host_problem(h)]
    return out + _text_problems("", p.model_dump(mode="json"))


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_profile(spec: str) -> HardwareProfile:
    """Load a profile from a preset name (``4xL4``) or a JSON file path."""
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        from autotune.safe_input import read_text

        return HardwareProfile.from_json(read_text(path, "--hardware/--profile"), origin=str(path))
    preset = PRESET_DIR / f"{spec}.json"
    if not preset.is_file():
        raise UserError(
            f"--hardware/--profile: unknown preset {spec!r}; choose one of "
            f"{', '.join(preset_names())} or give a path to a profile JSON "
            "(write one with `python -m autotune.hardware report --json > my.json`)"
        )
    profile = HardwareProfile.from_json(preset.read_text(), origin=str(preset))
    return profile.model_copy(update={"source": f"preset:{spec}"})
