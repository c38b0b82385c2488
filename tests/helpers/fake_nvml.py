"""A fake pynvml driven by a recorded hardware profile (the gpustat way).

``FakeNVML.from_profile(profile)`` answers NVML calls with the GPUs of a preset;
scenario knobs reproduce the failures detection must survive:

- ``library_missing``: nvmlInit raises NVMLError_LibraryNotFound (no driver);
- ``init_error``: nvmlInit raises another NVMLError (driver/library mismatch);
- ``failing_queries``: {(nvml_index, "nvmlDeviceGetMemoryInfo"), ...} raise for one GPU;
  ``(None, "nvmlSystemGetDriverVersion")`` and the like raise for a system-wide query;
- ``dead_gpus``: {nvml_index}: every query on that GPU raises (GPU fallen off the bus);
- ``mig``: {nvml_index: [(mig_uuid, mig_name, total_mib, free_mib), ...]}: MIG enabled;
- ``p2p_error``: nvmlDeviceGetP2PStatus raises (old driver).
- ``mig_handles_restricted``: a MIG instance's handle refuses the per-GPU queries (compute
  capability, PCI info, MIG mode) with NotSupported: NVML says MIG handles work "with some
  restrictions", so detection must ask the parent GPU's handle for those;
- ``fail_from_call``: {name: n}: the n-th call of ``name`` and every later one raise (a handle
  that was there when the GPUs were listed and is gone when detection opens it again).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace

# The real nvidia-ml-py values (tests/unit/hardware/test_hardware.py compares them with the installed
# module): READ is a one-element tuple there, a stray comma in the bindings.
NVML_P2P_CAPS_INDEX_READ = (0,)
NVML_P2P_CAPS_INDEX_NVLINK = 2
NVML_P2P_STATUS_OK = 0
NVML_P2P_STATUS_NOT_SUPPORTED = 5
MIB = 1024 * 1024


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):
    def __str__(self):
        return "NVML Shared Library Not Found"


class NVMLError_DriverNotLoaded(NVMLError):
    def __str__(self):
        return "Driver Not Loaded"


class NVMLError_Unknown(NVMLError):
    def __str__(self):
        return "Unknown Error"


class NVMLError_GpuIsLost(NVMLError):
    def __str__(self):
        return "GPU is lost"


class NVMLError_NotSupported(NVMLError):
    def __str__(self):
        return "Not Supported"


@dataclass
class _Dev:
    uuid: str
    name: str
    total_mib: int
    free_mib: int
    cc: tuple[int, int]
    bus_id: str
    speed: tuple = (None, None, None, None)  # max SM clock, max memory clock (MHz), PCIe gen, width; None: refused


@dataclass
class _Handle:
    index: int
    mig: int | None = None


@dataclass
class FakeNVML:
    devices: list[_Dev]
    nvlink_pairs: set = field(default_factory=set)
    p2p_pairs: set = field(default_factory=set)
    library_missing: bool = False
    init_error: bool = False
    failing_queries: set = field(default_factory=set)
    dead_gpus: set = field(default_factory=set)
    mig: dict = field(default_factory=dict)
    p2p_error: bool = False
    driver: str = "550.54.15"
    cuda: int = 12040
    mig_not_supported: bool = False
    mig_pending_off: bool = False  # MIG on now, off after the next reset: only "current" counts
    mig_handles_restricted: bool = False
    fail_from_call: dict = field(default_factory=dict)
    calls: list = field(default_factory=list)
    initialised: int = 0

    NVML_P2P_CAPS_INDEX_READ = NVML_P2P_CAPS_INDEX_READ
    NVML_P2P_CAPS_INDEX_NVLINK = NVML_P2P_CAPS_INDEX_NVLINK
    NVML_P2P_STATUS_OK = NVML_P2P_STATUS_OK
    NVMLError = NVMLError

    @classmethod
    def from_profile(cls, profile, **knobs) -> "FakeNVML":
        devs = []
        for g in profile.gpus.devices:
            major, minor = (int(x) for x in g.compute_capability.split("."))
            devs.append(_Dev(g.uuid, g.name, g.memory_total_mib, g.memory_free_mib, (major, minor), g.pci_bus_id,
                             (g.clocks_max_sm_mhz, g.clocks_max_memory_mhz, g.pcie_link_gen_max,
                              g.pcie_link_width_max)))
        return cls(devs, {tuple(p) for p in profile.gpus.nvlink_pairs}, {tuple(p) for p in profile.gpus.p2p_pairs},
                   **knobs)

    # -- helpers -------------------------------------------------------------
    def _check(self, name: str, h: _Handle | None = None):
        self.calls.append(name)
        if not self.initialised:
            raise NVMLError_Unknown()
        if name in self.fail_from_call and self.calls.count(name) >= self.fail_from_call[name]:
            raise NVMLError_Unknown()
        if h is None and (None, name) in self.failing_queries:  # a system-wide query
            raise NVMLError_Unknown()
        if h is not None:
            if h.index in self.dead_gpus:
                raise NVMLError_GpuIsLost()
            if (h.index, name) in self.failing_queries:
                raise NVMLError_Unknown()

    # -- the NVML surface detection uses --------------------------------------
    def nvmlInit(self):
        if self.library_missing:
            raise NVMLError_LibraryNotFound()
        if self.init_error:
            raise NVMLError_DriverNotLoaded()
        self.initialised += 1

    def nvmlShutdown(self):
        self.initialised -= 1

    def nvmlSystemGetDriverVersion(self):
        self._check("nvmlSystemGetDriverVersion")
        return self.driver

    def nvmlSystemGetCudaDriverVersion(self):
        self._check("nvmlSystemGetCudaDriverVersion")
        return self.cuda

    def nvmlDeviceGetCount(self):
        self._check("nvmlDeviceGetCount")
        return len(self.devices)

    def nvmlDeviceGetHandleByIndex(self, i):
        self._check("nvmlDeviceGetHandleByIndex")
        if not 0 <= i < len(self.devices) or (i, "nvmlDeviceGetHandleByIndex") in self.failing_queries:
            raise NVMLError_Unknown()
        return _Handle(i)

    def nvmlDeviceGetUUID(self, h):
        self._check("nvmlDeviceGetUUID", h)
        if h.mig is not None:
            return self.mig[h.index][h.mig][0]
        return self.devices[h.index].uuid

    def nvmlDeviceGetName(self, h):
        self._check("nvmlDeviceGetName", h)
        if h.mig is not None:
            return self.mig[h.index][h.mig][1]
        return self.devices[h.index].name.encode()  # old bindings return bytes

    def nvmlDeviceGetMemoryInfo(self, h):
        self._check("nvmlDeviceGetMemoryInfo", h)
        if h.mig is not None:
            _, _, total, free = self.mig[h.index][h.mig]
        else:
            d = self.devices[h.index]
            total, free = d.total_mib, d.free_mib
        return SimpleNamespace(total=total * MIB, free=free * MIB, used=(total - free) * MIB)

    def _per_gpu(self, name: str, h: _Handle) -> None:
        self._check(name, h)
        if h.mig is not None and self.mig_handles_restricted:
            raise NVMLError_NotSupported()

    def nvmlDeviceGetCudaComputeCapability(self, h):
        self._per_gpu("nvmlDeviceGetCudaComputeCapability", h)
        return self.devices[h.index].cc

    NVML_CLOCK_SM, NVML_CLOCK_MEM = 1, 2

    def _speed(self, name: str, h: _Handle, i: int):
        self._per_gpu(name, h)
        value = self.devices[h.index].speed[i]
        if value is None:
            raise NVMLError_NotSupported()
        return value

    def nvmlDeviceGetMaxClockInfo(self, h, clock):
        return self._speed("nvmlDeviceGetMaxClockInfo", h, 0 if clock == self.NVML_CLOCK_SM else 1)

    def nvmlDeviceGetMaxPcieLinkGeneration(self, h):
        return self._speed("nvmlDeviceGetMaxPcieLinkGeneration", h, 2)

    def nvmlDeviceGetMaxPcieLinkWidth(self, h):
        return self._speed("nvmlDeviceGetMaxPcieLinkWidth", h, 3)

    def nvmlDeviceGetPciInfo(self, h):
        self._per_gpu("nvmlDeviceGetPciInfo", h)
        return SimpleNamespace(busId=self.devices[h.index].bus_id)

    def nvmlDeviceGetMigMode(self, h):
        self._per_gpu("nvmlDeviceGetMigMode", h)
        if self.mig_not_supported:
            raise NVMLError_NotSupported()
        on = 1 if h.index in self.mig else 0
        return [on, 0 if self.mig_pending_off else on]  # (current, pending), as nvidia-ml-py returns them

    def nvmlDeviceGetMaxMigDeviceCount(self, h):
        if not isinstance(h, _Handle):  # the real library refuses a missing handle
            raise NVMLError_Unknown()
        self._check("nvmlDeviceGetMaxMigDeviceCount", h)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, h, k):
        self._check("nvmlDeviceGetMigDeviceHandleByIndex", h)
        if k >= len(self.mig.get(h.index, [])):
            raise NVMLError_NotSupported()
        return _Handle(h.index, k)

    def nvmlDeviceGetP2PStatus(self, h1, h2, cap):
        self._check("nvmlDeviceGetP2PStatus")
        if not isinstance(cap, int):  # the real binding wraps it in ctypes.c_uint, which takes only an int
            raise TypeError(f"an integer is required (got type {type(cap).__name__})")
        if self.p2p_error:
            raise NVMLError_NotSupported()
        pair = (min(h1.index, h2.index), max(h1.index, h2.index))
        table = self.nvlink_pairs if cap == NVML_P2P_CAPS_INDEX_NVLINK else self.p2p_pairs  # READ: index 0
        return NVML_P2P_STATUS_OK if pair in table else NVML_P2P_STATUS_NOT_SUPPORTED
