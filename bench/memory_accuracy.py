"""Memory-estimate accuracy: predicted vs measured activation peak over a zoo of models, and
estimation time.

For each model and micro-batch: the planner's traced estimate (fake tensors, no memory
spent) against the real peak of one forward+backward of the same step.

- On a CUDA device (run it wherever one is available): the real peak is
  ``torch.cuda.max_memory_allocated`` minus parameters and gradients; also the largest
  micro-batch that really fits vs the planned one (zero OOMs at the planned micro-batch).
  Targets (issue 9): median error <= 5 %, max <= 10 %, planned >= 90 % of the true maximum.
- On CPU: the real peak is PyTorch's allocation accounting (``MemTracker`` on real tensors),
  the same bookkeeping the trace uses, so this checks the trace, not the allocator.

Also times the estimate: the built-in workload (pure arithmetic) and a ~1B-parameter
transformer traced under fake tensors (target < 60 s on 2 CPU cores).

    .venv/bin/python bench/memory_accuracy.py [--skip-1b]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn as nn

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from common import ROOT, env, machine  # noqa: E402

from autotune.model_trace import trace  # noqa: E402

ZOO = [  # (factory, sample spec, batch maker)
    ("trace_models:mlp", "[64]", lambda b: torch.randn(b, 64)),
    ("trace_models:cnn", "[3,32,32]", lambda b: torch.randn(b, 3, 32, 32)),
    ("trace_models:tied_lm", "int[32]<500", lambda b: torch.randint(0, 500, (b, 32))),
    ("memory_accuracy:medium_lm", "int[128]<8000", lambda b: torch.randint(0, 8000, (b, 128))),
    ("memory_accuracy:deep_mlp", "[512]", lambda b: torch.randn(b, 512)),
]
MICROS = (1, 4, 16, 32, 64)


def medium_lm():
    import trace_models

    return trace_models.TiedLM(vocab=8000, d=256, layers=4)


def deep_mlp():
    layers = []
    for _ in range(8):
        layers += [nn.Linear(512, 512), nn.LayerNorm(512), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(512, 10))


def one_billion():
    import trace_models

    return trace_models.TiedLM(vocab=32000, d=2048, layers=19)


def real_peak(factory: str, batch, device: str) -> float:
    mod, fn = factory.split(":")
    torch.manual_seed(0)
    model = getattr(__import__(mod), fn)().to(device)
    batch = batch.to(device)
    if device == "cuda":
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        model(batch).float().mean().backward()
        torch.cuda.synchronize()
        grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
        return torch.cuda.max_memory_allocated() - base - grads
    from torch.distributed._tools.mem_tracker import MemTracker

    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        model(batch).float().mean().backward()
    peak = {str(k).rsplit(".", 1)[-1]: v for k, v in next(iter(tracker.get_tracker_snapshot("peak").values())).items()}
    return peak["Total"] - peak.get("PARAM", 0) - peak.get("GRAD", 0)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--skip-1b", action="store_true")
    args = ap.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    name = torch.cuda.get_device_name() if device == "cuda" else "CPU (allocation accounting, not a GPU)"
    print(f"# memory accuracy on {name}; {machine()}")
    print(f"{'model':<28}{'micro':>6}{'predicted MiB':>15}{'measured MiB':>14}{'error':>8}")
    errors = []
    for factory, sample, make in ZOO:
        facts = trace(factory, sample)
        for b in MICROS:
            real = real_peak(factory, make(b), device)
            pred = facts.activations.bytes(b, half=False, checkpointing=False)
            err = (pred - real) / real
            errors.append(abs(err))
            print(f"{factory.split(':')[1]:<28}{b:>6}{pred / 2**20:>15.2f}{real / 2**20:>14.2f}{100 * err:>7.1f}%")
    print(f"median |error| {100 * statistics.median(errors):.1f}%, max {100 * max(errors):.1f}% "
          f"over {len(errors)} points")
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "autotune", "estimate", "--hardware", "4xL4"], cwd=ROOT, env=env(),
                   capture_output=True, check=True)
    print(f"estimate, built-in workload (whole process): {time.perf_counter() - t0:.2f} s")
    if not args.skip_1b:
        t0 = time.perf_counter()
        facts = trace("memory_accuracy:one_billion", "int[512]<32000", modes=("half",))
        print(f"traced {facts.num_parameters:,}-parameter transformer, as a GPU plan asks (bf16 autocast, "
              f"7 micro-batch sizes): {time.perf_counter() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
