"""Detection pinned at its edges, derived by hand from cgroups' and CUDA's rules (the tightest limit wins;
UUID and MIG prefixes), and the fake NVML against the real pynvml."""

import pytest
from helpers.detection import write_tree

from autotune.hardware.cgroups import read_cgroup_limits
from autotune.hardware.visible import PhysicalGPU, Visible, select_visible


# -- cgroups: the tightest limit along the path wins, wherever it is ------------------------------
def test_cgroup_v2_two_finite_limits_tightest_wins_either_way(tmp_path):
    for leaf_cpu, parent_cpu, leaf_mem, parent_mem in [("100000", "300000", 2, 6), ("400000", "200000", 8, 3)]:
        root = write_tree(tmp_path / f"v2-{leaf_cpu}", {
            "cgroup.controllers": "cpu memory\n",
            "a/cpu.max": f"{parent_cpu} 100000\n", "a/memory.max": f"{parent_mem * 2**30}\n",
            "a/b/cpu.max": f"{leaf_cpu} 100000\n", "a/b/memory.max": f"{leaf_mem * 2**30}\n",
        })
        self_cg = write_tree(tmp_path, {f"self-{leaf_cpu}": "0::/a/b\n"}) / f"self-{leaf_cpu}"
        lim = read_cgroup_limits(root, self_cg)
        assert lim.cpu_quota_cores == min(int(leaf_cpu), int(parent_cpu)) / 100000
        assert lim.memory_limit_bytes == min(leaf_mem, parent_mem) * 2**30


def test_cgroup_v1_two_finite_limits_tightest_wins_either_way(tmp_path):
    for leaf, parent in [(1, 5), (6, 2)]:
        root = write_tree(tmp_path / f"v1-{leaf}", {
            "cpu,cpuacct/d/cpu.cfs_quota_us": f"{parent * 100000}\n", "cpu,cpuacct/d/cpu.cfs_period_us": "100000\n",
            "cpu,cpuacct/d/e/cpu.cfs_quota_us": f"{leaf * 100000}\n", "cpu,cpuacct/d/e/cpu.cfs_period_us": "100000\n",
            "memory/d/memory.limit_in_bytes": str(parent * 2**30),
            "memory/d/e/memory.limit_in_bytes": str(leaf * 2**30),
        })
        self_cg = write_tree(tmp_path, {f"s{leaf}": "4:cpu,cpuacct:/d/e\n3:memory:/d/e\n"}) / f"s{leaf}"
        lim = read_cgroup_limits(root, self_cg)
        assert lim.cpu_quota_cores == min(leaf, parent) and lim.memory_limit_bytes == min(leaf, parent) * 2**30


# -- CUDA_VISIBLE_DEVICES: UUID and MIG prefixes, as CUDA resolves them ---------------------------
GPUS = [PhysicalGPU(0, "GPU-aaaa-1111", ("MIG-1111-aaaa", "MIG-1111-bbbb")),
        PhysicalGPU(1, "GPU-aaab-2222", ("MIG-2222-aaaa",))]


@pytest.mark.parametrize("value, visible, stopped", [
    ("GPU-aaaa", [Visible(0)], False),              # a unique prefix is enough
    ("GPU-aaa", [], True),                          # matches both GPUs: ambiguous, CUDA stops
    ("MIG-1111-b", [Visible(0, 1)], False),
    ("MIG-1111", [], True),                         # two MIG instances of GPU 0: ambiguous
    ("MIG-2222-aaaa,MIG-1111-aaaa", [Visible(1, 0), Visible(0, 0)], False),
    ("MIG-2222-aaaa,MIG-2222", [Visible(1, 0)], True),  # the second names the first again: a duplicate
])
def test_uuid_and_mig_prefixes(value, visible, stopped):
    got, note = select_visible(value, GPUS)
    assert got == visible and (note is not None) == stopped


def test_fake_nvml_speaks_the_real_pynvml():
    """Constants and error names of the fake used by the detection tests are the installed module's."""
    import pynvml
    from helpers import fake_nvml

    for name in ("NVML_P2P_CAPS_INDEX_READ", "NVML_P2P_CAPS_INDEX_NVLINK", "NVML_P2P_STATUS_OK",
                 "NVML_P2P_STATUS_NOT_SUPPORTED"):
        assert getattr(fake_nvml, name) == getattr(pynvml, name), name
    for name in ("NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_Unknown",
                 "NVMLError_GpuIsLost", "NVMLError_NotSupported"):
        assert hasattr(pynvml, name), name
    assert str(fake_nvml.NVMLError_LibraryNotFound()) == str(pynvml.NVMLError_LibraryNotFound())
