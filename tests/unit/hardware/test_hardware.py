"""Detection through a fake NVML driven by the presets, recorded cgroup files, and the report."""

import json
import sys

import pytest
from helpers.detection import FakePsutil, run_detect, write_tree
from helpers.fake_nvml import FakeNVML
from pydantic import BaseModel

from autotune.hardware import detect
from autotune.hardware.cgroups import (
    parse_cfs_quota,
    parse_cpu_max,
    parse_memory_limit,
    parse_proc_self_cgroup,
    read_cgroup_limits,
)
from autotune.hardware.host import effective_cores, parse_slurm_env
from autotune.hardware.visible import PhysicalGPU, Visible, select_visible
from autotune.profiles import HardwareProfile, load_profile, preset_names

REQUIRED_PRESETS = {"cpu-only", "1xT4", "4xT4", "4xL4", "4xA100-80GB", "8xA100-40GB", "8xH100-80GB",
                    "2xRTX4090", "2x4xL4"}


# -- presets ---------------------------------------------------------------------------

def test_required_presets_exist_and_load():
    assert REQUIRED_PRESETS <= set(preset_names())
    for name in preset_names():
        p = load_profile(name)
        assert p.source == f"preset:{name}"
        assert HardwareProfile.from_json(p.to_json()) == p  # JSON round trip


@pytest.mark.parametrize("name, model, mib, cc", [
    ("4xL4", "NVIDIA L4", 23034, "8.9"), ("1xT4", "Tesla T4", 15360, "7.5"),
    ("8xA100-40GB", "NVIDIA A100-SXM4-40GB", 40960, "8.0"), ("8xH100-80GB", "NVIDIA H100 80GB HBM3", 81559, "9.0"),
    ("2xRTX4090", "NVIDIA GeForce RTX 4090", 24564, "8.9"),
])
def test_preset_figures_are_real(name, model, mib, cc):
    g = load_profile(name).gpus.devices[0]
    assert (g.name, g.memory_total_mib, g.compute_capability) == (model, mib, cc)


def test_unknown_preset_is_a_user_error():
    from autotune.errors import UserError
    with pytest.raises(UserError, match="unknown preset 'nope'.*4xL4"):
        load_profile("nope")


# -- NVML through the fake --------------------------------------------------------------

@pytest.mark.parametrize("preset", ["4xL4", "8xH100-80GB", "2xRTX4090", "1xT4", "8xA100-40GB"])
def test_detect_reproduces_preset_gpus(tmp_path, preset):
    prof = load_profile(preset)
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof))
    assert hw.gpus.available and hw.num_gpus == prof.num_gpus
    for got, want in zip(hw.gpus.devices, prof.gpus.devices):
        fields = ("name", "memory_total_mib", "memory_free_mib", "compute_capability", "uuid", "pci_bus_id")
        assert [getattr(got, f) for f in fields] == [getattr(want, f) for f in fields]
    assert hw.gpus.interconnect == prof.gpus.interconnect
    assert hw.gpus.nvlink_pairs == prof.gpus.nvlink_pairs
    assert hw.gpus.driver_version == "550.54.15" and hw.gpus.cuda_driver_version == "12.4"
    assert not [k for k in hw.unknown if k.startswith("gpus")]


def test_h100_nvlink_and_rtx4090_without_p2p(tmp_path):
    h100 = run_detect(tmp_path, FakeNVML.from_profile(load_profile("8xH100-80GB")))
    assert h100.gpus.interconnect == "nvlink" and len(h100.gpus.nvlink_pairs) == 28
    rtx = run_detect(tmp_path, FakeNVML.from_profile(load_profile("2xRTX4090")))
    assert rtx.gpus.interconnect == "pcie" and rtx.gpus.p2p_pairs == ()
    assert "without peer-to-peer" in rtx.gpus.interconnect_reason


def test_library_missing_is_a_cpu_machine_not_an_error(tmp_path):
    hw = run_detect(tmp_path, FakeNVML([], library_missing=True))
    assert not hw.gpus.available and hw.num_gpus == 0
    assert "NVML library not found" in hw.gpus.reason
    assert "gpus" not in hw.unknown
    assert hw.cpu.effective_cores == 8  # the rest still works


def test_init_failure_marks_gpus_unknown(tmp_path):
    hw = run_detect(tmp_path, FakeNVML([], init_error=True))
    assert hw.num_gpus == 0 and hw.gpus.interconnect == "unknown"
    assert "NVML failed to initialise" in hw.unknown["gpus"] and "Driver Not Loaded" in hw.unknown["gpus"]


def test_one_gpu_failing_one_query(tmp_path):
    fake = FakeNVML.from_profile(load_profile("4xL4"), failing_queries={(2, "nvmlDeviceGetMemoryInfo")})
    hw = run_detect(tmp_path, fake)
    assert hw.num_gpus == 4
    bad = hw.gpus.devices[2]
    assert bad.memory_total_mib is None and bad.memory_free_mib is None and bad.name == "NVIDIA L4"
    assert "Unknown Error" in hw.unknown["gpus.devices[2].memory_total_mib"]
    assert hw.gpus.devices[1].memory_total_mib == 23034


def test_dead_gpu_becomes_placeholder(tmp_path):
    fake = FakeNVML.from_profile(load_profile("4xL4"), dead_gpus={1})
    hw = run_detect(tmp_path, fake)
    assert hw.num_gpus == 4
    assert hw.gpus.devices[1].error == "device did not answer NVML queries"
    assert hw.gpus.devices[0].error is None and hw.gpus.devices[3].name == "NVIDIA L4"
    # the lost GPU's handle still answers peer queries here: the 4xL4 PCIe links are reported
    assert hw.gpus.interconnect == "pcie"


def test_p2p_query_failure_is_unknown_treated_as_pcie(tmp_path):
    hw = run_detect(tmp_path, FakeNVML.from_profile(load_profile("8xH100-80GB"), p2p_error=True))
    assert hw.gpus.interconnect == "unknown"
    assert "treated as PCIe" in hw.unknown["gpus.interconnect"]


def test_pre_ampere_mig_not_supported_is_false_not_unknown(tmp_path):
    hw = run_detect(tmp_path, FakeNVML.from_profile(load_profile("1xT4"), mig_not_supported=True))
    assert hw.gpus.devices[0].mig_mode is False
    assert not any("mig" in k for k in hw.unknown)


def test_mig_instances_selected_by_id(tmp_path):
    mig = {0: [("MIG-aaaa-1111", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968, 19800),
               ("MIG-bbbb-2222", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968, 19700)]}
    fake = FakeNVML.from_profile(load_profile("8xA100-40GB"), mig=mig)
    hw = run_detect(tmp_path, fake, environ={"CUDA_VISIBLE_DEVICES": "MIG-bbbb-2222"})
    assert hw.num_gpus == 1
    g = hw.gpus.devices[0]
    assert g.index == 0 and g.nvml_index == 0 and g.mig_mode is True
    assert g.name.endswith("MIG 3g.20gb") and g.memory_total_mib == 19968 and g.memory_free_mib == 19700
    assert g.compute_capability == "8.0"
    # without a MIG id the physical GPU is listed, flagged as MIG-enabled
    hw_all = run_detect(tmp_path, fake)
    assert hw_all.gpus.devices[0].mig_mode is True and hw_all.gpus.devices[1].mig_mode is False
    # ...with the memory of each of its slices, and the selected instance marked as one
    assert hw_all.gpus.devices[0].mig_slices_mib == (19968, 19968) and hw_all.gpus.devices[1].mig_slices_mib == ()
    assert g.mig_instance is True and hw_all.gpus.devices[0].mig_instance is False


