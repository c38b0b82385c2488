"""The step timed on this CPU and a run's speed kept for later plans, end to end (issue 38): the shared DDP reference
run (conftest.runs: 2 processes, timed, in its own cache directory), then a plan of the same model and settings."""

import datetime
import json

import pytest


def test_a_timed_cpu_run_predicts_records_its_speed_and_a_later_plan_takes_it(runs, cli):
    run, cache = runs / "ddp", runs / "cache"
    rec = json.loads((run / "timing.json").read_text())
    assert rec["prediction_basis"].startswith("timed on this CPU") and "2 processes x 1 thread(s)" in rec[
        "prediction_basis"]
    assert rec["predicted_samples_per_s"] > 0 and rec["measured_samples_per_s"] > 0
    got = json.loads((run / "metrics.json").read_text())["measured_process"]  # what rank 0's process had meanwhile
    assert got["wall_s"] > 0 and 0 < got["cpu_share"] and got["threads"] == 1 and 0 <= got["wait_share"] <= 1
    assert rec["measured_under_load"] is None  # the suite judges nothing under load (tests/README.md)
    assert list(cache.glob("steps-*.json"))  # the step's timing, kept like the trace
    r = cli("autotune", "plan", "--config", str(runs / "timed.yaml"), "--nproc_per_node", "2", "--batch_size",
                "16", "--grad_accum", "1", "--json", env={"AUTOTUNE_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    assert "timing" not in r.stderr  # the step's timing came from the cache
    te = json.loads(r.stdout)["time_estimate"]
    assert te["samples_per_s"] == pytest.approx(rec["measured_samples_per_s"], rel=1e-3)
    assert te["basis"].startswith(f"calibrated by your run of {datetime.date.today()} in {run.absolute()}: measured "
                                  f"{rec['measured_samples_per_s']:,.1f} samples/s"), te["basis"]


@pytest.fixture
def two_cpu_burners():
    """Two processes a core that keep every core busy while the test runs (stopped, by their own ids, whatever
    happens). One a core left a short round its core now and then: with two burners on this machine's two cores and
    the suite's other worker, 2 of 5 rounds at micro-batch 32 once had their cores, enough for a quiet figure."""
    import os
    import subprocess
    import sys

    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * (os.cpu_count() or 1))]
    try:
        yield burners
    finally:
        for p in burners:
            p.kill()
            p.wait()


def test_a_step_timed_beside_two_cpu_burners_is_kept_only_flagged_and_a_busy_plan_takes_it_without_timing(
        tmp_path, cli, two_cpu_burners):
    """Issue 47: a timing that did not have its cores is never this machine's figure; issue 45 item 6: on a busy
    machine a second `plan` takes the flagged figure at once and says it was measured under load, and when."""
    from helpers.multiprocess import SMALL

    from autotune.planner.model_facts import MeasuredSteps

    cfg = tmp_path / "timed.yaml"
    cfg.write_text(SMALL.replace("probe: false", "probe: true").replace("seq_len: 6", "seq_len: 6, omp_num_threads: 1"))
    env = {"AUTOTUNE_CACHE_DIR": str(tmp_path / "cache"), "AUTOTUNE_BUSY_LOAD": "0.2"}  # judged as on your machine

    def plan():
        r = cli("autotune", "plan", "--config", str(cfg), "--nproc_per_node", "1", "--json", env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return json.loads(r.stdout)["time_estimate"], r.stderr

    first, said = plan()
    assert "autotune: timing the built-in GPT's training step on this CPU" in said, said
    assert "the step was timed under load (rounds that did not have their cores: " in said, said
    assert "; measured under load (" in first["basis"]
    assert "kept flagged, not as this machine's figure" in first["basis"]
    kept, = (tmp_path / "cache").glob("steps-*.json")
    flagged = MeasuredSteps.model_validate_json(kept.read_text())
    assert flagged.under_load and flagged.measured_at in first["basis"]  # kept only flagged, with when
    second, said = plan()  # the burners still run: busy now
    assert "timing the built-in GPT" not in said and "this machine is busy now (other work held" in said, said
    assert second["basis"].startswith(first["basis"] + "; taken because this machine is busy now (other work held")
    assert second["samples_per_s"] == first["samples_per_s"]
