"""Helpers for the benchmarks: timing whole processes, medians, environment."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


def env(**extra) -> dict:
    e = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    e.pop("AUTOTUNE_PLAN", None)
    e.update(extra)
    return e


def time_process(cmd: list[str], repeats: int = 7, **kw) -> list[float]:
    """Wall time of whole processes, after one warm-up run (page cache, .pyc)."""
    subprocess.run(cmd, capture_output=True, env=kw.get("env") or env(), cwd=kw.get("cwd", ROOT), check=True)
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, capture_output=True, env=kw.get("env") or env(), cwd=kw.get("cwd", ROOT), check=True)
        out.append(time.perf_counter() - t0)
    return out


def med(xs: list[float]) -> float:
    return statistics.median(xs)


def machine() -> str:
    import platform

    return f"{os.cpu_count()} cores, Python {platform.python_version()}, {platform.machine()}"
