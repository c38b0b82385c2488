"""plan.json has a flat view a script can read (issue 51, item 7): a script that reads ``plan["micro_batch_size"]``
from $AUTOTUNE_PLAN gets the plan's value instead of a KeyError, and autotune reads the same file back unchanged."""

import json
import subprocess
import sys

from autotune.config import TrainConfig, apply_overrides
from autotune.plan import load_plan
from autotune.planner import plan
from autotune.profiles import load_profile
from autotune.rundir.records import write_records

READS_FLAT = """\
import json, os
plan = json.load(open(os.environ["AUTOTUNE_PLAN"]))
print(plan["micro_batch_size"], plan["gradient_accumulation_steps"], plan["batch"]["micro_batch_size"],
      plan.get("learning_rate"))
"""


def _written(tmp_path, **over):
    p = plan(load_profile("cpu-only"), apply_overrides(TrainConfig(), {"distributed.nproc_per_node": 2, **over}))
    write_records(tmp_path, p, load_profile("cpu-only"), None)
    return p, tmp_path / "plan.json"


def test_a_script_reading_plan_micro_batch_size_gets_the_plans_value(tmp_path):
    p, path = _written(tmp_path)
    script = tmp_path / "reads.py"
    script.write_text(READS_FLAT)
    out = subprocess.run([sys.executable, str(script)], env={"AUTOTUNE_PLAN": str(path)}, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    b = p.batch
    assert out.stdout.split() == [str(b.micro_batch_size), str(b.gradient_accumulation_steps),
                                  str(b.micro_batch_size), f"{p.schedule.learning_rate}"]
    assert load_plan(path) == p  # the view is dropped on reading: the same plan


def test_the_view_holds_only_what_the_plan_owns(tmp_path):
    """A user's script keeps its own rate when the config sets none: the view has no learning_rate then."""
    p, path = _written(tmp_path, **{"training.entrypoint": "train.py"})
    data = json.loads(path.read_text())
    assert "learning_rate" in p.run.script_defaults and "learning_rate" not in data
    assert data["micro_batch_size"] == p.batch.micro_batch_size and data["world_size"] == 2
    assert data["precision"] == p.numerics.precision and load_plan(path) == p