def _one_a100_with_mig(**knobs):
    one = load_profile("8xA100-40GB")
    one = one.model_copy(update={"gpus": one.gpus.model_copy(update={"devices": one.gpus.devices[:1]})})
    mig = {0: [("MIG-aaaa-1111", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968, 19800)]}
    return one.gpus.devices[0], FakeNVML.from_profile(one, mig=mig, **knobs)


def test_a_mig_instance_reports_its_parent_gpus_compute_capability_pci_address_and_mig_mode(tmp_path):
    # MIG handles that refuse per-GPU queries: the answers must come from the parent GPU's handle
    parent, fake = _one_a100_with_mig(mig_handles_restricted=True)
    hw = run_detect(tmp_path, fake, environ={"CUDA_VISIBLE_DEVICES": "MIG-aaaa-1111"})
    g = hw.gpus.devices[0]
    assert (g.compute_capability, g.pci_bus_id, g.mig_mode, g.mig_instance) == ("8.0", parent.pci_bus_id, True, True)
    assert g.memory_total_mib == 19968 and g.error is None
    assert not [k for k in hw.unknown if k.startswith("gpus.devices")], hw.unknown


def test_a_mig_instance_whose_parent_handle_is_gone_reports_the_compute_capability_unknown(tmp_path):
    # one GPU: the first nvmlDeviceGetHandleByIndex lists it, the second (the parent of the MIG
    # instance, asked again for its compute capability) fails
    parent, fake = _one_a100_with_mig(fail_from_call={"nvmlDeviceGetHandleByIndex": 2})
    hw = run_detect(tmp_path, fake, environ={"CUDA_VISIBLE_DEVICES": "MIG-aaaa-1111"})
    g = hw.gpus.devices[0]
    assert g.compute_capability is None
    assert hw.unknown["gpus.devices[0].compute_capability"] == "NVMLError_Unknown: Unknown Error"
    # the rest is asked of the instance's own handle: its memory, and the PCI address it shares
    assert (g.memory_total_mib, g.pci_bus_id, g.mig_mode, g.error) == (19968, parent.pci_bus_id, True, None)
    assert None not in hw.unknown


def test_a_mig_instance_gone_between_listing_and_probing_is_reported_with_nvmls_error(tmp_path):
    # listing the instances asks for slots 0 (there) and 1 (the gap that ends them); the third
    # call, detection opening the instance again, fails
    _, fake = _one_a100_with_mig(fail_from_call={"nvmlDeviceGetMigDeviceHandleByIndex": 3})
    hw = run_detect(tmp_path, fake, environ={"CUDA_VISIBLE_DEVICES": "MIG-aaaa-1111"})
    g = hw.gpus.devices[0]
    assert g.error == "NVMLError_Unknown: Unknown Error" == hw.unknown["gpus.devices[0]"]
    assert g.name is None and g.memory_total_mib is None
    assert None not in hw.unknown


def test_a_mig_gpu_is_planned_as_its_slice_end_to_end(tmp_path):
    from autotune.config import TrainConfig
    from autotune.planner import plan

    mig = {0: [("MIG-aaaa-1111", "NVIDIA A100-SXM4-40GB MIG 3g.20gb", 19968, 19800),
               ("MIG-bbbb-2222", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 9856, 9800)]}
    one = load_profile("8xA100-40GB")
    one = one.model_copy(update={"gpus": one.gpus.model_copy(update={"devices": one.gpus.devices[:1]})})
    hw = run_detect(tmp_path, FakeNVML.from_profile(one, mig=mig))
    p = plan(hw, TrainConfig())
    # the smallest slice: 9856 MiB = 10.3 GB, the >= 10 GB band (micro 8), never the 40 GB parent
    assert p.memory.gpu_memory_gib == round(9856 / 1024, 2) and p.batch.micro_batch_size == 8
    assert any("MIG mode" in w for w in p.warnings)


@pytest.mark.parametrize("value, expect_nvml, note", [
    (None, [0, 1, 2, 3], None),
    ("", [], "empty"),
    ("  ", [], "empty"),
    ("2,0", [2, 0], None),
    ("1, 3", [1, 3], None),
    ("0,7,1", [0], "'7' is not a valid device"),
    ("0,0", [0], "duplicate"),
    ("-1", [], "not a valid"),
    ("²", [], "not a valid"),  # a Unicode digit: str.isdigit() says yes, int() says no
    ("GPU-l40000-0003", [3], None),
    ("GPU-l4", [], "not a valid"),  # ambiguous prefix
    ("GPU-nope", [], "not a valid"),
    ("3,GPU-l40000-0001", [3, 1], None),
])
def test_cuda_visible_devices_rules(tmp_path, value, expect_nvml, note):
    fake = FakeNVML.from_profile(load_profile("4xL4"))
    env = {} if value is None else {"CUDA_VISIBLE_DEVICES": value}
    hw = run_detect(tmp_path, fake, environ=env)
    assert [g.nvml_index for g in hw.gpus.devices] == expect_nvml
    assert [g.index for g in hw.gpus.devices] == list(range(len(expect_nvml)))  # renumbered as CUDA does
    if note:
        text = hw.unknown.get("gpus.cuda_visible_devices", "") + (hw.gpus.reason or "")
        assert note in text
    if value == "":
        assert hw.gpus.reason.startswith("CUDA_VISIBLE_DEVICES is empty")


