"""Where the launcher's settings take effect in the ranks: the plan's timeout reaches the real process group."""

import os
import sys

from helpers.support import free_port


# -- where the launcher's settings take effect ---------------------------------------------------
def test_plan_timeout_reaches_the_process_group(tmp_path):
    """Read back from the real gloo process group that init(plan) created (in a child process, so no
    process group outlives the test in this one)."""
    import subprocess

    from helpers.support import ROOT

    code = (
        "import datetime, torch, torch.distributed as dist\n"
        "from autotune.config import parse_config\n"
        "from autotune.planner import plan\n"
        "from autotune.profiles import load_profile\n"
        "from autotune.runtime.dist import cleanup, init\n"
        "p = plan(load_profile('cpu-only'), parse_config({'distributed': {'backend': 'ddp', 'nproc_per_node': 1,"
        " 'timeout_s': 77}}))\n"
        "ctx = init(p)\n"
        "group = dist.distributed_c10d._get_default_group()\n"
        "print('TIMEOUT', group._get_backend(torch.device('cpu')).options._timeout.total_seconds())\n"
        "cleanup(ctx)\n")
    env = {**os.environ, "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
           "MASTER_PORT": str(free_port()), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "TIMEOUT 77.0" in r.stdout


def test_the_rank_entry_blocks_the_same_stop_signals_the_run_receives():
    """autotune.train blocks the stop signals before torch is imported (numpy's OpenBLAS pool, started by that
    import, would otherwise take a SIGTERM and die of it with no checkpoint): the same four runtime.preempt
    receives, named apart so the entry imports no torch first."""
    import signal

    from autotune import train
    from autotune.runtime.preempt import STOP_SIGNALS

    assert {getattr(signal, s) for s in train.STOP_SIGNALS} == set(STOP_SIGNALS)


def test_the_stop_signals_are_blocked_before_torch_is_first_imported_in_a_rank(tmp_path):
    """The rank's entry run for real on a plan, in a child: at the moment `torch` is first imported (its import
    starts numpy's thread pool), every stop signal is already blocked."""
    import json
    import subprocess

    from helpers.support import ROOT

    from autotune.config import TrainConfig
    from autotune.planner import plan
    from autotune.profiles import load_profile

    plan_file = tmp_path / "plan.json"
    plan_file.write_text(plan(load_profile("cpu-only"), TrainConfig()).model_dump_json())
    code = (
        "import json, signal, sys\n"
        "class AtTorch:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'torch':\n"
        "            mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])\n"
        "            print(json.dumps(sorted(int(s) for s in mask)), flush=True)\n"
        "            raise SystemExit(0)\n"
        "sys.meta_path.insert(0, AtTorch())\n"
        "from autotune import train\n"
        "train.main(['--plan', sys.argv[1], '--run_dir', sys.argv[2]])\n")
    r = subprocess.run([sys.executable, "-c", code, str(plan_file), str(tmp_path / "run")], capture_output=True,
                       text=True, timeout=120, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    blocked = set(json.loads(r.stdout.strip().splitlines()[-1]))
    import signal

    from autotune.train import STOP_SIGNALS

    assert {int(getattr(signal, s)) for s in STOP_SIGNALS} <= blocked, r.stderr[-2000:]
