"""Edges of detection, from recorded inputs and the rules they implement: cgroup files, /proc/cpuinfo,
CUDA_VISIBLE_DEVICES, NVML's answers and failures, NVML peer links, SLURM's variables, the whole CPU and memory
records."""

import pytest
from helpers.detection import FakePsutil, run_detect, write_tree
from helpers.fake_nvml import FakeNVML, NVMLError_Unknown
from helpers.profiles_util import preset_with_gpus

from autotune.hardware.cgroups import (
    CgroupLimits,
    parse_cfs_quota,
    parse_cpu_max,
    parse_memory_limit,
    parse_proc_self_cgroup,
    read_cgroup_limits,
)
from autotune.hardware.host import probe_cpu
from autotune.hardware.nvml import classify_interconnect
from autotune.hardware.visible import PhysicalGPU, Visible, select_visible
from autotune.profiles import load_profile


# -- cgroup text --------------------------------------------------------------------------------
def test_cpu_max_edges():
    assert parse_cpu_max("150000") == 1.5  # no period: the kernel's default 100000 us
    assert parse_cpu_max("100000 1") == 100000.0  # a 1 us period is odd but valid
    for bad in ("", "100000 0", "100000 -5"):
        with pytest.raises(ValueError, match="cpu.max"):
            parse_cpu_max(bad)


def test_cfs_quota_edges():
    assert parse_cfs_quota("1", "100000") == 1e-5  # the smallest quota is still a quota
    assert parse_cfs_quota("50000", "1") == 50000.0
    for quota, period in (("0", "100000"), ("-1", "100000"), ("100000", "0"), ("100000", "-1")):
        assert parse_cfs_quota(quota, period) is None


def test_memory_limit_unlimited_boundary():
    assert parse_memory_limit(str(1 << 60)) is None
    assert parse_memory_limit(str((1 << 60) - 4096)) == (1 << 60) - 4096


def test_proc_self_cgroup_keeps_colons_in_paths():
    assert parse_proc_self_cgroup("0::/a:b/c\n") == {"": "/a:b/c"}
    assert parse_proc_self_cgroup("4:cpu:/x:y\nnot a line\n") == {"cpu": "/x:y"}


def _self(tmp_path, name, text):
    return write_tree(tmp_path, {name: text}) / name


def test_cgroup_v1_cpu_dir_spellings_and_cpuacct_path(tmp_path):
    for dirname in ("cpu", "cpu,cpuacct", "cpuacct,cpu"):
        root = write_tree(tmp_path / dirname.replace(",", "_"), {
            f"{dirname}/j/cpu.cfs_quota_us": "250000\n", f"{dirname}/j/cpu.cfs_period_us": "100000\n"})
        lim = read_cgroup_limits(root, _self(tmp_path, "s-" + dirname, "7:cpuacct:/j\n"))  # only cpuacct named
        assert (lim.version, lim.cpu_quota_cores, lim.memory_limit_bytes) == (1, 2.5, None), dirname


def test_cgroup_v1_with_only_memory_or_only_cpu(tmp_path):
    mem = write_tree(tmp_path / "m", {"memory/memory.limit_in_bytes": str(3 * 2**30)})
    lim = read_cgroup_limits(mem, tmp_path / "missing")
    assert (lim.version, lim.cpu_quota_cores, lim.memory_limit_bytes, lim.errors) == (1, None, 3 * 2**30, {})
    cpu = write_tree(tmp_path / "c", {"cpu/cpu.cfs_quota_us": "200000", "cpu/cpu.cfs_period_us": "100000"})
    lim = read_cgroup_limits(cpu, tmp_path / "missing")
    assert (lim.version, lim.cpu_quota_cores, lim.memory_limit_bytes, lim.errors) == (1, 2.0, None, {})


def test_no_cgroup_hierarchy_is_named(tmp_path):
    (tmp_path / "empty").mkdir()
    lim = read_cgroup_limits(tmp_path / "empty", tmp_path / "missing")
    assert lim.version is None and lim.errors == {"cgroup": f"no cgroup v1 or v2 hierarchy under {tmp_path / 'empty'}"}