def test_select_visible_is_pure(monkeypatch):
    """Same inputs, same answer, inputs untouched: no NVML (importing pynvml fails here), no environment (a
    different CUDA_VISIBLE_DEVICES exported changes nothing)."""
    gpus = [PhysicalGPU(0, "GPU-a"), PhysicalGPU(1, "GPU-b", ("MIG-x",))]
    before = list(gpus)
    first = select_visible("1,MIG-x", gpus)
    monkeypatch.setitem(sys.modules, "pynvml", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    assert first == ([Visible(1), Visible(1, 0)], None) == select_visible("1,MIG-x", gpus)
    assert gpus == before


# -- cgroups (recorded file contents) ------------------------------------------------------

def test_cgroup_text_parsers():
    assert parse_cpu_max("max 100000\n") is None
    assert parse_cpu_max("200000 100000\n") == 2.0
    assert parse_cpu_max("150000 100000") == 1.5
    assert parse_cfs_quota("-1\n", "100000\n") is None
    assert parse_cfs_quota("400000\n", "100000\n") == 4.0
    assert parse_memory_limit("max\n") is None
    assert parse_memory_limit("9223372036854771712\n") is None  # v1 "unlimited"
    assert parse_memory_limit("8589934592\n") == 8 * 2**30
    assert parse_proc_self_cgroup("12:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n") == \
        {"cpu": "/docker/abc", "cpuacct": "/docker/abc", "memory": "/docker/abc", "": "/"}
    with pytest.raises(ValueError):
        parse_cpu_max("")


def test_cgroup_v2_tree_takes_tightest_ancestor(tmp_path):
    root = write_tree(tmp_path / "cg", {
        "cgroup.controllers": "cpu memory\n",
        "kubepods/cpu.max": "300000 100000\n",
        "kubepods/memory.max": "max\n",
        "kubepods/pod1/cpu.max": "max 100000\n",
        "kubepods/pod1/memory.max": f"{6 * 2**30}\n",
    })
    self_cg = write_tree(tmp_path, {"self": "0::/kubepods/pod1\n"}) / "self"
    lim = read_cgroup_limits(root, self_cg)
    assert lim.version == 2 and lim.cpu_quota_cores == 3.0 and lim.memory_limit_bytes == 6 * 2**30


def test_cgroup_v1_tree(tmp_path):
    root = write_tree(tmp_path / "cg", {
        "cpu,cpuacct/docker/abc/cpu.cfs_quota_us": "150000\n",
        "cpu,cpuacct/docker/abc/cpu.cfs_period_us": "100000\n",
        "memory/docker/abc/memory.limit_in_bytes": str(4 * 2**30),
        "memory/memory.limit_in_bytes": "9223372036854771712",
    })
    self_cg = write_tree(tmp_path, {"self": "5:cpu,cpuacct:/docker/abc\n3:memory:/docker/abc\n"}) / "self"
    lim = read_cgroup_limits(root, self_cg)
    assert lim.version == 1 and lim.cpu_quota_cores == 1.5 and lim.memory_limit_bytes == 4 * 2**30


def test_cgroup_v1_with_cpu_and_cpuacct_mounted_apart_reads_the_cpu_hierarchys_path(tmp_path):
    """Older hosts mount cpu and cpuacct as separate hierarchies, and /proc/self/cgroup then lists a
    path for each: the quota is the cpu controller's (1.5 cores), not the cpuacct path's directory
    (0.5); with no cpu line, the cpuacct path is the fallback."""
    root = write_tree(tmp_path / "cg", {
        "cpu/slice/a/cpu.cfs_quota_us": "150000\n", "cpu/slice/a/cpu.cfs_period_us": "100000\n",
        "cpu/slice/b/cpu.cfs_quota_us": "50000\n", "cpu/slice/b/cpu.cfs_period_us": "100000\n",
    })
    both = write_tree(tmp_path, {"both": "6:cpu:/slice/a\n5:cpuacct:/slice/b\n"}) / "both"
    assert read_cgroup_limits(root, both).cpu_quota_cores == 1.5
    acct = write_tree(tmp_path, {"acct": "5:cpuacct:/slice/b\n"}) / "acct"
    assert read_cgroup_limits(root, acct).cpu_quota_cores == 0.5


def detect_with_cgroup(tmp_path, root, **psutil_kw):
    return detect(nvml=FakeNVML([], library_missing=True), environ={}, cgroup_root=root,
                  proc_self_cgroup=tmp_path / "missing", sys_class=tmp_path, psutil_module=FakePsutil(**psutil_kw))


def test_cgroup_limits_drive_effective_cores_and_ram(tmp_path):
    root = write_tree(tmp_path / "cg", {"cgroup.controllers": "cpu memory\n", "cpu.max": "200000 100000\n",
                                        "memory.max": str(4 * 2**30)})
    hw = detect_with_cgroup(tmp_path, root, logical=16)
    assert hw.cpu.effective_cores == 2 and "cgroup CPU quota is 2 cores" in hw.cpu.effective_cores_reason
    assert hw.memory.cgroup_limit_mib == 4096 and hw.memory.effective_mib == 4096
    assert "cgroup memory limit" in hw.memory.effective_reason


def test_unreadable_cgroup_file_is_unknown_not_a_crash(tmp_path):
    root = write_tree(tmp_path / "cg", {"cgroup.controllers": "cpu memory\n", "cpu.max": "garbage here\n"})
    (root / "memory.max").mkdir()  # reading a directory fails
    hw = detect_with_cgroup(tmp_path, root)
    assert "cpu.cgroup_quota_cores" in hw.unknown and "memory.cgroup_limit_mib" in hw.unknown
    assert hw.cpu.effective_cores == 8


def test_psutil_failure_is_unknown(tmp_path):
    hw = run_detect(tmp_path, FakeNVML([], library_missing=True), psutil_module=FakePsutil(fail=True))
    assert hw.memory.total_mib is None and "memory.total_mib" in hw.unknown
    assert hw.cpu.effective_cores >= 1


def test_effective_cores_rule():
    assert effective_cores(64, 16, 3.5)[0] == 3
    assert effective_cores(8, None, None) == (8, "8 logical cores")
    assert effective_cores(None, None, None)[0] == 1
    assert effective_cores(8, 8, 0.5)[0] == 1


def test_infiniband_and_slurm(tmp_path):
    (tmp_path / "sysclass" / "infiniband" / "mlx5_0").mkdir(parents=True)
    (tmp_path / "sysclass" / "infiniband" / "mlx5_1").mkdir(parents=True)
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "node[1-2]",
           "SLURM_NTASKS": "8", "SLURM_CPUS_PER_TASK": "6", "SLURM_GPUS_ON_NODE": "4"}
    hw = run_detect(tmp_path, FakeNVML([], library_missing=True), environ=env)
    assert hw.infiniband == ("mlx5_0", "mlx5_1") and hw.infiniband_rate_gbps is None  # no port says a rate
    assert hw.slurm.job_id == "42" and hw.slurm.num_nodes == 2 and hw.num_nodes == 2
    assert parse_slurm_env({}) is None


def test_the_infiniband_rate_is_the_slowest_active_port_as_the_adapter_reports_it(tmp_path):
    """Each adapter's ports/N/rate as mlx5 writes it; a port that is down does not count (issue 45)."""
    ports = {"mlx5_0/ports/1": ("4: ACTIVE\n", "400 Gb/sec (4X NDR)\n"),
             "mlx5_1/ports/1": ("4: ACTIVE\n", "200 Gb/sec (4X HDR)\n"),
             "mlx5_2/ports/1": ("1: DOWN\n", "10 Gb/sec (4X SDR)\n")}
    for where, (state, rate) in ports.items():
        d = tmp_path / "sysclass" / "infiniband" / where
        d.mkdir(parents=True)
        (d / "state").write_text(state)
        (d / "rate").write_text(rate)
    hw = run_detect(tmp_path, FakeNVML([], library_missing=True))
    assert hw.infiniband == ("mlx5_0", "mlx5_1", "mlx5_2") and hw.infiniband_rate_gbps == 200.0


def test_real_detect_on_this_machine_never_raises():
    hw = detect()
    assert hw.cpu.effective_cores >= 1
    assert hw.software["python"]
    assert HardwareProfile.from_json(hw.to_json()) == hw


# -- the report CLI --------------------------------------------------------------------------

PROFILE_KEYS = {"schema_version", "source", "description", "hostname", "num_nodes", "gpus", "cpu", "memory",
                "infiniband", "infiniband_rate_gbps", "slurm", "kubernetes", "software", "unknown"}
GPU_KEYS = {"index", "nvml_index", "uuid", "name", "memory_total_mib", "memory_free_mib", "compute_capability",
            "pci_bus_id", "mig_mode", "mig_instance", "mig_slices_mib", "error", "clocks_max_sm_mhz",
            "clocks_max_memory_mhz", "pcie_link_gen_max", "pcie_link_width_max"}


