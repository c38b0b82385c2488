"""What a finished launch reads back from the run directory, each once and passed along (issue 46): metrics.json for
the built-in loop's speed, its calibration and the final accuracy; observed/ for the final judgement of a user's
script, whose end is decided from the notes kept when its processes ended."""

import io
import json
from types import SimpleNamespace

from autotune.config import TrainConfig, apply_overrides
from autotune.planner import plan
from autotune.profiles import load_profile


def _counting(monkeypatch, module: str, name: str, seen: list, key):
    import importlib

    mod = importlib.import_module(module)
    real = getattr(mod, name)

    def counted(*a, **k):
        seen.append(key(*a, **k))
        return real(*a, **k)

    monkeypatch.setattr(mod, name, counted)


def test_a_finished_builtin_run_reads_its_metrics_once(tmp_path, monkeypatch, capsys):
    """The speed against the prediction, whether the run had its cores, and the final validation accuracy come from
    one reading of metrics.json (it was read three times: the speed, the load, the accuracy)."""
    from autotune.launch import sequence

    monkeypatch.delenv("AUTOTUNE_BUSY_LOAD", raising=False)  # the load rule as users have it (the suite turns it off)
    p = plan(load_profile("4xL4"), TrainConfig(), deepspeed_installed=True)
    got = {"wall_s": 30.0, "cpu_share": 0.4, "threads": 2, "wait_share": 0.6}  # under load: nothing kept
    (tmp_path / "metrics.json").write_text(json.dumps({
        "measured_samples_per_s": 123.0, "measured_steps": 12, "measured_process": got,
        "final": {"val/accuracy": 0.5, "val/loss": 1.25}}))
    reads: list[str] = []
    _counting(monkeypatch, "autotune.safe_input", "read_text", reads, lambda path, *a, **k: str(path))
    sequence._say_figures(SimpleNamespace(plan=p, run_dir=tmp_path, speed_key=("a model", "NVIDIA L4")))
    out = capsys.readouterr().out.splitlines()
    assert reads.count(str(tmp_path / "metrics.json")) == 1, reads
    assert out[0].startswith("speed: predicted ") and ", measured 123.0 (" in out[0]
    assert out[1].startswith("speed: not kept to calibrate later plans: measured under load: its process had 40 %")
    assert out[-1] == "Final validation accuracy: 0.500 (loss 1.2500)"
    assert json.loads((tmp_path / "timing.json").read_text())["measured_samples_per_s"] == 123.0


def test_a_finished_scripts_records_are_read_once_and_its_end_from_the_notes_kept(tmp_path, monkeypatch):
    """After the processes ended: observed/ is read once, for the final judgement; how each rank's script ended
    (returned, its own exit code) comes from the notes kept when they ended, not from another reading."""
    from autotune.launch import sequence
    from autotune.launch.evidence import ScriptWatch

    cfg = apply_overrides(TrainConfig(), {"training.entrypoint": "train.py", "distributed.nproc_per_node": 2})
    p = plan(load_profile("cpu-only"), cfg, deepspeed_installed=False)
    status = tmp_path / "status"
    for rank in (0, 1):
        (tmp_path / "observed").mkdir(exist_ok=True)
        (tmp_path / "observed" / f"rank-{rank}.json").write_text(json.dumps({
            "rank": rank, "pid": 1000 + rank, "launch": "L1", "steps": 6, "returned": True, "ended": 1.0}))
        (status / "script").mkdir(parents=True, exist_ok=True)
        (status / "script" / f"rank-{rank}.json").write_text(json.dumps({
            "rank": rank, "pid": 1000 + rank, "launch": "L1", "ended": 1.0, "returned": True, "exit_code": None,
            "raised": None}))
    watch = ScriptWatch(p, tmp_path, io.StringIO(), launch="L1", status_dir=status, processes=dict)
    folders: list[str] = []
    _counting(monkeypatch, "autotune.rundir.status", "read_rank_files", folders, lambda d, *a, **k: d.name)
    watch.settle()  # as the launch does when execute returns, before the private folder goes
    evidence = sequence._record_evidence(SimpleNamespace(plan=p, delivery=None, records_dir=tmp_path), watch)
    end = sequence._script_end(watch, [])
    assert folders == ["script", "observed"], folders
    assert evidence.stepped == 6 and end.all_returned and end.failure is None
    assert json.loads((tmp_path / "delivery.json").read_text())["observed"]["steps_most"] == 6


def test_the_figures_at_the_end_are_this_launchs_own(tmp_path, monkeypatch, capsys):
    """Issue 44 review: a script's launch in runs/exp1 printed "Final validation accuracy: 0.387" from the built-in
    run's metrics.json left there, and its TensorBoard folder. The figures are this launch's: a metrics.json that
    carries its launch id (the built-in loop writes it), a TensorBoard folder it wrote into since it started."""
    import os

    from autotune.launch import sequence

    script = apply_overrides(TrainConfig(), {"training.entrypoint": "d_acc.py"})
    p = plan(load_profile("cpu-only"), script, deepspeed_installed=False)
    (tmp_path / "tensorboard").mkdir()
    (tmp_path / "tensorboard" / "events").write_text("old")
    os.utime(tmp_path / "tensorboard" / "events", (1e9, 1e9))
    left = {"launch": "earlier", "final": {"val/accuracy": 0.387, "val/loss": 1.7951}}
    (tmp_path / "metrics.json").write_text(json.dumps(left))
    setup = SimpleNamespace(plan=p, run_dir=tmp_path, speed_key=(None, None))
    sequence._say_figures(setup, "L2", 2e9)
    assert capsys.readouterr().out == ""
    (tmp_path / "metrics.json").write_text(json.dumps({**left, "launch": "L2"}))
    (tmp_path / "tensorboard" / "events").write_text("new")  # written now, after the launch started
    sequence._say_figures(setup, "L2", 1.5e9)
    assert capsys.readouterr().out.splitlines() == [f"TensorBoard: tensorboard --logdir {tmp_path / 'tensorboard'}",
                                                    "Final validation accuracy: 0.387 (loss 1.7951)"]
