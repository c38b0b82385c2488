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


DIRECT = """
import os, sys, time, timeit, torch
from autotune.runtime import observe, observe_steps
observe.install()
import torch.utils.data
from torch.utils.data import dataloader as dl
from torch.optim.optimizer import _global_optimizer_post_hooks
batch = (torch.zeros(64, 16), torch.zeros(64, dtype=torch.long))
yielded = dl._BaseDataLoaderIter.__next__
class It(dl._BaseDataLoaderIter):
    def __init__(self): pass
    def _next_data(self): return batch
    def _get_iterator(self): return self
opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(4))], lr=1e-3)
hooks = list(_global_optimizer_post_hooks.values())
it = It()
it._sampler_iter = iter(range(10**9))
it._num_yielded = 0
it._profile_name = "x"
it._IterableDataset_len_called = None
it._dataset_kind = 0
n = 20000
t_next = min(timeit.repeat(lambda: yielded(it), number=n, repeat=5)) / n
orig = getattr(yielded, "__wrapped__")
t_plain = min(timeit.repeat(lambda: orig(it), number=n, repeat=5)) / n
t_step = min(timeit.repeat(lambda: [h(opt, (), {}) for h in hooks], number=n, repeat=5)) / n
# per training forward: the pre-hook on the model the script trains (the leading dimension of its input)
model = torch.nn.Linear(16, 4)
observe_steps._count_forwards(model)
(pre,) = model._forward_pre_hooks.values()
x = torch.zeros(64, 16)
t_forward = min(timeit.repeat(lambda: pre(model, (x,), {}), number=n, repeat=5)) / n
# per backward pass: the wrapper around torch.autograd.backward, timed around a function that does nothing
class Mod:
    backward = staticmethod(lambda *a, **k: None)
plain = Mod.backward
observe_steps._autograd(Mod)
t_backward = (min(timeit.repeat(lambda: Mod.backward(), number=n, repeat=5))
              - min(timeit.repeat(lambda: plain(), number=n, repeat=5))) / n
print(t_next - t_plain, t_step, t_forward, t_backward)
"""


def direct(run_dir: str) -> tuple[float, float, float, float]:
    """Seconds the observer adds per DataLoader batch, per optimizer step, per training forward and per backward
    pass, timed on the hooks themselves."""
    env = {**os.environ, "RANK": "0", "AUTOTUNE_RUN_DIR": run_dir, "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", DIRECT], capture_output=True, text=True, env=env, timeout=300,
                       check=True)
    per_batch, per_step, per_forward, per_backward = map(float, r.stdout.split())
    return per_batch, per_step, per_forward, per_backward


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
        per_batch, per_step, per_forward, per_backward = direct(td)
    p, o = statistics.median(plain), statistics.median(observed)
    print(f"step without observer: {p * 1e3:.3f} ms (runs: {', '.join(f'{x * 1e3:.3f}' for x in plain)})")
    print(f"step with observer:    {o * 1e3:.3f} ms (runs: {', '.join(f'{x * 1e3:.3f}' for x in observed)})")
    print(f"A/B difference: {(o - p) * 1e6:+.1f} us a step, {(o - p) / p * 100:+.2f} % (median of {a.runs} runs each; "
          "within the noise of separate processes)")
    cost = per_batch + per_step + per_forward + per_backward  # this loop: one micro-batch per optimizer step
    print(f"the hooks themselves: {per_batch * 1e6:.2f} us per batch, {per_step * 1e6:.2f} us per optimizer step, "
          f"{per_forward * 1e6:.2f} us per training forward, {per_backward * 1e6:.2f} us per backward pass: "
          f"{cost * 1e6:.2f} us a step = {cost / p * 100:.3f} % of this {p * 1e3:.2f} ms step")
    return 0


if __name__ == "__main__":
    sys.exit(main())