def test_unreadable_cgroup_files_name_the_file(tmp_path):
    root = write_tree(tmp_path / "cg", {"cgroup.controllers": "cpu memory\n", "cpu.max": "garbage\n"})
    (root / "memory.max").mkdir()
    lim = read_cgroup_limits(root, tmp_path / "missing")
    assert lim.errors["cpu"].startswith(f"cannot read {root / 'cpu.max'}: ")
    assert lim.errors["memory"].startswith(f"cannot read {root / 'memory.max'}: ")


def test_default_paths_are_this_machines():
    assert read_cgroup_limits() == read_cgroup_limits("/sys/fs/cgroup", "/proc/self/cgroup")
    assert read_cgroup_limits().version in (1, 2)  # this machine has a cgroup hierarchy


# -- /proc/cpuinfo and affinity ----------------------------------------------------------------------
class AffinityPsutil(FakePsutil):
    def Process(self):
        from types import SimpleNamespace
        return SimpleNamespace(cpu_affinity=lambda: [0, 2, 5])


def test_cpu_model_name_and_affinity(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: X\nmodel name\t: Test CPU 9000 @ 3GHz\nflags\t: a b\n")
    unknown = {}
    cpu = probe_cpu(AffinityPsutil(logical=8), CgroupLimits(), unknown, cpuinfo=info)
    assert cpu.model_name == "Test CPU 9000 @ 3GHz"
    assert (cpu.affinity_cores, cpu.effective_cores) == (3, 3) and unknown == {}


def test_cpu_model_name_without_a_model_line_is_the_platform_s_or_unknown(tmp_path, monkeypatch):
    import platform

    from autotune.hardware.host import _cpu_model_name

    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nCPU implementer\t: 0x41\n")  # an ARM cpuinfo has no "model name"
    monkeypatch.setattr(platform, "processor", lambda: "aarch64")
    assert _cpu_model_name(info) == "aarch64"
    monkeypatch.setattr(platform, "processor", lambda: "")
    assert _cpu_model_name(info) is None and _cpu_model_name(tmp_path / "missing") is None


# -- CUDA_VISIBLE_DEVICES ------------------------------------------------------------------------------
FOUR = [PhysicalGPU(i, f"GPU-{i}000") for i in range(4)]


def test_visible_index_edges_and_notes():
    assert select_visible("4", FOUR) == ([], "CUDA_VISIBLE_DEVICES entry '4' is not a valid device; CUDA stops there, "
                                             "so '4' is ignored")
    assert select_visible("3,1-,0", FOUR) == ([Visible(3)], "CUDA_VISIBLE_DEVICES entry '1-' is not a valid device; "
                                                           "CUDA stops there, so '1-,0' is ignored")
    assert select_visible("1,1", FOUR)[1] == ("CUDA_VISIBLE_DEVICES entry '1' is a duplicate; CUDA stops there, "
                                              "so '1' is ignored")


# -- NVML peer links (pure) ------------------------------------------------------------------------------
def test_classify_interconnect():
    assert classify_interconnect(1, [], [], None) == ("none", "fewer than two visible GPUs")
    assert classify_interconnect(2, [], [], "NotSupported") == (
        "unknown", "NVML did not report peer links (NotSupported); treated as PCIe")
    assert classify_interconnect(3, [(0, 1), (0, 2), (1, 2)], [], None) == (
        "nvlink", "NVML reports NVLink between every pair of visible GPUs")
    assert classify_interconnect(4, [(0, 1), (2, 3)], [], None) == (
        "nvlink", "NVML reports NVLink between 2 of the GPU pairs; the rest use PCIe")
    assert classify_interconnect(2, [], [(0, 1)], None) == ("pcie", "no NVLink reported; PCIe with peer-to-peer reads")
    assert classify_interconnect(2, [], [], None) == ("pcie", "no NVLink reported; PCIe without peer-to-peer reads")


# -- NVML answers and failures, through the fake driven by presets -------------------------------------------
class NoCount(FakeNVML):
    def nvmlDeviceGetCount(self):
        raise NVMLError_Unknown()


class NoHandleFor1(FakeNVML):
    def nvmlDeviceGetHandleByIndex(self, i):
        if i == 1:
            raise NVMLError_Unknown()
        return super().nvmlDeviceGetHandleByIndex(i)


class OddBytes(FakeNVML):
    def nvmlDeviceGetMemoryInfo(self, h):
        from types import SimpleNamespace
        return SimpleNamespace(total=80 * 10**9, free=79 * 10**9, used=10**9)  # not whole MiB


class LibraryMessageOnly(FakeNVML):
    def nvmlInit(self):
        raise RuntimeError("NVML Shared Library Not Found")  # an older binding's plain error, same meaning


def test_nvml_failures_are_named(tmp_path):
    l4 = load_profile("4xL4")
    env = {"CUDA_VISIBLE_DEVICES": "0,1"}
    hw = run_detect(tmp_path, NoCount.from_profile(l4), environ=env)
    assert hw.gpus.reason == "NVML could not count devices (NVMLError_Unknown: Unknown Error)"
    assert hw.gpus.driver_version == "550.54.15" and hw.gpus.cuda_visible_devices == "0,1"
    missing = run_detect(tmp_path, FakeNVML.from_profile(l4, library_missing=True), environ=env)
    assert missing.gpus.reason == "no NVIDIA driver (NVML library not found)" and "gpus" not in missing.unknown
    assert missing.gpus.cuda_visible_devices == "0,1" and missing.gpus.interconnect == "none"
    old = run_detect(tmp_path, LibraryMessageOnly.from_profile(l4))
    assert old.gpus.reason == "no NVIDIA driver (NVML library not found)"
    broken = run_detect(tmp_path, FakeNVML.from_profile(l4, init_error=True), environ=env)
    assert broken.unknown["gpus"] == broken.gpus.reason == \
        "NVML failed to initialise (NVMLError_DriverNotLoaded: Driver Not Loaded)"
    assert broken.gpus.interconnect == "unknown" and broken.gpus.cuda_visible_devices == "0,1"
    empty = run_detect(tmp_path, FakeNVML([]))
    assert empty.gpus.reason == "NVML found no GPU" and not empty.gpus.available
    found = run_detect(tmp_path, FakeNVML.from_profile(l4), environ=env)
    assert found.gpus.available and found.gpus.reason is None  # GPUs found: no reason for their absence


def test_a_gpu_without_handle_is_a_placeholder_and_links_are_unknown(tmp_path):
    hw = run_detect(tmp_path, NoHandleFor1.from_profile(load_profile("4xL4")))
    assert hw.gpus.devices[1].error == "NVML returned no handle for this device"
    assert hw.gpus.devices[0].name == "NVIDIA L4"
    assert hw.gpus.interconnect_reason == \
        "NVML did not report peer links (RuntimeError: GPU 1 has no handle); treated as PCIe"


def test_memory_in_bytes_is_floored_to_whole_mib(tmp_path):
    hw = run_detect(tmp_path, OddBytes.from_profile(load_profile("1xT4")))
    assert (hw.gpus.devices[0].memory_total_mib, hw.gpus.devices[0].memory_free_mib) == (76293, 75340)


def test_two_gpus_with_nvlink(tmp_path):
    hw = run_detect(tmp_path, FakeNVML.from_profile(preset_with_gpus("8xH100-80GB", 2)))
    assert hw.gpus.interconnect == "nvlink" and hw.gpus.nvlink_pairs == ((0, 1),)


def test_mig_uses_the_current_mode_not_the_pending_one(tmp_path):
    mig = {0: [("MIG-aaaa-0", "A100 1g.10gb", 9984, 9800)]}
    fake = FakeNVML.from_profile(load_profile("4xA100-80GB"), mig=mig, mig_pending_off=True)
    hw = run_detect(tmp_path, fake, environ={"CUDA_VISIBLE_DEVICES": "MIG-aaaa-0"})
    assert [(d.nvml_index, d.memory_total_mib, d.mig_mode) for d in hw.gpus.devices] == [(0, 9984, True)]


# -- host records, whole, from recorded inputs ------------------------------------------------------------
def test_slurm_variables_whole_record_and_fallback_names():
    from autotune.hardware.host import parse_slurm_env
    from autotune.profiles import SlurmInfo

    full = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_NTASKS": "8",
            "SLURM_NTASKS_PER_NODE": "4", "SLURM_CPUS_PER_TASK": "6", "SLURM_GPUS_ON_NODE": "4",
            "SLURM_JOB_PARTITION": "gpu", "SLURM_NNODES": "9", "SLURM_NODELIST": "x", "SLURM_GPUS": "9"}
    assert parse_slurm_env(full) == SlurmInfo(job_id="42", num_nodes=2, nodelist="node[1-2]", ntasks=8,
                                              ntasks_per_node="4", cpus_per_task=6, gpus="4", partition="gpu",
                                              hosts=("node1", "node2"), gpus_per_node=4)
    older = {"SLURM_JOB_ID": "7", "SLURM_NNODES": "3", "SLURM_NODELIST": "a,b,c", "SLURM_GPUS": "a100:2",
             "SLURM_CPUS_PER_TASK": "lots"}
    # an unreadable variable leaves the allocation's details unknown (the planner then needs flags)
    assert parse_slurm_env(older) == SlurmInfo(job_id="7", num_nodes=3, nodelist="a,b,c", gpus="a100:2")


