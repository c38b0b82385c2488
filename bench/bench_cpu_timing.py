"""The built-in run on this CPU against its timed prediction (issue 38): ``launch_distributed_training.sh
--nproc_per_node 2 --max_steps N``, each repeat in a fresh cache directory (so the step is timed anew and no past run
calibrates it), timing.json's predicted samples/s against what the loop measured after its first logged window.
Target: within 30 %. Then one more launch in the last repeat's cache: its plan is calibrated by the run before.

    .venv/bin/python bench/bench_cpu_timing.py [repeats] [max_steps]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from common import ROOT, env, machine


def launch(run: Path, cache: Path, max_steps: int) -> dict:
    r = subprocess.run([str(ROOT / "launch_distributed_training.sh"), "--nproc_per_node", "2", "--max_steps",
                        str(max_steps), "--run_dir", str(run)], capture_output=True, text=True, cwd=ROOT,
                       env=env(AUTOTUNE_CACHE_DIR=str(cache)), timeout=900)
    if r.returncode:
        raise RuntimeError(f"launch failed ({r.returncode}): {r.stderr[-2000:]}")
    rec = json.loads((run / "timing.json").read_text())
    timed = re.search(r"timed in ([\d.]+) s", r.stderr)
    steps = json.loads(next(cache.glob("steps-*.json")).read_text())
    return {"predicted": rec["predicted_samples_per_s"], "measured": rec["measured_samples_per_s"],
            "error": rec.get("error_fraction"), "timing_s": float(timed.group(1)) if timed else None,
            "basis": rec["prediction_basis"], "steps": steps["points"], "all_reduce_s": steps["all_reduce_s"]}


def main(repeats: int = 3, max_steps: int = 100) -> list[dict]:
    out = []
    with tempfile.TemporaryDirectory() as d:
        for i in range(repeats):
            cache = Path(d) / f"cache{i}"
            out.append(launch(Path(d) / f"run{i}", cache, max_steps))
        out.append(dict(launch(Path(d) / "again", cache, max_steps), again=True))
    print(f"machine: {machine()}")
    for i, r in enumerate(out):
        what = "calibrated by the run before" if r.get("again") else f"timed anew ({r['timing_s']} s)"
        parts = ", ".join(f"{m}: {fb * 1e3:.1f} + {opt * 1e3:.1f} ms" for m, fb, opt in r["steps"])
        print(f"{i + 1}: predicted {r['predicted']:,.0f} samples/s, measured {r['measured']:,.0f}, "
              f"error {-r['error'] / (1 + r['error']) * 100:+.0f} % of measured ({what}; micro-step + optimizer "
              f"{parts}, all-reduce {r['all_reduce_s'] * 1e3:.1f} ms)")
    return out


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
