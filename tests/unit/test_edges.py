"""Edges of the pure helpers, from recorded inputs and the rules they implement (cgroup files,
/proc/cpuinfo, CUDA_VISIBLE_DEVICES, NVML peer links, the launch record)."""

import pytest

from autotune.hardware import (PhysicalGPU, Visible, classify_interconnect, parse_cfs_quota, parse_cpu_max,
                               parse_memory_limit, parse_proc_self_cgroup, read_cgroup_limits, select_visible)
from autotune.hardware.cgroups import CgroupLimits
from autotune.hardware.host import probe_cpu
from autotune.launch import LaunchSpec, default_cache_dir, launch_spec, redact
from autotune.planner import plan
from autotune.config import TrainConfig, apply_overrides
from autotune.profiles import load_profile
from profiles_util import make_profile
from test_hardware import FakePsutil, write_tree


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


# -- the launch record -------------------------------------------------------------------------------------
def test_record_and_shell_are_exact_and_redact_only_secrets():
    spec = LaunchSpec(cmd=["python", "-m", "x", "a b"], env={"B": "2 3", "A": "1", "HF_TOKEN": "s"},
                      env_sources={"A": "user", "B": "autotune", "HF_TOKEN": "user", "GONE": "user"}, cwd="/w")
    assert spec.to_record() == {"argv": ["python", "-m", "x", "a b"], "env": {"B": "2 3", "A": "1", "HF_TOKEN": "<redacted>"},
                                "env_sources": {"A": "user", "B": "autotune", "HF_TOKEN": "user"}, "cwd": "/w"}
    assert spec.shell() == "A=1 B='2 3' HF_TOKEN='<redacted>' python -m x 'a b'"
    assert redact({"PATH": "/bin", "MY_PASSWORD": "x"}) == {"PATH": "/bin", "MY_PASSWORD": "<redacted>"}


def test_cache_dir_follows_xdg_then_home():
    assert default_cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == "/c/autotune"
    assert default_cache_dir({"HOME": "/h"}) == "/h/.cache/autotune"
    assert default_cache_dir({}) == "/tmp/.cache/autotune"


def test_nccl_ib_disabled_exactly_when_no_infiniband():
    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    assert launch_spec(p, "/r", {}, has_infiniband=False).env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_DISABLE" not in launch_spec(p, "/r", {}, has_infiniband=True).env


# -- host RAM for optimizer offload, at its threshold ------------------------------------------------------
# ZeRO offload keeps 12 bytes of optimizer state per parameter, split over the ranks, for every rank on
# the node, with the policy's 1.5x margin: 4 ranks x 12/4 x 1.5 = 18 bytes/param; one rank: 18 too.
# 4 GPUs, 1.621e9 parameters: 29.178e9 bytes = 27.17 GiB, so 27 GiB of RAM refuses and 28 accepts.
# 1 GPU (DeepSpeed forced), 4.0525e8 parameters: 6.79 GiB, so 6 refuses and 7 accepts.
@pytest.mark.parametrize("n_gpus", [1, 4])
def test_offload_host_ram_threshold(n_gpus):
    params = 1_621_000_000 if n_gpus == 4 else 405_250_000
    cfg = apply_overrides(TrainConfig(), {"model.num_parameters": params, "training.entrypoint": "t.py",
                                          "distributed.backend": "deepspeed"})
    need_gib = 12 * params / n_gpus * n_gpus * 1.5 / 2**30
    free_mib = 10000 if n_gpus == 4 else 2500  # states exceed the budget without offload, fit with it
    lo, hi = int(need_gib), int(need_gib) + 1
    for ram, expect in ((lo, False), (hi, True)):
        p = plan(make_profile(gpus=[("G", free_mib + 500, free_mib, "8.0")] * n_gpus, ram_gib=ram), cfg,
                 deepspeed_installed=True)
        assert p.engine.offload_optimizer is expect, (n_gpus, ram, need_gib, p.reasons["offload_optimizer"])
