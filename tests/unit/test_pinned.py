"""Behaviour pinned at its edges, each expectation derived by hand from the documented rule
(the policy file, the ZeRO paper's arithmetic, CUDA's and cgroups' rules), not from the code."""

import os
import signal
import sys

import pytest
from helpers.detection import write_tree
from helpers.profiles_util import make_profile

from autotune.config import TrainConfig, apply_overrides, parse_config
from autotune.hardware.cgroups import read_cgroup_limits
from autotune.hardware.visible import PhysicalGPU, Visible, select_visible
from autotune.planner import plan
from autotune.profiles import load_profile

CC80 = "8.0"


def one_gpu(free_mib, cc=CC80, ram_gib=64, n=1):
    return make_profile(gpus=[("GPU", free_mib + 500, free_mib, cc)] * n, ram_gib=ram_gib)


# -- policy bands: GB (10^9 bytes) as configs/policy.yaml states --------------------------------
# The smallest whole MiB at or above G GB is ceil(G * 10^9 / 2^20): 80 GB -> 76294 MiB,
# 40 -> 38147, 20 -> 19074, 14 -> 13352, 10 -> 9537, 6 -> 5723. One MiB less is the band below.
@pytest.mark.parametrize("free_mib, micro", [
    (76294, 64), (76293, 32),
    (38147, 32), (38146, 16),
    (19074, 16), (19073, 12),
    (13352, 12), (13351, 8),
    (9537, 8), (9536, 4),
    (5723, 4), (5722, 2),
])
def test_policy_band_edges_are_in_gb(free_mib, micro):
    p = plan(one_gpu(free_mib), TrainConfig())
    assert p.batch.micro_batch_size == micro, p.reasons["micro_batch_size"]


@pytest.mark.parametrize("preset, micro", [("4xA100-80GB", 64), ("8xH100-80GB", 64), ("8xA100-40GB", 32),
                                           ("4xL4", 16), ("4xT4", 12)])
def test_80_and_40_gb_cards_land_in_their_bands(preset, micro):
    big_target = apply_overrides(TrainConfig(), {"training.global_batch_size": 4096})  # no target reduction
    assert plan(load_profile(preset), big_target, deepspeed_installed=True).batch.micro_batch_size == micro


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


# -- where the launcher's settings take effect ---------------------------------------------------
def test_plan_timeout_reaches_the_process_group(tmp_path):
    """Read back from the real gloo process group that init(plan) created (in a child process, so no
    process group outlives the test in this one)."""
    import subprocess

    from helpers.support import ROOT

    code = (
        "import datetime, torch, torch.distributed as dist\n"
        "from autotune.config import parse_config\n"
        "from autotune.planner import plan\n"
        "from autotune.profiles import load_profile\n"
        "from autotune.runtime.dist import cleanup, init\n"
        "p = plan(load_profile('cpu-only'), parse_config({'distributed': {'backend': 'ddp', 'nproc_per_node': 1,"
        " 'timeout_s': 77}}))\n"
        "ctx = init(p)\n"
        "group = dist.distributed_c10d._get_default_group()\n"
        "print('TIMEOUT', group._get_backend(torch.device('cpu')).options._timeout.total_seconds())\n"
        "cleanup(ctx)\n")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(29000 + os.getpid() % 1000), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TIMEOUT 77.0" in r.stdout


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL, signal.SIGUSR1])
def test_execute_returns_128_plus_n_for_a_child_killed_by_signal_n(sig):
    from autotune.exports.launch_spec import LaunchSpec
    from autotune.launch.process import execute

    spec = LaunchSpec(cmd=[sys.executable, "-c", f"import os, signal; os.kill(os.getpid(), {int(sig)})"], env={})
    assert execute(spec) == 128 + int(sig)


def test_torchrun_rendezvous_store_setting_is_in_every_launch():
    """PyTorch issue 135712: elastic restarts are flaky unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1."""
    from autotune.exports.launch_spec import launch_spec

    for backend in ("single", "ddp"):
        cfg = parse_config({"distributed": {"backend": backend, "nproc_per_node": 2 if backend == "ddp" else 1}})
        spec = launch_spec(plan(load_profile("cpu-only"), cfg), "/r", {"HOME": "/h"})
        assert spec.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_torchrun_reads_the_shutdown_grace_and_the_signals_the_launcher_sets(monkeypatch):
    """Where they take effect: torchrun's own argument parsing and launch config, given the launch's
    environment. SIGTERM reaches the ranks with their preemption grace plus 5 s before SIGKILL, and
    SIGUSR1 (SLURM's --signal) is handled like SIGTERM instead of killing torchrun; a single-process
    launch (no torchrun) sets neither."""
    from torch.distributed.run import config_from_args, get_args_parser

    from autotune.exports.launch_spec import launch_spec

    cfg = parse_config({"distributed": {"backend": "ddp", "nproc_per_node": 2},
                        "checkpoint": {"preemption_grace_s": 40}})
    env = launch_spec(plan(load_profile("cpu-only"), cfg), "/r", {"HOME": "/h"}).env
    for k in ("TORCH_ELASTIC_SHUTDOWN_TIMEOUT", "PET_SIGNALS_TO_HANDLE"):
        monkeypatch.setenv(k, env[k])
    args = get_args_parser().parse_args(["--nproc_per_node=2", "train.py"])
    assert args.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    config, _, _ = config_from_args(args)
    assert config.shutdown_timeout == 45
    single = launch_spec(plan(load_profile("cpu-only"), parse_config({"distributed": {"backend": "single"}})), "/r",
                         {"HOME": "/h"}).env
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in single and "PET_SIGNALS_TO_HANDLE" not in single


@pytest.mark.parametrize("saved_by, backend, refused", [
    ("deepspeed", "ddp", True), ("deepspeed", "single", True), ("ddp", "deepspeed", True),
    ("single", "ddp", False), ("ddp", "single", False), ("deepspeed", "deepspeed", False),
])
def test_resume_across_engine_families_is_refused(saved_by, backend, refused):
    from autotune.errors import UserError
    from autotune.rundir.checkpoints import check_compatible

    meta = {"backend": saved_by, "global_batch_size": 32}
    if refused:
        with pytest.raises(UserError, match=f"written by the {saved_by} backend"):
            check_compatible(meta, "/c", backend, 32)
    else:
        check_compatible(meta, "/c", backend, 32)
