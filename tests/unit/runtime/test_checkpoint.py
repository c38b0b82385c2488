"""Checkpoint manager in one process: atomic layout, rotation, clear errors on bad checkpoints."""

import json

import pytest
import torch

from autotune.config import TrainConfig, apply_overrides
from autotune.errors import UserError
from autotune.planner import plan
from autotune.prepare import resolve_resume
from autotune.profiles import load_profile
from autotune.rundir.checkpoints import latest_checkpoint, list_checkpoints, newest_good_checkpoint, verify_checkpoint
from autotune.runtime.checkpoint_manager import CheckpointManager
from autotune.runtime.dist import DistContext
from autotune.runtime.engine import make_engine
from autotune.runtime.workload import build_model

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


def test_zeroed_bytes_inside_a_file_are_found(tmp_path):
    """The same size, 64 bytes zeroed in the middle: only the checksum sees it."""
    eng = engine_for()
    mgr = CheckpointManager(tmp_path, CTX)
    path = mgr.save(eng, 1, consumed=4)
    data = bytearray((path / "model.pt").read_bytes())
    data[len(data) // 2:len(data) // 2 + 64] = bytes(64)
    (path / "model.pt").write_bytes(bytes(data))
    assert verify_checkpoint(path) == [f"{path / 'model.pt'}: checksum differs from when it was written (damaged)"]
    with pytest.raises(UserError, match="is damaged"):
        mgr.load(eng, path)


def test_auto_resume_falls_back_to_the_newest_good_checkpoint(tmp_path):
    eng = engine_for()
    mgr = CheckpointManager(tmp_path, CTX)
    good = mgr.save(eng, 1, consumed=4)
    bad = mgr.save(eng, 2, consumed=8)
    (bad / "trainer.pt").write_bytes((bad / "trainer.pt").read_bytes()[:100])  # truncated
    warned = []
    assert newest_good_checkpoint(tmp_path, warned.append) == good
    assert warned == [f"checkpoint step-00000002 is damaged and skipped: {bad / 'trainer.pt'}: 100 bytes, "
                      f"{json.loads((bad / 'checksums.json').read_text())['files']['trainer.pt']['bytes']} "
                      "when written (truncated or changed)"]
    assert mgr.newest_good(warned.append) == good and warned[1] == warned[0]
    with pytest.raises(UserError, match=f"{bad} is damaged") as e:
        resolve_resume(str(bad), tmp_path)  # an explicit damaged path is an error naming the file
    assert "trainer.pt: 100 bytes" in e.value.problems[0]
    assert resolve_resume("auto", tmp_path, warned.append) == good


@pytest.mark.parametrize("meta, problem", [
    ({"step": 1, "backend": "single", "world_size": 1, "global_batch_size": 256}, "missing micro_batches_consumed"),
    ({"step": "1", "micro_batches_consumed": 4, "backend": "single", "world_size": 1, "global_batch_size": 256},
     "step must be non-negative integers"),
    ([1, 2], "not a JSON object"),
])
def test_malformed_meta_is_named_not_a_keyerror(tmp_path, meta, problem):
    eng = engine_for()
    path = CheckpointManager(tmp_path, CTX).save(eng, 1, consumed=4)
    (path / "meta.json").write_text(json.dumps(meta))
    (found,) = verify_checkpoint(path)
    assert found.endswith(problem) and "meta.json" in found
    with pytest.raises(UserError, match="is damaged"):
        CheckpointManager(tmp_path, CTX).load(eng, path)


def test_bad_checkpoints_are_user_errors_that_touch_nothing(tmp_path):
    eng = engine_for()
    mgr = CheckpointManager(tmp_path, CTX)
    with pytest.raises(UserError, match="is damaged") as e:
        mgr.load(eng, tmp_path)
    assert "not an autotune checkpoint" in e.value.problems[0]
    path = mgr.save(eng, 1, consumed=4)
    size = (path / "model.pt").stat().st_size
    (path / "model.pt").write_bytes(b"garbage")
    with pytest.raises(UserError, match="is damaged") as e:
        mgr.load(eng, path)
    assert str(e.value).startswith(f"--resume_from: {path} is damaged; resume from an earlier checkpoint "
                                   "(--resume_from auto skips damaged ones)")
    assert e.value.problems == [f"{path / 'model.pt'}: 7 bytes, {size} when written (truncated or changed)"]
    assert (path / "model.pt").read_bytes() == b"garbage"
    (path / "checksums.json").unlink()  # a checkpoint from before checksums: loading finds the damage
    with pytest.raises(UserError, match="damaged or incompatible with this model") as e:
        mgr.load(eng, path)
    assert e.value.problems[0].startswith("rank 0: UnpicklingError: ")
    other = engine_for(**{"training.global_batch_size": 128})
    good = mgr.save(eng, 2, consumed=8)
    with pytest.raises(UserError, match="--global_batch_size 256"):
        mgr.load(other, good)


def test_resume_applies_a_changed_learning_rate_and_says_so(tmp_path):
    """The checkpoint trained at lr 3e-3; the new plan says 1e-3: the new value runs, and it is reported."""
    from autotune.runtime.optimizer import schedule_lambda

    a = engine_for(**{"training.learning_rate": 3e-3})
    for _ in range(3):
        one_step(a)
    path = CheckpointManager(tmp_path, CTX).save(a, 3, consumed=12)
    b = engine_for(**{"training.learning_rate": 1e-3, "training.weight_decay": 0.05})
    meta = CheckpointManager(tmp_path, CTX).load(b, path)
    assert meta["changed"]["learning_rate"] == (a.plan.schedule.learning_rate, 1e-3)
    assert meta["changed"]["weight_decay"] == (a.plan.optimizer.weight_decay, 0.05)
    expected = 1e-3 * schedule_lambda(b.plan)(3)
    assert b.lr() == pytest.approx(expected)
    assert b.opt.optimizer.param_groups[0]["weight_decay"] == 0.05
    one_step(b)  # the schedule continues from the new base
    assert b.lr() == pytest.approx(1e-3 * schedule_lambda(b.plan)(4))
    same = engine_for(**{"training.learning_rate": 3e-3})
    assert CheckpointManager(tmp_path, CTX).load(same, path)["changed"] == {}


@pytest.mark.parametrize("text", ["[]", '{"files": []}', '{"files": {"model.pt": 3}}', '{"files": {}, "files": {}}',
                                  " " * (5 << 20)])
def test_a_damaged_checksum_list_is_named_not_a_traceback(tmp_path, text):
    from autotune.errors import UserError
    from autotune.rundir.checkpoints import read_checksums

    (tmp_path / "checksums.json").write_text(text)
    with pytest.raises(UserError, match="checksums.json is damaged"):
        read_checksums(tmp_path)


def test_resuming_from_an_older_checkpoint_sets_the_later_ones_aside(tmp_path, capsys):
    """keep_last 2: saved 10 and 20, resumed from 10, saved 15: the old 20 must not win --resume_from auto."""
    import types

    from autotune.launch.sequence import set_aside_abandoned
    from autotune.rundir.checkpoints import latest_checkpoint, list_checkpoints

    def save(step):
        d = tmp_path / "checkpoints" / f"step-{step:08d}"
        d.mkdir(parents=True)
        (d / "meta.json").write_text("{}")
        return d

    ten, twenty = save(10), save(20)
    plan = types.SimpleNamespace(run=types.SimpleNamespace(entrypoint=None),
                                 engine=types.SimpleNamespace(node_rank=0))
    set_aside_abandoned(types.SimpleNamespace(plan=plan, resume_path=ten, run_dir=tmp_path))
    fifteen = save(15)
    assert list_checkpoints(tmp_path) == [ten, fifteen] and latest_checkpoint(tmp_path) == fifteen
    kept = list((tmp_path / "checkpoints").glob("abandoned-*/step-00000020"))
    assert len(kept) == 1 and (kept[0] / "meta.json").exists()  # moved, never deleted
    assert "set aside the 1 later checkpoint(s)" in capsys.readouterr().err and not twenty.exists()
    # a user's script keeps its own checkpoints its own way; another run's checkpoint sets nothing aside
    save(30)
    user = types.SimpleNamespace(run=types.SimpleNamespace(entrypoint="train.py"), engine=plan.engine)
    set_aside_abandoned(types.SimpleNamespace(plan=user, resume_path=ten, run_dir=tmp_path))
    other = tmp_path / "elsewhere" / "checkpoints" / "step-00000001"
    other.mkdir(parents=True)
    set_aside_abandoned(types.SimpleNamespace(plan=plan, resume_path=other, run_dir=tmp_path))
    assert latest_checkpoint(tmp_path).name == "step-00000030"


def test_a_checkpoint_without_checksums_still_needs_this_ranks_random_state_at_its_own_world_size(tmp_path):
    """A checkpoint written before checksums existed: the manager checks the rank's random-number state itself,
    and only when the checkpoint was saved at this world size (at another, the ranks' states are not this
    layout's, and a resume at another world size starts them afresh)."""
    eng = engine_for()
    mgr = CheckpointManager(tmp_path, CTX)
    path = mgr.save(eng, 1, consumed=4)
    (path / "checksums.json").unlink()
    assert mgr.verify(path) == []
    (path / "rng-rank0.pt").unlink()
    assert mgr.verify(path) == [f"{path / 'rng-rank0.pt'}: missing"]
    meta = json.loads((path / "meta.json").read_text())
    (path / "meta.json").write_text(json.dumps({**meta, "world_size": 2}))
    assert mgr.verify(path) == []


def _saved_then_edited(tmp_path, **meta_changes):
    """A checkpoint at step 3 of micro 16 x accumulation 2 (6 micro-batches consumed), its checksums removed (a
    checkpoint from before them) so that its meta can be edited: ``None`` removes a key."""
    eng = engine_for(**{"training.global_batch_size": 32, "training.batch_size_per_gpu": 16})
    path = CheckpointManager(tmp_path, CTX).save(eng, 3, consumed=6)
    (path / "checksums.json").unlink()
    meta = json.loads((path / "meta.json").read_text())
    assert (meta["world_size"], meta["micro_batch_size"], meta["gradient_accumulation_steps"]) == (1, 16, 2)
    meta.update(meta_changes)
    (path / "meta.json").write_text(json.dumps({k: v for k, v in meta.items() if v is not None}))
    return path


@pytest.mark.parametrize("changes, micro, position", [
    ({}, 16, 6),  # same world: the saving run's micro-batches, which the stream converts through samples
    ({"world_size": 2}, 8, 12),  # another world: restart the position from the steps taken, in 8 x 4
    ({"micro_batch_size": None}, 8, 12),  # no micro-batch recorded, another accumulation: from the steps
])
def test_a_resume_counts_its_data_position_in_this_runs_micro_batches_where_it_must(tmp_path, changes, micro,
                                                                                     position):
    """Loaded at micro 8 x accumulation 4 (the same global batch): what ``load`` returns for the data stream."""
    path = _saved_then_edited(tmp_path, **changes)
    meta = CheckpointManager(tmp_path, CTX).load(
        engine_for(**{"training.global_batch_size": 32, "training.batch_size_per_gpu": 8}), path)
    assert (meta["micro_batch_size"], meta["micro_batches_consumed"]) == (micro, position)


def test_without_a_micro_batch_recorded_the_same_accumulation_keeps_the_position(tmp_path):
    path = _saved_then_edited(tmp_path, micro_batch_size=None)
    meta = CheckpointManager(tmp_path, CTX).load(
        engine_for(**{"training.global_batch_size": 32, "training.batch_size_per_gpu": 16}), path)
    assert meta["micro_batches_consumed"] == 6 and "micro_batch_size" not in meta


@pytest.mark.parametrize("world, restored", [(1, True), (2, False)])
def test_the_random_state_is_restored_only_at_the_world_size_it_was_saved_at(tmp_path, world, restored):
    """The checkpoint's rank-0 random state is the one at its save; at another world size the ranks' states are
    not this layout's, and the loading process keeps its own."""
    path = _saved_then_edited(tmp_path, world_size=world)
    saved = torch.load(path / "rng-rank0.pt", weights_only=False)["torch"]
    eng = engine_for(**{"training.global_batch_size": 32, "training.batch_size_per_gpu": 16})
    torch.manual_seed(11)
    own = torch.get_rng_state()
    assert not torch.equal(own, saved)
    CheckpointManager(tmp_path, CTX).load(eng, path)
    assert torch.equal(torch.get_rng_state(), saved if restored else own)


def test_a_checkpoint_of_another_engine_family_is_refused_naming_both(tmp_path):
    path = _saved_then_edited(tmp_path, backend="deepspeed")
    with pytest.raises(UserError) as e:
        CheckpointManager(tmp_path, CTX).load(engine_for(**{"training.global_batch_size": 32}), path)
    assert str(e.value).startswith(f"--resume_from: {path} was written by the deepspeed backend and this run uses "
                                   "single; resume with the same engine family (--deepspeed)")
