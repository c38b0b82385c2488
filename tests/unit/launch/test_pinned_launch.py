"""Where the launcher's settings take effect: a child killed by signal N is 128+N, torchrun's rendezvous store
setting in every launch, and torchrun reading the shutdown grace and the signals the launcher sets."""

import signal
import sys

import pytest

from autotune.config import parse_config
from autotune.planner import plan
from autotune.profiles import load_profile


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
    # torchrun's config_from_args exports OMP_NUM_THREADS=1 for several processes: into this test's environment
    # only (it once leaked into every later test of the worker, and a CPU plan read it as the user's threads)
    monkeypatch.setenv("OMP_NUM_THREADS", "")  # recorded, so that monkeypatch restores "not set" afterwards
    monkeypatch.delenv("OMP_NUM_THREADS")
    args = get_args_parser().parse_args(["--nproc_per_node=2", "train.py"])
    assert args.signals_to_handle == "SIGTERM,SIGINT,SIGHUP,SIGQUIT,SIGUSR1"
    config, _, _ = config_from_args(args)
    assert config.shutdown_timeout == 45
    single = launch_spec(plan(load_profile("cpu-only"), parse_config({"distributed": {"backend": "single"}})), "/r",
                         {"HOME": "/h"}).env
    assert "TORCH_ELASTIC_SHUTDOWN_TIMEOUT" not in single and "PET_SIGNALS_TO_HANDLE" not in single
