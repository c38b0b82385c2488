"""Checkpoint manager in one process: atomic layout, rotation, clear errors on bad checkpoints."""

import json

import pytest
import torch

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.runtime.checkpoint import CheckpointManager
from autotune.runtime.dist import DistContext
from autotune.runtime.engine import make_engine
from autotune.runtime_paths import latest_checkpoint, list_checkpoints
from autotune.workload import build_model

CTX = DistContext(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"), distributed=False)


def engine_for(**over):
    cfg = apply_overrides(TrainConfig(), {"training.max_steps": 10, **over})
    p = plan(load_profile("cpu-only"), cfg)
    torch.manual_seed(0)
    return make_engine(p, build_model(p.workload), CTX)


def one_step(engine):
    x = torch.randint(0, 10, (4, 15), generator=torch.Generator().manual_seed(7))
    engine.forward_backward((x, x), boundary=True)
    engine.step()


def test_rotation_keeps_last_k_and_ignores_unfinished(tmp_path):
    eng = engine_for()
    mgr = CheckpointManager(tmp_path, CTX, keep_last=2)
    for step in (1, 2, 3, 4):
        one_step(eng)
        mgr.save(eng, step, consumed=step * 4)
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-00000003", "step-00000004"]
    (tmp_path / "checkpoints" / "step-00000009.tmp").mkdir()  # a crash mid-save
    assert latest_checkpoint(tmp_path).name == "step-00000004"
    meta = json.loads((latest_checkpoint(tmp_path) / "meta.json").read_text())
    assert meta["step"] == 4 and meta["micro_batches_consumed"] == 16 and meta["backend"] == "single"


def test_load_restores_weights_optimizer_and_schedule(tmp_path):
    a = engine_for()
    one_step(a)
    path = CheckpointManager(tmp_path, CTX).save(a, 1, consumed=4)
    b = engine_for()
    CheckpointManager(tmp_path, CTX).load(b, path)
    for (ka, va), (kb, vb) in zip(a.module.state_dict().items(), b.module.state_dict().items()):
        assert ka == kb and torch.equal(va, vb)
    assert b.lr() == a.lr()
    one_step(a)
    one_step(b)
    for va, vb in zip(a.module.parameters(), b.module.parameters()):
        assert torch.allclose(va, vb)


def test_bad_checkpoints_are_user_errors_that_touch_nothing(tmp_path):
    eng = engine_for()
    mgr = CheckpointManager(tmp_path, CTX)
    with pytest.raises(UserError, match="not an autotune checkpoint"):
        mgr.load(eng, tmp_path)
    path = mgr.save(eng, 1, consumed=4)
    (path / "model.pt").write_bytes(b"garbage")
    with pytest.raises(UserError, match="damaged or incompatible"):
        mgr.load(eng, path)
    assert (path / "model.pt").read_bytes() == b"garbage"
    other = engine_for(**{"training.global_batch_size": 128})
    good = mgr.save(eng, 2, consumed=8)
    with pytest.raises(UserError, match="--global_batch_size 256"):
        mgr.load(other, good)
