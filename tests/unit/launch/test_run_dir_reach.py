"""The run directory never reaches outside itself (issue 34), for what a finished run writes and reads: timing.json
and delivery.json are replaced, never written through a planted link; a named pipe planted where autotune writes
is refused before the launch; the records read at the end never hang on one; and --resume_from auto never takes a
run folder that is a link to somewhere else."""

import json
import os
import threading
import time
from types import SimpleNamespace

import pytest

from autotune.errors import UserError


def test_a_planted_link_or_pipe_where_a_run_writes_is_refused_before_anything_is_written(tmp_path):
    from autotune.rundir.lock import RunLock

    outside = tmp_path / "precious.txt"
    outside.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "timing.json").symlink_to(outside)
    with pytest.raises(UserError, match=rf"--run_dir: {run / 'timing.json'} is a symbolic link \(to {outside}\)"):
        RunLock(run).acquire(["autotune"])
    (run / "timing.json").unlink()
    os.mkfifo(run / "metrics.jsonl")
    with pytest.raises(UserError, match=rf"--run_dir: {run / 'metrics.jsonl'} is not a regular file \(a named pipe"):
        RunLock(run).acquire(["autotune"])
    assert outside.read_text() == "mine\n"


def test_timing_and_delivery_replace_a_link_and_a_pipe_never_hangs_the_end_of_a_run(tmp_path):
    from autotune.launch import sequence, speed_check
    from autotune.rundir.records import read_record

    outside = tmp_path / "precious.txt"
    outside.write_text("mine\n")
    run = tmp_path / "run"
    run.mkdir()
    (run / "timing.json").symlink_to(outside)  # planted after the launch's check
    speed_check.write(run, {"measured_samples_per_s": 1.0})
    assert outside.read_text() == "mine\n" and not (run / "timing.json").is_symlink()
    assert json.loads((run / "timing.json").read_text()) == {"measured_samples_per_s": 1.0}
    os.mkfifo(run / "metrics.json")
    os.mkfifo(run / "delivery.json")
    done = []

    def the_end():
        done.append((speed_check.read_metrics(run), read_record(run / "delivery.json")))

    t = threading.Thread(target=the_end, daemon=True)
    t.start()
    t.join(20)
    assert not t.is_alive(), "reading a named pipe in the run directory hung the launcher"
    assert done == [({}, {})]
    (run / "delivery.json").unlink()
    (run / "delivery.json").symlink_to(outside)
    plan = SimpleNamespace(engine=SimpleNamespace(world_size=1), batch=None)
    setup = SimpleNamespace(plan=plan, delivery=None, records_dir=run)
    script = SimpleNamespace(observed=lambda: [], all_returned=lambda: False, hidden_steps=lambda observed: [])
    sequence._record_evidence(setup, script)  # no observer files: an empty judgement, written beside the link
    assert outside.read_text() == "mine\n" and not (run / "delivery.json").is_symlink()


def test_resume_auto_never_takes_a_linked_run_folder(tmp_path):
    from autotune.prepare.resume import latest_run_with_checkpoint

    def a_run(where):
        (where / "checkpoints" / "step-00000004").mkdir(parents=True)
        (where / "checkpoints" / "step-00000004" / "meta.json").write_text(json.dumps({"step": 4}))
        (where / "plan.json").write_text(json.dumps({"run": {"entrypoint": "train.py"}}))
        return where

    runs = tmp_path / "runs"
    mine = a_run(runs / "20261125-mine")
    elsewhere = a_run(tmp_path / "elsewhere" / "run")
    (runs / "zz-link").symlink_to(elsewhere)
    future = time.time() + 3600
    os.utime(elsewhere, (future, future))  # the newest by time, through the link
    assert latest_run_with_checkpoint(runs, own_format=True, entry="train.py") == mine