def test_cpu_record_whole(tmp_path):
    from autotune.profiles import CPUInfo

    info = tmp_path / "cpuinfo"
    info.write_text("model name\t: Chip: v2 @ 2GHz\n")
    unknown = {}
    cpu = probe_cpu(FakePsutil(logical=16, physical=8), CgroupLimits(version=2, cpu_quota_cores=6.5), unknown,
                    cpuinfo=info)
    assert cpu == CPUInfo(model_name="Chip: v2 @ 2GHz", physical_cores=8, logical_cores=16, affinity_cores=16,
                          cgroup_quota_cores=6.5, cgroup_version=2, effective_cores=6,
                          effective_cores_reason="cgroup CPU quota is 6.5 cores (also: 16 logical cores; "
                                                 "CPU affinity allows 16)")
    assert unknown == {}

    class NoPhysical(FakePsutil):
        def cpu_count(self, logical=True):
            return 4 if logical else None

    unknown = {}
    cpu = probe_cpu(NoPhysical(), CgroupLimits(errors={"cpu": "cannot read x"}), unknown, cpuinfo=info)
    assert (cpu.physical_cores, cpu.logical_cores) == (None, 4)
    assert unknown == {"cpu.physical_cores": "psutil could not tell physical cores",
                       "cpu.cgroup_quota_cores": "cannot read x"}
    unknown = {}
    probe_cpu(FakePsutil(fail=True), CgroupLimits(), unknown, cpuinfo=info)
    assert unknown == {"cpu.logical_cores": "OSError: no /proc", "cpu.physical_cores": "OSError: no /proc"}


