"""Score autotune's plans against what a real GPU measured (bench/gpu_truth, copied from shared/gpu-truth).

    python bench/score_gpu_truth.py [--truth DIR] [--json]        (make bench-gpu-truth)

For each recorded model: plan it with `python -m autotune plan --json` for the recorded hardware profile
(a fresh trace cache, so the time is a first plan's), then compare the plan with the recordings:
- error: the plan's memory_estimate.total_gib against the measured allocated peak at the planned
  micro-batch and checkpointing (linear between recorded points);
- fit: planned micro-batch / the largest whose measured *reserved* peak stays inside the plan's own
  budget_gib (capped at global / world);
- oom: the planned micro-batch above the largest that ran;
- throughput: samples/s of the plan at the global batch (accumulation included) / the best recorded setting;
- seconds: the plan command's wall time (trace included).
Targets (issue 24): median |error| <= 5 %, max <= 10 %; fit >= 0.9; no OOM; throughput >= 0.97; <= 20 s.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GIB = 2 ** 30


def linear(points: list[dict], micro: int, key: str) -> float | None:
    pts = sorted((p["micro"], p[key]) for p in points)
    for (a, ya), (b, yb) in zip(pts, pts[1:]):
        if a <= micro <= b:
            return ya + (yb - ya) * (micro - a) / (b - a)
    return next((y for m, y in pts if m == micro), None)


def samples_per_s(points: list[dict], micro: int, global_batch: int, world: int) -> float | None:
    t_fb, t_opt = linear(points, micro, "t_fb"), linear(points, micro, "t_opt")
    if t_fb is None:
        return None
    acc = math.ceil(global_batch / (micro * world))
    return micro * acc / (acc * t_fb + t_opt)


def score(record: dict, plan: dict, seconds: float) -> dict:
    g, world = record["global_batch_size"], plan["world_size"]
    micro, ckpt = plan["micro_batch_size"], bool(plan["gradient_checkpointing"])
    est = plan["memory_estimate"] or {}
    ran = [p for p in record["points"] if p["ok"] and p["ckpt"] == ckpt]
    oom = micro > max((p["micro"] for p in ran), default=0)
    measured = linear(ran, micro, "peak")
    err = None if (measured is None or est.get("total_gib") is None) else \
        (est["total_gib"] - measured / GIB) / (measured / GIB) * 100
    fits = [p["micro"] for p in ran if est.get("budget_gib") is not None and p["reserved"] / GIB <= est["budget_gib"]]
    cap = max(1, g // world)
    fit = min(max(fits, default=0), cap)
    best = max(samples_per_s([p for p in record["points"] if p["ok"] and p["ckpt"] == c], p["micro"], g, world) or 0
               for c in (False, True) for p in record["points"] if p["ok"] and p["ckpt"] == c and p["micro"] <= cap)
    mine = None if oom else samples_per_s(ran, micro, g, world)
    return {"model": record["model"], "micro": micro, "checkpointing": ckpt, "predicted_gib": est.get("total_gib"),
            "measured_gib": None if measured is None else round(measured / GIB, 2),
            "error_pct": None if err is None else round(err, 1), "largest_fitting_micro": fit,
            "planned_over_fitting": round(micro / fit, 2) if fit else None, "oom": oom,
            "throughput_vs_best": round((mine or 0) / best, 3) if best else None, "plan_seconds": round(seconds, 1),
            "budget_gib": est.get("budget_gib")}


def plan_once(record: dict, profile: Path, truth: Path, cache: str, extra: tuple[str, ...] = ()
              ) -> tuple[dict | None, float, str]:
    with tempfile.TemporaryDirectory() as td:
        (Path(td) / "train.py").write_text("print('a user script')\n")
        cfg = Path(td) / "cfg.yaml"
        cfg.write_text(f"training:\n  model: {record['factory']}\n  sample_input: {record['sample_input']}\n"
                       f"  entrypoint: {Path(td) / 'train.py'}\n  global_batch_size: {record['global_batch_size']}\n"
                       "  max_steps: 10\n")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(truth.parent), str(ROOT),
                                                                         os.environ.get("PYTHONPATH")])),
               "AUTOTUNE_CACHE_DIR": cache}
        t0 = time.monotonic()
        r = subprocess.run([sys.executable, "-m", "autotune", "plan", "--config", str(cfg), "--hardware", str(profile),
                            "--json", *extra], cwd=truth.parent, env=env, capture_output=True, text=True, timeout=1200)
        secs = time.monotonic() - t0
    if r.returncode != 0:
        return None, secs, r.stderr[-500:]
    return json.loads(r.stdout), secs, ""


def deepspeed_rows(truth: Path, profile: Path) -> list[dict]:
    """Each recorded ZeRO run (bench/gpu_truth/deepspeed) planned at its stage and micro-batch. Besides the total,
    the activations alone: the recorded peak minus what DeepSpeed held after a step (bf16 weights, fp32 master
    and Adam's moments), against the plan's activations (the DeepSpeed bf16 line)."""
    ds = json.loads((truth.parent / "deepspeed" / "h100-1gpu.json").read_text())
    models = {json.loads(f.read_text())["model"]: json.loads(f.read_text()) for f in truth.glob("*.json")
              if f != profile}
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        for run in ds["runs"]:
            for p in run["points"]:
                print(f"planning {run['model']} ZeRO-{run['stage']} at micro-batch {p['micro']} ...", file=sys.stderr,
                      flush=True)
                plan, secs, err = plan_once(models[run["model"]], profile, truth, cache,
                                            ("--deepspeed", "--zero_stage", str(run["stage"]), "--batch_size",
                                             str(p["micro"])))
                if plan is None:
                    rows.append({"model": run["model"], "stage": run["stage"], "micro": p["micro"], "error": err})
                    continue
                e = plan["memory_estimate"]
                measured = p["peak"] / GIB
                held = run["after_first_step"] / GIB
                rows.append({"model": run["model"], "stage": run["stage"], "micro": p["micro"],
                             "predicted_gib": e["total_gib"], "states_gib": e["model_states_gib"],
                             "activations_gib": e["activations_gib"], "overhead_gib": e["overhead_gib"],
                             "measured_gib": round(measured, 2), "held_after_step_gib": round(held, 2),
                             "error_pct": round((e["total_gib"] - measured) / measured * 100, 1),
                             "activations_error_pct": round((e["activations_gib"] - (measured - held)) /
                                                            (measured - held) * 100, 1)})
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truth", default=str(ROOT / "bench" / "gpu_truth" / "h100"))
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--deepspeed", action="store_true",
                    help="also plan each recorded DeepSpeed run (--deepspeed --zero_stage N --batch_size M) and "
                         "compare")
    a = ap.parse_args(argv)
    truth = Path(a.truth)
    profile = next(truth.glob("*profile.json"))
    out = []
    with tempfile.TemporaryDirectory() as cache:
        for f in sorted(truth.glob("*.json")):
            if f == profile:
                continue
            record = json.loads(f.read_text())
            print(f"planning {record['model']} ...", file=sys.stderr, flush=True)
            plan, secs, err = plan_once(record, profile, truth, cache)
            if plan is None:
                out.append({"model": record["model"], "error": f"plan failed: {err}"})
                continue
            out.append(score(record, plan, secs))
    ds_rows = deepspeed_rows(truth, profile) if a.deepspeed else []
    errs = [abs(o["error_pct"]) for o in out if o.get("error_pct") is not None]
    summary = {"models": len(out), "error_median_pct": round(statistics.median(errs), 1) if errs else None,
               "error_max_pct": round(max(errs), 1) if errs else None, "oom": sum(bool(o.get("oom")) for o in out),
               "planned_over_fitting_min": min((o["planned_over_fitting"] for o in out
                                                if o.get("planned_over_fitting")), default=None),
               "throughput_vs_best_min": min((o.get("throughput_vs_best") or 0 for o in out), default=None),
               "plan_seconds_max": max((o.get("plan_seconds", 0) for o in out), default=None)}
    if ds_rows:
        ds_errs = [abs(r["error_pct"]) for r in ds_rows if r.get("error_pct") is not None]
        summary["deepspeed_error_max_pct"] = round(max(ds_errs), 1) if ds_errs else None
        summary["deepspeed_activations_error_max_pct"] = round(max(abs(r["activations_error_pct"]) for r in ds_rows), 1)
    if a.json:
        print(json.dumps({"summary": summary, "models": out, "deepspeed": ds_rows}, indent=2))
    else:
        for o in out:
            if "error" in o:
                print(f"{o['model']:12s} {o['error']}")
                continue
            print(f"{o['model']:12s} micro {o['micro']:<5d} ckpt {'on ' if o['checkpointing'] else 'off'} | predicted "
                  f"{o['predicted_gib']} GiB, measured {o['measured_gib']} GiB, error {o['error_pct']} % | fits up to "
                  f"{o['largest_fitting_micro']} (budget {o['budget_gib']} GiB) -> {o['planned_over_fitting']} | "
                  f"throughput {o['throughput_vs_best']} of best | oom {o['oom']} | plan {o['plan_seconds']} s")
        for r in ds_rows:
            print(f"{r['model']:12s} ZeRO-{r['stage']} micro {r['micro']:<3d} | predicted {r['predicted_gib']} GiB "
                  f"(states {r['states_gib']}, activations {r['activations_gib']}, overhead {r['overhead_gib']}), "
                  f"measured {r['measured_gib']} GiB, error {r['error_pct']} % | activations vs measured peak - "
                  f"{r['held_after_step_gib']} GiB held after a step: {r['activations_error_pct']} %")
        print("summary:", json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
