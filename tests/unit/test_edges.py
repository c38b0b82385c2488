"""Edges of the pure helpers, from recorded inputs and the rules they implement (cgroup files,
/proc/cpuinfo, CUDA_VISIBLE_DEVICES, NVML peer links, the launch record)."""

import dataclasses

import pytest
from helpers.detection import FakePsutil, write_tree
from helpers.profiles_util import make_profile

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.launch_spec import LaunchSpec, default_cache_dir, launch_spec
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
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.rundir.records import redact


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


# -- the launch record -------------------------------------------------------------------------------------
def test_record_and_shell_are_exact_and_redact_only_secrets():
    spec = LaunchSpec(cmd=["python", "-m", "x", "a b"], env={"B": "2 3", "A": "1", "HF_TOKEN": "s"},
                      env_sources={"A": "user", "B": "autotune", "HF_TOKEN": "user", "GONE": "user"}, cwd="/w")
    assert spec.to_record() == {"argv": ["python", "-m", "x", "a b"],
                                "env": {"B": "2 3", "A": "1", "HF_TOKEN": "<redacted>"},
                                "env_sources": {"A": "user", "B": "autotune", "HF_TOKEN": "user"}, "cwd": "/w"}
    assert spec.shell() == "cd /w && A=1 B='2 3' HF_TOKEN='<redacted>' python -m x 'a b'"
    assert dataclasses.replace(spec, cwd=None).shell() == "A=1 B='2 3' HF_TOKEN='<redacted>' python -m x 'a b'"
    assert launch_spec(plan(load_profile("cpu-only"), TrainConfig()), "/r", {}, cwd="/work dir").cwd == "/work dir"
    assert redact({"PATH": "/bin", "MY_PASSWORD": "x"}) == {"PATH": "/bin", "MY_PASSWORD": "<redacted>"}


def test_cache_dir_follows_xdg_then_home():
    assert default_cache_dir({"XDG_CACHE_HOME": "/c", "HOME": "/h"}) == "/c/autotune"
    assert default_cache_dir({"HOME": "/h"}) == "/h/.cache/autotune"
    assert default_cache_dir({}) == "/tmp/.cache/autotune"


def test_nccl_ib_disabled_exactly_when_no_infiniband():
    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    assert launch_spec(p, "/r", {}, has_infiniband=False).env["NCCL_IB_DISABLE"] == "1"
    assert "NCCL_IB_DISABLE" not in launch_spec(p, "/r", {}, has_infiniband=True).env


# -- config files: every message names the file and the place --------------------------------------------
def test_config_file_errors_name_file_line_and_column(tmp_path):
    from autotune.config import load_config
    from autotune.errors import UserError

    with pytest.raises(UserError) as e:
        load_config(tmp_path / "none.yaml")
    assert str(e.value) == (f"--config: no such file {str(tmp_path / 'none.yaml')!r} "
                            "(the shipped example is configs/default_config.yaml)")
    with pytest.raises(UserError) as e:
        load_config(tmp_path)
    assert str(e.value) == f"--config: {str(tmp_path)!r} is a directory, expected a file"
    bad = tmp_path / "bad.yaml"
    bad.write_text("training:\n  learning_rate: [1, 2\n")  # the flow sequence never closes
    with pytest.raises(UserError) as e:
        load_config(bad)
    assert str(e.value).startswith(f"{bad}: invalid YAML at line 3, column 1: expected ',' or ']'")
    wrong = tmp_path / "wrong.yaml"
    wrong.write_text("training: {epochs: 0}\n")
    with pytest.raises(UserError) as e:
        load_config(wrong)
    assert str(e.value) == f"{wrong}: 1 problem(s) in the config" and e.value.problems[0].startswith("training.epochs:")


def test_verbatim_problems_are_listed_under_one_message():
    from autotune.config import parse_config
    from autotune.errors import UserError

    with pytest.raises(UserError) as e:
        plan(load_profile("cpu-only"), parse_config({}), auto_optimize=False)
    assert str(e.value) == "--no_auto_optimize uses the config verbatim, but values are missing"
    assert [p.split(":")[0] for p in e.value.problems] == [
        "distributed.backend", "training.mixed_precision", "training.batch_size_per_gpu",
        "training.gradient_accumulation_steps"]


