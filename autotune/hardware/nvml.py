"""GPUs through NVML (``nvidia-ml-py``, imported as ``pynvml``): never raises.

Field names follow nvidia-smi's (``memory.total`` -> ``memory_total_mib``). A GPU that
fails every query becomes a placeholder record with its error, so the rest still prints.
``classify_interconnect`` is a pure function of the peer-link answers.
"""

from __future__ import annotations

from typing import Any, Mapping

from autotune.hardware.fail_alone import Probes, describe, text
from autotune.hardware.visible import PhysicalGPU, Visible, select_visible
from autotune.profiles import GPUInfo, GPUSection

MIB = 1024 * 1024


def _load_nvml():
    import pynvml  # from nvidia-ml-py; ~80 ms, no torch

    return pynvml


def probe_gpus(nvml: Any, environ: Mapping[str, str], unknown: dict[str, str]) -> GPUSection:
    """Query NVML for the GPUs CUDA_VISIBLE_DEVICES leaves visible."""
    visible_env = environ.get("CUDA_VISIBLE_DEVICES")
    base = {"cuda_visible_devices": visible_env}
    if nvml is None:
        try:
            nvml = _load_nvml()
        except Exception as e:  # nvidia-ml-py not installed (or broken)
            unknown["gpus"] = f"nvidia-ml-py is not installed ({describe(e)})"
            return GPUSection(reason=unknown["gpus"], interconnect="unknown", **base)
    try:
        nvml.nvmlInit()
    except Exception as e:
        # NVMLError_LibraryNotFound on machines without the NVIDIA driver: a normal CPU machine.
        if "LibraryNotFound" in type(e).__name__ or "Library Not Found" in str(e):
            return GPUSection(reason="no NVIDIA driver (NVML library not found)", **base)
        unknown["gpus"] = f"NVML failed to initialise ({describe(e)})"
        return GPUSection(reason=unknown["gpus"], interconnect="unknown", **base)
    try:
        return _probe_initialised(nvml, visible_env, Probes(unknown))
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception:  # nothing to report: the answers are already in
            pass


def _cuda_version(nvml: Any) -> str:
    v = int(nvml.nvmlSystemGetCudaDriverVersion())
    return f"{v // 1000}.{(v % 1000) // 10}"


def _probe_initialised(nvml: Any, visible_env: str | None, pr: Probes) -> GPUSection:
    driver = pr.get("gpus.driver_version", lambda: text(nvml.nvmlSystemGetDriverVersion()))
    cuda = pr.get("gpus.cuda_driver_version", lambda: _cuda_version(nvml))
    count = pr.get("gpus", lambda: int(nvml.nvmlDeviceGetCount()))
    if count is None:
        pr.note("gpus", f"NVML could not count devices ({pr.unknown['gpus']})")
        return GPUSection(reason=pr.unknown["gpus"], driver_version=driver, cuda_driver_version=cuda,
                          cuda_visible_devices=visible_env, interconnect="unknown")

    # A device that cannot even give its handle is reported below, per visible index.
    handles = [_try(lambda i=i: nvml.nvmlDeviceGetHandleByIndex(i)) for i in range(count)]
    physical = [PhysicalGPU(i, _try(lambda h=h: text(nvml.nvmlDeviceGetUUID(h))), tuple(_mig_uuids(nvml, h)))
                if h is not None else PhysicalGPU(i, None) for i, h in enumerate(handles)]
    visible, note = select_visible(visible_env, physical)
    if note:
        pr.note("gpus.cuda_visible_devices", note)
    devices, vis_handles = [], []
    for cuda_index, v in enumerate(visible):
        h = handles[v.nvml_index]
        if v.mig_index is not None and h is not None:
            h = pr.get(f"gpus.devices[{cuda_index}]",
                       lambda h=h, v=v: nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, v.mig_index))
        devices.append(_probe_device(nvml, h, cuda_index, v, pr))
        vis_handles.append(h)

    nvlink, p2p, link_err = _probe_links(nvml, vis_handles)
    interconnect, why = classify_interconnect(len(devices), nvlink, p2p, link_err)
    if link_err:
        pr.note("gpus.interconnect", why)
    return GPUSection(
        available=bool(devices), reason=None if devices else (note or "NVML found no GPU"),
        driver_version=driver, cuda_driver_version=cuda, cuda_visible_devices=visible_env,
        devices=tuple(devices), nvlink_pairs=tuple(nvlink), p2p_pairs=tuple(p2p),
        interconnect=interconnect, interconnect_reason=why,
    )


def classify_interconnect(num_devices: int, nvlink_pairs: list, p2p_pairs: list,
                          link_error: str | None) -> tuple[str, str]:
    """(nvlink | pcie | none | unknown, why) from NVML's peer-link answers (pure)."""
    if num_devices < 2:
        return "none", "fewer than two visible GPUs"
    if link_error:
        return "unknown", f"NVML did not report peer links ({link_error}); treated as PCIe"
    all_pairs = num_devices * (num_devices - 1) // 2
    if nvlink_pairs and len(nvlink_pairs) == all_pairs:
        return "nvlink", "NVML reports NVLink between every pair of visible GPUs"
    if nvlink_pairs:
        return "nvlink", f"NVML reports NVLink between {len(nvlink_pairs)} of the GPU pairs; the rest use PCIe"
    return "pcie", f"no NVLink reported; PCIe {'with' if p2p_pairs else 'without'} peer-to-peer reads"