def test_report_json_schema_is_pinned(cli):
    r = cli("autotune.hardware", "report", "--json", "--profile", "4xL4")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data) == PROFILE_KEYS
    assert set(data["gpus"]) == {"available", "reason", "driver_version", "cuda_driver_version",
                                 "cuda_visible_devices", "devices", "nvlink_pairs", "p2p_pairs", "interconnect",
                                 "interconnect_reason"}
    assert set(data["gpus"]["devices"][0]) == GPU_KEYS
    assert set(data["cpu"]) == {"model_name", "physical_cores", "logical_cores", "affinity_cores",
                                "cgroup_quota_cores", "cgroup_version", "effective_cores", "effective_cores_reason"}
    assert set(data["memory"]) == {"total_mib", "available_mib", "cgroup_limit_mib", "effective_mib",
                                   "effective_reason"}


def test_report_on_this_machine_text_and_json(cli):
    r = cli("autotune.hardware", "report")
    assert r.returncode == 0, r.stderr
    for section in ("HARDWARE DETECTION RESULTS", "CPU AND MEMORY", "OPTIMAL TRAINING SETTINGS"):
        assert section in r.stdout
    j = cli("autotune.hardware", "report", "--json")
    assert j.returncode == 0 and HardwareProfile.model_validate_json(j.stdout).source == "detected"


@pytest.mark.parametrize("preset", sorted(REQUIRED_PRESETS))
def test_report_every_preset(preset):
    import io
    from argparse import Namespace

    from helpers.support import ROOT

    from autotune.commands.report import run

    buf = io.StringIO()
    assert run(Namespace(json=False, profile=preset, config=str(ROOT / "configs/default_config.yaml"),
                         with_plan=True), out=buf) == 0
    text = buf.getvalue()
    assert "OPTIMAL TRAINING SETTINGS" in text
    assert f"Batch size per {'process' if preset == 'cpu-only' else 'GPU'}:" in text  # no GPU: per process
    if preset != "cpu-only":
        assert "GPU CONFIGURATION" in text and "compute capability" in text
    else:  # the condition that failed, not every condition listed
        assert ("Time estimate:            unknown (no GPU, and the model's step was not timed here: the plan is for "
                "the preset cpu-only, another machine: a step is timed only on the machine autotune detects (plan "
                "without --hardware))\n") in text


def test_report_on_this_cpu_says_it_times_nothing_by_design(monkeypatch):
    """New user: `python -m autotune.hardware report` said "a CPU plan is timed for real only on this machine (not a
    preset), on one node, ..." although every condition was met; the report times nothing, and says so."""
    import io
    from argparse import Namespace

    from helpers.support import ROOT

    from autotune.commands.report import run
    from autotune.profiles import CPUInfo

    here = load_profile("cpu-only").model_copy(update={"source": "detected", "cpu": CPUInfo(
        model_name="Test CPU", physical_cores=2, logical_cores=2, effective_cores=2)})
    buf = io.StringIO()
    assert run(Namespace(json=False, profile=here, config=str(ROOT / "configs/default_config.yaml"),
                         with_plan=True), out=buf) == 0
    assert ("Time estimate:            unknown (no GPU, and the model's step was not timed here: `report` never times "
            "it (it runs nothing, by design, and answers at once): `python -m autotune plan` times the step on this "
            "CPU, once, then keeps the figure)\n") in buf.getvalue()


def test_report_bad_profile_exit_2(cli, tmp_path):
    bad = tmp_path / "p.json"
    bad.write_text('{"gpus": {"devices": [{"index": "x"}]}}')
    r = cli("autotune.hardware", "report", "--profile", str(bad))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "gpus.devices[0].index" in r.stderr
    r2 = cli("autotune.hardware", "report", "--profile", "9xB200")
    assert r2.returncode == 2 and "unknown preset" in r2.stderr


def test_report_does_not_import_torch_or_deepspeed(cli):
    code = ("import sys, io, contextlib\n"
            "from autotune.commands.report import main\n"
            "with contextlib.redirect_stdout(io.StringIO()):\n"
            "    rc = main(['report'])\n"
            "print('RC', rc, 'IMPORTED', [m for m in ('torch', 'deepspeed') if m in sys.modules])\n")
    r = cli("autotune.hardware", "report")
    assert r.returncode == 0 and "torch" in r.stdout  # torch is installed and reported by version...
    import os
    import subprocess
    import sys

    from helpers.support import ROOT
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                       env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert p.returncode == 0, p.stderr
    assert "RC 0 IMPORTED []" in p.stdout  # ...but never imported


def test_report_text_says_what_is_unknown_and_why(tmp_path):
    import io

    from autotune.exports.report import render_profile

    fake = FakeNVML.from_profile(load_profile("4xL4"), failing_queries={(1, "nvmlDeviceGetMemoryInfo")},
                                 dead_gpus={3}, p2p_error=True)
    hw = run_detect(tmp_path, fake, psutil_module=FakePsutil(fail=True))
    buf = io.StringIO()
    render_profile(hw, buf)
    text = buf.getvalue()
    assert "GPU 1: NVIDIA L4" in text and "memory total:       unknown (NVMLError_Unknown: Unknown Error)" in text
    assert "GPU 3: unknown" in text and "device did not answer NVML queries" in text
    assert "Interconnect:  unknown" in text and "treated as PCIe" in text
    assert "RAM total:       unknown (OSError: no /proc/meminfo)" in text
    assert "GPU 0: NVIDIA L4" in text and "22.5 GiB (23034 MiB)" in text  # the rest still prints


