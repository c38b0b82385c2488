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
    assert list(cache.glob("steps-*.json"))  # the step's timing, kept like the trace
    r = cli("autotune", "plan", "--config", str(runs / "timed.yaml"), "--nproc_per_node", "2", "--batch_size",
                "16", "--grad_accum", "1", "--json", env={"AUTOTUNE_CACHE_DIR": str(cache)})
    assert r.returncode == 0, r.stderr
    assert "timing" not in r.stderr  # the step's timing came from the cache
    te = json.loads(r.stdout)["time_estimate"]
    assert te["samples_per_s"] == pytest.approx(rec["measured_samples_per_s"], rel=1e-3)
    assert te["basis"].startswith(f"calibrated by your run of {datetime.date.today()} in {run.absolute()}: measured "
                                  f"{rec['measured_samples_per_s']:,.1f} samples/s"), te["basis"]
