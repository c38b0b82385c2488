"""Score the step-time model's constants out of sample (issue 55): nothing is scored on what it was fitted on.

    .venv/bin/python bench/score_out_of_sample.py [--h100 DIR] [--h200 DIR] [--plans]

- in sample: the H100's efficiencies (configs/gpus.yaml, h100-recorded) fitted on every recorded H100 model
  (bench/fit_step_time.py) and scored on the same points: what BENCHMARKS.md showed before;
- leave one model out on the H100: fitted without model M, scored on M's points only;
- the H200: the H100's constants as configs/gpus.yaml has them (fitted on the H100 alone), scored on the H200's points.
Each point is a recorded forward+backward time (every micro-batch, checkpointing on and off). With --plans the
project's scorer (../shared/gpu-truth/score.py) plans each H100 model with the constants fitted without it (a copy of
configs/gpus.yaml, read by a wrapper interpreter that points the planner's table at it: the planner itself reads no
environment) and the H200 models with the table as it is, and prints its summaries.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
# the shared recordings (H100 and H200) where this checkout sits beside them, else the H100 copy in bench/gpu_truth
SHARED = next((p for p in (ROOT.parent / "shared" / "gpu-truth", ROOT / "bench" / "gpu_truth")
               if (p / "h100").is_dir()), ROOT / "bench" / "gpu_truth")
WRAPPER = """import os, runpy, sys
from pathlib import Path
from autotune.planner import gpus
gpus.DEFAULT_TABLE_PATH = Path(os.environ["BENCH_GPU_TABLE"])
sys.argv = [sys.argv[0], *sys.argv[3:]]  # called as: wrapper -m autotune <args>
runpy.run_module("autotune", run_name="__main__", alter_sys=True)
"""


def summary(errs: list[float]) -> str:
    a = [abs(e) for e in errs]
    return f"median {statistics.median(a) * 100:.1f} %, max {max(a) * 100:.1f} % ({len(a)} points)"


def table_with(cal, where: Path) -> Path:
    """configs/gpus.yaml with the h100-recorded set replaced by ``cal``'s fitted values."""
    import yaml

    data = yaml.safe_load((ROOT / "configs" / "gpus.yaml").read_text())
    for e in data["efficiencies"]:
        if e["name"] == cal.name:
            e.update({k: float(getattr(cal, k)) for k in ("matmul", "conv", "memory", "optimizer_memory", "kernel_s")})
    where.write_text(yaml.safe_dump(data, sort_keys=False))
    return where


def score(truth: Path, table: Path | None, only: str | None, td: Path) -> dict:
    """score.py's RESULT for ``truth`` (only model ``only`` where given), planned with ``table`` (None: the repo's)."""
    if only is not None:
        sub = td / f"truth-{only}" / truth.name
        sub.mkdir(parents=True)
        for f in truth.glob("*.json"):
            if f.name.endswith("profile.json") or f.stem == only:
                (sub / f.name).write_text(f.read_text())
        truth = sub
    py, env = sys.executable, dict(os.environ)
    if table is not None:
        wrap = td / "with_table.py"
        wrap.write_text(WRAPPER)
        sh = td / f"python-{only}"
        sh.write_text(f"#!/bin/sh\nexec {sys.executable} {wrap} \"$@\"\n")
        sh.chmod(0o755)
        py, env = str(sh), dict(env, BENCH_GPU_TABLE=str(table), PYTHONPATH=os.pathsep.join(
            filter(None, [str(ROOT), str(SHARED), env.get("PYTHONPATH")])))
    r = subprocess.run([sys.executable, str(SHARED / "score.py"), "--truth", str(truth.resolve()), "--python", py,
                        "--json"], capture_output=True, text=True, env=env, cwd=ROOT, timeout=1800)
    line = next((x for x in r.stdout.splitlines() if x.startswith("RESULT ")), None)
    if line is None:
        raise SystemExit(f"score.py failed: {r.stderr[-2000:]}")
    return json.loads(line[len("RESULT "):])


CONTEXT_MIB = 600  # configs/policy.yaml cuda_context_mib
MARGIN = 0.03  # configs/policy.yaml estimate_margin_fraction: from issue 55's kept-back models, not fitted here


def slack_of(rec: dict) -> float:
    """Reserved over allocated at the largest step that ran without checkpointing (the policy's slack, per model)."""
    top = max((p for p in rec["points"] if p["ok"] and not p["ckpt"]), key=lambda p: p["micro"])
    return top["reserved"] / top["peak"] - 1