def test_shipped_presets_match_their_generator(tmp_path):
    """configs/hardware/*.json are what tools/make_presets.py writes from its vendor figures."""
    import subprocess
    import sys

    from helpers.support import ROOT

    from autotune.profiles import PRESET_DIR

    r = subprocess.run([sys.executable, str(ROOT / "tools" / "make_presets.py"), "--out", str(tmp_path)],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    generated = sorted(p.name for p in tmp_path.glob("*.json"))
    assert generated == sorted(p.name for p in PRESET_DIR.glob("*.json"))
    for name in generated:
        assert (tmp_path / name).read_text() == (PRESET_DIR / name).read_text(), name


def test_software_versions_agree_with_importlib_metadata():
    from importlib import metadata

    from autotune.hardware.host import SOFTWARE_PACKAGES, software_versions

    got = software_versions()
    for name in SOFTWARE_PACKAGES:
        try:
            want = metadata.version(name)
        except metadata.PackageNotFoundError:
            want = None
        assert got[name] == want, name
    assert got["torch"] and got["pydantic"]  # installed here, so the comparison above compared something


def test_installed_versions_from_recorded_folders(tmp_path):
    from autotune.hardware.host import installed_versions

    first, second = tmp_path / "a", tmp_path / "b"
    for d, names in ((first, ["nvidia_ml_py-12.575.51.dist-info", "torch-2.5.1+cu124.dist-info", "README.md"]),
                     (second, ["torch-2.4.0.dist-info", "Old_Pkg-1.0-py3.11.egg-info", "deepspeed.egg-info"])):
        d.mkdir()
        for n in names:
            (d / n).mkdir()
    got = installed_versions([str(first), str(second), str(tmp_path / "missing")])
    assert got == {"nvidia-ml-py": "12.575.51", "torch": "2.5.1+cu124", "old-pkg": "1.0"}  # first path wins


def test_report_does_not_call_the_other_nccl_build_missing():
    """Seen on the first GPU machine: torch with CUDA 13 carries nvidia-nccl-cu13, and the report
    listed nvidia-nccl-cu12 as 'Not installed' as if something were wrong."""
    import io

    from autotune.exports.report import render_profile
    from autotune.profiles import load_profile

    hw = load_profile("4xL4")
    for software, missing in (({"nvidia-nccl-cu12": None, "nvidia-nccl-cu13": "2.28.9", "deepspeed": None},
                               "Not installed:   deepspeed\n"),
                              ({"nvidia-nccl-cu12": None, "nvidia-nccl-cu13": None},
                               "Not installed:   nvidia-nccl-cu12, nvidia-nccl-cu13\n")):
        out = io.StringIO()
        render_profile(hw.model_copy(update={"software": software}), out)
        assert missing in out.getvalue()


def test_failing_system_queries_are_unknown_by_their_own_field(tmp_path):
    """The driver and CUDA version queries fail: each is unknown under its own dotted field, and the GPUs
    are still all there with their links. The device count fails: no GPU, the reason, and what was
    known (driver, CUDA, CUDA_VISIBLE_DEVICES) kept, the interconnect unknown."""
    prof = load_profile("8xA100-40GB")
    env = {"CUDA_VISIBLE_DEVICES": "0,1,2,3,4,5,6,7"}
    versions = {(None, "nvmlSystemGetDriverVersion"), (None, "nvmlSystemGetCudaDriverVersion")}
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof, failing_queries=versions), environ=env)
    assert (hw.gpus.driver_version, hw.gpus.cuda_driver_version) == (None, None)
    assert {"gpus.driver_version", "gpus.cuda_driver_version"} <= set(hw.unknown)
    assert hw.gpus.count == 8 and hw.gpus.cuda_visible_devices == "0,1,2,3,4,5,6,7"
    assert hw.gpus.p2p_pairs == prof.gpus.p2p_pairs and hw.gpus.nvlink_pairs == prof.gpus.nvlink_pairs
    nocount = run_detect(tmp_path, FakeNVML.from_profile(prof, failing_queries={(None, "nvmlDeviceGetCount")}),
                         environ=env)
    g = nocount.gpus
    assert (g.available, g.count, g.interconnect) == (False, 0, "unknown")
    assert (g.driver_version, g.cuda_driver_version, g.cuda_visible_devices) == \
        ("550.54.15", "12.4", env["CUDA_VISIBLE_DEVICES"])
    assert g.reason == nocount.unknown["gpus"] and g.reason


def test_a_gpu_answering_none_of_the_key_queries_is_marked_as_such(tmp_path):
    """GPU 1 answers neither name, memory nor compute capability: it keeps its NVML index and says it
    did not answer. GPU 2 only fails its name: a partial answer is no device error."""
    prof = load_profile("4xL4")
    key = ("nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability")
    failing = {(1, q) for q in key} | {(2, "nvmlDeviceGetName")}
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof, failing_queries=failing))
    d1, d2 = hw.gpus.devices[1], hw.gpus.devices[2]
    assert (d1.nvml_index, d1.error, d1.name, d1.memory_total_mib) == \
        (1, "device did not answer NVML queries", None, None)
    assert (d2.error, d2.name, d2.memory_total_mib) == (None, None, prof.gpus.devices[2].memory_total_mib)


@pytest.mark.parametrize("raw, shown", [(12040, "12.4"), (13000, "13.0"), (12090, "12.9"), (11080, "11.8")])
def test_cuda_driver_version_from_nvmls_integer(tmp_path, raw, shown):
    """NVML gives the CUDA driver version as 1000 x major + 10 x minor."""
    hw = run_detect(tmp_path, FakeNVML.from_profile(load_profile("4xL4"), cuda=raw))
    assert hw.gpus.cuda_driver_version == shown


def _with(hw, gpu=None, **sections):
    """``hw`` with GPU 0's fields (``gpu``) and whole sections' fields replaced."""
    upd = {}
    if gpu:
        devs = list(hw.gpus.devices)
        devs[0] = devs[0].model_copy(update=gpu)
        upd["gpus"] = hw.gpus.model_copy(update={"devices": tuple(devs)})
    for name, fields in sections.items():
        upd[name] = getattr(hw, name).model_copy(update=fields) if isinstance(fields, dict) else fields
    return hw.model_copy(update=upd)


PROBLEM_EDGES = [
    # (GPU 0 fields, section fields, the one problem expected; None = accepted)
    ({"memory_total_mib": 0}, {}, "gpus.devices[0].memory_total_mib: must be positive, got 0"),
    ({"memory_total_mib": 1, "memory_free_mib": 1}, {}, None),
    ({"memory_free_mib": -1}, {}, "gpus.devices[0].memory_free_mib: must be >= 0, got -1"),
    ({"memory_free_mib": 0}, {}, None),
    ({"memory_total_mib": 100, "memory_free_mib": 100}, {}, None),
    ({"memory_total_mib": 100, "memory_free_mib": 101}, {},
     "gpus.devices[0].memory_free_mib: 101 is more than memory_total_mib 100"),
    ({"memory_total_mib": None, "memory_free_mib": 101}, {}, None),
    ({"compute_capability": "9"}, {}, None),
    ({"compute_capability": "8."}, {}, 'gpus.devices[0].compute_capability: must look like "8.9", got \'8.\''),
    ({"compute_capability": "x.9"}, {}, 'gpus.devices[0].compute_capability: must look like "8.9", got \'x.9\''),
    ({"compute_capability": "8.x"}, {}, 'gpus.devices[0].compute_capability: must look like "8.9", got \'8.x\''),
    ({"compute_capability": "²"}, {}, 'gpus.devices[0].compute_capability: must look like "8.9", got \'²\''),
    ({"compute_capability": "8.²"}, {}, 'gpus.devices[0].compute_capability: must look like "8.9", got \'8.²\''),
    ({"mig_slices_mib": (1, 2)}, {}, None),
    ({"mig_slices_mib": (5, 0)}, {}, "gpus.devices[0].mig_slices_mib: every slice must be positive, got [5, 0]"),
    (None, {"cpu": {"effective_cores": 0}}, "cpu.effective_cores: must be >= 1, got 0"),
    (None, {"cpu": {"effective_cores": 1, "physical_cores": 1, "logical_cores": 1, "affinity_cores": 1}}, None),
    (None, {"cpu": {"logical_cores": 0}}, "cpu.logical_cores: must be >= 1 or null (unknown), got 0"),
    (None, {"cpu": {"affinity_cores": 0}}, "cpu.affinity_cores: must be >= 1 or null (unknown), got 0"),
    (None, {"cpu": {"cgroup_quota_cores": 0.0}}, "cpu.cgroup_quota_cores: must be positive, got 0.0"),
    (None, {"cpu": {"cgroup_quota_cores": 0.01}}, None),
    (None, {"cpu": {"cgroup_quota_cores": 999999.0}}, None),
    (None, {"cpu": {"cgroup_quota_cores": 1e6}}, "cpu.cgroup_quota_cores: must be positive, got 1000000.0"),
    (None, {"memory": {"available_mib": 0, "effective_mib": 0}}, None),
    (None, {"memory": {"cgroup_limit_mib": -1}}, "memory.cgroup_limit_mib: must be >= 0 or null (unknown), got -1"),
    # numbers no machine has: generous, finite bounds (profiles.MAX_*)
    ({"memory_total_mib": 4 << 20, "memory_free_mib": 4 << 20}, {}, None),
    ({"memory_total_mib": (4 << 20) + 1}, {}, "gpus.devices[0].memory_total_mib: at most 4194304 (4 TiB), got 4194305"),
    ({"mig_slices_mib": (1, 10 ** 30)}, {},
     f"gpus.devices[0].mig_slices_mib: at most 4194304 (4 TiB) each, got {10 ** 30}"),
    ({"clocks_max_sm_mhz": 100_001}, {}, "gpus.devices[0].clocks_max_sm_mhz: at most 100000, got 100001"),
    ({"pcie_link_width_max": 65}, {}, "gpus.devices[0].pcie_link_width_max: at most 64, got 65"),
    (None, {"cpu": {"effective_cores": 8192, "physical_cores": 8192, "logical_cores": 8192}}, None),
    (None, {"cpu": {"effective_cores": 1_000_000}}, "cpu.effective_cores: at most 8192, got 1000000"),
    (None, {"cpu": {"logical_cores": 8193}}, "cpu.logical_cores: at most 8192, got 8193"),
    (None, {"memory": {"total_mib": 64 << 20}}, None),
    (None, {"memory": {"total_mib": 10 ** 30}}, f"memory.total_mib: at most 67108864 (64 TiB), got {10 ** 30}"),
    (None, {"num_nodes": 65536}, None),
    (None, {"num_nodes": 10 ** 9}, "num_nodes: at most 65536, got 1000000000"),
    # text: printable and bounded, never shown raw
    ({"name": "NVIDIA L4 (rev. 2) \u00e9"}, {}, None),
    ({"name": "\x1b]0;pwn\x07\x1b[2J" + "x" * (1 << 20)}, {},
     "gpus.devices[0].name: a control character ('\\x1b' at 0): text only"),
    ({"name": "x" * 4097}, {}, "gpus.devices[0].name: 4097 characters, at most 4096"),
    (None, {"cpu": {"model_name": "Xeon\nnode 0: ok"}}, "cpu.model_name: a control character ('\\n' at 4): text only"),
    (None, {"memory": {"effective_reason": "cgroup v2 says:\n  max"}}, None),  # a reason may span lines
    (None, {"memory": {"effective_reason": "\x1b[2J"}}, "memory.effective_reason: a control character ('\\x1b' at 0): "
     "text only"),
    (None, {"hostname": "\u202eevil"}, "hostname: a control character ('\\u202e' at 0): text only"),
    (None, {"software": {"torch": "2.13\x07"}}, "software.torch: a control character ('\\x07' at 4): text only"),
    (None, {"unknown": {"gpus\x1b": "x"}}, "unknown: a control character ('\\x1b' at 4) in a key: text only"),
]