def _try(fn):
    """fn(), or None when NVML refuses (for probes whose failure the caller reports itself)."""
    try:
        return fn()
    except Exception:  # any NVML failure here means "no answer"
        return None


def _mig_uuids(nvml: Any, h: Any) -> list[str]:
    """UUIDs of a GPU's MIG instances; [] when MIG is off or unsupported."""
    mode = _try(lambda: nvml.nvmlDeviceGetMigMode(h))  # (current, pending)
    if not mode or not mode[0]:
        return []
    out: list[str] = []
    for k in range(_try(lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))) or 0):
        uuid = _try(lambda k=k: text(nvml.nvmlDeviceGetUUID(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k))))
        if uuid is None:
            break  # MIG slots are filled from 0; the first gap ends them
        out.append(uuid)
    return out


def _mig_slices_mib(nvml: Any, h: Any) -> list[int]:
    """Memory of each MIG instance of a GPU in MIG mode (a process gets one of them)."""
    out: list[int] = []
    for k in range(_try(lambda: int(nvml.nvmlDeviceGetMaxMigDeviceCount(h))) or 0):
        mem = _try(lambda k=k: nvml.nvmlDeviceGetMemoryInfo(nvml.nvmlDeviceGetMigDeviceHandleByIndex(h, k)))
        if mem is None:
            break
        out.append(int(mem.total) // MIB)
    return out


def _probe_device(nvml: Any, h: Any, cuda_index: int, v: Visible, pr: Probes) -> GPUInfo:
    key = f"gpus.devices[{cuda_index}]"
    if h is None:
        pr.unknown.setdefault(key, "NVML returned no handle for this device")
        return GPUInfo(index=cuda_index, nvml_index=v.nvml_index, error=pr.unknown[key])
    vals: dict[str, Any] = {}

    def q(name: str, fn) -> None:
        value = pr.get(f"{key}.{name}", fn)
        if f"{key}.{name}" not in pr.unknown:
            vals[name] = value

    q("uuid", lambda: text(nvml.nvmlDeviceGetUUID(h)))
    q("name", lambda: text(nvml.nvmlDeviceGetName(h)))
    mem = pr.get(f"{key}.memory_total_mib", lambda: nvml.nvmlDeviceGetMemoryInfo(h))
    if mem is None:
        pr.note(f"{key}.memory_free_mib", pr.unknown[f"{key}.memory_total_mib"])
    else:
        vals.update(memory_total_mib=int(mem.total) // MIB, memory_free_mib=int(mem.free) // MIB)
    # A MIG instance shares its parent's compute capability and PCI address.
    parent = h
    if v.mig_index is not None:
        parent = pr.get(f"{key}.compute_capability", lambda: nvml.nvmlDeviceGetHandleByIndex(v.nvml_index), h)

    def cc():
        major, minor = nvml.nvmlDeviceGetCudaComputeCapability(parent)
        return f"{int(major)}.{int(minor)}"

    q("compute_capability", cc)
    q("pci_bus_id", lambda: text(nvml.nvmlDeviceGetPciInfo(parent).busId))
    q("mig_mode", lambda: bool(nvml.nvmlDeviceGetMigMode(parent)[0]))
    if "NotSupported" in pr.unknown.get(f"{key}.mig_mode", ""):
        # GPUs before Ampere have no MIG at all: that is a "no", not an unknown.
        pr.unknown.pop(f"{key}.mig_mode")
        vals["mig_mode"] = False
    if v.mig_index is not None:
        vals["mig_instance"] = True
    elif vals.get("mig_mode"):
        vals["mig_slices_mib"] = tuple(_mig_slices_mib(nvml, h))
    # speed facts for the step-time model (nvidia-smi's clocks.max.sm, clocks.max.memory, pcie.link.gen.max,
    # pcie.link.width.max): optional, so a refusal leaves them None (the GPU table's row stands) and is not an unknown
    for field, ask in (("clocks_max_sm_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(parent, nvml.NVML_CLOCK_SM)),
                       ("clocks_max_memory_mhz", lambda: nvml.nvmlDeviceGetMaxClockInfo(parent, nvml.NVML_CLOCK_MEM)),
                       ("pcie_link_gen_max", lambda: nvml.nvmlDeviceGetMaxPcieLinkGeneration(parent)),
                       ("pcie_link_width_max", lambda: nvml.nvmlDeviceGetMaxPcieLinkWidth(parent))):
        value = _try(ask)
        if isinstance(value, int) and value > 0:
            vals[field] = value
    failed = [k for k in ("name", "memory_total_mib", "compute_capability") if k not in vals]
    error = "device did not answer NVML queries" if len(failed) == 3 else None
    return GPUInfo(index=cuda_index, nvml_index=v.nvml_index, error=error, **vals)


def _probe_links(nvml: Any, handles: list[Any]) -> tuple[list[tuple[int, int]], list[tuple[int, int]], str | None]:
    """(NVLink pairs, P2P-read pairs, error) among the visible GPUs."""
    nvlink: list[tuple[int, int]] = []
    p2p: list[tuple[int, int]] = []
    if len(handles) < 2:
        return nvlink, p2p, None
    ok, idx_nvlink, idx_read = nvml.NVML_P2P_STATUS_OK, nvml.NVML_P2P_CAPS_INDEX_NVLINK, nvml.NVML_P2P_CAPS_INDEX_READ
    if isinstance(idx_read, tuple):  # nvidia-ml-py defines it with a stray comma: (0,)
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
    except Exception as e:  # old drivers: peer queries unsupported
        return [], [], describe(e)
    return nvlink, p2p, None
