"""The torchrun export's line, run as printed: it starts what the plan runs (new user's review: it printed
`torchrun --nproc_per_node=4 --standalone train.py` for the built-in workload, which has no train.py, and carried
nothing of the plan)."""

import json
import os
import subprocess
import sys
from pathlib import Path

from helpers.multiprocess import SMALL


def test_the_torchrun_line_run_as_printed_trains_the_plan_on_two_cpu_processes(cli, tmp_path):
    cfg = tmp_path / "small.yaml"
    cfg.write_text(SMALL)
    run_dir = tmp_path / "exported"
    r = cli("autotune", "export", "--format", "torchrun", "--config", str(cfg), "--hardware", "cpu-only",
            "--nproc_per_node", "2", "--max_steps", "2", "--batch_size", "8", "--grad_accum", "2",
            "--run_dir", str(run_dir), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    comment, line = r.stdout.splitlines()
    assert comment == (f"# the plan (ddp x2 on cpu, micro-batch 8 x accumulation 2 x 2 = 32, fp32) is in "
                       f"{run_dir / 'plan.json'}, written by this export; the line starts what it runs")
    plan = json.loads((run_dir / "plan.json").read_text())
    assert line == (f"OMP_NUM_THREADS={plan['loader']['omp_num_threads']} AUTOTUNE_PLAN={run_dir / 'plan.json'} "
                    "torchrun --nproc_per_node=2 --standalone --module autotune.train")
    assert f"wrote the plan the line reads: {run_dir / 'plan.json'}" in r.stderr
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    env.pop("AUTOTUNE_PLAN", None)
    ran = subprocess.run(["bash", "-c", r.stdout], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=240)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    out = ran.stdout + ran.stderr
    assert "ddp x2 on cpu, micro-batch 8 x accumulation 2 x 2 = 32 per step, fp32, 2 steps" in out  # the plan's
    assert json.loads((run_dir / "metrics.json").read_text())["steps"] == 2  # trained in the plan's run directory