@pytest.mark.parametrize("gpu, sections, problem", PROBLEM_EDGES)
def test_profile_problems_at_each_edge(gpu, sections, problem):
    """Each check of a profile read from a file, on both sides of its edge, with its exact words."""
    from autotune.profiles import profile_problems

    base = load_profile("4xL4")
    assert profile_problems(base) == []
    top = {k: v for k, v in sections.items() if not isinstance(getattr(base, k), BaseModel)}
    got = profile_problems(_with(base, gpu, **{k: v for k, v in sections.items() if k not in top}).model_copy(
        update=top))
    assert got == ([] if problem is None else [problem])


def test_a_profile_with_absurd_numbers_or_terminal_escapes_is_refused_by_name_and_never_printed(tmp_path, cli):
    """A profile file whose GPU name holds terminal escapes and 1 MB of text, a million cores, 1e9 nodes and 1e30
    MiB of memory (host and GPU): `launch --dry-run --hardware F` exits 2 naming each field, prints none of the text
    (the old code planned OMP_NUM_THREADS=1000000 and a world of 4e9, rc 0); a peer sending it is refused alike."""
    from autotune.errors import UserError
    from autotune.profiles import peer_profile

    data = json.loads(load_profile("4xL4").to_json())
    data["gpus"]["devices"][0]["name"] = "\x1b]0;pwn\x07\x1b[2J" + "A" * (1 << 20)
    data["cpu"]["effective_cores"] = 1_000_000
    data["num_nodes"] = 10 ** 9
    data["memory"]["total_mib"] = data["gpus"]["devices"][1]["memory_total_mib"] = 10 ** 30
    f = tmp_path / "absurd.json"
    f.write_text(json.dumps(data))
    r = cli("autotune", "launch", "--dry-run", "--hardware", str(f), "--run_dir", str(tmp_path / "run"))
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "Traceback" not in out, out[-3000:]
    for field in ("gpus.devices[0].name: a control character", "cpu.effective_cores: at most 8192",
                  "num_nodes: at most 65536", "memory.total_mib: at most 67108864",
                  "gpus.devices[1].memory_total_mib: at most 4194304"):
        assert field in out, out[-3000:]
    assert "\x1b" not in out and "\x07" not in out and "AAAA" not in out and len(out) < 10_000
    with pytest.raises(UserError, match=r"^node 1 sent an impossible profile: field num_nodes: at most 65536"):
        peer_profile(data, 1)


def test_a_negative_gpu_index_is_named():
    from autotune.profiles import profile_problems

    base = load_profile("4xL4")
    devs = (base.gpus.devices[0].model_copy(update={"index": -1}),) + base.gpus.devices[1:]
    bad = base.model_copy(update={"gpus": base.gpus.model_copy(update={"devices": devs})})
    assert profile_problems(bad)[0] == "gpus.devices[0].index: must be >= 0, got -1"


def test_profile_problems_in_the_gpu_list_as_a_whole():
    from autotune.profiles import profile_problems

    base = load_profile("4xL4")
    g = base.gpus
    none = {"devices": (), "p2p_pairs": (), "nvlink_pairs": ()}
    assert profile_problems(_with(base, gpus=g.model_copy(update=none))) == [
        "gpus.available: true, but gpus.devices lists none"]
    assert profile_problems(_with(base, gpus=g.model_copy(update={"available": False}))) == [
        "gpus.available: false, but gpus.devices lists GPUs"]
    assert profile_problems(_with(base, gpus=g.model_copy(update={"p2p_pairs": ((0, 4),)}))) == [
        "gpus: link (0, 4) names a GPU that gpus.devices does not list"]
    assert profile_problems(_with(base, gpus=g.model_copy(update={"nvlink_pairs": ((7, 1),)}))) == [
        "gpus: link (7, 1) names a GPU that gpus.devices does not list"]
    assert profile_problems(_with(base, gpus=g.model_copy(update={"nvlink_pairs": ((0, 3),)}))) == []


def test_a_gpu_answering_one_key_query_of_three_is_not_a_device_error(tmp_path):
    """Each of name, memory and compute capability alone makes a partial answer (no device error); a GPU
    whose handle NVML does not give keeps its NVML index and says so."""
    prof = load_profile("4xL4")
    key = ("nvmlDeviceGetName", "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetCudaComputeCapability")
    failing = {(i, q) for i, keep in ((0, key[0]), (2, key[1]), (3, key[2])) for q in key if q != keep}
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof, failing_queries=failing))
    d = hw.gpus.devices
    assert [g.error for g in d] == [None, None, None, None]
    assert (d[0].name, d[0].memory_total_mib, d[0].compute_capability) == ("NVIDIA L4", None, None)
    assert (d[2].name, d[2].memory_total_mib, d[2].compute_capability) == (None, prof.gpus.devices[2].memory_total_mib,
                                                                         None)
    assert (d[3].name, d[3].memory_total_mib, d[3].compute_capability) == (None, None, "8.9")
    nohandle = run_detect(tmp_path, FakeNVML.from_profile(prof, failing_queries={(2, "nvmlDeviceGetHandleByIndex")}))
    g = nohandle.gpus.devices[2]
    assert (g.index, g.nvml_index, g.name) == (2, 2, None) and g.error


