"""What a user's first plan of a large model costs, and whether the trace scaled from a few of its blocks gives the
facts of the whole trace (issue 54).

    .venv/bin/python bench/bench_plan_time.py [--models NAME,...] [--compare NAME,...] [--json]

For each model (``MODELS``: decoders at public shapes, ``bench/decoders.py``) a cold ``autotune plan --json
--no_probe --hardware 8xH100-80GB`` runs with an empty cache (``AUTOTUNE_CACHE_DIR`` of its own), then the same plan
again (cached). Each is timed as the process's own CPU time (user + system, children included: the ``rusage`` of the
waited child) beside its wall time: on a machine shared with other work the wall time grows with the load, the CPU
time far less, so the CPU time is the figure to read.

``--compare``: the models traced both ways in this process, scaled (the plan's path) and whole
(``trace(scale_blocks=False)``), in the modes a plan on 8 x H100 traces (bf16 autocast, DeepSpeed's bf16 weights,
FSDP2 at 8 ranks; each with checkpointing); the table gives the largest difference of the activation peaks (plain and
checkpointed) and of the FLOPs per step over the traced micro-batches, and the CPU time of each trace.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH = ROOT / "bench"
MODELS = {  # name: (factory, sample, parameters as named)
    "gpt-125m-2k": ("decoders:gpt_125m", "decoders:batch_2048", "125 M"),
    "gpt-350m-2k": ("decoders:gpt_350m", "decoders:batch_2048", "350 M"),
    "llama3.2-1b-2k": ("decoders:llama32_1b", "decoders:llama_batch_2048", "1.2 B"),
    "llama3-8b-2k": ("decoders:llama3_8b", "decoders:llama_batch_2048", "8.0 B"),
    "llama3-8b-8k": ("decoders:llama3_8b", "decoders:llama_batch_8192", "8.0 B"),
    "mpt-7b-8k": ("decoders:mpt_7b", "decoders:batch_8192", "6.6 B"),
    "mpt-30b-2k": ("decoders:mpt_30b", "decoders:batch_2048", "29.9 B"),
    "llama3-70b-8k": ("decoders:llama3_70b", "decoders:llama_batch_8192", "70.6 B"),
}
MODES = ("half", "deepspeed", "fsdp", "world8")  # what a plan on 8 x H100 80GB traces


def timed(cmd: list[str], **kw) -> tuple[float, float, subprocess.CompletedProcess]:
    """(process CPU seconds with its children, wall seconds, the result)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall, r


def plan_times(name: str) -> dict:
    model, sample, _ = MODELS[name]
    with tempfile.TemporaryDirectory() as td:
        entry = Path(td) / "train.py"
        entry.write_text("import torch\n")
        cfg = Path(td) / "cfg.yaml"
        cfg.write_text(f"training:\n  model: {model}\n  sample_input: {sample}\n  entrypoint: {entry}\n")
        env = dict(os.environ, AUTOTUNE_CACHE_DIR=str(Path(td) / "cache"),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(BENCH), str(ROOT), os.environ.get("PYTHONPATH")])))
        cmd = [sys.executable, "-m", "autotune", "plan", "--config", str(cfg), "--json", "--no_probe", "--hardware",
               "8xH100-80GB"]
        out = {"model": name}
        for run in ("cold", "cached"):
            cpu, wall, r = timed(cmd, cwd=BENCH, env=env, timeout=3600)
            out[f"{run}_cpu_s"], out[f"{run}_wall_s"] = round(cpu, 1), round(wall, 1)
            if r.returncode not in (0, 3):
                out["error"] = r.stderr.strip()[-400:]
                return out
            if run == "cold":
                out["path"] = next((ln.split("autotune: ", 1)[1] for ln in r.stderr.splitlines()
                                    if "tracing" in ln and "line(s)" in ln), "")
    return out


def compare(name: str) -> dict:
    from autotune.measure.trace import trace

    model, sample, _ = MODELS[name]
    got = {}
    for scaled in (True, False):
        t0 = time.process_time()
        got[scaled] = trace(model, sample, modes=MODES, cuda=True, scale_blocks=scaled)
        got[f"cpu{scaled}"] = time.process_time() - t0
    s, w = got[True], got[False]
    out = {"model": name, "scaled_cpu_s": round(got["cpuTrue"], 1), "whole_cpu_s": round(got["cpuFalse"], 1),
           "path": s.source.split("; ")[-1]}
    for key in ("half", "half_checkpointed", "half_weights", "half_weights_checkpointed", "fsdp", "fsdp_checkpointed"):
        a, b = getattr(s.activations, key), getattr(w.activations, key)
        if a is None or b is None:
            continue
        pa, pb = dict(a.points), dict(b.points)
        out[f"{key}_max_diff_pct"] = round(max(abs(pa[m] - pb[m]) / max(abs(pb[m]), 1.0) * 100 for m in pb
                                               if m in pa), 3) if set(pa) == set(pb) else "points differ"
    worst = 0.0
    for key in ("half", "half_checkpointed", "half_weights", "half_weights_checkpointed"):
        a, b = getattr(s.work, key), getattr(w.work, key)
        if a is None or b is None:
            continue
        for x, y in zip(a.points, b.points):
            fx = x.forward.flops + x.backward.flops + x.optimizer.flops
            fy = y.forward.flops + y.backward.flops + y.optimizer.flops
            worst = max(worst, abs(fx - fy) / max(fy, 1.0) * 100)
    out["flops_max_diff_pct"] = round(worst, 4)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--compare", default="")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    sys.path.insert(0, str(BENCH))
    os.chdir(BENCH)
    rows = [plan_times(n) for n in a.models.split(",") if n]
    for r in rows:
        print(json.dumps(r) if a.json else
              f"{r['model']:16} cold {r.get('cold_cpu_s')} s CPU ({r.get('cold_wall_s')} s wall), cached "
              f"{r.get('cached_cpu_s')} s CPU ({r.get('cached_wall_s')} s wall)  {r.get('error', r.get('path', ''))}",
              flush=True)
    for n in filter(None, a.compare.split(",")):
        print(json.dumps(compare(n)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
