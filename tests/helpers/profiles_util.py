"""Hand-written profiles for planner tests."""

from autotune.profiles import CPUInfo, GPUInfo, GPUSection, HardwareProfile, MemoryInfo, load_profile


def make_profile(gpus=(), cores=16, ram_gib=64, nodes=1, interconnect="pcie", deepspeed="0.19.8",
                 infiniband=()) -> HardwareProfile:
    """gpus: iterable of (name, total_mib, free_mib, cc) tuples."""
    devs = tuple(
        GPUInfo(index=i, nvml_index=i, name=n, memory_total_mib=t, memory_free_mib=f, compute_capability=cc)
        for i, (n, t, f, cc) in enumerate(gpus)
    )
    return HardwareProfile(
        source="test", num_nodes=nodes,
        gpus=GPUSection(available=bool(devs), devices=devs, interconnect=interconnect if len(devs) > 1 else "none"),
        cpu=CPUInfo(logical_cores=cores, physical_cores=cores, effective_cores=cores,
                    effective_cores_reason=f"{cores} cores"),
        memory=MemoryInfo(total_mib=ram_gib * 1024, available_mib=ram_gib * 1024, effective_mib=ram_gib * 1024),
        infiniband=infiniband,
        software={"deepspeed": deepspeed},
    )


L4 = ("NVIDIA L4", 23034, 22563, "8.9")
T4 = ("Tesla T4", 15360, 14930, "7.5")
V100 = ("Tesla V100-SXM2-16GB", 16384, 16000, "7.0")
A100 = ("NVIDIA A100-SXM4-80GB", 81920, 81050, "8.0")


def preset_with_gpus(name: str, n: int) -> HardwareProfile:
    """A preset widened or narrowed to n identical GPUs (e.g. 8xL4 from 4xL4)."""
    p = load_profile(name)
    g = p.gpus.devices[0]
    devs = tuple(g.model_copy(update={"index": i, "nvml_index": i}) for i in range(n))
    return p.model_copy(update={"gpus": p.gpus.model_copy(update={"devices": devs})})