@pytest.mark.parametrize("missing", [0, 3])
def test_peer_links_without_a_handle_name_the_gpu(tmp_path, missing):
    prof = load_profile("4xL4")
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof, failing_queries={(missing, "nvmlDeviceGetHandleByIndex")}))
    assert hw.gpus.interconnect == "unknown"
    assert hw.gpus.interconnect_reason == (f"NVML did not report peer links (RuntimeError: GPU {missing} has no "
                                           "handle); treated as PCIe")


class _InitFails(FakeNVML):
    def __init__(self, error):
        super().__init__([])
        self.error = error

    def nvmlInit(self):
        raise self.error


def test_nvml_library_missing_is_told_by_the_error_s_type_or_its_words():
    """nvidia-ml-py raises NVMLError_LibraryNotFound ("NVML Shared Library Not Found"); either the type's
    name or the words make it a machine without the driver, anything else is a failed probe."""
    from autotune.hardware.nvml import probe_gpus

    class NVMLError_LibraryNotFound(Exception):
        pass

    for error in (NVMLError_LibraryNotFound("x"), RuntimeError("NVML Shared Library Not Found")):
        unknown = {}
        g = probe_gpus(_InitFails(error), {}, unknown)
        assert g.reason == "no NVIDIA driver (NVML library not found)" and unknown == {}
    unknown = {}
    g = probe_gpus(_InitFails(RuntimeError("Driver Not Loaded")), {}, unknown)
    assert g.reason == unknown["gpus"] == "NVML failed to initialise (RuntimeError: Driver Not Loaded)"
    assert g.interconnect == "unknown"


def test_without_an_injected_nvml_the_installed_nvidia_ml_py_is_asked():
    """Real: the probe loads the installed nvidia-ml-py (pynvml) itself and answers as that module does."""
    import pynvml

    from autotune.hardware.nvml import probe_gpus

    own, given = {}, {}
    assert probe_gpus(None, {}, own) == probe_gpus(pynvml, {}, given) and own == given


def test_the_cpu_probes_read_proc_cpuinfo_by_default():
    from autotune.hardware.host import _cpu_model_name

    assert _cpu_model_name() == _cpu_model_name("/proc/cpuinfo")
    assert (_cpu_model_name() is not None) == ("model name" in open("/proc/cpuinfo").read())
    from autotune.hardware.cgroups import CgroupLimits
    from autotune.hardware.host import probe_cpu

    assert probe_cpu(FakePsutil(), CgroupLimits(), {}) == probe_cpu(FakePsutil(), CgroupLimits(), {},
                                                                     cpuinfo="/proc/cpuinfo")
    assert probe_cpu(FakePsutil(), CgroupLimits(), {}).model_name == _cpu_model_name()


@pytest.mark.parametrize("p2p, words", [({(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)}, "with"), (set(), "without")])
def test_detection_tells_pcie_peer_reads_from_none(tmp_path, p2p, words):
    prof = load_profile("4xL4")
    fake = FakeNVML.from_profile(prof)
    fake.nvlink_pairs, fake.p2p_pairs = set(), p2p
    hw = run_detect(tmp_path, fake)
    assert (hw.gpus.interconnect, hw.gpus.interconnect_reason) == ("pcie", f"no NVLink reported; PCIe {words} "
                                                                            "peer-to-peer reads")
    assert set(hw.gpus.p2p_pairs) == p2p


def test_mig_slices_in_whole_mib_and_none_when_nvml_cannot_count_them(tmp_path):
    """NVML gives bytes: a slice of 9856.5 MiB is listed as 9856 (whole MiB, rounded down). When the
    instance count cannot be read, no slice or instance UUID is invented."""
    prof = load_profile("8xA100-40GB")
    mig = {0: [("MIG-aaaa-1111", "NVIDIA A100-SXM4-40GB MIG 2g.10gb", 9856.5, 9800)]}
    hw = run_detect(tmp_path, FakeNVML.from_profile(prof, mig=mig))
    assert hw.gpus.devices[0].mig_slices_mib == (9856,)
    blind = FakeNVML.from_profile(prof, mig=mig, failing_queries={(0, "nvmlDeviceGetMaxMigDeviceCount")})
    hw = run_detect(tmp_path, blind)
    assert hw.gpus.devices[0].mig_mode is True and hw.gpus.devices[0].mig_slices_mib == ()
    # its instance's UUID was never listed, so CUDA_VISIBLE_DEVICES naming it selects nothing, and says so
    hw = run_detect(tmp_path, blind, environ={"CUDA_VISIBLE_DEVICES": "MIG-aaaa-1111"})
    assert hw.gpus.devices == () and hw.gpus.reason == ("CUDA_VISIBLE_DEVICES entry 'MIG-aaaa-1111' is not a valid "
                                                        "device; CUDA stops there, so 'MIG-aaaa-1111' is ignored")


def test_software_versions_read_the_search_path_given(tmp_path):
    from autotune.hardware.host import software_versions

    (tmp_path / "DeepSpeed-9.9.9.dist-info").mkdir()  # PEP 503: the name's case does not matter
    got = software_versions([str(tmp_path)])
    assert got["deepspeed"] == "9.9.9" and got["torch"] is None
    assert software_versions()["torch"] is not None  # sys.path: the installed torch


def test_cpu_affinity_that_cannot_be_read_is_an_unknown_under_its_name():
    from types import SimpleNamespace

    from autotune.hardware.cgroups import CgroupLimits
    from autotune.hardware.host import probe_cpu

    class NoAffinity(FakePsutil):
        def Process(self):
            def fail():
                raise OSError("no sched_getaffinity")
            return SimpleNamespace(cpu_affinity=fail)

    unknown = {}
    cpu = probe_cpu(NoAffinity(), CgroupLimits(), unknown, cpuinfo="/nonexistent")
    assert cpu.affinity_cores is None and unknown["cpu.affinity_cores"] == "OSError: no sched_getaffinity"
    assert (cpu.effective_cores, cpu.effective_cores_reason) == (8, "8 logical cores")


def test_cgroup_limits_find_this_process_s_own_cgroup_through_proc_self_cgroup_by_default(tmp_path):
    """Real /proc/self/cgroup: a tree laid out where it says this process sits (a tight memory limit in
    the process's own cgroup, a loose one at the root) is read down to that cgroup without being told."""
    from pathlib import Path

    paths = parse_proc_self_cgroup(Path("/proc/self/cgroup").read_text())
    nested = {k: v for k, v in paths.items() if k in ("", "memory") and v.strip("/")}
    if not nested:
        pytest.skip("this process sits at the root of every memory cgroup hierarchy: a missing "
                    "/proc/self/cgroup would read the same")
    v2 = "" in nested
    base = tmp_path if v2 else tmp_path / "memory"
    own = base / nested["" if v2 else "memory"].strip("/")
    own.mkdir(parents=True)
    name = "memory.max" if v2 else "memory.limit_in_bytes"
    if v2:
        (tmp_path / "cgroup.controllers").write_text("cpu memory\n")
    (base / name).write_text(str(8 * 2**30))
    (own / name).write_text(str(2 * 2**30))
    assert read_cgroup_limits(tmp_path).memory_limit_bytes == 2 * 2**30


