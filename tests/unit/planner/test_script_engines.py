"""Engines a user's script can run, shown from its source (issue 51, item 5): DeepSpeed is planned only for a script
that calls deepspeed.initialize or uses Accelerate or the HF Trainer (which take the config autotune hands them);
FSDP2 only for one that shards its model itself or goes through Accelerate; otherwise the plan keeps DDP and says
why. The built-in runtime runs them all."""

import pytest

from autotune.config import TrainConfig, apply_overrides
from autotune.exports.script_engines import engines_not_run
from autotune.exports.script_scan import scan_script
from autotune.prepare.planning import plan_for

PLAIN_DDP = """\
import os
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(8, 2).cuda())
"""
DEEPSPEED = """\
import deepspeed
import torch

model = torch.nn.Linear(8, 2)
engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters())
"""
ACCELERATE = """\
from accelerate import Accelerator
accelerator = Accelerator()
"""
FULLY_SHARD = """\
import torch
from torch.distributed.fsdp import fully_shard
model = torch.nn.Linear(8, 2)
fully_shard(model)
"""


def _plan(tmp_path, source, **over):
    script = tmp_path / "train.py"
    script.write_text(source)
    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": str(script), **over})
    return plan_for(cfg, hardware="4xA100-80GB")[0], str(script)


def test_a_plain_ddp_script_on_four_a100s_is_planned_without_deepspeed_and_says_why(tmp_path):
    p, script = _plan(tmp_path, PLAIN_DDP)
    assert p.engine.backend == "ddp" and p.engine.zero_stage is None
    why = p.reasons["backend"]
    assert f"{script} does not call deepspeed.initialize" in why and "it cannot run DeepSpeed" in why
    assert "DeepSpeed is installed" in why  # the installation is not the reason any more
    # the user's word still wins
    assert _plan(tmp_path, PLAIN_DDP, **{"distributed.backend": "deepspeed"})[0].engine.backend == "deepspeed"


@pytest.mark.parametrize("source", [DEEPSPEED, ACCELERATE], ids=["deepspeed.initialize", "accelerate"])
def test_a_script_that_can_run_deepspeed_is_planned_on_it_as_before(tmp_path, source):
    p, _ = _plan(tmp_path, source)
    assert p.engine.backend == "deepspeed" and p.engine.zero_stage == 2
    assert "cannot run DeepSpeed" not in p.reasons["backend"]


def test_the_built_in_runtime_runs_every_engine():
    assert engines_not_run(None, None) == {}
    assert plan_for(TrainConfig(), hardware="4xA100-80GB")[0].engine.backend == "deepspeed"


def test_what_each_script_shape_can_run(tmp_path):
    def cannot(source):
        f = tmp_path / "s.py"
        f.write_text(source)
        return set(engines_not_run(str(f), scan_script(f)))

    assert cannot(PLAIN_DDP) == {"deepspeed", "fsdp"}
    assert cannot(DEEPSPEED) == {"fsdp"}
    assert cannot(FULLY_SHARD) == {"deepspeed"}
    assert cannot(ACCELERATE) == set()
    assert cannot("from autotune import runtime\n") == set()
    # not shown is not assumed: a script that is not here, or cannot be read, runs neither
    assert set(engines_not_run("elsewhere.py", None)) == {"deepspeed", "fsdp"}
    assert "could not be read" in engines_not_run(str(tmp_path / "x.py"), scan_script(tmp_path / "x.py"))["fsdp"]
