"""Whole-process time of `python -m autotune.hardware report` and `python -m autotune plan`, side
by side in one run with the floor (`python -c "import psutil, pynvml"`, what any NVML/psutil tool
pays) and DeepSpeed's `ds_report` (which imports torch and deepspeed).

Targets: report <= 2x the floor, and >= 15x faster than ds_report."""

from __future__ import annotations

import shutil
from pathlib import Path

from common import PY, machine, med, time_process


def main() -> dict:
    res = {}
    res["floor_import_psutil_pynvml"] = med(time_process([PY, "-c", "import psutil, pynvml"]))
    res["report"] = med(time_process([PY, "-m", "autotune.hardware", "report"]))
    res["report_json"] = med(time_process([PY, "-m", "autotune.hardware", "report", "--json"]))
    res["plan"] = med(time_process([PY, "-m", "autotune", "plan", "--hardware", "8xH100-80GB"]))
    res["plan_json_here"] = med(time_process([PY, "-m", "autotune", "plan", "--json"]))
    ds_report = Path(PY).with_name("ds_report")
    if ds_report.exists() or shutil.which("ds_report"):
        res["ds_report"] = med(time_process([str(ds_report if ds_report.exists() else "ds_report")], repeats=3))
        res["ratio_ds_report_over_report"] = res["ds_report"] / res["report"]
    res["ratio_report_over_floor"] = res["report"] / res["floor_import_psutil_pynvml"]
    print(f"machine: {machine()}")
    for k, v in res.items():
        print(f"{k:32s} {v:8.3f}" + ("" if k.startswith("ratio") else " s"))
    return res


if __name__ == "__main__":
    main()
