"""Run every benchmark; results go into BENCHMARKS.md by hand, with the date and machine."""

import runpy
import sys
from pathlib import Path

here = Path(__file__).resolve().parent
sys.path.insert(0, str(here))
sys.path.insert(0, str(here.parent))
for name in ("bench_report", "bench_launch", "bench_steps", "bench_observer", "bench_cpu_timing", "score_gpu_truth"):
    print(f"\n== {name} ==", flush=True)
    runpy.run_path(str(here / f"{name}.py"), run_name="__main__")
