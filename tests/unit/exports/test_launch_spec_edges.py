"""Edges of the launch spec and the exports: the launch record and its shell line (secrets redacted), the
cache directory, NCCL's InfiniBand switch, where the environment comes from, the DeepSpeed JSON of a plan that
is not DeepSpeed's."""

import dataclasses

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.launch_spec import LaunchSpec, default_cache_dir, launch_spec
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.rundir.records import redact


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