def test_load_profile_tells_files_from_presets_and_names_each(tmp_path, monkeypatch):
    import autotune.profiles as profiles
    from autotune.errors import UserError

    with pytest.raises(UserError) as e:
        load_profile(str(tmp_path / "missing.json"))  # a .json path is a file, even when it is not there
    assert str(e.value) == f"--hardware/--profile: no such file {str(tmp_path / 'missing.json')!r}"
    with pytest.raises(UserError) as e:
        load_profile("nope")
    assert str(e.value) == ("--hardware/--profile: unknown preset 'nope'; choose one of " + ", ".join(preset_names())
                            + " or give a path to a profile JSON (write one with `python -m autotune.hardware report "
                            "--json > my.json`)")
    # a preset is named as one whatever its file says, and a broken one is named by its path
    presets = tmp_path / "presets"
    presets.mkdir()
    data = json.loads(load_profile("4xL4").to_json())
    (presets / "mine.json").write_text(json.dumps({**data, "source": "detected"}))
    (presets / "broken.json").write_text(json.dumps({**data, "num_nodes": 0}))
    monkeypatch.setattr(profiles, "PRESET_DIR", presets)
    assert load_profile("mine").source == "preset:mine"
    with pytest.raises(UserError) as e:
        load_profile("broken")
    assert str(e.value).startswith(f"{presets / 'broken.json'}: ")
    extensionless = tmp_path / "myprofile"
    extensionless.write_text(json.dumps({**data, "source": "my report"}))  # an existing path without .json: a file
    assert load_profile(str(extensionless)).source == f"file:{extensionless}"  # another machine, whatever it says


def test_a_profile_file_is_another_machine_even_one_this_machine_wrote(tmp_path, monkeypatch):
    """Issue 44 (attacker): this machine's `report --json`, edited into an 8-core Xeon, kept "source": "detected", so
    the plan timed its step on this CPU and labelled the figure the Xeon's. A profile read from a file is never this
    machine, whatever it says: nothing is timed here for it and this environment's OMP_NUM_THREADS is not its."""
    from autotune.config import TrainConfig
    from autotune.measure.timing import times_here, why_untimed
    from autotune.prepare import plan_for

    data = json.loads(detect().to_json())
    assert data["source"] == "detected"
    data["hostname"] = "other-machine"
    data["cpu"].update(model_name="Intel Xeon Platinum 8480+", physical_cores=8, logical_cores=8, affinity_cores=8,
                       cgroup_quota_cores=None, effective_cores=8)
    other = tmp_path / "hw_other.json"
    other.write_text(json.dumps(data))
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    cfg = TrainConfig()
    plan, hw, _ = plan_for(cfg, None, str(other))
    assert hw.source == f"file:{other}"
    assert not times_here(hw, plan)
    assert why_untimed(cfg, hw, plan, None) == (f"the plan is for the profile file {other}, another machine: a step "
                                                "is timed only on the machine autotune detects (plan without "
                                                "--hardware)")
    assert plan.loader.omp_num_threads != 3  # this shell's threads are not the other machine's
    same = tmp_path / "same.json"
    same.write_text(detect().to_json())  # unedited: still a file, and planned as one
    assert load_profile(str(same)).source == f"file:{same}"


def test_a_profile_file_s_defaults_and_messages_by_hand():
    """from_json: a profile without schema_version is this autotune's; another version, impossible numbers
    (free memory above a total of 1 MiB) are refused naming the origin, "<profile>" when none is given."""
    import json

    from helpers.profiles_util import make_profile

    from autotune.errors import UserError
    from autotune.profiles import HardwareProfile

    hw = make_profile(gpus=[("GPU", 20000, 19000, "8.0")], ram_gib=64)
    d = json.loads(hw.to_json())
    del d["schema_version"]
    assert HardwareProfile.from_json(json.dumps(d)) == hw
    with pytest.raises(UserError) as e:
        HardwareProfile.from_json(json.dumps({**d, "schema_version": 99}))
    assert str(e.value).startswith("<profile>: schema_version 99 is not one this autotune reads (")
    d["gpus"]["devices"][0].update(memory_total_mib=1, memory_free_mib=2)
    with pytest.raises(UserError) as e:
        HardwareProfile.from_json(json.dumps(d))
    assert str(e.value) == ("<profile>: not a possible machine (1 problem(s)); fix the numbers or write the profile "
                            "again with `python -m autotune.hardware report --json`")
    assert e.value.problems == ["gpus.devices[0].memory_free_mib: 2 is more than memory_total_mib 1"]


@pytest.mark.parametrize("slurm, problem", [
    ({"job_id": "4242", "nodelist": "node[01-04,07],gpu7"}, None),
    ({"job_id": "4242_3", "nodelist": "a[1-65536]"}, None),  # an array task; as many hosts as nodes may be
    ({"job_id": "1;rm"}, "slurm.job_id: '1;rm' is not a SLURM job id (digits; an array task's 12_3)"),
    ({"job_id": "$(id)"}, "slurm.job_id: '$(id)' is not a SLURM job id (digits; an array task's 12_3)"),
    ({"nodelist": "a[1-999999999]"}, "slurm.nodelist: not a SLURM node list naming at most 65536 hosts: more than "
                                     "65536 hosts"),
    ({"nodelist": "a[1-65537]"}, "slurm.nodelist: not a SLURM node list naming at most 65536 hosts: more than 65536 "
                                 "hosts"),
    ({"nodelist": "a[1-300]b[1-300]"}, "slurm.nodelist: not a SLURM node list naming at most 65536 hosts: more than "
                                       "65536 hosts"),
    ({"nodelist": "a[3-1]"}, "slurm.nodelist: not a SLURM node list naming at most 65536 hosts: [3-1]: '3-1' is not "
                             "N or N-M with N <= M"),
    ({"nodelist": "a;rm,b"}, "slurm.nodelist: not a SLURM node list naming at most 65536 hosts: 'a;rm' is not a host "
                             "name or a bracketed range of them"),
    ({"nodelist": "a[1-2"}, "slurm.nodelist: not a SLURM node list naming at most 65536 hosts: a bracket not closed"),
])
def test_a_profiles_slurm_job_id_and_node_list_are_slurms_own(slurm, problem):
    """Issue 52 item 7: `plan --hardware` accepted slurm.job_id "1;rm" and nodelist "a[1-999999999]". A job id is
    SLURM's (digits, an array task's or a het job's suffix); a node list is SLURM's syntax naming at most MAX_NODES
    hosts, counted without expanding it (bounded time and memory)."""
    import time

    from autotune.profiles import SlurmInfo, profile_problems

    p = load_profile("4xL4").model_copy(update={"slurm": SlurmInfo(**slurm)})
    t0 = time.monotonic()
    assert profile_problems(p) == ([] if problem is None else [problem])
    assert time.monotonic() - t0 < 1


def test_plan_hardware_refuses_a_slurm_job_id_that_is_not_one(tmp_path, cli):
    data = json.loads(load_profile("4xL4").to_json())
    data["slurm"] = {"job_id": "1;rm", "nodelist": "a[1-999999999]"}
    f = tmp_path / "p.json"
    f.write_text(json.dumps(data))
    r = cli("autotune", "plan", "--hardware", str(f))
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr[-2000:]
    assert "slurm.job_id: '1;rm' is not a SLURM job id" in r.stderr and "slurm.nodelist: " in r.stderr