# -- the profile model -------------------------------------------------------------------------------------
def test_compute_capability_tuple_and_json_indent():
    from autotune.profiles import GPUInfo

    assert GPUInfo(index=0, compute_capability="8").compute_capability_tuple() == (8, 0)
    assert GPUInfo(index=0, compute_capability="12.1").compute_capability_tuple() == (12, 1)
    assert GPUInfo(index=0).compute_capability_tuple() is None
    text = load_profile("cpu-only").to_json()
    assert text.splitlines()[1].startswith('  "schema_version"')


# -- precision rules of a custom policy; GPU memory warnings ------------------------------------------------------
def _policy(tmp_path, rules):
    import yaml

    from autotune.planner.policy import DEFAULT_POLICY_PATH, load_policy

    data = yaml.safe_load(DEFAULT_POLICY_PATH.read_text())
    data["precision_by_compute_capability"] = rules
    f = tmp_path / "p.yaml"
    f.write_text(yaml.safe_dump(data))
    return load_policy(str(f))


def test_unknown_compute_capability_takes_the_lowest_rule_and_reasons_name_the_next_rule(tmp_path):
    pol = _policy(tmp_path, [{"min_compute_capability": 9.0, "precision": "bf16", "tf32": True},
                             {"min_compute_capability": 7.0, "precision": "fp16", "tf32": False},
                             {"min_compute_capability": 1.0, "precision": "fp32", "tf32": False}])
    unknown = make_profile(gpus=[("G", 16000, 15000, None)])
    assert plan(unknown, TrainConfig(), policy=pol).numerics.precision == "fp32"
    volta = plan(make_profile(gpus=[("V", 16000, 15000, "7.5")]), TrainConfig(), policy=pol)
    assert volta.numerics.precision == "fp16"
    assert volta.reasons["precision"] == ("lowest compute capability 7.5 is below the 9.0 that bf16 needs: fp16 "
                                          "with dynamic loss scaling")
    # two better rules, listed highest first: the reason names the nearer one
    pascal = plan(make_profile(gpus=[("P", 16000, 15000, "6.0")]), TrainConfig(), policy=pol)
    assert pascal.reasons["precision"] == "lowest compute capability 6.0 is below the 7.0 that fp16 needs: fp32"


def test_unknown_compute_capability_takes_the_lowest_rule_even_when_one_starts_at_1_0(tmp_path):
    pol = _policy(tmp_path, [{"min_compute_capability": 8.0, "precision": "bf16", "tf32": True},
                             {"min_compute_capability": 1.0, "precision": "fp16", "tf32": False},
                             {"min_compute_capability": 0.5, "precision": "fp32", "tf32": False}])
    unknown = plan(make_profile(gpus=[("G", 16000, 15000, None)]), TrainConfig(), policy=pol)
    assert unknown.numerics.precision == "fp32"
    assert unknown.reasons["precision"] == "compute capability unknown for some GPU: fp32, the safe choice"


def test_gpu_memory_warnings():
    from autotune.planner.deciders import fmt_gb

    assert fmt_gb(95367.43) == "100.0 GB"  # 95367.43 MiB x 2^20 = 1e11 bytes
    same_name = plan(make_profile(gpus=[("L4", 23034, 22563, "8.9"), ("L4", 23034, 20000, "8.9")]), TrainConfig(),
                     deepspeed_installed=True)
    assert same_name.warnings == ("GPUs differ (L4): planning every rank to the smallest free memory, GPU 1 with "
                                  "21.0 GB",)
    names = plan(make_profile(gpus=[("A", 23034, 22563, "8.9"), (None, 23034, 22563, "8.9")]), TrainConfig(),
                 deepspeed_installed=True)
    assert names.warnings[0].startswith("GPUs differ (?, A): planning every rank to the smallest free memory, GPU 0")
    one_unknown = make_profile(gpus=[("L4", 23034, 22563, "8.9"), ("L4", None, None, "8.9")])
    p = plan(one_unknown, TrainConfig(), deepspeed_installed=True)
    assert p.warnings[0] == ("memory of some GPU is unknown (see the hardware report); planning for the smallest "
                             "band") and p.batch.micro_batch_size == 2


