import atexit
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

# What autotune keeps between runs (traces, CPU step timings, past runs' speeds) goes to a cache of the suite's own:
# a test's launch must not calibrate the user's later plans (a pytest run is not "your run"), and the user's past
# runs must not change what a test plans. Each pytest process (each xdist worker) has one for its whole session.
os.environ["AUTOTUNE_CACHE_DIR"] = _SUITE_CACHE = tempfile.mkdtemp(prefix="autotune-test-cache-")
atexit.register(shutil.rmtree, _SUITE_CACHE, ignore_errors=True)
# A plan for this machine takes an exported OMP_NUM_THREADS as its threads per rank: the suite's plans are the
# planner's own wherever it runs (a test that wants one exports it itself).
os.environ.pop("OMP_NUM_THREADS", None)
# The suite runs two workers and their launches on two cores: every timing and run would be judged measured under load
# (rundir.contention), and whether a plan times again would depend on the moment. The load rule's own tests set it back.
os.environ["AUTOTUNE_BUSY_LOAD"] = "1000"

if os.environ.get("MUTANT_UNDER_TEST"):
    # Under `make mutation` the property tests draw the same examples for every mutant and never replay
    # a failure stored by an earlier one: a failure found once (a real bug, say) would otherwise "kill"
    # every mutant run after it.
    from hypothesis import settings

    settings.register_profile("mutation", database=None, derandomize=True)
    settings.load_profile("mutation")


def run_cli(*args, env=None, timeout=120, cwd=None):
    """Run `python -m <args>` in a fresh interpreter; returns CompletedProcess (text)."""
    full_env = {**os.environ, **(env or {})}
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True, env=full_env,
                          timeout=timeout, cwd=cwd or ROOT)


@pytest.fixture(autouse=True)
def _children_outside_mutmut_stats(monkeypatch):
    """Under `make mutation`, mutmut's stats phase (which tests reach which functions) marks the
    process with MUTANT_UNDER_TEST=stats; a child process inheriting it records its hits through
    mutmut's configuration, which it cannot find when the test runs it from another directory. The
    children run the original code in that phase (their hits were never counted); while a mutant runs,
    they inherit its name and run the mutant. Outside mutmut this does nothing."""
    if os.environ.get("MUTANT_UNDER_TEST") == "stats":
        monkeypatch.delenv("MUTANT_UNDER_TEST")


@pytest.fixture
def cli():
    return run_cli


@pytest.fixture(scope="session")
def default_config():
    from autotune.config import load_config

    return load_config(ROOT / "configs" / "default_config.yaml")
