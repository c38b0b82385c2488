"""The hardware profile: a frozen, JSON round-tripping snapshot of one machine.

Detection (``autotune.hardware``) produces it; the planner and the report read it.
Presets in ``configs/hardware/*.json`` are the same model written by hand from
vendor figures, so users can plan for machines they do not have.

"Unknown" is a value: a probe that fails leaves its field ``None`` and records
why in ``unknown`` (dotted field path -> reason). Field names follow NVML /
nvidia-smi vocabulary with units at the end (``memory_total_mib``). A profile
read from a file or sent by a peer passes ``profile_checks.profile_problems``.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from autotune.errors import UserError, format_validation_error
from autotune.profile_checks import profile_problems

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
    source: str = "detected"  # "detected" (this machine, now), "preset:<name>" or "file:<path>"
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


def preset_names() -> list[str]:
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def load_profile(spec: str) -> HardwareProfile:
    """Load a profile from a preset name (``4xL4``) or a JSON file path. Either is another machine, never this one
    (``source`` "preset:<name>" or "file:<path>", whatever the file says): a file written by ``report --json`` on
    this machine and edited, or copied from another, is planned for, never timed here nor given this environment's
    OMP_NUM_THREADS."""
    path = Path(spec)
    if path.suffix == ".json" or path.exists():
        from autotune.safe_input import read_text

        profile = HardwareProfile.from_json(read_text(path, "--hardware/--profile"), origin=str(path))
        return profile.model_copy(update={"source": f"file:{path}"})
    preset = PRESET_DIR / f"{spec}.json"
    if not preset.is_file():
        raise UserError(
            f"--hardware/--profile: unknown preset {spec!r}; choose one of "
            f"{', '.join(preset_names())} or give a path to a profile JSON "
            "(write one with `python -m autotune.hardware report --json > my.json`)"
        )
    profile = HardwareProfile.from_json(preset.read_text(), origin=str(preset))
    return profile.model_copy(update={"source": f"preset:{spec}"})