def test_memory_record_whole():
    from autotune.hardware.host import probe_memory
    from autotune.profiles import MemoryInfo

    ps = FakePsutil(total_mib=32768, avail_mib=30000)
    assert probe_memory(ps, CgroupLimits(memory_limit_bytes=8 * 2**30 + 5), {}) == MemoryInfo(
        total_mib=32768, available_mib=30000, cgroup_limit_mib=8192, effective_mib=8192,
        effective_reason="the cgroup memory limit (8.0 GiB) is the tighter bound")
    assert probe_memory(ps, CgroupLimits(memory_limit_bytes=40 * 2**30), {}).effective_reason == \
        "available RAM (29.3 GiB) is the tighter bound"
    assert probe_memory(ps, CgroupLimits(), {}).effective_reason == "available RAM (29.3 GiB); no cgroup memory limit"
    big = FakePsutil(total_mib=204800, avail_mib=102400)  # exactly 100 GiB available: MiB / 1024, not 1025
    assert probe_memory(big, CgroupLimits(), {}).effective_reason == "available RAM (100.0 GiB); no cgroup memory limit"
    assert probe_memory(big, CgroupLimits(memory_limit_bytes=150 * 2**30), {}).effective_reason == \
        "available RAM (100.0 GiB) is the tighter bound"
    unknown = {}
    m = probe_memory(FakePsutil(fail=True), CgroupLimits(errors={"memory": "cannot read y"}), unknown)
    assert m == MemoryInfo(effective_reason="RAM unknown")
    assert unknown == {"memory.total_mib": "OSError: no /proc/meminfo",
                       "memory.available_mib": "OSError: no /proc/meminfo",
                       "memory.cgroup_limit_mib": "cannot read y", "memory.effective_mib": "RAM unknown"}
    assert probe_memory(FakePsutil(fail=True), CgroupLimits(memory_limit_bytes=2**30), {}).effective_mib == 1024

    class Ragged(FakePsutil):  # what the kernel reports: pages, not whole MiB
        def virtual_memory(self):
            from types import SimpleNamespace
            return SimpleNamespace(total=self.total * 2**20 + 4096, available=self.avail * 2**20 + 4096)

    m = probe_memory(Ragged(), CgroupLimits(), {})
    assert (m.total_mib, m.available_mib, m.effective_mib) == (32768, 30000, 30000)
    assert all(type(v) is int for v in (m.total_mib, m.available_mib, m.effective_mib))


