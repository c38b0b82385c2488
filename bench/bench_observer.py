"""What observing a user's script costs (autotune.runtime.observe): per-step time of the same small training loop
with and without the observer, each in fresh processes, alternating, median of the runs.

    python bench/bench_observer.py [--runs 5] [--steps 400]

The loop is a DataLoader over a TensorDataset, an MLP (16 -> 512 -> 512 -> 4), AdamW: a step of about a
millisecond on a CPU core, so the observer's per-batch and per-step hooks are a large share of it if anything is;
a GPU step is longer and the share smaller. Target (issue 25): under 1 % of step time."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SITE = ROOT / "autotune" / "runtime" / "observe_site"

LOOP = """
import sys, time, torch, torch.nn as nn, torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset
torch.set_num_threads(1)
steps = int(sys.argv[1])
x = torch.randn(64 * 50, 16)
loader = DataLoader(TensorDataset(x, x.sum(1).long() % 4), batch_size=64, shuffle=True)
model = nn.Sequential(nn.Linear(16, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 4))
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
done, t0 = 0, None
while done < steps:
    for xb, yb in loader:
        if done == 20:
            t0 = time.perf_counter()  # after a warm-up
        F.cross_entropy(model(xb), yb).backward(); opt.step(); opt.zero_grad()
        done += 1
        if done == steps:
            break
print((time.perf_counter() - t0) / (steps - 20))
"""


def one(observe: bool, steps: int, run_dir: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AUTOTUNE_OBSERVE")}
    env.update(RANK="0", AUTOTUNE_RUN_DIR=run_dir, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(SITE) if observe else None, str(ROOT)]))
    r = subprocess.run([sys.executable, "-c", LOOP, str(steps)], capture_output=True, text=True, env=env,
                       timeout=600, check=True)
    return float(r.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--steps", type=int, default=400)
    a = ap.parse_args(argv)
    plain, observed = [], []
    with tempfile.TemporaryDirectory() as td:
        for _ in range(a.runs):
            plain.append(one(False, a.steps, td))
            observed.append(one(True, a.steps, td))
        assert (Path(td) / "observed" / "rank-0.json").exists(), "the observer did not run"
    p, o = statistics.median(plain), statistics.median(observed)
    print(f"step without observer: {p * 1e3:.3f} ms (runs: {', '.join(f'{x * 1e3:.3f}' for x in plain)})")
    print(f"step with observer:    {o * 1e3:.3f} ms (runs: {', '.join(f'{x * 1e3:.3f}' for x in observed)})")
    print(f"cost: {(o - p) * 1e6:+.1f} us a step, {(o - p) / p * 100:+.2f} % of the step (median of {a.runs} runs each)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