def headroom_verdicts(truth: Path, slack_for) -> list[str]:
    """For each recorded model and checkpointing, the largest micro-batch the headroom rule plans when the allocated
    peak is the measured one (so only the headroom is scored): the measured peak x (1 + slack) + the step's largest
    tensor (the trace's) + MARGIN x the activations, within free memory - the CUDA context. ``slack_for(model)``: the
    slack fitted without that model. Against what ran and what failed."""
    from fit_step_time import facts_of

    cwd = os.getcwd()
    profile = next(truth.glob("*profile.json"))
    free = json.loads(profile.read_text())["gpus"]["devices"][0]["memory_free_mib"] * 2**20
    out = []
    for f in sorted(truth.glob("*.json")):
        if f == profile:
            continue
        rec = json.loads(f.read_text())
        facts = facts_of(rec, truth)
        os.chdir(cwd)
        slack = slack_for(rec["model"])
        for ckpt in (False, True):
            pts = sorted((p for p in rec["points"] if p["ckpt"] == ckpt), key=lambda p: p["micro"])
            if not pts or facts.work is None:
                continue
            line = facts.work.line(True, ckpt)

            good = [p for p in pts if p["ok"]][-2:]

            def peak(p):  # a failed step's peak: linear from the last two that ran (the README: within 1 %)
                if "peak" in p:
                    return p["peak"]
                (m0, y0), (m1, y1) = ((q["micro"], q["peak"]) for q in good)
                return y1 + (y1 - y0) * (p["micro"] - m1) / (m1 - m0)

            def planned(p):
                acts = peak(p) - 16 * rec["params"]
                need = peak(p) * (1 + slack) + line.at(p["micro"]).largest_allocation_bytes + MARGIN * acts
                return need <= free - CONTEXT_MIB * 2**20

            ran = [p["micro"] for p in pts if p["ok"]]
            failed = [p["micro"] for p in pts if not p["ok"]]
            plans = [p["micro"] for p in pts if planned(p)]
            oom = [m for m in plans if m in failed]
            out.append(f"  {rec['model']:11s} ckpt {'on ' if ckpt else 'off'} (slack {slack:.2%}): largest planned "
                       f"{max(plans, default=0)}, largest ran {max(ran, default=0)}, first failed "
                       f"{min(failed, default='-')}{'; OOM at ' + str(oom) if oom else ''}")
    return out


def main(argv=None) -> int:
    from fit_step_time import errors, fit, recorded_points

    from autotune.planner.gpus import load_table

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--h100", default=str(SHARED / "h100"))
    ap.add_argument("--h200", default=str(SHARED / "h200"))
    ap.add_argument("--plans", action="store_true", help="also plan with score.py, each model out of sample")
    a = ap.parse_args(argv)
    cwd = os.getcwd()
    gpu, data = recorded_points(Path(a.h100))
    os.chdir(cwd)
    shipped = load_table().efficiency("h100-recorded")
    refit = fit(data, gpu, shipped, load_table().efficiency("conservative"))
    print(f"H100, refitted on all: matmul {refit.matmul:.3f} (published), conv {refit.conv:.4f}, memory "
          f"{refit.memory:.3f}, optimizer {refit.optimizer_memory:.3f}, kernel {refit.kernel_s * 1e6:.1f} us: "
          f"{summary(errors(data, gpu, refit))}")
    models = sorted({d[0] for d in data})
    print(f"H100, in sample (configs/gpus.yaml, fitted on {', '.join(models)}): {summary(errors(data, gpu, shipped))}")
    loo, held = {}, []
    for m in models:
        cal = fit([d for d in data if d[0] != m], gpu, shipped, load_table().efficiency("conservative"))
        loo[m] = cal
        mine = [d for d in data if d[0] == m]
        errs = errors(mine, gpu, cal)
        held += errs
        print(f"  without {m:11s}: matmul {cal.matmul:.3f}, conv {cal.conv:.4f}, memory {cal.memory:.3f}, "
              f"optimizer {cal.optimizer_memory:.3f}, kernel {cal.kernel_s * 1e6:.1f} us -> on {m}: {summary(errs)}")
    print(f"H100, leave one model out: {summary(held)}")
    if not Path(a.h200).is_dir():
        print(f"no H200 recordings at {a.h200}: the H200 is not scored")
        return 0
    gpu2, data2 = recorded_points(Path(a.h200))
    os.chdir(cwd)
    print(f"H200 with the H100's constants: {summary(errors(data2, gpu2, gpu2.efficiency))}")
    for m in models:
        e = errors([d for d in data2 if d[0] == m], gpu2, gpu2.efficiency)
        print(f"  {m:11s}: {summary(e)}")
    recs = {json.loads(f.read_text())["model"]: json.loads(f.read_text()) for f in Path(a.h100).glob("*.json")
            if not f.name.endswith("profile.json")}
    slacks = {m: slack_of(r) for m, r in recs.items()}
    print("Headroom, H100, the slack fitted without each model (the median of the others'): "
          + ", ".join(f"{m} {v:.2%}" for m, v in sorted(slacks.items())))
    for line in headroom_verdicts(Path(a.h100), lambda m: statistics.median(v for k, v in slacks.items() if k != m)):
        print(line)
    print(f"Headroom, H200, with the H100's slack (median {statistics.median(slacks.values()):.2%}):")
    for line in headroom_verdicts(Path(a.h200), lambda m: statistics.median(slacks.values())):
        print(line)
    if a.plans:
        with tempfile.TemporaryDirectory() as td:
            t = Path(td)
            for m in models:
                res = score(Path(a.h100), table_with(loo[m], t / f"gpus-without-{m}.yaml"), m, t)
                print(f"score.py, H100, {m} with constants fitted without it: {json.dumps(res['models'][0])}")
            res = score(Path(a.h200), None, None, t)
            print(f"score.py, H200 with the H100's constants: {json.dumps(res['summary'])}")
            for row in res["models"]:
                print(f"  {json.dumps(row)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
