"""The scaled trace against the whole one on shapes like issue 55's kept-back models (``kept_shapes``), in the modes
given (default: bf16 autocast, with checkpointing where the model offers it): the largest difference of the peaks and
of the FLOPs per step over the traced micro-batches, and each trace's CPU time.

    .venv/bin/python bench/bench_kept_shapes.py [--models gpt2_medium,bert_base,vit_base,tinyllama] [--modes half]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

KEYS = ("fp32", "half", "fp32_checkpointed", "half_checkpointed", "half_weights", "half_weights_checkpointed")


def _flops(w) -> float:
    return w.forward.flops + w.backward.flops + w.optimizer.flops


def compare(name: str, modes: tuple[str, ...]) -> dict:
    from autotune.measure.trace import trace

    got, cpu = {}, {}
    for scaled in (True, False):
        t0 = time.process_time()
        got[scaled] = trace(f"kept_shapes:{name}", f"kept_shapes:{name}_batch", modes=modes, cuda=True,
                            scale_blocks=scaled)
        cpu[scaled] = round(time.process_time() - t0, 1)
    s, w = got[True], got[False]
    out = {"model": name, "path": s.source.split("; ")[-1], "scaled_cpu_s": cpu[True], "whole_cpu_s": cpu[False]}
    for key in KEYS:
        a, b = getattr(s.activations, key), getattr(w.activations, key)
        if a is None or b is None:
            continue
        pa, pb = dict(a.points), dict(b.points)
        out[f"{key}_peak_max_diff_pct"] = (round(max(abs(pa[m] - pb[m]) / abs(pb[m]) * 100 for m in pb), 4)
                                           if pa.keys() == pb.keys() else "points differ")
        fl = [abs(_flops(x) - _flops(y)) / _flops(y) * 100
              for x, y in zip(getattr(s.work, key).points, getattr(w.work, key).points)]
        out[f"{key}_flops_max_diff_pct"] = round(max(fl), 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="gpt2_medium,bert_base,vit_base,tinyllama")
    ap.add_argument("--modes", default="half")
    a = ap.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    for name in a.models.split(","):
        print(json.dumps(compare(name, tuple(a.modes.split(",")))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
