"""FSDP2 as torchtitan runs it (issue 43 items 6-9): the process group has a CPU backend exactly when FSDP2 offloads;
and on 4 CPU processes over gloo (torch's fully_shard runs there), autotune's FSDPEngine keeps the root gathered
between forward and backward while the blocks are resharded, builds the built-in GPT on the meta device and makes
only the shards (the same weights as a whole build), and runs HSDP on a 2 x 2 mesh whose step equals FSDP2's over
every rank, all-reducing across replicas at the accumulation's last micro-step only."""

import json
import os
import subprocess
import sys

import pytest
from helpers.support import ROOT

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import EngineSection


def _engine(**over) -> EngineSection:
    base = dict(backend="fsdp", device="cuda", nproc_per_node=8, world_size=8)
    return EngineSection(**{**base, **over})


def test_the_process_group_has_a_cpu_backend_exactly_when_fsdp2_offloads():
    from autotune.runtime.dist import process_group_backend

    assert process_group_backend(_engine(offload_optimizer=True, offload_param=True)) == "cpu:gloo,cuda:nccl"
    assert process_group_backend(_engine()) == "nccl"
    # DeepSpeed's offload reduces its norms on the GPU (ZeRO's total_norm_cuda): NCCL alone
    assert process_group_backend(_engine(backend="deepspeed", zero_stage=2, offload_optimizer=True)) == "nccl"
    assert process_group_backend(_engine(backend="ddp")) == "nccl"
    assert process_group_backend(_engine(device="cpu", offload_optimizer=True, offload_param=True)) == "gloo"


def test_init_joins_the_group_with_the_backend_the_plan_needs(monkeypatch):
    """What ``dist.init`` really passes to torch, for a GPU plan with and without FSDP2's offload (the GPU calls are
    stood in for: this machine has none)."""
    import torch
    import torch.distributed as dist

    from autotune.planner import plan
    from autotune.profiles import load_profile
    from autotune.runtime import dist as rdist

    joined = []
    monkeypatch.setattr(torch.cuda, "set_device", lambda i: None)
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group", lambda backend, timeout: joined.append(backend))
    for offload in (True, False):
        cfg = apply_overrides(TrainConfig(), {"distributed.backend": "fsdp", "distributed.offload_optimizer": offload})
        p = plan(load_profile("4xL4"), cfg)
        assert (p.engine.backend, p.engine.offload_param) == ("fsdp", offload)
        monkeypatch.setenv("WORLD_SIZE", str(p.engine.world_size))
        rdist.init(p)
    assert joined == ["cpu:gloo,cuda:nccl", "nccl"]


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    """4 gloo ranks running helpers/fsdp_ranks.py's checks; what each saw."""
    tmp = tmp_path_factory.mktemp("mesh")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")]), "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, "-m", "helpers.fsdp_ranks", str(r), "4", str(tmp / "store"), str(tmp)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for r in range(4)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert all(p.returncode == 0 for p in procs), "\n".join(o[-3000:] for o in outs)
    return [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(4)], outs


def test_the_root_stays_gathered_between_forward_and_backward(ranks):
    seen, _ = ranks
    for r in seen:
        assert r["root_gathered_after_forward"] is True  # torch's root rule: not resharded after forward
        assert r["unit_resharded_after_forward"] is True  # the blocks are


def test_the_builtin_gpt_is_built_on_the_meta_device_and_only_its_shards_are_made(ranks):
    seen, outs = ranks
    for r in seen:
        assert r["built_on_meta"] is True  # no storage before fully_shard: the whole model never exists in a rank
        assert r["one_mesh"] == [[4], ["dp_shard"]] and r["shard_rows"] == [32, 128]  # a quarter of fc's rows
        assert r["init_as_whole"] is True  # the shards hold exactly what a whole build at the same seed holds
    assert "FSDP2 over a 1-D mesh (dp_shard 4), 2 unit(s) + the root, built on the meta device" in outs[0]


def test_hsdp_runs_on_a_2x2_mesh_and_steps_as_fsdp2_over_every_rank(ranks):
    seen, outs = ranks
    for r in seen:
        assert r["hsdp_mesh"] == [[2, 2], ["dp_replicate", "dp_shard"]]
        assert r["hsdp_placements"] == ["Replicate", "Shard"] and r["hsdp_shard_rows"] == [64, 128]
        assert r["hsdp_all_reduce"] == [False, True]  # across replicas at the last micro-step only
        assert r["moved"] > 1e-4  # the step changed the weights ...
        assert r["hsdp_step_as_fsdp"] < 1e-6  # ... and HSDP's equal FSDP2's: the gradient is every rank's mean
    assert "FSDP2 over a 2-D mesh (dp_replicate 2 x dp_shard 2)" in outs[0]