def test_effective_cores_reasons():
    from autotune.hardware.host import effective_cores

    assert effective_cores(None, None, None) == (1, "core count unknown; assuming 1")
    assert effective_cores(8, None, None) == (8, "8 logical cores")
    assert effective_cores(8, 4, 0.5) == \
        (1, "cgroup CPU quota is 0.5 cores (also: 8 logical cores; CPU affinity allows 4)")


def test_software_versions_search_path_default_is_sys_path(tmp_path, monkeypatch):
    import sys

    from autotune.hardware.host import installed_versions

    assert installed_versions() == installed_versions(list(sys.path))
    assert "torch" in installed_versions()
    (tmp_path / "mypkg-3.1.dist-info").mkdir()
    monkeypatch.chdir(tmp_path)
    assert installed_versions([""])["mypkg"] == "3.1"  # "" on sys.path is the current directory


def test_cgroup_lines_after_a_malformed_one_and_quota_without_period(tmp_path):
    assert parse_proc_self_cgroup("garbage\n4:memory:/m\n") == {"memory": "/m"}
    root = write_tree(tmp_path / "q", {"cpu/j/cpu.cfs_quota_us": "200000\n", "cpu/cpu.cfs_quota_us": "300000\n",
                                       "cpu/cpu.cfs_period_us": "100000\n"})
    lim = read_cgroup_limits(root, _self(tmp_path, "sq", "4:cpu:/j\n5:cpuacct:/elsewhere\n"))
    assert lim.cpu_quota_cores == 3.0 and lim.errors == {}  # the leaf has a quota but no period: not a limit


@pytest.mark.parametrize("text, why", [("", "empty cpu.max"), ("  \n", "empty cpu.max"),
                                       ("100000 0", "bad period in cpu.max: '100000 0'"),
                                       ("100000 -5", "bad period in cpu.max: '100000 -5'")])
def test_a_cpu_max_no_kernel_writes_is_named_with_its_reason(tmp_path, text, why):
    root = write_tree(tmp_path / "cg", {"cgroup.controllers": "cpu memory\n", "cpu.max": text})
    lim = read_cgroup_limits(root, tmp_path / "missing")
    assert lim.cpu_quota_cores is None and lim.errors["cpu"] == f"cannot read {root / 'cpu.max'}: {why}"
