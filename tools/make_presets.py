"""Regenerate configs/hardware/*.json from the vendor figures below.

Memory figures are what NVML reports as memory.total (MiB) on each card, e.g.
an L4 sold as 24 GB shows 23034 MiB (22.5 GiB). Compute capabilities from
https://developer.nvidia.com/cuda-gpus. Host figures are the common cloud
shapes for each GPU (GCP g2-standard-48 for 4xL4, AWS g4dn.12xlarge for 4xT4,
GCP a2-ultragpu-4g for 4xA100-80GB, AWS p4d.24xlarge for 8xA100-40GB,
DGX H100 for 8xH100). Run: python tools/make_presets.py [--out DIR]
"""
import argparse
import json
from itertools import combinations
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "configs" / "hardware"

GPU = {  # name, memory.total MiB, typical free MiB right after boot, cc
    "T4": ("Tesla T4", 15360, 14930, "7.5"),
    "L4": ("NVIDIA L4", 23034, 22563, "8.9"),
    "A100-40GB": ("NVIDIA A100-SXM4-40GB", 40960, 40326, "8.0"),
    "A100-80GB": ("NVIDIA A100-SXM4-80GB", 81920, 81050, "8.0"),
    "H100-80GB": ("NVIDIA H100 80GB HBM3", 81559, 80994, "9.0"),
    "RTX4090": ("NVIDIA GeForce RTX 4090", 24564, 24080, "8.9"),
}


def gpus(kind, n, link, p2p=True, driver="550.54.15", cuda="12.4"):
    name, total, free, cc = GPU[kind]
    devs = [
        {
            "index": i, "nvml_index": i,
            "uuid": f"GPU-{kind.lower().replace('-', '')[:6]:0<6}-{i:04d}-4a1b-9c2d-{i:012d}",
            "name": name, "memory_total_mib": total, "memory_free_mib": free,
            "compute_capability": cc, "pci_bus_id": f"00000000:{0x10 + i:02X}:00.0", "mig_mode": False,
        }
        for i in range(n)
    ]
    pairs = [list(p) for p in combinations(range(n), 2)]
    if n < 2:
        inter, why = "none", "fewer than two visible GPUs"
    elif link == "nvlink":
        inter, why = "nvlink", "NVML reports NVLink between every pair of visible GPUs"
    else:
        inter = "pcie"
        why = "no NVLink reported; PCIe " + ("with" if p2p else "without") + " peer-to-peer reads"
    return {
        "available": True, "driver_version": driver, "cuda_driver_version": cuda,
        "devices": devs, "nvlink_pairs": pairs if link == "nvlink" else [],
        "p2p_pairs": pairs if (p2p or link == "nvlink") else [],
        "interconnect": inter, "interconnect_reason": why,
    }


def cpu(cores, threads):
    return {"model_name": None, "physical_cores": cores, "logical_cores": threads, "affinity_cores": threads,
            "cgroup_quota_cores": None, "cgroup_version": 2, "effective_cores": threads,
            "effective_cores_reason": f"{threads} logical cores"}


def mem(gib):
    mib = gib * 1024
    return {"total_mib": mib, "available_mib": int(mib * 0.95), "cgroup_limit_mib": None,
            "effective_mib": int(mib * 0.95),
            "effective_reason": f"available RAM ({mib * 0.95 / 1024:.1f} GiB); no cgroup memory limit"}


NO_GPU = {"available": False, "reason": "no NVIDIA driver (NVML library not found)", "devices": [],
          "interconnect": "none"}

PRESETS = {
    "cpu-only": ("Laptop or CI runner without a GPU: 8 threads, 32 GiB", 1, NO_GPU, cpu(4, 8), mem(32), []),
    "1xT4": ("One T4 16 GB (GCP n1-standard-8)", 1, gpus("T4", 1, "pcie"), cpu(4, 8), mem(30), []),
    "4xT4": ("4x T4 16 GB, PCIe (AWS g4dn.12xlarge)", 1, gpus("T4", 4, "pcie"), cpu(24, 48), mem(192), []),
    "4xL4": ("4x L4 24 GB, PCIe (GCP g2-standard-48)", 1, gpus("L4", 4, "pcie"), cpu(24, 48), mem(192), []),
    "4xA100-80GB": ("4x A100 SXM4 80 GB, NVLink (GCP a2-ultragpu-4g)", 1, gpus("A100-80GB", 4, "nvlink"),
                    cpu(24, 48), mem(680), []),
    "8xA100-40GB": ("8x A100 SXM4 40 GB, NVSwitch (AWS p4d.24xlarge)", 1, gpus("A100-40GB", 8, "nvlink"),
                    cpu(48, 96), mem(1152), []),
    "8xH100-80GB": ("8x H100 SXM5 80 GB, NVLink/NVSwitch, 8 InfiniBand HCAs (DGX H100)", 1,
                    gpus("H100-80GB", 8, "nvlink"), cpu(112, 224), mem(2048), [f"mlx5_{i}" for i in range(8)]),
    "2xRTX4090": ("2x GeForce RTX 4090 24 GB on PCIe, no P2P (workstation)", 1, gpus("RTX4090", 2, "pcie", p2p=False),
                  cpu(16, 32), mem(128), []),
    "2x4xL4": ("Two nodes, each 4x L4 24 GB (GCP g2-standard-48), Ethernet between nodes", 2, gpus("L4", 4, "pcie"),
               cpu(24, 48), mem(192), []),
}



def main(argv=None):
    ap = argparse.ArgumentParser(description="write configs/hardware/*.json from the figures above")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    out = ap.parse_args(argv).out
    out.mkdir(parents=True, exist_ok=True)
    for name, (desc, nodes, g, c, m, ib) in PRESETS.items():
        prof = {"schema_version": 1, "source": f"preset:{name}", "description": desc, "hostname": None,
                "num_nodes": nodes, "gpus": g, "cpu": c, "memory": m, "infiniband": ib, "slurm": None,
                "software": {}, "unknown": {}}
        (out / f"{name}.json").write_text(json.dumps(prof, indent=2) + "\n")
        print("wrote", out / f"{name}.json")


if __name__ == "__main__":
    main()