# -- NVML answers and failures, through the fake driven by presets -------------------------------------------
from helpers.detection import run_detect  # noqa: E402
from helpers.fake_nvml import FakeNVML, NVMLError_Unknown  # noqa: E402
from helpers.profiles_util import preset_with_gpus  # noqa: E402


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


# -- execute: exit codes, working directory, its own session, forwarded signals ------------------------------
def test_execute_exit_codes_cwd_and_session(tmp_path):
    import os
    import sys

    from autotune.launch.process import execute

    def spec(code, cwd=None):
        return LaunchSpec(cmd=[sys.executable, "-c", code], env={"X_MARK": "1"}, cwd=cwd)

    assert execute(spec("import sys; sys.exit(0)")) == 0
    assert execute(spec("import sys; sys.exit(1)")) == 1
    out = tmp_path / "out"
    code = (f"import os; open({str(out)!r}, 'w').write(f'{{os.getcwd()}} {{os.getsid(0)}} {{os.environ[\"X_MARK\"]}} "
            f"{{os.environ.get(\"X_OUTER\")}}')")
    assert execute(spec(code, cwd=str(tmp_path)), environ={"X_OUTER": "o", "PATH": os.environ["PATH"]}) == 0
    cwd, sid, mark, outer = out.read_text().split()
    assert cwd == str(tmp_path) and int(sid) != os.getsid(0) and mark == "1" and outer == "o"
    # the fds it is told to keep (the run directory's lock) reach the child; others are closed there
    r, w = os.pipe()
    try:
        assert execute(spec(f"import os; os.write({w}, b'held')"), keep_fds=(w,)) == 0
        assert os.read(r, 4) == b"held"
        assert execute(spec(f"import os; os.write({w}, b'held')")) == 1  # not kept: closed in the child
    finally:
        os.close(r)
        os.close(w)


def test_env_sources_and_unbuffered_output():
    p = plan(load_profile("cpu-only"), TrainConfig())
    s = launch_spec(p, "/r", {"HOME": "/h"})
    assert s.env["PYTHONUNBUFFERED"] == "1" and s.env_sources["PYTHONUNBUFFERED"] == "autotune"
    assert s.env_sources["AUTOTUNE_PLAN"] == "autotune" and s.cwd is None


def test_deepspeed_json_for_a_non_deepspeed_plan_and_print_interval():
    from autotune.exports.deepspeed import deepspeed_config

    ddp = plan(load_profile("4xL4"), apply_overrides(TrainConfig(), {"distributed.backend": "ddp",
                                                                      "training.log_every_steps": 1}))
    ds = deepspeed_config(ddp)  # what `export --format deepspeed` writes for a DDP plan
    assert ds["zero_optimization"]["stage"] == 0 and ds["steps_per_print"] == 100


def test_exports_without_offload_and_default_script():
    from autotune.exports.launchers import accelerate_config, torchrun_command

    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    assert accelerate_config(p)["deepspeed_config"]["offload_optimizer_device"] == "none"
    assert torchrun_command(p) == ["torchrun", "--nproc_per_node=4", "--standalone", "train.py"]


def test_yaml_reader_error_has_no_position_but_a_message(tmp_path):
    from autotune.config import load_config
    from autotune.errors import UserError

    f = tmp_path / "ctrl.yaml"
    f.write_text("training:\n  seed: 1\x07\n")  # a control character: yaml's reader refuses it
    with pytest.raises(UserError) as e:
        load_config(f)
    msg = str(e.value)
    assert msg.startswith(f"{f}: invalid YAML: ") and "#x0007" in msg and "at line" not in msg


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
